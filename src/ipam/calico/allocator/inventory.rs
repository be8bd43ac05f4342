//! What other code asks of the allocations: room left (STATUS), a
//! handle's addresses and attributes, an address's owner changed
//! (KubeVirt), this host's handles and their pods (GC), the affinities'
//! labels (upgrade).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;

use super::super::IpamError;
use super::super::block;
use super::claim::made_within;
use super::{Allocator, CAS_ATTEMPTS, contention, ds};
use crate::datastore::ipam_model::{
    ATTR_NAMESPACE, ATTR_NODE, ATTR_POD, BlockAffinity, IpPool, IpamBlock, IpamHandle,
    affinity_labels, cidr_name, handle_name_on,
};
use crate::datastore::{DatastoreError, ListFilter};

impl<'a> Allocator<'a> {
    /// Whether this host can be given one more address from `pools`: a
    /// free, unreserved address in a block affine to it (with `strict`
    /// affinity off: in any of their blocks), or, with `auto_blocks`, a
    /// pool with room for another block.
    pub async fn has_room(
        &self,
        pools: &[IpPool],
        strict: bool,
        auto_blocks: bool,
    ) -> Result<bool, IpamError> {
        let reserved = self.reservations().await?;
        let is_reserved = |ip: IpAddr| reserved.iter().any(|r| r.contains(&ip));
        let ours = self.affinity_value();
        let nets: Vec<(IpNet, u8)> = pools
            .iter()
            .filter_map(|p| p.spec.network().map(|n| (n, p.spec.effective_block_size())))
            .collect();
        // This host's own blocks first, through its affinities: what a
        // node with room answers with (a runtime asks every few seconds),
        // without reading the cluster's blocks.
        for v6 in [false, true] {
            if !nets.iter().any(|(n, _)| n.addr().is_ipv6() == v6) {
                continue;
            }
            for a in self.host_affinities(v6).await? {
                let Ok(cidr) = a.spec.cidr.parse::<IpNet>() else {
                    continue;
                };
                if !nets.iter().any(|(n, _)| n.contains(&cidr)) {
                    continue;
                }
                if let Some(b) = self.get_block(&cidr).await?
                    && b.spec.affinity.as_deref() == Some(ours.as_str())
                    && block::free_count(&b.spec, &cidr, &is_reserved) > 0
                {
                    return Ok(true);
                }
            }
        }
        // Full, or none yet: another block to borrow from, or room for one.
        let blocks = self
            .store
            .list::<IpamBlock>("", &ListFilter::All)
            .await
            .map_err(ds("error listing IPAM blocks"))?;
        let mut per_pool = vec![0u128; nets.len()];
        for b in blocks.into_iter().filter(|b| !b.spec.deleted) {
            let Ok(cidr) = b.spec.cidr.parse::<IpNet>() else {
                continue;
            };
            let Some(i) = nets.iter().position(|(n, _)| n.contains(&cidr)) else {
                continue;
            };
            per_pool[i] += 1;
            let b = self.collected(b).await?;
            let usable = !strict || b.spec.affinity.as_deref() == Some(ours.as_str());
            if usable && block::free_count(&b.spec, &cidr, &is_reserved) > 0 {
                return Ok(true);
            }
        }
        Ok(auto_blocks
            && nets.iter().zip(&per_pool).any(|((net, size), n)| {
                let bits = u32::from(size.saturating_sub(net.prefix_len()));
                1u128.checked_shl(bits).is_none_or(|capacity| *n < capacity)
            }))
    }

    /// The addresses `handle` holds.
    pub async fn addresses_of(&self, handle: &str) -> Result<Vec<IpAddr>, IpamError> {
        let name = handle_name_on(self.store.backend(), handle);
        let Some(h) = self
            .live_handle(&name, &format!("error getting IPAMHandle({name})"))
            .await?
        else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for cidr in h.spec.block.keys().filter_map(|c| c.parse::<IpNet>().ok()) {
            if let Some(b) = self.get_block(&cidr).await? {
                out.extend(block::addresses_of(&b.spec, &cidr, handle));
            }
        }
        Ok(out)
    }

