//! Rotation, as lumberjack does it but safe between processes: under the
//! exclusive lock the live file is renamed to its backup name and the
//! backups are pruned; then, with the lock released, the rotating process
//! compresses the backup (and any a killed process left uncompressed), and
//! takes the lock again only to rename the `.gz` into place and remove the
//! uncompressed file.
//!
//! A backup being compressed is claimed with an `flock` on it (taken on the
//! live file before the rename), so two processes never compress the same
//! one; one pruned meanwhile is noticed (no links left) and its compressed
//! copy dropped.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use jiff::Timestamp;

use super::compress::{self, Gzipped};
use super::limits::Limits;
use super::lock::{self, LockFile, Mode, WAIT};
use super::names::{self, Naming};

/// What [`rotate`] did.
#[derive(Debug)]
pub(super) enum Rotated {
    /// The file was rotated (by this call); pruning or compressing may
    /// have failed after that.
    Yes { problem: Option<io::Error> },
    /// There was nothing to do: another process rotated it first, or it is
    /// small enough.
    NotNeeded,
    /// The lock could not be had in time.
    Busy,
}

/// Whether a file of `size` bytes must be rotated before `incoming` more
/// are appended (lumberjack's test; an empty file is never rotated).
pub(super) fn needs_rotation(size: u64, incoming: u64, max_size: u64) -> bool {
    size > 0 && size.saturating_add(incoming) > max_size
}

/// Rotates `log` if it still needs it once the exclusive lock is held
/// (at most `wait` for it), then compresses. An error before the rename
/// is returned; one after it is the rotation's `problem`.
pub(super) fn rotate(
    log: &Path,
    naming: &Naming,
    lock: &LockFile,
    limits: &Limits,
    incoming: u64,
    wait: Duration,
) -> io::Result<Rotated> {
    let Some(guard) = lock.lock(Mode::Exclusive, wait)? else {
        return Ok(Rotated::Busy);
    };
    let size = match std::fs::metadata(log) {
        Ok(meta) => meta.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Rotated::NotNeeded),
        Err(e) => return Err(e),
    };
    if !needs_rotation(size, incoming, limits.max_size) {
        return Ok(Rotated::NotNeeded);
    }
    let claim = File::open(log)?;
    let claimed = lock::try_lock(&claim, Mode::Exclusive).is_ok();
    let backup = free_name(naming, Timestamp::now());
    std::fs::rename(log, &backup)?;
    let pruned = prune(naming, limits, Timestamp::now());
    drop(guard);
    let compressed = if claimed {
        compress_one(&claim, &backup, lock)
    } else {
        Ok(())
    };
    drop(claim);
    let leftovers = compress_leftovers(naming, lock);
    Ok(Rotated::Yes {
        problem: pruned.and(compressed).and(leftovers).err(),
    })
}

/// The backup name for `now`, a millisecond later while that is taken.
fn free_name(naming: &Naming, now: Timestamp) -> std::path::PathBuf {
    let mut time = now;
    loop {
        let backup = naming.backup(time);
        if !backup.exists() && !names::compressed(&backup).exists() {
            return backup;
        }
        time += Duration::from_millis(1);
    }
}

/// Removes backups, oldest first, until at most `max_count` remain, none
/// older than `max_age` (by the time in its name), and the live file
/// (counted at `max_size`) plus the backups (an uncompressed one counted
/// twice: room for its compressed copy) fit in the cap. Also removes the
/// temporary files of compressions whose process is gone. To be called
/// with the lock held exclusive.
pub(super) fn prune(naming: &Naming, limits: &Limits, now: Timestamp) -> io::Result<()> {
    let listing = naming.list()?;
    let mut result = Ok(());
    let mut remove = |path: &Path| match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => result = Err(e),
        _ => {}
    };
    for temp in &listing.temps {
        let abandoned = File::open(temp).is_ok_and(|f| lock::try_lock(&f, Mode::Exclusive).is_ok());
        if abandoned {
            remove(temp);
        }
    }
    let cutoff = now.checked_sub(limits.max_age).ok();
    let mut used = limits.max_size;
    let mut kept = 0;
    let mut keeping = true;
    // Files of one rotation (a backup and its .gz, when a process died
    // between renaming the .gz and removing the backup) go together.
    for group in listing.backups.chunk_by(|a, b| a.time == b.time) {
        let size: u64 = group.iter().map(|b| b.size).sum();
        let reserve: u64 = if group.iter().any(|b| b.compressed) {
            0
        } else {
            size
        };
        let cost = size.saturating_add(reserve);
        keeping = keeping
            && kept < limits.max_count
            && cutoff.is_none_or(|c| group[0].time >= c)
            && used.saturating_add(cost) <= limits.cap;
        if keeping {
            used += cost;
            kept += 1;
        } else {
            group.iter().for_each(|b| remove(&b.path));
        }
    }
    result
}

