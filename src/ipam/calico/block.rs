//! One IPAM block's bookkeeping, in memory: ordinals handed out from the
//! head of the `unallocated` FIFO and returned to its tail, per-ordinal
//! attributes (shared entries, compacted when unused), and the sequence
//! numbers Calico records. The allocator reads a block, applies one of
//! these operations and writes it back compare-and-swap.
//!
//! IP cooldown (Calico's IPAMConfig `ipCooldownSeconds`): with a cooldown,
//! a released ordinal is not returned to `unallocated` but pointed at an
//! attribute holding only `releasedAt` (no handle, so no handle's lookup
//! finds it; allocated, so nothing hands it out and the block is not
//! empty); [`collect_cooled`] frees those whose cooldown has passed, as
//! every read of a block does.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use ipnet::IpNet;

use crate::datastore::ipam_model::{AllocationAttribute, IpamBlockSpec};

/// The number of addresses in a block of this prefix (blocks are at most
/// 2^16 addresses in practice; larger ones are refused by pool checks).
pub fn block_len(cidr: &IpNet) -> usize {
    let host_bits = u32::from(cidr.max_prefix_len() - cidr.prefix_len());
    1usize.checked_shl(host_bits).unwrap_or(usize::MAX)
}

/// A fresh block: every ordinal free, in order.
pub fn new_block(
    cidr: &IpNet,
    affinity: Option<String>,
    claim_time: Option<String>,
) -> IpamBlockSpec {
    let n = block_len(cidr);
    IpamBlockSpec {
        cidr: cidr.to_string(),
        affinity,
        affinity_claim_time: claim_time,
        allocations: vec![None; n],
        unallocated: (0..n).collect(),
        // As Calico starts a block's: the time in nanoseconds, so that a
        // block deleted and made again never hands an address the
        // sequence number it had before (a release naming the old
        // allocation's number then frees nothing).
        sequence_number: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        ..IpamBlockSpec::default()
    }
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// The ordinal of `ip` in the block, if it is inside.
pub fn ordinal_of(cidr: &IpNet, ip: IpAddr) -> Option<usize> {
    if !cidr.contains(&ip) {
        return None;
    }
    usize::try_from(to_u128(ip) - to_u128(cidr.network())).ok()
}

/// The address at `ordinal`.
pub fn address_at(cidr: &IpNet, ordinal: usize) -> IpAddr {
    let n = to_u128(cidr.network()) + ordinal as u128;
    match cidr {
        IpNet::V4(_) => IpAddr::V4((n as u32).into()),
        IpNet::V6(_) => IpAddr::V6(n.into()),
    }
}

/// The block's CIDR, parsed.
pub fn cidr_of(block: &IpamBlockSpec) -> Option<IpNet> {
    block.cidr.parse::<IpNet>().ok().map(|n| n.trunc())
}

/// Free ordinals that are not reserved.
pub fn free_count(
    block: &IpamBlockSpec,
    cidr: &IpNet,
    reserved: &(dyn Fn(IpAddr) -> bool + Sync),
) -> usize {
    block
        .unallocated
        .iter()
        .filter(|&&o| !reserved(address_at(cidr, o)))
        .count()
}

/// Whether no address of the block is allocated.
pub fn is_empty(block: &IpamBlockSpec) -> bool {
    block.allocations.iter().all(Option::is_none)
}

fn attribute_index(
    block: &mut IpamBlockSpec,
    handle: &str,
    attrs: &BTreeMap<String, String>,
) -> usize {
    if let Some(i) = block
        .attributes
        .iter()
        .position(|a| a.handle_id.as_deref() == Some(handle) && &a.secondary == attrs)
    {
        return i;
    }
    block.attributes.push(AllocationAttribute {
        handle_id: Some(handle.to_string()),
        secondary: attrs.clone(),
        ..AllocationAttribute::default()
    });
    block.attributes.len() - 1
}

fn record(block: &mut IpamBlockSpec, ordinal: usize, attr: usize) {
    block.allocations[ordinal] = Some(attr);
    block
        .sequence_number_for_allocation
        .insert(ordinal.to_string(), block.sequence_number);
}

/// Takes up to `n` free, unreserved ordinals from the head of the FIFO
/// for `handle`; returns their addresses.
pub fn assign(
    block: &mut IpamBlockSpec,
    cidr: &IpNet,
    n: usize,
    handle: &str,
    attrs: &BTreeMap<String, String>,
    reserved: &(dyn Fn(IpAddr) -> bool + Sync),
) -> Vec<IpAddr> {
    let mut taken = Vec::new();
    let mut keep = Vec::with_capacity(block.unallocated.len());
    for &o in &block.unallocated {
        if taken.len() < n && o < block.allocations.len() && !reserved(address_at(cidr, o)) {
            taken.push(o);
        } else {
            keep.push(o);
        }
    }
    if taken.is_empty() {
        return Vec::new();
    }
    block.unallocated = keep;
    let attr = attribute_index(block, handle, attrs);
    for &o in &taken {
        record(block, o, attr);
    }
    taken.into_iter().map(|o| address_at(cidr, o)).collect()
}

/// Why one address cannot be assigned.
#[derive(Debug, PartialEq, Eq)]
pub enum AssignOneError {
    /// Allocated already, to this handle (if known).
    InUse(Option<String>),
    OutOfBlock,
}

/// Assigns exactly `ip` to `handle`.
pub fn assign_one(
    block: &mut IpamBlockSpec,
    cidr: &IpNet,
    ip: IpAddr,
    handle: &str,
    attrs: &BTreeMap<String, String>,
) -> Result<(), AssignOneError> {
    let o = ordinal_of(cidr, ip)
        .filter(|&o| o < block.allocations.len())
        .ok_or(AssignOneError::OutOfBlock)?;
    if let Some(attr) = block.allocations[o] {
        let holder = block.attributes.get(attr).and_then(|a| a.handle_id.clone());
        return Err(AssignOneError::InUse(holder));
    }
    block.unallocated.retain(|&u| u != o);
    let attr = attribute_index(block, handle, attrs);
    record(block, o, attr);
    Ok(())
}

/// Frees every ordinal held by `handle` (cooling them down when
/// `released_at` is given); returns how many.
pub fn release_handle(block: &mut IpamBlockSpec, handle: &str, released_at: Option<&str>) -> usize {
    let held: HashSet<usize> = block
        .attributes
        .iter()
        .enumerate()
        .filter(|(_, a)| a.handle_id.as_deref() == Some(handle))
        .map(|(i, _)| i)
        .collect();
    let ordinals: Vec<usize> = block
        .allocations
        .iter()
        .enumerate()
        .filter(|(_, a)| a.is_some_and(|i| held.contains(&i)))
        .map(|(o, _)| o)
        .collect();
    free(block, &ordinals, released_at);
    ordinals.len()
}

/// Frees these addresses (those allocated; a cooling one is released
/// already and left as it is), cooling them down when `released_at` is
/// given; returns, per handle, how many were freed (`""` for allocations
/// without a handle).
pub fn release_ips(
    block: &mut IpamBlockSpec,
    cidr: &IpNet,
    ips: &[IpAddr],
    released_at: Option<&str>,
) -> BTreeMap<String, usize> {
    let mut freed = BTreeMap::new();
    let mut ordinals = Vec::new();
    for &ip in ips {
        let Some(o) = ordinal_of(cidr, ip).filter(|&o| o < block.allocations.len()) else {
            continue;
        };
        if let Some(attr) = block.allocations[o]
            && !is_cooling(block, o)
        {
            let handle = block
                .attributes
                .get(attr)
                .and_then(|a| a.handle_id.clone())
                .unwrap_or_default();
            *freed.entry(handle).or_insert(0) += 1;
            ordinals.push(o);
        }
    }
    free(block, &ordinals, released_at);
    freed
}

/// Whether `ordinal` is a released address cooling down.
pub fn is_cooling(block: &IpamBlockSpec, ordinal: usize) -> bool {
    block
        .allocations
        .get(ordinal)
        .copied()
        .flatten()
        .and_then(|a| block.attributes.get(a))
        .is_some_and(|a| a.released_at.is_some())
}

/// How many addresses of the block are cooling down.
pub fn cooling_count(block: &IpamBlockSpec) -> usize {
    (0..block.allocations.len())
        .filter(|&o| is_cooling(block, o))
        .count()
}

fn free(block: &mut IpamBlockSpec, ordinals: &[usize], released_at: Option<&str>) {
    if ordinals.is_empty() {
        return;
    }
    match released_at {
        Some(at) => {
            // One entry per release, as Calico adds it.
            block.attributes.push(AllocationAttribute {
                released_at: Some(at.to_string()),
                ..AllocationAttribute::default()
            });
            let cooling = block.attributes.len() - 1;
            for &o in ordinals {
                block.allocations[o] = Some(cooling);
            }
        }
        None => {
            for &o in ordinals {
                block.allocations[o] = None;
                block.sequence_number_for_allocation.remove(&o.to_string());
                block.unallocated.push(o);
            }
        }
    }
    compact_attributes(block);
}

/// Frees the cooling addresses released `cooldown` or longer before
/// `now` (every one when the cooldown is 0; an unreadable time counts as
/// long ago), as Calico does on every read of a block; whether any was.
pub fn collect_cooled(block: &mut IpamBlockSpec, cooldown: Duration, now: SystemTime) -> bool {
    let cutoff = jiff::Timestamp::try_from(now.checked_sub(cooldown).unwrap_or(now)).ok();
    let cooled = |a: &AllocationAttribute| {
        a.released_at
            .as_deref()
            .is_some_and(|at| match (at.parse::<jiff::Timestamp>(), cutoff) {
                (Ok(at), Some(cutoff)) => at <= cutoff,
                _ => true,
            })
    };
    let done: Vec<usize> = block
        .allocations
        .iter()
        .enumerate()
        .filter(|(_, a)| a.and_then(|i| block.attributes.get(i)).is_some_and(cooled))
        .map(|(o, _)| o)
        .collect();
    free(block, &done, None);
    !done.is_empty()
}

/// Drops attribute entries no allocation points at, re-indexing the rest.
fn compact_attributes(block: &mut IpamBlockSpec) {
    let used: HashSet<usize> = block.allocations.iter().flatten().copied().collect();
    let mut new_index = vec![None; block.attributes.len()];
    let mut kept = Vec::with_capacity(used.len());
    for (i, attr) in std::mem::take(&mut block.attributes)
        .into_iter()
        .enumerate()
    {
        if used.contains(&i) {
            new_index[i] = Some(kept.len());
            kept.push(attr);
        }
    }
    block.attributes = kept;
    for a in block.allocations.iter_mut().flatten() {
        *a = new_index[*a].expect("a used attribute is kept");
    }
}

/// Which owner of an address: Calico's ActiveOwnerAttrs (`secondary`) or
/// AlternateOwnerAttrs (`alternate`, a KubeVirt migration target's pod).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerSlot {
    Active,
    Alternate,
}

