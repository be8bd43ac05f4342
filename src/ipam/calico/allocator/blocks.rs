//! The blocks as the allocator reads and writes them: through the copies
//! kept beside the host lock ([`super::super::block_cache`]), soft-deleted
//! objects' deletes finished, a block's freed addresses collected.

use std::sync::atomic::Ordering;
use std::time::SystemTime;

use ipnet::IpNet;

use super::super::IpamError;
use super::super::block;
use super::super::block_cache::BlockCache;
use super::{Allocator, ds};
use crate::datastore::ipam_model::{ATTR_NODE, IpamBlock, cidr_name};
use crate::datastore::{
    Backend, DatastoreError, ListFilter, Precondition, Resource, decode, meta_field,
};

impl<'a> Allocator<'a> {
    /// Starts allocations and releases from the blocks' copies kept under
    /// the host lock ([`BlockCache`]; `None`: the lock is not held, or
    /// the store keeps no copies), and keeps what this call writes there.
    pub fn use_block_cache(&self, cache: Option<BlockCache>) {
        if let Some(cache) = cache {
            let _ = self.blocks.set(cache);
        }
    }

    /// The kept copy of the block of `cidr`, its cooled addresses freed;
    /// `None` without one (or one soft-deleted).
    pub(super) async fn cached_block(&self, cidr: &IpNet) -> Option<IpamBlock> {
        let copy = self.blocks.get()?.get(&cidr_name(cidr)).await?;
        if copy.spec.deleted {
            return None;
        }
        self.collected(copy).await.ok()
    }

    /// The block a write starts from: the copy kept under the lock where
    /// `copy` allows it (a write's first attempt) and only this host
    /// writes the block, or the block as this call listed it a moment ago
    /// (once), `true` with either (what it offers is written on its
    /// revision; where it offers nothing the block is read again); else
    /// the block read now (a copy of a block gone is forgotten).
    pub(super) async fn block_to_write(
        &self,
        cidr: &IpNet,
        copy: bool,
    ) -> Result<(Option<IpamBlock>, bool), IpamError> {
        if copy
            && let Some(copy) = self.cached_block(cidr).await
            && self.written_here_alone(&copy)
        {
            return Ok((Some(copy), true));
        }
        if let Some(listed) = self.take_listed(cidr) {
            return Ok((Some(self.collected(listed).await?), true));
        }
        let read = self.get_block(cidr).await?;
        if read.is_none() {
            self.keep_block(&cidr_name(cidr), None).await;
        }
        Ok((read, false))
    }

    /// The names of every block, sorted. Where a list carries whole
    /// objects anyway (the Kubernetes API) they are kept for this call:
    /// borrowing, which looks at the listed blocks next, writes on them
    /// rather than reading each again. Elsewhere (etcd) names only.
    pub(super) async fn list_blocks(&self) -> Result<Vec<String>, IpamError> {
        if self.store.backend() != Backend::Kubernetes {
            return self
                .store
                .list_names(IpamBlock::KIND, "")
                .await
                .map_err(ds("error listing IPAM blocks"));
        }
        let objects = self
            .store
            .list_objects(IpamBlock::KIND, "", &ListFilter::All)
            .await
            .map_err(ds("error listing IPAM blocks"))?;
        let mut names: Vec<String> = objects
            .iter()
            .map(|o| meta_field(o, "name").to_string())
            .collect();
        names.sort();
        // (One that does not decode is read when its turn comes.)
        self.keep_listed(objects.into_iter().filter_map(|o| decode(o).ok()).collect());
        Ok(names)
    }

    /// Keeps blocks as this call listed them (whole objects), for their
    /// first write ([`Allocator::block_to_write`]).
    fn keep_listed(&self, blocks: Vec<IpamBlock>) {
        let mut listed = self.listed_blocks.lock().unwrap_or_else(|p| p.into_inner());
        listed.clear();
        listed.extend(
            blocks
                .into_iter()
                // (A soft-deleted block is read, and its delete finished.)
                .filter(|b| !b.spec.deleted)
                .map(|b| (b.metadata.name.clone(), b)),
        );
    }

