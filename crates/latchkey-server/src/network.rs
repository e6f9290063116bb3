//! Raft transport to peers over gRPC: one cached HTTP/2 channel per peer.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use latchkey_client::ClientOptions;
use latchkey_core::codec;
use latchkey_proto::v1::raft_client::RaftClient;
use latchkey_proto::v1::RaftMessage;
use latchkey_storage::TypeConfig;
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::{de::DeserializeOwned, Serialize};
use tonic::transport::Channel;

use crate::MAX_MESSAGE_BYTES;

/// Above this encoded size an AppendEntries with several entries is split.
const SPLIT_ABOVE_BYTES: usize = 16 * 1024 * 1024;

/// Creates [`PeerLink`]s, sharing one channel per (node id, address).
#[derive(Clone, Default)]
pub struct PeerNetwork {
    channels: Arc<Mutex<BTreeMap<(u64, String), Channel>>>,
    options: ClientOptions,
}

impl PeerNetwork {
    fn channel(&self, target: u64, addr: &str) -> Result<Channel, String> {
        let mut map = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        let key = (target, addr.to_string());
        if let Some(c) = map.get(&key) {
            return Ok(c.clone());
        }
        let c = latchkey_client_channel(addr, &self.options)?;
        map.insert(key, c.clone());
        Ok(c)
    }
}

fn latchkey_client_channel(addr: &str, options: &ClientOptions) -> Result<Channel, String> {
    latchkey_client::channel(addr, options).map_err(|e| e.to_string())
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerLink;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> PeerLink {
        PeerLink {
            target,
            channel: self.channel(target, &node.addr),
        }
    }
}

/// The Raft transport to one peer.
pub struct PeerLink {
    target: u64,
    channel: Result<Channel, String>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct LinkError(String);

type RpcResult<T, E> = Result<T, RPCError<u64, BasicNode, RaftError<u64, E>>>;

impl PeerLink {
    fn client(&self) -> Result<RaftClient<Channel>, Unreachable> {
        match &self.channel {
            Ok(c) => Ok(RaftClient::new(c.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES)),
            Err(e) => Err(Unreachable::new(&LinkError(format!(
                "bad address for node {}: {e}",
                self.target
            )))),
        }
    }

    async fn call<Req, Resp, E>(
        &self,
        kind: Rpc,
        request: &Req,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let payload =
            codec::encode(request).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut client = self.client()?;
        let mut req = tonic::Request::new(RaftMessage { payload });
        req.set_timeout(option.hard_ttl());
        let reply = match kind {
            Rpc::Append => client.append_entries(req).await,
            Rpc::Vote => client.vote(req).await,
            Rpc::Snapshot => client.install_snapshot(req).await,
        };
        let reply = reply.map_err(|status| {
            let e = LinkError(format!("node {}: {}", self.target, status.message()));
            if status.code() == tonic::Code::Unavailable {
                RPCError::Unreachable(Unreachable::new(&e))
            } else {
                RPCError::Network(NetworkError::new(&e))
            }
        })?;
        let result: Result<Resp, RaftError<u64, E>> = codec::decode(&reply.into_inner().payload)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

enum Rpc {
    Append,
    Vote,
    Snapshot,
}

impl RaftNetwork<TypeConfig> for PeerLink {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<u64>, openraft::error::Infallible> {
        if rpc.entries.len() > 1 {
            let size: usize = rpc
                .entries
                .iter()
                .map(|e| match &e.payload {
                    openraft::EntryPayload::Normal(r) => r.command.payload_len(),
                    _ => 64,
                })
                .sum();
            if size > SPLIT_ABOVE_BYTES {
                let hint = (rpc.entries.len() / 2).max(1) as u64;
                return Err(RPCError::PayloadTooLarge(
                    PayloadTooLarge::new_entries_hint(hint),
                ));
            }
        }
        self.call(Rpc::Append, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<u64>, InstallSnapshotError> {
        self.call(Rpc::Snapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<u64>, openraft::error::Infallible> {
        self.call(Rpc::Vote, &rpc, &option).await
    }
}
