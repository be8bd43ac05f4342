//! A containerd of one test, as a Kubernetes node runs it: the peers'
//! containerd 2.x with its CRI plugin, Debian's runc behind the peers'
//! containerd-shim-runc-v2, and CNI from a bin directory of the test's own
//! holding the built plugin as `calico` (and `calico-ipam`) beside the
//! reference plugins. Everything it keeps (root, state, sockets, the CNI
//! directories, its log) lives in one temporary directory; `Drop` stops and
//! removes whatever sandboxes are left (so their DELs run), stops
//! containerd, and clears what a crash could leave behind (runc
//! containers with their cgroups, shims, mounts under that directory: the
//! sandboxes' netns bind mounts among them, so that their veths go too).
//!
//! Paths containerd 2.x keeps outside its root and state whatever the
//! config says: the shims' sockets in /run/containerd/s (named by a hash of
//! this instance's socket path, the namespace and the sandbox ID; removed
//! by the shim, or by `Drop` for a shim it had to kill; the directory
//! stays) and libcni's result cache in /var/lib/cni/results (one file per
//! network, sandbox and interface; removed by DEL, or by `Drop` for a
//! sandbox no DEL ran for). The one thing a crash leaves: the iptables
//! rules of a portmap whose DEL never ran.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::testbed::Testbed;

/// The OCI runtime: Debian's runc (apt package `runc`).
pub const RUNC: &str = "/usr/sbin/runc";

/// The peers this needs from PEERS_BIN.
const PEERS: &[&str] = &[
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "crictl",
    "host-local",
    "portmap",
    "bandwidth",
    "loopback",
];

/// The reference plugins linked into the CNI bin directory.
const CNI_PEERS: &[&str] = &["host-local", "portmap", "bandwidth", "loopback", "ptp"];

/// How long one crictl or ctr call may take (a sandbox's ADD or DEL runs
/// inside it; the plugin's own deadline is 30 s).
const CALL_TIMEOUT: Duration = Duration::from_secs(90);

/// The binaries (peers, runc, `tools` on PATH) and files a containerd of
/// this kind needs; what is missing, if anything.
pub fn missing(bed: &Testbed, tools: &[&str]) -> Option<String> {
    let mut gone: Vec<String> = PEERS
        .iter()
        .filter(|p| !bed.peer(p).is_file())
        .map(|p| bed.peer(p).display().to_string())
        .collect();
    if !Path::new(RUNC).is_file() {
        gone.push(format!("{RUNC} (apt package runc)"));
    }
    for t in tools {
        if which(t).is_none() {
            gone.push(format!("{t} on PATH"));
        }
    }
    let tar = bed.var("TESTBED_PAUSE_TAR");
    if !Path::new(tar).is_file() {
        gone.push(tar.to_string());
    }
    (!gone.is_empty()).then(|| format!("missing {}", gone.join(", ")))
}

