//! A lost node's IPAM released as Calico's kube-controllers releases it
//! once the node is deleted (its node controller's IPAM garbage
//! collection): the addresses whose allocation names the node (and the
//! handles of the pods it held) released by handle, then its block
//! affinities: a block left empty deleted, one still holding other nodes'
//! addresses kept with no affinity (so that any node may claim it once it
//! empties). Every write compare-and-swap on the revision read. The Node
//! object itself is deleted by the caller first.

use std::collections::BTreeSet;

use calico_cni::datastore::ipam_model::{BlockAffinity, IpamBlock, cidr_name};
use calico_cni::datastore::{DatastoreError, ListFilter, Precondition, Resource, Store};
use calico_cni::ipam::calico::allocator::Allocator;
use calico_cni::ipam::calico::block;
use ipnet::IpNet;

use super::testbed::Failure;

/// What [`release_node`] released.
#[derive(Debug, Default)]
pub struct Released {
    pub addresses: usize,
    pub handles: usize,
    pub blocks_deleted: usize,
    pub blocks_kept: usize,
    pub affinities: usize,
}

/// Releases `node`'s IPAM; `pods` are the handles of the pods it held (as
/// kube-controllers finds them: pods that no longer exist).
pub async fn release_node(
    store: &dyn Store,
    node: &str,
    pods: &[String],
) -> Result<Released, Failure> {
    let mut released = Released::default();
    // The handles of allocations naming the node, and the pods'.
    let mut handles: BTreeSet<String> = pods.iter().cloned().collect();
    for b in store.list::<IpamBlock>("", &ListFilter::All).await? {
        for a in &b.spec.attributes {
            if a.secondary.get("node").map(String::as_str) == Some(node)
                && let Some(h) = &a.handle_id
            {
                handles.insert(h.clone());
            }
        }
    }
    // (The allocator as any node's: it writes no affinity of its own.)
    let allocator = Allocator::new(store, node);
    for h in &handles {
        if let Some(n) = allocator.release_by_handle(h).await? {
            released.addresses += n;
            released.handles += 1;
        }
    }
    let affinity = format!("host:{node}");
    let affinities: Vec<BlockAffinity> = store
        .list::<BlockAffinity>("", &ListFilter::All)
        .await?
        .into_iter()
        .filter(|a| a.spec.node == node)
        .collect();
    for a in affinities {
        if let Ok(cidr) = a.spec.cidr.parse::<IpNet>() {
            match release_block(store, &cidr, &affinity).await? {
                Some(true) => released.blocks_deleted += 1,
                Some(false) => released.blocks_kept += 1,
                None => {}
            }
        }
        match store
            .delete::<BlockAffinity>("", &a.metadata.name, &Precondition::exactly(a.metadata()))
            .await
        {
            Ok(()) | Err(DatastoreError::NotFound(_)) => released.affinities += 1,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(released)
}

/// The node's block of `cidr`: deleted if empty (`Some(true)`), else its
/// affinity taken off (`Some(false)`); `None`: not the node's (any more).
async fn release_block(
    store: &dyn Store,
    cidr: &IpNet,
    affinity: &str,
) -> Result<Option<bool>, Failure> {
    let name = cidr_name(cidr);
    for _ in 0..20 {
        let Some(mut b) = store.get::<IpamBlock>("", &name).await? else {
            return Ok(None);
        };
        if b.spec.affinity.as_deref() != Some(affinity) {
            return Ok(None);
        }
        let written = if block::is_empty(&b.spec) {
            store
                .delete::<IpamBlock>("", &name, &Precondition::exactly(b.metadata()))
                .await
                .map(|()| true)
        } else {
            b.spec.affinity = None;
            b.spec.sequence_number += 1;
            store.update(&mut b).await.map(|_| false)
        };
        match written {
            Ok(deleted) => return Ok(Some(deleted)),
            Err(DatastoreError::Conflict(_)) => continue,
            Err(DatastoreError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
    Err(format!("releasing block {cidr}: kept conflicting").into())
}
