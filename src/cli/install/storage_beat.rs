//! The datastore watch's sign that the API server's storage still takes
//! writes: the node's Lease (`kube-node-lease/<node>`), which kubelet
//! renews every 10 s through the API server and so through etcd. A watch
//! is served by the API server's watch cache, which stays open, quiet and
//! ready while etcd behind it is stopped or gone; renewals are seen only
//! once etcd has taken them. So while renewals keep coming the storage
//! answers, at no request; when none came for [`STALE`], one read of the
//! Lease as of now (bounded by [`READ_TIMEOUT`]) tells a failing storage
//! (the read fails: not ready) from a late kubelet (it answers: still
//! ready, read again after [`QUIET`] while no renewal comes).

use std::time::Duration;

use tokio::time::Instant;

use crate::plugin::status_watch::Verdict;

/// How long without a renewal before the storage is asked (kubelet renews
/// every 10 s, give or take 4%).
pub const STALE: Duration = Duration::from_secs(15);

/// How long the read as of now may take.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The wait between reads while the storage answers but no renewal comes
/// (kubelet stopped or late): a node without kubelet costs a request a
/// minute, not four.
pub const QUIET: Duration = Duration::from_secs(60);

/// When the Lease was last seen renewed and when the storage is next
/// asked.
#[derive(Debug, Clone)]
pub struct StorageBeat {
    /// The node's name (the Lease's).
    pub node: String,
    next_read: Instant,
}

impl StorageBeat {
    pub fn new(node: &str, now: Instant) -> StorageBeat {
        StorageBeat {
            node: node.to_string(),
            next_read: now + STALE,
        }
    }

    /// A renewal seen (the Lease's watch delivered it, so etcd took it).
    pub fn renewed(&mut self, now: Instant) {
        self.next_read = now + STALE;
    }

    /// When the storage is to be asked (no renewal since [`STALE`]).
    pub fn read_at(&self) -> Instant {
        self.next_read
    }

    /// The verdict of the read made at `now` (`Err`: why it failed), and
    /// when to read again if no renewal comes first.
    pub fn read(&mut self, now: Instant, read: Result<(), ReadFailure>) -> Verdict {
        match read {
            Ok(()) => {
                self.next_read = now + QUIET;
                Verdict::Ready
            }
            Err(ReadFailure::Credentials(why)) => {
                self.next_read = now + STALE;
                Verdict::Unknown(format!(
                    "the node's Lease kube-node-lease/{} went unrenewed and could not be read: {why}",
                    self.node
                ))
            }
            Err(ReadFailure::Storage(why)) => {
                self.next_read = now + STALE;
                Verdict::NotReady(format!(
                    "the node's Lease kube-node-lease/{} has not been renewed for {} s and a read of it as of now failed ({why}): the API server's storage is not taking writes",
                    self.node,
                    STALE.as_secs()
                ))
            }
        }
    }
}

/// Why the read as of now failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadFailure {
    /// The watcher's own credentials refused (401, 403): nothing learnt of
    /// the storage.
    Credentials(String),
    /// No answer in time, or an error of the server.
    Storage(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewals_keep_it_quiet_and_a_failed_read_is_not_ready() {
        let t0 = Instant::now();
        let mut beat = StorageBeat::new("node-1", t0);
        assert_eq!(beat.read_at(), t0 + STALE);
        beat.renewed(t0 + Duration::from_secs(10));
        assert_eq!(beat.read_at(), t0 + Duration::from_secs(10) + STALE);

        let at = t0 + Duration::from_secs(25);
        assert_eq!(beat.read(at, Ok(())), Verdict::Ready);
        assert_eq!(
            beat.read_at(),
            at + QUIET,
            "a late kubelet: read a minute on"
        );

        let failed = beat.read(at, Err(ReadFailure::Storage("no answer within 5 s".into())));
        let Verdict::NotReady(why) = failed else {
            panic!("{failed:?}")
        };
        assert!(why.contains("kube-node-lease/node-1"), "{why}");
        assert!(why.contains("no answer within 5 s"), "{why}");
        assert_eq!(beat.read_at(), at + STALE);

        let refused = beat.read(at, Err(ReadFailure::Credentials("403".into())));
        assert!(matches!(refused, Verdict::Unknown(_)), "{refused:?}");
    }
}
