//! Pod start-up on the test bed's node, with this plugin and with Calico
//! v3.32.1's binary in its place, in one run: the figures users feel.
//! Run as root with the node up:
//!
//!     bash scripts/testbed.sh up --node && eval "$(bash scripts/testbed.sh env)"
//!     cargo run --release --example node_startup -- [--single 10] [--burst 50] [--rounds 2]
//!
//! Each round, for each binary in turn (installed as an installer does: the file renamed over
//! the node's `calico`; the same conflist for both, Calico's stock text at
//! cniVersion 0.3.1, which Calico's binary accepts): `--single` times one pod
//! at a time from its creation through the API to phase Running and to the
//! first TCP connection from the node to its echo server; `--burst` creates
//! that many pods at once and times each the same way; p50/p99 of each. The
//! node's CPU time in the CNI binaries per pod (ADD and DEL, all plugins of
//! the chain), and beside it containerd's reaped children's CPU time
//! (`cutime + cstime` in /proc/<containerd>/stat), which is not the CNI
//! chain's alone: containerd also execs `containerd-shim-runc-v2 start` and
//! `delete` per sandbox (Go processes, ~110 ms a pod here); split by plugin
//! and CNI command, every exec of the node's CNI binaries timed by
//! `scripts/node-cni-cost.sh wrap` (their children, iptables, included),
//! with the API requests each made (the test bed's audit log). The plugin
//! under test is the node's (the debug build unless CALICO_BIN named a
//! release build at `up --node`, or `--ours FILE` names one here).

use std::net::{IpAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: eval \"$(bash scripts/testbed.sh env)\" with the node up")
    })
}

/// One admin request to the test bed's API server: the JSON answer.
fn api(method: &str, path: &str, body: Option<&Value>) -> Value {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "30", "-X", method])
        .args(["--cacert", &var("TESTBED_CA")])
        .args([
            "--cert",
            &var("TESTBED_ADMIN_CERT"),
            "--key",
            &var("TESTBED_ADMIN_KEY"),
        ])
        .args(["-H", "Content-Type: application/json"]);
    if let Some(b) = body {
        cmd.args(["--data-binary", &b.to_string()]);
    }
    let out = cmd
        .arg(format!("{}{path}", var("TESTBED_API")))
        .output()
        .expect("curl");
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

/// A file put as an installer does: written beside, renamed over.
fn put(path: &Path, bytes: &[u8], mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension("swap");
    std::fs::write(&tmp, bytes).expect("write");
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).expect("chmod");
    std::fs::rename(&tmp, path).expect("rename");
}

/// scripts/node-cni-cost.sh with `args`: its JSON report, if any.
fn cni_cost(args: &[&str]) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/node-cni-cost.sh");
    let out = Command::new("bash")
        .arg(script)
        .args(args)
        .output()
        .expect("node-cni-cost.sh");
    assert!(
        out.status.success(),
        "node-cni-cost.sh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

fn epoch() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// containerd's reaped children's CPU time, in clock ticks.
fn children_cpu_ticks() -> u64 {
    let pid = std::fs::read_to_string(format!("{}/node-containerd.pid", var("TESTBED_DIR")))
        .expect("node containerd pid");
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).expect("stat");
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("stat")
        .1
        .split_whitespace()
        .collect();
    // After the command: state is field 3; cutime and cstime fields 16, 17.
    fields[13].parse::<u64>().unwrap() + fields[14].parse::<u64>().unwrap()
}

fn pod(name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "startup"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{"name": "c", "image": var("TESTBED_ECHO_IMAGE"), "imagePullPolicy": "Never"}],
            "dnsPolicy": "Default", "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1
        }
    })
}

/// Times from creation to Running and to the first connection, per pod.
#[derive(Default)]
struct Timed {
    running: Vec<f64>,
    connected: Vec<f64>,
    /// The CNI chain's CPU time over these pods.
    cpu_ms: f64,
    /// Per exec'd binary and CNI command: (calls, CPU ms, API requests).
    by_command: std::collections::BTreeMap<String, (u64, f64, u64)>,
}

