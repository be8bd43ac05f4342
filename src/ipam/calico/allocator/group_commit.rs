//! The allocator's side of [`super::super::intents`]: a waiting call posts
//! its intent, the lock holder serves the intents waiting in its block
//! write, and a served call takes its address from the block.

use std::net::IpAddr;
use std::sync::atomic::Ordering;

use ipnet::IpNet;
use tokio::time::Instant;

use super::super::intents::{Intent, Intents, State, expiry_in};
use super::super::lock::Post;
use super::{Allocator, Assigned, AutoAssign, IpamError, new_handle, with_prefixes};
use crate::datastore::ipam_model::{IpamBlock, IpamHandle, handle_name_on};
use crate::datastore::{DatastoreError, Write};

/// The most waiting calls one block write serves.
const GROUP_MAX: usize = 32;

impl<'a> Allocator<'a> {
    /// What this call posts if it has to wait for the host lock: its
    /// intent (one address, of a store whose blocks are kept; its handle
    /// written ahead of the lock, or, where the handle and the block are
    /// written in one transaction, by the holder).
    pub fn intent_post(
        &self,
        req: &AutoAssign<'_>,
        lock_file: &std::path::Path,
        deadline: Instant,
    ) -> Option<Post> {
        if req.num4 + req.num6 != 1 {
            return None;
        }
        let handle = self
            .ahead_handle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let datastore = self.store.identity()?;
        let v6 = req.num6 == 1;
        let intent = Intent {
            datastore: datastore.clone(),
            handle_id: req.handle.to_string(),
            handle_name: handle_name_on(self.store.backend(), req.handle),
            handle,
            attrs: req.attrs.clone(),
            pools: if v6 { req.pools6 } else { req.pools4 }.to_vec(),
            v6,
            expires_ms: expiry_in(deadline.saturating_duration_since(Instant::now())),
            state: State::Posted,
        };
        // Written ahead (naming one block), or to be written by the holder.
        match self.store.writes_together() {
            true => intent.handle.is_none().then_some(())?,
            false => intent.block().map(|_| ())?,
        }
        let intents = Intents::new(lock_file, datastore);
        let name = intent.handle_name.clone();
        *self.posted_slot() = Some((intents.clone(), name));
        Some(Box::new(move || match intents.write_now(&intent) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!("posting the allocation's intent: {e}");
                false
            }
        }))
    }

    /// Serves intents while the host lock is held (`None`: not held), and
    /// whether this call posted one before it waited.
    pub fn use_intents(&self, intents: Option<Intents>, posted: bool) {
        if let Some(intents) = intents {
            let _ = self.intents.set(intents);
        }
        self.posted.store(posted, Ordering::Relaxed);
        if !posted {
            self.posted_slot().take();
        }
    }

    /// Takes this call's intent back (under the lock, before anything
    /// else) and, if a holder served it, its address: found in the block
    /// its handle names. Unserved, the call goes on from its handle as the
    /// intent records it (or as read again, if a holder may have changed
    /// it unrecorded).
    pub async fn served(&self, req: &AutoAssign<'_>) -> Result<Option<Assigned>, IpamError> {
        // (Left in place until the intent is taken: a call cancelled
        // meanwhile withdraws it.)
        let Some((intents, name)) = self.posted_slot().clone() else {
            return Ok(None);
        };
        let taken = intents.take(&name).await;
        self.posted_slot().take();
        let Some(intent) = taken else {
            return Ok(None);
        };
        let what = format!("error reading IPAMHandle({name})");
        match (intent.state, intent.block()) {
            (State::Served, Some(cidr)) => {
                let (read, _) = self.block_to_write(&cidr, true).await?;
                let mine = read
                    .map(|b| super::block::addresses_of(&b.spec, &cidr, req.handle))
                    .unwrap_or_default();
                if !mine.is_empty() {
                    self.take_ahead_handle();
                    tracing::debug!(%cidr, ?mine, "served by the lock's holder");
                    return Ok(Some(assigned(mine, &cidr)));
                }
                // Not there (a copy behind the datastore, or dropped):
                // the handle as it is now.
                self.set_ahead_handle(self.live_handle(&name, &what).await?);
            }
            (State::Posted, _) => self.set_ahead_handle(intent.handle),
            _ => self.set_ahead_handle(self.live_handle(&name, &what).await?),
        }
        Ok(None)
    }

    /// Where this call's intent went, until it takes it back.
    fn posted_slot(&self) -> std::sync::MutexGuard<'_, Option<(Intents, String)>> {
        self.posted_to.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_ahead_handle(&self, handle: Option<IpamHandle>) {
        *self.ahead_handle.lock().unwrap_or_else(|p| p.into_inner()) = handle;
    }

    /// A call that ends: its intent removed if it did not take it back (it
    /// gave up before it held the lock); true if it posted one (a holder
    /// may have served it, so the handle is kept for the DEL that follows
    /// a failed ADD).
    pub(super) async fn withdraw_intent(&self) -> bool {
        let Some((intents, name)) = self.posted_slot().take() else {
            return self.posted.load(Ordering::Relaxed);
        };
        intents.take(&name).await;
        true
    }

    /// Removes the intents of these handles (a DEL's, under the lock: the
    /// ADD that posted one is gone).
    pub async fn drop_intents(&self, handles: &[String]) {
        let Some(intents) = self.intents.get() else {
            return;
        };
        for handle in handles {
            let name = handle_name_on(self.store.backend(), handle);
            if let Some(i) = intents.take(&name).await {
                tracing::info!(handle = %i.handle_id, state = ?i.state, "removed an intent left by an ADD");
            }
        }
    }

    /// An address of this call's handle already in `blk` (as read, or as
    /// copied): a holder served its intent though the call did not hear of
    /// it (it stopped, or failed to record so, or the lock was not held).
    /// Only for a call that posted one: its handle is new, so an address of
    /// it can only be a holder's doing.
    pub(super) fn served_unrecorded(
        &self,
        blk: &IpamBlock,
        cidr: &IpNet,
        handle: &str,
    ) -> Vec<IpAddr> {
        if !self.posted.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let mine = super::block::addresses_of(&blk.spec, cidr, handle);
        if !mine.is_empty() {
            self.take_ahead_handle();
            tracing::info!(%cidr, ?mine, "served by a lock holder, unrecorded");
        }
        mine
    }

    /// The waiting intents this write of `blk` can serve besides its own
    /// request's: of its family and pools, not already in the block, as
    /// many as it has free addresses (their handles made to name the block
    /// first where they name another, each recorded as written).
    pub(super) async fn gather(
        &self,
        blk: &IpamBlock,
        cidr: &IpNet,
        req: &AutoAssign<'_>,
        reserved: &(dyn Fn(IpAddr) -> bool + Sync),
    ) -> Vec<Intent> {
        let Some(intents) = self.intents.get() else {
            return Vec::new();
        };
        let room = super::block::free_count(&blk.spec, cidr, reserved).min(GROUP_MAX);
        if room == 0 {
            return Vec::new();
        }
        let v6 = cidr.addr().is_ipv6();
        let pools = if v6 { req.pools6 } else { req.pools4 };
        let together = self.store.writes_together();
        let mut chosen: Vec<Intent> = intents
            .waiting()
            .await
            .into_iter()
            .filter(|i| {
                i.v6 == v6
                    && i.pools == pools
                    && i.handle_id != req.handle
                    && match together {
                        true => i.handle.is_none(),
                        false => i.block().is_some(),
                    }
                    && super::block::addresses_of(&blk.spec, cidr, &i.handle_id).is_empty()
            })
            .take(room)
            .collect();
        if together {
            // Their handles are created in the block's transaction.
            return chosen;
        }
        let (mut renamed, same): (Vec<Intent>, Vec<Intent>) =
            chosen.drain(..).partition(|i| i.block() != Some(*cidr));
        if renamed.is_empty() {
            return same;
        }
        // Recorded as being written first: a holder stopped half way
        // leaves the waiter reading its handle again.
        for i in &mut renamed {
            i.state = State::Renaming;
        }
        intents.write(renamed.clone()).await;
        let writes = renamed.into_iter().map(|mut i| async move {
            let mut h = i.handle.clone()?;
            h.spec.block = std::collections::BTreeMap::from([(cidr.to_string(), 1)]);
            match self.store.update(&mut h).await {
                Ok(stored) => {
                    i.handle = Some(stored);
                    i.state = State::Posted;
                    Some(i)
                }
                // Changed by its own call (gone on without the lock) or
                // gone: left Renaming, the waiter reads it again.
                Err(e) => {
                    tracing::debug!(handle = %i.handle_id, "making a waiting handle name {cidr}: {e}");
                    None
                }
            }
        });
        let renamed: Vec<Intent> = futures::future::join_all(writes)
            .await
            .into_iter()
            .flatten()
            .collect();
        intents.write(renamed.clone()).await;
        let mut all = same;
        all.extend(renamed);
        all
    }

    /// Assigns the group's addresses in `blk` (each intent's one), keeping
    /// those that got one.
    pub(super) fn assign_group(
        blk: &mut IpamBlock,
        cidr: &IpNet,
        group: &mut Vec<Intent>,
        reserved: &(dyn Fn(IpAddr) -> bool + Sync),
    ) {
        group.retain(|i| {
            !super::block::assign(&mut blk.spec, cidr, 1, &i.handle_id, &i.attrs, reserved)
                .is_empty()
        });
    }

    /// The group's handles, where they are written with the block (one
    /// transaction): each created naming `cidr` once.
    pub(super) fn group_handles(
        group: &[Intent],
        cidr: &IpNet,
    ) -> Result<Vec<Write>, DatastoreError> {
        group
            .iter()
            .map(|i| Write::create(&mut new_handle(&i.handle_name, &i.handle_id, cidr, 1)))
            .collect()
    }

    /// Records the group as served (its block write succeeded): each
    /// intent's handle as written, naming `cidr`.
    pub(super) async fn record_served(&self, group: Vec<Intent>, cidr: &IpNet) {
        let Some(intents) = self.intents.get() else {
            return;
        };
        if group.is_empty() {
            return;
        }
        tracing::debug!(served = group.len(), "served waiting calls");
        let served = group
            .into_iter()
            .map(|mut i| {
                if i.handle.is_none() {
                    i.handle = Some(new_handle(&i.handle_name, &i.handle_id, cidr, 1));
                }
                i.state = State::Served;
                i
            })
            .collect();
        intents.write(served).await;
    }
}

fn assigned(ips: Vec<IpAddr>, cidr: &IpNet) -> Assigned {
    let ips = with_prefixes(ips, cidr);
    match cidr {
        IpNet::V4(_) => Assigned {
            v4: ips,
            v6: Vec::new(),
        },
        IpNet::V6(_) => Assigned {
            v4: Vec::new(),
            v6: ips,
        },
    }
}
