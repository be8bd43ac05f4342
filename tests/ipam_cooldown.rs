//! IP cooldown (Calico's IPAMConfig `ipCooldownSeconds`, calico#12496) on
//! the three datastores: the embedded store, the test bed's API server and
//! a private etcd cluster. The property: no address is handed out again
//! within its cooldown of its release — for every address, the ADD that
//! gets it again returns at least the cooldown after the DEL that released
//! it began — with four calico-ipam processes cycling ADD/DEL on a block
//! of 8 addresses. An ADD that finds only cooling addresses fails at once
//! (Calico's choice: a cooling address is simply not free), and once the
//! cooldown has passed every address can be had again (none leaked).
//! Released addresses are read back from the stored block: pointed at an
//! attribute holding only `releasedAt`, not in `unallocated`.
//!
//! IPAMConfig `default` is the cluster's: the tests of this binary take
//! turns, and no other test binary runs meanwhile (cargo runs them one by
//! one); each puts the config back as it found it (absent).

mod common;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use calico_cni::datastore::ipam_model::IpamConfig;
use common::etcd::PrivateCluster;
use common::ipam::{Backend, World, address};
use common::*;
use serde_json::{Value, json};

/// One test at a time: IPAMConfig is cluster-wide.
static TURN: Mutex<()> = Mutex::new(());

const COOLDOWN: Duration = Duration::from_secs(1);
const WORKERS: usize = 4;
const CYCLES: usize = 12;

/// IPAMConfig `default` with a cooldown while it lives; then as it was
/// (the test bed's API server has one, as calico-node makes it).
struct Config<'a> {
    w: &'a World,
    before: Option<Value>,
}

impl<'a> Config<'a> {
    fn with_cooldown(w: &'a World, seconds: u64) -> Config<'a> {
        let before = w.get::<IpamConfig>(IpamConfig::NAME);
        match &before {
            Some(current) => {
                let mut changed = current.clone();
                changed["spec"]["ipCooldownSeconds"] = json!(seconds);
                w.update::<IpamConfig>(changed);
            }
            None => {
                w.create::<IpamConfig>(json!({"metadata": {"name": IpamConfig::NAME},
                    "spec": {"strictAffinity": false, "autoAllocateBlocks": true,
                             "ipCooldownSeconds": seconds}}));
            }
        }
        Config { w, before }
    }
}

impl Drop for Config<'_> {
    fn drop(&mut self) {
        match (&self.before, self.w.get::<IpamConfig>(IpamConfig::NAME)) {
            (Some(before), Some(mut now)) => {
                now["spec"] = before["spec"].clone();
                self.w.update::<IpamConfig>(now);
            }
            (None, _) => self.w.delete::<IpamConfig>(IpamConfig::NAME),
            (Some(_), None) => panic!("IPAMConfig default disappeared"),
        }
    }
}

/// One address's holding: when its ADD ran, when its DEL ran.
#[derive(Debug, Clone, Copy)]
struct Holding {
    add: (Instant, Instant),
    del: (Instant, Instant),
}

