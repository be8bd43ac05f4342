//! Release: a block's addresses freed, then taken off the handle; by
//! handle, by address, or one address checked against its expected owner.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;

use super::super::IpamError;
use super::super::block;
use super::{Allocator, CAS_ATTEMPTS, contention, ds};
use crate::datastore::ipam_model::{IpamBlock, IpamHandle, cidr_name, handle_name_on};
use crate::datastore::{DatastoreError, ListFilter};

/// What [`Allocator::release_address`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressRelease {
    /// Freed; it was held by this handle (`""`: none).
    Released { handle: String },
    /// Not allocated (no block holds it, or its ordinal is free).
    NotAllocated,
    /// Allocated, but not as expected (another handle or sequence number).
    Changed,
}

impl<'a> Allocator<'a> {
    /// Frees every address of `handle` and deletes it; the number freed,
    /// `None` when the handle does not exist.
    pub async fn release_by_handle(&self, handle: &str) -> Result<Option<usize>, IpamError> {
        self.release_handle_from(handle, None).await
    }

    /// [`Allocator::release_by_handle`] starting from the handle as
    /// [`Allocator::read_handle`] read it (`None`: read now; a handle
    /// written since makes its delete conflict and the release start over).
    pub async fn release_handle_from(
        &self,
        handle: &str,
        ahead: Option<Option<IpamHandle>>,
    ) -> Result<Option<usize>, IpamError> {
        let name = handle_name_on(self.store.backend(), handle);
        let what = format!("error releasing IPAMHandle({name})");
        let mut freed = 0;
        let stamp = self.release_stamp().await?;
        let mut ahead = ahead;
        for _ in 0..CAS_ATTEMPTS {
            let current = match ahead.take() {
                Some(read) => read,
                None => self.live_handle(&name, &what).await?,
            };
            let Some(h) = current else {
                return Ok((freed > 0).then_some(freed));
            };
            for cidr in h.spec.block.keys().filter_map(|c| c.parse::<IpNet>().ok()) {
                freed += self
                    .release_in_block(&cidr, |b| {
                        block::release_handle(b, handle, stamp.as_deref())
                    })
                    .await?;
            }
            // One compare-and-swap delete on the revision read: a handle
            // is read only by its own container's calls and GC, which see
            // it gone either way (no `deleted` mark written first). (Sent
            // at once with the blocks' write on the API server, it made
            // both slower, not the release faster: BENCHMARKS.md, session
            // 15.)
            match self.store.delete_as_read(&h).await {
                Ok(()) | Err(DatastoreError::NotFound(_)) => return Ok(Some(freed)),
                // Written meanwhile (an ADD under the same handle): again.
                Err(DatastoreError::Conflict(_)) => continue,
                Err(e) => return Err(ds(what)(e)),
            }
        }
        Err(contention(&what))
    }

    /// Applies a release to a block on the revision read (deleting it when
    /// it is left empty and has no affinity); how many were freed.
    pub(super) async fn release_in_block(
        &self,
        cidr: &IpNet,
        release: impl Fn(&mut crate::datastore::ipam_model::IpamBlockSpec) -> usize,
    ) -> Result<usize, IpamError> {
        let what = format!("error updating IPAMBlock({})", cidr_name(cidr));
        for attempt in 0..CAS_ATTEMPTS {
            // As in an allocation: a copy freeing nothing is read again.
            let (read, from_copy) = self.block_to_write(cidr, attempt == 0).await?;
            let Some(mut blk) = read else {
                return Ok(0);
            };
            let freed = release(&mut blk.spec);
            if freed == 0 {
                if from_copy {
                    continue;
                }
                return Ok(0);
            }
            // (A block read with cooled addresses freed saves that too.)
            let result = if block::is_empty(&blk.spec) && blk.spec.affinity.is_none() {
                blk.spec.sequence_number += 1;
                self.keep_block(&blk.metadata.name, None).await;
                self.store
                    .soft_delete(&mut blk, |b| b.spec.deleted = true)
                    .await
            } else {
                self.put_block(&mut blk).await.map(|_| ())
            };
            match result {
                Ok(()) | Err(DatastoreError::NotFound(_)) => return Ok(freed),
                Err(DatastoreError::Conflict(_)) => continue,
                // As in an allocation: a refused write from a copy reads again.
                Err(_) if from_copy => continue,
                Err(e) => return Err(ds(what)(e)),
            }
        }
        Err(contention(&what))
    }

