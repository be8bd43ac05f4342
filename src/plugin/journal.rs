//! The release queue's storage: one file per DEL whose datastore part
//! could not be done, written so that it survives power loss (a temporary
//! file, fsync'd, renamed over the entry, the directory fsync'd) and
//! readable by any later invocation on the node.
//!
//! Layout under `release_queue_dir`:
//!
//! ```text
//! <network>/<container ID>+<ifname>.json   owed, by network
//! .dead/<network>/<container ID>+<ifname>.json   dead letters
//! ```
//!
//! A call looks only at its own network's directory, so the entries of
//! other networks (or of networks whose config is gone) cost it nothing.
//! An entry's modification time is when it is next due: whether anything
//! is due is known from the directory and a `stat` per entry, without
//! reading one. (Network names start with a letter or digit, so `.dead`
//! is never a network's directory; entries of the first layout, flat
//! `<network>_<cid>_<ifname>.json` files, are moved into it by
//! [`Journal::networks`].)

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

/// The dead letters' directory, under the queue's.
const DEAD: &str = ".dead";

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
    /// Attempts that failed after the DEL that recorded the entry.
    pub attempts: u32,
    /// Unix seconds: when it was first recorded, when it was last tried,
    /// and when to try again.
    pub since: u64,
    #[serde(default)]
    pub last_attempt: u64,
    pub next_attempt: u64,
    /// Dead letters: why it was given up on, and when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_since: Option<u64>,
}

impl Owed {
    /// What a DEL of `container_id`'s `ifname` on `network` owes, as it
    /// failed with `error` now; `vars` are its CNI variables.
    pub fn new(
        network: String,
        container_id: String,
        ifname: String,
        config: Value,
        vars: HashMap<String, String>,
        error: String,
    ) -> Owed {
        Owed {
            network,
            container_id,
            ifname,
            config,
            vars,
            error,
            attempts: 0,
            since: now_secs(),
            last_attempt: 0,
            next_attempt: 0,
            dead_reason: None,
            dead_since: None,
        }
    }

    /// The entry's file name in its network's directory.
    pub fn file_name(&self) -> String {
        entry_name(&self.container_id, &self.ifname)
    }
}

/// `[A-Za-z0-9._-]` kept, every other byte `%XX`: one name per value.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"._-".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `<container ID>+<ifname>.json` (a container ID never holds `+`).
pub fn entry_name(container_id: &str, ifname: &str) -> String {
    format!("{}+{}.json", encode(container_id), encode(ifname))
}