/// The attribute entry of `ip`, if it is allocated (and not cooling).
pub fn attribute_of<'b>(
    block: &'b IpamBlockSpec,
    cidr: &IpNet,
    ip: IpAddr,
) -> Option<&'b AllocationAttribute> {
    let o = ordinal_of(cidr, ip)?;
    if is_cooling(block, o) {
        return None;
    }
    block
        .attributes
        .get(block.allocations.get(o).copied().flatten()?)
}

/// Sets one owner slot of `ip`, which `handle` must hold, to `attrs` (empty:
/// cleared). The address gets an attribute entry of its own (entries are
/// shared by a handle's addresses in a block) and the unused ones go.
pub fn set_owner(
    block: &mut IpamBlockSpec,
    cidr: &IpNet,
    ip: IpAddr,
    handle: &str,
    slot: OwnerSlot,
    attrs: BTreeMap<String, String>,
) -> Result<(), String> {
    let current = attribute_of(block, cidr, ip)
        .filter(|a| a.handle_id.as_deref() == Some(handle))
        .cloned()
        .ok_or_else(|| format!("{ip} is not allocated to handle {handle}"))?;
    let mut updated = current;
    match slot {
        OwnerSlot::Active => updated.secondary = attrs,
        OwnerSlot::Alternate => updated.alternate = attrs,
    }
    let o = ordinal_of(cidr, ip).expect("allocated, so in the block");
    block.attributes.push(updated);
    block.allocations[o] = Some(block.attributes.len() - 1);
    compact_attributes(block);
    Ok(())
}

