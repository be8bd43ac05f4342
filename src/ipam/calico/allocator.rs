//! Calico's allocator on the store API (calico-behaviour.md §10.3): affine
//! blocks first, then a new block claimed in two phases (a pending
//! BlockAffinity, the block, the affinity confirmed), then, unless
//! strictAffinity, borrowing from other hosts' blocks. Every write is
//! compare-and-swap on the revision read, retried a bounded number of
//! times; block and affinity deletes are soft first (`deleted: true`, then
//! a delete on that revision) so that readers, which ignore soft-deleted
//! objects, never act on an object that is going away; a handle, read only
//! by its own container's calls and GC, is deleted in one compare-and-swap.
//!
//! Write order (so that a crash leaves at worst a handle without an
//! address, which the handle's release cleans up, never an address
//! without a handle): auto-assign increments the handle, then writes the
//! block (and takes the handle back if the block write loses); an explicit
//! address is written to the block, then to the handle (and freed again if
//! the handle write fails); release frees the block's addresses, then
//! takes them off the handle. A block write under the host lock also takes
//! addresses for the calls waiting for it (their handles written ahead, made
//! to name that block first where they name another: [`super::intents`]).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use ipnet::IpNet;

use super::IpamError;
use super::block;
use super::block_cache::{self, BlockCache};
use super::intents::Intents;
use super::pools::{
    SelectorLabels, USE_WORKLOAD, automatic_pools, blocks_for_host, host_seed, pools_select_nodes,
    requested_pools,
};
use crate::datastore::ipam_model::{
    AFFINITY_CONFIRMED, AFFINITY_PENDING, ATTR_NAMESPACE, ATTR_NODE, ATTR_POD, BlockAffinity,
    BlockAffinitySpec, IpPool, IpReservation, IpamBlock, IpamConfig, IpamConfigSpec, IpamHandle,
    IpamHandleSpec, LABEL_AFFINITY_TYPE, LABEL_HOSTNAME_HASH, LABEL_IP_VERSION, affinity_labels,
    affinity_name_on, cidr_name, cidr_of_block_name, handle_name_on, hostname_hash,
};
use crate::datastore::{DatastoreError, ListFilter, Precondition, Resource, Store, Write, decode};

mod group_commit;

/// Conflicts retried before giving up (Calico's figure).
const CAS_ATTEMPTS: usize = 100;
/// The per-host block limit when neither IPAMConfig nor the request set one.
const DEFAULT_MAX_BLOCKS_PER_HOST: usize = 20;
/// New-block candidates looked at beyond the blocks known to exist.
const CLAIM_LOOKAHEAD: usize = 64;

/// One auto-assign request.
pub struct AutoAssign<'a> {
    pub num4: usize,
    pub num6: usize,
    pub handle: &'a str,
    pub attrs: &'a BTreeMap<String, String>,
    /// Requested pools (CIDRs or names) per family; empty = automatic.
    pub pools4: &'a [String],
    pub pools6: &'a [String],
    /// A per-request block limit (0 = the configured one).
    pub max_blocks: usize,
    pub labels: &'a dyn SelectorLabels,
}

/// What an auto-assign got: addresses with their block's prefix length.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Assigned {
    pub v4: Vec<IpNet>,
    pub v6: Vec<IpNet>,
}

/// What one family got, and why it fell short.
struct FamilyOutcome {
    ips: Vec<IpNet>,
    messages: Vec<String>,
}

/// What an auto-assignment reads besides the blocks: IPAMConfig, the
/// pools, the reservations and this host's BlockAffinities of each family
/// asked for. Read ahead (before the host lock, all at once: see
/// [`Allocator::read_ahead`]) they keep the lock for the block's reads and
/// writes alone; the affinities may then have changed by the time the lock
/// is held (another ADD of this host claimed a block meanwhile), so they
/// are read again before a block is claimed.
pub struct Inputs {
    config: IpamConfigSpec,
    pools: Vec<IpPool>,
    reserved: Vec<IpNet>,
    /// This host's affinities, IPv4 and IPv6 (`None`: that family is not
    /// asked for).
    affinities: [Option<Vec<BlockAffinity>>; 2],
    /// Read before the host lock was held.
    ahead: bool,
}

