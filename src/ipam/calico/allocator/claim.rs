//! Block claiming in two phases: a pending BlockAffinity, the block, the
//! affinity confirmed; a pending affinity left by a crash settled.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use ipnet::IpNet;

use super::super::IpamError;
use super::super::block;
use super::super::pools::blocks_for_host;
use super::{Allocator, CAS_ATTEMPTS, CLAIM_LOOKAHEAD, contention, ds};
use crate::datastore::DatastoreError;
use crate::datastore::ipam_model::{
    AFFINITY_CONFIRMED, AFFINITY_PENDING, BlockAffinity, BlockAffinitySpec, IpPool, IpamBlock,
    affinity_labels, affinity_name_on, cidr_name,
};

/// Whether an object created at `timestamp` (RFC 3339; none: long ago)
/// was made less than `within` ago.
pub(super) fn made_within(timestamp: &str, within: Duration) -> bool {
    let Ok(made) = timestamp.parse::<jiff::Timestamp>() else {
        return false;
    };
    let age = jiff::Timestamp::now().duration_since(made);
    age < jiff::SignedDuration::try_from(within).unwrap_or(jiff::SignedDuration::MAX)
}

impl<'a> Allocator<'a> {
    /// A pending affinity of this host: confirmed when its block exists
    /// and is this host's, deleted when the block is another's; left
    /// pending (for the claim to finish) when there is no block yet.
    pub(super) async fn settle_pending(
        &self,
        mut affinity: BlockAffinity,
        cidr: &IpNet,
    ) -> Result<bool, IpamError> {
        match self.get_block(cidr).await? {
            Some(b) if b.spec.affinity.as_deref() == Some(&self.affinity_value()) => {
                affinity.spec.state = AFFINITY_CONFIRMED.into();
                match self.store.update(&mut affinity).await {
                    Ok(_) | Err(DatastoreError::Conflict(_)) => Ok(true),
                    Err(e) => Err(ds("error confirming BlockAffinity")(e)),
                }
            }
            Some(_) => {
                self.drop_affinity(affinity).await;
                Ok(false)
            }
            None => Ok(false),
        }
    }

    pub(super) async fn drop_affinity(&self, mut affinity: BlockAffinity) {
        let name = affinity.metadata.name.clone();
        if let Err(e) = self
            .store
            .soft_delete(&mut affinity, |a| a.spec.deleted = "true".into())
            .await
        {
            tracing::warn!(%name, "removing a BlockAffinity this host does not hold: {e}");
        }
    }

    /// Claims the first free block of the pools (in this host's order);
    /// `None` when every block exists. The block names listed are left in
    /// `listed` (for borrowing, which looks at the same blocks next).
    pub(super) async fn claim_new_block(
        &self,
        pools: &[IpPool],
        listed: &std::sync::Mutex<Option<Vec<String>>>,
    ) -> Result<Option<IpNet>, IpamError> {
        // A claim that found none free a moment ago spares this one the
        // list (the pools and their block sizes as the note's key).
        let key = pools
            .iter()
            .map(|p| format!("{}/{}", p.spec.cidr, p.spec.effective_block_size()))
            .collect::<Vec<_>>()
            .join(",");
        let cache = self.blocks.get();
        if let Some(cache) = cache
            && cache.pools_full(&key).await
        {
            return Ok(None);
        }
        let names = self.list_blocks().await?;
        let existing: HashSet<String> = names.iter().cloned().collect();
        *listed.lock().unwrap_or_else(|p| p.into_inner()) = Some(names);
        for pool in pools {
            let Some(net) = pool.spec.network() else {
                continue;
            };
            let size = pool.spec.effective_block_size();
            for cidr in blocks_for_host(&net, size, self.host, existing.len() + CLAIM_LOOKAHEAD) {
                if existing.contains(&cidr_name(&cidr)) {
                    continue;
                }
                if self.claim(&cidr).await? {
                    return Ok(Some(cidr));
                }
            }
        }
        if let Some(cache) = cache {
            cache.note_pools_full(Some(&key)).await;
        }
        Ok(None)
    }

    /// Claims `cidr` for this host in two phases; false when another host
    /// got the block first.
    pub(super) async fn claim(&self, cidr: &IpNet) -> Result<bool, IpamError> {
        let name = affinity_name_on(self.store.backend(), self.host, cidr);
        let mut affinity = BlockAffinity::new(
            &name,
            BlockAffinitySpec {
                state: AFFINITY_PENDING.into(),
                node: self.host.to_string(),
                affinity_type: "host".into(),
                cidr: cidr.to_string(),
                deleted: "false".into(),
                ..BlockAffinitySpec::default()
            },
        );
        affinity.metadata.labels = affinity_labels(self.host, cidr);
        let what = format!("error claiming block {cidr}");
        if let Some(cache) = self.blocks.get() {
            cache.note_claim().await;
        }
        let mut affinity = match self.store.create(&mut affinity).await {
            Ok(a) => a,
            Err(DatastoreError::AlreadyExists(_)) => {
                match self
                    .store
                    .get::<BlockAffinity>("", &name)
                    .await
                    .map_err(ds(what.clone()))?
                {
                    Some(a) if a.spec.node == self.host && a.spec.deleted != "true" => a,
                    Some(a) if a.spec.deleted == "true" => {
                        // A release that stopped half way: finished, so
                        // that a later claim of this block can succeed.
                        self.finish_delete(&a).await;
                        return Ok(false);
                    }
                    _ => return Ok(false),
                }
            }
            Err(e) => return Err(ds(what)(e)),
        };
        let claim_time = crate::datastore::rfc3339_utc(SystemTime::now());
        let mut blk = IpamBlock::new(
            &cidr_name(cidr),
            block::new_block(cidr, Some(self.affinity_value()), Some(claim_time)),
        );
        match self.store.create(&mut blk).await {
            Ok(stored) => self.keep_block(&stored.metadata.name, Some(&stored)).await,
            Err(DatastoreError::AlreadyExists(_)) => {
                let ours = self
                    .get_block(cidr)
                    .await?
                    .is_some_and(|b| b.spec.affinity.as_deref() == Some(&self.affinity_value()));
                if !ours {
                    self.drop_affinity(affinity).await;
                    return Ok(false);
                }
            }
            Err(e) => {
                self.drop_affinity(affinity).await;
                return Err(ds(what)(e));
            }
        }
        for _ in 0..CAS_ATTEMPTS {
            if affinity.spec.state == AFFINITY_CONFIRMED {
                return Ok(true);
            }
            affinity.spec.state = AFFINITY_CONFIRMED.into();
            match self.store.update(&mut affinity).await {
                Ok(_) => return Ok(true),
                Err(DatastoreError::Conflict(_)) => {
                    match self
                        .store
                        .get::<BlockAffinity>("", &name)
                        .await
                        .map_err(ds(what.clone()))?
                    {
                        Some(a) => affinity = a,
                        None => return Ok(false),
                    }
                }
                Err(e) => return Err(ds(what)(e)),
            }
        }
        Err(contention(&what))
    }
}
