//! Quickstart: two pods wired by the real `calico` binary through the CNI
//! exec contract, with `conf/10-calico-local.conflist` (embedded datastore,
//! `calico-ipam`, which is the same binary). Run as root:
//!
//!     cargo build --release && cargo run --release --example quickstart
//!
//! It creates an IP pool with `calico ipam pool add`, two network
//! namespaces, ADDs a pod in each, prints their addresses, routes, stored
//! WorkloadEndpoints and IPAM blocks, pings pod to pod and host to pod, DELs
//! both and shows that nothing is left. State (the datastore, the IPAM lock,
//! the log) lives in a temporary directory, so the host's /var/lib and
//! /var/run are not touched.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use calico_cni::datastore::ipam_model::IpamBlock;
use calico_cni::datastore::local::LocalStore;
use calico_cni::datastore::model::WorkloadEndpoint;
use calico_cni::datastore::{ListFilter, Store};
use serde_json::Value;

/// The pool the pods' addresses come from.
const POOL: &str = "10.250.0.0/24";

type Failure = Box<dyn std::error::Error>;

fn calico_binary() -> PathBuf {
    if let Ok(p) = std::env::var("CALICO_BIN") {
        return PathBuf::from(p);
    }
    // target/<profile>/examples/quickstart -> target/<profile>/calico
    let exe = std::env::current_exe().expect("current exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("calico")
}

fn sh(cmd: &str, args: &[&str]) -> Result<String, Failure> {
    let out = Command::new(cmd).args(args).output()?;
    if !out.status.success() {
        return Err(format!("{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Where a runtime finds the plugins: a directory of the state dir with
/// `calico-ipam`, a link to the `calico` binary (as installed next to it).
struct Cni<'a> {
    binary: &'a Path,
    path: String,
}

/// One CNI invocation, as a runtime makes it.
fn cni(
    cni: &Cni,
    command: &str,
    container: &str,
    netns: &str,
    conf: &Value,
) -> Result<String, Failure> {
    let binary = cni.binary;
    let env: HashMap<&str, &str> = HashMap::from([
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", container),
        ("CNI_NETNS", netns),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", &cni.path),
    ]);
    let mut child = Command::new(binary)
        .env_clear()
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(conf.to_string().as_bytes())?;
    let out = child.wait_with_output()?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!("{command} {container} failed: {stdout}").into());
    }
    Ok(stdout)
}

fn main() {
    if let Err(e) = run() {
        eprintln!("quickstart failed: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Failure> {
    if !nix::unistd::geteuid().is_root() {
        return Err("run as root: it creates network namespaces and veths".into());
    }
    let binary = calico_binary();
    if !binary.exists() {
        return Err(format!(
            "{} not found: run `cargo build --release` first",
            binary.display()
        )
        .into());
    }
    let state = tempfile::tempdir()?;
    let list: Value = serde_json::from_str(&std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/conf/10-calico-local.conflist"
    ))?)?;
    let mut plugin = list["plugins"][0].clone();
    let at = |name: &str| Value::from(state.path().join(name).to_string_lossy().into_owned());
    plugin["nodename"] = "quickstart-node".into();
    plugin["log_file_path"] = at("cni.log");
    plugin["local_datastore_path"] = at("store.db");
    plugin["ipam_lock_file"] = at("run/ipam.lock");
    // The list as installed in a conf dir, for `calico ipam pool add`.
    let mut installed = list.clone();
    installed["plugins"] = serde_json::json!([plugin.clone()]);
    let conflist = state.path().join("10-calico-local.conflist");
    std::fs::write(&conflist, serde_json::to_string_pretty(&installed)?)?;
    // What libcni does with a conflist: inject name and cniVersion.
    let mut conf = plugin;
    conf["name"] = list["name"].clone();
    conf["cniVersion"] = list["cniVersion"].clone();
    println!("== config (from conf/10-calico-local.conflist, state in a temp dir)\n{conf:#}\n");

    let conflist = conflist.to_string_lossy().into_owned();
    let pool = [
        "ipam",
        "pool",
        "add",
        "quickstart-ipv4-ippool",
        POOL,
        "--config",
        &conflist,
    ];
    println!("== calico {}", pool.join(" "));
    print!("{}", sh(&binary.to_string_lossy(), &pool)?);
    let list_pools = ["ipam", "pool", "list", "--config", &conflist];
    print!("{}", sh(&binary.to_string_lossy(), &list_pools)?);
    println!();

    let bin = state.path().join("bin");
    std::fs::create_dir_all(&bin)?;
    std::os::unix::fs::symlink(&binary, bin.join("calico-ipam"))?;
    let plugins = Cni {
        binary: &binary,
        path: bin.to_string_lossy().into_owned(),
    };

    let tag = std::process::id();
    let pods: Vec<(String, String)> = ["a", "b"]
        .iter()
        .map(|p| (format!("qs{tag}-{p}"), format!("{p}{tag:010}qs")))
        .collect();
    for (ns, _) in &pods {
        sh("ip", &["netns", "add", ns])?;
    }
    let outcome = wire_and_check(&plugins, &conf, &pods, state.path());
    for (ns, _) in &pods {
        let _ = sh("ip", &["netns", "del", ns]);
    }
    outcome?;

    // With every address released, the pool can go.
    let remove = [
        "ipam",
        "pool",
        "remove",
        "quickstart-ipv4-ippool",
        "--config",
        &conflist,
    ];
    println!("== calico {}", remove.join(" "));
    print!("{}", sh(&binary.to_string_lossy(), &remove)?);
    Ok(())
}

fn wire_and_check(
    plugins: &Cni,
    conf: &Value,
    pods: &[(String, String)],
    state: &Path,
) -> Result<(), Failure> {
    let mut ips = Vec::new();
    for (ns, cid) in pods {
        let result: Value = serde_json::from_str(&cni(
            plugins,
            "ADD",
            cid,
            &format!("/var/run/netns/{ns}"),
            conf,
        )?)?;
        let ip = result["ips"][0]["address"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        println!("== ADD {cid} in netns {ns}: {ip}");
        println!("{result:#}");
        println!(
            "-- addresses in {ns}:\n{}",
            sh("ip", &["netns", "exec", ns, "ip", "-br", "addr"])?
        );
        println!(
            "-- routes in {ns}:\n{}",
            sh("ip", &["netns", "exec", ns, "ip", "route"])?
        );
        ips.push(ip.split('/').next().unwrap_or_default().to_string());
    }
    println!(
        "-- host routes to the pods:\n{}",
        sh("ip", &["route", "show", "proto", "boot"])?
    );

    let store = LocalStore::open(&state.join("store.db"), std::time::Duration::from_secs(5))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let weps = runtime
        .block_on((&store as &dyn Store).list::<WorkloadEndpoint>("default", &ListFilter::All))?;
    println!("== stored WorkloadEndpoints ({}):", weps.len());
    for w in &weps {
        println!("{}", serde_json::to_string_pretty(w)?);
    }
    let blocks =
        runtime.block_on((&store as &dyn Store).list::<IpamBlock>("", &ListFilter::All))?;
    for b in &blocks {
        println!(
            "== IPAMBlock {} (affinity {}): {} addresses allocated",
            b.spec.cidr,
            b.spec.affinity.as_deref().unwrap_or("none"),
            allocated(b)
        );
    }

    println!("== ping pod a -> pod b ({})", ips[1]);
    print!(
        "{}",
        sh(
            "ip",
            &["netns", "exec", &pods[0].0, "ping", "-c2", "-W2", &ips[1]]
        )?
    );
    println!("== ping host -> pod a ({})", ips[0]);
    print!("{}", sh("ping", &["-c2", "-W2", &ips[0]])?);

    for (ns, cid) in pods {
        cni(plugins, "DEL", cid, &format!("/var/run/netns/{ns}"), conf)?;
        println!("== DEL {cid}: ok");
    }

    // Nothing may be left: veths, routes, reservations, endpoints.
    let links = sh("ip", &["-o", "link", "show"])?;
    let veths: Vec<_> = pods
        .iter()
        .map(|(_, cid)| format!("cali{}", &cid[..11]))
        .filter(|v| links.contains(v.as_str()))
        .collect();
    let routes = sh("ip", &["route", "show", "proto", "boot"])?;
    let leftover_routes: Vec<_> = ips
        .iter()
        .filter(|ip| routes.contains(ip.as_str()))
        .collect();
    let reservations: usize = runtime
        .block_on((&store as &dyn Store).list::<IpamBlock>("", &ListFilter::All))?
        .iter()
        .map(allocated)
        .sum();
    let weps = runtime
        .block_on((&store as &dyn Store).list::<WorkloadEndpoint>("default", &ListFilter::All))?;
    println!(
        "== left behind: host veths {veths:?}, host routes {leftover_routes:?}, allocated addresses {reservations}, WorkloadEndpoints {}",
        weps.len()
    );
    if !veths.is_empty() || !leftover_routes.is_empty() || reservations != 0 || !weps.is_empty() {
        return Err("something was left behind".into());
    }
    println!("== namespaces are deleted next; nothing else remains");
    Ok(())
}

/// Addresses allocated in a block.
fn allocated(block: &IpamBlock) -> usize {
    block
        .spec
        .allocations
        .iter()
        .filter(|a| a.is_some())
        .count()
}
