//! Logging with `tracing`: to stderr and, when `log_file_path` is set, to
//! that file, as Calico keeps it (its `ConfigureLogging`: lumberjack with
//! `log_file_max_size`/`_age`/`_count`, 0 meaning the default), plus
//! gzip-compressed backups and a hard cap on the bytes the logs take.
//! Never to stdout: stdout carries the CNI result.
//!
//! - [`limits`]: the settings as numbers (defaults, the cap);
//! - [`names`]: lumberjack's backup names;
//! - [`lock`]: the sidecar lock file shared by concurrent plugins;
//! - [`file`]: the appending writer that rotates before a record would
//!   take the file past its size;
//! - [`rotation`]: rename, prune, compress;
//! - [`compress`]: gzip to a temporary file.
//!
//! Problems with the log file itself are reported on stderr, not through
//! `tracing`: they arise inside the subscriber's writer.

mod compress;
mod file;
mod limits;
mod lock;
mod names;
mod rotation;

use std::io::{self, Write};
use std::sync::{Arc, Mutex};

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::MakeWriter;

pub use file::LogFile;
pub use limits::Limits;

/// What the config says about logging.
#[derive(Debug, Clone, Default)]
pub struct LogSettings {
    pub level: String,
    pub file: String,
    /// Rotate before the file would pass this many MiB (0 or less: 100).
    pub max_size_mb: i64,
    /// Delete backups older than this many days (0 or less: 30).
    pub max_age_days: i64,
    /// Keep at most this many backups (0 or less: 10).
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
    file: Option<Arc<Mutex<LogFile>>>,
}

struct TeeWriter<'a>(&'a Tee);

impl Write for TeeWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let _ = io::stderr().write_all(buf);
        if let Some(file) = &self.0.file
            && let Ok(mut f) = file.lock()
        {
            f.write_record(buf);
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

/// Installs the global subscriber. Safe to call once per process; a file
/// that cannot be opened is reported on stderr and logging continues there.
pub fn init(settings: &LogSettings) {
    let file = if settings.file.is_empty() {
        None
    } else {
        match LogFile::open(&settings.file, Limits::from_settings(settings)) {
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
}
