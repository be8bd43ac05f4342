//! A cluster simulated on one machine: N nodes sharing one IPAM on the test
//! bed's API server (or its etcd cluster), pods ADDed and DELed through
//! the CNI exec contract of the real `calico-ipam` binary — ours, and
//! Calico v3.32.1's as the control — with every answer recorded and
//! checked: no address held by two live pods at once, nothing left in the
//! pool after the churn. Each simulated node has its own nodename, state
//! directory (`local_datastore_path`, and so the release journal and
//! STATUS's cache beside it), IPAM lock file and log, as on its own
//! machine. The kernel part (the veth pair, routes) is not simulated: the
//! IPAM plugin is exec'd directly, which is where addresses are shared
//! between nodes; the kernel part's cost is the plugin bench's.
//!
//!     eval "$(bash scripts/testbed.sh env)"
//!     cargo run --release --example cluster_scale -- --backend kdd --nodes 50 --ops 2000
//!
//! Options: `--backend kdd|etcd`, `--nodes N` (default 20), `--ops M` ADDs
//! and DELs in all (default 1000), `--pods P` live pods a node aims at
//! (default 10), `--concurrency C` calls in flight (default 8), `--rate R`
//! (calls started a second, at most C in flight: both binaries under the
//! same load; without it each in-flight slot starts its next call as soon
//! as one ends, so a faster binary meets more writes a second), `--pool
//! CIDR` (default: a free /22 of 100.96.0.0/12) with `--block-size B`
//! (default 26: a /22 is 16 blocks, fewer than the nodes, so nodes borrow),
//! `--strict-affinity` (IPAMConfig strictAffinity for the run: no
//! borrowing; restored after), `--binary ours|calico|both` (default both),
//! `--ours PATH` (default: the `calico` beside this example's build),
//! `--kill-every K` (SIGKILL one plugin process in K while it runs; its pod
//! is DELed again until a DEL succeeds, as kubelet does), `--fault
//! apiserver|etcd-leader` (halfway through the churn, kube-apiserver or the
//! calico-etcd leader restarted by `scripts/testbed.sh`; calls that fail
//! meanwhile are failures the runtime retries: an ADD's pod is DELed), or
//! `blackhole` (the last node's datastore traffic dropped by a relay for
//! `--hole-seconds`, default 60, while its kubelet's ADDs hang; then the
//! node lost: its plugin processes killed, its Node deleted and its IPAM
//! released as Calico's kube-controllers releases a deleted node's:
//! `examples/common/node_release.rs`).
//! `--cleanup` removes what runs that did not finish left (pools, blocks,
//! affinities, handles and nodes named `sim-…`) and exits. Exits non-zero
//! on a duplicate or a leak of ours (Calico's are reported, not judged).
//! Diagnosis: `CLUSTER_SCALE_SLOWEST=1` prints the 20 slowest ADDs (their
//! container, node and start); `CLUSTER_SCALE_LOG_LEVEL=debug` sets the
//! plugins' log level (each node's `cni.log` in the run's directory, then
//! kept).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use calico_cni::datastore::etcd::EtcdStore;
use calico_cni::datastore::ipam_model::{
    BlockAffinity, IpPool, IpPoolSpec, IpamBlock, IpamConfig, IpamConfigSpec, IpamHandle, Node,
};
use calico_cni::datastore::kubernetes::KubernetesStore;
use calico_cni::datastore::{ListFilter, Precondition, Resource, Store};
use calico_cni::etcd::EtcdClient;
use calico_cni::k8s::{K8sClient, K8sConfig};
use ipnet::IpNet;
use serde_json::{Value, json};

#[path = "common/node_release.rs"]
mod node_release;
#[path = "common/relay.rs"]
mod relay;
#[path = "common/testbed.rs"]
mod testbed;

use testbed::{Failure, deadline, etcd_config, var};

#[derive(Clone, Debug)]
struct Options {
    backend: String,
    nodes: usize,
    ops: usize,
    pods: usize,
    concurrency: usize,
    /// Calls started a second (open loop, up to `concurrency` in flight);
    /// `None`: each in-flight slot starts its next call at once.
    rate: Option<f64>,
    pool: Option<IpNet>,
    block_size: u8,
    strict_affinity: bool,
    binaries: Vec<String>,
    ours: PathBuf,
    kill_every: usize,
    fault: Option<String>,
    hole_seconds: u64,
    cleanup: bool,
    run: String,
}

fn options() -> Result<Options, Failure> {
    let exe = std::env::current_exe()?;
    let ours = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("calico"))
        .ok_or("no directory of this example")?;
    let mut o = Options {
        backend: "kdd".into(),
        nodes: 20,
        ops: 1000,
        pods: 10,
        concurrency: 8,
        rate: None,
        pool: None,
        block_size: 26,
        strict_affinity: false,
        binaries: vec!["calico".into(), "ours".into()],
        ours,
        kill_every: 0,
        fault: None,
        hole_seconds: 60,
        cleanup: false,
        run: format!("{:x}", std::process::id()),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).cloned().unwrap_or_default();
        let mut step = 2;
        match args[i].as_str() {
            "--backend" => o.backend = value,
            "--nodes" => o.nodes = value.parse()?,
            "--ops" => o.ops = value.parse()?,
            "--pods" => o.pods = value.parse()?,
            "--concurrency" => o.concurrency = value.parse()?,
            "--rate" => o.rate = Some(value.parse::<f64>()?).filter(|r| *r > 0.0),
            "--pool" => o.pool = Some(value.parse()?),
            "--block-size" => o.block_size = value.parse()?,
            "--cleanup" => {
                o.cleanup = true;
                step = 1;
            }
            "--strict-affinity" => {
                o.strict_affinity = true;
                step = 1;
            }
            "--binary" => {
                o.binaries = match value.as_str() {
                    "both" => vec!["calico".into(), "ours".into()],
                    "ours" | "calico" => vec![value],
                    other => return Err(format!("--binary ours|calico|both, not {other}").into()),
                }
            }
            "--ours" => o.ours = value.into(),
            "--kill-every" => o.kill_every = value.parse()?,
            "--fault" => {
                o.fault = match value.as_str() {
                    "none" => None,
                    "apiserver" => Some("restart-apiserver".into()),
                    "etcd-leader" => Some("restart-calico-etcd-leader".into()),
                    "blackhole" => Some(BLACKHOLE.into()),
                    other => {
                        return Err(format!(
                            "--fault none|apiserver|etcd-leader|blackhole, not {other}"
                        )
                        .into());
                    }
                }
            }
            "--hole-seconds" => o.hole_seconds = value.parse()?,
            other => return Err(format!("unknown option {other}").into()),
        }
        i += step;
    }
    if !["etcd", "kdd"].contains(&o.backend.as_str()) {
        return Err("--backend is etcd or kdd".into());
    }
    Ok(o)
}

/// The admin's view of the datastore (the run's pool, nodes and checks).
async fn admin_store(backend: &str) -> Result<Arc<dyn Store>, Failure> {
    Ok(match backend {
        "etcd" => Arc::new(EtcdStore::new(EtcdClient::new(
            &etcd_config()?,
            deadline(),
        )?)),
        _ => {
            let conf = K8sConfig {
                kubeconfig: Some(var("KUBECONFIG")?.into()),
                ..K8sConfig::default()
            };
            Arc::new(KubernetesStore::new(
                K8sClient::new(&conf, deadline()).await?,
                None,
                None,
            ))
        }
    })
}

/// `--fault blackhole`: the last node's traffic black-holed for
/// `--hole-seconds`, then the node lost (its processes killed, its Node
/// deleted, its IPAM released as Calico's kube-controllers releases it).
const BLACKHOLE: &str = "blackhole";

/// The node `--fault blackhole` takes.
struct Loss {
    node: usize,
    name: String,
    /// 0: reachable; 1: black-holed; 2: lost.
    state: std::sync::atomic::AtomicU8,
    /// Its pods, which no DEL reaches any more (they go with the node).
    stranded: Mutex<Vec<Live>>,
    /// When its IPAM was released (the stranded pods' holds end there).
    released_at: Mutex<Option<Instant>>,
    /// Calls on the node not yet recorded (the release waits for them).
    in_flight: std::sync::atomic::AtomicUsize,
    relays: Vec<relay::Relay>,
}

