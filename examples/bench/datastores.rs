//! The datastore rows: this plugin against Calico v3.32.1's own
//! binaries (`calico` with its `calico-ipam`, from the peers build), both
//! with calico-ipam, on the test bed's real kube-apiserver (Kubernetes pods
//! created through the API, bound to a bench node) and on its etcd cluster
//! (plain CNI containers), the two binaries alternating in one run (their
//! sequential calls interleaved pod by pod): for each datastore and
//! binary, sequential ADD and DEL (p50, p99), 8- and
//! 32-way, a burst of B pods at once (the time until all are networked, the
//! p99 of one ADD), CPU time per ADD and DEL (the call and the children it
//! waited for: Calico's calico-ipam), peak RSS per call; then, through the
//! fault proxy in pass-through, the API requests and body bytes per ADD
//! and per DEL; failures and leaks (addresses left in the pool, host veths
//! and routes) after every phase.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use super::{
    Failure, RSS_CALLS, Sample, Stats, invoke, invoke_probed, ms, percentile, phase, sh, stats,
};

#[path = "../../tests/common/faultproxy.rs"]
#[allow(dead_code)]
mod faultproxy;

/// Which datastore a row is on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Store {
    Kdd,
    Etcd,
}

impl Store {
    pub fn label(self) -> &'static str {
        match self {
            Store::Kdd => "kubernetes",
            Store::Etcd => "etcd",
        }
    }
}

/// One binary under test: its `calico` and the CNI_PATH holding its
/// calico-ipam.
pub struct Binary {
    pub label: &'static str,
    pub calico: PathBuf,
    pub cni_path: String,
}

/// What a datastore round measured for one binary.
#[derive(Default)]
pub struct Figures {
    pub add: BTreeMap<usize, Stats>,
    pub del: BTreeMap<usize, Stats>,
    pub burst_wall: Duration,
    pub burst_add_p99: Duration,
    pub cpu_add: Duration,
    pub cpu_del: Duration,
    /// The servers' CPU (kube-apiserver, etcd) per call, all rounds, and
    /// during the burst's ADDs.
    pub server_add: Duration,
    pub server_del: Duration,
    pub burst_server: Duration,
    pub rss_kib: i64,
    pub requests_add: f64,
    pub requests_del: f64,
    pub bytes_add: f64,
    pub bytes_del: f64,
    pub failures: usize,
    pub leaked: bool,
}

fn var(name: &str) -> Result<String, Failure> {
    std::env::var(name).map_err(|_| {
        format!("{name} is not set: eval \"$(bash scripts/testbed.sh env)\" (the test bed)").into()
    })
}

/// One admin request to the test bed's API server.
fn api(method: &str, path: &str, body: Option<&Value>) -> Result<Value, Failure> {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "30", "-X", method])
        .args(["--cacert", &var("TESTBED_CA")?])
        .args(["--cert", &var("TESTBED_ADMIN_CERT")?])
        .args(["--key", &var("TESTBED_ADMIN_KEY")?])
        .args(["-H", "Content-Type: application/json"]);
    if let Some(b) = body {
        cmd.args(["--data-binary", &b.to_string()]);
    }
    let out = cmd.arg(format!("{}{path}", var("TESTBED_API")?)).output()?;
    Ok(serde_json::from_slice(&out.stdout).unwrap_or(Value::Null))
}

