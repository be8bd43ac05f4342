//! Torture: random operations from 16 workers over 64 pods — ADD of a new
//! sandbox (the old one left for a later DEL: ADD(A) ADD(B) DEL(A)), DEL,
//! DEL repeated, CHECK, GC with the valid attachments (exclusive with the
//! others, as the spec has it), ADD of a pod's new sandbox concurrently
//! with the DEL of its old one — with random kills (SIGKILL after a random
//! step of ADD or DEL; the sandbox is then DEL'd later, as a runtime
//! does). Checked throughout: no address handed to two live sandboxes,
//! every failure a CNI error JSON. At the end, after a DEL of every
//! sandbox ever made: no address, handle, endpoint record, host veth or
//! pod interface left.
//!
//! On the embedded store with calico-ipam, and on the test bed's API
//! server. The short configuration runs in CI (TORTURE_OPS, default 400 on
//! the embedded store, a quarter of it on the API server); the long one:
//!
//!     TORTURE_OPS=10000 TORTURE_KDD_OPS=1000 cargo test --features fault-injection \
//!         --test torture -- --nocapture
//!
//! TORTURE_SEED replays a run (the seed is printed).

mod common;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock};

use common::ipam::{Backend, World, address};
use common::testbed::Namespace;
use common::*;
use serde_json::{Value, json};

const WORKERS: usize = 16;
const PODS: usize = 64;
const ADD_STEPS: [&str; 5] = ["ipam", "veth", "addresses", "host-routes", "endpoint"];
const DEL_STEPS: [&str; 3] = ["del-netns", "del-ipam", "del-endpoint"];

/// xorshift64*: small, seedable, good enough to pick operations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn seed() -> u64 {
    std::env::var("TORTURE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| u64::from_str_radix(&unique()[..8], 16).unwrap() | 1)
}

fn ops(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// One sandbox: its container ID and netns, and the result of its ADD.
struct Sandbox {
    cid: String,
    netns: Netns,
    result: Option<Value>,
}

#[derive(Default)]
struct Pod {
    /// The current sandbox, and older ones still to be DEL'd.
    current: Option<Sandbox>,
    stale: Vec<Sandbox>,
}

struct Run<'a> {
    w: &'a World,
    conf: Value,
    ns: Option<&'a Namespace>,
    pods: Vec<Mutex<Pod>>,
    /// Live addresses: address -> container ID.
    live: Mutex<HashMap<IpAddr, String>>,
    /// GC excludes every other operation.
    gc: RwLock<()>,
    violations: Mutex<Vec<String>>,
    counts: Mutex<HashMap<&'static str, usize>>,
    kills: AtomicUsize,
}

