//! The host lock around allocation and release (`ipam_lock_file`, default
//! `/var/run/calico/ipam.lock`): an exclusive `flock`, so that the
//! plugins of one node take turns rather than racing on the same blocks.
//! It is an optimisation only — every write is compare-and-swap — so, as
//! in Calico, failing to take it (or not getting it before the deadline)
//! is logged and the call goes on without it.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::fcntl::{Flock, FlockArg};
use tokio::time::Instant;

use super::block_cache::BlockCache;

pub const DEFAULT_LOCK_FILE: &str = "/var/run/calico/ipam.lock";

/// A held lock; released when dropped (the file closes).
#[derive(Debug)]
pub struct HostLock {
    held: Option<Flock<File>>,
    path: PathBuf,
    /// Alive as long as the lock is held: what its block copies check.
    token: Arc<()>,
    /// When it was taken (for the debug log of how long it was held).
    since: Instant,
}

impl Drop for HostLock {
    fn drop(&mut self) {
        if self.held.is_some() {
            tracing::debug!(
                held_ms = self.since.elapsed().as_secs_f64() * 1e3,
                "IPAM host lock released"
            );
        }
    }
}

impl HostLock {
    /// Whether the lock is really held (not gone on without it).
    pub fn is_held(&self) -> bool {
        self.held.is_some()
    }

    /// The copies of the blocks the calls under this lock last wrote
    /// ([`BlockCache`]), for the datastore `identity` names; `None` when
    /// the lock is not held or the store gives no identity.
    pub fn block_cache(&self, identity: Option<String>) -> Option<BlockCache> {
        match (&self.held, identity) {
            (Some(_), Some(datastore)) => Some(BlockCache::new(&self.path, datastore, &self.token)),
            _ => None,
        }
    }
}

/// The lock file of a config (`""` = the default).
pub fn lock_path(configured: &str) -> PathBuf {
    if configured.is_empty() {
        PathBuf::from(DEFAULT_LOCK_FILE)
    } else {
        PathBuf::from(configured)
    }
}

fn open(path: &Path) -> std::io::Result<File> {
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o777)
            .create(dir)?;
    }
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o644)
        .open(path)
}

fn lock(path: &Path) -> std::io::Result<Flock<File>> {
    Flock::lock(open(path)?, FlockArg::LockExclusive).map_err(|(_, errno)| errno.into())
}

/// Takes the lock, waiting at most until `deadline`. The wait is on a
/// thread of its own (a blocking flock cannot be cancelled; an abandoned
/// waiter unlocks as soon as it gets the lock, and dies with the process).
pub async fn acquire(path: &Path, deadline: Instant) -> HostLock {
    let asked = Instant::now();
    let owned = path.to_path_buf();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("ipam-lock".into())
        .spawn(move || {
            // Sent back to the caller; dropped (unlocked) if it gave up.
            let _ = tx.send(lock(&owned));
        });
    let outcome: std::result::Result<(), String> = match spawned {
        Err(e) => Err(e.to_string()),
        Ok(_) => match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(Ok(held))) => {
                tracing::debug!(
                    waited_ms = asked.elapsed().as_secs_f64() * 1e3,
                    "IPAM host lock taken"
                );
                return HostLock {
                    held: Some(held),
                    path: path.to_path_buf(),
                    token: Arc::new(()),
                    since: Instant::now(),
                };
            }
            Ok(Ok(Err(e))) => Err(e.to_string()),
            Ok(Err(_)) => Err("the waiting thread ended".to_string()),
            Err(_) => Err("not free before the deadline".to_string()),
        },
    };
    if let Err(why) = outcome {
        tracing::warn!(path = %path.display(), "IPAM host lock: {why}; going on without it");
    }
    HostLock {
        held: None,
        path: path.to_path_buf(),
        token: Arc::new(()),
        since: Instant::now(),
    }
}