fn etcdctl(args: &[&str], input: Option<&str>) -> Result<String, Failure> {
    let bin = std::env::var("PEERS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from("/var/cache/calico-cni-peers/bin"))
        .join("etcdctl");
    let mut cmd = Command::new(bin);
    for (k, _) in std::env::vars() {
        if k.starts_with("ETCDCTL_") {
            cmd.env_remove(k);
        }
    }
    cmd.arg(format!(
        "--endpoints={}",
        var("TESTBED_CALICO_ETCD_ENDPOINTS")?
    ))
    .arg(format!("--cacert={}", var("TESTBED_CALICO_ETCD_CA")?))
    .arg(format!("--cert={}", var("TESTBED_CALICO_ETCD_CERT")?))
    .arg(format!("--key={}", var("TESTBED_CALICO_ETCD_KEY")?))
    .args(args)
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    if let Some(input) = input {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(input.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(format!("etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One round's samples of one binary: each phase's calls, its wall time
/// and the CPU the datastore's servers (kube-apiserver, etcd) spent during
/// it, and whether it leaked.
pub struct RoundSamples {
    adds: Vec<Sample>,
    add_wall: Duration,
    add_server: Duration,
    dels: Vec<Sample>,
    del_wall: Duration,
    del_server: Duration,
    leaked: bool,
}

/// The host's veths (a leak after a DEL phase).
fn veths() -> usize {
    sh("ip", &["-o", "link", "show", "type", "veth"])
        .lines()
        .count()
}

/// The datastore's server processes of this machine (kube-apiserver,
/// etcd): their `stat` files.
fn server_pids() -> Vec<PathBuf> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("stat"))
        .filter(|stat| {
            std::fs::read_to_string(stat).is_ok_and(|s| {
                s.rsplit_once(')').is_some_and(|(head, _)| {
                    head.ends_with("(kube-apiserver") || head.ends_with("(etcd")
                })
            })
        })
        .collect()
}

/// The CPU time (user + system) the datastore's server processes of this
/// machine have used so far.
fn server_cpu() -> Duration {
    server_cpu_of(&server_pids())
}

/// The CPU time (user + system) the processes of these `stat` files have
/// used so far.
fn server_cpu_of(stats: &[PathBuf]) -> Duration {
    let tick = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let mut ticks = 0u64;
    for path in stats {
        let Ok(stat) = std::fs::read_to_string(path) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        // After the name: state is field 3, utime 14 and stime 15.
        let f: Vec<&str> = rest.split_whitespace().collect();
        ticks += f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
            + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    }
    Duration::from_secs_f64(ticks as f64 / tick)
}

/// The bench's world on one datastore: a node for each binary (each its
/// own affine blocks, as on a real node where one plugin writes them: with
/// one node, each binary's writes would make the other's copy of the block
/// stale, a conflict and a read more on every call once their calls
/// interleave), a pool selecting only these nodes, pods (Kubernetes) and
/// the config both binaries get.
pub struct World {
    pub store: Store,
    tag: String,
    /// The binaries' labels and their nodes.
    nodes: Vec<(String, String)>,
    namespace: String,
    pool: String,
    cidr: String,
    dir: PathBuf,
}

impl World {
    pub fn new(
        store: Store,
        dir: &Path,
        sides: &[&str],
        pods: usize,
        cidr: &str,
    ) -> Result<World, Failure> {
        let tag = format!("bench{}{}", std::process::id(), store.label().len());
        let w = World {
            store,
            nodes: sides
                .iter()
                .enumerate()
                .map(|(k, side)| (side.to_string(), format!("{tag}-node{k}")))
                .collect(),
            namespace: format!("{tag}-ns"),
            pool: format!("{tag}-pool"),
            cidr: cidr.into(),
            dir: dir.join(store.label()),
            tag,
        };
        std::fs::create_dir_all(&w.dir)?;
        let selector = format!("calico-bench == '{}'", w.tag);
        let pool_spec = json!({"cidr": w.cidr, "blockSize": 26, "nodeSelector": selector,
                               "ipipMode": "Never", "vxlanMode": "Never"});
        match store {
            Store::Kdd => {
                for (_, node) in &w.nodes {
                    api(
                        "POST",
                        "/api/v1/nodes",
                        Some(&json!({"apiVersion": "v1", "kind": "Node",
                            "metadata": {"name": node, "labels": {"calico-bench": w.tag}}})),
                    )?;
                }
                api(
                    "POST",
                    "/api/v1/namespaces",
                    Some(&json!({"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": w.namespace}})),
                )?;
                api(
                    "POST",
                    "/apis/crd.projectcalico.org/v1/ippools",
                    Some(
                        &json!({"apiVersion": "crd.projectcalico.org/v1", "kind": "IPPool",
                        "metadata": {"name": w.pool}, "spec": pool_spec}),
                    ),
                )?;
                // Each node its pods (a kubelet networks only its node's).
                for (_, node) in &w.nodes {
                    for i in 0..pods {
                        api(
                            "POST",
                            &format!("/api/v1/namespaces/{}/pods", w.namespace),
                            Some(&json!({"apiVersion": "v1", "kind": "Pod",
                                "metadata": {"name": format!("{node}-p{i}"),
                                             "labels": {"app": "bench"}},
                                "spec": {"nodeName": node,
                                         "containers": [{"name": "c", "image": "bench"}]}})),
                        )?;
                    }
                }
            }
            Store::Etcd => {
                let v3 = "/calico/resources/v3/projectcalico.org";
                if etcdctl(
                    &[
                        "get",
                        &format!("{v3}/clusterinformations/default"),
                        "--keys-only",
                    ],
                    None,
                )?
                .trim()
                .is_empty()
                {
                    let info = json!({"kind": "ClusterInformation", "apiVersion": "projectcalico.org/v3",
                        "metadata": {"name": "default", "uid": "6e1e1a3c-0000-4000-8000-0000000000b1",
                                     "creationTimestamp": "2026-12-01T00:00:00Z"},
                        "spec": {"clusterGUID": "0123456789abcdef0123456789abcdef",
                                 "clusterType": "k8s,bgp", "datastoreReady": true}});
                    etcdctl(
                        &["put", &format!("{v3}/clusterinformations/default")],
                        Some(&info.to_string()),
                    )?;
                }
                for (k, (_, name)) in w.nodes.iter().enumerate() {
                    let node = json!({"kind": "Node", "apiVersion": "projectcalico.org/v3",
                        "metadata": {"name": name, "labels": {"calico-bench": w.tag},
                                     "uid": format!("6e1e1a3c-0000-4000-8000-0000000001{k:02}"),
                                     "creationTimestamp": "2026-12-01T00:00:00Z"},
                        "spec": {}});
                    etcdctl(
                        &["put", &format!("{v3}/nodes/{name}")],
                        Some(&node.to_string()),
                    )?;
                }
                let pool = json!({"kind": "IPPool", "apiVersion": "projectcalico.org/v3",
                    "metadata": {"name": w.pool, "uid": "6e1e1a3c-0000-4000-8000-0000000000b3",
                                 "creationTimestamp": "2026-12-01T00:00:00Z"},
                    "spec": pool_spec});
                etcdctl(
                    &["put", &format!("{v3}/ippools/{}", w.pool)],
                    Some(&pool.to_string()),
                )?;
            }
        }
        Ok(w)
    }

    /// The node of the binary labelled `side`.
    fn node(&self, side: &str) -> &str {
        self.nodes
            .iter()
            .find(|(s, _)| s == side)
            .map_or("", |(_, node)| node.as_str())
    }

    /// The network config both binaries get (the same text but the node),
    /// each with its own log file and lock.
    fn conf(
        &self,
        side: &str,
        kubeconfig: Option<&str>,
        etcd: Option<&str>,
    ) -> Result<Value, Failure> {
        let dir = self.dir.join(side);
        std::fs::create_dir_all(&dir)?;
        let mut conf = json!({
            "cniVersion": "0.3.1", "name": "k8s-pod-network", "type": "calico",
            "nodename": self.node(side), "nodename_file_optional": true, "log_level": "info",
            "log_file_path": dir.join("cni.log"), "ipam_lock_file": dir.join("ipam.lock"),
            // Its own release queue: a DEL the counting proxy cut short
            // must not leave the node-wide queue's replays (each up to its
            // 1 s budget against a proxy gone) to later runs' ADDs.
            "release_queue_dir": dir.join("release-queue"),
            "mtu": 1450, "ipam": {"type": "calico-ipam"},
        });
        // BENCH_LOG_LEVEL=debug: a profile's log, kept in /tmp.
        if let Ok(level) = std::env::var("BENCH_LOG_LEVEL") {
            conf["log_level"] = json!(level);
            conf["log_file_path"] = json!(format!("/tmp/bench-{}-{side}.log", self.store.label()));
        }
        match self.store {
            Store::Kdd => {
                let kubeconfig = match kubeconfig {
                    Some(k) => k.to_string(),
                    None => var("CALICO_CNI_KUBECONFIG")?,
                };
                conf["datastore_type"] = json!("kubernetes");
                conf["kubernetes"] = json!({"kubeconfig": kubeconfig});
                conf["policy"] = json!({"type": "k8s"});
            }
            Store::Etcd => {
                conf["datastore_type"] = json!("etcdv3");
                conf["etcd_endpoints"] = json!(match etcd {
                    Some(e) => e.to_string(),
                    None => var("TESTBED_CALICO_ETCD_ENDPOINTS")?,
                });
                conf["etcd_ca_cert_file"] = json!(var("TESTBED_CALICO_ETCD_CA")?);
                conf["etcd_cert_file"] = json!(var("TESTBED_CALICO_ETCD_CERT")?);
                conf["etcd_key_file"] = json!(var("TESTBED_CALICO_ETCD_KEY")?);
            }
        }
        Ok(conf)
    }

    /// One CNI call for pod `i` of `b`'s node (sandbox `cid`, netns
    /// `netns`); `probed`: through GNU time, for its peak RSS
    /// (`invoke_probed`).
    #[allow(clippy::too_many_arguments)]
    fn call(
        &self,
        probed: bool,
        b: &Binary,
        conf: &Value,
        verb: &str,
        i: usize,
        cid: &str,
        netns: &str,
    ) -> Sample {
        let args = format!(
            "K8S_POD_NAMESPACE={};K8S_POD_NAME={}-p{i};K8S_POD_INFRA_CONTAINER_ID={cid}",
            self.namespace,
            self.node(b.label)
        );
        let mut env = vec![
            ("CNI_COMMAND", verb),
            ("CNI_CONTAINERID", cid),
            ("CNI_NETNS", netns),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", b.cni_path.as_str()),
        ];
        if self.store == Store::Kdd {
            env.push(("CNI_ARGS", args.as_str()));
        }
        let run = if probed { invoke_probed } else { invoke };
        run(&b.calico, &env, conf.to_string().as_bytes())
    }

    /// Addresses of the pool still allocated (a leak after a DEL phase).
    fn allocated(&self) -> Result<usize, Failure> {
        let blocks: Vec<Value> = match self.store {
            Store::Kdd => api("GET", "/apis/crd.projectcalico.org/v1/ipamblocks", None)?["items"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
            Store::Etcd => etcdctl(
                &[
                    "get",
                    "/calico/ipam/v2/assignment/",
                    "--prefix",
                    "--print-value-only",
                ],
                None,
            )?
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .map(|v| json!({"spec": v}))
            .collect(),
        };
        let net: ipnet::IpNet = self.cidr.parse()?;
        Ok(blocks
            .iter()
            .filter(|b| {
                b["spec"]["cidr"]
                    .as_str()
                    .and_then(|c| c.parse::<ipnet::IpNet>().ok())
                    .is_some_and(|c| net.contains(&c))
            })
            .map(|b| {
                b["spec"]["allocations"]
                    .as_array()
                    .map_or(0, |a| a.iter().filter(|x| !x.is_null()).count())
            })
            .sum())
    }

    /// Whether the host's veths or the store's allocations differ after a
    /// round from before it (a row says so).
    fn leaked(
        &self,
        binary: &str,
        conc: usize,
        before: (usize, usize),
        after: (usize, usize),
    ) -> bool {
        if after != before {
            println!(
                "| {} | {binary} | {conc} | LEAK: (veths, allocated) before {before:?} after {after:?} | | | | | |",
                self.store.label()
            );
        }
        after != before
    }

    /// The failed calls among `adds` and `dels`; the first one's answer
    /// printed as a row (`phase`: the concurrency, the burst, the RSS probe).
    fn failed(&self, b: &Binary, phase: &str, adds: &[Sample], dels: &[Sample]) -> usize {
        if let Some(s) = adds.iter().chain(dels).find(|s| !s.ok) {
            println!(
                "| {} | {} | {phase} | failed: {} | | | | | |",
                self.store.label(),
                b.label,
                s.stdout.replace('\n', " ")
            );
        }
        adds.iter().chain(dels).filter(|s| !s.ok).count()
    }

    /// One round of `n` pods, `conc` at a time: ADD all, DEL all; leaks
    /// checked. The samples of each phase (`probed`: each call through GNU
    /// time, for the peak RSS; its latency not used).
    fn round(
        &self,
        probed: bool,
        b: &Binary,
        conf: &Value,
        n: usize,
        conc: usize,
        tag: &str,
    ) -> Result<RoundSamples, Failure> {
        for i in 0..n {
            sh("ip", &["netns", "add", &format!("{tag}-{i}")]);
        }
        let before = (veths(), self.allocated()?);
        let cid = |i: usize| format!("{tag}{i:04}");
        let netns = |i: usize| format!("/var/run/netns/{tag}-{i}");
        let start = server_cpu();
        let (adds, add_wall) = phase(n, conc, |i| {
            self.call(probed, b, conf, "ADD", i, &cid(i), &netns(i))
        });
        let added = server_cpu();
        let (dels, del_wall) = phase(n, conc, |i| {
            self.call(probed, b, conf, "DEL", i, &cid(i), &netns(i))
        });
        let deleted = server_cpu();
        let after = (veths(), self.allocated()?);
        for i in 0..n {
            sh("ip", &["netns", "del", &format!("{tag}-{i}")]);
        }
        let leaked = self.leaked(b.label, conc, before, after);
        Ok(RoundSamples {
            adds,
            add_wall,
            add_server: added.saturating_sub(start),
            dels,
            del_wall,
            del_server: deleted.saturating_sub(added),
            leaked,
        })
    }

    /// The sequential round (one call at a time) of every binary, their
    /// calls interleaved: pod i of each binary in turn (the order rotating
    /// with i), then the DELs the same way. Each binary's calls share every
    /// stretch of time with the others', so the ratio of their p50s
    /// compares calls made under the same load: this machine's speed, the
    /// API server's and the kernel's (a netns cleanup behind an earlier
    /// phase holds rtnl) drift within a run, and a binary's block of calls
    /// after the other's left that drift in the ratio. The servers' CPU is
    /// read around each call and counted to its binary; the leak check is
    /// the round's (a leak shows on every binary's line).
    pub fn sequential(&self, binaries: &[&Binary], n: usize) -> Result<Vec<RoundSamples>, Failure> {
        let confs = binaries
            .iter()
            .map(|b| self.conf(b.label, None, None))
            .collect::<Result<Vec<_>, _>>()?;
        let tags: Vec<String> = binaries
            .iter()
            .map(|b| format!("d{}{}1", std::process::id() % 1000, &b.label[..1]))
            .collect();
        for tag in &tags {
            for i in 0..n {
                sh("ip", &["netns", "add", &format!("{tag}-{i}")]);
            }
        }
        let before = (veths(), self.allocated()?);
        let servers = server_pids();
        let each = |verb: &str| {
            let mut out: Vec<(Vec<Sample>, Duration)> = binaries
                .iter()
                .map(|_| (Vec::new(), Duration::ZERO))
                .collect();
            for i in 0..n {
                for k in 0..binaries.len() {
                    let j = (i + k) % binaries.len();
                    let start = server_cpu_of(&servers);
                    let sample = self.call(
                        false,
                        binaries[j],
                        &confs[j],
                        verb,
                        i,
                        &format!("{}{i:04}", tags[j]),
                        &format!("/var/run/netns/{}-{i}", tags[j]),
                    );
                    out[j].1 += server_cpu_of(&servers).saturating_sub(start);
                    out[j].0.push(sample);
                }
            }
            out
        };
        let adds = each("ADD");
        let dels = each("DEL");
        let after = (veths(), self.allocated()?);
        for tag in &tags {
            for i in 0..n {
                sh("ip", &["netns", "del", &format!("{tag}-{i}")]);
            }
        }
        let leaked = self.leaked("all", 1, before, after);
        Ok(adds
            .into_iter()
            .zip(dels)
            .map(|((adds, add_server), (dels, del_server))| RoundSamples {
                add_wall: adds.iter().map(|s| s.elapsed).sum(),
                del_wall: dels.iter().map(|s| s.elapsed).sum(),
                adds,
                add_server,
                dels,
                del_server,
                leaked,
            })
            .collect())
    }

    /// Everything for one binary: the rounds at each concurrency (conc 1:
    /// `sequential`'s samples when given), the burst, CPU and RSS; then the
    /// requests through the counting proxy.
    pub fn measure(
        &self,
        b: &Binary,
        side: &str,
        n: usize,
        concs: &[usize],
        burst: usize,
        mut sequential: Option<RoundSamples>,
    ) -> Result<Figures, Failure> {
        let conf = self.conf(side, None, None)?;
        let mut f = Figures::default();
        let mut cpu = (Vec::new(), Vec::new());
        let (mut server, mut calls) = ((Duration::ZERO, Duration::ZERO), (0, 0));
        for &conc in concs {
            let tag = format!("d{}{}{conc}", std::process::id() % 1000, &side[..1]);
            let samples = match sequential.take_if(|_| conc == 1) {
                Some(s) => s,
                None => self.round(false, b, &conf, n, conc, &tag)?,
            };
            let RoundSamples {
                adds,
                add_wall: aw,
                add_server,
                dels,
                del_wall: dw,
                del_server,
                leaked,
            } = samples;
            server.0 += add_server;
            server.1 += del_server;
            calls.0 += adds.len();
            calls.1 += dels.len();
            f.failures += self.failed(b, &conc.to_string(), &adds, &dels);
            f.leaked |= leaked;
            cpu.0.extend(adds.iter().map(|s| s.cpu));
            cpu.1.extend(dels.iter().map(|s| s.cpu));
            f.add.insert(conc, stats(&adds, aw));
            f.del.insert(conc, stats(&dels, dw));
        }
        let tag = format!("d{}{}b", std::process::id() % 1000, &side[..1]);
        let RoundSamples {
            adds,
            add_wall: wall,
            add_server,
            dels,
            del_server,
            leaked,
            ..
        } = self.round(false, b, &conf, burst, burst, &tag)?;
        f.failures += self.failed(b, "burst", &adds, &dels);
        f.leaked |= leaked;
        f.burst_wall = wall;
        f.burst_server = add_server;
        server.0 += add_server;
        server.1 += del_server;
        calls.0 += adds.len();
        calls.1 += dels.len();
        f.server_add = server.0 / calls.0.max(1) as u32;
        f.server_del = server.1 / calls.1.max(1) as u32;
        let mut t: Vec<Duration> = adds.iter().map(|s| s.elapsed).collect();
        t.sort();
        f.burst_add_p99 = percentile(&t, 99);
        let median = |v: &mut Vec<Duration>| {
            v.sort();
            v.get(v.len() / 2).copied().unwrap_or_default()
        };
        f.cpu_add = median(&mut cpu.0);
        f.cpu_del = median(&mut cpu.1);
        // Peak RSS per call: single calls read through GNU time.
        let tag = format!("d{}{}r", std::process::id() % 1000, &side[..1]);
        let probed = self.round(true, b, &conf, RSS_CALLS.min(n), 1, &tag)?;
        f.failures += self.failed(b, "rss", &probed.adds, &probed.dels);
        f.leaked |= probed.leaked;
        // Each call's peak on stderr (`BENCH_RSS_DETAIL=1`): which verb
        // grew, when the figure moves.
        if std::env::var_os("BENCH_RSS_DETAIL").is_some() {
            let kib = |v: &[Sample]| v.iter().map(|s| s.max_rss_kib).collect::<Vec<_>>();
            eprintln!(
                "rss {} adds {:?} dels {:?}",
                b.label,
                kib(&probed.adds),
                kib(&probed.dels)
            );
        }
        f.rss_kib = probed
            .adds
            .iter()
            .chain(&probed.dels)
            .map(|s| s.max_rss_kib)
            .max()
            .unwrap_or(0);
        self.count_requests(b, side, &mut f)?;
        Ok(f)
    }

    /// Requests and body bytes per ADD and DEL, through the fault proxy in
    /// pass-through (5 pods, one at a time).
    fn count_requests(&self, b: &Binary, side: &str, f: &mut Figures) -> Result<(), Failure> {
        const CALLS: usize = 5;
        // Calico's etcd client speaks gRPC (HTTP/2, which it insists on
        // through ALPN); the proxy speaks HTTP/1.1 only: not counted.
        if self.store == Store::Etcd && b.label != "ours" {
            f.requests_add = f64::NAN;
            f.requests_del = f64::NAN;
            f.bytes_add = f64::NAN;
            f.bytes_del = f64::NAN;
            return Ok(());
        }
        let proxy = match self.store {
            Store::Kdd => faultproxy::FaultProxy::start(
                &var("TESTBED_API")?,
                Path::new(&var("TESTBED_CA")?),
                Path::new(&var("TESTBED_PROXY_CERT")?),
                Path::new(&var("TESTBED_PROXY_KEY")?),
            ),
            Store::Etcd => {
                let first = var("TESTBED_CALICO_ETCD_ENDPOINTS")?;
                let first = first.split(',').next().unwrap_or_default().to_string();
                faultproxy::FaultProxy::start_with_identity(
                    &first,
                    Path::new(&var("TESTBED_CALICO_ETCD_CA")?),
                    Path::new(&var("TESTBED_PROXY_CERT")?),
                    Path::new(&var("TESTBED_PROXY_KEY")?),
                    Some((
                        Path::new(&var("TESTBED_CALICO_ETCD_CERT")?),
                        Path::new(&var("TESTBED_CALICO_ETCD_KEY")?),
                    )),
                )
            }
        };
        let kubeconfig = self.dir.join(format!("{side}-proxy.kubeconfig"));
        let conf = match self.store {
            Store::Kdd => {
                let mut kc: Value =
                    serde_json::from_slice(&std::fs::read(var("CALICO_CNI_KUBECONFIG")?)?)?;
                kc["clusters"][0]["cluster"]["server"] = json!(proxy.url());
                std::fs::write(&kubeconfig, kc.to_string())?;
                self.conf(side, Some(&kubeconfig.to_string_lossy()), None)?
            }
            Store::Etcd => self.conf(side, None, Some(&proxy.url()))?,
        };
        let tag = format!("q{}{}", std::process::id() % 1000, &side[..1]);
        let mut counts = [(0usize, 0u64); 2];
        for i in 0..CALLS {
            sh("ip", &["netns", "add", &format!("{tag}-{i}")]);
            let (cid, netns) = (format!("{tag}{i:04}"), format!("/var/run/netns/{tag}-{i}"));
            for (k, verb) in ["ADD", "DEL"].into_iter().enumerate() {
                let (r0, b0) = (proxy.requests().len(), proxy.bytes());
                let s = self.call(false, b, &conf, verb, i, &cid, &netns);
                f.failures += usize::from(!s.ok);
                let (r1, b1) = (proxy.requests().len(), proxy.bytes());
                if i == 0 && std::env::var("BENCH_SHOW_REQUESTS").is_ok() {
                    for (method, path) in &proxy.requests()[r0..r1] {
                        println!(
                            "| {} | {} | {verb} request | {method} {path} |",
                            self.store.label(),
                            b.label
                        );
                    }
                }
                counts[k].0 += r1 - r0;
                counts[k].1 += (b1.0 - b0.0) + (b1.1 - b0.1);
            }
            sh("ip", &["netns", "del", &format!("{tag}-{i}")]);
        }
        f.requests_add = counts[0].0 as f64 / CALLS as f64;
        f.requests_del = counts[1].0 as f64 / CALLS as f64;
        f.bytes_add = counts[0].1 as f64 / CALLS as f64;
        f.bytes_del = counts[1].1 as f64 / CALLS as f64;
        Ok(())
    }
}

impl Drop for World {
    fn drop(&mut self) {
        match self.store {
            Store::Kdd => {
                // The pods at once (no kubelet confirms a graceful delete:
                // they would stay Terminating, the namespace with them,
                // and the controllers' retries load the API server of the
                // runs that follow).
                let _ = api(
                    "DELETE",
                    &format!("/api/v1/namespaces/{}/pods", self.namespace),
                    Some(&json!({"kind": "DeleteOptions", "apiVersion": "v1",
                                 "gracePeriodSeconds": 0})),
                );
                let _ = api(
                    "DELETE",
                    &format!("/api/v1/namespaces/{}", self.namespace),
                    None,
                );
                let _ = api(
                    "DELETE",
                    &format!("/apis/crd.projectcalico.org/v1/ippools/{}", self.pool),
                    None,
                );
                // The nodes' blocks and affinities.
                for plural in ["blockaffinities", "ipamblocks"] {
                    let list = api(
                        "GET",
                        &format!("/apis/crd.projectcalico.org/v1/{plural}"),
                        None,
                    )
                    .unwrap_or_default();
                    for item in list["items"].as_array().cloned().unwrap_or_default() {
                        let mine = self.nodes.iter().any(|(_, node)| {
                            item["spec"]["node"] == json!(node)
                                || item["spec"]["affinity"] == json!(format!("host:{node}"))
                        });
                        if mine {
                            let name = item["metadata"]["name"].as_str().unwrap_or_default();
                            let _ = api(
                                "DELETE",
                                &format!("/apis/crd.projectcalico.org/v1/{plural}/{name}"),
                                None,
                            );
                        }
                    }
                }
                for (_, node) in &self.nodes {
                    let _ = api("DELETE", &format!("/api/v1/nodes/{node}"), None);
                }
            }
            Store::Etcd => {
                let v3 = "/calico/resources/v3/projectcalico.org";
                let _ = etcdctl(&["del", &format!("{v3}/ippools/{}", self.pool)], None);
                for (_, node) in &self.nodes {
                    let _ = etcdctl(&["del", &format!("{v3}/nodes/{node}")], None);
                    let _ = etcdctl(
                        &["del", &format!("/calico/ipam/v2/host/{node}"), "--prefix"],
                        None,
                    );
                }
                // The pool's blocks (keys `<prefix>/<address>-<prefix length>`).
                let prefix = "/calico/ipam/v2/assignment/ipv4/block/";
                let net: Option<ipnet::IpNet> = self.cidr.parse().ok();
                let keys =
                    etcdctl(&["get", prefix, "--prefix", "--keys-only"], None).unwrap_or_default();
                for key in keys.lines().filter(|k| !k.is_empty()) {
                    let cidr = key.trim_start_matches(prefix).replacen('-', "/", 1);
                    let inside = cidr
                        .parse::<ipnet::IpNet>()
                        .ok()
                        .zip(net)
                        .is_some_and(|(c, n)| n.contains(&c));
                    if inside {
                        let _ = etcdctl(&["del", key], None);
                    }
                }
            }
        }
    }
}

/// Prints the datastore rows and the ratios; whether anything failed or leaked.
pub fn report(rows: &[(Store, &str, &Figures)]) -> bool {
    let mut bad = false;
    println!(
        "\n| datastore | binary | conc | op | n | fail | p50 ms | p99 ms | ops/s |\n|---|---|---|---|---|---|---|---|---|"
    );
    for (store, label, f) in rows {
        for (op, m) in [("ADD", &f.add), ("DEL", &f.del)] {
            for (conc, s) in m.iter() {
                println!(
                    "| {} | {label} | {conc} | {op} | {} | {} | {} | {} | {:.0} |",
                    store.label(),
                    s.n,
                    s.failures,
                    ms(s.p50),
                    ms(s.p99),
                    s.ops_per_s
                );
            }
        }
        bad |= f.failures > 0 || f.leaked;
    }
    println!(
        "\n| datastore | binary | burst: all networked s | burst: ADD p99 ms | burst: server CPU s | CPU/ADD ms | CPU/DEL ms | server CPU/ADD ms | server CPU/DEL ms | peak RSS KiB | requests/ADD | requests/DEL | bytes/ADD | bytes/DEL | failures | leaks |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for (store, label, f) in rows {
        println!(
            "| {} | {label} | {:.2} | {} | {:.2} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.0} | {:.0} | {} | {} |",
            store.label(),
            f.burst_wall.as_secs_f64(),
            ms(f.burst_add_p99),
            f.burst_server.as_secs_f64(),
            ms(f.cpu_add),
            ms(f.cpu_del),
            ms(f.server_add),
            ms(f.server_del),
            f.rss_kib,
            f.requests_add,
            f.requests_del,
            f.bytes_add,
            f.bytes_del,
            f.failures,
            u8::from(f.leaked)
        );
    }
    // Over rounds: the median of each figure (the peak RSS: the smallest,
    // each round's having the bench's own RSS as its floor, which grows
    // over a run).
    let all = |store: Store, label: &str| -> Vec<&Figures> {
        rows.iter()
            .filter(|(s, l, _)| *s == store && *l == label)
            .map(|r| r.2)
            .collect()
    };
    let median = |mut v: Vec<f64>| -> f64 {
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => f64::NAN,
            n if n % 2 == 0 => (v[n / 2 - 1] + v[n / 2]) / 2.0,
            n => v[n / 2],
        }
    };
    let rounds = all(Store::Kdd, "ours")
        .len()
        .max(all(Store::Etcd, "ours").len());
    println!(
        "\n| ratio, ours / Calico v3.32.1 (medians of {rounds} round(s)) | value | target |\n|---|---|---|"
    );
    for (store, add_t, del_t, burst_t) in [
        (Store::Kdd, "0.15", "0.2", "0.1"),
        (Store::Etcd, "0.1", "-", "0.08"),
    ] {
        let (o, c) = (all(store, "ours"), all(store, "calico-v3.32.1"));
        if o.is_empty() || c.is_empty() {
            continue;
        }
        let c1 = *o[0].add.keys().next().unwrap_or(&1);
        let r = |f: &dyn Fn(&Figures) -> f64| {
            median(o.iter().map(|x| f(x)).collect()) / median(c.iter().map(|x| f(x)).collect())
        };
        let s = |d: Duration| d.as_secs_f64();
        println!(
            "| {}: ADD p50 (conc {c1}) | {:.2} | <= {add_t} |",
            store.label(),
            r(&|f| f.add.get(&c1).map_or(f64::NAN, |x| s(x.p50)))
        );
        println!(
            "| {}: DEL p50 (conc {c1}) | {:.2} | <= {del_t} |",
            store.label(),
            r(&|f| f.del.get(&c1).map_or(f64::NAN, |x| s(x.p50)))
        );
        println!(
            "| {}: burst, all networked | {:.2} | <= {burst_t} |",
            store.label(),
            r(&|f| s(f.burst_wall))
        );
        println!(
            "| {}: CPU per ADD | {:.2} | |",
            store.label(),
            r(&|f| s(f.cpu_add))
        );
        let least = |v: &[&Figures]| v.iter().map(|f| f.rss_kib).min().unwrap_or(0) as f64;
        println!(
            "| {}: peak RSS per call | {:.2} | <= 0.15 (kubernetes) |",
            store.label(),
            least(&o) / least(&c).max(1.0)
        );
    }
    bad
}
