//! The sidecar lock file (`<log>.lock`) that concurrent plugins share: a
//! writer holds it exclusive while it checks the file's size and appends a
//! record, a rotation while it renames the file and prunes the backups, a
//! compression holds it shared while it creates its temporary file. Waits are bounded, so that a stopped process holding it costs
//! the others at most [`WAIT`] once.
//!
//! `flock(2)` locks belong to an open file description: each [`LockFile`]
//! opens its own, so threads holding different ones exclude each other as
//! processes do.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The longest a writer or rotation waits for the lock.
pub(super) const WAIT: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Shared,
    Exclusive,
}

#[derive(Debug)]
pub(super) struct LockFile {
    file: File,
}

/// Held until dropped.
#[derive(Debug)]
pub(super) struct Guard<'a> {
    file: &'a File,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}

/// `<log>.lock`
pub(super) fn lock_path(log: &Path) -> PathBuf {
    let mut name = log.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

impl LockFile {
    pub fn open(log: &Path) -> io::Result<LockFile> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o644)
            .open(lock_path(log))?;
        Ok(LockFile { file })
    }

    /// The lock in `mode`, waiting at most `wait`; `None` when that was
    /// not enough.
    pub fn lock(&self, mode: Mode, wait: Duration) -> io::Result<Option<Guard<'_>>> {
        let give_up = Instant::now() + wait;
        let mut pause = Duration::from_micros(200);
        loop {
            match try_lock(&self.file, mode) {
                Ok(()) => return Ok(Some(Guard { file: &self.file })),
                Err(TryLockError::WouldBlock) if Instant::now() < give_up => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(10));
                }
                Err(TryLockError::WouldBlock) => return Ok(None),
                Err(TryLockError::Error(e)) => return Err(e),
            }
        }
    }
}

/// `flock` in `mode` without waiting: used on the lock file, and on a
/// backup or a temporary file to claim it for compressing.
pub(super) fn try_lock(file: &File, mode: Mode) -> Result<(), TryLockError> {
    match mode {
        Mode::Shared => file.try_lock_shared(),
        Mode::Exclusive => file.try_lock(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclusive_excludes_and_shared_shares_within_the_wait() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("cni.log");
        let (a, b) = (LockFile::open(&log).unwrap(), LockFile::open(&log).unwrap());
        assert!(lock_path(&log).exists());
        let shared = a.lock(Mode::Shared, WAIT).unwrap().expect("free");
        let also = b.lock(Mode::Shared, Duration::ZERO).unwrap();
        assert!(also.is_some(), "shared locks coexist");
        drop(also);
        let started = Instant::now();
        let none = b.lock(Mode::Exclusive, Duration::from_millis(50)).unwrap();
        assert!(none.is_none(), "exclusive waits for shared holders");
        assert!(started.elapsed() >= Duration::from_millis(50));
        drop(shared);
        let ex = b.lock(Mode::Exclusive, Duration::ZERO).unwrap();
        assert!(ex.is_some(), "free once the guard is dropped");
        assert!(a.lock(Mode::Shared, Duration::ZERO).unwrap().is_none());
    }
}
