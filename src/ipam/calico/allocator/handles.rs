//! The IPAMHandles: incremented before a block write, decremented after a
//! release, written ahead of the host lock and taken by the allocation
//! that follows, deleted when unused.

use std::collections::BTreeMap;

use ipnet::IpNet;

use super::super::IpamError;
use super::super::block_cache;
use super::{Allocator, AutoAssign, CAS_ATTEMPTS, contention, ds, pause};
use crate::datastore::DatastoreError;
use crate::datastore::ipam_model::{IpamHandle, IpamHandleSpec, handle_name_on};

/// A new handle `name` for `handle` holding `n` addresses of `cidr`.
pub(super) fn new_handle(name: &str, handle: &str, cidr: &IpNet, n: usize) -> IpamHandle {
    IpamHandle::new(
        name,
        IpamHandleSpec {
            handle_id: handle.to_string(),
            block: BTreeMap::from([(cidr.to_string(), n)]),
            ..IpamHandleSpec::default()
        },
    )
}

impl<'a> Allocator<'a> {
    /// The handle named `name`, unless absent or soft-deleted.
    pub(super) async fn live_handle(
        &self,
        name: &str,
        what: &str,
    ) -> Result<Option<IpamHandle>, IpamError> {
        let handle = self
            .store
            .get::<IpamHandle>("", name)
            .await
            .map_err(ds(what))?;
        match handle {
            Some(h) if h.spec.deleted => {
                self.finish_delete(&h).await;
                Ok(None)
            }
            other => Ok(other),
        }
    }

    /// Adds `n` addresses in `cidr` to the handle, creating it if absent.
    /// A handle is new but for a retried ADD: created first, read only
    /// when it exists.
    pub(super) async fn increment_handle(
        &self,
        handle: &str,
        cidr: &IpNet,
        n: usize,
    ) -> Result<(), IpamError> {
        let name = handle_name_on(self.store.backend(), handle);
        let what = format!("error updating IPAMHandle({name})");
        for attempt in 0..CAS_ATTEMPTS {
            let current = if attempt == 0 {
                None
            } else {
                self.store
                    .get::<IpamHandle>("", &name)
                    .await
                    .map_err(ds(what.clone()))?
            };
            let result = match current {
                None => self
                    .store
                    .create(&mut new_handle(&name, handle, cidr, n))
                    .await
                    .map(|_| ()),
                Some(h) if h.spec.deleted => {
                    // Going away (or left half deleted): gone first.
                    self.finish_delete(&h).await;
                    pause(attempt).await;
                    continue;
                }
                Some(mut h) => {
                    *h.spec.block.entry(cidr.to_string()).or_insert(0) += n;
                    self.store.update(&mut h).await.map(|_| ())
                }
            };
            match result {
                Ok(()) => return Ok(()),
                Err(DatastoreError::Conflict(_) | DatastoreError::AlreadyExists(_)) => continue,
                Err(e) => return Err(ds(what)(e)),
            }
        }
        Err(contention(&what))
    }

    /// Takes `n` addresses in `cidr` off the handle (all of that block's
    /// when `n` is `None`), deleting it when it holds nothing more.
    pub(super) async fn decrement_handle(
        &self,
        handle: &str,
        cidr: &IpNet,
        n: Option<usize>,
    ) -> Result<(), IpamError> {
        let name = handle_name_on(self.store.backend(), handle);
        let what = format!("error updating IPAMHandle({name})");
        for _ in 0..CAS_ATTEMPTS {
            let Some(mut h) = self.live_handle(&name, &what).await? else {
                return Ok(());
            };
            let key = cidr.to_string();
            let left = h.spec.block.get(&key).copied().unwrap_or(0);
            match n {
                Some(n) if left > n => {
                    h.spec.block.insert(key, left - n);
                }
                _ => {
                    h.spec.block.remove(&key);
                }
            }
            let result = if h.spec.block.is_empty() {
                // As in release_by_handle: one compare-and-swap delete.
                self.store.delete_as_read(&h).await
            } else {
                self.store.update(&mut h).await.map(|_| ())
            };
            match result {
                Ok(()) | Err(DatastoreError::NotFound(_)) => return Ok(()),
                Err(DatastoreError::Conflict(_)) => continue,
                Err(e) => return Err(ds(what)(e)),
            }
        }
        Err(contention(&what))
    }

