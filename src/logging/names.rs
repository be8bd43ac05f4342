//! Lumberjack's backup names, which Calico's CNI log directory holds:
//! `<stem>-<2006-01-02T15-04-05.000>.<ext>` with the rotation time in UTC
//! (`cni.log` → `cni-2024-01-02T03-04-05.678.log`), `.gz` appended once
//! compressed. The extension is Go's `filepath.Ext` (from the last dot);
//! a backup's age is the time in its name, as lumberjack reads it.

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use jiff::civil::DateTime;
use jiff::tz::TimeZone;

/// Go's `2006-01-02T15-04-05.000`.
const TIME_FORMAT: &str = "%Y-%m-%dT%H-%M-%S%.3f";
const GZ: &str = ".gz";
/// What a compression's temporary file has after the `.gz` name.
const TEMP_MARK: &str = ".gz.tmp-";

/// The names of one log file's backups.
#[derive(Debug, Clone)]
pub(super) struct Naming {
    dir: PathBuf,
    /// `<stem>-`
    prefix: String,
    /// `.<ext>`, or empty
    ext: String,
}

/// One backup file found in the directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Backup {
    pub path: PathBuf,
    pub time: Timestamp,
    pub compressed: bool,
    pub size: u64,
}

/// What the log directory holds besides the log file.
#[derive(Debug, Default)]
pub(super) struct Listing {
    /// Newest first.
    pub backups: Vec<Backup>,
    /// Compressions' temporary files, live or left by a killed process.
    pub temps: Vec<PathBuf>,
}

impl Naming {
    pub fn new(log: &Path) -> Naming {
        let dir = match log.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = log
            .file_name()
            .map(OsStr::to_string_lossy)
            .unwrap_or_default();
        let (stem, ext) = name.rfind('.').map_or((&*name, ""), |i| name.split_at(i));
        Naming {
            dir,
            prefix: format!("{stem}-"),
            ext: ext.to_string(),
        }
    }

    /// The uncompressed backup rotated at `time`.
    pub fn backup(&self, time: Timestamp) -> PathBuf {
        let stamp = TimeZone::UTC.to_datetime(time).strftime(TIME_FORMAT);
        self.dir.join(format!("{}{stamp}{}", self.prefix, self.ext))
    }

    /// The time and compression a backup's file name says, if it is one.
    pub fn parse(&self, file_name: &str) -> Option<(Timestamp, bool)> {
        let rest = file_name.strip_prefix(&self.prefix)?;
        let (rest, compressed) = match rest.strip_suffix(GZ) {
            Some(r) if r.ends_with(&self.ext) => (r, true),
            _ => (rest, false),
        };
        let stamp = rest.strip_suffix(&self.ext)?;
        let time = DateTime::strptime(TIME_FORMAT, stamp).ok()?;
        // Exactly Go's layout (jiff would also take other precisions).
        if time.strftime(TIME_FORMAT).to_string() != stamp {
            return None;
        }
        Some((TimeZone::UTC.to_timestamp(time).ok()?, compressed))
    }

    /// Whether `file_name` is a compression's temporary file for one of
    /// these backups.
    pub fn is_temp(&self, file_name: &str) -> bool {
        file_name
            .find(TEMP_MARK)
            .is_some_and(|i| self.parse(&file_name[..i]).is_some())
    }

    /// The directory's backups and temporary files.
    pub fn list(&self) -> io::Result<Listing> {
        let mut listing = Listing::default();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some((time, compressed)) = self.parse(name) {
                let Ok(meta) = entry.metadata() else { continue }; // just removed
                if meta.is_file() {
                    listing.backups.push(Backup {
                        path: entry.path(),
                        time,
                        compressed,
                        size: meta.len(),
                    });
                }
            } else if self.is_temp(name) {
                listing.temps.push(entry.path());
            }
        }
        listing
            .backups
            .sort_by(|a, b| b.time.cmp(&a.time).then(b.compressed.cmp(&a.compressed)));
        Ok(listing)
    }
}

