//! Shared helpers for the integration tests: running the built binary
//! through the CNI exec contract, RAII network namespaces, unique names,
//! and reading kernel state back with `ip -j`.

#![allow(dead_code)]

pub mod containerd;
pub mod etcd;
pub mod faultproxy;
pub mod ipam;
pub mod testbed;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{Value, json};

pub const CALICO: &str = env!("CARGO_BIN_EXE_calico");
pub const CNI_BIN: &str = "/usr/lib/cni";

/// A test that cannot run here: under CI=true it fails, otherwise it is
/// skipped, saying why.
pub fn cannot_run(test: &str, why: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test} cannot run under CI=true: {why}");
    }
    eprintln!("skipping {test}: {why}");
}

/// True when running as root; otherwise the test cannot run (see `cannot_run`).
pub fn root_or_skip(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    cannot_run(test, "needs root (network namespaces and veths)");
    false
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A short token unique to this process and call (hex).
pub fn unique() -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut seed = [0u8; 4];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut seed))
        .expect("urandom");
    format!("{:08x}{:03x}", u32::from_ne_bytes(seed), n & 0xfff)
}

/// A network namespace made for one test, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new() -> Netns {
        let name = format!("cnit-{}", unique());
        run_ok("ip", &["netns", "add", &name]);
        Netns { name }
    }
    pub fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }
    /// `ip -j ...` inside the namespace. Panics, with the command and its
    /// stderr, when `ip` fails (a device that does not exist included: ask
    /// `link` whether one does).
    pub fn ip_json(&self, args: &[&str]) -> Value {
        let mut full = vec!["netns", "exec", &self.name, "ip", "-j"];
        full.extend_from_slice(args);
        ip_json_of(&full)
    }
    /// The destinations of the namespace's IPv4 routes (`default` for the
    /// default route).
    pub fn route_dsts(&self) -> Vec<String> {
        self.ip_json(&["-4", "route"])
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["dst"].as_str().unwrap().to_string())
            .collect()
    }

    /// The link called `name` in the namespace (`ip -j link show`, filtered),
    /// `None` when there is none; panics when `ip` fails.
    pub fn link(&self, name: &str) -> Option<Value> {
        find_link(self.ip_json(&["link", "show"]), name)
    }
    pub fn sysctl(&self, key: &str) -> String {
        run_ok(
            "ip",
            &[
                "netns",
                "exec",
                &self.name,
                "cat",
                &format!("/proc/sys/{key}"),
            ],
        )
        .trim()
        .to_string()
    }
    pub fn exec(&self, cmd: &[&str]) -> std::process::Output {
        let mut full = vec!["netns", "exec", &self.name];
        full.extend_from_slice(cmd);
        Command::new("ip")
            .args(&full)
            .output()
            .expect("ip netns exec")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

pub fn run_ok(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `ip ARGS` and parses the JSON it prints (`ARGS` carry `-j`).
/// Panics, naming the command and its stderr, when `ip` fails or prints
/// anything but JSON, so that a broken `ip` never reads as "nothing there".
/// A dump the kernel reports as interrupted (links or routes changed under
/// it, as other tests' do) is retried.
fn ip_json_of(args: &[&str]) -> Value {
    for attempt in 0..20 {
        let out = Command::new("ip").args(args).output().expect("spawn ip");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("Dump was interrupted") {
            std::thread::sleep(std::time::Duration::from_millis(5 * attempt));
            continue;
        }
        assert!(
            out.status.success(),
            "ip {} failed ({}): {stderr}",
            args.join(" "),
            out.status
        );
        return serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "ip {} printed no JSON ({e}): {:?} / stderr {stderr}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout)
            )
        });
    }
    panic!("ip {}: dump interrupted 20 times in a row", args.join(" "))
}

/// The entry named `name` in an `ip -j link show` listing.
fn find_link(links: Value, name: &str) -> Option<Value> {
    let Value::Array(links) = links else {
        panic!("ip -j link show printed no list: {links}");
    };
    links.into_iter().find(|l| l["ifname"] == name)
}

/// `ip -j ...` in the host namespace; panics when `ip` fails (see `ip_json_of`).
pub fn host_ip_json(args: &[&str]) -> Value {
    let mut full = vec!["-j"];
    full.extend_from_slice(args);
    ip_json_of(&full)
}

