//! Calico's allocator through the library, on the embedded store (one
//! SQLite file per test, several connections standing for several
//! processes): block claiming and affinity, borrowing, strictAffinity,
//! the per-host block limit, reservations, explicit addresses, releases,
//! dual-stack all-or-nothing, and a concurrent run with the invariants
//! checked at the end.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use calico_cni::datastore::ipam_model::{
    BlockAffinity, IpPool, IpPoolSpec, IpReservation, IpReservationSpec, IpamBlock, IpamConfig,
    IpamConfigSpec, IpamHandle, hostname_hash,
};
use calico_cni::datastore::local::LocalStore;
use calico_cni::datastore::{ListFilter, Store};
use calico_cni::ipam::calico::IpamError;
use calico_cni::ipam::calico::allocator::{Allocator, AutoAssign};
use calico_cni::ipam::calico::pools::SelectorLabels;
use ipnet::IpNet;

struct NoLabels;

#[async_trait::async_trait]
impl SelectorLabels for NoLabels {
    async fn node_labels(&self) -> Result<BTreeMap<String, String>, IpamError> {
        Ok(BTreeMap::new())
    }
    async fn namespace_labels(&self) -> Result<BTreeMap<String, String>, IpamError> {
        Ok(BTreeMap::new())
    }
}

fn run<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn open(path: &Path) -> LocalStore {
    LocalStore::open(path, Duration::from_secs(30)).unwrap()
}

fn pool(store: &dyn Store, name: &str, cidr: &str, block_size: u8) {
    let mut p = IpPool::new(
        name,
        IpPoolSpec {
            cidr: cidr.into(),
            block_size,
            ..Default::default()
        },
    );
    run(store.create(&mut p)).unwrap();
}

fn attrs(pod: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("pod".to_string(), pod.to_string())])
}

async fn assign(
    store: &dyn Store,
    host: &str,
    handle: &str,
    num4: usize,
    num6: usize,
) -> Result<Vec<IpNet>, IpamError> {
    let a = attrs(handle);
    let got = Allocator::new(store, host)
        .auto_assign(&AutoAssign {
            num4,
            num6,
            handle,
            attrs: &a,
            pools4: &[],
            pools6: &[],
            max_blocks: 0,
            labels: &NoLabels,
        })
        .await?;
    Ok(got.v4.into_iter().chain(got.v6).collect())
}

fn allocated(store: &dyn Store) -> usize {
    run(store.list::<IpamBlock>("", &ListFilter::All))
        .unwrap()
        .iter()
        .map(|b| b.spec.allocations.iter().flatten().count())
        .sum()
}

fn handles(store: &dyn Store) -> Vec<IpamHandle> {
    run(store.list::<IpamHandle>("", &ListFilter::All)).unwrap()
}