pub fn now_secs() -> u64 {
    secs(SystemTime::now())
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The pause after `attempts` failed attempts: 5 s doubling to 5 minutes.
pub fn backoff(attempts: u32) -> Duration {
    Duration::from_secs((5u64 << attempts.min(6)).min(300))
}

/// One network's entries as its directory lists them.
#[derive(Debug, Default)]
pub struct Listing {
    /// Every entry's path, with whether it is due.
    pub entries: Vec<(PathBuf, bool)>,
}

impl Listing {
    pub fn holds(&self, name: &str) -> bool {
        self.entries
            .iter()
            .any(|(p, _)| p.file_name().is_some_and(|n| n == name))
    }

    pub fn due(&self) -> impl Iterator<Item = &Path> {
        self.entries
            .iter()
            .filter(|(_, due)| *due)
            .map(|(p, _)| p.as_path())
    }
}

/// The queue in one directory.
#[derive(Debug, Clone)]
pub struct Journal {
    dir: PathBuf,
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

fn is_entry(path: &Path) -> bool {
    path.extension().is_some_and(|x| x == "json")
        && !path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'))
}

impl Journal {
    pub fn new(dir: PathBuf) -> Journal {
        Journal { dir }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn network_dir(&self, network: &str) -> PathBuf {
        self.dir.join(encode(network))
    }

    fn dead_dir(&self, network: &str) -> PathBuf {
        self.dir.join(DEAD).join(encode(network))
    }

    /// Where the entry of an attachment lives.
    pub fn path_of(&self, network: &str, container_id: &str, ifname: &str) -> PathBuf {
        self.network_dir(network)
            .join(entry_name(container_id, ifname))
    }

    /// One network's entries, each marked due or not (its modification
    /// time has come): a directory read and a `stat` per entry; nothing at
    /// all when the network has no directory.
    pub fn list(&self, network: &str) -> Listing {
        let Ok(dir) = std::fs::read_dir(self.network_dir(network)) else {
            return Listing::default();
        };
        let now = SystemTime::now();
        let entries = dir
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| is_entry(p))
            .map(|p| {
                let due = std::fs::metadata(&p)
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t <= now);
                (p, due)
            })
            .collect();
        Listing { entries }
    }

    /// Reads an entry; `None` when it is gone (or unreadable, logged).
    pub fn read(&self, path: &Path) -> Option<Owed> {
        let bytes = std::fs::read(path).ok()?;
        match serde_json::from_slice(&bytes) {
            Ok(o) => Some(o),
            Err(e) => {
                tracing::warn!(path = %path.display(), "unreadable release queue entry: {e}");
                None
            }
        }
    }

    /// Writes `owed` to `path` atomically, due at its `next_attempt`.
    fn write_at(&self, path: &Path, owed: &Owed) -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = path.parent().unwrap_or(&self.dir);
        std::fs::create_dir_all(dir)?;
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let tmp = dir.join(format!(".{name}.tmp"));
        {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&serde_json::to_vec_pretty(owed).expect("JSON values serialize"))?;
            f.set_modified(UNIX_EPOCH + Duration::from_secs(owed.next_attempt))?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        sync_dir(dir)
    }

    /// Writes `owed` as its network's entry (its schedule as it says).
    pub fn write(&self, owed: &Owed) -> std::io::Result<()> {
        let path = self.path_of(&owed.network, &owed.container_id, &owed.ifname);
        self.write_at(&path, owed)
    }

    /// Records what a failed DEL owes: a new entry due after the first
    /// pause, or (a DEL of an attachment already queued failed again) the
    /// entry with its first time kept and one more failed attempt.
    pub fn record(&self, mut owed: Owed) -> std::io::Result<Owed> {
        let path = self.path_of(&owed.network, &owed.container_id, &owed.ifname);
        let now = now_secs();
        if let Some(previous) = self.read(&path) {
            owed.since = previous.since;
            owed.attempts = previous.attempts + 1;
            owed.last_attempt = now;
        }
        owed.next_attempt = now + backoff(owed.attempts).as_secs();
        self.write_at(&path, &owed)?;
        Ok(owed)
    }

    /// Removes the entry of an attachment (done, or superseded by a new ADD
    /// of it); absent is fine.
    pub fn remove(&self, network: &str, container_id: &str, ifname: &str) -> std::io::Result<()> {
        remove_file(&self.path_of(network, container_id, ifname))
    }

    /// The networks with a directory in the queue. Entries of the first,
    /// flat layout are moved into their network's directory first.
    pub fn networks(&self) -> Vec<String> {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut networks = Vec::new();
        for e in dir.filter_map(Result::ok) {
            let path = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            if path.is_dir() {
                networks.push(name);
            } else if is_entry(&path) {
                // The first layout: read it, write it where it belongs.
                if let Some(owed) = self.read(&path) {
                    let moved = self.write(&owed).and_then(|()| remove_file(&path));
                    match moved {
                        Ok(()) => {
                            if !networks.contains(&encode(&owed.network)) {
                                networks.push(encode(&owed.network));
                            }
                        }
                        Err(e) => {
                            tracing::warn!(path = %path.display(), "cannot move a release queue entry: {e}")
                        }
                    }
                }
            }
        }
        networks.sort();
        networks.dedup();
        networks
    }

    /// Every owed entry of every network (not dead letters), oldest first.
    pub fn pending(&self) -> Vec<(PathBuf, Owed)> {
        let mut out: Vec<(PathBuf, Owed)> = self
            .networks()
            .iter()
            .flat_map(|n| self.read_dir_entries(&self.dir.join(n)))
            .collect();
        out.sort_by_key(|(_, o)| o.since);
        out
    }

    /// Every dead letter, oldest first.
    pub fn dead(&self) -> Vec<(PathBuf, Owed)> {
        let root = self.dir.join(DEAD);
        let Ok(dir) = std::fs::read_dir(&root) else {
            return Vec::new();
        };
        let mut out: Vec<(PathBuf, Owed)> = dir
            .filter_map(Result::ok)
            .filter(|e| e.path().is_dir())
            .flat_map(|e| self.read_dir_entries(&e.path()))
            .collect();
        out.sort_by_key(|(_, o)| o.since);
        out
    }

    fn read_dir_entries(&self, dir: &Path) -> Vec<(PathBuf, Owed)> {
        let Ok(listing) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        listing
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| is_entry(p))
            .filter_map(|p| self.read(&p).map(|o| (p, o)))
            .collect()
    }

    /// Gives up on `owed`: written as a dead letter with `reason`, its
    /// owed entry removed.
    pub fn dead_letter(&self, mut owed: Owed, reason: &str) -> std::io::Result<Owed> {
        owed.dead_reason = Some(reason.to_string());
        owed.dead_since = Some(now_secs());
        let path = self.dead_dir(&owed.network).join(owed.file_name());
        self.write_at(&path, &owed)?;
        self.remove(&owed.network, &owed.container_id, &owed.ifname)?;
        Ok(owed)
    }

    /// Puts a dead letter (or an owed entry) back in the queue, due now,
    /// with its attempts counted from zero again.
    pub fn revive(&self, mut owed: Owed) -> std::io::Result<()> {
        let dead = self.dead_dir(&owed.network).join(owed.file_name());
        owed.dead_reason = None;
        owed.dead_since = None;
        owed.attempts = 0;
        owed.next_attempt = now_secs();
        self.write(&owed)?;
        remove_file(&dead)
    }

    /// Removes a dead letter for good.
    pub fn forget_dead(&self, owed: &Owed) -> std::io::Result<()> {
        remove_file(&self.dead_dir(&owed.network).join(owed.file_name()))
    }
}

