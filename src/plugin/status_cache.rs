//! STATUS's ready answer kept between calls, so that a runtime asking
//! every few seconds (kubelet: every 5 s) costs the datastore one full
//! check a window (`status_cache_seconds`, default 15 minutes: 7 API
//! requests on the Kubernetes datastore) and one read every
//! `status_probe_seconds` (default 2 minutes: ClusterInformation, which
//! tells the datastore answers, accepts the credentials and is ready), not
//! a full check a call: on an idle node, under one API request a minute.
//!
//! Under `status_cache_dir` (`cni-status` beside the embedded datastore,
//! `/var/lib/calico/cni-status` by default), per network:
//!
//! ```text
//! <network>.json      the last ready full check: its key, when it and the
//!                     last probe began (0600)
//! <network>.changed   touched by every ADD and DEL of the network (its mtime)
//! ```
//!
//! Only a ready answer is kept; a not-ready full check removes it. The
//! answer stands while its key (the network, a digest of its config, the
//! call's variables and its credentials) is the same, its full check began
//! less than the window ago, and no ADD or DEL of the network ended since
//! that check began (an ADD's allocation during the check, say, is caught
//! by the marker's time, where removing the answer alone would be undone
//! by the check's write). What the verb checks between full checks is
//! `plugin::status`'s.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::cni::NetConf;

/// The layout of the answer file; another is read as no answer.
const FORMAT: u32 = 1;

/// A kept answer: STATUS was ready by a full check that began at
/// `checked_at_ms` (Unix milliseconds), for the key `key`, and the
/// datastore still answered and was ready by a probe that began at
/// `probed_at_ms` (the full check's time until one is made).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    pub format: u32,
    pub key: String,
    pub checked_at_ms: u64,
    pub probed_at_ms: u64,
}

impl Answer {
    pub fn new(key: String, checked_at: SystemTime) -> Answer {
        Answer {
            format: FORMAT,
            key,
            checked_at_ms: unix_ms(checked_at),
            probed_at_ms: unix_ms(checked_at),
        }
    }

    /// The same answer, confirmed by a probe that began at `at`.
    pub fn probed(&self, at: SystemTime) -> Answer {
        Answer {
            probed_at_ms: unix_ms(at),
            ..self.clone()
        }
    }

    pub fn checked_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.checked_at_ms)
    }

    fn probed_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.probed_at_ms.max(self.checked_at_ms))
    }
}

/// Whether a call may answer from the cache (`Fresh`, with the answer's
/// age), may once a probe confirms it (`Probe`, with the time since the
/// last confirmation), or why it checks afresh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Due {
    Fresh(Duration),
    Probe(Duration),
    /// `status_cache_seconds` is 0.
    Off,
    /// No answer kept (or one this build cannot read).
    NoAnswer,
    /// The network's config, the call's variables or the credentials differ.
    KeyChanged,
    /// The full check began a window ago or more (or in the future: the
    /// clock was set back).
    Expired(Duration),
    /// An ADD or DEL of the network ended since the full check began.
    Changed,
}

impl std::fmt::Display for Due {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Due::Fresh(age) => write!(f, "the kept answer is {} ms old", age.as_millis()),
            Due::Probe(since) => write!(
                f,
                "the kept answer was last confirmed {} ms ago",
                since.as_millis()
            ),
            Due::Off => f.write_str("status_cache_seconds is 0"),
            Due::NoAnswer => f.write_str("no answer kept"),
            Due::KeyChanged => {
                f.write_str("the kept answer is of another config, environment or credentials")
            }
            Due::Expired(age) => {
                write!(f, "the kept answer's full check is {} s old", age.as_secs())
            }
            Due::Changed => f.write_str("an ADD or DEL of the network since its full check"),
        }
    }
}

/// Whether `answer` stands for a call of `key` at `now`: the window is not
/// zero, the keys match, the check began less than `window` ago, and the
/// network's last ADD or DEL (`changed_at`) ended before it began; and
/// whether a probe must confirm it first (the last confirmation began
/// `probe` ago or more; a zero `probe`: never).
pub fn due(
    answer: Option<&Answer>,
    key: &str,
    now: SystemTime,
    (window, probe): (Duration, Duration),
    changed_at: Option<SystemTime>,
) -> Due {
    if window.is_zero() {
        return Due::Off;
    }
    let Some(answer) = answer.filter(|a| a.format == FORMAT) else {
        return Due::NoAnswer;
    };
    if answer.key != key {
        return Due::KeyChanged;
    }
    let checked_at = answer.checked_at();
    let age = match now.duration_since(checked_at) {
        Ok(age) if age < window => age,
        Ok(age) => return Due::Expired(age),
        Err(_) => return Due::Expired(Duration::ZERO),
    };
    // Millisecond precision for the check's start: a change within the
    // same millisecond counts as after it.
    if changed_at.is_some_and(|c| unix_ms(c) >= answer.checked_at_ms) {
        return Due::Changed;
    }
    match now.duration_since(answer.probed_at()) {
        _ if probe.is_zero() => Due::Fresh(age),
        Ok(since) if since < probe => Due::Fresh(age),
        Ok(since) => Due::Probe(since),
        Err(_) => Due::Probe(Duration::ZERO),
    }
}