/// The host link called `name` (`ip -j link show dev NAME`: one link, no
/// dump to be interrupted), `None` when there is none; panics when `ip`
/// fails otherwise.
pub fn host_link(name: &str) -> Option<Value> {
    let out = Command::new("ip")
        .args(["-j", "link", "show", "dev", name])
        .output()
        .expect("spawn ip");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // (A link deleted while `ip` asks for it: "No such device".)
    if !out.status.success()
        && (stderr.contains("does not exist") || stderr.contains("No such device"))
    {
        return None;
    }
    assert!(
        out.status.success(),
        "ip -j link show dev {name} failed: {stderr}"
    );
    let links: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("ip -j link show dev {name} printed no JSON ({e})"));
    find_link(links, name)
}

/// Whether the host has a link called `name`; panics when `ip` fails.
pub fn host_link_exists(name: &str) -> bool {
    host_link(name).is_some()
}

pub fn host_sysctl(key: &str) -> String {
    std::fs::read_to_string(format!("/proc/sys/{key}"))
        .unwrap()
        .trim()
        .to_string()
}

/// What one plugin run printed.
#[derive(Debug)]
pub struct Outcome {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}): {:?} / stderr {}",
                self.stdout, self.stderr
            )
        })
    }
    pub fn assert_ok(&self) -> &Self {
        assert_eq!(
            self.code, 0,
            "plugin failed: {} / {}",
            self.stdout, self.stderr
        );
        self
    }
    pub fn error_code(&self) -> u64 {
        assert_ne!(self.code, 0, "expected failure: {}", self.stdout);
        self.json()["code"].as_u64().expect("error code")
    }
}

/// Runs `binary` with exactly `env` and `stdin`.
pub fn exec(binary: &str, env: &HashMap<String, String>, stdin: &str) -> Outcome {
    exec_args(binary, &[], env, stdin)
}

/// Runs `binary` with arguments `args`, exactly `env` and `stdin`.
pub fn exec_args(
    binary: &str,
    args: &[&str],
    env: &HashMap<String, String>,
    stdin: &str,
) -> Outcome {
    let mut child = Command::new(binary)
        .args(args)
        .env_clear()
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn plugin");
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    let out = child.wait_with_output().expect("wait");
    Outcome {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

pub fn env_of(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    let mut env: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    env.insert("PATH".into(), std::env::var("PATH").unwrap_or_default());
    env
}

/// One test's private plugin setup: a state directory (embedded store,
/// host-local data), a subnet of its own, and the config to run with.
pub struct Setup {
    pub dir: tempfile::TempDir,
    pub subnet: String,
    pub subnet6: String,
    pub conf: Value,
}

static SUBNET: AtomicU32 = AtomicU32::new(0);

impl Setup {
    /// `version`: cniVersion; `dual`: add an IPv6 range.
    pub fn new(version: &str, dual: bool) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        // A /24 per test: pid and a counter keep parallel test processes apart.
        let n = (std::process::id() % 200) * 50 + SUBNET.fetch_add(1, Ordering::Relaxed) % 50;
        let subnet = format!("10.{}.{}.0/24", 100 + n / 256 % 100, n % 256);
        let subnet6 = format!("fd00:{:x}:{:x}::/64", 100 + n / 256 % 100, n % 256);
        let mut ranges = vec![json!([{"subnet": subnet}])];
        if dual {
            ranges.push(json!([{"subnet": subnet6}]));
        }
        let conf = json!({
            "cniVersion": version,
            "name": "net1",
            "type": "calico",
            "log_level": "debug",
            "log_file_path": dir.path().join("log/cni.log"),
            "nodename": "test-node",
            "mtu_file": dir.path().join("mtu"),
            "local_datastore_path": dir.path().join("store.db"),
            "ipam": {
                "type": "host-local",
                "ranges": ranges,
                "dataDir": dir.path().join("ipam"),
            },
        });
        Setup {
            dir,
            subnet,
            subnet6,
            conf,
        }
    }

    pub fn ipam_dir(&self) -> PathBuf {
        self.dir.path().join("ipam").join("net1")
    }

    /// Address reservations host-local still holds.
    pub fn reservations(&self) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(self.ipam_dir()) else {
            return vec![];
        };
        rd.filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with("last_reserved_ip") && n != "lock")
            .collect()
    }

    pub fn store_path(&self) -> PathBuf {
        self.dir.path().join("store.db")
    }

    /// Stored WorkloadEndpoints (read straight from the embedded store's file).
    pub fn endpoints(&self) -> Vec<Value> {
        self.stored("WorkloadEndpoint")
    }

    /// Stored objects of one kind, from the embedded store's file.
    pub fn stored(&self, kind: &str) -> Vec<Value> {
        if !self.store_path().exists() {
            return vec![];
        }
        let conn = rusqlite::Connection::open(self.store_path()).unwrap();
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .unwrap();
        let mut stmt = conn
            .prepare("SELECT value FROM resources WHERE kind = ?1 ORDER BY name")
            .unwrap();
        stmt.query_map([kind], |row| row.get::<_, String>(0))
            .unwrap()
            .map(|v| serde_json::from_str(&v.unwrap()).unwrap())
            .collect()
    }

    pub fn run(&self, command: &str, container: &str, netns: &str, ifname: &str) -> Outcome {
        self.run_with(command, container, netns, ifname, &self.conf, &[])
    }

    pub fn run_with(
        &self,
        command: &str,
        container: &str,
        netns: &str,
        ifname: &str,
        conf: &Value,
        extra: &[(&str, &str)],
    ) -> Outcome {
        let mut env = env_of(&[
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", container),
            ("CNI_NETNS", netns),
            ("CNI_IFNAME", ifname),
            ("CNI_PATH", CNI_BIN),
        ]);
        for (k, v) in extra {
            env.insert(k.to_string(), v.to_string());
        }
        exec(CALICO, &env, &conf.to_string())
    }
}