/// `name` on the PATH containerd and the plugins run with.
pub fn which(name: &str) -> Option<PathBuf> {
    search_path()
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// The path of `name` (see `which`); panics when there is none.
pub fn tool(name: &str) -> String {
    which(name)
        .unwrap_or_else(|| panic!("{name} not found on {}", search_path()))
        .to_string_lossy()
        .into_owned()
}

fn search_path() -> String {
    let mut path = String::from("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    if let Ok(p) = std::env::var("PATH") {
        path.push(':');
        path.push_str(&p);
    }
    path
}

/// A test-owned containerd; stopped, with everything it made, on drop.
pub struct Containerd {
    pub dir: tempfile::TempDir,
    peers: PathBuf,
    child: Option<Child>,
    pause_image: String,
    pause_tar: String,
    cgroup_parent: String,
    files: AtomicU32,
}

impl Containerd {
    /// Starts containerd, waits until its CRI answers, imports the sandbox
    /// image. Panics (after cleaning up) when any step fails.
    pub fn start(bed: &Testbed) -> Containerd {
        let dir = tempfile::Builder::new()
            .prefix("ctrd-")
            .tempdir()
            .expect("tempdir");
        // Like /var/lib/containerd: traversable, not listable.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let mut c = Containerd {
            dir,
            peers: bed.peers_bin().into(),
            child: None,
            pause_image: bed.var("TESTBED_PAUSE_IMAGE").to_string(),
            pause_tar: bed.var("TESTBED_PAUSE_TAR").to_string(),
            cgroup_parent: format!("/calico-cni-test-{}", super::unique()),
            files: AtomicU32::new(0),
        };
        for d in [c.root(), c.state(), c.bin_dir(), c.conf_dir(), c.pod_logs()] {
            std::fs::create_dir_all(d).unwrap();
        }
        // The plugin as a Kubernetes node installs it: `calico` and a
        // `calico-ipam` link to it (the binary picks its personality from
        // argv[0], which libcni sets to the path it execs).
        std::os::unix::fs::symlink(super::CALICO, c.bin_dir().join("calico")).unwrap();
        std::os::unix::fs::symlink("calico", c.bin_dir().join("calico-ipam")).unwrap();
        for p in CNI_PEERS {
            std::os::unix::fs::symlink(bed.peer(p), c.bin_dir().join(p)).unwrap();
        }
        std::fs::write(c.config_path(), c.config_toml()).unwrap();
        std::fs::write(
            c.crictl_config(),
            format!(
                "runtime-endpoint: unix://{sock}\nimage-endpoint: unix://{sock}\ntimeout: 60\n\
                 debug: false\npull-image-on-create: false\n",
                sock = c.socket().display()
            ),
        )
        .unwrap();

        let log = std::fs::File::create(c.log_path()).unwrap();
        let child = Command::new(c.peers.join("containerd"))
            .arg("--config")
            .arg(c.config_path())
            .env_clear()
            .env("PATH", c.path_env())
            .env("TMPDIR", c.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("spawn containerd");
        c.child = Some(child);
        c.wait_ready();
        c.import_pause_image();
        c
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }
    pub fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }
    /// CRI's CNI bin_dirs (the only one).
    pub fn bin_dir(&self) -> PathBuf {
        self.dir.path().join("cni/bin")
    }
    /// CRI's CNI conf_dir.
    pub fn conf_dir(&self) -> PathBuf {
        self.dir.path().join("cni/net.d")
    }
    pub fn pod_logs(&self) -> PathBuf {
        self.dir.path().join("pods")
    }
    /// The cgroup parent for this instance's sandboxes (kubelet always
    /// sets one; CRI then also passes the cgroupPath capability). Removed
    /// from every hierarchy on drop.
    pub fn cgroup_parent(&self) -> &str {
        &self.cgroup_parent
    }
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("containerd.log")
    }
    fn config_path(&self) -> PathBuf {
        self.dir.path().join("config.toml")
    }
    fn crictl_config(&self) -> PathBuf {
        self.dir.path().join("crictl.yaml")
    }
    /// containerd's PATH (the shim and iptables for portmap are found on
    /// it; libcni hands the plugins containerd's environment).
    fn path_env(&self) -> String {
        format!("{}:{}", self.peers.display(), search_path())
    }

    fn config_toml(&self) -> String {
        let q = |p: PathBuf| serde_json::to_string(&p.to_string_lossy()).unwrap();
        let runtime = r#"plugins."io.containerd.cri.v1.runtime""#;
        format!(
            r#"version = 3
root = {root}
state = {state}
# No drop-ins from /etc/containerd/conf.d.
imports = []
# Plugins that would reach outside this directory (opt: /opt/containerd and
# PATH; NRI: /var/run/nri/nri.sock) or that nothing here uses.
disabled_plugins = [
  "io.containerd.internal.v1.opt",
  "io.containerd.nri.v1.nri",
  "io.containerd.internal.v1.tracing",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.differ.v1.erofs",
  "io.containerd.mount-handler.v1.erofs",
]

[grpc]
  address = {sock}

[ttrpc]
  address = {ttrpc}

[debug]
  level = "debug"

[metrics]
  address = ""

# Required by the transfer service; by default it reads /opt/containerd.
[plugins."io.containerd.image-verifier.v1.bindir"]
  bin_dir = {verifiers}

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = {pause}

[{runtime}]
  # The sandboxes' netns bind mounts under state/ rather than /var/run/netns.
  netns_mounts_under_state_dir = true
  # Sandboxes get oom_score_adj -998 by default, which needs
  # CAP_SYS_RESOURCE; where that is not in the bounding set (as on the
  # machines this project runs on) runc init fails with "can't get final
  # child's PID from pipe: EOF". Capped at containerd's own score instead.
  restrict_oom_score_adj = true
  enable_cdi = false
  [{runtime}.containerd]
    default_runtime_name = "runc"
    [{runtime}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{runtime}.containerd.runtimes.runc.options]
        BinaryName = {runc}
        Root = {runc_root}
        SystemdCgroup = false
  [{runtime}.cni]
    bin_dirs = [{bin}]
    conf_dir = {conf}
    max_conf_num = 1

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#,
            root = q(self.root()),
            state = q(self.state()),
            sock = q(self.socket()),
            ttrpc = q(self.dir.path().join("containerd.sock.ttrpc")),
            verifiers = q(self.dir.path().join("image-verifier")),
            pause = serde_json::to_string(&self.pause_image).unwrap(),
            runc = q(RUNC.into()),
            runc_root = q(self.state().join("runc")),
            bin = q(self.bin_dir()),
            conf = q(self.conf_dir()),
        )
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// The last `lines` lines of containerd's log (the plugins' stderr is
    /// in it too).
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn wait_ready(&mut self) {
        let end = Instant::now() + Duration::from_secs(60);
        let mut last = String::new();
        loop {
            if !self.alive() {
                panic!("containerd exited at start:\n{}", self.log_tail(60));
            }
            // A CRI plugin that failed to load never comes: say why at once.
            let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
            if let Some(line) = log.lines().find(|l| {
                l.contains("failed to load plugin") && l.contains("id=io.containerd.grpc.v1.cri ")
            }) {
                panic!("containerd's CRI plugin did not load: {line}");
            }
            if self.socket().exists() {
                let out = self.crictl(&["info"]);
                if out.status.success() {
                    let info: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
                    if condition(&info, "RuntimeReady")["status"] == true {
                        return;
                    }
                    last = format!("{}", info["status"]);
                } else {
                    last = String::from_utf8_lossy(&out.stderr).into_owned();
                }
            }
            assert!(
                Instant::now() < end,
                "containerd's CRI not ready after 60 s: {last}\n{}",
                self.log_tail(60)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The sandbox image from the test bed's OCI layout tar, into CRI's
    /// namespace (nothing is ever pulled).
    fn import_pause_image(&self) {
        let tar = &self.pause_tar;
        let sock = self.socket();
        let out = self.run(Command::new(self.peers.join("ctr")).args([
            "-a",
            &sock.to_string_lossy(),
            "-n",
            "k8s.io",
            "images",
            "import",
            tar,
        ]));
        assert!(
            out.status.success(),
            "ctr images import {tar}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let image = self.crictl_json(&["inspecti", &self.pause_image]);
        assert!(
            image["status"]["id"].is_string(),
            "sandbox image not in CRI after import: {image}"
        );
    }

    fn run(&self, cmd: &mut Command) -> Output {
        cmd.env("PATH", self.path_env());
        run_bounded(cmd, CALL_TIMEOUT)
    }

    /// `crictl` against this containerd (its own crictl.yaml).
    pub fn crictl(&self, args: &[&str]) -> Output {
        self.run(
            Command::new(self.peers.join("crictl"))
                .arg("--config")
                .arg(self.crictl_config())
                .args(args),
        )
    }

    /// `crictl`, which must succeed; its stdout.
    pub fn crictl_ok(&self, args: &[&str]) -> String {
        let out = self.crictl(args);
        assert!(
            out.status.success(),
            "crictl {args:?} failed: {}\n--- containerd log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log_tail(40)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `crictl` whose stdout is JSON.
    pub fn crictl_json(&self, args: &[&str]) -> Value {
        let out = self.crictl_ok(args);
        serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("crictl {args:?}: not JSON ({e}): {out}"))
    }

    /// `crictl info` (CRI Status, verbose).
    pub fn info(&self) -> Value {
        self.crictl_json(&["info"])
    }

    /// Writes `conflist` as the one conflist in conf_dir and waits (30 s at
    /// most) until CRI has loaded it and reports NetworkReady.
    pub fn write_conflist(&self, conflist: &Value) {
        let name = conflist["name"].as_str().expect("conflist name");
        // Written beside and renamed: the conf syncer never reads half a file.
        let tmp = self.conf_dir().join(".10-calico.tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(conflist).unwrap()).unwrap();
        std::fs::rename(&tmp, self.conf_dir().join("10-calico.conflist")).unwrap();
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let info = self.info();
            let loaded = info["cniconfig"]["Networks"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|n| n["Config"]["Name"] == name)
                .and_then(|n| n["Config"]["Source"].as_str())
                .and_then(|s| serde_json::from_str::<Value>(s).ok());
            let ready = condition(&info, "NetworkReady");
            if loaded.as_ref() == Some(conflist) && ready["status"] == true {
                return;
            }
            assert!(
                Instant::now() < end,
                "conflist {name} not loaded or network not ready after 30 s: \
                 loaded {loaded:?}, NetworkReady {ready}, lastCNILoadStatus {}\n{}",
                info["lastCNILoadStatus"],
                self.log_tail(40)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `crictl runp` of `config` (a PodSandboxConfig); the sandbox ID.
    pub fn runp(&self, config: &Value) -> String {
        let n = self.files.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.path().join(format!("sandbox-{n}.json"));
        std::fs::write(&path, config.to_string()).unwrap();
        let id = self
            .crictl_ok(&["runp", &path.to_string_lossy()])
            .trim()
            .to_string();
        assert!(
            id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "crictl runp printed {id:?}"
        );
        id
    }

    pub fn inspectp(&self, id: &str) -> Value {
        self.crictl_json(&["inspectp", "-o", "json", id])
    }

    /// IDs of the sandboxes CRI knows.
    pub fn pods(&self) -> Vec<String> {
        self.crictl_ok(&["pods", "-q"])
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    }

    /// The network namespace of a running sandbox, from `crictl inspectp`
    /// (the path in its runtime spec), checked against its pause process's
    /// /proc/PID/ns/net.
    pub fn sandbox_netns(&self, id: &str) -> SandboxNetns {
        let v = self.inspectp(id);
        let path = v["info"]["runtimeSpec"]["linux"]["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|n| n["type"] == "network")
            .and_then(|n| n["path"].as_str())
            .unwrap_or_else(|| panic!("sandbox {id}: no network namespace path: {v}"))
            .to_string();
        let pid = v["info"]["pid"].as_u64().expect("sandbox pid");
        let by_path = std::fs::metadata(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let by_pid = std::fs::metadata(format!("/proc/{pid}/ns/net")).unwrap();
        assert_eq!(
            (by_path.dev(), by_path.ino()),
            (by_pid.dev(), by_pid.ino()),
            "{path} is not the netns of the sandbox's process {pid}"
        );
        SandboxNetns { path, pid }
    }

    fn cleanup(&mut self) {
        if self.alive() && self.socket().exists() {
            // Stopping runs each sandbox's CNI DEL; removing drops the record.
            let ids = self
                .crictl(&["pods", "-q"])
                .stdout
                .split(|b| *b == b'\n')
                .map(|l| String::from_utf8_lossy(l).trim().to_string())
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>();
            for id in &ids {
                let _ = self.crictl(&["stopp", id]);
                let _ = self.crictl(&["rmp", "-f", id]);
            }
        }
        if let Some(mut child) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let end = Instant::now() + Duration::from_secs(10);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        // What a crash could leave: runc containers (the pause processes and
        // their cgroups), then this instance's shims.
        let runc_root = self.state().join("runc");
        for ns in std::fs::read_dir(&runc_root)
            .into_iter()
            .flatten()
            .flatten()
        {
            let root = ns.path();
            let list = run_bounded(
                Command::new(RUNC)
                    .arg("--root")
                    .arg(&root)
                    .args(["list", "-q"]),
                Duration::from_secs(10),
            );
            for id in String::from_utf8_lossy(&list.stdout).split_whitespace() {
                // No DEL ran for it: libcni's cached result stays otherwise.
                for cached in std::fs::read_dir("/var/lib/cni/results")
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    if cached
                        .file_name()
                        .to_string_lossy()
                        .contains(&format!("-{id}-"))
                    {
                        let _ = std::fs::remove_file(cached.path());
                    }
                }
                let _ = run_bounded(
                    Command::new(RUNC)
                        .arg("--root")
                        .arg(&root)
                        .args(["delete", "--force", id]),
                    Duration::from_secs(10),
                );
            }
        }
        for pid in shims_of(&self.socket()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        // A killed shim leaves its sockets in /run/containerd/s, named
        // sha256("SOCKET/NAMESPACE/ID") and sha256(".../ID/debug").
        let tasks = self.state().join("io.containerd.runtime.v2.task");
        for ns in std::fs::read_dir(&tasks).into_iter().flatten().flatten() {
            for task in std::fs::read_dir(ns.path()).into_iter().flatten().flatten() {
                let base = format!(
                    "{}/{}/{}",
                    self.socket().display(),
                    ns.file_name().to_string_lossy(),
                    task.file_name().to_string_lossy()
                );
                for path in [base.clone(), format!("{base}/debug")] {
                    if let Some(hash) = sha256_hex(&path) {
                        let _ = std::fs::remove_file(Path::new("/run/containerd/s").join(hash));
                    }
                }
            }
        }
        // Mounts under this directory, deepest first: the netns bind mounts
        // (a netns unmounted and unreferenced is gone, and the veths in it
        // with it), shm, rootfs overlays.
        unmount_under(self.dir.path());
        for hierarchy in cgroup_mounts() {
            let _ = std::fs::remove_dir(hierarchy.join(self.cgroup_parent.trim_start_matches('/')));
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// A sandbox's network namespace (a containerd bind mount).
pub struct SandboxNetns {
    pub path: String,
    pub pid: u64,
}

impl SandboxNetns {
    /// `ip -j ARGS` inside; panics when `ip` fails.
    pub fn ip_json(&self, args: &[&str]) -> Value {
        let net = format!("--net={}", self.path);
        let mut full = vec![net.as_str(), "ip", "-j"];
        full.extend_from_slice(args);
        let nsenter = tool("nsenter");
        let out = super::run_ok(&nsenter, &full);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("ip -j {args:?}: {e}: {out}"))
    }
}

/// The status of CRI condition `kind` in `crictl info`.
pub fn condition<'a>(info: &'a Value, kind: &str) -> &'a Value {
    info["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == kind)
        .unwrap_or(&Value::Null)
}

/// Runs `cmd` to completion, killing it after `timeout` (its output so far,
/// status failed, then).
pub fn run_bounded(cmd: &mut Command, timeout: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let reader = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    };
    let out = reader(Box::new(child.stdout.take().unwrap()));
    let err = reader(Box::new(child.stderr.take().unwrap()));
    let end = Instant::now() + timeout;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() >= end {
            let _ = child.kill();
            break child.wait().expect("wait");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stderr = err.join().unwrap();
    if Instant::now() >= end {
        stderr.extend_from_slice(format!("\n(killed after {timeout:?})").as_bytes());
    }
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr,
    }
}

/// sha256 of `text` in hex, by coreutils' sha256sum (no hash crate here).
fn sha256_hex(text: &str) -> Option<String> {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .ok()?;
    std::io::Write::write_all(&mut child.stdin.take()?, text.as_bytes()).ok()?;
    let out = child.wait_with_output().ok()?;
    let hex = String::from_utf8_lossy(&out.stdout);
    let hex = hex.split_whitespace().next()?;
    (out.status.success() && hex.len() == 64).then(|| hex.to_string())
}

/// PIDs of containerd-shim-runc-v2 processes serving the containerd at
/// `socket` (started with `-address SOCKET`).
fn shims_of(socket: &Path) -> Vec<i32> {
    let want = socket.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            args.first()
                .is_some_and(|a| a.ends_with("containerd-shim-runc-v2"))
                && args.windows(2).any(|w| w[0] == "-address" && w[1] == want)
        })
        .collect()
}

/// Mount points of the cgroup (v1) and cgroup2 hierarchies.
fn cgroup_mounts() -> Vec<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mountinfo
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let fstype = post.split(' ').next()?;
            let point = pre.split(' ').nth(4)?;
            (fstype == "cgroup" || fstype == "cgroup2")
                .then(|| PathBuf::from(unescape_mount_path(point)))
        })
        .collect()
}

/// Lazily unmounts every mount point under `dir`, deepest first.
fn unmount_under(dir: &Path) {
    let prefix = format!("{}/", dir.display());
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<String> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mount_path)
        .filter(|p| p.starts_with(&prefix))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    points.dedup();
    for p in points {
        let c = std::ffi::CString::new(p).unwrap();
        // SAFETY: a valid NUL-terminated path; umount2 only reads it.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// /proc/self/mountinfo escapes space, tab, newline and backslash as \ooo.
fn unescape_mount_path(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