    /// The attributes `ip` is allocated with (`None`: not allocated).
    pub async fn attributes_of(
        &self,
        ip: IpAddr,
    ) -> Result<Option<crate::datastore::ipam_model::AllocationAttribute>, IpamError> {
        let Some(cidr) = self.block_cidr_of(ip).await? else {
            return Ok(None);
        };
        Ok(self
            .get_block(&cidr)
            .await?
            .and_then(|b| block::attribute_of(&b.spec, &cidr, ip).cloned()))
    }

    /// Sets an owner slot of `ip` (held by `handle`) to `attrs` (empty:
    /// cleared), compare-and-swap on the block; with `expected` (namespace,
    /// pod), only while that slot still names that pod (Calico's
    /// preconditions). The address's attributes as written.
    pub async fn set_owner(
        &self,
        ip: IpAddr,
        handle: &str,
        slot: block::OwnerSlot,
        attrs: &BTreeMap<String, String>,
        expected: Option<(&str, &str)>,
    ) -> Result<crate::datastore::ipam_model::AllocationAttribute, IpamError> {
        let cidr = self
            .block_cidr_of(ip)
            .await?
            .ok_or_else(|| IpamError::Invalid(format!("{ip} is not in a configured pool")))?;
        let what = format!("error updating IPAMBlock({})", cidr_name(&cidr));
        for _ in 0..CAS_ATTEMPTS {
            let Some(mut blk) = self.get_block(&cidr).await? else {
                return Err(IpamError::Invalid(format!("{ip} is not allocated")));
            };
            if let Some((namespace, pod)) = expected {
                let current = block::attribute_of(&blk.spec, &cidr, ip)
                    .map(|a| match slot {
                        block::OwnerSlot::Active => a.secondary.clone(),
                        block::OwnerSlot::Alternate => a.alternate.clone(),
                    })
                    .unwrap_or_default();
                let found = |k: &str| current.get(k).map_or("", String::as_str);
                if found(ATTR_POD) != pod || found(ATTR_NAMESPACE) != namespace {
                    let name = match slot {
                        block::OwnerSlot::Active => "ActiveOwnerAttrs",
                        block::OwnerSlot::Alternate => "AlternateOwnerAttrs",
                    };
                    return Err(IpamError::Contention(format!(
                        "cannot set {name}: expected pod={pod} namespace={namespace} but found pod={} namespace={}",
                        found(ATTR_POD),
                        found(ATTR_NAMESPACE)
                    )));
                }
            }
            block::set_owner(&mut blk.spec, &cidr, ip, handle, slot, attrs.clone())
                .map_err(IpamError::Invalid)?;
            let written = block::attribute_of(&blk.spec, &cidr, ip)
                .cloned()
                .unwrap_or_default();
            match self.put_block(&mut blk).await {
                Ok(_) => return Ok(written),
                Err(DatastoreError::Conflict(_)) => continue,
                Err(e) => return Err(ds(what)(e)),
            }
        }
        Err(contention(&what))
    }

    /// The block `ip` belongs in, by the pool that holds it.
    pub(super) async fn block_cidr_of(&self, ip: IpAddr) -> Result<Option<IpNet>, IpamError> {
        let pools = self.pools().await?;
        Ok(pools
            .iter()
            .find(|p| p.spec.network().is_some_and(|n| n.contains(&ip)))
            .and_then(|p| IpNet::new(ip, p.spec.effective_block_size()).ok())
            .map(|c| c.trunc()))
    }

    /// The handles holding an address allocated to this host (by the
    /// allocation's `node` attribute) whose ID starts with `prefix`.
    pub async fn host_handles(&self, prefix: &str) -> Result<BTreeSet<String>, IpamError> {
        Ok(self.host_handle_pods(prefix).await?.into_keys().collect())
    }

