//! Auto-assignment: per family, this host's affine blocks first, then a new
//! block claimed ([`super::claim`]), then, unless strictAffinity,
//! borrowing from other hosts' blocks; the addresses taken from a block
//! and written with the handle, undone when a later step fails.

use std::net::IpAddr;
use std::sync::atomic::Ordering;

use ipnet::IpNet;

use super::super::IpamError;
use super::super::block;
use super::super::pools::{automatic_pools, host_seed, requested_pools};
use super::handles::new_handle;
use super::inputs::{Affinities, Inputs};
use super::{
    Allocator, Assigned, AutoAssign, CAS_ATTEMPTS, DEFAULT_MAX_BLOCKS_PER_HOST, contention, ds,
};
use crate::datastore::ipam_model::{
    AFFINITY_CONFIRMED, AFFINITY_PENDING, BlockAffinity, IpPool, IpamBlock, IpamConfigSpec,
    IpamHandle, cidr_name, cidr_of_block_name, handle_name_on,
};
use crate::datastore::{DatastoreError, Write, decode};

/// What one family got, and why it fell short.
pub(super) struct FamilyOutcome {
    ips: Vec<IpNet>,
    messages: Vec<String>,
}

/// How a block is looked at for an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Candidate {
    /// One of this host's, on a first look: a kept copy offering nothing
    /// is left for later ([`Taken::CopyOffersNothing`]).
    Affine,
    /// One of this host's whose copy offered nothing on a first look:
    /// read from the datastore.
    AffineRead,
    /// A block this call has just claimed: from its copy, read again when
    /// the copy offers nothing.
    Claimed,
    /// Another host's (borrowing).
    Borrowed,
}

/// What [`Allocator::assign_from_block`] took.
#[derive(Debug)]
pub(super) enum Taken {
    Addresses(Vec<IpNet>),
    /// Nothing: the kept copy offered no address (not read again).
    CopyOffersNothing,
}

impl Taken {
    pub(super) fn addresses(self) -> Vec<IpNet> {
        match self {
            Taken::Addresses(ips) => ips,
            Taken::CopyOffersNothing => Vec::new(),
        }
    }
}

/// Addresses of a block with its prefix length.
pub(super) fn with_prefixes(ips: Vec<IpAddr>, cidr: &IpNet) -> Vec<IpNet> {
    ips.into_iter().map(|ip| with_prefix(ip, cidr)).collect()
}

pub(super) fn with_prefix(ip: IpAddr, cidr: &IpNet) -> IpNet {
    IpNet::new(ip, cidr.prefix_len()).expect("a block's prefix fits its family")
}

impl<'a> Allocator<'a> {
    /// Auto-assigns per family; all or nothing: a family that falls short
    /// (or fails) releases what the other got.
    pub async fn auto_assign(&self, req: &AutoAssign<'_>) -> Result<Assigned, IpamError> {
        self.auto_assign_from(req, None).await
    }

    /// [`Allocator::auto_assign`] from the inputs [`Allocator::read_ahead`]
    /// read (`None`: read now).
    pub async fn auto_assign_from(
        &self,
        req: &AutoAssign<'_>,
        ahead: Option<Inputs>,
    ) -> Result<Assigned, IpamError> {
        let ahead = std::sync::Mutex::new(ahead);
        self.with_latest_pools(|| async {
            let early = ahead.lock().unwrap_or_else(|p| p.into_inner()).take();
            let inputs = match early {
                Some(inputs) => inputs,
                None => self.inputs(req, false).await?,
            };
            self.auto_assign_once(req, inputs).await
        })
        .await
    }

