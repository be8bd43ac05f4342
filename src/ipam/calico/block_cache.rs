//! The blocks this host's calls last wrote, kept beside the host lock and
//! used only while it is held: the block an allocation or a release
//! starts from, instead of reading it again from the datastore.
//!
//! Under the lock the calls of one host take turns on their blocks, so the
//! block the last call wrote (as the datastore answered the write: its new
//! revision) is, but for another host's borrowing or a writer that does
//! not take the lock, the block as stored. It is only a starting point:
//! the write that follows is compare-and-swap on its revision, so a stale
//! copy loses (`Conflict`), is forgotten and the block is read again. A
//! copy that offers nothing (no free address, not this host's, no address
//! of the handle) is not trusted either: the block is read again before
//! the call concludes anything from it (an allocation first tries this
//! host's other blocks, and reads a full copy's block again only if none
//! has room). Inside the lock, an allocation then costs the handle's
//! create and the block's write alone.
//!
//! One file per block (`<lock file>.blocks/<block name>`, the directory
//! 0700, files 0600, written whole and renamed into place), naming the
//! datastore it came from ([`crate::datastore::Store::identity`]): a copy
//! of another datastore's block (a node moved between clusters, tests with
//! their own servers sharing a lock file) is never used. A datastore
//! rebuilt in place starts its revisions again, so a revision alone could
//! match: etcd's identity carries the cluster's ID, and a Kubernetes write
//! carries the block's uid, which a rebuilt cluster's block does not have
//! (the API server refuses it; a refused write from a copy reads the block
//! again). The local store has no use for copies (its reads cost no round
//! trip) and gives no identity.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use serde::{Deserialize, Serialize};

use crate::datastore::ipam_model::IpamBlock;

/// The copies of one lock's blocks for one datastore, usable while the
/// lock that made it is held.
#[derive(Debug, Clone)]
pub struct BlockCache {
    dir: PathBuf,
    datastore: String,
    /// Alive while the host lock is held.
    held: Weak<()>,
}

#[derive(Deserialize)]
struct Copy {
    datastore: String,
    block: IpamBlock,
}

/// A [`Copy`] as written, borrowing what it holds.
#[derive(Serialize)]
struct CopyOf<'a> {
    datastore: &'a str,
    block: &'a IpamBlock,
}

/// The directory of the copies beside `lock_file`.
pub fn dir_beside(lock_file: &Path) -> PathBuf {
    let mut name = lock_file.file_name().unwrap_or_default().to_os_string();
    name.push(".blocks");
    lock_file.with_file_name(name)
}

impl BlockCache {
    /// The copies beside `lock_file` of `datastore`'s blocks, usable while
    /// `held` is alive.
    pub fn new(lock_file: &Path, datastore: String, held: &Arc<()>) -> BlockCache {
        BlockCache {
            dir: dir_beside(lock_file),
            datastore,
            held: Arc::downgrade(held),
        }
    }

    fn usable(&self) -> bool {
        self.held.strong_count() > 0
    }

    fn path(&self, name: &str) -> Option<PathBuf> {
        // Block names are CIDRs with `-` for `.`, `:` and `/`.
        let plain =
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        plain.then(|| self.dir.join(name))
    }

    /// The copy of block `name`, if there is one of this datastore.
    pub async fn get(&self, name: &str) -> Option<IpamBlock> {
        if !self.usable() {
            return None;
        }
        let path = self.path(name)?;
        let datastore = self.datastore.clone();
        let name = name.to_string();
        blocking(move || {
            let bytes = std::fs::read(&path).ok()?;
            let copy: Copy = serde_json::from_slice(&bytes).ok()?;
            (copy.datastore == datastore && copy.block.metadata.name == name).then_some(copy.block)
        })
        .await
        .flatten()
    }