    /// Frees these addresses, whoever holds them, and takes them off their
    /// handles (the ipAddrs re-create path and rollbacks); they cool down
    /// when IPAMConfig says so.
    pub async fn release_ips(&self, ips: &[IpAddr]) -> Result<(), IpamError> {
        let stamp = self.release_stamp().await?;
        self.release_ips_as(ips, stamp.as_deref()).await
    }

    pub(super) async fn release_ips_as(
        &self,
        ips: &[IpAddr],
        stamp: Option<&str>,
    ) -> Result<(), IpamError> {
        let pools = self.pools().await?;
        let mut by_block: BTreeMap<IpNet, Vec<IpAddr>> = BTreeMap::new();
        for &ip in ips {
            let Some(pool) = pools
                .iter()
                .find(|p| p.spec.network().is_some_and(|n| n.contains(&ip)))
            else {
                continue;
            };
            if let Ok(cidr) = IpNet::new(ip, pool.spec.effective_block_size()) {
                by_block.entry(cidr.trunc()).or_default().push(ip);
            }
        }
        for (cidr, ips) in by_block {
            let handles = std::sync::Mutex::new(BTreeMap::new());
            self.release_in_block(&cidr, |b| {
                let freed = block::release_ips(b, &cidr, &ips, stamp);
                let total = freed.values().sum();
                *handles.lock().unwrap_or_else(|p| p.into_inner()) = freed;
                total
            })
            .await?;
            let handles = handles.into_inner().unwrap_or_else(|p| p.into_inner());
            for (handle, n) in handles.into_iter().filter(|(h, _)| !h.is_empty()) {
                self.decrement_handle(&handle, &cidr, Some(n)).await?;
            }
        }
        Ok(())
    }

    /// Frees one address wherever its block is (listed: the operator's
    /// `calico ipam release`, which also reaches blocks no pool covers),
    /// and takes it off its handle. With `expected` (handle, sequence
    /// number, as a report recorded them), only an allocation still
    /// exactly that is freed.
    pub async fn release_address(
        &self,
        ip: IpAddr,
        expected: Option<(&str, u64)>,
    ) -> Result<AddressRelease, IpamError> {
        let blocks = self
            .store
            .list::<IpamBlock>("", &ListFilter::All)
            .await
            .map_err(ds("error listing IPAM blocks"))?;
        let Some(cidr) = blocks
            .iter()
            .filter(|b| !b.spec.deleted)
            .filter_map(|b| b.spec.cidr.parse::<IpNet>().ok())
            .find(|c| c.contains(&ip))
        else {
            return Ok(AddressRelease::NotAllocated);
        };
        let stamp = self.release_stamp().await?;
        let outcome = std::sync::Mutex::new(AddressRelease::NotAllocated);
        let set = |o: AddressRelease| *outcome.lock().unwrap_or_else(|p| p.into_inner()) = o;
        self.release_in_block(&cidr, |b| {
            let Some(ordinal) = block::ordinal_of(&cidr, ip).filter(|&o| o < b.allocations.len())
            else {
                set(AddressRelease::NotAllocated);
                return 0;
            };
            let Some(attr) = b.allocations[ordinal].filter(|_| !block::is_cooling(b, ordinal))
            else {
                set(AddressRelease::NotAllocated);
                return 0;
            };
            let handle = b
                .attributes
                .get(attr)
                .and_then(|a| a.handle_id.clone())
                .unwrap_or_default();
            if let Some((want_handle, want_seq)) = expected {
                let seq = b
                    .sequence_number_for_allocation
                    .get(&ordinal.to_string())
                    .copied()
                    .unwrap_or_default();
                if handle != want_handle || seq != want_seq {
                    set(AddressRelease::Changed);
                    return 0;
                }
            }
            let freed = block::release_ips(b, &cidr, &[ip], stamp.as_deref())
                .values()
                .sum();
            set(AddressRelease::Released { handle });
            freed
        })
        .await?;
        let outcome = outcome.into_inner().unwrap_or_else(|p| p.into_inner());
        if let AddressRelease::Released { handle } = &outcome
            && !handle.is_empty()
        {
            self.decrement_handle(handle, &cidr, Some(1)).await?;
        }
        Ok(outcome)
    }
}