/// Compresses the claimed backup `backup` (open as `src`): its `.gz` put
/// in place and the backup removed, unless it was pruned meanwhile. A
/// backup whose `.gz` is already there (a process died before removing
/// it) is just removed.
fn compress_one(src: &File, backup: &Path, lock: &LockFile) -> io::Result<()> {
    let gz = names::compressed(backup);
    let temp = if gz.exists() {
        None
    } else {
        match compress::gzip(src, backup, lock)? {
            Gzipped::Done(temp) => Some(temp),
            Gzipped::NotSmaller | Gzipped::Busy => return Ok(()),
        }
    };
    // Dropping `temp` without persisting it removes it.
    let Some(_guard) = lock.lock(Mode::Exclusive, WAIT)? else {
        return Ok(()); // the next rotation compresses it
    };
    if src.metadata()?.nlink() == 0 {
        return Ok(()); // pruned
    }
    if let Some(temp) = temp {
        temp.persist(&gz)?;
    }
    std::fs::remove_file(backup)
}

/// Compresses the uncompressed backups no other process is compressing.
fn compress_leftovers(naming: &Naming, lock: &LockFile) -> io::Result<()> {
    for backup in naming.list()?.backups.iter().filter(|b| !b.compressed) {
        let Ok(src) = File::open(&backup.path) else {
            continue; // just compressed or pruned
        };
        if lock::try_lock(&src, Mode::Exclusive).is_err() || src.metadata()?.nlink() == 0 {
            continue; // being compressed, or done since it was listed
        }
        compress_one(&src, &backup.path, lock)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logging::compress::gunzip;
    use crate::logging::compress::tests::noise;

    const DAY: Duration = Duration::from_secs(86400);

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    struct Dir {
        _tmp: tempfile::TempDir,
        log: std::path::PathBuf,
        naming: Naming,
        lock: LockFile,
    }

    fn dir() -> Dir {
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path().join("cni.log");
        Dir {
            naming: Naming::new(&log),
            lock: LockFile::open(&log).unwrap(),
            log,
            _tmp: tmp,
        }
    }

    impl Dir {
        /// A backup at `time`, `size` bytes, compressed or not.
        fn backup(&self, time: &str, size: usize, gz: bool) -> std::path::PathBuf {
            let mut path = self.naming.backup(at(time));
            if gz {
                path = names::compressed(&path);
            }
            std::fs::write(&path, vec![b'x'; size]).unwrap();
            path
        }

        fn names(&self) -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(self.log.parent().unwrap())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| n != "cni.log.lock")
                .collect();
            names.sort();
            names
        }
    }

    fn limits(max_size: u64, max_count: usize, max_age: Duration) -> Limits {
        Limits::new(max_size, max_count, max_age)
    }

    #[test]
    fn the_size_test_is_lumberjacks() {
        assert!(!needs_rotation(0, 10, 5), "an empty file takes any record");
        assert!(!needs_rotation(3, 2, 5));
        assert!(needs_rotation(3, 3, 5));
        assert!(needs_rotation(u64::MAX, 1, 5));
    }

    #[test]
    fn pruning_keeps_the_newest_max_count() {
        let d = dir();
        for day in 1..=5 {
            d.backup(&format!("2024-01-0{day}T00:00:00Z"), 10, day % 2 == 0);
        }
        let l = limits(1000, 2, 3650 * DAY);
        prune(&d.naming, &l, at("2024-01-06T00:00:00Z")).unwrap();
        assert_eq!(
            d.names(),
            [
                "cni-2024-01-04T00-00-00.000.log.gz",
                "cni-2024-01-05T00-00-00.000.log"
            ]
        );
    }

    #[test]
    fn pruning_removes_backups_older_than_max_age_by_their_name() {
        let d = dir();
        d.backup("2024-01-01T00:00:00Z", 10, true);
        d.backup("2024-01-02T00:00:01Z", 10, true);
        d.backup("2024-01-09T00:00:00Z", 10, false);
        // The files are all new on disk: only the names say their age.
        prune(
            &d.naming,
            &limits(1000, 10, 7 * DAY),
            at("2024-01-09T00:00:00Z"),
        )
        .unwrap();
        assert_eq!(
            d.names(),
            [
                "cni-2024-01-02T00-00-01.000.log.gz",
                "cni-2024-01-09T00-00-00.000.log"
            ]
        );
    }

    #[test]
    fn pruning_keeps_the_total_under_the_cap_oldest_first() {
        // max_size 1000, max_count 3: cap 5000, the live file counted 1000.
        let l = limits(1000, 3, 3650 * DAY);
        assert_eq!(l.cap, 5000);
        let now = at("2024-01-04T00:00:00Z");
        let d = dir();
        d.backup("2024-01-01T00:00:00Z", 10, true);
        d.backup("2024-01-02T00:00:00Z", 2000, true);
        d.backup("2024-01-03T00:00:00Z", 2000, true);
        prune(&d.naming, &l, now).unwrap();
        // 1000 + 2000 + 2000 fills the cap: the third goes, though the
        // count would allow it.
        assert_eq!(
            d.names(),
            [
                "cni-2024-01-02T00-00-00.000.log.gz",
                "cni-2024-01-03T00-00-00.000.log.gz"
            ]
        );
        let d = dir();
        d.backup("2024-01-01T00:00:00Z", 10, true);
        d.backup("2024-01-02T00:00:00Z", 2500, true);
        d.backup("2024-01-03T00:00:00Z", 2000, true);
        prune(&d.naming, &l, now).unwrap();
        // The second does not fit; the small oldest one would, but no
        // backup outlives a newer one.
        assert_eq!(d.names(), ["cni-2024-01-03T00-00-00.000.log.gz"]);
    }

    #[test]
    fn the_cap_counts_uncompressed_backups_twice() {
        let d = dir();
        let l = limits(1000, 3, 3650 * DAY);
        d.backup("2024-01-02T00:00:00Z", 1500, true);
        d.backup("2024-01-03T00:00:00Z", 1500, false);
        prune(&d.naming, &l, at("2024-01-04T00:00:00Z")).unwrap();
        // 1000 + 2 × 1500 = 4000; + 1500 > 5000.
        assert_eq!(d.names(), ["cni-2024-01-03T00-00-00.000.log"]);
    }

    #[test]
    fn pruning_removes_abandoned_temps_only() {
        let d = dir();
        let b = d.backup("2024-01-03T00:00:00Z", 10, false);
        let abandoned = names::temp(&b);
        std::fs::write(&abandoned, b"half").unwrap();
        let live = names::temp(&b);
        std::fs::write(&live, b"half").unwrap();
        let held = File::open(&live).unwrap();
        lock::try_lock(&held, Mode::Exclusive).unwrap();
        prune(&d.naming, &limits(1000, 3, DAY), at("2024-01-03T00:00:01Z")).unwrap();
        assert!(!abandoned.exists());
        assert!(live.exists(), "its writer still holds it");
        assert!(b.exists());
    }

    fn log_text(lines: std::ops::Range<usize>) -> Vec<u8> {
        lines
            .flat_map(|i| format!("2024-01-02T03:04:05.000000Z  INFO line {i}\n").into_bytes())
            .collect()
    }

    #[test]
    fn rotation_renames_compresses_and_round_trips() {
        let d = dir();
        let text = log_text(0..2000);
        std::fs::write(&d.log, &text).unwrap();
        let l = limits(text.len() as u64, 3, DAY);
        assert!(
            matches!(
                rotate(&d.log, &d.naming, &d.lock, &l, 0, WAIT).unwrap(),
                Rotated::NotNeeded
            ),
            "exactly max_size is still fine"
        );
        let before = Timestamp::now();
        assert!(matches!(
            rotate(&d.log, &d.naming, &d.lock, &l, 1, WAIT).unwrap(),
            Rotated::Yes { problem: None }
        ));
        assert!(!d.log.exists(), "the next writer creates it");
        let names = d.names();
        assert_eq!(names.len(), 1, "{names:?}");
        let (time, compressed) = d.naming.parse(&names[0]).unwrap();
        assert!(compressed, "{names:?}");
        assert!(time >= before - Duration::from_millis(1) && time <= Timestamp::now());
        let gz = d.log.parent().unwrap().join(&names[0]);
        assert_eq!(gunzip(&gz).unwrap(), text);
    }

    #[test]
    fn rotation_compresses_what_a_killed_process_left() {
        let d = dir();
        // A backup left uncompressed, one whose .gz was already renamed in,
        // and an abandoned temporary file.
        let left = d.naming.backup(at("2024-01-01T00:00:00Z"));
        let text = log_text(0..300);
        std::fs::write(&left, &text).unwrap();
        let both = d.backup("2024-01-02T00:00:00Z", 100, false);
        std::fs::write(names::compressed(&both), b"whole gz").unwrap();
        std::fs::write(names::temp(&left), b"half").unwrap();
        std::fs::write(&d.log, log_text(0..10)).unwrap();
        let l = limits(1 << 20, 10, 36500 * DAY);
        assert!(matches!(
            rotate(&d.log, &d.naming, &d.lock, &l, 1 << 20, WAIT).unwrap(),
            Rotated::Yes { problem: None }
        ));
        let names = d.names();
        assert_eq!(names.len(), 3, "{names:?}");
        assert_eq!(names[0], "cni-2024-01-01T00-00-00.000.log.gz");
        assert_eq!(names[1], "cni-2024-01-02T00-00-00.000.log.gz");
        assert!(names[2].ends_with(".log.gz"), "{names:?}");
        assert_eq!(gunzip(&names::compressed(&left)).unwrap(), text);
        assert_eq!(
            std::fs::read(names::compressed(&both)).unwrap(),
            b"whole gz",
            "kept, its uncompressed twin removed"
        );
    }

    #[test]
    fn incompressible_backups_stay_uncompressed() {
        let d = dir();
        let data = noise(50_000);
        std::fs::write(&d.log, &data).unwrap();
        let l = limits(data.len() as u64, 10, DAY);
        assert!(matches!(
            rotate(&d.log, &d.naming, &d.lock, &l, 1, WAIT).unwrap(),
            Rotated::Yes { problem: None }
        ));
        let names = d.names();
        assert_eq!(names.len(), 1, "{names:?}");
        assert!(names[0].ends_with(".log"), "{names:?}");
        assert_eq!(
            std::fs::read(d.log.parent().unwrap().join(&names[0])).unwrap(),
            data
        );
    }

    #[test]
    fn a_busy_lock_skips_the_rotation() {
        let d = dir();
        std::fs::write(&d.log, b"0123456789").unwrap();
        let other = LockFile::open(&d.log).unwrap();
        let _held = other.lock(Mode::Shared, WAIT).unwrap().unwrap();
        let l = limits(5, 10, DAY);
        assert!(matches!(
            rotate(&d.log, &d.naming, &d.lock, &l, 1, Duration::from_millis(20)).unwrap(),
            Rotated::Busy
        ));
        assert_eq!(d.names(), ["cni.log"]);
    }

    #[test]
    fn backup_names_never_collide() {
        let d = dir();
        let t = at("2024-01-01T00:00:00Z");
        std::fs::write(d.naming.backup(t), b"").unwrap();
        std::fs::write(
            names::compressed(&d.naming.backup(t + Duration::from_millis(1))),
            b"",
        )
        .unwrap();
        assert_eq!(
            free_name(&d.naming, t),
            d.naming.backup(t + Duration::from_millis(2))
        );
    }
}
