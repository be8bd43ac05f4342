//! What a long-running watcher of the datastore (`calico install --watch`
//! on the node) tells STATUS, so that STATUS learns of a failure only the
//! API server can see — ClusterInformation's `datastoreReady` turned
//! false, the plugin's ServiceAccount (and so every token made for it)
//! deleted, the API server gone — within seconds, at the cost of one watch
//! request per object every few minutes instead of a probe a call.
//!
//! `<status_cache_dir>/datastore-watch.json` (0600): the API server
//! watched, what the watcher knows ([`Verdict`]), and when it last said
//! so. The watcher writes it at
//! every change and every [`HEARTBEAT`]; a report older than [`FRESH`] is
//! no report (the watcher has stopped), and STATUS goes back to its probe.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The report's file, in the status cache's directory.
pub const FILE: &str = "datastore-watch.json";

/// How often the watcher confirms its report when nothing changes.
pub const HEARTBEAT: Duration = Duration::from_secs(10);

/// How old a report may be and still stand.
pub const FRESH: Duration = Duration::from_secs(25);

/// The layout of the report; another is read as no report.
const FORMAT: u32 = 1;

/// What the watcher knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", content = "reason", rename_all = "kebab-case")]
pub enum Verdict {
    /// Every object watched is as a ready datastore has it.
    Ready,
    /// An object watched says the datastore will refuse the plugin (why):
    /// STATUS is not ready, with no request of its own.
    NotReady(String),
    /// A watch is failing (why): the watcher knows nothing, and STATUS
    /// checks for itself.
    Unknown(String),
}

/// The watcher's report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub format: u32,
    /// The API server watched (its URL as the client has it).
    pub server: String,
    #[serde(flatten)]
    pub verdict: Verdict,
    /// When the watcher said so (Unix milliseconds).
    pub at_ms: u64,
}

impl Report {
    pub fn new(server: &str, verdict: Verdict, at: SystemTime) -> Report {
        Report {
            format: FORMAT,
            server: same_server(server).to_string(),
            verdict,
            at_ms: at
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        }
    }

    /// The report, if it is of `server`, in this layout, and less than
    /// [`FRESH`] old at `now` (a report from the future: none).
    pub fn standing(self, server: &str, now: SystemTime) -> Option<Report> {
        let at = UNIX_EPOCH + Duration::from_millis(self.at_ms);
        let age = now.duration_since(at).ok()?;
        (self.format == FORMAT && age < FRESH && self.server == same_server(server)).then_some(self)
    }
}

/// A server's URL without the trailing slash the client may add.
fn same_server(server: &str) -> &str {
    server.trim_end_matches('/')
}

/// The report's path in `dir`.
pub fn path_in(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

/// The report in `dir`, if one parses.
pub fn load(dir: &Path) -> Option<Report> {
    serde_json::from_slice(&std::fs::read(path_in(dir)).ok()?).ok()
}

/// Writes `report` into `dir` (made, 0700, if need be): a temporary file
/// of mode 0600 renamed over the last.
pub fn store(dir: &Path, report: &Report) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let tmp = dir.join(format!(".{FILE}.{}", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(&serde_json::to_vec(report)?))
        .and_then(|()| std::fs::rename(&tmp, path_in(dir)));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_stands_for_its_server_while_fresh() {
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let ready = Report::new("https://10.96.0.1:443/", Verdict::Ready, t0);
        assert_eq!(ready.server, "https://10.96.0.1:443");
        let stands = |r: &Report, server, secs| {
            r.clone()
                .standing(server, t0 + Duration::from_secs(secs))
                .is_some()
        };
        assert!(stands(&ready, "https://10.96.0.1:443", 0));
        assert!(stands(&ready, "https://10.96.0.1:443/", 24));
        assert!(!stands(&ready, "https://10.96.0.1:443", 25));
        assert!(!stands(&ready, "https://192.0.2.2:6443", 1));
        assert!(
            ready
                .clone()
                .standing("https://10.96.0.1:443", t0 - Duration::from_secs(1))
                .is_none()
        );

        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("cni-status");
        assert_eq!(load(&sub), None);
        let not = Report::new("https://k:6443", Verdict::NotReady("deleted".into()), t0);
        store(&sub, &not).unwrap();
        assert_eq!(load(&sub), Some(not.clone()));
        let text = std::fs::read_to_string(path_in(&sub)).unwrap();
        assert!(
            text.contains(r#""verdict":"not-ready","reason":"deleted""#),
            "{text}"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path_in(&sub))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        store(&sub, &ready).unwrap();
        assert_eq!(load(&sub), Some(ready));
        assert_eq!(std::fs::read_dir(&sub).unwrap().count(), 1);
    }
}
