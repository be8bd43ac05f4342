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

    /// The blocks not `affinity`'s (other hosts') of the family asked
    /// that this host's calls last wrote (borrowed from) and that had a
    /// free address then, in this host's order ([`borrowing_order`]).
    pub async fn borrowed(&self, affinity: &str, v6: bool) -> Vec<ipnet::IpNet> {
        if !self.usable() {
            return Vec::new();
        }
        let (dir, datastore, affinity) = (
            self.dir.clone(),
            self.datastore.clone(),
            affinity.to_string(),
        );
        let copies = blocking(move || with_room(&dir, &datastore, v6))
            .await
            .unwrap_or_default();
        let borrowed: Vec<ipnet::IpNet> = copies
            .into_iter()
            .filter(|(_, a)| a.as_deref() != Some(affinity.as_str()))
            .map(|(c, _)| c)
            .collect();
        borrowing_order(borrowed, &affinity)
    }

    /// How many block claims this host's calls have started, as counted
    /// beside the lock ([`claims_started`]).
    pub async fn claims(&self) -> Option<u64> {
        if !self.usable() {
            return None;
        }
        let dir = self.dir.clone();
        blocking(move || read_claims(&dir)).await.flatten()
    }

    /// Counts a claim about to start (before its affinity is written): a
    /// call that read this host's affinities ahead of the lock sees, under
    /// it, whether any claim may have changed them since.
    pub async fn note_claim(&self) {
        if !self.usable() {
            return;
        }
        let dir = self.dir.clone();
        let written = blocking(move || {
            let next = read_claims(&dir).unwrap_or(0).wrapping_add(1);
            let path = dir.join(CLAIMS);
            let part = dir.join(format!("{CLAIMS}.{}", std::process::id()));
            write_whole(&dir, &part, &path, next.to_string().as_bytes())
        })
        .await;
        if let Some(Err(e)) = written {
            // (Unreadable, the count is not trusted: affinities are read
            // again.)
            tracing::debug!("counting a block claim: {e}");
            let _ = std::fs::remove_file(self.dir.join(CLAIMS));
        }
    }

    /// Whether a claim found no free block in `pools` (their CIDRs and
    /// block sizes, as [`BlockCache::note_pools_full`] was given them)
    /// less than [`POOLS_FULL_FOR`] ago.
    pub async fn pools_full(&self, pools: &str) -> bool {
        if !self.usable() {
            return false;
        }
        let path = self.dir.join(POOLS_FULL);
        let pools = pools.to_string();
        blocking(move || {
            let text = std::fs::read_to_string(&path).ok()?;
            let (at, noted) = text.split_once(' ')?;
            let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(at.parse().ok()?);
            let age = std::time::SystemTime::now().duration_since(at).ok()?;
            Some(noted == pools && age < POOLS_FULL_FOR)
        })
        .await
        .flatten()
        .unwrap_or(false)
    }

    /// Notes that a claim found no free block in `pools` (or forgets it:
    /// `None`, a block was claimed).
    pub async fn note_pools_full(&self, pools: Option<&str>) {
        if !self.usable() {
            return;
        }
        let dir = self.dir.clone();
        let path = dir.join(POOLS_FULL);
        let text = pools.map(|p| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            format!("{} {p}", now.as_millis())
        });
        let written = blocking(move || match text {
            Some(text) => {
                let part = dir.join(format!("{POOLS_FULL}.{}", std::process::id()));
                write_whole(&dir, &part, &path, text.as_bytes())
            }
            None => match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            },
        })
        .await;
        if let Some(Err(e)) = written {
            tracing::debug!("noting the pools' free blocks: {e}");
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

/// The file noting when a claim last found no free block in the pools.
const POOLS_FULL: &str = ".pools-full";

/// How long a claim that found no free block spares the next ones (on
/// this host, in the same pools) their list of every block: they borrow
/// at once. Blocks are freed rarely (a node deleted, an empty block
/// released), and one freed meanwhile is claimed this much later.
pub const POOLS_FULL_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// The file counting this host's block claims, beside the copies (a name
/// with a dot: never taken for a copy).
const CLAIMS: &str = ".claims";

/// The count (none kept yet: 0; unreadable: `None`).
fn read_claims(dir: &Path) -> Option<u64> {
    match std::fs::read_to_string(dir.join(CLAIMS)) {
        Ok(text) => text.trim().parse().ok(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(0),
        Err(_) => None,
    }
}

/// How many block claims this host's calls (those taking the lock of
/// `lock_file`) have started, read without the lock, before this host's
/// affinities are read ahead of it (`None`: not known).
pub async fn claims_started(lock_file: &Path) -> Option<u64> {
    let dir = dir_beside(lock_file);
    blocking(move || read_claims(&dir)).await.flatten()
}

/// The block a call of this host most likely takes its next address
/// from, as the copies beside `lock_file` tell it, read without the lock
/// (a guess, for writing the handle before the lock; the allocation
/// itself starts from the block under the lock): of `datastore`, of the
/// family asked, not deleted, with a free address; the lowest of this
/// host's (`affinity`), as the allocator tries this host's blocks in
/// address order, else the first it borrowed from in its borrowing order.
pub async fn likely_block(
    lock_file: &Path,
    datastore: String,
    affinity: String,
    v6: bool,
) -> Option<ipnet::IpNet> {
    let dir = dir_beside(lock_file);
    let copies = blocking(move || with_room(&dir, &datastore, v6)).await?;
    let (mine, others): (Vec<_>, Vec<_>) = copies
        .into_iter()
        .partition(|(_, a)| a.as_deref() == Some(affinity.as_str()));
    mine.into_iter().map(|(c, _)| c).min().or_else(|| {
        let others = others.into_iter().map(|(c, _)| c).collect();
        borrowing_order(others, &affinity).into_iter().next()
    })
}

/// Other hosts' blocks in the order the host of `affinity` borrows from
/// them: address order, started at a place of the host's own. In address
/// order alone every host tried the same lowest block first: at 50 nodes
/// borrowing from 16 blocks the lowest took twice the writes of the
/// others and lost 4× the compare-and-swaps (issue 46).
pub fn borrowing_order(mut blocks: Vec<ipnet::IpNet>, affinity: &str) -> Vec<ipnet::IpNet> {
    blocks.sort();
    if !blocks.is_empty() {
        let start = (super::pools::host_seed(affinity) % blocks.len() as u128) as usize;
        blocks.rotate_left(start);
    }
    blocks
}

/// The blocks of `datastore` of the family asked, not deleted, with a free
/// address, as the copies in `dir` last saw them, with their affinities.
fn with_room(dir: &Path, datastore: &str, v6: bool) -> Vec<(ipnet::IpNet, Option<String>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
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
        let spec = copy.block.spec;
        let Ok(cidr) = spec.cidr.parse::<ipnet::IpNet>() else {
            continue;
        };
        if copy.datastore == datastore
            && copy.block.metadata.name == name
            && !spec.deleted
            && !spec.unallocated.is_empty()
            && cidr.addr().is_ipv6() == v6
        {
            found.push((cidr, spec.affinity));
        }
    }
    found
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

    fn with_affinity(cidr: &str, affinity: Option<&str>, free: bool) -> IpamBlock {
        let net: ipnet::IpNet = cidr.parse().unwrap();
        let mut b = IpamBlock::new(
            &crate::datastore::ipam_model::cidr_name(&net),
            crate::ipam::calico::block::new_block(&net, affinity.map(str::to_string), None),
        );
        if !free {
            b.spec.unallocated.clear();
        }
        b
    }

    #[tokio::test]
    async fn the_blocks_borrowed_from_are_the_other_hosts_with_room() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("ipam.lock");
        let held = Arc::new(());
        let cache = BlockCache::new(&lock, "kubernetes https://a".into(), &held);
        cache
            .put(&with_affinity("10.0.0.0/26", Some("host:me"), true))
            .await;
        cache
            .put(&with_affinity("10.0.1.0/26", Some("host:other"), true))
            .await;
        cache
            .put(&with_affinity("10.0.0.128/26", Some("host:other"), true))
            .await;
        cache.put(&with_affinity("10.0.2.0/26", None, false)).await;
        let borrowed = cache.borrowed("host:me", false).await;
        let want: Vec<ipnet::IpNet> = vec![
            "10.0.0.128/26".parse().unwrap(),
            "10.0.1.0/26".parse().unwrap(),
        ];
        assert_eq!(
            borrowed,
            borrowing_order(want.clone(), "host:me"),
            "others' blocks with room, in this host's order"
        );
        assert!(cache.borrowed("host:me", true).await.is_empty());
        // The likely block is this host's first; without one with room, the
        // first borrowed from in its order.
        let likely = |a: &str| likely_block(&lock, "kubernetes https://a".into(), a.into(), false);
        assert_eq!(
            likely("host:me").await,
            Some("10.0.0.0/26".parse().unwrap())
        );
        cache
            .put(&with_affinity("10.0.0.0/26", Some("host:me"), false))
            .await;
        assert_eq!(likely("host:me").await, Some(borrowed[0]));
    }

    #[test]
    fn hosts_start_borrowing_at_different_blocks() {
        let blocks: Vec<ipnet::IpNet> = (0..16)
            .map(|i| format!("10.0.{i}.0/26").parse().unwrap())
            .collect();
        let firsts: std::collections::BTreeSet<ipnet::IpNet> = (0..50)
            .map(|n| borrowing_order(blocks.clone(), &format!("host:node-{n}"))[0])
            .collect();
        assert!(
            firsts.len() >= 12,
            "50 hosts start at {} blocks",
            firsts.len()
        );
        // Each order is the address order, rotated.
        let order = borrowing_order(blocks.clone(), "host:node-7");
        let at = blocks.iter().position(|b| *b == order[0]).unwrap();
        let mut rotated = blocks.clone();
        rotated.rotate_left(at);
        assert_eq!(order, rotated);
    }

    #[tokio::test]
    async fn claims_are_counted_and_a_full_pool_noted_for_a_while() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("ipam.lock");
        let held = Arc::new(());
        let cache = BlockCache::new(&lock, "etcd 1".into(), &held);
        // None counted yet: 0, before and under the lock alike.
        assert_eq!(claims_started(&lock).await, Some(0));
        assert_eq!(cache.claims().await, Some(0));
        cache.note_claim().await;
        cache.note_claim().await;
        assert_eq!(claims_started(&lock).await, Some(2));
        assert_eq!(cache.claims().await, Some(2));
        // The count is never taken for a block's copy.
        assert!(cache.borrowed("host:me", false).await.is_empty());
        // An unreadable count is not trusted.
        std::fs::write(dir_beside(&lock).join(CLAIMS), "x").unwrap();
        assert_eq!(claims_started(&lock).await, None);

        let pools = "10.0.0.0/22/26";
        assert!(!cache.pools_full(pools).await);
        cache.note_pools_full(Some(pools)).await;
        assert!(cache.pools_full(pools).await);
        assert!(!cache.pools_full("10.0.4.0/22/26").await, "other pools");
        // Older than POOLS_FULL_FOR: looked at again.
        let old = std::time::SystemTime::now() - POOLS_FULL_FOR - std::time::Duration::from_secs(1);
        let ms = old
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis();
        std::fs::write(dir_beside(&lock).join(POOLS_FULL), format!("{ms} {pools}")).unwrap();
        assert!(!cache.pools_full(pools).await);
        cache.note_pools_full(Some(pools)).await;
        cache.note_pools_full(None).await;
        assert!(!cache.pools_full(pools).await);
        // Not while the lock is let go.
        cache.note_pools_full(Some(pools)).await;
        drop(held);
        assert!(!cache.pools_full(pools).await);
        assert_eq!(cache.claims().await, None);
    }
}