impl Run<'_> {
    fn pod_name(i: usize) -> String {
        format!("pod-{i}")
    }

    fn args(&self, i: usize, cid: &str) -> String {
        match self.ns {
            Some(ns) => format!(
                "K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={cid}",
                ns.name,
                Self::pod_name(i)
            ),
            None => String::new(),
        }
    }

    fn count(&self, what: &'static str) {
        *self.counts.lock().unwrap().entry(what).or_default() += 1;
    }

    fn violation(&self, what: String) {
        eprintln!("VIOLATION: {what}");
        self.violations.lock().unwrap().push(what);
    }

    /// Runs a verb; `kill`: the step after which the process kills itself.
    fn exec(
        &self,
        verb: &str,
        i: usize,
        sb: &Sandbox,
        conf: &Value,
        kill: Option<&str>,
    ) -> Outcome {
        let args = self.args(i, &sb.cid);
        let out = match kill {
            Some(step) => self.w.plugin_with_env(
                verb,
                &sb.cid,
                &sb.netns.path(),
                conf,
                &args,
                &[("CALICO_CNI_KILL_AFTER", step)],
            ),
            None => self
                .w
                .plugin(verb, &sb.cid, &sb.netns.path(), conf, &args, None),
        };
        if out.code == -1 {
            self.kills.fetch_add(1, Ordering::Relaxed);
        } else if out.code != 0 {
            let reply: Option<Value> = serde_json::from_str(&out.stdout).ok();
            let ok = reply
                .as_ref()
                .is_some_and(|r| r["code"].as_u64().is_some() && r["msg"].is_string());
            if !ok {
                self.violation(format!("{verb} {}: not a CNI error: {out:?}", sb.cid));
            }
        }
        out
    }

    fn add(&self, i: usize, sb: &mut Sandbox, kill: Option<&str>) {
        let out = self.exec("ADD", i, sb, &self.conf, kill);
        if out.code != 0 {
            return;
        }
        let r = out.json();
        let ip = address(&r, 0).addr();
        let mut live = self.live.lock().unwrap();
        if let Some(other) = live.insert(ip, sb.cid.clone())
            && other != sb.cid
        {
            self.violation(format!("{ip} given to {} while {other} holds it", sb.cid));
        }
        sb.result = Some(r);
    }

    /// DEL; `true` when it succeeded (the sandbox is gone).
    fn del(&self, i: usize, sb: &Sandbox, kill: Option<&str>) -> bool {
        // Forget its address first: once DEL starts, it may be reused.
        if let Some(r) = &sb.result {
            let ip = address(r, 0).addr();
            let mut live = self.live.lock().unwrap();
            if live.get(&ip) == Some(&sb.cid) {
                live.remove(&ip);
            }
        }
        self.exec("DEL", i, sb, &self.conf, kill).code == 0
    }

    fn new_sandbox() -> Sandbox {
        Sandbox {
            cid: container_id(),
            netns: Netns::new(),
            result: None,
        }
    }

    fn one(&self, rng: &mut Rng) {
        let kill_add = (rng.below(10) == 0).then(|| ADD_STEPS[rng.below(ADD_STEPS.len())]);
        let kill_del = (rng.below(10) == 0).then(|| DEL_STEPS[rng.below(DEL_STEPS.len())]);
        let op = rng.below(100);
        if op < 3 {
            let _exclusive = self.gc.write().unwrap();
            self.count("GC");
            let valid: Vec<Value> = self
                .pods
                .iter()
                .flat_map(|p| {
                    let p = p.lock().unwrap();
                    p.current
                        .iter()
                        .chain(p.stale.iter())
                        .map(|s| json!({"containerID": s.cid, "ifname": "eth0"}))
                        .collect::<Vec<_>>()
                })
                .collect();
            let mut conf = self.conf.clone();
            conf["cni.dev/valid-attachments"] = json!(valid);
            let out = self.w.plugin("GC", "", "", &conf, "", None);
            if out.code != 0 {
                self.violation(format!("GC failed: {out:?}"));
            }
            return;
        }
        let _shared = self.gc.read().unwrap();
        let i = rng.below(PODS);
        let mut pod = self.pods[i].lock().unwrap();
        match op {
            // ADD of a new sandbox; the old one waits for its DEL.
            3..=37 => {
                self.count("ADD");
                if let Some(old) = pod.current.take() {
                    pod.stale.push(old);
                }
                let mut sb = Self::new_sandbox();
                self.add(i, &mut sb, kill_add);
                pod.current = Some(sb);
            }
            // DEL of the current sandbox (sometimes twice).
            38..=62 => {
                self.count("DEL");
                if let Some(sb) = pod.current.take() {
                    let done = self.del(i, &sb, kill_del);
                    if done && op >= 58 {
                        self.count("DEL again");
                        if !self.del(i, &sb, None) {
                            self.violation(format!("a repeated DEL of {} failed", sb.cid));
                        }
                    }
                    if !done {
                        pod.stale.push(sb);
                    }
                }
            }
            // DEL of a stale sandbox (ADD(A) ADD(B) DEL(A)).
            63..=77 => {
                self.count("DEL stale");
                if !pod.stale.is_empty() {
                    let k = rng.below(pod.stale.len());
                    let sb = pod.stale.remove(k);
                    if !self.del(i, &sb, kill_del) {
                        pod.stale.push(sb);
                    }
                }
            }
            // CHECK of the current sandbox.
            78..=89 => {
                self.count("CHECK");
                if let Some(sb) = &pod.current
                    && let Some(r) = &sb.result
                {
                    let mut conf = self.conf.clone();
                    conf["prevResult"] = r.clone();
                    let out = self.exec("CHECK", i, sb, &conf, None);
                    if out.code != 0 {
                        self.violation(format!("CHECK {} failed: {out:?}", sb.cid));
                    }
                }
            }
            // A new sandbox's ADD concurrently with the old one's DEL.
            _ => {
                self.count("ADD || DEL");
                let Some(old) = pod.current.take() else {
                    return;
                };
                let mut sb = Self::new_sandbox();
                let deleted = std::thread::scope(|s| {
                    let del = s.spawn(|| self.del(i, &old, kill_del));
                    self.add(i, &mut sb, kill_add);
                    del.join().unwrap()
                });
                if !deleted {
                    pod.stale.push(old);
                }
                pod.current = Some(sb);
            }
        }
    }

    /// DEL of every sandbox left, each until it succeeds (bounded).
    fn del_everything(&self) {
        for (i, p) in self.pods.iter().enumerate() {
            let mut pod = p.lock().unwrap();
            let mut all: Vec<Sandbox> = pod.stale.drain(..).collect();
            all.extend(pod.current.take());
            for sb in all {
                if !(0..5).any(|_| self.del(i, &sb, None)) {
                    self.violation(format!("the final DEL of {} keeps failing", sb.cid));
                }
                if sb.netns.link("eth0").is_some() {
                    self.violation(format!("{}: eth0 left after its DEL", sb.cid));
                }
                let veth = match self.ns {
                    Some(ns) => calico_cni::datastore::names::veth_name_for_workload(
                        &ns.name,
                        &Self::pod_name(i),
                        None,
                    ),
                    None => host_veth(&sb.cid),
                };
                if host_link_exists(&veth) && self.ns.is_none() {
                    self.violation(format!("{}: host veth {veth} left", sb.cid));
                }
            }
        }
    }
}

