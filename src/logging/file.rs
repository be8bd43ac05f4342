//! The log file as one plugin process writes it, while other processes
//! append to it and rotate it too.
//!
//! Each record is one `write(2)` with `O_APPEND`, made holding the lock
//! file exclusive, after checking that the open file is still the one at
//! `log_file_path` (else it reopens it) and that the record fits: the size
//! check and the append are one step for every process, so the file never
//! outgrows `max_size`, however many plugins write at once (a record is a
//! few hundred bytes: the lock is held for microseconds). A rotation renames
//! the file holding the same lock, so no record ever lands in a backup that
//! is being compressed, and none is lost or written twice. A record that
//! would take the file past `max_size` first rotates it (lumberjack's
//! rule); when that cannot be done (the lock held too long by another
//! process, an error, or the file found full again [`ROUNDS`] times), the
//! record goes to stderr only. A record larger than `max_size` goes to
//! stderr only (lumberjack refuses it too).
//!
//! After waiting [`WAIT`] for the lock once in vain, a process stops
//! waiting: from then on it writes if the lock is free and otherwise
//! without it (a record then may, rarely, land in a backup being
//! compressed and be lost, or pass `max_size`), and rotates only if the
//! lock is free.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use jiff::Timestamp;

use super::limits::Limits;
use super::lock::{Guard, LockFile, Mode, WAIT};
use super::names::Naming;
use super::rotation::{self, Rotated};

/// How often a record may find the file full again after a rotation.
const ROUNDS: usize = 8;

/// One process's handle on the log file.
#[derive(Debug)]
pub struct LogFile {
    path: PathBuf,
    naming: Naming,
    limits: Limits,
    lock: LockFile,
    file: File,
    /// How long to wait for the lock: [`WAIT`], zero once that was not
    /// enough.
    patience: Duration,
    /// A problem was reported on stderr (once per process, not per record).
    reported: bool,
}

impl LogFile {
    /// Creates the parent directories (0755, as Calico) and opens the file
    /// to append (0644). Prunes the backups, as lumberjack does when it
    /// opens the file, if no other process holds the lock.
    pub fn open(path: impl AsRef<Path>, limits: Limits) -> io::Result<LogFile> {
        let path = path.as_ref();
        if let Some(parent) = path.parent()
            && !parent.as_os_str().is_empty()
        {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)?;
        }
        let lock = LockFile::open(path)?;
        let naming = Naming::new(path);
        if let Some(_guard) = lock.lock(Mode::Exclusive, Duration::ZERO)?
            && let Err(e) = rotation::prune(&naming, &limits, Timestamp::now())
        {
            eprintln!("calico: pruning the backups of {}: {e}", path.display());
        }
        Ok(LogFile {
            file: open_append(path)?,
            path: path.to_path_buf(),
            naming,
            limits,
            lock,
            patience: WAIT,
            reported: false,
        })
    }

    /// Appends one record, rotating first if it needs to. Problems are
    /// reported on stderr, where the record is anyway.
    pub fn write_record(&mut self, record: &[u8]) {
        if let Err(e) = self.append(record)
            && !self.reported
        {
            self.reported = true;
            eprintln!("calico: log file {}: {e}", self.path.display());
        }
    }

    fn append(&mut self, record: &[u8]) -> io::Result<()> {
        let incoming = u64::try_from(record.len()).unwrap_or(u64::MAX);
        if incoming > self.limits.max_size {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!(
                    "a record of {incoming} bytes is larger than log_file_max_size ({} bytes)",
                    self.limits.max_size
                ),
            ));
        }
        // Each round either writes or sees a rotation done (by this process
        // or another); others may fill the new file before this one is back.
        let mut problem = None;
        let mut written = None;
        for _ in 0..ROUNDS {
            let guard = lock_for_record(&self.lock, &mut self.patience)?;
            let size = follow(&self.path, &mut self.file)?;
            if !rotation::needs_rotation(size, incoming, self.limits.max_size) {
                written = Some(self.file.write_all(record));
                break;
            }
            drop(guard);
            match rotation::rotate(
                &self.path,
                &self.naming,
                &self.lock,
                &self.limits,
                incoming,
                self.patience,
            )? {
                Rotated::Yes { problem: Some(e) } => problem = problem.or(Some(e)),
                Rotated::Yes { problem: None } | Rotated::NotNeeded => {}
                Rotated::Busy => {
                    self.patience = Duration::ZERO;
                    written = Some(Err(io::Error::new(
                        io::ErrorKind::WouldBlock,
                        "another process holds the lock too long to rotate: \
                         records that do not fit go to stderr only",
                    )));
                    break;
                }
            }
        }
        written.unwrap_or_else(|| {
            Err(io::Error::other(
                "others filled the file faster than it rotated: a record went to stderr only",
            ))
        })?;
        problem.map_or(Ok(()), Err)
    }
}

