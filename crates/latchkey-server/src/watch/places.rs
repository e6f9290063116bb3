//! [`Places`]: how many watches are open, on the replica and on each
//! client connection, against their limits.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Mutex;

use latchkey_proto::wire::WatchError;

/// How many watches may be open at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WatchLimits {
    /// On the whole replica.
    pub(crate) per_replica: usize,
    /// On one client connection.
    pub(crate) per_connection: usize,
}

#[derive(Default)]
struct Open {
    total: usize,
    per_connection: BTreeMap<SocketAddr, usize>,
}

/// The open watches' places.
pub(crate) struct Places {
    limits: WatchLimits,
    open: Mutex<Open>,
}

impl Places {
    pub(crate) fn new(limits: WatchLimits) -> Self {
        Places {
            limits,
            open: Mutex::default(),
        }
    }

    /// Take a place for a watch on `connection` (`None`: in-process, only
    /// the replica's limit applies), or refuse it past a limit.
    pub(crate) fn take(&self, connection: Option<SocketAddr>) -> Result<(), WatchError> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.total >= self.limits.per_replica {
            return Err(WatchError::TooManyWatches {
                max: self.limits.per_replica as u64,
                scope: "replica".into(),
            });
        }
        if let Some(addr) = connection {
            let n = open.per_connection.entry(addr).or_default();
            if *n >= self.limits.per_connection {
                return Err(WatchError::TooManyWatches {
                    max: self.limits.per_connection as u64,
                    scope: "connection".into(),
                });
            }
            *n += 1;
        }
        open.total += 1;
        Ok(())
    }

    /// Give back a place taken for `connection`.
    pub(crate) fn give_back(&self, connection: Option<SocketAddr>) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.total = open.total.saturating_sub(1);
        if let Some(addr) = connection {
            if let Some(n) = open.per_connection.get_mut(&addr) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    open.per_connection.remove(&addr);
                }
            }
        }
    }

    /// Watches open now.
    pub(crate) fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> Option<SocketAddr> {
        Some(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    #[test]
    fn limits_per_connection_and_per_replica_hold_and_places_come_back() {
        let places = Places::new(WatchLimits {
            per_replica: 3,
            per_connection: 2,
        });
        places.take(addr(1)).unwrap();
        places.take(addr(1)).unwrap();
        let refused = places.take(addr(1)).unwrap_err();
        assert!(
            matches!(&refused, WatchError::TooManyWatches { max: 2, scope } if scope == "connection"),
            "{refused:?}"
        );
        places.take(None).unwrap();
        let refused = places.take(addr(2)).unwrap_err();
        assert!(
            matches!(&refused, WatchError::TooManyWatches { max: 3, scope } if scope == "replica"),
            "{refused:?}"
        );
        assert_eq!(places.open(), 3);
        places.give_back(addr(1));
        places.take(addr(2)).unwrap();
        places.give_back(addr(1));
        places.give_back(addr(2));
        places.give_back(None);
        assert_eq!(places.open(), 0);
        // Every place came back: the full limits again.
        places.take(addr(1)).unwrap();
        places.take(addr(1)).unwrap();
        places.take(addr(3)).unwrap();
    }
}
