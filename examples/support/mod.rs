//! What the examples share: a three-replica cluster in this process.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::Path;

use latchkey::Node;

/// Start replicas 1, 2 and 3 on free loopback ports, each with its own
/// RocksDB directory under `dir`. Returns the nodes and the member list.
pub async fn start_three(
    dir: &Path,
) -> Result<(BTreeMap<u64, Node>, Vec<(u64, String)>), Box<dyn std::error::Error + Send + Sync>> {
    // Reserve three loopback ports, then hand the bound sockets to the nodes.
    let mut listeners = BTreeMap::new();
    for id in 1..=3u64 {
        listeners.insert(id, TcpListener::bind("127.0.0.1:0")?);
    }
    let members: Vec<(u64, String)> = listeners
        .iter()
        .map(|(id, l)| Ok((*id, l.local_addr()?.to_string())))
        .collect::<std::io::Result<_>>()?;
    let mut nodes = BTreeMap::new();
    for (id, listener) in listeners {
        let node = Node::builder(id)
            .listener(listener)
            .data_dir(dir.join(format!("node-{id}")))
            .initial_members(members.clone())
            .start()
            .await?;
        nodes.insert(id, node);
    }
    Ok((nodes, members))
}