impl Loss {
    fn cut(&self) -> bool {
        self.state.load(std::sync::atomic::Ordering::Relaxed) != 0
    }

    /// Whether `node`'s calls no longer go out (it is the node cut).
    fn takes(&self, node: usize) -> bool {
        node == self.node && self.cut()
    }
}

/// A call on the node a [`Loss`] takes, until it is recorded.
struct Flight<'a>(Option<&'a Loss>);

impl<'a> Flight<'a> {
    fn on(loss: Option<&'a Loss>, node: usize) -> Flight<'a> {
        let loss = loss.filter(|l| l.node == node);
        if let Some(l) = loss {
            l.in_flight
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Flight(loss)
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        if let Some(l) = self.0 {
            l.in_flight
                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// The victim's network config: its datastore reached through relays
/// ([`relay::Relay`]) that the fault cuts.
fn relayed_config(
    o: &Options,
    node: &SimNode,
    conf: &mut Value,
) -> Result<Vec<relay::Relay>, Failure> {
    let before = relay::RELAYS.lock().unwrap().len();
    if o.backend == "etcd" {
        let endpoints = var("TESTBED_CALICO_ETCD_ENDPOINTS")?;
        let relayed: Vec<String> = endpoints
            .split(',')
            .map(|e| relay::relayed_url(e.trim()))
            .collect::<Result<_, _>>()?;
        conf["etcd_endpoints"] = json!(relayed.join(","));
    } else {
        let kubeconfig = std::fs::read_to_string(var("CALICO_CNI_KUBECONFIG")?)?;
        let mut text = String::new();
        let json = serde_json::from_str::<Value>(&kubeconfig).ok();
        if let Some(mut json) = json.clone() {
            // (The test bed's: JSON.)
            for cluster in json["clusters"].as_array_mut().into_iter().flatten() {
                let server = cluster["cluster"]["server"].as_str().unwrap_or_default();
                let relayed = relay::relayed_url(server)?;
                cluster["cluster"]["server"] = json!(relayed);
            }
            text = json.to_string();
        }
        for line in kubeconfig.lines().filter(|_| json.is_none()) {
            match line.trim_start().strip_prefix("server:") {
                Some(url) => {
                    let relayed = relay::relayed_url(url.trim().trim_matches('"'))?;
                    let indent = &line[..line.len() - line.trim_start().len()];
                    text.push_str(&format!("{indent}server: {relayed}\n"));
                }
                None => {
                    text.push_str(line);
                    text.push('\n');
                }
            }
        }
        let path = node.dir.join("relayed.kubeconfig");
        std::fs::write(&path, text)?;
        conf["kubernetes"]["kubeconfig"] = json!(path);
    }
    Ok(relay::RELAYS.lock().unwrap()[before..].to_vec())
}

/// One simulated node: its name and its own directory (state, lock, log).
#[derive(Clone)]
struct SimNode {
    name: String,
    dir: PathBuf,
}

/// The network config a node's plugin gets (the `calico` plugin's, whose
/// IPAM section calico-ipam reads).
fn network_config(o: &Options, node: &SimNode, pool: &IpNet) -> Result<Value, Failure> {
    let mut conf = json!({
        "cniVersion": "1.0.0",
        "name": format!("sim-{}", o.run),
        "type": "calico",
        "nodename": node.name,
        "nodename_file_optional": true,
        // (CLUSTER_SCALE_LOG_LEVEL=debug: each call's steps in the
        // node's cni.log, at a cost in CPU.)
        "log_level": std::env::var("CLUSTER_SCALE_LOG_LEVEL").unwrap_or_else(|_| "warning".into()),
        "log_file_path": node.dir.join("cni.log"),
        "local_datastore_path": node.dir.join("state/calico.db"),
        "ipam_lock_file": node.dir.join("ipam.lock"),
        "ipam": {"type": "calico-ipam", "ipv4_pools": [pool.to_string()]},
    });
    if o.backend == "etcd" {
        conf["datastore_type"] = json!("etcdv3");
        conf["etcd_endpoints"] = json!(var("TESTBED_CALICO_ETCD_ENDPOINTS")?);
        conf["etcd_ca_cert_file"] = json!(var("TESTBED_CALICO_ETCD_CA")?);
        conf["etcd_cert_file"] = json!(var("TESTBED_CALICO_ETCD_CERT")?);
        conf["etcd_key_file"] = json!(var("TESTBED_CALICO_ETCD_KEY")?);
    } else {
        conf["datastore_type"] = json!("kubernetes");
        conf["kubernetes"] = json!({"kubeconfig": var("CALICO_CNI_KUBECONFIG")?});
    }
    Ok(conf)
}

/// What one call did.
#[derive(Debug, Clone)]
struct Call {
    add: bool,
    node: usize,
    cid: String,
    started: Instant,
    ended: Instant,
    ok: bool,
    killed: bool,
    ip: Option<std::net::IpAddr>,
    error: String,
}

/// A pod the churn holds.
#[derive(Debug, Clone)]
struct Live {
    node: usize,
    cid: String,
}

/// The plugin processes running, with their nodes (a node lost takes its
/// processes with it).
static RUNNING: Mutex<Vec<(u32, usize)>> = Mutex::new(Vec::new());

/// SIGKILLs the plugin processes running on `node`.
fn kill_node_processes(node: usize) -> usize {
    let running = RUNNING.lock().unwrap();
    let mut killed = 0;
    for (pid, _) in running.iter().filter(|(_, n)| *n == node) {
        let pid = nix::unistd::Pid::from_raw(*pid as i32);
        if nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).is_ok() {
            killed += 1;
        }
    }
    killed
}

/// One exec of calico-ipam (`binary`) on node `node`, killed after
/// `kill_after` if given.
fn exec(
    binary: &Path,
    node: usize,
    verb: &str,
    cid: &str,
    conf: &str,
    kill_after: Option<Duration>,
) -> (bool, bool, String) {
    let mut child = Command::new(binary)
        .env_clear()
        .env("CNI_COMMAND", verb)
        .env("CNI_CONTAINERID", cid)
        .env("CNI_NETNS", "/var/run/netns/cluster-scale")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", binary.parent().unwrap())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("exec calico-ipam");
    let pid = child.id();
    RUNNING.lock().unwrap().push((pid, node));
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        let _ = stdin.write_all(conf.as_bytes());
    }
    let mut killed = false;
    if let Some(after) = kill_after {
        let end = Instant::now() + after;
        while Instant::now() < end {
            if child.try_wait().ok().flatten().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        if child.try_wait().ok().flatten().is_none() {
            let _ = child.kill();
            killed = true;
        }
    }
    let out = child.wait_with_output().expect("wait");
    RUNNING.lock().unwrap().retain(|(p, _)| *p != pid);
    (
        out.status.success(),
        killed,
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// A small deterministic generator (the run is not about randomness).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// The churn with one binary: `o.ops` calls, `o.concurrency` at once.
/// Every call recorded; the pods live at its end returned, and on etcd
/// its request counters read just before a fault (a member restarted
/// counts from zero again: [`etcd_difference`]).
type EtcdCounts = BTreeMap<(String, String), usize>;

fn churn(
    o: &Options,
    binary: &Path,
    nodes: &[SimNode],
    confs: &[String],
    loss: Option<&Loss>,
) -> (Vec<Call>, Vec<Live>, Option<EtcdCounts>) {
    let before_fault: Mutex<Option<EtcdCounts>> = Mutex::default();
    let live: Arc<Mutex<Vec<Live>>> = Arc::default();
    let calls: Arc<Mutex<Vec<Call>>> = Arc::default();
    let issued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seq = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let late = std::sync::atomic::AtomicUsize::new(0);
    let target = o.nodes * o.pods;
    let t0 = Instant::now();
    std::thread::scope(|s| {
        if let Some(loss) = loss {
            let (issued, live, calls, seq) = (&issued, &live, &calls, &seq);
            s.spawn(move || {
                while issued.load(std::sync::atomic::Ordering::Relaxed) < o.ops / 2 {
                    std::thread::sleep(Duration::from_millis(10));
                }
                lose_node(o, binary, confs, loss, live, calls, seq);
            });
        }
        if let Some(fault) = o.fault.as_ref().filter(|f| *f != BLACKHOLE) {
            let (issued, before_fault) = (&issued, &before_fault);
            s.spawn(move || {
                while issued.load(std::sync::atomic::Ordering::Relaxed) < o.ops / 2 {
                    std::thread::sleep(Duration::from_millis(10));
                }
                if o.backend == "etcd" {
                    *before_fault.lock().unwrap() = etcd_requests();
                }
                let t0 = Instant::now();
                let out = Command::new("bash")
                    .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/testbed.sh"))
                    .arg(fault)
                    .output()
                    .expect("scripts/testbed.sh");
                eprintln!(
                    "cluster_scale: fault {fault} at call {} took {} ms: {}",
                    o.ops / 2,
                    t0.elapsed().as_millis(),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            });
        }
        for t in 0..o.concurrency {
            let (live, calls, issued, seq, late) = (&live, &calls, &issued, &seq, &late);
            s.spawn(move || {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((t as u64 + 1) * 0x1234_5678_9ABC));
                loop {
                    let n = issued.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if n >= o.ops {
                        break;
                    }
                    if let Some(rate) = o.rate {
                        // Call n starts at n/rate s (late when every slot
                        // was busy then: counted).
                        let at = t0 + Duration::from_secs_f64(n as f64 / rate);
                        let now = Instant::now();
                        if at > now {
                            std::thread::sleep(at - now);
                        } else if now - at > Duration::from_millis(50) {
                            late.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                    // ADD while the cluster is below its aim (and now and
                    // then above it), else DEL a live pod.
                    let pod = {
                        let mut l = live.lock().unwrap();
                        let add = l.is_empty()
                            || (l.len() < target && rng.below(4) != 0)
                            || rng.below(8) == 0;
                        if add {
                            None
                        } else {
                            let i = rng.below(l.len());
                            Some(l.swap_remove(i))
                        }
                    };
                    let kill = |rng: &mut Rng| {
                        (o.kill_every > 0 && rng.below(o.kill_every) == 0)
                            .then(|| Duration::from_millis(1 + rng.below(40) as u64))
                    };
                    match pod {
                        None => {
                            // (No pod is scheduled to the node cut.)
                            let node = match loss {
                                Some(l) if l.cut() => rng.below(nodes.len() - 1),
                                _ => rng.below(nodes.len()),
                            };
                            let cid = format!(
                                "sim{}{:08x}",
                                o.run,
                                seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                            );
                            let flight = Flight::on(loss, node);
                            let started = Instant::now();
                            let (ok, killed, out) =
                                exec(binary, node, "ADD", &cid, &confs[node], kill(&mut rng));
                            let ended = Instant::now();
                            let ip = ok
                                .then(|| serde_json::from_str::<Value>(&out).ok())
                                .flatten()
                                .and_then(|r| r["ips"][0]["address"].as_str().map(str::to_string))
                                .and_then(|a| a.parse::<IpNet>().ok())
                                .map(|n| n.addr());
                            calls.lock().unwrap().push(Call {
                                add: true,
                                node,
                                cid: cid.clone(),
                                started,
                                ended,
                                ok: ok && ip.is_some(),
                                killed,
                                ip,
                                error: if ok { String::new() } else { out },
                            });
                            // A failed or killed ADD is DELed by the runtime
                            // (kubelet tears the sandbox down): kept live so
                            // that a DEL comes for it.
                            let mut l = live.lock().unwrap();
                            match loss {
                                Some(loss) if loss.takes(node) => {
                                    loss.stranded.lock().unwrap().push(Live { node, cid })
                                }
                                _ => l.push(Live { node, cid }),
                            }
                            drop(flight);
                        }
                        Some(pod) => {
                            del_until_done(o, binary, confs, &pod, calls, &mut rng, kill, loss)
                        }
                    }
                }
            });
        }
    });
    let late = late.into_inner();
    if late > 0 {
        eprintln!(
            "cluster_scale: {late} of {} calls started over 50 ms late (all {} slots busy): raise --concurrency",
            o.ops, o.concurrency
        );
    }
    let live = std::mem::take(&mut *live.lock().unwrap());
    (
        Arc::try_unwrap(calls).unwrap().into_inner().unwrap(),
        live,
        before_fault.into_inner().unwrap(),
    )
}

/// `--fault blackhole`: the node's link cut (its pods stranded), its
/// kubelet's ADDs hanging meanwhile (one after another, as kubelet
/// retries); after `--hole-seconds` the node lost: its processes killed,
/// its Node deleted and its IPAM released ([`node_release`]).
fn lose_node(
    o: &Options,
    binary: &Path,
    confs: &[String],
    loss: &Loss,
    live: &Mutex<Vec<Live>>,
    calls: &Mutex<Vec<Call>>,
    seq: &std::sync::atomic::AtomicUsize,
) {
    let cut_at = Instant::now();
    {
        let mut l = live.lock().unwrap();
        loss.state.store(1, std::sync::atomic::Ordering::Relaxed);
        for r in &loss.relays {
            r.hole(true);
        }
        let (gone, stay): (Vec<Live>, Vec<Live>) = l.drain(..).partition(|p| p.node == loss.node);
        *l = stay;
        loss.stranded.lock().unwrap().extend(gone);
    }
    let end = cut_at + Duration::from_secs(o.hole_seconds);
    let mut hung = 0;
    while Instant::now() < end {
        let cid = format!(
            "sim{}{:08x}",
            o.run,
            seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let started = Instant::now();
        let left = end.saturating_duration_since(started);
        let (ok, killed, out) = exec(
            binary,
            loss.node,
            "ADD",
            &cid,
            &confs[loss.node],
            Some(left),
        );
        hung += 1;
        calls.lock().unwrap().push(Call {
            add: true,
            node: loss.node,
            cid: cid.clone(),
            started,
            ended: Instant::now(),
            ok: false,
            killed,
            ip: None,
            error: if ok {
                format!("answered through the hole: {out}")
            } else {
                out
            },
        });
        loss.stranded.lock().unwrap().push(Live {
            node: loss.node,
            cid,
        });
    }
    loss.state.store(2, std::sync::atomic::Ordering::Relaxed);
    let killed = kill_node_processes(loss.node);
    for r in &loss.relays {
        r.close();
    }
    // Its calls killed, their pods recorded as stranded before the release.
    while loss.in_flight.load(std::sync::atomic::Ordering::SeqCst) > 0 {
        kill_node_processes(loss.node);
        std::thread::sleep(Duration::from_millis(10));
    }
    let released_at = Instant::now();
    *loss.released_at.lock().unwrap() = Some(released_at);
    let network = format!("sim-{}", o.run);
    let handles: Vec<String> = loss
        .stranded
        .lock()
        .unwrap()
        .iter()
        .map(|p| format!("{network}.{}", p.cid))
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let released = rt.block_on(async {
        let store = admin_store(&o.backend).await?;
        let admin = admin_client(o).await?;
        delete_node(store.as_ref(), admin.as_ref(), &loss.name).await?;
        node_release::release_node(store.as_ref(), &loss.name, &handles).await
    });
    eprintln!(
        "cluster_scale: node {} black-holed {} s ({hung} ADDs hung meanwhile, {killed} processes killed with it), then deleted and released in {} ms: {released:?}",
        loss.name,
        o.hole_seconds,
        released_at.elapsed().as_millis()
    );
}

/// Every pod still live DELed (until each DEL succeeds), recorded in
/// `calls`.
fn del_all(o: &Options, binary: &Path, confs: &[String], live: &[Live], calls: &mut Vec<Call>) {
    let recorded = Mutex::new(std::mem::take(calls));
    let mut rng = Rng(42);
    for pod in live {
        del_until_done(o, binary, confs, pod, &recorded, &mut rng, |_| None, None);
    }
    *calls = recorded.into_inner().unwrap();
}

/// Live pods whose address is not in exactly one block allocation with
/// the pod's handle (`<network>.<container>`); a pod whose ADD failed or
/// was killed counts if it holds an allocation anyway (it must be the one
/// its handle names). Under `--strict-affinity`, also any address in a
/// block not affine to its pod's node.
async fn misallocated(
    o: &Options,
    store: &dyn Store,
    pool: &IpNet,
    calls: &[Call],
    live: &[Live],
) -> Result<Vec<String>, Failure> {
    let answered: HashMap<&str, std::net::IpAddr> = calls
        .iter()
        .filter(|c| c.add && c.ok)
        .map(|c| (c.cid.as_str(), c.ip.unwrap()))
        .collect();
    // Every allocation in the pool: address → handles.
    let mut held: BTreeMap<std::net::IpAddr, Vec<String>> = BTreeMap::new();
    let mut strict_broken = Vec::new();
    for b in store.list::<IpamBlock>("", &ListFilter::All).await? {
        let Ok(cidr) = b.spec.cidr.parse::<IpNet>() else {
            continue;
        };
        if !pool.contains(&cidr) {
            continue;
        }
        let hosts: Vec<std::net::IpAddr> = match cidr {
            IpNet::V4(c) => (0..(1u32 << (32 - c.prefix_len())))
                .map(|i| std::net::IpAddr::V4((u32::from(c.network()) + i).into()))
                .collect(),
            IpNet::V6(_) => Vec::new(),
        };
        for (ordinal, a) in b.spec.allocations.iter().enumerate() {
            let Some(index) = a else { continue };
            let attribute = b.spec.attributes.get(*index);
            let handle = attribute.and_then(|at| at.handle_id.clone());
            // strictAffinity: no address from another node's block.
            let node = attribute.and_then(|at| at.secondary.get("node"));
            if o.strict_affinity
                && let Some(node) = node
                && b.spec.affinity.as_deref() != Some(&format!("host:{node}"))
            {
                strict_broken.push(format!(
                    "{} of {node} in block {} (affinity {:?}) under strictAffinity",
                    hosts[ordinal], b.spec.cidr, b.spec.affinity
                ));
            }
            held.entry(hosts[ordinal])
                .or_default()
                .push(handle.unwrap_or_default());
        }
    }
    let network = format!("sim-{}", o.run);
    let mut wrong = strict_broken;
    for pod in live {
        let handle = format!("{network}.{}", pod.cid);
        match answered.get(pod.cid.as_str()) {
            Some(ip) => match held.get(ip).map(Vec::as_slice) {
                Some([h]) if *h == handle => {}
                other => wrong.push(format!("{} ({ip}): allocations {other:?}", pod.cid)),
            },
            None => {
                let holding: Vec<_> = held
                    .iter()
                    .filter(|(_, hs)| hs.contains(&handle))
                    .map(|(ip, _)| ip)
                    .collect();
                if holding.len() > 1 {
                    wrong.push(format!("{} (no answer): allocations {holding:?}", pod.cid));
                }
            }
        }
    }
    Ok(wrong)
}

/// Problems `ipam check` (ours, then calicoctl's) reports for addresses of
/// the pool: the lines naming one.
fn ipam_checks(
    o: &Options,
    pool: &IpNet,
    conflist: &Path,
) -> Result<(Vec<String>, Vec<String>), Failure> {
    let in_pool = |text: &str| -> Vec<String> {
        text.lines()
            // (Each block is listed with its CIDR; problems name addresses.)
            .filter(|l| !l.contains("IPAM block") && !l.trim_start().starts_with("Found"))
            .filter(|l| {
                // (A bare address, not a CIDR: the pool's own line.)
                l.split_whitespace()
                    .filter_map(|w| {
                        w.trim_matches(|c: char| !(c.is_ascii_digit() || c == '.'))
                            .parse::<std::net::Ipv4Addr>()
                            .ok()
                            .filter(|_| !w.contains('/'))
                    })
                    .any(|ip| pool.contains(&std::net::IpAddr::V4(ip)))
            })
            .map(str::to_string)
            .collect()
    };
    let ours = Command::new(&o.ours)
        .args(["ipam", "check", "--show-problem-ips", "--config"])
        .arg(conflist)
        .output()?;
    let calicoctl = Path::new(&var("PEERS_BIN")?).join("calico-v3.32.1/calicoctl");
    let mut cmd = Command::new(calicoctl);
    cmd.args([
        "ipam",
        "check",
        "--show-problem-ips",
        "--allow-version-mismatch",
    ])
    .env_clear()
    .env("KUBECONFIG", var("KUBECONFIG")?);
    if o.backend == "kdd" {
        cmd.env("DATASTORE_TYPE", "kubernetes");
    } else {
        cmd.env("DATASTORE_TYPE", "etcdv3")
            .env("ETCD_ENDPOINTS", var("TESTBED_CALICO_ETCD_ENDPOINTS")?)
            .env("ETCD_CA_CERT_FILE", var("TESTBED_CALICO_ETCD_CA")?)
            .env("ETCD_CERT_FILE", var("TESTBED_CALICO_ETCD_CERT")?)
            .env("ETCD_KEY_FILE", var("TESTBED_CALICO_ETCD_KEY")?);
    }
    let theirs = cmd.output()?;
    for (who, out) in [
        ("calico ipam check", &ours),
        ("calicoctl ipam check", &theirs),
    ] {
        if !out.status.success() {
            return Err(format!(
                "{who}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
    }
    Ok((
        in_pool(&String::from_utf8_lossy(&ours.stdout)),
        in_pool(&String::from_utf8_lossy(&theirs.stdout)),
    ))
}

/// DELs `pod` until a DEL succeeds (as kubelet retries), each recorded;
/// a pod of the node cut is left to go with it.
#[allow(clippy::too_many_arguments)]
fn del_until_done(
    _o: &Options,
    binary: &Path,
    confs: &[String],
    pod: &Live,
    calls: &Mutex<Vec<Call>>,
    rng: &mut Rng,
    kill: impl Fn(&mut Rng) -> Option<Duration>,
    loss: Option<&Loss>,
) {
    for attempt in 0.. {
        let _flight = Flight::on(loss, pod.node);
        if let Some(loss) = loss.filter(|l| l.takes(pod.node)) {
            loss.stranded.lock().unwrap().push(pod.clone());
            return;
        }
        let started = Instant::now();
        let kill_after = if attempt < 3 { kill(rng) } else { None };
        let (ok, killed, out) = exec(
            binary,
            pod.node,
            "DEL",
            &pod.cid,
            &confs[pod.node],
            kill_after,
        );
        calls.lock().unwrap().push(Call {
            add: false,
            node: pod.node,
            cid: pod.cid.clone(),
            started,
            ended: Instant::now(),
            ok,
            killed,
            ip: None,
            error: if ok { String::new() } else { out },
        });
        if ok {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Pairs of pods that held one address at once: a pod holds its address
/// from its ADD's answer to its first DEL's start (a DEL may release before
/// it answers), so a second ADD answered with that address in between is a
/// duplicate.
fn duplicates(calls: &[Call], released: &[(String, Instant)]) -> Vec<String> {
    let mut first_del: HashMap<&str, Instant> = HashMap::new();
    // (A pod lost with its node holds its address until the release.)
    for (cid, at) in released {
        first_del.insert(cid, *at);
    }
    for c in calls.iter().filter(|c| !c.add) {
        first_del
            .entry(&c.cid)
            .and_modify(|t| *t = (*t).min(c.started))
            .or_insert(c.started);
    }
    let mut by_ip: BTreeMap<std::net::IpAddr, Vec<(Instant, Instant, &str)>> = BTreeMap::new();
    for c in calls.iter().filter(|c| c.add && c.ok) {
        let until = first_del
            .get(c.cid.as_str())
            .copied()
            .unwrap_or_else(Instant::now);
        by_ip
            .entry(c.ip.unwrap())
            .or_default()
            .push((c.ended, until, &c.cid));
    }
    let mut found = Vec::new();
    for (ip, mut holds) in by_ip {
        holds.sort();
        for w in holds.windows(2) {
            let ((_, until, a), (from, _, b)) = (w[0], w[1]);
            if from < until {
                found.push(format!("{ip}: {a} and {b}"));
            }
        }
    }
    found
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// What the run left: addresses allocated in the pool's blocks, handles of
/// the run, and the blocks claimed.
async fn left(
    o: &Options,
    store: &dyn Store,
    pool: &IpNet,
) -> Result<(usize, Vec<String>, usize), Failure> {
    let blocks: Vec<IpamBlock> = store
        .list::<IpamBlock>("", &ListFilter::All)
        .await?
        .into_iter()
        .filter(|b| {
            b.spec
                .cidr
                .parse::<IpNet>()
                .is_ok_and(|c| pool.contains(&c))
        })
        .collect();
    let allocated = blocks
        .iter()
        .map(|b| b.spec.allocations.iter().filter(|a| a.is_some()).count())
        .sum();
    let prefix = format!("sim-{}.", o.run);
    let handles: Vec<String> = store
        .list_names(IpamHandle::KIND, "")
        .await?
        .into_iter()
        .filter(|h| h.starts_with(&prefix))
        .collect();
    Ok((allocated, handles, blocks.len()))
}

/// Removes the run's blocks, affinities and handles (between binaries, and
/// at the end).
async fn clear(
    o: &Options,
    store: &dyn Store,
    pool: &IpNet,
    nodes: &[SimNode],
) -> Result<(), Failure> {
    let none = Precondition::default();
    for b in store.list::<IpamBlock>("", &ListFilter::All).await? {
        if b.spec
            .cidr
            .parse::<IpNet>()
            .is_ok_and(|c| pool.contains(&c))
        {
            store
                .delete_object(IpamBlock::KIND, "", &b.metadata.name, &none)
                .await?;
        }
    }
    let names: std::collections::HashSet<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    for a in store.list::<BlockAffinity>("", &ListFilter::All).await? {
        if names.contains(a.spec.node.as_str()) {
            store
                .delete_object(BlockAffinity::KIND, "", &a.metadata.name, &none)
                .await?;
        }
    }
    let prefix = format!("sim-{}.", o.run);
    for h in store.list_names(IpamHandle::KIND, "").await? {
        if h.starts_with(&prefix) {
            store.delete_object(IpamHandle::KIND, "", &h, &none).await?;
        }
    }
    Ok(())
}

/// A /22 (or the block size's share) of 100.96.0.0/12 no pool or block
/// overlaps.
async fn free_pool(store: &dyn Store) -> Result<IpNet, Failure> {
    let mut taken: Vec<IpNet> = Vec::new();
    for p in store.list::<IpPool>("", &ListFilter::All).await? {
        taken.extend(p.spec.cidr.parse::<IpNet>().ok());
    }
    for b in store.list::<IpamBlock>("", &ListFilter::All).await? {
        taken.extend(b.spec.cidr.parse::<IpNet>().ok());
    }
    let space: IpNet = "100.96.0.0/12".parse()?;
    space
        .subnets(22)?
        .find(|c| {
            !taken
                .iter()
                .any(|t| t.contains(&c.network()) || c.contains(&t.network()))
        })
        .ok_or_else(|| "no free /22 in 100.96.0.0/12".into())
}

/// The test bed's audit log: the CNI identity's requests received in
/// [since, until], by verb and resource, and how many were answered 409.
fn audited(
    since: std::time::SystemTime,
    until: std::time::SystemTime,
) -> Option<(usize, BTreeMap<String, usize>, usize)> {
    // The log and its rotated backup (`audit-<time>.log`): a window may
    // straddle a rotation.
    let logs = Path::new(&std::env::var("TESTBED_DIR").ok()?).join("logs");
    let mut text = String::new();
    for entry in std::fs::read_dir(logs).ok()?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("audit") && name.ends_with(".log") {
            text.push_str(&std::fs::read_to_string(entry.path()).ok()?);
            text.push('\n');
        }
    }
    let (mut total, mut by, mut conflicts) = (0, BTreeMap::new(), 0);
    let mut seen = std::collections::HashSet::new();
    let unix = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    let (since, until) = (unix(since), unix(until));
    for line in text.lines() {
        let Ok(e) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if !e["user"]["username"]
            .as_str()
            .is_some_and(|u| u.ends_with(":calico-cni-plugin"))
        {
            continue;
        }
        let Some(at) = e["requestReceivedTimestamp"]
            .as_str()
            .and_then(rfc3339_seconds)
        else {
            continue;
        };
        if at < since
            || at > until
            || !seen.insert(e["auditID"].as_str().unwrap_or_default().to_string())
        {
            continue;
        }
        total += 1;
        let key = format!(
            "{} {}",
            e["verb"].as_str().unwrap_or_default(),
            e["objectRef"]["resource"].as_str().unwrap_or("-")
        );
        *by.entry(key.clone()).or_insert(0) += 1;
        if e["responseStatus"]["code"] == 409 {
            conflicts += 1;
            // (Which requests lost: a create of what exists, or an update
            // or delete on a stale resourceVersion.)
            *by.entry(format!("409 on {key}")).or_insert(0) += 1;
        }
    }
    Some((total, by, conflicts))
}

/// The etcd cluster's KV requests so far (`grpc_server_handled_total` of
/// `etcdserverpb.KV`), per member and method: the run's are the difference
/// (the cluster serves Calico's datastore alone; a member restarted
/// counts from zero again).
fn etcd_requests() -> Option<EtcdCounts> {
    let mut by = BTreeMap::new();
    for endpoint in std::env::var("TESTBED_CALICO_ETCD_ENDPOINTS")
        .ok()?
        .split(',')
    {
        let out = Command::new("curl")
            .args(["-s", "--max-time", "10", "--cacert"])
            .arg(std::env::var("TESTBED_CALICO_ETCD_CA").ok()?)
            .arg("--cert")
            .arg(std::env::var("TESTBED_CALICO_ETCD_CERT").ok()?)
            .arg("--key")
            .arg(std::env::var("TESTBED_CALICO_ETCD_KEY").ok()?)
            .arg(format!("{endpoint}/metrics"))
            .output()
            .ok()?;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some(started) = line.strip_prefix("process_start_time_seconds ") {
                // (Tells a member restarted between two readings.)
                let started: f64 = started.trim().parse().ok()?;
                by.insert(
                    (endpoint.to_string(), STARTED.to_string()),
                    started as usize,
                );
                continue;
            }
            if !line.starts_with("grpc_server_handled_total{")
                || !line.contains("grpc_service=\"etcdserverpb.KV\"")
            {
                continue;
            }
            let method = line.split("grpc_method=\"").nth(1)?.split('"').next()?;
            let count: f64 = line.rsplit(' ').next()?.parse().ok()?;
            *by.entry((endpoint.to_string(), method.to_string()))
                .or_insert(0) += count as usize;
        }
    }
    Some(by)
}

/// [`etcd_requests`]' key of a member's process start time.
const STARTED: &str = "@started";

/// The requests between two readings of [`etcd_requests`], by method; a
/// member restarted between them (its start time moved) served what it
/// had by `mid` (read just before the fault), then all it counts in
/// `after` (what it served between `mid` and its kill is not known: a few
/// requests). Without `mid` a restarted member's first counts were lost:
/// the etcd runs with the leader killed of 2026-12-07 undercounted.
fn etcd_difference(
    before: &EtcdCounts,
    mid: Option<&EtcdCounts>,
    after: EtcdCounts,
) -> BTreeMap<String, usize> {
    let started = |c: &EtcdCounts, endpoint: &str| {
        c.get(&(endpoint.to_string(), STARTED.to_string())).copied()
    };
    let mut by = BTreeMap::new();
    for (key, n) in &after {
        if key.1 == STARTED {
            continue;
        }
        let n = *n;
        let was = before.get(key).copied().unwrap_or(0);
        let restarted = started(&after, &key.0) != started(before, &key.0);
        let run = match (restarted, mid.and_then(|m| m.get(key))) {
            (true, Some(then)) => then.saturating_sub(was) + n,
            (true, None) => n,
            (false, _) => n.saturating_sub(was),
        };
        if run > 0 {
            *by.entry(key.1.clone()).or_insert(0) += run;
        }
    }
    by
}

/// Seconds since the epoch of an RFC 3339 UTC time with fractions.
fn rfc3339_seconds(s: &str) -> Option<f64> {
    let (date, time) = s.trim_end_matches('Z').split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut t = time.split(':');
    let (h, min, sec) = (
        t.next()?.parse::<f64>().ok()?,
        t.next()?.parse::<f64>().ok()?,
        t.next()?.parse::<f64>().ok()?,
    );
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days as f64 * 86_400.0 + h * 3600.0 + min * 60.0 + sec)
}

/// One binary's row.
struct Row {
    who: String,
    adds: usize,
    dels: usize,
    failed_adds: usize,
    killed: usize,
    add_ms: (f64, f64),
    del_ms: (f64, f64),
    per_second: f64,
    requests: Option<(usize, BTreeMap<String, usize>, usize)>,
    blocks: usize,
    duplicates: Vec<String>,
    leaked: (usize, usize),
    live: usize,
    misallocated: Vec<String>,
    /// Problem lines naming the pool's addresses: ours, calicoctl's.
    checks: (Vec<String>, Vec<String>),
    /// The IPAM objects stored at the churn's end ([`stored`]).
    stored: Option<[(usize, usize); 3]>,
}

async fn run_one(
    o: &Options,
    who: &str,
    store: &dyn Store,
    pool: &IpNet,
    nodes: &[SimNode],
) -> Result<Row, Failure> {
    let bin = std::env::temp_dir().join(format!("cluster-scale-{}-{who}", o.run));
    std::fs::create_dir_all(&bin)?;
    let target = match who {
        "ours" => o.ours.clone(),
        _ => Path::new(&var("PEERS_BIN")?).join("calico-v3.32.1/calico-ipam"),
    };
    let binary = bin.join("calico-ipam");
    let _ = std::fs::remove_file(&binary);
    std::os::unix::fs::symlink(&target, &binary)?;
    let mut confs: Vec<String> = nodes
        .iter()
        .map(|n| network_config(o, n, pool).map(|c| c.to_string()))
        .collect::<Result<_, _>>()?;
    let loss = match o.fault.as_deref() {
        Some(BLACKHOLE) => {
            let victim = nodes.len() - 1;
            let node = &nodes[victim];
            // (Lost in the other binary's run: back, with nothing.)
            let admin = admin_client(o).await?;
            let _ = create_node(o, store, admin.as_ref(), &node.name).await;
            let _ = std::fs::remove_dir_all(node.dir.join("state"));
            std::fs::create_dir_all(node.dir.join("state"))?;
            let mut conf = network_config(o, node, pool)?;
            let relays = relayed_config(o, node, &mut conf)?;
            confs[victim] = conf.to_string();
            Some(Arc::new(Loss {
                node: victim,
                name: node.name.clone(),
                state: Default::default(),
                stranded: Mutex::default(),
                released_at: Mutex::default(),
                in_flight: Default::default(),
                relays,
            }))
        }
        _ => None,
    };
    let etcd_before = (o.backend == "etcd").then(etcd_requests).flatten();
    let since = std::time::SystemTime::now();
    let t0 = Instant::now();
    let (mut calls, live, etcd_before_fault) = {
        let (o, binary, nodes, confs) = (o.clone(), binary.clone(), nodes.to_vec(), confs.clone());
        let loss = loss.clone();
        tokio::task::spawn_blocking(move || churn(&o, &binary, &nodes, &confs, loss.as_deref()))
            .await?
    };
    // The pods lost with their node, and when their addresses went.
    let released: Vec<(String, Instant)> = match &loss {
        Some(l) => {
            let at = l.released_at.lock().unwrap().unwrap_or_else(Instant::now);
            l.stranded
                .lock()
                .unwrap()
                .iter()
                .map(|p| (p.cid.clone(), at))
                .collect()
        }
        None => Vec::new(),
    };
    let took = t0.elapsed();
    let until = std::time::SystemTime::now();
    // The pods live at the churn's end, each in its one allocation; the
    // blocks claimed.
    let wrong = misallocated(o, store, pool, &calls, &live).await?;
    let (_, _, blocks) = left(o, store, pool).await?;
    let kept = stored(o, pool);
    let live_pods = live.len();
    calls = {
        let (o, binary, confs) = (o.clone(), binary.clone(), confs.clone());
        tokio::task::spawn_blocking(move || {
            del_all(&o, &binary, &confs, &live, &mut calls);
            calls
        })
        .await?
    };
    let (allocated, handles, _) = left(o, store, pool).await?;
    for h in handles.iter().take(5) {
        eprintln!("cluster_scale {who}: handle left: {h}");
    }
    let handles = handles.len();
    let conflist = nodes[0].dir.join("check.conflist");
    let mut one: Value = serde_json::from_str(&confs[0])?;
    let name = one["name"].clone();
    one.as_object_mut().unwrap().remove("name");
    // (The check reads what the CNI's identity may not: the admin's.)
    if o.backend == "kdd" {
        one["kubernetes"]["kubeconfig"] = json!(var("KUBECONFIG")?);
    }
    std::fs::write(
        &conflist,
        json!({"cniVersion": "1.0.0", "name": name, "plugins": [one]}).to_string(),
    )?;
    let checks = ipam_checks(o, pool, &conflist)?;
    let ms = |add: bool| {
        let mut v: Vec<f64> = calls
            .iter()
            .filter(|c| c.add == add && c.ok)
            .map(|c| (c.ended - c.started).as_secs_f64() * 1e3)
            .collect();
        v.sort_by(f64::total_cmp);
        (percentile(&v, 0.5), percentile(&v, 0.99))
    };
    if std::env::var_os("CLUSTER_SCALE_SLOWEST").is_some() {
        // The slowest ADDs, with when they started in the run.
        let first = calls.iter().map(|c| c.started).min();
        let mut adds: Vec<&Call> = calls.iter().filter(|c| c.add && c.ok).collect();
        adds.sort_by_key(|c| std::cmp::Reverse(c.ended - c.started));
        for c in adds.iter().take(20) {
            eprintln!(
                "cluster_scale {who}: slow ADD {} on node {} at {:.1} s: {:.1} ms",
                c.cid,
                c.node,
                first.map_or(0.0, |f| (c.started - f).as_secs_f64()),
                (c.ended - c.started).as_secs_f64() * 1e3
            );
        }
    }
    let failed: Vec<&Call> = calls
        .iter()
        .filter(|c| c.add && !c.ok && !c.killed)
        .collect();
    for c in failed.iter().take(3) {
        eprintln!(
            "cluster_scale {who}: ADD {} on node {} failed: {}",
            c.cid,
            c.node,
            c.error.trim()
        );
    }
    let _ = std::fs::remove_dir_all(&bin);
    Ok(Row {
        who: who.to_string(),
        adds: calls.iter().filter(|c| c.add).count(),
        dels: calls.iter().filter(|c| !c.add).count(),
        failed_adds: failed.len(),
        killed: calls.iter().filter(|c| c.killed).count(),
        add_ms: ms(true),
        del_ms: ms(false),
        per_second: calls.len() as f64 / took.as_secs_f64(),
        requests: match (o.backend.as_str(), etcd_before) {
            ("kdd", _) => audited(since, until),
            (_, Some(before)) => etcd_requests().map(|after| {
                let by = etcd_difference(&before, etcd_before_fault.as_ref(), after);
                // (etcd does not count a lost compare-and-swap apart.)
                (by.values().sum(), by, 0)
            }),
            _ => None,
        },
        blocks,
        duplicates: duplicates(&calls, &released),
        stored: kept,
        leaked: (allocated, handles),
        live: live_pods,
        misallocated: wrong,
        checks,
    })
}

/// Everything earlier runs left: pools `sim-…` with their blocks, the
/// affinities and handles of `sim-…`, the nodes `sim-…`.
async fn cleanup(o: &Options, store: &dyn Store) -> Result<(), Failure> {
    let none = Precondition::default();
    let pools: Vec<IpNet> = store
        .list::<IpPool>("", &ListFilter::All)
        .await?
        .into_iter()
        .filter(|p| p.metadata.name.starts_with("sim-"))
        .filter_map(|p| p.spec.cidr.parse().ok())
        .collect();
    println!("cleanup: {} pools of earlier runs: {pools:?}", pools.len());
    for b in store.list::<IpamBlock>("", &ListFilter::All).await? {
        let in_pool = b
            .spec
            .cidr
            .parse::<IpNet>()
            .is_ok_and(|c| pools.iter().any(|p| p.contains(&c)));
        let affine = b
            .spec
            .affinity
            .as_deref()
            .is_some_and(|a| a.starts_with("host:sim-"));
        if in_pool || affine {
            store
                .delete_object(IpamBlock::KIND, "", &b.metadata.name, &none)
                .await?;
        }
    }
    for a in store.list::<BlockAffinity>("", &ListFilter::All).await? {
        if a.spec.node.starts_with("sim-") {
            store
                .delete_object(BlockAffinity::KIND, "", &a.metadata.name, &none)
                .await?;
        }
    }
    for h in store.list_names(IpamHandle::KIND, "").await? {
        if h.starts_with("sim-") {
            store.delete_object(IpamHandle::KIND, "", &h, &none).await?;
        }
    }
    for p in store.list::<IpPool>("", &ListFilter::All).await? {
        if p.metadata.name.starts_with("sim-") {
            store
                .delete_object(IpPool::KIND, "", &p.metadata.name, &none)
                .await?;
        }
    }
    if o.backend == "kdd" {
        let k8s = K8sClient::new(
            &K8sConfig {
                kubeconfig: Some(var("KUBECONFIG")?.into()),
                ..K8sConfig::default()
            },
            deadline(),
        )
        .await?;
        for n in k8s
            .list_json(
                "Node",
                "/api/v1/nodes",
                Some("calico-cni.test/cluster-scale"),
                false,
            )
            .await?
        {
            let name = n["metadata"]["name"].as_str().unwrap_or_default();
            k8s.delete_json("Node", &format!("/api/v1/nodes/{name}"), None, None)
                .await?;
        }
    } else {
        for n in store.list_names(Node::KIND, "").await? {
            if n.starts_with("sim-") {
                store.delete_object(Node::KIND, "", &n, &none).await?;
            }
        }
    }
    Ok(())
}

/// On etcd, the objects calico-node's start-up makes and calicoctl reads
/// (ClusterInformation, KubeControllersConfiguration), if absent.
/// The run's IPAM objects as the datastore's etcd stores them (the API
/// server's etcd for the Kubernetes datastore): count and bytes of the
/// pool's blocks, the run's nodes' affinities, the run's handles. `None`
/// if etcd could not be read.
fn stored(o: &Options, pool: &IpNet) -> Option<[(usize, usize); 3]> {
    use base64::Engine as _;
    let kdd = o.backend == "kdd";
    let env = |kdd_name: &str, etcd_name: &str| var(if kdd { kdd_name } else { etcd_name }).ok();
    let etcdctl = Path::new(&var("PEERS_BIN").ok()?).join("etcdctl");
    let (endpoints, ca, cert, key) = (
        env("ETCD_ENDPOINTS", "TESTBED_CALICO_ETCD_ENDPOINTS")?,
        env("ETCD_CA_CERT_FILE", "TESTBED_CALICO_ETCD_CA")?,
        env("ETCD_CERT_FILE", "TESTBED_CALICO_ETCD_CERT")?,
        env("ETCD_KEY_FILE", "TESTBED_CALICO_ETCD_KEY")?,
    );
    let prefixes = match kdd {
        true => [
            "/registry/crd.projectcalico.org/ipamblocks/",
            "/registry/crd.projectcalico.org/blockaffinities/",
            "/registry/crd.projectcalico.org/ipamhandles/",
        ],
        false => [
            "/calico/ipam/v2/assignment/",
            "/calico/ipam/v2/host/",
            "/calico/ipam/v2/handle/",
        ],
    };
    let node_prefix = format!("sim-{}-", o.run);
    let handle_prefix = format!("sim-{}.", o.run);
    let mut found = [(0, 0); 3];
    for (i, prefix) in prefixes.iter().enumerate() {
        let out = Command::new(&etcdctl)
            .env_clear()
            .arg(format!("--endpoints={endpoints}"))
            .arg(format!("--cacert={ca}"))
            .arg(format!("--cert={cert}"))
            .arg(format!("--key={key}"))
            .args(["get", "--prefix", prefix, "-w", "json"])
            .output()
            .ok()?;
        let answer: Value = serde_json::from_slice(&out.stdout).ok()?;
        let b64 = |v: &Value| {
            base64::engine::general_purpose::STANDARD
                .decode(v.as_str().unwrap_or_default())
                .unwrap_or_default()
        };
        for kv in answer["kvs"].as_array().cloned().unwrap_or_default() {
            let (k, v) = (b64(&kv["key"]), b64(&kv["value"]));
            let key = String::from_utf8_lossy(&k);
            let value: Value = serde_json::from_slice(&v).unwrap_or_default();
            let spec = if kdd { &value["spec"] } else { &value };
            let ours = match i {
                0 => spec["cidr"]
                    .as_str()
                    .and_then(|c| c.parse::<IpNet>().ok())
                    .is_some_and(|c| pool.contains(&c)),
                1 if kdd => spec["node"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(&node_prefix)),
                1 => key.contains(&format!("/host/{node_prefix}")),
                _ if kdd => spec["handleID"]
                    .as_str()
                    .is_some_and(|h| h.starts_with(&handle_prefix)),
                _ => key.contains(&format!("/handle/{handle_prefix}")),
            };
            if ours {
                found[i].0 += 1;
                found[i].1 += k.len() + v.len();
            }
        }
    }
    Some(found)
}

fn ensure_etcd_defaults() -> Result<(), Failure> {
    let etcdctl = Path::new(&var("PEERS_BIN")?).join("etcdctl");
    let run = |args: &[&str]| -> Result<String, Failure> {
        let out = Command::new(&etcdctl)
            .env_clear()
            .arg(format!(
                "--endpoints={}",
                var("TESTBED_CALICO_ETCD_ENDPOINTS")?
            ))
            .arg(format!("--cacert={}", var("TESTBED_CALICO_ETCD_CA")?))
            .arg(format!("--cert={}", var("TESTBED_CALICO_ETCD_CERT")?))
            .arg(format!("--key={}", var("TESTBED_CALICO_ETCD_KEY")?))
            .args(args)
            .output()?;
        if !out.status.success() {
            return Err(
                format!("etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr)).into(),
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let v3 = "/calico/resources/v3/projectcalico.org";
    for (plural, kind, uid, spec) in [
        (
            "clusterinformations",
            "ClusterInformation",
            1,
            json!({"clusterGUID": "0123456789abcdef0123456789abcdef",
                   "clusterType": "k8s,bgp", "datastoreReady": true}),
        ),
        (
            "kubecontrollersconfigurations",
            "KubeControllersConfiguration",
            2,
            json!({"healthChecks": "Enabled", "logSeverityScreen": "Info",
                   "etcdV3CompactionPeriod": "10m",
                   "controllers": {"node": {"reconcilerPeriod": "5m", "leakGracePeriod": "15m"}}}),
        ),
    ] {
        let key = format!("{v3}/{plural}/default");
        if run(&["get", "--print-value-only", &key])?.trim().is_empty() {
            let object = json!({"kind": kind, "apiVersion": "projectcalico.org/v3",
                "metadata": {"name": "default", "uid": format!("6e1e1a3c-0000-4000-8000-00000000000{uid}"),
                             "creationTimestamp": "2026-12-01T00:00:00Z"},
                "spec": spec});
            run(&["put", &key, &object.to_string()])?;
        }
    }
    Ok(())
}

/// Sets IPAMConfig `strictAffinity` for the run; IPAMConfig as it was
/// (`None`: absent, Calico's defaults).
async fn set_strict_affinity(store: &dyn Store) -> Result<Option<IpamConfig>, Failure> {
    let before = store.get::<IpamConfig>("", IpamConfig::NAME).await?;
    match before.clone() {
        Some(mut config) => {
            config.spec.strict_affinity = true;
            store.update(&mut config).await?;
        }
        None => {
            let spec = IpamConfigSpec {
                strict_affinity: true,
                ..IpamConfigSpec::defaults()
            };
            store
                .create(&mut IpamConfig::new(IpamConfig::NAME, spec))
                .await?;
        }
    }
    Ok(before)
}

/// IPAMConfig put back as [`set_strict_affinity`] found it.
async fn restore_ipam_config(store: &dyn Store, before: Option<IpamConfig>) -> Result<(), Failure> {
    let now = store.get::<IpamConfig>("", IpamConfig::NAME).await?;
    match (before, now) {
        (Some(before), Some(mut now)) => {
            now.spec = before.spec;
            store.update(&mut now).await?;
        }
        (None, Some(now)) => {
            store
                .delete::<IpamConfig>("", IpamConfig::NAME, &Precondition::exactly(now.metadata()))
                .await?;
        }
        _ => {}
    }
    Ok(())
}

/// The admin's API client (the Kubernetes datastore: v1 Nodes).
async fn admin_client(o: &Options) -> Result<Option<K8sClient>, Failure> {
    Ok(match o.backend.as_str() {
        "kdd" => Some(
            K8sClient::new(
                &K8sConfig {
                    kubeconfig: Some(var("KUBECONFIG")?.into()),
                    ..K8sConfig::default()
                },
                deadline(),
            )
            .await?,
        ),
        _ => None,
    })
}

/// A simulated node's Node object: a v1 Node on the API server, Calico's
/// Node on etcd.
async fn create_node(
    o: &Options,
    store: &dyn Store,
    admin: Option<&K8sClient>,
    name: &str,
) -> Result<(), Failure> {
    match admin {
        Some(k8s) => {
            k8s.create_json(
                "Node",
                "/api/v1/nodes",
                &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name,
                    "labels": {"calico-cni.test/cluster-scale": o.run}}}),
            )
            .await?;
        }
        None => {
            let node = json!({"kind": "Node", "apiVersion": "projectcalico.org/v3",
                "metadata": {"name": name}, "spec": {}});
            store.create_object(Node::KIND, node).await?;
        }
    }
    Ok(())
}

async fn delete_node(
    store: &dyn Store,
    admin: Option<&K8sClient>,
    name: &str,
) -> Result<(), Failure> {
    match admin {
        Some(k8s) => {
            k8s.delete_json("Node", &format!("/api/v1/nodes/{name}"), None, None)
                .await?;
        }
        None => {
            store
                .delete_object(Node::KIND, "", name, &Precondition::default())
                .await?;
        }
    }
    Ok(())
}

async fn run(o: Options) -> Result<bool, Failure> {
    let store = admin_store(&o.backend).await?;
    if o.backend == "etcd" {
        ensure_etcd_defaults()?;
    }
    if o.cleanup {
        cleanup(&o, store.as_ref()).await?;
        return Ok(true);
    }
    let pool = match o.pool {
        Some(p) => p,
        None => free_pool(store.as_ref()).await?,
    };
    let mut ippool = IpPool::new(
        &format!("sim-{}", o.run),
        IpPoolSpec {
            cidr: pool.to_string(),
            block_size: o.block_size,
            node_selector: "all()".into(),
            allowed_uses: vec!["Workload".into(), "Tunnel".into()],
            assignment_mode: "Manual".into(),
            ..IpPoolSpec::default()
        },
    );
    store.create(&mut ippool).await?;
    let root = std::env::temp_dir().join(format!("cluster-scale-{}", o.run));
    let nodes: Vec<SimNode> = (0..o.nodes)
        .map(|i| SimNode {
            name: format!("sim-{}-{i}", o.run),
            dir: root.join(format!("node-{i}")),
        })
        .collect();
    let admin = admin_client(&o).await?;
    for n in &nodes {
        std::fs::create_dir_all(n.dir.join("state"))?;
        create_node(&o, store.as_ref(), admin.as_ref(), &n.name).await?;
    }
    println!(
        "cluster_scale {}: {} nodes, {} calls, {} at once{}, pool {pool} (/{} blocks: {}), {} live pods a node aimed at{}{}{}",
        o.backend,
        o.nodes,
        o.ops,
        o.concurrency,
        o.rate
            .map(|r| format!(" (at most), {r} started a second"))
            .unwrap_or_default(),
        o.block_size,
        1usize << (o.block_size - pool.prefix_len()),
        o.pods,
        if o.strict_affinity {
            ", strictAffinity"
        } else {
            ""
        },
        if let Some(f) = &o.fault {
            format!(", fault {f} halfway")
        } else {
            String::new()
        },
        if o.kill_every > 0 {
            format!(", SIGKILL 1 call in {}", o.kill_every)
        } else {
            String::new()
        },
    );
    let config_before = match o.strict_affinity {
        true => Some(set_strict_affinity(store.as_ref()).await?),
        false => None,
    };
    let mut rows = Vec::new();
    let mut result = Ok(());
    for who in &o.binaries {
        let row = run_one(&o, who, store.as_ref(), &pool, &nodes).await;
        clear(&o, store.as_ref(), &pool, &nodes).await?;
        match row {
            Ok(row) => rows.push(row),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    // The run's objects go, whatever happened; IPAMConfig is as it was.
    if let Some(before) = config_before {
        restore_ipam_config(store.as_ref(), before).await?;
    }
    let none = Precondition::default();
    for n in &nodes {
        let _ = delete_node(store.as_ref(), admin.as_ref(), &n.name).await;
    }
    let _ = store
        .delete_object(IpPool::KIND, "", &ippool.metadata().name, &none)
        .await;
    if std::env::var_os("CLUSTER_SCALE_LOG_LEVEL").is_some() {
        eprintln!("cluster_scale: the nodes' logs kept in {}", root.display());
    } else {
        let _ = std::fs::remove_dir_all(&root);
    }
    result?;

    println!(
        "| binary | ADDs (failed, killed) | DELs | ADD p50/p99 ms | DEL p50/p99 ms | calls/s | API requests per ADD+DEL pair | 409s | blocks claimed | live pods checked (wrong) | duplicates | leaked addresses/handles | ipam check problems, ours/calicoctl |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut clean = true;
    for r in &rows {
        let pairs = r.adds.max(1) as f64;
        let requests = r.requests.as_ref().map_or("-".to_string(), |(n, _, _)| {
            format!("{:.1}", *n as f64 / pairs)
        });
        let conflicts = r
            .requests
            .as_ref()
            .map_or("-".to_string(), |(_, _, c)| c.to_string());
        println!(
            "| {} | {} ({}, {}) | {} | {:.1} / {:.1} | {:.1} / {:.1} | {:.0} | {} | {} | {} | {} ({}) | {} | {} / {} | {} / {} |",
            r.who,
            r.adds,
            r.failed_adds,
            r.killed,
            r.dels,
            r.add_ms.0,
            r.add_ms.1,
            r.del_ms.0,
            r.del_ms.1,
            r.per_second,
            requests,
            conflicts,
            r.blocks,
            r.live,
            r.misallocated.len(),
            r.duplicates.len(),
            r.leaked.0,
            r.leaked.1,
            r.checks.0.len(),
            r.checks.1.len()
        );
        if let Some((_, by, _)) = &r.requests {
            println!("  {} requests by verb and resource: {by:?}", r.who);
        }
        if let Some([b, a, h]) = r.stored {
            println!(
                "  {} stored at the churn's end ({} live pods): {} blocks {} B, {} affinities {} B, {} handles {} B",
                r.who, r.live, b.0, b.1, a.0, a.1, h.0, h.1
            );
        }
        for d in r.duplicates.iter().take(5) {
            println!("  {} DUPLICATE {d}", r.who);
        }
        for d in r.misallocated.iter().take(5) {
            println!("  {} MISALLOCATED {d}", r.who);
        }
        for l in r.checks.0.iter().chain(&r.checks.1).take(5) {
            println!("  {} IPAM CHECK {l}", r.who);
        }
        // (Only ours gates the exit: what Calico's binary leaks or
        // duplicates is a finding about the control, printed above.)
        clean &= r.who != "ours"
            || (r.duplicates.is_empty()
                && r.leaked == (0, 0)
                && r.misallocated.is_empty()
                && r.checks.0.is_empty()
                && r.checks.1.is_empty());
    }
    if let [calico, ours] = &rows[..] {
        println!(
            "ours / Calico's: ADD p99 {:.2}, requests per pair {}",
            ours.add_ms.1 / calico.add_ms.1.max(1e-9),
            match (&ours.requests, &calico.requests) {
                (Some((a, ..)), Some((b, ..))) => format!(
                    "{:.2}",
                    *a as f64
                        / ours.adds.max(1) as f64
                        / (*b as f64 / calico.adds.max(1) as f64).max(1e-9)
                ),
                _ => "-".into(),
            }
        );
    }
    Ok(clean)
}

fn main() {
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("cluster_scale: {e}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    match rt.block_on(run(o)) {
        Ok(true) => {}
        Ok(false) => {
            eprintln!("cluster_scale: a duplicate or a leak of ours");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("cluster_scale: {e}");
            std::process::exit(2);
        }
    }
}