    pub(super) async fn auto_assign_once(
        &self,
        req: &AutoAssign<'_>,
        inputs: Inputs,
    ) -> Result<Assigned, IpamError> {
        let Inputs {
            config,
            pools,
            reserved,
            affinities: [affinities4, affinities6],
            ahead,
            claims_seen,
        } = inputs;
        let mut assigned = Assigned::default();
        for (v6, num, requested, affinities) in [
            (false, req.num4, req.pools4, affinities4),
            (true, req.num6, req.pools6, affinities6),
        ] {
            if num == 0 {
                continue;
            }
            let outcome = self
                .assign_family(
                    v6,
                    num,
                    requested,
                    req,
                    &config,
                    &pools,
                    &reserved,
                    Affinities {
                        list: affinities.unwrap_or_default(),
                        ahead,
                        claims_seen,
                    },
                )
                .await;
            let short = match outcome {
                Ok(o) if o.ips.len() == num => {
                    if v6 {
                        &mut assigned.v6
                    } else {
                        &mut assigned.v4
                    }
                    .extend(o.ips);
                    continue;
                }
                Ok(o) => {
                    let family = if v6 { "IPv6" } else { "IPv4" };
                    let mut msg = format!(
                        "failed to request {family} addresses: Assigned {} out of {num} requested {family} addresses",
                        o.ips.len()
                    );
                    for m in &o.messages {
                        msg.push_str("; ");
                        msg.push_str(m);
                    }
                    let partial: Vec<IpAddr> = o.ips.iter().map(IpNet::addr).collect();
                    self.undo(req.handle, &partial).await;
                    IpamError::Exhausted(msg)
                }
                Err(e) => e,
            };
            let got: Vec<IpAddr> = assigned
                .v4
                .iter()
                .chain(&assigned.v6)
                .map(IpNet::addr)
                .collect();
            self.undo(req.handle, &got).await;
            return Err(short);
        }
        Ok(assigned)
    }

