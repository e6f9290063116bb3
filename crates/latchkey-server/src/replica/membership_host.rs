//! The replica as a membership change sees it ([`MembershipHost`]).

use crate::membership::MembershipHost;
use crate::peer_auth::PeerClient;
use crate::raft_view::RaftView;
use crate::write_queue::WriteQueue;

use super::Replica;

impl MembershipHost for Replica {
    fn view(&self) -> &RaftView {
        &self.view
    }

    fn is_leader(&self) -> bool {
        Replica::is_leader(self)
    }

    fn peer_client(&self, addr: &str) -> Result<PeerClient, latchkey_proto::ChannelError> {
        Replica::peer_client(self, addr)
    }

    fn writes(&self) -> &WriteQueue {
        &self.writes
    }

    fn membership_changes(&self) -> &tokio::sync::Mutex<()> {
        &self.membership_changes
    }

    fn was_restored(&self) -> bool {
        self.restore_seed != 0
    }
}