#[test]
fn claims_a_block_with_two_phase_affinity_and_releases_by_handle() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("s.db"));
    let s: &dyn Store = &store;
    pool(s, "p", "10.77.0.0/24", 26);

    let ips = run(assign(s, "node-a", "net1.c1", 1, 0)).unwrap();
    assert_eq!(ips.len(), 1);
    let ip = ips[0];
    assert_eq!(ip.prefix_len(), 26);
    // A fresh block hands out its base address first.
    assert_eq!(ip.addr(), ip.network());
    let blocks = run(s.list::<IpamBlock>("", &ListFilter::All)).unwrap();
    assert_eq!(blocks.len(), 1);
    let b = &blocks[0];
    assert_eq!(
        b.metadata.name,
        calico_cni::datastore::ipam_model::cidr_name(&ip.trunc())
    );
    assert_eq!(b.spec.affinity.as_deref(), Some("host:node-a"));
    assert_eq!(b.spec.allocations[0], Some(0));
    assert_eq!(b.spec.unallocated.len(), 63);
    assert_eq!(b.spec.attributes[0].handle_id.as_deref(), Some("net1.c1"));
    // The block numbers its allocations from the time it was made (as
    // Calico's newBlock does); the first allocation took that number.
    assert!(b.spec.sequence_number > 1_700_000_000_000_000_000);
    assert_eq!(
        b.spec.sequence_number_for_allocation["0"] + 1,
        b.spec.sequence_number
    );
    let affinities = run(s.list::<BlockAffinity>("", &ListFilter::All)).unwrap();
    assert_eq!(affinities.len(), 1);
    let a = &affinities[0];
    assert_eq!(a.spec.state, "confirmed");
    assert_eq!(a.spec.deleted, "false");
    assert_eq!(a.metadata.name, format!("node-a-{}", b.metadata.name));
    assert_eq!(
        a.metadata
            .labels
            .get("projectcalico.org/hostname-hash")
            .map(String::as_str),
        Some(hostname_hash("node-a").as_str())
    );
    let h = handles(s);
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].spec.handle_id, "net1.c1");
    assert_eq!(h[0].spec.block.get(&ip.trunc().to_string()), Some(&1));

    // The same host's next address comes from the same block.
    let next = run(assign(s, "node-a", "net1.c2", 1, 0)).unwrap();
    assert_eq!(next[0].trunc(), ip.trunc());
    assert_ne!(next[0], ip);

    let alloc = Allocator::new(s, "node-a");
    assert_eq!(run(alloc.release_by_handle("net1.c1")).unwrap(), Some(1));
    assert_eq!(run(alloc.release_by_handle("net1.c1")).unwrap(), None);
    assert_eq!(run(alloc.release_by_handle("net1.c2")).unwrap(), Some(1));
    assert!(handles(s).is_empty());
    assert_eq!(allocated(s), 0);
    // The block stays this host's.
    assert_eq!(
        run(s.list::<IpamBlock>("", &ListFilter::All))
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn borrows_unless_strict_and_honours_the_block_limit() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("s.db"));
    let s: &dyn Store = &store;
    // One block of 4 addresses.
    pool(s, "p", "10.78.0.0/30", 30);
    for i in 0..3 {
        run(assign(s, "node-a", &format!("a{i}"), 1, 0)).unwrap();
    }
    // node-b finds no free block and borrows node-a's last address.
    let b = run(assign(s, "node-b", "b0", 1, 0)).unwrap();
    assert_eq!(b[0].addr().to_string(), "10.78.0.3");
    // Full now.
    let e = run(assign(s, "node-b", "b1", 1, 0))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("Assigned 0 out of 1 requested IPv4 addresses")
            && e.contains("No IPs available in pools: [10.78.0.0/30]"),
        "{e}"
    );
    run(Allocator::new(s, "node-b").release_by_handle("b0")).unwrap();

    // strictAffinity: no borrowing.
    let mut config = IpamConfig::new(
        IpamConfig::NAME,
        IpamConfigSpec {
            strict_affinity: true,
            auto_allocate_blocks: true,
            max_blocks_per_host: 0,
            ..Default::default()
        },
    );
    let config = run(s.create(&mut config)).unwrap();
    let e = run(assign(s, "node-b", "b2", 1, 0))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("No more free affine blocks and strict affinity enabled"),
        "{e}"
    );
    assert!(
        handles(s).iter().all(|h| h.spec.handle_id != "b2"),
        "a failed assignment leaves no handle"
    );

    // maxBlocksPerHost 1: node-a's block is full, no second one.
    pool(s, "q", "10.78.1.0/28", 30);
    let mut config = config;
    config.spec.max_blocks_per_host = 1;
    run(s.update(&mut config)).unwrap();
    run(assign(s, "node-a", "a3", 1, 0)).unwrap();
    let e = run(assign(s, "node-a", "a4", 1, 0))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "Need to allocate an IPAM block but could not - limit of 1 blocks reached for this node"
        ),
        "{e}"
    );
}

#[test]
fn reservations_are_skipped_and_explicit_addresses_checked() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("s.db"));
    let s: &dyn Store = &store;
    pool(s, "p", "10.79.0.0/24", 26);
    let mut r = IpReservation::new(
        "r",
        IpReservationSpec {
            reserved_cidrs: vec!["10.79.0.0/31".into()],
            ..Default::default()
        },
    );
    run(s.create(&mut r)).unwrap();
    let ips = run(assign(s, "node-a", "h1", 1, 0)).unwrap();
    let last_octet = ips[0]
        .addr()
        .to_string()
        .rsplit('.')
        .next()
        .unwrap()
        .parse::<u8>()
        .unwrap();
    assert!(
        last_octet % 64 >= 2 || ips[0].network().to_string() != "10.79.0.0",
        "{ips:?}"
    );

    let alloc = Allocator::new(s, "node-a");
    let ip: IpAddr = "10.79.0.200".parse().unwrap();
    let got = run(alloc.assign_ip(ip, "h2", &attrs("p2"))).unwrap();
    assert_eq!(got.addr(), ip);
    let e = run(alloc.assign_ip(ip, "h3", &attrs("p3")))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("resource already exists") && e.contains("h2"),
        "{e}"
    );
    let e = run(alloc.assign_ip("10.80.0.1".parse().unwrap(), "h4", &attrs("p4")))
        .unwrap_err()
        .to_string();
    assert_eq!(e, "The provided IP address is not in a configured pool\n");
    assert_eq!(run(alloc.addresses_of("h2")).unwrap(), [ip]);
    run(alloc.release_ips(&[ip])).unwrap();
    assert!(handles(s).iter().all(|h| h.spec.handle_id != "h2"));
}