    /// The handles whose ID starts with `prefix` that hold no address in
    /// any block although they count some in blocks affine to this host
    /// (every block they name exists and is this host's): what an ADD
    /// killed between writing its handle and writing the block's
    /// allocation leaves (Calico's order: handle first, then block). Only
    /// this host's blocks, as only this host's calls — serialized by the
    /// IPAM lock — allocate from them save a rare borrower. Where the
    /// datastore writes one object at a time, a handle made less than
    /// `in_flight` ago (a call's deadline) is not one: an ADD writes its
    /// handle there before the lock ([`Allocator::create_handle_ahead`]),
    /// so it may be on its way to the lock.
    pub async fn orphan_host_handles(
        &self,
        prefix: &str,
        in_flight: Duration,
    ) -> Result<BTreeSet<String>, IpamError> {
        let blocks = self
            .store
            .list::<IpamBlock>("", &ListFilter::All)
            .await
            .map_err(ds("error listing IPAM blocks"))?;
        let handles = self
            .store
            .list::<IpamHandle>("", &ListFilter::All)
            .await
            .map_err(ds("error listing IPAM handles"))?;
        let live: Vec<&IpamBlock> = blocks.iter().filter(|b| !b.spec.deleted).collect();
        let holding: HashSet<&str> = live
            .iter()
            .flat_map(|b| {
                b.spec
                    .allocations
                    .iter()
                    .flatten()
                    .filter_map(|i| b.spec.attributes.get(*i))
                    .filter_map(|a| a.handle_id.as_deref())
            })
            .collect();
        let ours = self.affinity_value();
        let affine: HashSet<&str> = live
            .iter()
            .filter(|b| b.spec.affinity.as_deref() == Some(ours.as_str()))
            .map(|b| b.spec.cidr.as_str())
            .collect();
        Ok(handles
            .iter()
            .filter(|h| !h.spec.deleted && h.spec.handle_id.starts_with(prefix))
            .filter(|h| !holding.contains(h.spec.handle_id.as_str()))
            .filter(|h| {
                !h.spec.block.is_empty() && h.spec.block.keys().all(|c| affine.contains(c.as_str()))
            })
            .filter(|h| {
                self.store.writes_together()
                    || !made_within(&h.metadata.creation_timestamp, in_flight)
            })
            .map(|h| h.spec.handle_id.clone())
            .collect())
    }

    /// [`Allocator::host_handles`], each with the pod (namespace, name) its
    /// allocation's attributes name, if any.
    pub async fn host_handle_pods(
        &self,
        prefix: &str,
    ) -> Result<BTreeMap<String, Option<(String, String)>>, IpamError> {
        let blocks = self
            .store
            .list::<IpamBlock>("", &ListFilter::All)
            .await
            .map_err(ds("error listing IPAM blocks"))?;
        let mut found = BTreeMap::new();
        for b in blocks.iter().filter(|b| !b.spec.deleted) {
            for index in b.spec.allocations.iter().flatten() {
                let Some(attr) = b.spec.attributes.get(*index) else {
                    continue;
                };
                let on_host = attr.secondary.get(ATTR_NODE).map(String::as_str) == Some(self.host);
                if let Some(h) = attr.handle_id.as_deref()
                    && on_host
                    && h.starts_with(prefix)
                {
                    let pod = match (
                        attr.secondary.get(ATTR_NAMESPACE),
                        attr.secondary.get(ATTR_POD),
                    ) {
                        (Some(ns), Some(pod)) if !ns.is_empty() && !pod.is_empty() => {
                            Some((ns.clone(), pod.clone()))
                        }
                        _ => None,
                    };
                    let entry = found.entry(h.to_string()).or_insert(None);
                    if entry.is_none() {
                        *entry = pod;
                    }
                }
            }
        }
        Ok(found)
    }

    /// Stamps the hostname-hash, affinity-type and ip-version labels on
    /// this host's BlockAffinities that lack them (affinities written by
    /// older Calico releases); how many were labelled.
    pub async fn label_host_affinities(&self) -> Result<usize, IpamError> {
        let all = self
            .store
            .list::<BlockAffinity>("", &ListFilter::All)
            .await
            .map_err(ds("error listing BlockAffinities"))?;
        let mut labelled = 0;
        for mut a in all.into_iter().filter(|a| a.spec.node == self.host) {
            let Ok(cidr) = a.spec.cidr.parse::<IpNet>() else {
                continue;
            };
            let wanted = affinity_labels(self.host, &cidr);
            if wanted
                .iter()
                .all(|(k, v)| a.metadata.labels.get(k) == Some(v))
            {
                continue;
            }
            a.metadata.labels.extend(wanted);
            match self.store.update(&mut a).await {
                Ok(_) => labelled += 1,
                Err(DatastoreError::Conflict(_) | DatastoreError::NotFound(_)) => {}
                Err(e) => return Err(ds("error labelling BlockAffinity")(e)),
            }
        }
        Ok(labelled)
    }
}