/// What an answer is keyed by, each part told apart from the next (a
/// length before each): the parts in, a hex SHA-256 out.
pub struct Key(Sha256);

impl Default for Key {
    fn default() -> Key {
        Key::new()
    }
}

impl Key {
    pub fn new() -> Key {
        let mut k = Key(Sha256::new());
        k.part("calico-cni status key", b"1");
        k
    }

    /// One part: its label and its bytes.
    pub fn part(&mut self, label: &str, bytes: &[u8]) -> &mut Key {
        for piece in [label.as_bytes(), bytes] {
            self.0.update((piece.len() as u64).to_be_bytes());
            self.0.update(piece);
        }
        self
    }

    pub fn finish(self) -> String {
        self.0
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// The answers of one network, in the config's `status_cache_dir`.
#[derive(Debug, Clone)]
pub struct Cache {
    dir: PathBuf,
    network: String,
}

impl Cache {
    /// The cache of `conf`'s network (its name is a CNI identifier: a
    /// letter or digit first, then letters, digits and `_.-`).
    pub fn of(conf: &NetConf) -> Cache {
        Cache::at(conf.status_cache_dir(), &conf.name)
    }

    pub fn at(dir: PathBuf, network: &str) -> Cache {
        Cache {
            dir,
            network: network.to_string(),
        }
    }

    /// The directory of every network's answers.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn answer_path(&self) -> PathBuf {
        self.dir.join(format!("{}.json", self.network))
    }

    fn marker_path(&self) -> PathBuf {
        self.dir.join(format!("{}.changed", self.network))
    }

    /// The kept answer, if there is one that parses.
    pub fn load(&self) -> Option<Answer> {
        let bytes = std::fs::read(self.answer_path()).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// When the network's last ADD or DEL ended, if any did.
    pub fn changed_at(&self) -> Option<SystemTime> {
        std::fs::metadata(self.marker_path())
            .and_then(|m| m.modified())
            .ok()
    }

    /// Keeps `answer`: a temporary file of mode 0600 renamed over the
    /// answer (no fsync: a lost answer costs one full check).
    pub fn store(&self, answer: &Answer) -> std::io::Result<()> {
        let path = self.answer_path();
        let tmp = self
            .dir
            .join(format!(".{}.json.{}", self.network, std::process::id()));
        let write = |dir_made: bool| -> std::io::Result<()> {
            if dir_made {
                make_dir(&self.dir)?;
            }
            let mut f = private_file(&tmp, true)?;
            f.write_all(&serde_json::to_vec(answer)?)?;
            std::fs::rename(&tmp, &path)
        };
        let done = match write(false) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => write(true),
            other => other,
        };
        if done.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        done
    }

    /// Removes the kept answer (a not-ready full check).
    pub fn forget(&self) {
        let _ = std::fs::remove_file(self.answer_path());
    }

    /// An ADD or DEL of the network has ended: the marker's time set to
    /// now (the file made, 0600, if need be) and the answer removed, so
    /// that the next STATUS checks afresh. Best effort: errors are logged.
    pub fn invalidate(&self) {
        let marker = self.marker_path();
        let touch = |dir_made: bool| -> std::io::Result<()> {
            if dir_made {
                make_dir(&self.dir)?;
            }
            private_file(&marker, false)?.set_modified(SystemTime::now())
        };
        let touched = match touch(false) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => touch(true),
            other => other,
        };
        if let Err(e) = touched {
            tracing::warn!(
                "could not mark STATUS's answer stale ({}): {e}",
                marker.display()
            );
        }
        self.forget();
    }
}

fn make_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// `path` opened for writing, made with mode 0600 if absent (`truncate`:
/// emptied).
fn private_file(path: &Path, truncate: bool) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(truncate)
        .mode(0o600)
        .open(path)
}