/// Creates `n` pods at once in `ns` and times each.
fn start(ns: &str, node: &str, n: usize) -> Timed {
    let mut created = Vec::new();
    for i in 0..n {
        let name = format!("s{i}");
        created.push((name.clone(), Instant::now()));
        api(
            "POST",
            &format!("/api/v1/namespaces/{ns}/pods"),
            Some(&pod(&name, node)),
        );
    }
    let mut running: Vec<Option<f64>> = vec![None; n];
    let mut connected: Vec<Option<f64>> = vec![None; n];
    let mut ips: Vec<Option<IpAddr>> = vec![None; n];
    let end = Instant::now() + Duration::from_secs(300);
    while connected.iter().any(Option::is_none) {
        assert!(Instant::now() < end, "pods did not all start: {running:?}");
        if running.iter().any(Option::is_none) {
            let list = api("GET", &format!("/api/v1/namespaces/{ns}/pods"), None);
            for p in list["items"].as_array().into_iter().flatten() {
                let name = p["metadata"]["name"].as_str().unwrap_or_default();
                let Some(i) = created.iter().position(|(n, _)| n == name) else {
                    continue;
                };
                if running[i].is_none() && p["status"]["phase"] == "Running" {
                    running[i] = Some(created[i].1.elapsed().as_secs_f64() * 1000.0);
                    ips[i] = p["status"]["podIP"].as_str().and_then(|a| a.parse().ok());
                }
            }
        }
        for i in 0..n {
            if let (None, Some(ip)) = (connected[i], ips[i])
                && TcpStream::connect_timeout(&(ip, 8080).into(), Duration::from_millis(20)).is_ok()
            {
                connected[i] = Some(created[i].1.elapsed().as_secs_f64() * 1000.0);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Timed {
        running: running.into_iter().flatten().collect(),
        connected: connected.into_iter().flatten().collect(),
        ..Default::default()
    }
}

/// The host's cali interfaces (the node's own pods', CoreDNS's, included).
fn cali_links() -> usize {
    let links = Command::new("ip")
        .args(["-o", "link"])
        .output()
        .expect("ip");
    String::from_utf8_lossy(&links.stdout)
        .matches(": cali")
        .count()
}

/// Deletes the namespace's pods and waits until they are gone and their
/// sandboxes torn down (no more cali interfaces than `before`, the node's
/// own pods' before the run: CoreDNS's).
fn clear(ns: &str, before: usize) {
    api("DELETE", &format!("/api/v1/namespaces/{ns}/pods"), None);
    let end = Instant::now() + Duration::from_secs(300);
    loop {
        let left = api("GET", &format!("/api/v1/namespaces/{ns}/pods"), None)["items"]
            .as_array()
            .map_or(0, Vec::len);
        let veths = cali_links().saturating_sub(before);
        if left == 0 && veths == 0 {
            return;
        }
        assert!(Instant::now() < end, "{left} pods and {veths} veths left");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[((s.len() as f64 - 1.0) * q).round() as usize]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map_or(default, |v| v.parse().expect("a number"))
    };
    let (single, burst, rounds) = (arg("--single", 10), arg("--burst", 50), arg("--rounds", 2));
    let node = var("TESTBED_NODE");
    let node_dir = PathBuf::from(var("TESTBED_NODE_DIR"));
    let binary = node_dir.join("host/opt/cni/bin/calico");
    let conflist = node_dir.join("host/etc/cni/net.d/10-calico.conflist");
    let installed = (
        std::fs::read(&binary).unwrap(),
        std::fs::read(&conflist).unwrap(),
    );
    let ours = match args.iter().position(|a| a == "--ours") {
        Some(i) => std::fs::read(&args[i + 1]).expect("--ours FILE"),
        None => installed.0.clone(),
    };
    let mut stock: Value = serde_json::from_slice(&installed.1).unwrap();
    stock["cniVersion"] = json!("0.3.1");
    let stock = serde_json::to_vec_pretty(&stock).unwrap();
    let theirs = std::fs::read(PathBuf::from(var("PEERS_BIN")).join("calico-v3.32.1/calico"))
        .expect("Calico's binary (scripts/peers.sh)");
    let nodename = Path::new("/var/lib/calico/nodename");
    let made_nodename = !nodename.exists();
    std::fs::create_dir_all("/var/lib/calico").unwrap();
    std::fs::write(nodename, &node).unwrap();
    let before = cali_links();
    let ns = format!("startup-{}", std::process::id());
    api(
        "POST",
        "/api/v1/namespaces",
        Some(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})),
    );

    // Rounds alternate the binaries (ours, Calico's, ours, ...) so that a
    // drift of the machine's load over the run falls on both alike.
    let plugins = [("ours", &ours), ("Calico v3.32.1", &theirs)];
    let mut results: Vec<[Timed; 2]> = plugins.iter().map(|_| Default::default()).collect();
    for _ in 0..rounds {
        for (i, (_, bytes)) in plugins.iter().enumerate() {
            put(&binary, bytes, 0o755);
            put(&conflist, &stock, 0o644);
            std::thread::sleep(Duration::from_secs(2)); // containerd reloads the config
            for (j, (at_once, times)) in [(1, single), (burst, 1)].into_iter().enumerate() {
                cni_cost(&["wrap"]);
                let since = epoch().to_string();
                let ticks = children_cpu_ticks();
                for _ in 0..times {
                    let t = start(&ns, &node, at_once);
                    clear(&ns, before);
                    results[i][j].running.extend(t.running);
                    results[i][j].connected.extend(t.connected);
                }
                // (USER_HZ is 100 on Linux.)
                results[i][j].cpu_ms += (children_cpu_ticks() - ticks) as f64 * 10.0;
                let report = cni_cost(&["report", &since]);
                cni_cost(&["unwrap"]);
                for (command, c) in report["calls"].as_object().into_iter().flatten() {
                    let e = results[i][j].by_command.entry(command.clone()).or_default();
                    let count = c["count"].as_u64().unwrap_or(0);
                    e.0 += count;
                    e.1 += count as f64 * c["cpu_ms_mean"].as_f64().unwrap_or(0.0);
                    e.2 += c["api_requests"].as_u64().unwrap_or(0);
                }
            }
        }
    }
    println!(
        "| plugin | pods at once | pods | to Running p50 ms | p99 | to first connection p50 ms | p99 | CNI binaries' CPU ms per pod | containerd's children's CPU ms per pod |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for ((label, _), timed) in plugins.iter().zip(&results) {
        for (at_once, all) in [1, burst].into_iter().zip(timed) {
            let pods = all.running.len();
            println!(
                "| {label} | {at_once} | {pods} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1} |",
                quantile(&all.running, 0.5),
                quantile(&all.running, 0.99),
                quantile(&all.connected, 0.5),
                quantile(&all.connected, 0.99),
                all.by_command.values().map(|c| c.1).sum::<f64>() / pods as f64,
                all.cpu_ms / pods as f64
            );
        }
    }
    println!();
    println!(
        "| plugin | pods at once | exec'd binary and CNI command | calls per pod | CPU ms per pod | API requests per pod |"
    );
    println!("|---|---|---|---|---|---|");
    for ((label, _), timed) in plugins.iter().zip(&results) {
        for (at_once, all) in [1, burst].into_iter().zip(timed) {
            let pods = all.running.len().max(1) as f64;
            for (command, (calls, cpu, requests)) in &all.by_command {
                println!(
                    "| {label} | {at_once} | {command} | {:.2} | {:.1} | {:.1} |",
                    *calls as f64 / pods,
                    cpu / pods,
                    *requests as f64 / pods
                );
            }
        }
    }
    put(&binary, &installed.0, 0o755);
    put(&conflist, &installed.1, 0o644);
    api("DELETE", &format!("/api/v1/namespaces/{ns}"), None);
    if made_nodename {
        let _ = std::fs::remove_file(nodename);
    }
}
