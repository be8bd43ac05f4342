//! Quickstart: two pods wired by the real `calico` binary through the CNI
//! exec contract, with `conf/10-calico-local.conflist` (embedded datastore,
//! Debian's host-local). Run as root:
//!
//!     cargo build --release && cargo run --release --example quickstart
//!
//! It creates two network namespaces, ADDs a pod in each, prints their
//! addresses, routes and stored WorkloadEndpoints, pings pod to pod and host
//! to pod, DELs both and shows that nothing is left. State lives in a
//! temporary directory, so the host's /var/lib is not touched.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use calico_cni::datastore::local::LocalStore;
use calico_cni::datastore::model::WorkloadEndpoint;
use calico_cni::datastore::{ListFilter, Store};
use serde_json::Value;

const CNI_BIN: &str = "/usr/lib/cni";

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

/// One CNI invocation, as a runtime makes it.
fn cni(
    binary: &Path,
    command: &str,
    container: &str,
    netns: &str,
    conf: &Value,
) -> Result<String, Failure> {
    let env: HashMap<&str, &str> = HashMap::from([
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", container),
        ("CNI_NETNS", netns),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", CNI_BIN),
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
    // What libcni does with a conflist: inject name and cniVersion.
    let mut conf = list["plugins"][0].clone();
    conf["name"] = list["name"].clone();
    conf["cniVersion"] = list["cniVersion"].clone();
    conf["nodename"] = "quickstart-node".into();
    conf["log_file_path"] = state.path().join("cni.log").to_string_lossy().into();
    conf["local_datastore_path"] = state.path().join("store.db").to_string_lossy().into();
    conf["ipam"]["dataDir"] = state.path().join("ipam").to_string_lossy().into();
    conf["ipam"]["ranges"] = serde_json::json!([[{"subnet": "10.250.0.0/24"}]]);
    println!("== config (from conf/10-calico-local.conflist, state in a temp dir)\n{conf:#}\n");

    let tag = std::process::id();
    let pods: Vec<(String, String)> = ["a", "b"]
        .iter()
        .map(|p| (format!("qs{tag}-{p}"), format!("{p}{tag:010}qs")))
        .collect();
    for (ns, _) in &pods {
        sh("ip", &["netns", "add", ns])?;
    }
    let outcome = wire_and_check(&binary, &conf, &pods, state.path());
    for (ns, _) in &pods {
        let _ = sh("ip", &["netns", "del", ns]);
    }
    outcome
}

fn wire_and_check(
    binary: &Path,
    conf: &Value,
    pods: &[(String, String)],
    state: &Path,
) -> Result<(), Failure> {
    let mut ips = Vec::new();
    for (ns, cid) in pods {
        let result: Value = serde_json::from_str(&cni(
            binary,
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
        cni(binary, "DEL", cid, &format!("/var/run/netns/{ns}"), conf)?;
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
    let reservations = std::fs::read_dir(state.join("ipam/k8s-pod-network"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| {
                    e.file_name().to_string_lossy().contains('.')
                        && !e.file_name().to_string_lossy().starts_with("last_")
                })
                .count()
        })
        .unwrap_or(0);
    let weps = runtime
        .block_on((&store as &dyn Store).list::<WorkloadEndpoint>("default", &ListFilter::All))?;
    println!(
        "== left behind: host veths {veths:?}, host routes {leftover_routes:?}, IP reservations {reservations}, WorkloadEndpoints {}",
        weps.len()
    );
    if !veths.is_empty() || !leftover_routes.is_empty() || reservations != 0 || !weps.is_empty() {
        return Err("something was left behind".into());
    }
    println!("== namespaces are deleted next; nothing else remains");
    Ok(())
}