/// The cooling addresses of the world's blocks, read back from the store:
/// (address, releasedAt).
fn cooling(w: &World) -> Vec<(IpAddr, String)> {
    let mut out = Vec::new();
    for b in w.blocks() {
        let cidr: ipnet::IpNet = b["spec"]["cidr"].as_str().unwrap().parse().unwrap();
        let attrs = b["spec"]["attributes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let unallocated: Vec<u64> = b["spec"]["unallocated"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o.as_u64().unwrap())
            .collect();
        for (o, a) in b["spec"]["allocations"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
        {
            let Some(i) = a.as_u64() else { continue };
            let attr = &attrs[i as usize];
            if let Some(at) = attr["releasedAt"].as_str() {
                assert!(attr.get("handle_id").is_none(), "{attr}");
                assert!(!unallocated.contains(&(o as u64)), "{b}");
                out.push((common::ipam::address_at(&cidr, o), at.to_string()));
            }
        }
    }
    out
}

fn property(test: &str, w: &World) {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let pool = w.v4(0).to_string().replace("/24", "/29");
    let pool: ipnet::IpNet = pool.parse().unwrap();
    w.pool(&pool.to_string(), json!({"blockSize": 29}));
    let _config = Config::with_cooldown(w, COOLDOWN.as_secs());
    let conf = w.conf();

    // One release read back: cooling, with its time, and not free.
    let cid = container_id();
    let r = w.ipam("ADD", &cid, &conf, "").assert_ok().json();
    let first = address(&r, 0).addr();
    w.ipam("DEL", &cid, &conf, "").assert_ok();
    let cooled = cooling(w);
    assert_eq!(cooled.len(), 1, "{cooled:?}");
    assert_eq!(cooled[0].0, first);
    assert!(
        w.allocations().iter().all(|(_, h)| h.is_empty()),
        "{:?}",
        w.allocations()
    );
    std::thread::sleep(COOLDOWN);

    let holdings: Mutex<BTreeMap<IpAddr, Vec<Holding>>> = Mutex::default();
    let refused: Mutex<Vec<Duration>> = Mutex::default();
    std::thread::scope(|s| {
        for _ in 0..WORKERS {
            s.spawn(|| {
                let mut done = 0;
                while done < CYCLES {
                    let cid = container_id();
                    let started = Instant::now();
                    let out = w.ipam("ADD", &cid, &conf, "");
                    let added = Instant::now();
                    if out.code != 0 {
                        let msg = out.json()["msg"].as_str().unwrap_or_default().to_string();
                        assert!(msg.contains("Assigned 0 out of 1"), "{out:?}");
                        refused.lock().unwrap().push(added - started);
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                    let ip = address(&out.json(), 0).addr();
                    std::thread::sleep(Duration::from_millis(20));
                    let releasing = Instant::now();
                    w.ipam("DEL", &cid, &conf, "").assert_ok();
                    let released = Instant::now();
                    holdings
                        .lock()
                        .unwrap()
                        .entry(ip)
                        .or_default()
                        .push(Holding {
                            add: (started, added),
                            del: (releasing, released),
                        });
                    done += 1;
                }
            });
        }
    });

    let holdings = holdings.into_inner().unwrap();
    let mut reused = 0;
    for (ip, mut list) in holdings {
        list.sort_by_key(|h| h.add.0);
        for pair in list.windows(2) {
            let (before, after) = (pair[0], pair[1]);
            assert!(
                after.add.1 >= before.del.0 + COOLDOWN,
                "{ip} was handed out {:?} after the DEL that released it began (cooldown {COOLDOWN:?})",
                after.add.1 - before.del.0
            );
            reused += 1;
        }
    }
    let refused = refused.into_inner().unwrap();
    let slowest = refused.iter().max().copied().unwrap_or_default();
    eprintln!(
        "{test}: {} cycles, {reused} addresses handed out again after their cooldown, \
         {} ADDs refused while only cooling addresses were left (slowest {slowest:?})",
        WORKERS * CYCLES,
        refused.len()
    );
    assert!(reused > 0, "no address came back: the cooldown never ended");
    assert!(slowest < COOLDOWN, "a refused ADD waited {slowest:?}");

    // After the cooldown: all 8 addresses can be had; none leaked.
    std::thread::sleep(COOLDOWN);
    let cids: Vec<String> = (0..8).map(|_| container_id()).collect();
    let mut got: Vec<IpAddr> = cids
        .iter()
        .map(|cid| address(&w.ipam("ADD", cid, &conf, "").assert_ok().json(), 0).addr())
        .collect();
    got.sort();
    got.dedup();
    assert_eq!(got.len(), 8, "{got:?}");
    assert!(got.iter().all(|ip| pool.contains(ip)), "{got:?}");
    for cid in &cids {
        w.ipam("DEL", cid, &conf, "").assert_ok();
    }
    assert_eq!(cooling(w).len(), 8);
}

#[test]
fn cooldown_embedded() {
    let test = "cooldown_embedded";
    let Some(w) = World::new(test, Backend::Embedded) else {
        return;
    };
    property(test, &w);
}

#[test]
fn cooldown_kdd() {
    let test = "cooldown_kdd";
    let Some(w) = World::new(test, Backend::Kdd) else {
        return;
    };
    property(test, &w);
}

#[test]
fn cooldown_etcd() {
    let test = "cooldown_etcd";
    let Some(cluster) = PrivateCluster::start(test, 1) else {
        return;
    };
    let Some(w) = World::on_etcd(test, cluster.access()) else {
        return;
    };
    property(test, &w);
}