#[test]
fn dual_stack_is_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("s.db"));
    let s: &dyn Store = &store;
    pool(s, "v4", "10.81.0.0/24", 26);
    pool(s, "v6", "fd00:81::/126", 126);
    let ips = run(assign(s, "node-a", "d1", 1, 1)).unwrap();
    assert_eq!(ips.len(), 2);
    assert_eq!(ips[1].prefix_len(), 126);
    for i in 2..5 {
        run(assign(s, "node-a", &format!("d{i}"), 0, 1)).unwrap();
    }
    // IPv6 is exhausted: the IPv4 address of the attempt is given back.
    let before = allocated(s);
    let e = run(assign(s, "node-a", "d9", 1, 1))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("failed to request IPv6 addresses: Assigned 0 out of 1"),
        "{e}"
    );
    assert_eq!(allocated(s), before);
    assert!(handles(s).iter().all(|h| h.spec.handle_id != "d9"));
}

#[test]
fn concurrent_hosts_never_share_an_address_and_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    pool(&open(&path), "p", "10.82.0.0/26", 29);
    // Every address held by someone right now: an assignment must never
    // return one of them (it is taken out before its release starts).
    let live = std::sync::Arc::new(std::sync::Mutex::new(HashSet::new()));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (path, live) = (path.clone(), live.clone());
            std::thread::spawn(move || {
                let store = open(&path);
                let s: &dyn Store = &store;
                let host = format!("node-{}", t % 4);
                let release = |handle: &str, ip: IpNet| {
                    assert!(live.lock().unwrap().remove(&ip));
                    run(Allocator::new(s, &host).release_by_handle(handle)).unwrap();
                };
                let mut held = Vec::new();
                for i in 0..20 {
                    let handle = format!("net1.t{t}-{i}");
                    let ip = run(assign(s, &host, &handle, 1, 0)).unwrap()[0];
                    assert!(live.lock().unwrap().insert(ip), "{ip} handed out twice");
                    held.push((handle, ip));
                    if held.len() > 3 {
                        let (h, ip) = held.remove(0);
                        release(&h, ip);
                    }
                }
                for (handle, ip) in &held {
                    release(handle, *ip);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let store = open(&path);
    let s: &dyn Store = &store;
    assert!(handles(s).is_empty());
    assert_eq!(allocated(s), 0);
    let affinities = run(s.list::<BlockAffinity>("", &ListFilter::All)).unwrap();
    assert!(
        affinities.iter().all(|a| a.spec.state == "confirmed"),
        "{affinities:?}"
    );
}

/// A release that stopped between its mark and its delete (killed, or out
/// of time) leaves soft-deleted objects; the next reader finishes them, so
/// that neither a handle nor a block is stranded.
#[test]
fn interrupted_deletes_are_finished_by_the_next_reader() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("s.db"));
    let s: &dyn Store = &store;
    pool(s, "p", "10.78.0.0/24", 26);
    let ip = run(assign(s, "node-a", "net1.c1", 1, 0)).unwrap()[0];

    // The handle marked deleted and left so (the allocation freed first,
    // as a release does).
    let blk = |s: &dyn Store| {
        run(s.get::<IpamBlock>(
            "",
            &calico_cni::datastore::ipam_model::cidr_name(&ip.trunc()),
        ))
        .unwrap()
    };
    let mut b = blk(s).unwrap();
    b.spec.allocations[0] = None;
    b.spec.unallocated.push(0);
    run(s.update(&mut b)).unwrap();
    let mut h = handles(s).remove(0);
    h.spec.deleted = true;
    run(s.update(&mut h)).unwrap();
    let alloc = Allocator::new(s, "node-a");
    assert_eq!(run(alloc.release_by_handle("net1.c1")).unwrap(), None);
    assert!(handles(s).is_empty(), "{:?}", handles(s));

    // A soft-deleted handle met by an ADD under the same handle: deleted,
    // then created afresh.
    let again = run(assign(s, "node-a", "net1.c2", 1, 0)).unwrap()[0];
    let mut h = handles(s).remove(0);
    h.spec.deleted = true;
    run(s.update(&mut h)).unwrap();
    run(assign(s, "node-a", "net1.c2", 1, 0)).unwrap();
    let h = handles(s);
    assert_eq!(h.len(), 1);
    assert!(!h[0].spec.deleted);
    assert_eq!(h[0].spec.block.get(&again.trunc().to_string()), Some(&1));
    assert_eq!(run(alloc.release_by_handle("net1.c2")).unwrap(), Some(2));

    assert_eq!(allocated(s), 0);
    assert!(handles(s).is_empty());

    // The pool's only block released by its host (affinity gone), empty,
    // marked deleted and left so: another host's ADD meets it borrowing,
    // finishes the delete and claims the block in the same call.
    let mut b = blk(s).unwrap();
    b.spec.affinity = None;
    b.spec.deleted = true;
    run(s.update(&mut b)).unwrap();
    for a in run(s.list::<BlockAffinity>("", &ListFilter::All)).unwrap() {
        let pre = calico_cni::datastore::Precondition::default();
        run(s.delete::<BlockAffinity>("", &a.metadata.name, &pre)).unwrap();
    }
    let mut p = run(s.get::<IpPool>("", "p")).unwrap().unwrap();
    p.spec.cidr = ip.trunc().to_string();
    run(s.update(&mut p)).unwrap();
    let got = run(assign(s, "node-b", "net1.c3", 1, 0)).unwrap()[0];
    assert_eq!(got.trunc(), ip.trunc());
    let b = blk(s).unwrap();
    assert!(!b.spec.deleted);
    assert_eq!(b.spec.affinity.as_deref(), Some("host:node-b"));
    assert_eq!(
        run(Allocator::new(s, "node-b").release_by_handle("net1.c3")).unwrap(),
        Some(1)
    );
    assert_eq!(allocated(s), 0);
    assert!(handles(s).is_empty());
}

