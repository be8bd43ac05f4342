//! The release queue's storage: one file per DEL whose datastore part
//! could not be done, in `release_queue_dir`, written so that it survives
//! power loss (a temporary file, fsync'd, renamed over the entry, the
//! directory fsync'd) and readable by any later invocation on the node.
//! An entry is keyed by network, container ID and interface: it owes
//! exactly what a DEL of that attachment releases.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The CNI variables a DEL of the attachment needs (never the rest of the
/// environment, which may hold credentials).
pub const KEPT_VARS: [&str; 5] = [
    "CNI_CONTAINERID",
    "CNI_IFNAME",
    "CNI_ARGS",
    "CNI_PATH",
    "FELIX_INTERFACEPREFIX",
];

/// What a DEL still owes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Owed {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    /// The DEL's network config, as given (its datastore and IPAM).
    pub config: Value,
    /// The DEL's CNI variables ([`KEPT_VARS`]).
    pub vars: HashMap<String, String>,
    /// Why the last attempt failed.
    pub error: String,
    pub attempts: u32,
    /// Unix seconds: when it was first recorded, and when to try again.
    pub since: u64,
    pub next_attempt: u64,
}

impl Owed {
    /// The entry's file name: `<network>_<container ID>_<ifname>.json`
    /// (each part is made of `[A-Za-z0-9_.-]`, checked by the contract).
    pub fn file_name(&self) -> String {
        entry_name(&self.network, &self.container_id, &self.ifname)
    }
}

pub fn entry_name(network: &str, container_id: &str, ifname: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    format!(
        "{}_{}_{}.json",
        clean(network),
        clean(container_id),
        clean(ifname)
    )
}

pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The pause before attempt `n + 1`: 5 s doubling to 5 minutes.
pub fn backoff(attempts: u32) -> Duration {
    Duration::from_secs((5u64 << attempts.min(6)).min(300))
}

/// The queue in one directory.
#[derive(Debug, Clone)]
pub struct Journal {
    dir: PathBuf,
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

impl Journal {
    pub fn new(dir: PathBuf) -> Journal {
        Journal { dir }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Records `owed` (replacing an entry of the same attachment, whose
    /// first time and attempts are kept and counted on).
    pub fn record(&self, mut owed: Owed) -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::create_dir_all(&self.dir)?;
        let name = owed.file_name();
        let path = self.dir.join(&name);
        if let Some(previous) = self.read(&path) {
            owed.since = previous.since;
            owed.attempts = previous.attempts + 1;
        }
        owed.next_attempt = now_secs() + backoff(owed.attempts).as_secs();
        let tmp = self.dir.join(format!(".{name}.tmp"));
        {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&serde_json::to_vec_pretty(&owed).expect("JSON values serialize"))?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &path)?;
        sync_dir(&self.dir)
    }

    fn read(&self, path: &Path) -> Option<Owed> {
        let bytes = std::fs::read(path).ok()?;
        match serde_json::from_slice(&bytes) {
            Ok(o) => Some(o),
            Err(e) => {
                tracing::warn!(path = %path.display(), "unreadable release queue entry: {e}");
                None
            }
        }
    }

    /// Every entry, oldest first; none when the directory does not exist.
    pub fn entries(&self) -> Vec<Owed> {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out: Vec<Owed> = dir
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .filter(|p| {
                !p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            })
            .filter_map(|p| self.read(&p))
            .collect();
        out.sort_by_key(|o| o.since);
        out
    }

    /// Removes the entry of an attachment (done, or superseded by a new ADD
    /// of it); absent is fine.
    pub fn remove(&self, network: &str, container_id: &str, ifname: &str) -> std::io::Result<()> {
        let path = self.dir.join(entry_name(network, container_id, ifname));
        match std::fs::remove_file(&path) {
            Ok(()) => sync_dir(&self.dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owed(cid: &str) -> Owed {
        Owed {
            network: "net1".into(),
            container_id: cid.into(),
            ifname: "eth0".into(),
            config: serde_json::json!({"name": "net1"}),
            vars: HashMap::new(),
            error: "datastore down".into(),
            attempts: 0,
            since: now_secs(),
            next_attempt: 0,
        }
    }

    #[test]
    fn entries_are_recorded_counted_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::new(dir.path().join("q"));
        assert!(j.entries().is_empty());
        j.record(owed("c1")).unwrap();
        j.record(owed("c2")).unwrap();
        j.record(owed("c1")).unwrap();
        let entries = j.entries();
        assert_eq!(entries.len(), 2);
        let c1 = entries.iter().find(|o| o.container_id == "c1").unwrap();
        assert_eq!(c1.attempts, 1);
        assert!(c1.next_attempt >= now_secs() + 9);
        j.remove("net1", "c1", "eth0").unwrap();
        j.remove("net1", "c1", "eth0").unwrap();
        assert_eq!(j.entries().len(), 1);
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(j.dir()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        assert_eq!(backoff(0), Duration::from_secs(5));
        assert_eq!(backoff(1), Duration::from_secs(10));
        assert_eq!(backoff(20), Duration::from_secs(300));
    }
}
