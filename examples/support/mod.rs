//! What the examples share: a three-replica cluster in this process.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::Path;

use latchkey::Node;

/// Start replicas 1, 2 and 3 on free loopback ports (a client and a peer
/// listener each), each with its own RocksDB directory under `dir`. Returns
/// the nodes and the initial members (their peer addresses); clients reach
/// a node at its `advertise_addr()`.
pub async fn start_three(
    dir: &Path,
) -> Result<(BTreeMap<u64, Node>, Vec<(u64, String)>), Box<dyn std::error::Error + Send + Sync>> {
    // Bind the loopback ports first, then hand the sockets to the nodes.
    let mut listeners = BTreeMap::new();
    for id in 1..=3u64 {
        let client = TcpListener::bind("127.0.0.1:0")?;
        let peer = TcpListener::bind("127.0.0.1:0")?;
        listeners.insert(id, (client, peer));
    }
    let members: Vec<(u64, String)> = listeners
        .iter()
        .map(|(id, (_, peer))| Ok((*id, peer.local_addr()?.to_string())))
        .collect::<std::io::Result<_>>()?;
    let mut nodes = BTreeMap::new();
    for (id, (client, peer)) in listeners {
        let node = Node::builder(id)
            .listener(client)
            .peer_listener(peer)
            .data_dir(dir.join(format!("node-{id}")))
            .initial_members(members.clone())
            .start()
            .await?;
        nodes.insert(id, node);
    }
    Ok((nodes, members))
}
