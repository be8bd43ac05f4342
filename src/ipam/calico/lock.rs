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
use super::intents::Intents;

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
    /// Whether the call posted what it came for before waiting
    /// ([`acquire_posting`]).
    posted: bool,
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

    /// Whether the call had to wait and posted first.
    pub fn posted(&self) -> bool {
        self.posted
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

    /// The intents waiting beside this lock ([`Intents`]) of the datastore
    /// `identity` names, for the holder to serve; `None` when the lock is
    /// not held or the store gives no identity.
    pub fn intents(&self, identity: Option<String>) -> Option<Intents> {
        match (&self.held, identity) {
            (Some(_), Some(datastore)) => Some(Intents::new(&self.path, datastore)),
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

fn lock(path: &Path, how: FlockArg) -> std::io::Result<Option<Flock<File>>> {
    lock_file(open(path)?, how)
}

/// `how` on the open lock file: `None` when a non-blocking attempt finds
/// it held.
fn lock_file(file: File, how: FlockArg) -> std::io::Result<Option<Flock<File>>> {
    match Flock::lock(file, how) {
        Ok(held) => Ok(Some(held)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) if how == FlockArg::LockExclusiveNonblock => {
            Ok(None)
        }
        Err((_, errno)) => Err(errno.into()),
    }
}

/// The lock file opened (made if needed) on the blocking pool, ahead of
/// [`acquire_posting`]: a free lock is then taken with one non-blocking
/// flock on the caller's thread, not by a hand-off to the pool (0.1-0.5
/// ms on the allocation's path, more while the pool's threads are busy
/// with the datastore and the dataplane). `None` when it cannot be opened:
/// [`acquire_posting`] opens it again and reports why.
pub async fn open_ahead(path: PathBuf) -> Option<File> {
    crate::handoff::spawn_blocking(move || open(&path))
        .await
        .ok()?
        .ok()
}

/// Takes the lock, waiting at most until `deadline`. When it is free (a
/// node's usual case) it is taken at once: on the file opened ahead
/// (`opened`, see [`open_ahead`]) by a non-blocking flock, else on the
/// blocking pool; when it is held the wait is on a thread of its own (a
/// blocking flock cannot be cancelled; an abandoned waiter unlocks as soon
/// as it gets the lock, and dies with the process).
pub async fn acquire(path: &Path, deadline: Instant, opened: Option<File>) -> HostLock {
    acquire_posting(path, deadline, None, opened).await
}

/// Work a call does, off the runtime's thread, only when it has to wait
/// for the lock (true: done).
pub type Post = Box<dyn FnOnce() -> bool + Send>;

/// [`acquire`], doing `post` first if the lock is held by another call
/// (an allocation asked of the holder: [`super::intents`]).
pub async fn acquire_posting(
    path: &Path,
    deadline: Instant,
    post: Option<Post>,
    opened: Option<File>,
) -> HostLock {
    let asked = Instant::now();
    let mut posted = false;
    let owned = path.to_path_buf();
    let at_once = match opened {
        // (LOCK_NB on an open file asks nothing of the filesystem: it never
        // waits.)
        Some(file) => Ok(Ok(lock_file(file, FlockArg::LockExclusiveNonblock))),
        None => {
            tokio::time::timeout_at(
                deadline,
                crate::handoff::spawn_blocking(move || {
                    lock(&owned, FlockArg::LockExclusiveNonblock)
                }),
            )
            .await
        }
    };
    let outcome: std::result::Result<Flock<File>, String> = match at_once {
        Ok(Ok(Ok(Some(held)))) => Ok(held),
        Ok(Ok(Err(e))) => Err(e.to_string()),
        Err(_) => Err("not free before the deadline".to_string()),
        // Held by another call (or the pool failed): wait for it.
        Ok(Ok(Ok(None))) | Ok(Err(_)) => {
            if let Some(post) = post {
                let done = tokio::time::timeout_at(deadline, crate::handoff::spawn_blocking(post));
                posted = matches!(done.await, Ok(Ok(true)));
            }
            wait(path, deadline).await
        }
    };
    let held = match outcome {
        Ok(held) => {
            tracing::debug!(
                waited_ms = asked.elapsed().as_secs_f64() * 1e3,
                "IPAM host lock taken"
            );
            Some(held)
        }
        Err(why) => {
            tracing::warn!(path = %path.display(), "IPAM host lock: {why}; going on without it");
            None
        }
    };
    HostLock {
        held,
        path: path.to_path_buf(),
        token: Arc::new(()),
        since: Instant::now(),
        posted,
    }
}

/// Waits for the lock on a thread of its own, until `deadline`.
async fn wait(path: &Path, deadline: Instant) -> std::result::Result<Flock<File>, String> {
    let owned = path.to_path_buf();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("ipam-lock".into())
        .spawn(move || {
            // Sent back to the caller; dropped (unlocked) if it gave up.
            let _ = tx.send(lock(&owned, FlockArg::LockExclusive));
        })
        .map_err(|e| e.to_string())?;
    match tokio::time::timeout_at(deadline, rx).await {
        Ok(Ok(Ok(Some(held)))) => Ok(held),
        Ok(Ok(Ok(None))) => Err("the lock was not taken".to_string()),
        Ok(Ok(Err(e))) => Err(e.to_string()),
        Ok(Err(_)) => Err("the waiting thread ended".to_string()),
        Err(_) => Err("not free before the deadline".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Free, the lock is taken at once; held, a call waits for it until its
    /// deadline and then goes on without it; released while a call waits,
    /// that call gets it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_free_lock_is_taken_at_once_and_a_held_one_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/ipam.lock");
        // (Opened ahead, free: one non-blocking flock.)
        let opened = open_ahead(path.clone()).await;
        assert!(opened.is_some());
        let first = acquire(&path, Instant::now() + Duration::from_secs(5), opened).await;
        assert!(first.is_held());

        let asked = Instant::now();
        let opened = open_ahead(path.clone()).await;
        assert!(opened.is_some());
        let second = acquire(&path, asked + Duration::from_millis(200), opened).await;
        assert!(!second.is_held());
        assert!(asked.elapsed() >= Duration::from_millis(200));

        let waiter = tokio::spawn({
            let path = path.clone();
            async move {
                acquire(&path, Instant::now() + Duration::from_secs(5), None)
                    .await
                    .is_held()
            }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiter.is_finished());
        drop(first);
        assert!(waiter.await.unwrap());
    }
}
