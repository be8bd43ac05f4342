//! Explicit addresses (`assign_ip`): written to the block, then to the
//! handle; and the reconciliation of an address or a handle with its block.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;

use super::super::IpamError;
use super::super::block;
use super::super::pools::USE_WORKLOAD;
use super::auto_assign::with_prefix;
use super::{Allocator, CAS_ATTEMPTS, contention, ds};
use crate::datastore::DatastoreError;
use crate::datastore::ipam_model::{cidr_name, handle_name_on};

impl<'a> Allocator<'a> {
    /// Assigns exactly `ip` to `handle` (`IP=` and the ipAddrs annotation).
    pub async fn assign_ip(
        &self,
        ip: IpAddr,
        handle: &str,
        attrs: &BTreeMap<String, String>,
    ) -> Result<IpNet, IpamError> {
        self.with_latest_pools(|| self.assign_ip_once(ip, handle, attrs))
            .await
    }

    pub(super) async fn assign_ip_once(
        &self,
        ip: IpAddr,
        handle: &str,
        attrs: &BTreeMap<String, String>,
    ) -> Result<IpNet, IpamError> {
        let pools = self.pools().await?;
        let Some(pool) = pools
            .iter()
            .find(|p| p.spec.network().is_some_and(|n| n.contains(&ip)))
        else {
            return Err(IpamError::Invalid(
                "The provided IP address is not in a configured pool\n".into(),
            ));
        };
        let uses = pool.spec.uses();
        if !uses.iter().any(|u| u == USE_WORKLOAD) {
            return Err(IpamError::Invalid(format!(
                "IP address {ip} is in IP pool {:?}, which is not allowed for use {USE_WORKLOAD:?} (allowedUses: [{}])",
                pool.metadata.name,
                uses.join(" ")
            )));
        }
        let cidr = IpNet::new(ip, pool.spec.effective_block_size())
            .map_err(|e| IpamError::Invalid(format!("IP pool {:?}: {e}", pool.metadata.name)))?
            .trunc();
        let what = format!("error updating IPAMBlock({})", cidr_name(&cidr));
        for _ in 0..CAS_ATTEMPTS {
            let Some(mut blk) = self.get_block(&cidr).await? else {
                // No block yet: claim it for this host (another host
                // winning is fine: the address goes in its block).
                self.claim(&cidr).await?;
                continue;
            };
            match block::assign_one(&mut blk.spec, &cidr, ip, handle, attrs) {
                Ok(()) => {}
                Err(block::AssignOneError::InUse(holder)) => {
                    return Err(IpamError::InUse(format!(
                        "resource already exists: address {ip} is already assigned in block {cidr} (to handle {})",
                        holder.as_deref().unwrap_or("<none>")
                    )));
                }
                Err(block::AssignOneError::OutOfBlock) => {
                    return Err(IpamError::Invalid(format!("{ip} is not in block {cidr}")));
                }
            }
            match self.put_block(&mut blk).await {
                Ok(_) => {}
                Err(DatastoreError::Conflict(_)) => continue,
                Err(e) => return Err(ds(what)(e)),
            }
            crate::fault::kill_point("ipam-assign-block");
            if let Err(e) = self.increment_handle(handle, &cidr, 1).await {
                self.undo(handle, &[ip]).await;
                return Err(e);
            }
            return Ok(with_prefix(ip, &cidr));
        }
        Err(contention(&what))
    }

    /// [`Self::reconcile_handle`] for the block `ip` falls in (none when no
    /// pool holds it).
    pub async fn reconcile_address(&self, ip: IpAddr, handle: &str) -> Result<bool, IpamError> {
        match self.block_cidr_of(ip).await? {
            Some(cidr) => self.reconcile_handle(handle, &cidr).await,
            None => Ok(false),
        }
    }

    /// Makes `handle`'s count for `cidr` what the block says it holds
    /// there (a writer killed between an explicit address's block write
    /// and its handle write leaves the handle short); whether it changed.
    pub async fn reconcile_handle(&self, handle: &str, cidr: &IpNet) -> Result<bool, IpamError> {
        let held = match self.get_block(cidr).await? {
            Some(b) => block::addresses_of(&b.spec, cidr, handle).len(),
            None => 0,
        };
        let name = handle_name_on(self.store.backend(), handle);
        let what = format!("error updating IPAMHandle({name})");
        let recorded = self
            .live_handle(&name, &what)
            .await?
            .and_then(|h| h.spec.block.get(&cidr.to_string()).copied())
            .unwrap_or(0);
        match held.cmp(&recorded) {
            std::cmp::Ordering::Equal => Ok(false),
            std::cmp::Ordering::Greater => {
                self.increment_handle(handle, cidr, held - recorded).await?;
                Ok(true)
            }
            std::cmp::Ordering::Less => {
                self.decrement_handle(handle, cidr, Some(recorded - held))
                    .await?;
                Ok(true)
            }
        }
    }
}