    /// The block of `cidr` as this call listed it, once.
    fn take_listed(&self, cidr: &IpNet) -> Option<IpamBlock> {
        self.listed_blocks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&cidr_name(cidr))
    }

    /// Whether this host is, as far as the block tells, its only writer:
    /// its affinity is this host's and no allocation in it names another
    /// node. Another host's block, or one other hosts borrow from, changes
    /// between this host's calls, so that a copy of it would mostly lose
    /// its compare-and-swap (a wasted write and, on the API server, the
    /// handle's count written twice more): it is read instead.
    fn written_here_alone(&self, blk: &IpamBlock) -> bool {
        blk.spec.affinity.as_deref() == Some(&self.affinity_value())
            && blk.spec.attributes.iter().all(|a| {
                [&a.secondary, &a.alternate]
                    .iter()
                    .all(|attrs| attrs.get(ATTR_NODE).is_none_or(|n| n == self.host))
            })
    }

    /// Keeps the block as the datastore answered its write, or forgets the
    /// copy (`None`: the write failed, or the block is gone).
    pub(super) async fn keep_block(&self, name: &str, stored: Option<&IpamBlock>) {
        if let Some(cache) = self.blocks.get() {
            match stored {
                Some(b) => cache.put(b).await,
                None => cache.forget(name).await,
            }
        }
    }

    /// A block as read, its cooled addresses freed (saved with the next
    /// write of the block, as in Calico).
    pub(super) async fn collected(&self, mut block: IpamBlock) -> Result<IpamBlock, IpamError> {
        if block
            .spec
            .attributes
            .iter()
            .any(|a| a.released_at.is_some())
        {
            let cooldown = self.config().await?.ip_cooldown();
            block::collect_cooled(&mut block.spec, cooldown, SystemTime::now());
        }
        Ok(block)
    }

    /// The block of `cidr`, unless absent or soft-deleted.
    pub(super) async fn get_block(&self, cidr: &IpNet) -> Result<Option<IpamBlock>, IpamError> {
        let name = cidr_name(cidr);
        let block = self
            .store
            .get::<IpamBlock>("", &name)
            .await
            .map_err(ds(format!("error getting IPAMBlock({name})")))?;
        match block {
            Some(b) if b.spec.deleted => {
                self.finish_delete(&b).await;
                Ok(None)
            }
            Some(b) => Ok(Some(self.collected(b).await?)),
            None => Ok(None),
        }
    }

    /// Finishes a soft delete that stopped half way (its writer was killed
    /// or ran out of time between the mark and the delete): the delete on
    /// the revision read. A writer that revived the object since changed
    /// that revision, so a live object is never deleted; failing is fine
    /// (the next reader tries again).
    pub(super) async fn finish_delete<R: Resource>(&self, resource: &R) {
        let meta = resource.metadata();
        let name = &meta.name;
        match self
            .store
            .delete::<R>("", name, &Precondition::exactly(meta))
            .await
        {
            Ok(()) => {
                self.finished.fetch_add(1, Ordering::Relaxed);
                tracing::info!(%name, "finished an interrupted delete");
            }
            Err(DatastoreError::NotFound(_) | DatastoreError::Conflict(_)) => {}
            Err(e) => tracing::debug!(%name, "finishing an interrupted delete: {e}"),
        }
    }

    /// Writes a block back on the revision it was read at, bumping its
    /// sequence number.
    pub(super) async fn put_block(
        &self,
        block: &mut IpamBlock,
    ) -> Result<IpamBlock, DatastoreError> {
        block.spec.sequence_number += 1;
        let written = self.store.update(block).await;
        self.keep_block(&block.metadata.name, written.as_ref().ok())
            .await;
        written
    }
}