fn torture(test: &str, backend: Backend, n: usize) {
    if !root_or_skip(test) {
        return;
    }
    let Some(w) = World::new(test, backend) else {
        return;
    };
    w.pool(&w.v4(0).to_string(), json!({"blockSize": 28}));
    let ns = (backend == Backend::Kdd).then(|| w.bed().namespace(json!({}), json!({})));
    let mut conf = w.conf();
    conf["cniVersion"] = json!("1.1.0");
    conf["log_level"] = json!("info");
    if let Some(ns) = &ns {
        conf["policy"] = json!({"type": "k8s"});
        for i in 0..PODS {
            w.pod(ns, &Run::pod_name(i), json!({}));
        }
    }
    let run = Run {
        w: &w,
        conf,
        ns: ns.as_ref(),
        pods: (0..PODS).map(|_| Mutex::new(Pod::default())).collect(),
        live: Mutex::new(HashMap::new()),
        gc: RwLock::new(()),
        violations: Mutex::new(Vec::new()),
        counts: Mutex::new(HashMap::new()),
        kills: AtomicUsize::new(0),
    };
    let seed = seed();
    let started = std::time::Instant::now();
    let done = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for worker in 0..WORKERS {
            let (run, done) = (&run, &done);
            s.spawn(move || {
                let mut rng = Rng(seed ^ ((worker as u64 + 1) << 32));
                while done.fetch_add(1, Ordering::Relaxed) < n {
                    run.one(&mut rng);
                }
            });
        }
    });
    let ops_time = started.elapsed();
    run.del_everything();
    // Nothing left in IPAM or the store.
    let allocations = w.allocations();
    if !allocations.is_empty() {
        run.violation(format!("addresses left: {allocations:?}"));
    }
    if backend != Backend::Kdd {
        let left = w.endpoints("default");
        if !left.is_empty() {
            run.violation(format!("{} endpoint records left", left.len()));
        }
    }
    let mut counts: Vec<_> = run.counts.lock().unwrap().clone().into_iter().collect();
    counts.sort();
    eprintln!(
        "torture {test}: seed {seed}, {n} operations by {WORKERS} workers over {PODS} pods in {:.1}s ({counts:?}), {} kills; violations {}",
        ops_time.as_secs_f64(),
        run.kills.load(Ordering::Relaxed),
        run.violations.lock().unwrap().len()
    );
    let v = run.violations.lock().unwrap();
    assert!(v.is_empty(), "seed {seed}: {:?}", &v[..v.len().min(10)]);
}

#[test]
fn torture_on_the_embedded_store_with_calico_ipam() {
    torture(
        "torture_embedded",
        Backend::Embedded,
        ops("TORTURE_OPS", 400),
    );
}

#[test]
fn torture_on_the_api_server_with_calico_ipam() {
    torture(
        "torture_kdd",
        Backend::Kdd,
        ops("TORTURE_KDD_OPS", ops("TORTURE_OPS", 400) / 4),
    );
}
