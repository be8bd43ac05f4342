//! Logging with `tracing`: to stderr and, when `log_file_path` is set, to
//! that file (parents created, appended, rotated by size before this
//! process writes). Never to stdout: stdout carries the CNI result.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::MakeWriter;

/// What the config says about logging.
#[derive(Debug, Clone, Default)]
pub struct LogSettings {
    pub level: String,
    pub file: String,
    /// Rotate once the file reaches this many MiB.
    pub max_size_mb: i64,
    /// Delete rotated files older than this many days.
    pub max_age_days: i64,
    /// Keep at most this many rotated files.
    pub max_count: i64,
}

/// Calico's level parsing: `debug`, `info`, `error` (any case); anything
/// else is info.
pub fn parse_level(level: &str) -> LevelFilter {
    match level.to_ascii_lowercase().as_str() {
        "debug" => LevelFilter::DEBUG,
        "error" => LevelFilter::ERROR,
        _ => LevelFilter::INFO,
    }
}

/// Writes every record to stderr and, if open, to the log file.
#[derive(Clone)]
struct Tee {
    file: Option<Arc<Mutex<File>>>,
}

struct TeeWriter<'a>(&'a Tee);

impl Write for TeeWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let _ = io::stderr().write_all(buf);
        if let Some(file) = &self.0.file
            && let Ok(mut f) = file.lock()
        {
            // One write per record keeps concurrent processes' lines whole (O_APPEND).
            f.write_all(buf)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Tee {
    type Writer = TeeWriter<'a>;
    fn make_writer(&'a self) -> Self::Writer {
        TeeWriter(self)
    }
}

fn backup_name(path: &Path, n: i64) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

/// How long a plugin waits for another one's log rotation.
const ROTATION_LOCK_WAIT: Duration = Duration::from_millis(500);

/// Size-based rotation: `cni.log` → `cni.log.1` → … → `cni.log.<count>`;
/// backups beyond `max_count` or older than `max_age_days` are removed.
/// Runs under an exclusive lock so that concurrent plugins rotate once.
pub fn rotate_if_needed(path: &Path, settings: &LogSettings) -> io::Result<()> {
    let limit = u64::try_from(settings.max_size_mb.max(1)).unwrap_or(1) * 1024 * 1024;
    let big = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.len() >= limit)
            .unwrap_or(false)
    };
    if !big(path) {
        return Ok(());
    }
    let mut lock_path = path.as_os_str().to_owned();
    lock_path.push(".lock");
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o644)
        .open(lock_path)?;
    // Bounded: a process that holds the lock for long (stopped, say) makes
    // this one skip the rotation rather than wait; the next one rotates.
    let give_up = std::time::Instant::now() + ROTATION_LOCK_WAIT;
    let mut lock = lock;
    let _guard = loop {
        match nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(guard) => break guard,
            Err((file, nix::errno::Errno::EWOULDBLOCK)) if std::time::Instant::now() < give_up => {
                lock = file;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => return Ok(()),
            Err((_, e)) => return Err(io::Error::from(e)),
        }
    };
    if !big(path) {
        return Ok(()); // another process rotated it while we waited
    }
    let count = settings.max_count.max(0);
    if count == 0 {
        return std::fs::remove_file(path);
    }
    let _ = std::fs::remove_file(backup_name(path, count));
    for n in (1..count).rev() {
        let _ = std::fs::rename(backup_name(path, n), backup_name(path, n + 1));
    }
    std::fs::rename(path, backup_name(path, 1))?;
    if settings.max_age_days > 0 {
        let max_age =
            Duration::from_secs(u64::try_from(settings.max_age_days).unwrap_or(0) * 86400);
        for n in 1..=count {
            let p = backup_name(path, n);
            let old = std::fs::metadata(&p)
                .and_then(|m| m.modified())
                .map(|t| SystemTime::now().duration_since(t).unwrap_or_default() > max_age)
                .unwrap_or(false);
            if old {
                let _ = std::fs::remove_file(p);
            }
        }
    }
    Ok(())
}

fn open_log_file(settings: &LogSettings) -> io::Result<File> {
    let path = Path::new(&settings.file);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    rotate_if_needed(path, settings)?;
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o644)
        .open(path)
}

/// Installs the global subscriber. Safe to call once per process; a file
/// that cannot be opened is reported on stderr and logging continues there.
pub fn init(settings: &LogSettings) {
    let file = if settings.file.is_empty() {
        None
    } else {
        match open_log_file(settings) {
            Ok(f) => Some(Arc::new(Mutex::new(f))),
            Err(e) => {
                eprintln!("calico: cannot open log file {}: {e}", settings.file);
                None
            }
        }
    };
    let _ = tracing_subscriber::fmt()
        .with_max_level(parse_level(&settings.level))
        .with_writer(Tee { file })
        .with_target(false)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels() {
        assert_eq!(parse_level("DEBUG"), LevelFilter::DEBUG);
        assert_eq!(parse_level("Error"), LevelFilter::ERROR);
        assert_eq!(parse_level("warning"), LevelFilter::INFO);
        assert_eq!(parse_level(""), LevelFilter::INFO);
    }

    #[test]
    fn rotation_by_size_keeps_count() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("sub/cni.log");
        let settings = LogSettings {
            level: "info".into(),
            file: log.to_str().unwrap().into(),
            max_size_mb: 1,
            max_age_days: 30,
            max_count: 2,
        };
        for round in 0..4 {
            let mut f = open_log_file(&settings).unwrap();
            f.write_all(&vec![b'a' + round; 1024 * 1024]).unwrap();
        }
        let _ = open_log_file(&settings).unwrap();
        assert_eq!(
            std::fs::metadata(&log).unwrap().len(),
            0,
            "fresh file after rotation"
        );
        assert_eq!(std::fs::read(backup_name(&log, 1)).unwrap()[0], b'd');
        assert_eq!(std::fs::read(backup_name(&log, 2)).unwrap()[0], b'c');
        assert!(
            !backup_name(&log, 3).exists(),
            "only max_count backups are kept"
        );
    }
}
