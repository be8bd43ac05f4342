//! Allocations asked for beside the host lock, for its holder to make in
//! its own block write: a group commit of the calls of one host.
//!
//! In a burst the calls of a host queue on the lock, and each would write
//! the same block in turn, one round trip after another. A call that has
//! to wait, and whose handle is already written (ahead of the lock,
//! naming the block its address most likely comes from), posts an
//! [`Intent`] first: one file per call, `<lock file>.intents/<handle
//! name>` (the directory 0700, files 0600, written whole and renamed into
//! place). The holder, about to write one of this host's blocks, takes
//! free addresses of it for the intents waiting (their handles made to
//! name that block first, where they name another), and writes them all
//! in its one block write; it marks each intent served. When a served call
//! gets the lock it finds its address in the copy of the block (or the
//! block as read), and writes nothing.
//!
//! Where the handle and the block are written in one transaction (etcd)
//! the waiter writes no handle ahead: the holder creates the handles of
//! the calls it serves in its own transaction, with the block.
//!
//! Only lock holders change an intent, and a call takes its own back as
//! soon as it holds the lock, so no two calls act on one intent at once.
//! The handle is written before the block, as for any allocation: a holder
//! makes an intent's handle name the block before it assigns the address,
//! and records the handle as written in the intent, so a waiter starts from
//! its handle as it is. A holder stopped between the handle's write and
//! the intent's leaves it [`State::Renaming`]: the waiter reads its handle
//! again. An intent past its call's deadline is not served; a call that
//! gives up waiting removes its own, and keeps its handle for the DEL that
//! follows (which removes the intent too, under the lock).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::block_cache::{blocking, write_whole};
use crate::datastore::ipam_model::IpamHandle;

/// An intent this close to its call's deadline is left alone.
const MARGIN: Duration = Duration::from_millis(500);

/// Where an intent stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum State {
    /// Waiting; its handle is as recorded.
    Posted,
    /// A holder was writing its handle: as recorded, or not; read it.
    Renaming,
    /// Its address is in the block its handle (as recorded) names.
    Served,
}

/// One waiting call's allocation of one address.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Intent {
    /// The datastore ([`crate::datastore::Store::identity`]).
    pub datastore: String,
    /// The allocation's handle ID.
    pub handle_id: String,
    /// The handle's object name.
    pub handle_name: String,
    /// The handle as last written (its block, its revision); `None` where
    /// the holder writes it with the block, in one transaction (etcd), and
    /// has not yet.
    pub handle: Option<IpamHandle>,
    /// The allocation's attributes.
    pub attrs: BTreeMap<String, String>,
    /// The pools the call asked for (empty: automatic).
    pub pools: Vec<String>,
    pub v6: bool,
    /// The call's deadline, in milliseconds since the epoch.
    pub expires_ms: u64,
    pub state: State,
}

impl Intent {
    /// Whether a holder may still serve it at `now`.
    pub fn live(&self, now: SystemTime) -> bool {
        let until = UNIX_EPOCH + Duration::from_millis(self.expires_ms);
        self.state == State::Posted && now + MARGIN < until
    }

    /// Whether its call's deadline has passed.
    pub fn expired(&self, now: SystemTime) -> bool {
        now > UNIX_EPOCH + Duration::from_millis(self.expires_ms)
    }

    /// The one block its handle names (with one address), if so.
    pub fn block(&self) -> Option<ipnet::IpNet> {
        match self.handle.as_ref()?.spec.block.iter().collect::<Vec<_>>()[..] {
            [(cidr, 1)] => cidr.parse().ok(),
            _ => None,
        }
    }
}