/// The lock, exclusive (the size check and the append are one step), or
/// `None` when it could not be had in time (the record is then written
/// without it, and the process stops waiting).
fn lock_for_record<'a>(
    lock: &'a LockFile,
    patience: &mut Duration,
) -> io::Result<Option<Guard<'a>>> {
    let guard = lock.lock(Mode::Exclusive, *patience)?;
    if guard.is_none() {
        *patience = Duration::ZERO;
    }
    Ok(guard)
}

fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o644)
        .open(path)
}

/// Reopens `path` into `file` unless `file` still is the file there
/// (another process rotated it); the size of the file.
fn follow(path: &Path, file: &mut File) -> io::Result<u64> {
    let open = file.metadata()?;
    match std::fs::metadata(path) {
        Ok(there) if there.dev() == open.dev() && there.ino() == open.ino() => Ok(open.len()),
        Ok(_) => {
            *file = open_append(path)?;
            Ok(file.metadata()?.len())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            *file = open_append(path)?;
            Ok(file.metadata()?.len())
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logging::compress::gunzip;
    use crate::logging::names;

    const DAY: Duration = Duration::from_secs(86400);

    fn limits(max_size: u64, max_count: usize) -> Limits {
        Limits::new(max_size, max_count, 3650 * DAY)
    }

    /// The lines of the backups, oldest first (decompressed), then of the
    /// live file.
    fn all_lines(log: &Path) -> Vec<String> {
        let naming = Naming::new(log);
        let mut backups = naming.list().unwrap().backups;
        backups.reverse();
        let mut text = Vec::new();
        for b in &backups {
            let content = if b.compressed {
                gunzip(&b.path).unwrap()
            } else {
                std::fs::read(&b.path).unwrap()
            };
            assert!(content.ends_with(b"\n"), "{b:?} ends mid-line");
            text.extend(content);
        }
        text.extend(std::fs::read(log).unwrap_or_default());
        String::from_utf8(text)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn record(writer: usize, i: usize) -> String {
        format!("2024-01-02T03:04:05.000000Z  INFO writer={writer} record={i:05} padding\n")
    }

    #[test]
    fn records_rotate_into_gzipped_backups_and_only_the_oldest_go() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("sub/dir/cni.log");
        let mut f = LogFile::open(&log, limits(1000, 2)).unwrap();
        let written: Vec<String> = (0..100).map(|i| record(0, i)).collect();
        for r in &written {
            f.write_record(r.as_bytes());
        }
        assert!(!f.reported);
        let mode = std::fs::metadata(log.parent().unwrap()).unwrap().mode();
        assert_eq!(mode & 0o777 & !0o022, 0o755 & !0o022);
        let backups = Naming::new(&log).list().unwrap().backups;
        assert_eq!(backups.len(), 2, "max_count: {backups:?}");
        assert!(backups.iter().all(|b| b.compressed), "{backups:?}");
        for b in &backups {
            assert!(gunzip(&b.path).unwrap().len() <= 1000);
        }
        assert!(std::fs::metadata(&log).unwrap().len() <= 1000);
        let kept = all_lines(&log);
        let expected: Vec<String> = written[written.len() - kept.len()..]
            .iter()
            .map(|r| r.trim_end().to_owned())
            .collect();
        assert!(kept.len() > 20, "{kept:?}");
        assert_eq!(kept, expected, "the newest records, in order");
    }

    #[test]
    fn a_writer_follows_the_file_another_process_rotated() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("cni.log");
        let mut a = LogFile::open(&log, limits(300, 10)).unwrap();
        let mut b = LogFile::open(&log, limits(300, 10)).unwrap();
        a.write_record(record(1, 0).as_bytes());
        for i in 0..4 {
            b.write_record(record(2, i).as_bytes());
        }
        // b rotated: a's open file is now the backup.
        assert_eq!(Naming::new(&log).list().unwrap().backups.len(), 1);
        a.write_record(record(1, 1).as_bytes());
        let live = std::fs::read_to_string(&log).unwrap();
        assert_eq!(live, record(2, 3) + &record(1, 1));
        assert_eq!(
            all_lines(&log),
            [record(1, 0), record(2, 0), record(2, 1), record(2, 2)]
                .iter()
                .chain([record(2, 3), record(1, 1)].iter())
                .map(|r| r.trim_end().to_owned())
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn concurrent_writers_lose_and_duplicate_nothing() {
        const WRITERS: usize = 6;
        const RECORDS: usize = 300;
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("cni.log");
        std::thread::scope(|s| {
            for w in 0..WRITERS {
                let log = &log;
                s.spawn(move || {
                    // Its own file and lock descriptions, as a process has.
                    let mut f = LogFile::open(log, limits(4096, 100_000)).unwrap();
                    for i in 0..RECORDS {
                        f.write_record(record(w, i).as_bytes());
                    }
                    assert!(!f.reported);
                });
            }
        });
        let listing = Naming::new(&log).list().unwrap();
        assert!(listing.temps.is_empty(), "{:?}", listing.temps);
        let rotations = listing.backups.len();
        assert!(rotations >= 20, "{rotations} rotations");
        assert!(listing.backups.iter().all(|b| b.compressed));
        let mut got = all_lines(&log);
        let mut expected: Vec<String> = (0..WRITERS)
            .flat_map(|w| (0..RECORDS).map(move |i| record(w, i).trim_end().to_owned()))
            .collect();
        got.sort();
        expected.sort();
        assert_eq!(got.len(), expected.len());
        assert!(got == expected, "lines lost, duplicated or torn");
    }

    #[test]
    fn the_file_never_outgrows_max_size_when_rotation_is_impossible() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("cni.log");
        std::fs::write(&log, record(0, 0).repeat(10)).unwrap();
        let size = std::fs::metadata(&log).unwrap().len();
        let mut f = LogFile::open(&log, limits(size + 10, 10)).unwrap();
        let other = LockFile::open(&log).unwrap();
        let held = other.lock(Mode::Exclusive, WAIT).unwrap().unwrap();
        let started = std::time::Instant::now();
        f.write_record(record(1, 0).as_bytes());
        f.write_record(record(1, 1).as_bytes());
        assert!(started.elapsed() < 2 * WAIT, "waits once, not per record");
        assert_eq!(std::fs::metadata(&log).unwrap().len(), size);
        drop(held);
        f.write_record(record(1, 2).as_bytes());
        assert_eq!(std::fs::read_to_string(&log).unwrap(), record(1, 2));
        assert_eq!(Naming::new(&log).list().unwrap().backups.len(), 1);
    }

    #[test]
    fn a_record_larger_than_max_size_is_refused_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("cni.log");
        let mut f = LogFile::open(&log, limits(10, 10)).unwrap();
        f.write_record(b"0123456789a");
        assert!(f.reported);
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 0);
        f.write_record(b"0123456789");
        assert_eq!(std::fs::read(&log).unwrap(), b"0123456789");
    }

    #[test]
    fn opening_prunes_as_lumberjack_does() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("cni.log");
        let naming = Naming::new(&log);
        let old = names::compressed(&naming.backup(Timestamp::now() - 40 * DAY));
        let young = names::compressed(&naming.backup(Timestamp::now() - DAY));
        std::fs::write(&old, b"x").unwrap();
        std::fs::write(&young, b"x").unwrap();
        let _f = LogFile::open(&log, Limits::new(1000, 10, 30 * DAY)).unwrap();
        assert!(!old.exists());
        assert!(young.exists());
    }
}