/// Inputs read ahead of the host lock (the ADD path: IPAMConfig, pools,
/// reservations and this host's affinities before the lock) that another
/// ADD of the host overtook: its new block is found and used, not a third
/// block claimed; and a handle read ahead of a release that an ADD wrote
/// meanwhile still has all its addresses released.
#[test]
fn inputs_read_ahead_of_the_lock_see_what_was_claimed_since() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("s.db"));
    let s: &dyn Store = &store;
    pool(s, "p", "10.78.0.0/24", 31);
    let blocks = || run(s.list::<IpamBlock>("", &ListFilter::All)).unwrap();

    // Block 1 full (two addresses of a /31).
    assert_eq!(run(assign(s, "node-a", "net1.b", 2, 0)).unwrap().len(), 2);
    let a = attrs("net1.a");
    let req = AutoAssign {
        num4: 1,
        num6: 0,
        handle: "net1.a",
        attrs: &a,
        pools4: &[],
        pools6: &[],
        max_blocks: 0,
        labels: &NoLabels,
    };
    let alloc = Allocator::new(s, "node-a");
    let ahead = run(alloc.read_ahead(&req)).unwrap();
    // Meanwhile another ADD of this host claims block 2 and takes one of
    // its two addresses.
    let c = run(assign(s, "node-a", "net1.c", 1, 0)).unwrap();
    assert_eq!(blocks().len(), 2);

    let got = run(alloc.auto_assign_from(&req, Some(ahead))).unwrap();
    assert_eq!(got.v4.len(), 1);
    assert_eq!(
        blocks().len(),
        2,
        "block 2's free address, not a new block: {:?} after {c:?}",
        got.v4
    );
    assert_eq!(got.v4[0].trunc(), c[0].trunc(), "in block 2");

    // The release side: the handle read ahead, then written (another
    // address added under it) before the release runs.
    let read = run(alloc.read_handle("net1.b")).unwrap();
    assert!(read.is_some());
    let extra =
        run(alloc.assign_ip("10.78.0.200".parse().unwrap(), "net1.b", &attrs("net1.b"))).unwrap();
    assert_eq!(
        run(alloc.release_handle_from("net1.b", Some(read))).unwrap(),
        Some(3),
        "both of block 1 and {extra:?}"
    );
    assert!(handles(s).iter().all(|h| h.spec.handle_id != "net1.b"));
    assert_eq!(allocated(s), 2, "net1.a and net1.c only");
}
