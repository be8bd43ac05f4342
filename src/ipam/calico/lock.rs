//! The host lock around allocation and release (`ipam_lock_file`, default
//! `/var/run/calico/ipam.lock`): an exclusive `flock`, so that the
//! plugins of one node take turns rather than racing on the same blocks.
//! It is an optimisation only — every write is compare-and-swap — so, as
//! in Calico, failing to take it (or not getting it before the deadline)
//! is logged and the call goes on without it.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use tokio::time::Instant;

pub const DEFAULT_LOCK_FILE: &str = "/var/run/calico/ipam.lock";

/// A held lock; released when dropped (the file closes).
#[derive(Debug)]
pub struct HostLock {
    held: Option<Flock<File>>,
}

impl HostLock {
    /// Whether the lock is really held (not gone on without it).
    pub fn is_held(&self) -> bool {
        self.held.is_some()
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
            Ok(Ok(Ok(held))) => return HostLock { held: Some(held) },
            Ok(Ok(Err(e))) => Err(e.to_string()),
            Ok(Err(_)) => Err("the waiting thread ended".to_string()),
            Err(_) => Err("not free before the deadline".to_string()),
        },
    };
    if let Err(why) = outcome {
        tracing::warn!(path = %path.display(), "IPAM host lock: {why}; going on without it");
    }
    HostLock { held: None }
}