/// `backup` with `.gz` appended.
pub(super) fn compressed(backup: &Path) -> PathBuf {
    let mut name = backup.as_os_str().to_owned();
    name.push(GZ);
    PathBuf::from(name)
}

/// A fresh temporary name for compressing `backup` (unique within the
/// machine: the process id and a per-process counter).
pub(super) fn temp(backup: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut name = backup.as_os_str().to_owned();
    name.push(format!(
        "{TEMP_MARK}{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn names_are_lumberjacks() {
        let n = Naming::new(Path::new("/var/log/calico/cni/cni.log"));
        let t = at("2024-01-02T03:04:05.678901Z");
        let b = n.backup(t);
        assert_eq!(
            b,
            Path::new("/var/log/calico/cni/cni-2024-01-02T03-04-05.678.log")
        );
        assert_eq!(
            compressed(&b),
            Path::new("/var/log/calico/cni/cni-2024-01-02T03-04-05.678.log.gz")
        );
        // Go's filepath.Ext: from the last dot; none, none.
        assert_eq!(
            Naming::new(Path::new("/l/a.b.txt")).backup(t),
            Path::new("/l/a.b-2024-01-02T03-04-05.678.txt")
        );
        assert_eq!(
            Naming::new(Path::new("cni")).backup(at("2024-11-30T23:59:59Z")),
            Path::new("./cni-2024-11-30T23-59-59.000")
        );
    }

    #[test]
    fn parsing_reads_the_time_back_and_rejects_other_files() {
        let n = Naming::new(Path::new("/l/cni.log"));
        let t = at("2024-01-02T03:04:05.678Z");
        assert_eq!(n.parse("cni-2024-01-02T03-04-05.678.log"), Some((t, false)));
        assert_eq!(
            n.parse("cni-2024-01-02T03-04-05.678.log.gz"),
            Some((t, true))
        );
        for other in [
            "cni.log",
            "cni.log.1",
            "cni.log.lock",
            "cni-2024-01-02T03-04-05.log",
            "cni-2024-01-02T03-04-05.6789.log",
            "cni-2024-01-02T03:04:05.678.log",
            "cni-2024-01-02T03-04-05.678.txt",
            "other-2024-01-02T03-04-05.678.log",
            "cni-2024-01-02T03-04-05.678.log.gz.tmp-12-0",
        ] {
            assert_eq!(n.parse(other), None, "{other}");
        }
        let b = n.backup(t);
        let tmp = temp(&b);
        assert!(n.is_temp(tmp.file_name().unwrap().to_str().unwrap()));
        assert_ne!(tmp, temp(&b), "temporary names are unique");
        assert!(!n.is_temp("cni-2024-01-02T03-04-05.678.log.gz"));
        assert!(!n.is_temp("cni.log.gz.tmp-1-1"));
    }

    #[test]
    fn listing_is_newest_first_and_finds_temps() {
        let dir = tempfile::tempdir().unwrap();
        let n = Naming::new(&dir.path().join("cni.log"));
        let old = n.backup(at("2024-01-01T00:00:00Z"));
        let new = n.backup(at("2024-02-01T00:00:00Z"));
        std::fs::write(compressed(&old), b"12345").unwrap();
        std::fs::write(&new, b"1").unwrap();
        std::fs::write(dir.path().join("cni.log"), b"live").unwrap();
        std::fs::write(dir.path().join("unrelated.log"), b"x").unwrap();
        let tmp = temp(&new);
        std::fs::write(&tmp, b"").unwrap();
        let l = n.list().unwrap();
        let got: Vec<_> = l
            .backups
            .iter()
            .map(|b| (b.path.clone(), b.compressed, b.size))
            .collect();
        assert_eq!(got, vec![(new, false, 1), (compressed(&old), true, 5)]);
        assert_eq!(l.temps, vec![tmp]);
    }
}