    /// Releases addresses this call took, logging (not returning) errors:
    /// the caller reports the failure that made it undo. They were never
    /// handed out, so they are free at once (no cooldown).
    pub(super) async fn undo(&self, handle: &str, ips: &[IpAddr]) {
        if ips.is_empty() {
            return;
        }
        if let Err(e) = self.release_ips_as(ips, None).await {
            tracing::warn!(%handle, "releasing {ips:?} after a failed assignment: {e}");
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn assign_family(
        &self,
        v6: bool,
        num: usize,
        requested: &[String],
        req: &AutoAssign<'_>,
        config: &IpamConfigSpec,
        all_pools: &[IpPool],
        reserved_nets: &[IpNet],
        affinities: Affinities,
    ) -> Result<FamilyOutcome, IpamError> {
        let pools = if requested.is_empty() {
            automatic_pools(all_pools, v6, self.host, req.labels).await?
        } else {
            requested_pools(all_pools, requested, v6)?
        };
        let nets: Vec<IpNet> = pools.iter().filter_map(|p| p.spec.network()).collect();
        let in_pools = |cidr: &IpNet| nets.iter().any(|n| n.contains(cidr));
        let reserved = |ip: IpAddr| reserved_nets.iter().any(|r| r.contains(&ip));
        let mut ips = Vec::new();
        let mut messages = Vec::new();

        // 1. This host's blocks (those read ahead, then any claimed since).
        // A block whose kept copy offers nothing (full as this host last
        // wrote it) is passed over while another of the host's blocks has
        // room, and read again only before the call concludes that none
        // has (a burst that fills one block then goes on in the next
        // without reading the full one again under the lock).
        let from_affine = async |cidrs: &[IpNet], ips: &mut Vec<IpNet>, full: &mut Vec<IpNet>| {
            for cidr in cidrs.iter().filter(|c| in_pools(c)) {
                if ips.len() == num {
                    break;
                }
                match self
                    .assign_from_block(cidr, num - ips.len(), req, &reserved, Candidate::Affine)
                    .await?
                {
                    Taken::Addresses(got) => ips.extend(got),
                    Taken::CopyOffersNothing => full.push(*cidr),
                }
            }
            Ok::<_, IpamError>(())
        };
        let mut full_copies = Vec::new();
        let mut affine = self.affine_blocks(affinities.list).await?;
        from_affine(&affine, &mut ips, &mut full_copies).await?;
        if ips.len() < num && affinities.ahead && self.claimed_since(affinities.claims_seen).await {
            let claimed_since: Vec<IpNet> = self
                .affine_blocks(self.host_affinities(v6).await?)
                .await?
                .into_iter()
                .filter(|c| !affine.contains(c))
                .collect();
            from_affine(&claimed_since, &mut ips, &mut full_copies).await?;
            affine.extend(claimed_since);
        }
        for cidr in &full_copies {
            if ips.len() == num {
                break;
            }
            let got = self
                .assign_from_block(cidr, num - ips.len(), req, &reserved, Candidate::AffineRead)
                .await?;
            ips.extend(got.addresses());
        }

        // 2. New blocks.
        let limit = match (config.max_blocks_per_host.max(0) as usize, req.max_blocks) {
            (0, 0) => DEFAULT_MAX_BLOCKS_PER_HOST,
            (0, r) => r,
            (g, 0) => g,
            (g, r) => g.min(r),
        };
        let mut owned = affine.len();
        // The block names a claim listed last (borrowing looks at them).
        let listed = std::sync::Mutex::new(None);
        let new_blocks = async |ips: &mut Vec<IpNet>, owned: &mut usize| {
            while ips.len() < num {
                if !config.auto_allocate_blocks {
                    return Ok(Some("automatic block allocation is disabled".to_string()));
                }
                if *owned >= limit {
                    return Ok(Some(format!(
                        "Need to allocate an IPAM block but could not - limit of {limit} blocks reached for this node"
                    )));
                }
                let Some(cidr) = self.claim_new_block(&pools, &listed).await? else {
                    break;
                };
                *owned += 1;
                let got = self
                    .assign_from_block(&cidr, num - ips.len(), req, &reserved, Candidate::Claimed)
                    .await?;
                ips.extend(got.addresses());
            }
            Ok::<_, IpamError>(None)
        };
        messages.extend(new_blocks(&mut ips, &mut owned).await?);

        // 3. Borrowing from other hosts' blocks.
        let finished_before = self.finished.load(Ordering::Relaxed);
        if ips.len() < num {
            if config.strict_affinity {
                messages.push("No more free affine blocks and strict affinity enabled".to_string());
            } else {
                // First the blocks this host last borrowed from (as its
                // copies tell: most often one with room, and no list),
                // then every block of the pools.
                let mut tried = Vec::new();
                let borrowed = match self.blocks.get() {
                    Some(cache) => cache.borrowed(&self.affinity_value(), v6).await,
                    None => Vec::new(),
                };
                for cidr in borrowed.into_iter().filter(|c| in_pools(c)) {
                    if ips.len() == num {
                        break;
                    }
                    tried.push(cidr);
                    ips.extend(
                        self.borrow_from(&cidr, num - ips.len(), req, &reserved)
                            .await?,
                    );
                }
                if ips.len() < num {
                    let earlier = listed.lock().unwrap_or_else(|p| p.into_inner()).take();
                    let names = match earlier {
                        Some(names) => names,
                        None => self.list_blocks().await?,
                    };
                    let mut candidates: Vec<IpNet> = names
                        .iter()
                        .filter_map(|n| cidr_of_block_name(n))
                        // Every block of the pools, each read fresh below:
                        // one full (or deleted) when listed may have
                        // changed since.
                        .filter(|c| in_pools(c) && c.addr().is_ipv6() == v6)
                        .filter(|c| !tried.contains(c))
                        .collect();
                    // Hosts start at different places (as new blocks do).
                    if !candidates.is_empty() {
                        let start = (host_seed(self.host) % candidates.len() as u128) as usize;
                        candidates.rotate_left(start);
                    }
                    for cidr in candidates {
                        if ips.len() == num {
                            break;
                        }
                        ips.extend(
                            self.borrow_from(&cidr, num - ips.len(), req, &reserved)
                                .await?,
                        );
                    }
                }
            }
        }
        // A block whose interrupted delete borrowing finished is free
        // again: claimed now rather than by the next ADD.
        if ips.len() < num
            && self.finished.load(Ordering::Relaxed) > finished_before
            && let Some(m) = new_blocks(&mut ips, &mut owned).await?
            && !messages.contains(&m)
        {
            messages.push(m);
        }
        if ips.len() < num {
            messages.push(format!("No IPs available in pools: {nets:?}"));
        }
        Ok(FamilyOutcome { ips, messages })
    }

    /// Whether a claim of this host's may have started since its
    /// affinities were read ahead, after `seen` claims: unless the count
    /// kept beside the lock (held) still says `seen`.
    async fn claimed_since(&self, seen: Option<u64>) -> bool {
        let Some(seen) = seen else {
            return true;
        };
        match self.blocks.get() {
            Some(cache) => cache.claims().await != Some(seen),
            None => true,
        }
    }

    /// Up to `n` addresses borrowed from another host's block.
    async fn borrow_from(
        &self,
        cidr: &IpNet,
        n: usize,
        req: &AutoAssign<'_>,
        reserved: &(dyn Fn(IpAddr) -> bool + Sync),
    ) -> Result<Vec<IpNet>, IpamError> {
        let got = self
            .assign_from_block(cidr, n, req, reserved, Candidate::Borrowed)
            .await?;
        Ok(got.addresses())
    }

    /// The blocks of these affinities that are this host's (a pending one,
    /// a claim that stopped half way, is finished or undone first), in
    /// address order.
    pub(super) async fn affine_blocks(
        &self,
        affinities: Vec<BlockAffinity>,
    ) -> Result<Vec<IpNet>, IpamError> {
        let mut affine: Vec<IpNet> = Vec::new();
        for a in affinities {
            let Ok(cidr) = a.spec.cidr.parse::<IpNet>() else {
                continue;
            };
            if a.spec.state == AFFINITY_PENDING {
                if self.settle_pending(a, &cidr).await? {
                    affine.push(cidr);
                }
            } else if a.spec.state == AFFINITY_CONFIRMED {
                affine.push(cidr);
            }
        }
        affine.sort();
        Ok(affine)
    }

    /// Takes up to `n` addresses from the block for the request's handle:
    /// the handle first, then the block on the revision read (a lost race
    /// reads the block again; the handle keeps its count while the next
    /// attempt takes as many, and gives back what no write took).
    pub(super) async fn assign_from_block(
        &self,
        cidr: &IpNet,
        n: usize,
        req: &AutoAssign<'_>,
        reserved: &(dyn Fn(IpAddr) -> bool + Sync),
        candidate: Candidate,
    ) -> Result<Taken, IpamError> {
        let mut counted = 0;
        let taken = self
            .take_from_block(cidr, n, req, reserved, candidate, &mut counted)
            .await;
        if counted > 0 {
            // The handle counts addresses whose block write never landed.
            let given_back = self.decrement_handle(req.handle, cidr, Some(counted)).await;
            match (&taken, given_back) {
                (Ok(_), Err(e)) => return Err(e),
                (Err(_), Err(e)) => {
                    tracing::warn!(handle = %req.handle, %cidr, "giving back the handle's count of {counted}: {e}")
                }
                _ => {}
            }
        }
        taken
    }

    /// [`Allocator::assign_from_block`]'s attempts; `counted`: how many
    /// addresses of `cidr` the handle counts for this call that no block
    /// write holds (yet).
    async fn take_from_block(
        &self,
        cidr: &IpNet,
        n: usize,
        req: &AutoAssign<'_>,
        reserved: &(dyn Fn(IpAddr) -> bool + Sync),
        candidate: Candidate,
        counted: &mut usize,
    ) -> Result<Taken, IpamError> {
        let what = format!("error updating IPAMBlock({})", cidr_name(cidr));
        let none = || Ok(Taken::Addresses(Vec::new()));
        let mut grouping = true;
        for attempt in 0..CAS_ATTEMPTS {
            // Only an address the copy offers is trusted (the write is on
            // its revision); a copy offering none is read again, or, for
            // one of this host's blocks on a first look, left for later.
            let copy = attempt == 0 && candidate != Candidate::AffineRead;
            let (read, from_copy) = self.block_to_write(cidr, copy).await?;
            let Some(mut blk) = read else {
                return none();
            };
            let mine = self.served_unrecorded(&blk, cidr, req.handle);
            if !mine.is_empty() {
                // The handle's count as the block has it (a write of this
                // call's that lost took its count back).
                self.reconcile_handle(req.handle, cidr).await?;
                *counted = 0;
                return Ok(Taken::Addresses(with_prefixes(mine, cidr)));
            }
            let usable = candidate == Candidate::Borrowed
                || blk.spec.affinity.as_deref() == Some(&self.affinity_value());
            let got = match usable {
                true => block::assign(&mut blk.spec, cidr, n, req.handle, req.attrs, reserved),
                false => Vec::new(),
            };
            if got.is_empty() {
                match (from_copy, candidate) {
                    (true, Candidate::Affine) => return Ok(Taken::CopyOffersNothing),
                    (true, _) => continue,
                    (false, _) => return none(),
                }
            }
            if self.store.writes_together() {
                // The calls waiting for the lock served in the same
                // transaction (until a write with them fails: one of their
                // handles may exist, a retried ADD's).
                let mut group = match (candidate, grouping) {
                    (Candidate::Borrowed, _) | (_, false) => Vec::new(),
                    _ => self.gather(&blk, cidr, req, reserved).await,
                };
                Self::assign_group(&mut blk, cidr, &mut group, reserved);
                let extra = Self::group_handles(&group, cidr).map_err(ds(what.clone()))?;
                let grouped = !extra.is_empty();
                match self
                    .write_with_handle(req.handle, cidr, got.len(), &mut blk, attempt > 0, extra)
                    .await
                {
                    Ok(()) => {
                        self.record_served(group, cidr).await;
                        return Ok(Taken::Addresses(with_prefixes(got, cidr)));
                    }
                    Err(_) if grouped => {
                        grouping = false;
                        continue;
                    }
                    // The block or the handle changed (or went) since
                    // read: both are read again.
                    Err(
                        DatastoreError::Conflict(_)
                        | DatastoreError::AlreadyExists(_)
                        | DatastoreError::NotFound(_),
                    ) => continue,
                    Err(_) if from_copy => continue,
                    Err(e) => return Err(ds(what)(e)),
                }
            }
            // The calls waiting for the lock whose addresses this write
            // can take as well, their handles written beside this one's.
            let gather = async {
                match candidate {
                    Candidate::Borrowed => Vec::new(),
                    _ => self.gather(&blk, cidr, req, reserved).await,
                }
            };
            // The handle's count made this attempt's (a retry after a
            // lost race most often takes as many: no write).
            let own = async {
                match got.len().cmp(counted) {
                    std::cmp::Ordering::Greater => {
                        self.handle_for(req.handle, cidr, got.len() - *counted)
                            .await
                    }
                    std::cmp::Ordering::Less => {
                        self.decrement_handle(req.handle, cidr, Some(*counted - got.len()))
                            .await
                    }
                    std::cmp::Ordering::Equal => Ok(()),
                }
            };
            let (own, mut group) = tokio::join!(own, gather);
            own?;
            *counted = got.len();
            Self::assign_group(&mut blk, cidr, &mut group, reserved);
            crate::fault::kill_point("ipam-handle");
            match self.put_block(&mut blk).await {
                Ok(_) => {
                    *counted = 0;
                    self.record_served(group, cidr).await;
                    return Ok(Taken::Addresses(with_prefixes(got, cidr)));
                }
                Err(DatastoreError::Conflict(_)) => continue,
                Err(DatastoreError::NotFound(_)) => return none(),
                // A write from a copy the datastore refuses for another
                // reason (a uid it does not know): the block is read again.
                Err(_) if from_copy => continue,
                Err(e) => return Err(ds(what)(e)),
            }
        }
        Err(contention(&what))
    }

    /// Writes an assignment made in `blk` (`n` addresses of `cidr` for
    /// `handle`) and the handle's count in one transaction: both or
    /// neither, so an allocation is never without its handle, nor a
    /// handle's count without its addresses. The handle is taken to be new
    /// (a create, no read) unless `read_handle`: after a write that failed,
    /// or for a retried ADD, whose handle exists. `others` (the handles of
    /// the waiting calls it serves) go in the same transaction. On success
    /// the block copy is kept; on failure it is dropped.
    pub(super) async fn write_with_handle(
        &self,
        handle: &str,
        cidr: &IpNet,
        n: usize,
        blk: &mut IpamBlock,
        read_handle: bool,
        others: Vec<Write>,
    ) -> Result<(), DatastoreError> {
        let name = handle_name_on(self.store.backend(), handle);
        let current = match read_handle {
            true => self.store.get::<IpamHandle>("", &name).await?,
            false => None,
        };
        let handle_write = match current {
            Some(mut h) if !h.spec.deleted => {
                *h.spec.block.entry(cidr.to_string()).or_insert(0) += n;
                Write::update(&mut h)?
            }
            current => {
                if let Some(going) = current {
                    // Going away (or left half deleted): gone first.
                    self.finish_delete(&going).await;
                }
                Write::create(&mut new_handle(&name, handle, cidr, n))?
            }
        };
        blk.spec.sequence_number += 1;
        let mut writes = vec![handle_write];
        writes.extend(others);
        writes.push(Write::update(blk)?);
        let written = self.store.write_together(writes).await;
        crate::fault::kill_point("ipam-handle");
        // The block as stored (the second write's answer) is kept; a
        // write that failed drops the copy.
        let stored = match written {
            Ok(mut stored) => stored.pop().and_then(|b| decode::<IpamBlock>(b).ok()),
            Err(e) => {
                self.keep_block(&blk.metadata.name, None).await;
                return Err(e);
            }
        };
        self.keep_block(&blk.metadata.name, stored.as_ref()).await;
        Ok(())
    }
}