    /// Keeps `block` as the datastore answered its write.
    pub async fn put(&self, block: &IpamBlock) {
        if !self.usable() {
            return;
        }
        let Some(path) = self.path(&block.metadata.name) else {
            return;
        };
        let copy = CopyOf {
            datastore: &self.datastore,
            block,
        };
        let bytes = match serde_json::to_vec(&copy) {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::debug!(block = %block.metadata.name, "keeping the block's copy: {e}");
                return self.forget(&block.metadata.name).await;
            }
        };
        let dir = self.dir.clone();
        let written = blocking(move || -> std::io::Result<()> {
            let mut part = path.clone().into_os_string();
            part.push(format!(".{}", std::process::id()));
            write_whole(&dir, Path::new(&part), &path, &bytes)
        })
        .await;
        if let Some(Err(e)) = written {
            tracing::debug!(block = %block.metadata.name, "keeping the block's copy: {e}");
            self.forget(&block.metadata.name).await;
        }
    }

    /// Drops the copy of block `name` (its write failed, or it is gone).
    pub async fn forget(&self, name: &str) {
        let Some(path) = self.path(name) else {
            return;
        };
        blocking(move || match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::debug!(path = %path.display(), "dropping a block's copy: {e}");
            }
            _ => {}
        })
        .await;
    }
}

/// The block a call of this host most likely takes its next address
/// from, as the copies beside `lock_file` tell it, read without the lock
/// (a guess, for writing the handle before the lock; the allocation
/// itself starts from the block under the lock): of `datastore`, this
/// host's (`affinity`), of the family asked, not deleted, with a free
/// address; the lowest, as the allocator tries this host's blocks in
/// address order.
pub async fn likely_block(
    lock_file: &Path,
    datastore: String,
    affinity: String,
    v6: bool,
) -> Option<ipnet::IpNet> {
    let dir = dir_beside(lock_file);
    blocking(move || {
        let mut likely: Option<ipnet::IpNet> = None;
        for entry in std::fs::read_dir(&dir).ok()?.flatten() {
            let name = entry.file_name();
            // Copies only, not another process's part-written file.
            let Some(name) = name.to_str().filter(|n| !n.contains('.')) else {
                continue;
            };
            let Ok(bytes) = std::fs::read(entry.path()) else {
                continue;
            };
            let Ok(copy) = serde_json::from_slice::<Copy>(&bytes) else {
                continue;
            };
            let spec = &copy.block.spec;
            let Ok(cidr) = spec.cidr.parse::<ipnet::IpNet>() else {
                continue;
            };
            if copy.datastore == datastore
                && copy.block.metadata.name == name
                && spec.affinity.as_deref() == Some(affinity.as_str())
                && !spec.deleted
                && !spec.unallocated.is_empty()
                && cidr.addr().is_ipv6() == v6
                && likely.is_none_or(|l| cidr < l)
            {
                likely = Some(cidr);
            }
        }
        likely
    })
    .await
    .flatten()
}

/// Writes `bytes` to `path` whole: to `part` (0600, in `dir`, made 0700
/// if missing), then renamed into place, so that no reader sees half.
pub(super) fn write_whole(
    dir: &Path,
    part: &Path,
    path: &Path,
    bytes: &[u8],
) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(part)?;
    file.write_all(bytes)?;
    std::fs::rename(part, path)
}

/// File work off the runtime's thread; `None` if the task was lost.
pub(super) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    crate::handoff::spawn_blocking(work).await.ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datastore::ipam_model::IpamBlockSpec;

    fn block(name: &str, revision: &str) -> IpamBlock {
        let mut b = IpamBlock::new(name, IpamBlockSpec::default());
        b.metadata.resource_version = revision.to_string();
        b
    }

    #[tokio::test]
    async fn copies_are_of_one_datastore_and_only_while_the_lock_is_held() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("ipam.lock");
        let held = Arc::new(());
        let cache = BlockCache::new(&lock, "kubernetes https://a".into(), &held);
        assert!(cache.get("10-0-0-0-26").await.is_none());
        cache.put(&block("10-0-0-0-26", "7")).await;
        let got = cache.get("10-0-0-0-26").await.expect("the copy kept");
        assert_eq!(got.metadata.resource_version, "7");
        assert_eq!(dir_beside(&lock), dir.path().join("ipam.lock.blocks"));

        // Another datastore's calls never see it.
        let other = BlockCache::new(&lock, "kubernetes https://b".into(), &held);
        assert!(other.get("10-0-0-0-26").await.is_none());

        // Names that are not block names are not paths.
        assert!(cache.get("../ipam.lock").await.is_none());

        cache.forget("10-0-0-0-26").await;
        assert!(cache.get("10-0-0-0-26").await.is_none());

        // Once the lock is let go, the copies are not used.
        cache.put(&block("10-0-0-64-26", "9")).await;
        drop(held);
        assert!(cache.get("10-0-0-64-26").await.is_none());
    }
}