impl Inputs {
    /// IPAMConfig as read.
    pub fn config(&self) -> &IpamConfigSpec {
        &self.config
    }
}

/// One family's affinities as an assignment got them.
struct Affinities {
    list: Vec<BlockAffinity>,
    /// Read before the host lock: read again before a block is claimed.
    ahead: bool,
}

/// The allocator for one host.
pub struct Allocator<'a> {
    store: &'a dyn Store,
    host: &'a str,
    /// Interrupted deletes this allocator finished (a block so freed is
    /// claimable again).
    finished: AtomicUsize,
    /// IPAMConfig, read once per allocator (one call).
    config: tokio::sync::OnceCell<IpamConfigSpec>,
    /// Pools are read as of now (after a cached list left an assignment
    /// without a pool).
    latest_pools: std::sync::atomic::AtomicBool,
    /// The copies of the blocks written under the host lock, while it is
    /// held ([`Allocator::use_block_cache`]).
    blocks: std::sync::OnceLock<BlockCache>,
    /// The request's handle as written before the host lock
    /// ([`Allocator::create_handle_ahead`]), until an allocation takes it.
    ahead_handle: std::sync::Mutex<Option<IpamHandle>>,
    /// The intents beside the host lock, while it is held: served in this
    /// call's block writes ([`Allocator::use_intents`]).
    intents: std::sync::OnceLock<Intents>,
    /// Where this call's intent went (its handle's name), until the call
    /// takes it back ([`Allocator::intent_post`]).
    posted_to: std::sync::Mutex<Option<(Intents, String)>>,
    /// This call posted an intent before waiting for the lock.
    posted: std::sync::atomic::AtomicBool,
}

fn ds(what: impl Into<String>) -> impl FnOnce(DatastoreError) -> IpamError {
    let what = what.into();
    move |source| IpamError::Datastore { what, source }
}

fn contention(what: &str) -> IpamError {
    IpamError::Contention(format!(
        "{what}: gave up after {CAS_ATTEMPTS} conflicting concurrent updates"
    ))
}