/// `t` in Unix milliseconds (0 before the epoch).
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    #[test]
    fn an_answer_stands_for_its_key_within_the_window_until_a_change() {
        let a = Answer::new("k".into(), at(0));
        let no_probe = (MIN, Duration::ZERO);
        let fresh = |now, changed| due(Some(&a), "k", now, no_probe, changed);
        assert_eq!(fresh(at(0), None), Due::Fresh(Duration::ZERO));
        assert_eq!(fresh(at(59), None), Due::Fresh(Duration::from_secs(59)));
        assert_eq!(fresh(at(60), None), Due::Expired(MIN));
        // The clock set back: checked afresh.
        assert_eq!(
            due(Some(&a), "k", at(0) - MIN, no_probe, None),
            Due::Expired(Duration::ZERO)
        );
        // An ADD or DEL that ended before the check began changes nothing;
        // one that ended as it began, or since, does.
        assert_eq!(
            fresh(at(10), Some(at(0) - MIN)),
            Due::Fresh(Duration::from_secs(10))
        );
        assert_eq!(fresh(at(10), Some(at(0))), Due::Changed);
        assert_eq!(fresh(at(10), Some(at(5))), Due::Changed);
        assert_eq!(
            due(Some(&a), "other", at(1), no_probe, None),
            Due::KeyChanged
        );
        assert_eq!(due(None, "k", at(1), no_probe, None), Due::NoAnswer);
        assert_eq!(
            due(Some(&a), "k", at(1), (Duration::ZERO, MIN), None),
            Due::Off
        );
        let old = Answer {
            format: 0,
            ..a.clone()
        };
        assert_eq!(due(Some(&old), "k", at(1), no_probe, None), Due::NoAnswer);
    }

    #[test]
    fn a_probe_confirms_an_answer_every_interval_within_the_window() {
        let (window, probe) = (Duration::from_secs(900), Duration::from_secs(120));
        let a = Answer::new("k".into(), at(0));
        let d = |a: &Answer, now| due(Some(a), "k", now, (window, probe), None);
        assert_eq!(d(&a, at(119)), Due::Fresh(Duration::from_secs(119)));
        assert_eq!(d(&a, at(120)), Due::Probe(Duration::from_secs(120)));
        let probed = a.probed(at(120));
        assert_eq!(d(&probed, at(200)), Due::Fresh(Duration::from_secs(200)));
        assert_eq!(d(&probed, at(240)), Due::Probe(Duration::from_secs(120)));
        // The window bounds every probe: a full check at its end.
        assert_eq!(
            d(&a.probed(at(850)), at(900)),
            Due::Expired(Duration::from_secs(900))
        );
        // A change since the full check beats a probe.
        assert_eq!(
            due(Some(&probed), "k", at(130), (window, probe), Some(at(125))),
            Due::Changed
        );
    }

    #[test]
    fn the_key_tells_every_part_apart() {
        let key = |parts: &[(&str, &[u8])]| {
            let mut k = Key::new();
            for (label, bytes) in parts {
                k.part(label, bytes);
            }
            k.finish()
        };
        let base = key(&[("network", b"net1"), ("config", b"{}")]);
        assert_eq!(base, key(&[("network", b"net1"), ("config", b"{}")]));
        assert_eq!(base.len(), 64);
        for other in [
            key(&[("network", b"net2"), ("config", b"{}")]),
            key(&[("network", b"net1"), ("config", b"{ }")]),
            // The same bytes split otherwise.
            key(&[("network", b"net1{"), ("config", b"}")]),
            key(&[("network", b"net1"), ("config", b"{}"), ("kubeconfig", b"")]),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn answers_are_kept_privately_per_network_and_invalidated() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::at(dir.path().join("cni-status"), "net1");
        let other = Cache::at(dir.path().join("cni-status"), "net2");
        assert_eq!(cache.load(), None);
        let a = Answer::new("k".into(), SystemTime::now());
        cache.store(&a).unwrap();
        assert_eq!(cache.load(), Some(a.clone()));
        assert_eq!(other.load(), None);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&cache.answer_path()), 0o600);
        assert_eq!(mode(&dir.path().join("cni-status")), 0o700);
        // Nothing left beside it but the answer.
        let names: Vec<_> = std::fs::read_dir(dir.path().join("cni-status"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["net1.json"]);

        assert_eq!(cache.changed_at(), None);
        cache.invalidate();
        assert_eq!(cache.load(), None);
        let changed = cache.changed_at().unwrap();
        assert!(unix_ms(changed) >= a.checked_at_ms);
        assert_eq!(
            due(Some(&a), "k", SystemTime::now(), (MIN, MIN), Some(changed)),
            Due::Changed
        );
        assert_eq!(mode(&dir.path().join("cni-status/net1.changed")), 0o600);
        assert_eq!(other.changed_at(), None);
        // A network whose directory is not there yet: invalidated all the
        // same (the directory made).
        let fresh = Cache::at(dir.path().join("new/cni-status"), "net1");
        fresh.invalidate();
        assert!(fresh.changed_at().is_some());
    }
}