/// One ping of `ip` from the netns `from` (the host when `None`) answers;
/// `what` names the path in the failure.
pub fn assert_ping(from: Option<&Netns>, ip: &str, what: &str) {
    let args = ["ping", "-c1", "-W2", ip];
    let out = match from {
        Some(ns) => ns.exec(&args),
        None => Command::new(args[0]).args(&args[1..]).output().unwrap(),
    };
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A container ID whose first 11 characters are unique (they name the host veth).
pub fn container_id() -> String {
    format!("{}c", unique())
}

pub fn host_veth(container: &str) -> String {
    format!("cali{}", &container[..11])
}

pub fn exists(p: &Path) -> bool {
    p.exists()
}

/// Runs a future to completion on a fresh current-thread runtime.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// A faulted ADD failed as it must: exit 1 with a CNI error JSON, within
/// the deadline (`deadline_s`) and the rollback's own budget (5 s), with
/// neither the pod's interface nor the host veth left.
pub fn assert_failed_cleanly(
    what: &str,
    out: &Outcome,
    took: std::time::Duration,
    deadline_s: u64,
    netns: &Netns,
    host_veth: &str,
) {
    assert_eq!(out.code, 1, "{what}: {out:?}");
    let reply: Value = out.json();
    assert!(
        reply["code"].as_u64().is_some() && reply["msg"].is_string(),
        "{what}: {reply}"
    );
    assert!(
        took < std::time::Duration::from_secs(deadline_s + 5 + 1),
        "{what}: ADD took {took:?}"
    );
    assert!(netns.link("eth0").is_none(), "{what}: eth0 left");
    assert!(!host_link_exists(host_veth), "{what}: host veth left");
}

/// The owed entries' files of a release queue directory (a directory per
/// network; the dead letters, `.dead`, apart), sorted.
#[allow(dead_code)]
pub fn queue_entry_files(queue: &Path) -> Vec<PathBuf> {
    let Ok(networks) = std::fs::read_dir(queue) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = networks
        .filter_map(Result::ok)
        .filter(|n| !n.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|n| std::fs::read_dir(n.path()).ok())
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "json")
                && !p.file_name().unwrap().to_string_lossy().starts_with('.')
        })
        .collect();
    out.sort();
    out
}

/// Makes every owed entry of a queue due now (an entry's modification time
/// is when it is next due), as if its backoff had passed.
#[allow(dead_code)]
pub fn make_queue_due(queue: &Path) {
    for entry in queue_entry_files(queue) {
        let f = std::fs::File::options().write(true).open(&entry).unwrap();
        f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(1))
            .unwrap();
    }
}
