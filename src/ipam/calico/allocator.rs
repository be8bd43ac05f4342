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
//!
//! Here: the allocator of one host, its requests and its errors. Beside
//! it, one concern a file: `inputs` (IPAMConfig, pools, reservations,
//! affinities, read ahead of the host lock), `blocks` (block reads and
//! writes through the kept copies), `handles` (the IPAMHandles, written
//! ahead or with a block), `auto_assign` (affine blocks, a new block,
//! borrowing), `claim` (a block claimed in two phases), `assign_ip`
//! (explicit addresses, reconciliation), `release`, `inventory` (what
//! STATUS, GC, KubeVirt and the upgrade ask), `group_commit` (the intents
//! of calls waiting for the host lock, served in the holder's block write).

use std::collections::BTreeMap;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use ipnet::IpNet;

use super::IpamError;
use super::block;
use super::block_cache::BlockCache;
use super::intents::Intents;
use super::pools::SelectorLabels;
use crate::datastore::ipam_model::{IpamBlock, IpamConfigSpec, IpamHandle};
use crate::datastore::{DatastoreError, Store};

mod assign_ip;
mod auto_assign;
mod blocks;
mod claim;
mod group_commit;
mod handles;
mod inputs;
mod inventory;
mod release;

use auto_assign::with_prefixes;
use handles::new_handle;
pub use inputs::Inputs;
pub use release::AddressRelease;

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
    /// Blocks as this call listed them (on the Kubernetes API, whose lists
    /// carry whole objects), by name: the first write of each starts from
    /// its listed object instead of reading it again
    /// ([`Allocator::block_to_write`]).
    listed_blocks: std::sync::Mutex<std::collections::HashMap<String, IpamBlock>>,
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
            listed_blocks: std::sync::Mutex::default(),
        }
    }
}
