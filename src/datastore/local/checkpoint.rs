//! The WAL kept short: a handle that closes when it has grown checkpoints
//! it, passively first, then truncating it when nobody is busy.

use super::{LocalStore, lock};

/// Frames in the WAL past which a closing connection checkpoints it (each
/// new process reads the whole WAL once, so it is kept short).
pub(super) const WAL_CHECKPOINT_FRAMES: u64 = 64;
/// A WAL frame: a 24-byte header and one page.
pub(super) const WAL_FRAME_BYTES: u64 = 24 + 4096;

impl Drop for LocalStore {
    fn drop(&mut self) {
        // A thread waiting for the next operation leaves now (and with it
        // the connection's lock, which the checkpoint takes).
        self.queue.close();
        let frames = std::fs::metadata(&self.wal).map_or(0, |m| m.len() / WAL_FRAME_BYTES);
        if frames < WAL_CHECKPOINT_FRAMES {
            return;
        }
        let conn = &mut *lock(&self.conn);
        // Fail fast when another process is reading or writing: one of the
        // next closers will do it.
        let _ = conn.busy_handler(None::<fn(i32) -> bool>);
        // First the frames are copied into the database (and both files
        // synced) by a passive checkpoint, which no other process's reads
        // or writes wait for; then, when that copied them all, a truncating
        // one starts the WAL over, holding the write lock only for the
        // truncation (a truncating checkpoint alone holds it through the
        // copy and both fsyncs: every write of a burst waited behind it).
        let checkpoint = |mode: &str| {
            conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })
        };
        let outcome = match checkpoint("PASSIVE") {
            Ok((busy, log, copied)) if busy != 0 || copied < log => Ok(false),
            Ok(_) => checkpoint("TRUNCATE").map(|(busy, _, _)| busy == 0),
            Err(e) => Err(e),
        };
        match outcome {
            Ok(true) => tracing::debug!(frames, "checkpointed and truncated the WAL"),
            Ok(false) => tracing::debug!(frames, "WAL checkpoint deferred: the store is busy"),
            Err(e) => tracing::debug!(frames, "WAL checkpoint failed: {e}"),
        }
    }
}
