//! Another process's lock: bounded waits for it (SQLite's busy handler,
//! the retries of the one-off schema creation), and SQLite's errors as the
//! store's (busy, locked, unopenable or full: unavailable).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rusqlite::ErrorCode;

use crate::datastore::DatastoreError;

impl From<rusqlite::Error> for DatastoreError {
    fn from(e: rusqlite::Error) -> Self {
        let message = format!("sqlite: {e}");
        match e.sqlite_error_code() {
            Some(
                ErrorCode::DatabaseBusy
                | ErrorCode::DatabaseLocked
                | ErrorCode::CannotOpen
                | ErrorCode::ReadOnly
                | ErrorCode::DiskFull
                | ErrorCode::SystemIoFailure,
            ) => DatastoreError::Unavailable(message),
            _ => DatastoreError::Other(message),
        }
    }
}

pub(super) fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// Runs `op` until it stops failing with SQLITE_BUSY or `deadline` passes.
pub(super) fn retry_while_busy<T>(
    deadline: Instant,
    mut op: impl FnMut() -> rusqlite::Result<T>,
) -> Result<T, DatastoreError> {
    loop {
        match op() {
            Err(e) if is_busy(&e) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            other => return other.map_err(DatastoreError::from),
        }
    }
}

/// How long a connection waits for another process's write lock in total.
pub(super) static BUSY_WAIT_LIMIT_MICROS: AtomicU64 = AtomicU64::new(0);
/// One wait for a busy lock. SQLite's own handler sleeps 1, 2, 5, 10 … 100
/// ms between tries, which turns a few concurrent plugins' sub-millisecond
/// transactions into tens of milliseconds of waiting; short sleeps keep the
/// wait close to the holder's transaction time.
pub(super) const BUSY_WAIT_STEP: Duration = Duration::from_micros(200);

/// SQLite's busy handler: `true` to try again after a short sleep.
pub(super) fn wait_while_busy(attempt: i32) -> bool {
    let waited = u64::try_from(attempt).unwrap_or(0) * BUSY_WAIT_STEP.as_micros() as u64;
    if waited >= BUSY_WAIT_LIMIT_MICROS.load(Ordering::Relaxed) {
        return false;
    }
    std::thread::sleep(BUSY_WAIT_STEP);
    true
}