fn remove_file(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => path.parent().map_or(Ok(()), sync_dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owed(network: &str, cid: &str) -> Owed {
        Owed::new(
            network.into(),
            cid.into(),
            "eth0".into(),
            serde_json::json!({"name": network}),
            HashMap::new(),
            "datastore down".into(),
        )
    }

    #[test]
    fn entries_are_recorded_counted_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::new(dir.path().join("q"));
        assert!(j.pending().is_empty());
        j.record(owed("net1", "c1")).unwrap();
        j.record(owed("net1", "c2")).unwrap();
        let again = j.record(owed("net1", "c1")).unwrap();
        assert_eq!(again.attempts, 1);
        assert!(again.next_attempt >= now_secs() + 9);
        let entries = j.pending();
        assert_eq!(entries.len(), 2);
        j.remove("net1", "c1", "eth0").unwrap();
        j.remove("net1", "c1", "eth0").unwrap();
        assert_eq!(j.pending().len(), 1);
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path().join("q/net1"))
            .unwrap()
            .collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn a_listing_is_one_networks_and_knows_what_is_due() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::new(dir.path().to_path_buf());
        assert!(j.list("net1").entries.is_empty());
        let mut due = owed("net1", "due");
        due.next_attempt = now_secs() - 1;
        j.write(&due).unwrap();
        j.record(owed("net1", "later")).unwrap();
        j.record(owed("net2", "other")).unwrap();
        let listing = j.list("net1");
        assert_eq!(listing.entries.len(), 2);
        assert!(listing.holds(&entry_name("later", "eth0")));
        let due: Vec<_> = listing.due().collect();
        assert_eq!(due.len(), 1);
        assert_eq!(j.read(due[0]).unwrap().container_id, "due");
        assert_eq!(j.networks(), ["net1", "net2"]);
    }

    #[test]
    fn names_are_one_per_attachment() {
        assert_ne!(entry_name("a_b", "c"), entry_name("a", "b_c"));
        assert_ne!(entry_name("a", "eth_0"), entry_name("a", "eth:0"));
        assert_eq!(entry_name("abc-1.2_x", "eth0"), "abc-1.2_x+eth0.json");
        assert_eq!(entry_name("c", "e/0"), "c+e%2F0.json");
    }

    #[test]
    fn dead_letters_are_kept_apart_and_can_be_revived() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::new(dir.path().to_path_buf());
        let o = j.record(owed("net1", "c1")).unwrap();
        j.dead_letter(o, "the IPAM plugin is gone").unwrap();
        assert!(j.pending().is_empty());
        assert!(j.list("net1").entries.is_empty());
        let dead = j.dead();
        assert_eq!(dead.len(), 1);
        assert_eq!(
            dead[0].1.dead_reason.as_deref(),
            Some("the IPAM plugin is gone")
        );
        // `.dead` is not a network.
        assert_eq!(j.networks(), ["net1"]);
        j.revive(dead[0].1.clone()).unwrap();
        assert!(j.dead().is_empty());
        let listing = j.list("net1");
        assert_eq!(listing.due().count(), 1);
    }

    #[test]
    fn entries_of_the_flat_layout_are_moved_into_their_network() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::new(dir.path().to_path_buf());
        let o = owed("net_1", "c1");
        std::fs::write(
            dir.path().join("net_1_c1_eth0.json"),
            serde_json::to_vec(&o).unwrap(),
        )
        .unwrap();
        assert_eq!(j.networks(), ["net_1"]);
        assert!(!dir.path().join("net_1_c1_eth0.json").exists());
        assert_eq!(j.pending()[0].1.container_id, "c1");
        assert_eq!(j.list("net_1").due().count(), 1);
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        assert_eq!(backoff(0), Duration::from_secs(5));
        assert_eq!(backoff(1), Duration::from_secs(10));
        assert_eq!(backoff(20), Duration::from_secs(300));
    }
}