    /// Deletes the handle written ahead of the lock if no allocation took
    /// it (the call failed): it holds nothing. (Should this fail, the DEL
    /// that follows a failed ADD deletes it.)
    pub async fn delete_unused_handle(&self) {
        if self.withdraw_intent().await {
            // Posted: a holder may have served it (or be serving it now),
            // so the handle stays, for the DEL.
            if let Some(h) = self.take_ahead_handle() {
                tracing::info!(name = %h.metadata.name, "the handle of a failed assignment that asked the lock's holder stays for the DEL");
            }
            return;
        }
        if let Some(unused) = self.take_ahead_handle() {
            self.delete_handle_ahead(&unused).await;
        }
    }

    /// Deletes a handle written ahead that no allocation took (it holds
    /// nothing). A failure is logged: the DEL that follows a failed ADD
    /// deletes it, as the orphan search ([`Self::orphan_host_handles`])
    /// finds it.
    pub async fn delete_handle_ahead(&self, unused: &IpamHandle) {
        let name = unused.metadata.name.clone();
        match self.store.delete_as_read(unused).await {
            Ok(()) => tracing::debug!(%name, "a handle written ahead, unused, deleted"),
            Err(e) => tracing::warn!(%name, "deleting a handle written ahead, unused: {e}"),
        }
    }

    /// A handle written ahead elsewhere ([`super::verbs::read_add`]), for
    /// the allocation to take as its own.
    pub fn adopt_ahead_handle(&self, handle: IpamHandle) {
        *self.ahead_handle.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
    }

    /// Writes the request's handle before the host lock is held, naming
    /// the block its address most likely comes from (this host's block as
    /// last written under the lock: [`block_cache::likely_block`]), so
    /// that under the lock the allocation writes its block alone. Only
    /// where the handle and the block are not written in one transaction
    /// anyway, for one address, and with copies of the blocks kept. The
    /// handle is written first as Calico writes it: a call killed after
    /// it leaves a handle holding no address, which the DEL that follows
    /// deletes. Fails quietly (the allocation then writes the handle).
    pub async fn create_handle_ahead(&self, req: &AutoAssign<'_>, lock_file: &std::path::Path) {
        if self.store.writes_together() || req.num4 + req.num6 != 1 {
            return;
        }
        let Some(datastore) = self.store.identity() else {
            return;
        };
        let v6 = req.num6 == 1;
        let Some(likely) =
            block_cache::likely_block(lock_file, datastore, self.affinity_value(), v6).await
        else {
            return;
        };
        let name = handle_name_on(self.store.backend(), req.handle);
        match self
            .store
            .create(&mut new_handle(&name, req.handle, &likely, 1))
            .await
        {
            Ok(stored) => {
                *self.ahead_handle.lock().unwrap_or_else(|p| p.into_inner()) = Some(stored)
            }
            // (A retried ADD's handle exists: the allocation reads it.)
            Err(e) => tracing::debug!(%name, "writing the handle ahead of the lock: {e}"),
        }
    }

    pub fn take_ahead_handle(&self) -> Option<IpamHandle> {
        self.ahead_handle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// The handle's part of an allocation of `n` addresses of `cidr`
    /// (written before the block's): the handle written ahead of the lock,
    /// made to name exactly that block (as it most likely does already),
    /// or the handle's count incremented.
    pub(super) async fn handle_for(
        &self,
        handle: &str,
        cidr: &IpNet,
        n: usize,
    ) -> Result<(), IpamError> {
        let Some(mut ahead) = self.take_ahead_handle() else {
            return self.increment_handle(handle, cidr, n).await;
        };
        let exactly = BTreeMap::from([(cidr.to_string(), n)]);
        if ahead.spec.block == exactly {
            return Ok(());
        }
        ahead.spec.block = exactly;
        match self.store.update(&mut ahead).await {
            Ok(_) => Ok(()),
            // Changed since it was written (another call of the same
            // container): counted as any handle is.
            Err(DatastoreError::Conflict(_) | DatastoreError::NotFound(_)) => {
                self.increment_handle(handle, cidr, n).await
            }
            Err(e) => Err(ds(format!(
                "error updating IPAMHandle({})",
                ahead.metadata.name
            ))(e)),
        }
    }

    /// The handle as it is now (`None`: absent), read ahead of
    /// [`Allocator::release_by_handle`] (before the host lock).
    pub async fn read_handle(&self, handle: &str) -> Result<Option<IpamHandle>, IpamError> {
        let name = handle_name_on(self.store.backend(), handle);
        self.live_handle(&name, &format!("error releasing IPAMHandle({name})"))
            .await
    }
}