/// Milliseconds since the epoch of a deadline `left` from now.
pub fn expiry_in(left: Duration) -> u64 {
    (SystemTime::now() + left)
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The directory of the intents beside `lock_file`.
pub fn dir_beside(lock_file: &Path) -> PathBuf {
    let mut name = lock_file.file_name().unwrap_or_default().to_os_string();
    name.push(".intents");
    lock_file.with_file_name(name)
}

/// The intents beside one lock file, of one datastore.
#[derive(Debug, Clone)]
pub struct Intents {
    dir: PathBuf,
    datastore: String,
}

impl Intents {
    pub fn new(lock_file: &Path, datastore: String) -> Intents {
        Intents {
            dir: dir_beside(lock_file),
            datastore,
        }
    }

    pub fn datastore(&self) -> &str {
        &self.datastore
    }

    fn path(&self, handle_name: &str) -> Option<PathBuf> {
        // Handle names are DNS names (or Calico's etcd IDs): no `/`, and
        // none starts with a `.`, which marks a part-written file here.
        let plain = !handle_name.is_empty()
            && !handle_name.starts_with('.')
            && handle_name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
        plain.then(|| self.dir.join(handle_name))
    }

    /// Writes `intent` whole (blocking file work).
    pub fn write_now(&self, intent: &Intent) -> std::io::Result<()> {
        let path = self
            .path(&intent.handle_name)
            .ok_or_else(|| std::io::Error::other("not a handle name"))?;
        let bytes = serde_json::to_vec(intent).map_err(std::io::Error::other)?;
        let part = self
            .dir
            .join(format!(".{}.{}", std::process::id(), intent.handle_name));
        write_whole(&self.dir, &part, &path, &bytes)
    }

    /// Writes these intents (a holder's record of what it did).
    pub async fn write(&self, intents: Vec<Intent>) {
        if intents.is_empty() {
            return;
        }
        let me = self.clone();
        blocking(move || {
            for intent in &intents {
                if let Err(e) = me.write_now(intent) {
                    tracing::warn!(handle = %intent.handle_id, "recording an intent: {e}");
                }
            }
        })
        .await;
    }

    /// The intents a holder may serve now, of this datastore, oldest
    /// deadline first.
    pub async fn waiting(&self) -> Vec<Intent> {
        let me = self.clone();
        let mut found = blocking(move || {
            let now = SystemTime::now();
            let Ok(entries) = std::fs::read_dir(&me.dir) else {
                return Vec::new();
            };
            let mut live = Vec::new();
            for entry in entries.flatten() {
                if entry.file_name().as_encoded_bytes().starts_with(b".") {
                    continue;
                }
                let Ok(bytes) = std::fs::read(entry.path()) else {
                    continue;
                };
                let Ok(intent) = serde_json::from_slice::<Intent>(&bytes) else {
                    continue;
                };
                if intent.datastore != me.datastore {
                    continue;
                }
                if intent.live(now) {
                    live.push(intent);
                } else if intent.expired(now) {
                    // Its call is past its deadline (killed, or gone on
                    // without the lock): never served, the file goes.
                    let _ = std::fs::remove_file(entry.path());
                }
            }
            live
        })
        .await
        .unwrap_or_default();
        found.sort_by_key(|i| i.expires_ms);
        found
    }

    /// Takes back the intent of `handle_name` (read and removed): by its
    /// own call under the lock, or a DEL's.
    pub async fn take(&self, handle_name: &str) -> Option<Intent> {
        let path = self.path(handle_name)?;
        let datastore = self.datastore.clone();
        blocking(move || {
            let bytes = std::fs::read(&path).ok()?;
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), "removing an intent: {e}");
            }
            serde_json::from_slice::<Intent>(&bytes)
                .ok()
                .filter(|i| i.datastore == datastore)
        })
        .await
        .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datastore::ipam_model::IpamHandleSpec;

    fn intent(name: &str, datastore: &str, expires_ms: u64) -> Intent {
        Intent {
            datastore: datastore.into(),
            handle_id: name.into(),
            handle_name: name.into(),
            handle: Some(IpamHandle::new(
                name,
                IpamHandleSpec {
                    handle_id: name.into(),
                    block: BTreeMap::from([("10.0.0.0/26".to_string(), 1)]),
                    ..IpamHandleSpec::default()
                },
            )),
            attrs: BTreeMap::new(),
            pools: Vec::new(),
            v6: false,
            expires_ms,
            state: State::Posted,
        }
    }

    /// A holder sees the live intents of its datastore only; a call takes
    /// its own back once; names that are not handle names are no paths.
    #[tokio::test]
    async fn waiting_intents_are_live_ones_of_one_datastore() {
        let dir = tempfile::tempdir().unwrap();
        let intents = Intents::new(&dir.path().join("ipam.lock"), "k8s a".into());
        let later = expiry_in(Duration::from_secs(30));
        intents
            .write(vec![
                intent("k8s-pod-network.b", "k8s a", later + 1),
                intent("k8s-pod-network.a", "k8s a", later),
                intent("k8s-pod-network.other", "k8s b", later),
                intent(
                    "k8s-pod-network.expired",
                    "k8s a",
                    expiry_in(Duration::ZERO) - 1000,
                ),
            ])
            .await;
        let waiting: Vec<String> = intents
            .waiting()
            .await
            .into_iter()
            .map(|i| i.handle_id)
            .collect();
        assert_eq!(waiting, ["k8s-pod-network.a", "k8s-pod-network.b"]);
        // An expired one is removed as it is seen; another datastore's is
        // left to its own holders.
        assert!(intents.take("k8s-pod-network.expired").await.is_none());
        assert!(
            dir.path()
                .join("ipam.lock.intents/k8s-pod-network.other")
                .exists()
        );
        let a = intents.take("k8s-pod-network.a").await.expect("posted");
        assert_eq!(a.block(), Some("10.0.0.0/26".parse().unwrap()));
        assert!(intents.take("k8s-pod-network.a").await.is_none());
        assert!(intents.take("../ipam.lock").await.is_none());
        assert!(intents.take("k8s-pod-network.other").await.is_none());
        assert_eq!(
            dir_beside(Path::new("/run/x.lock")),
            Path::new("/run/x.lock.intents")
        );
    }
}