/// A short pause between attempts that met a soft-deleted object.
async fn pause(attempt: usize) {
    let ms = (attempt as u64 + 1).min(20);
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// Whether an object created at `timestamp` (RFC 3339; none: long ago)
/// was made less than `within` ago.
fn made_within(timestamp: &str, within: Duration) -> bool {
    let Ok(made) = timestamp.parse::<jiff::Timestamp>() else {
        return false;
    };
    let age = jiff::Timestamp::now().duration_since(made);
    age < jiff::SignedDuration::try_from(within).unwrap_or(jiff::SignedDuration::MAX)
}

/// How a block is looked at for an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Candidate {
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
enum Taken {
    Addresses(Vec<IpNet>),
    /// Nothing: the kept copy offered no address (not read again).
    CopyOffersNothing,
}

impl Taken {
    fn addresses(self) -> Vec<IpNet> {
        match self {
            Taken::Addresses(ips) => ips,
            Taken::CopyOffersNothing => Vec::new(),
        }
    }
}

/// Addresses of a block with its prefix length.
fn with_prefixes(ips: Vec<IpAddr>, cidr: &IpNet) -> Vec<IpNet> {
    ips.into_iter().map(|ip| with_prefix(ip, cidr)).collect()
}

/// A new handle `name` for `handle` holding `n` addresses of `cidr`.
fn new_handle(name: &str, handle: &str, cidr: &IpNet, n: usize) -> IpamHandle {
    IpamHandle::new(
        name,
        IpamHandleSpec {
            handle_id: handle.to_string(),
            block: BTreeMap::from([(cidr.to_string(), n)]),
            ..IpamHandleSpec::default()
        },
    )
}

fn with_prefix(ip: IpAddr, cidr: &IpNet) -> IpNet {
    IpNet::new(ip, cidr.prefix_len()).expect("a block's prefix fits its family")
}

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
    pub fn new(store: &'a dyn Store, host: &'a str) -> Allocator<'a> {
        Allocator {
            store,
            host,
            finished: AtomicUsize::new(0),
            config: tokio::sync::OnceCell::new(),
            latest_pools: std::sync::atomic::AtomicBool::new(false),
            blocks: std::sync::OnceLock::new(),
            ahead_handle: std::sync::Mutex::new(None),
            intents: std::sync::OnceLock::new(),
            posted_to: std::sync::Mutex::new(None),
            posted: std::sync::atomic::AtomicBool::new(false),
        }
    }

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
    async fn cached_block(&self, cidr: &IpNet) -> Option<IpamBlock> {
        let copy = self.blocks.get()?.get(&cidr_name(cidr)).await?;
        if copy.spec.deleted {
            return None;
        }
        self.collected(copy).await.ok()
    }

    /// The block a write starts from: the copy kept under the lock where
    /// `copy` allows it (a write's first attempt), `true` with it; else
    /// the block read now.
    async fn block_to_write(
        &self,
        cidr: &IpNet,
        copy: bool,
    ) -> Result<(Option<IpamBlock>, bool), IpamError> {
        if copy && let Some(copy) = self.cached_block(cidr).await {
            return Ok((Some(copy), true));
        }
        Ok((self.get_block(cidr).await?, false))
    }

    /// Keeps the block as the datastore answered its write, or forgets the
    /// copy (`None`: the write failed, or the block is gone).
    async fn keep_block(&self, name: &str, stored: Option<&IpamBlock>) {
        if let Some(cache) = self.blocks.get() {
            match stored {
                Some(b) => cache.put(b).await,
                None => cache.forget(name).await,
            }
        }
    }

    /// The allocator with IPAMConfig as already read.
    pub fn with_config(self, config: IpamConfigSpec) -> Allocator<'a> {
        self.use_config(config);
        self
    }

    /// [`Allocator::with_config`] on a shared allocator (before its first
    /// read of IPAMConfig: a config already read stays).
    pub fn use_config(&self, config: IpamConfigSpec) {
        let _ = self.config.set(config);
    }

    fn affinity_value(&self) -> String {
        format!("host:{}", self.host)
    }

    /// IPAMConfig `default`, or Calico's defaults when absent (read once,
    /// as the datastore's cache holds it: configuration an operator sets,
    /// no write's precondition).
    pub async fn config(&self) -> Result<IpamConfigSpec, IpamError> {
        self.config
            .get_or_try_init(|| async {
                Ok(self
                    .store
                    .get_cached_or_absent::<IpamConfig>("", IpamConfig::NAME)
                    .await
                    .map_err(ds("error getting IPAMConfig"))?
                    .map_or_else(IpamConfigSpec::defaults, |c| c.spec))
            })
            .await
            .cloned()
    }

    /// The `releasedAt` of a release now: `None` (freed at once) without a
    /// cooldown. Sub-second precision, so that a cooldown is never cut
    /// short by the stamp's rounding (Calico's whole seconds read the same).
    async fn release_stamp(&self) -> Result<Option<String>, IpamError> {
        let cooldown = self.config().await?.ip_cooldown();
        Ok((!cooldown.is_zero()).then(|| {
            jiff::Timestamp::try_from(SystemTime::now())
                .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
                .to_string()
        }))
    }

    /// A block as read, its cooled addresses freed (saved with the next
    /// write of the block, as in Calico).
    async fn collected(&self, mut block: IpamBlock) -> Result<IpamBlock, IpamError> {
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

    pub async fn pools(&self) -> Result<Vec<IpPool>, IpamError> {
        if self.latest_pools.load(Ordering::Relaxed) {
            self.store.list_latest::<IpPool>("", &ListFilter::All).await
        } else {
            self.store.list::<IpPool>("", &ListFilter::All).await
        }
        .map_err(ds("error listing IP pools"))
    }

    /// Runs `attempt` again with the pools read as of now when it failed
    /// for want of a pool or an address on a list a cache may have served
    /// (a pool made a moment ago), once.
    async fn with_latest_pools<T, F, Fut>(&self, attempt: F) -> Result<T, IpamError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, IpamError>>,
    {
        match attempt().await {
            Err(IpamError::NoPools(_) | IpamError::Exhausted(_) | IpamError::Invalid(_))
                if !self.latest_pools.swap(true, Ordering::Relaxed) =>
            {
                tracing::debug!("no pool or address on the listed pools: reading them as of now");
                attempt().await
            }
            other => other,
        }
    }

    async fn reservations(&self) -> Result<Vec<IpNet>, IpamError> {
        let list = self
            .store
            .list::<IpReservation>("", &ListFilter::All)
            .await
            .map_err(ds("error listing IP reservations"))?;
        Ok(list
            .iter()
            .flat_map(|r| r.spec.reserved_cidrs.iter())
            .filter_map(|c| {
                c.parse::<IpNet>()
                    .ok()
                    .or_else(|| c.parse::<IpAddr>().ok().map(IpNet::from))
            })
            .collect())
    }

    /// The block of `cidr`, unless absent or soft-deleted.
    async fn get_block(&self, cidr: &IpNet) -> Result<Option<IpamBlock>, IpamError> {
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
    async fn finish_delete<R: Resource>(&self, resource: &R) {
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
    async fn put_block(&self, block: &mut IpamBlock) -> Result<IpamBlock, DatastoreError> {
        block.spec.sequence_number += 1;
        let written = self.store.update(block).await;
        self.keep_block(&block.metadata.name, written.as_ref().ok())
            .await;
        written
    }

    /// The handle named `name`, unless absent or soft-deleted.
    async fn live_handle(&self, name: &str, what: &str) -> Result<Option<IpamHandle>, IpamError> {
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
    async fn increment_handle(
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
    async fn decrement_handle(
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

    /// This host's BlockAffinities of one family (by the labels Calico
    /// looks them up with), live ones only.
    async fn host_affinities(&self, v6: bool) -> Result<Vec<BlockAffinity>, IpamError> {
        let labels = BTreeMap::from([
            (LABEL_HOSTNAME_HASH.to_string(), hostname_hash(self.host)),
            (LABEL_AFFINITY_TYPE.to_string(), "host".to_string()),
            (
                LABEL_IP_VERSION.to_string(),
                if v6 { "6" } else { "4" }.to_string(),
            ),
        ]);
        let mut list = self
            .store
            .list::<BlockAffinity>(
                "",
                &ListFilter::Node {
                    node: self.host.to_string(),
                    labels,
                },
            )
            .await
            .map_err(ds("error listing BlockAffinities"))?;
        list.retain(|a| a.spec.node == self.host && a.spec.deleted != "true");
        Ok(list)
    }

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
    async fn handle_for(&self, handle: &str, cidr: &IpNet, n: usize) -> Result<(), IpamError> {
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

    /// Reads an auto-assignment's inputs before the host lock is held.
    pub async fn read_ahead(&self, req: &AutoAssign<'_>) -> Result<Inputs, IpamError> {
        self.inputs(req, true).await
    }

    async fn inputs(&self, req: &AutoAssign<'_>, ahead: bool) -> Result<Inputs, IpamError> {
        let family = async |v6: bool, num: usize| {
            if num == 0 {
                Ok(None)
            } else {
                self.host_affinities(v6).await.map(Some)
            }
        };
        // Read ahead of the lock, the node's labels too when a pool's node
        // selector will need them, as soon as the pools say so (a failure
        // is left for the assignment to meet, and report, when it asks).
        // Where reads made at once cost one request (etcd), and on the
        // Kubernetes API, whose requests go at once on one connection, the
        // node is read with the pools rather than after them, in case they
        // need it (Calico reads it for every assignment): waiting for the
        // pools put the node's round trip between the reads and the lock.
        let with_pools = self.store.reads_together()
            || self.store.backend() == crate::datastore::Backend::Kubernetes;
        let pools = async {
            if ahead && with_pools {
                let (pools, _) = tokio::join!(self.pools(), req.labels.node_labels());
                return pools;
            }
            let pools = self.pools().await?;
            if ahead && pools_select_nodes(&pools) {
                let _ = req.labels.node_labels().await;
            }
            Ok(pools)
        };
        let (config, pools, reserved, v4, v6) = futures::future::try_join5(
            self.config(),
            pools,
            self.reservations(),
            family(false, req.num4),
            family(true, req.num6),
        )
        .await?;
        Ok(Inputs {
            config,
            pools,
            reserved,
            affinities: [v4, v6],
            ahead,
        })
    }

    async fn auto_assign_once(
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
    async fn undo(&self, handle: &str, ips: &[IpAddr]) {
        if ips.is_empty() {
            return;
        }
        if let Err(e) = self.release_ips_as(ips, None).await {
            tracing::warn!(%handle, "releasing {ips:?} after a failed assignment: {e}");
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn assign_family(
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
        if ips.len() < num && affinities.ahead {
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
                let Some(cidr) = self.claim_new_block(&pools).await? else {
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
                let names = self
                    .store
                    .list_names(IpamBlock::KIND, "")
                    .await
                    .map_err(ds("error listing IPAM blocks"))?;
                let mut candidates: Vec<IpNet> = names
                    .iter()
                    .filter_map(|n| cidr_of_block_name(n))
                    // Every block of the pools, each read fresh below: one
                    // full (or deleted) when listed may have changed since.
                    .filter(|c| in_pools(c) && c.addr().is_ipv6() == v6)
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
                    let got = self
                        .assign_from_block(
                            &cidr,
                            num - ips.len(),
                            req,
                            &reserved,
                            Candidate::Borrowed,
                        )
                        .await?;
                    ips.extend(got.addresses());
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

    /// The blocks of these affinities that are this host's (a pending one,
    /// a claim that stopped half way, is finished or undone first), in
    /// address order.
    async fn affine_blocks(&self, affinities: Vec<BlockAffinity>) -> Result<Vec<IpNet>, IpamError> {
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
    /// gives the handle back and reads again).
    async fn assign_from_block(
        &self,
        cidr: &IpNet,
        n: usize,
        req: &AutoAssign<'_>,
        reserved: &(dyn Fn(IpAddr) -> bool + Sync),
        candidate: Candidate,
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
            let (own, mut group) =
                tokio::join!(self.handle_for(req.handle, cidr, got.len()), gather);
            own?;
            Self::assign_group(&mut blk, cidr, &mut group, reserved);
            crate::fault::kill_point("ipam-handle");
            match self.put_block(&mut blk).await {
                Ok(_) => {
                    self.record_served(group, cidr).await;
                    return Ok(Taken::Addresses(with_prefixes(got, cidr)));
                }
                Err(e) => {
                    self.decrement_handle(req.handle, cidr, Some(got.len()))
                        .await?;
                    match e {
                        DatastoreError::Conflict(_) => continue,
                        DatastoreError::NotFound(_) => return none(),
                        // A write from a copy the datastore refuses for
                        // another reason (a uid it does not know): the
                        // block is read again.
                        _ if from_copy => continue,
                        e => return Err(ds(what)(e)),
                    }
                }
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
    async fn write_with_handle(
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

    /// A pending affinity of this host: confirmed when its block exists
    /// and is this host's, deleted when the block is another's; left
    /// pending (for the claim to finish) when there is no block yet.
    async fn settle_pending(
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

    async fn drop_affinity(&self, mut affinity: BlockAffinity) {
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
    /// `None` when every block exists.
    async fn claim_new_block(&self, pools: &[IpPool]) -> Result<Option<IpNet>, IpamError> {
        // Names only: which blocks exist, not what they hold.
        let existing: HashSet<String> = self
            .store
            .list_names(IpamBlock::KIND, "")
            .await
            .map_err(ds("error listing IPAM blocks"))?
            .into_iter()
            .collect();
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
        Ok(None)
    }

    /// Claims `cidr` for this host in two phases; false when another host
    /// got the block first.
    async fn claim(&self, cidr: &IpNet) -> Result<bool, IpamError> {
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

    async fn assign_ip_once(
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

    /// The handle as it is now (`None`: absent), read ahead of
    /// [`Allocator::release_by_handle`] (before the host lock).
    pub async fn read_handle(&self, handle: &str) -> Result<Option<IpamHandle>, IpamError> {
        let name = handle_name_on(self.store.backend(), handle);
        self.live_handle(&name, &format!("error releasing IPAMHandle({name})"))
            .await
    }

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
    async fn release_in_block(
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

    async fn release_ips_as(&self, ips: &[IpAddr], stamp: Option<&str>) -> Result<(), IpamError> {
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
    async fn block_cidr_of(&self, ip: IpAddr) -> Result<Option<IpNet>, IpamError> {
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