/// The addresses `handle` holds in the block.
pub fn addresses_of(block: &IpamBlockSpec, cidr: &IpNet, handle: &str) -> Vec<IpAddr> {
    block
        .allocations
        .iter()
        .enumerate()
        .filter_map(|(o, a)| {
            let attr = block.attributes.get((*a)?)?;
            (attr.handle_id.as_deref() == Some(handle)).then(|| address_at(cidr, o))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(pod: &str) -> BTreeMap<String, String> {
        BTreeMap::from([("pod".to_string(), pod.to_string())])
    }

    const NONE: &(dyn Fn(IpAddr) -> bool + Sync) = &|_| false;

    #[test]
    fn a_block_made_again_numbers_its_allocations_anew() {
        let cidr: IpNet = "10.0.0.0/30".parse().unwrap();
        let first = new_block(&cidr, None, None);
        // Nanoseconds since the epoch, as Calico starts a block's.
        assert!(first.sequence_number > 1_700_000_000_000_000_000);
        let mut again = new_block(&cidr, None, None);
        assert!(again.sequence_number > first.sequence_number);
        let got = assign(&mut again, &cidr, 1, "h", &attrs("p"), NONE);
        assert_eq!(got.len(), 1);
        assert_eq!(
            again.sequence_number_for_allocation["0"],
            again.sequence_number
        );
    }

    #[test]
    fn fifo_assign_and_release() {
        let cidr: IpNet = "10.0.0.0/30".parse().unwrap();
        let mut b = new_block(&cidr, Some("host:a".into()), None);
        assert_eq!(b.unallocated, [0, 1, 2, 3]);
        let got = assign(&mut b, &cidr, 2, "h1", &attrs("p1"), NONE);
        assert_eq!(
            got,
            [
                "10.0.0.0".parse::<IpAddr>().unwrap(),
                "10.0.0.1".parse().unwrap()
            ]
        );
        assert_eq!(b.allocations, [Some(0), Some(0), None, None]);
        assert_eq!(b.attributes.len(), 1);
        let got = assign(&mut b, &cidr, 1, "h2", &attrs("p2"), NONE);
        assert_eq!(got, ["10.0.0.2".parse::<IpAddr>().unwrap()]);
        assert_eq!(b.allocations[2], Some(1));
        // Releasing h1 returns its ordinals to the tail and compacts.
        assert_eq!(release_handle(&mut b, "h1", None), 2);
        assert_eq!(b.unallocated, [3, 0, 1]);
        assert_eq!(b.allocations, [None, None, Some(0), None]);
        assert_eq!(b.attributes[0].handle_id.as_deref(), Some("h2"));
        assert_eq!(b.sequence_number_for_allocation.len(), 1);
        // The next allocation takes the head: ordinal 3, not a just-freed one.
        let got = assign(&mut b, &cidr, 1, "h3", &attrs("p3"), NONE);
        assert_eq!(got, ["10.0.0.3".parse::<IpAddr>().unwrap()]);
        assert_eq!(
            addresses_of(&b, &cidr, "h2"),
            ["10.0.0.2".parse::<IpAddr>().unwrap()]
        );
        assert!(!is_empty(&b));
    }

    #[test]
    fn reserved_addresses_are_skipped() {
        let cidr: IpNet = "10.0.0.0/30".parse().unwrap();
        let mut b = new_block(&cidr, None, None);
        let reserved = |ip: IpAddr| ip == "10.0.0.0".parse::<IpAddr>().unwrap();
        assert_eq!(free_count(&b, &cidr, &reserved), 3);
        let got = assign(&mut b, &cidr, 1, "h", &attrs("p"), &reserved);
        assert_eq!(got, ["10.0.0.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(b.unallocated, [0, 2, 3]);
    }

    #[test]
    fn explicit_addresses() {
        let cidr: IpNet = "fd00::/126".parse().unwrap();
        let mut b = new_block(&cidr, None, None);
        let ip: IpAddr = "fd00::2".parse().unwrap();
        assign_one(&mut b, &cidr, ip, "h", &attrs("p")).unwrap();
        assert_eq!(b.unallocated, [0, 1, 3]);
        assert_eq!(
            assign_one(&mut b, &cidr, ip, "x", &attrs("q")),
            Err(AssignOneError::InUse(Some("h".into())))
        );
        assert_eq!(
            assign_one(&mut b, &cidr, "fd01::1".parse().unwrap(), "x", &attrs("q")),
            Err(AssignOneError::OutOfBlock)
        );
        let freed = release_ips(&mut b, &cidr, &[ip, "fd00::1".parse().unwrap()], None);
        assert_eq!(freed, BTreeMap::from([("h".to_string(), 1)]));
        assert!(is_empty(&b));
        assert_eq!(block_len(&"10.0.0.0/26".parse().unwrap()), 64);
        assert_eq!(block_len(&"fd00::/122".parse().unwrap()), 64);
    }

    #[test]
    fn released_addresses_cool_down() {
        let cidr: IpNet = "10.0.0.0/30".parse().unwrap();
        let mut b = new_block(&cidr, Some("host:a".into()), None);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let stamp = jiff::Timestamp::try_from(t0).unwrap().to_string();
        assign(&mut b, &cidr, 2, "h1", &attrs("p1"), NONE);
        assign(&mut b, &cidr, 1, "h2", &attrs("p2"), NONE);
        assert_eq!(release_handle(&mut b, "h1", Some(&stamp)), 2);
        // Cooling: allocated to no handle, not free, the block not empty.
        assert_eq!(b.allocations, [Some(1), Some(1), Some(0), None]);
        assert_eq!(b.attributes[1].released_at.as_deref(), Some(stamp.as_str()));
        assert_eq!(b.attributes[1].handle_id, None);
        assert_eq!(b.unallocated, [3]);
        assert_eq!(cooling_count(&b), 2);
        assert!(addresses_of(&b, &cidr, "h1").is_empty());
        // Nothing hands them out, by FIFO or by address.
        assert_eq!(assign(&mut b, &cidr, 4, "h3", &attrs("p3"), NONE).len(), 1);
        assert_eq!(
            assign_one(&mut b, &cidr, address_at(&cidr, 0), "h4", &attrs("p4")),
            Err(AssignOneError::InUse(None))
        );
        // Released again: no change (the cooldown is not restarted).
        let later = jiff::Timestamp::try_from(t0 + Duration::from_secs(5))
            .unwrap()
            .to_string();
        assert!(release_ips(&mut b, &cidr, &[address_at(&cidr, 0)], Some(&later)).is_empty());
        // Before the cooldown has passed: still cooling.
        let cooldown = Duration::from_secs(30);
        assert!(!collect_cooled(
            &mut b,
            cooldown,
            t0 + Duration::from_secs(29)
        ));
        assert_eq!(cooling_count(&b), 2);
        // After: free, at the FIFO's tail, the attribute and sequence numbers gone.
        assert!(collect_cooled(
            &mut b,
            cooldown,
            t0 + Duration::from_secs(30)
        ));
        assert_eq!(b.unallocated, [0, 1]);
        assert_eq!(b.allocations, [None, None, Some(0), Some(1)]);
        assert_eq!(b.attributes.len(), 2);
        assert!(b.attributes.iter().all(|a| a.released_at.is_none()));
        assert!(!b.sequence_number_for_allocation.contains_key("0"));
        // A cooldown of 0 frees at once; Calico's whole-second stamps read too.
        release_handle(&mut b, "h2", Some("2027-01-15T08:00:00Z"));
        assert!(collect_cooled(&mut b, Duration::ZERO, t0));
        assert_eq!(b.unallocated, [0, 1, 2]);
    }
}
