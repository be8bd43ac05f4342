//! etcd for the tests: the test bed's Calico cluster (three TLS members of
//! `scripts/testbed.sh`, separate from the etcd behind kube-apiserver) and
//! private clusters a test starts, stops and restarts member by member.
//!
//! Every read-back and admin write goes through the real server with the
//! peers' `etcdctl` (`-w json`), so that nothing the tests check shares code
//! with the plugin's own etcd client.

use std::ffi::OsStr;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::Value;

/// How to reach one etcd cluster as a client: its client URLs and the TLS
/// files (the CA that signed the servers, a client certificate and key).
#[derive(Clone, Debug)]
pub struct EtcdAccess {
    pub endpoints: Vec<String>,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The test bed's Calico etcd (TESTBED_CALICO_ETCD_*), with the plugin's
/// client certificate (CN calico-cni); `None` when the test cannot run (see
/// `testbed`).
pub fn calico_etcd(test: &str) -> Option<EtcdAccess> {
    let bed = crate::common::testbed::testbed(test)?;
    crate::common::testbed::peer(test, "etcdctl")?;
    let Some(endpoints) = bed.var_opt("TESTBED_CALICO_ETCD_ENDPOINTS") else {
        crate::common::cannot_run(
            test,
            "the test bed exports no TESTBED_CALICO_ETCD_ENDPOINTS (an environment \
             from an older scripts/testbed.sh env?)",
        );
        return None;
    };
    Some(EtcdAccess {
        endpoints: endpoints.split(',').map(str::to_string).collect(),
        ca: bed.var("TESTBED_CALICO_ETCD_CA").into(),
        cert: bed.var("TESTBED_CALICO_ETCD_CERT").into(),
        key: bed.var("TESTBED_CALICO_ETCD_KEY").into(),
    })
}

/// The peers' etcdctl (PEERS_BIN, or scripts/peers.sh's cache).
fn etcdctl_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| super::testbed::peers_bin_dir().join("etcdctl"))
}

fn b64(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .unwrap_or_else(|e| panic!("etcdctl printed bad base64 {s:?}: {e}"))
}

/// The `kvs` of an etcdctl `get -w json`: (key, value or empty, mod_revision).
fn kvs(v: &Value) -> Vec<(String, Vec<u8>, i64)> {
    let Some(kvs) = v.get("kvs") else {
        return vec![];
    };
    kvs.as_array()
        .unwrap_or_else(|| panic!("etcdctl: kvs is no list: {v}"))
        .iter()
        .map(|kv| {
            let key =
                String::from_utf8(b64(kv["key"].as_str().expect("key"))).expect("a UTF-8 key");
            // Go's encoding/json leaves out an empty value.
            let value = kv["value"].as_str().map(b64).unwrap_or_default();
            let rev = kv["mod_revision"].as_i64().expect("mod_revision");
            (key, value, rev)
        })
        .collect()
}

impl EtcdAccess {
    /// `https://a,https://b,...` (what ETCD_ENDPOINTS / etcd_endpoints take).
    pub fn endpoints_csv(&self) -> String {
        self.endpoints.join(",")
    }

    /// The same cluster through only some of its endpoints.
    pub fn with_endpoints(&self, endpoints: &[String]) -> EtcdAccess {
        EtcdAccess {
            endpoints: endpoints.to_vec(),
            ..self.clone()
        }
    }

    /// An etcdctl command against this cluster (endpoints and TLS set;
    /// the default command timeout of 5 s). Add the subcommand's arguments.
    pub fn etcdctl_command(&self) -> Command {
        let mut cmd = Command::new(etcdctl_bin());
        // Only the flags below: etcdctl takes ETCDCTL_* for its flags.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ETCDCTL_") {
                cmd.env_remove(k);
            }
        }
        cmd.arg(format!("--endpoints={}", self.endpoints_csv()))
            .arg(format!("--cacert={}", self.ca.display()))
            .arg(format!("--cert={}", self.cert.display()))
            .arg(format!("--key={}", self.key.display()))
            .stdin(Stdio::null());
        cmd
    }

    /// Runs etcdctl with `args` (stdin `input`, if any); its output, whether
    /// it succeeded or not.
    pub fn etcdctl_output(&self, args: &[&str], input: Option<&[u8]>) -> Output {
        let mut cmd = self.etcdctl_command();
        cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        if input.is_some() {
            cmd.stdin(Stdio::piped());
        }
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", etcdctl_bin().display()));
        if let Some(input) = input {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(input).expect("etcdctl stdin");
        }
        child.wait_with_output().expect("etcdctl")
    }

    /// Runs etcdctl with `args`; its stdout, panicking (with stderr) when it fails.
    pub fn etcdctl(&self, args: &[&str]) -> String {
        let out = self.etcdctl_output(args, None);
        assert!(
            out.status.success(),
            "etcdctl {args:?} against {}: {}",
            self.endpoints_csv(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs etcdctl `args` with `-w json`; the parsed output.
    pub fn etcdctl_json(&self, args: &[&str]) -> Value {
        let mut full = vec!["-w", "json"];
        full.extend_from_slice(args);
        let out = self.etcdctl(&full);
        serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("etcdctl {args:?} printed no JSON ({e}): {out:?}"))
    }

    /// The value at `key` as JSON and its mod_revision; `None` when absent.
    pub fn get(&self, key: &str) -> Option<(Value, i64)> {
        let (raw, rev) = self.get_raw(key)?;
        let v = serde_json::from_slice(&raw).unwrap_or_else(|e| {
            panic!(
                "the value at {key} is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&raw)
            )
        });
        Some((v, rev))
    }

    /// The bytes at `key` and their mod_revision; `None` when absent.
    pub fn get_raw(&self, key: &str) -> Option<(Vec<u8>, i64)> {
        let v = self.etcdctl_json(&["get", "--", key]);
        let mut kvs = kvs(&v);
        assert!(kvs.len() <= 1, "get {key}: more than one key: {v}");
        kvs.pop().map(|(_, value, rev)| (value, rev))
    }

    /// Every key under `prefix` with its value as JSON, in key order.
    pub fn list(&self, prefix: &str) -> Vec<(String, Value)> {
        let v = self.etcdctl_json(&["get", "--prefix", "--", prefix]);
        kvs(&v)
            .into_iter()
            .map(|(k, raw, _)| {
                let value = serde_json::from_slice(&raw).unwrap_or_else(|e| {
                    panic!(
                        "the value at {k} is not JSON ({e}): {:?}",
                        String::from_utf8_lossy(&raw)
                    )
                });
                (k, value)
            })
            .collect()
    }

    /// Every key under `prefix`, in key order.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let v = self.etcdctl_json(&["get", "--prefix", "--keys-only", "--", prefix]);
        kvs(&v).into_iter().map(|(k, _, _)| k).collect()
    }

    /// Puts `value` at `key`; panics when etcd refuses.
    pub fn put(&self, key: &str, value: &str) {
        if let Err(e) = self.try_put(key, value, Duration::from_secs(5)) {
            panic!("put {key} into {}: {e}", self.endpoints_csv());
        }
    }

    /// Puts `value` at `key` with etcdctl's `--command-timeout=timeout`;
    /// the error etcdctl printed when it fails.
    pub fn try_put(&self, key: &str, value: &str, timeout: Duration) -> Result<(), String> {
        let t = format!("--command-timeout={}ms", timeout.as_millis());
        // The value on stdin: it may start with '-' and be large.
        let out = self.etcdctl_output(&[&t, "put", "--", key], Some(value.as_bytes()));
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }

    /// Deletes every key under `prefix` (not empty); how many there were.
    pub fn delete_prefix(&self, prefix: &str) -> usize {
        assert!(!prefix.is_empty(), "delete_prefix of the whole keyspace");
        let v = self.etcdctl_json(&["del", "--prefix", "--", prefix]);
        v.get("deleted").and_then(Value::as_u64).unwrap_or(0) as usize
    }

    /// `member list -w json`: the members (ID, name, peerURLs, clientURLs;
    /// an added member that never started has no name).
    pub fn members(&self) -> Vec<Value> {
        let v = self.etcdctl_json(&["member", "list"]);
        v["members"]
            .as_array()
            .unwrap_or_else(|| panic!("member list: no members: {v}"))
            .clone()
    }
}

/// The last `n` lines of a file (for failure messages).
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    /// `None` while stopped (or once seen to have exited).
    child: Mutex<Option<Child>>,
}

/// A TLS etcd cluster of one test's own on 127.0.0.1: N members, their
/// data dirs, logs and certificates (signed by the test bed's CA) in a
/// temporary directory. Members can be stopped (SIGKILL) and started again
/// on the same data. Drop kills every member and removes the directory.
pub struct PrivateCluster {
    dir: tempfile::TempDir,
    etcd: PathBuf,
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    token: String,
    members: Vec<Member>,
    /// Whether members require a client certificate (`--client-cert-auth`).
    client_cert_auth: bool,
}

/// Ports the test bed uses (its etcds and their peer ports); never picked.
const RESERVED: std::ops::RangeInclusive<u16> = 23791..=23833;

/// `n` distinct free loopback ports (bound at once, then released).
fn free_ports(n: usize) -> Vec<u16> {
    let mut held = Vec::new();
    let mut ports = Vec::new();
    while ports.len() < n {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = l.local_addr().unwrap().port();
        held.push(l);
        if !RESERVED.contains(&port) {
            ports.push(port);
        }
    }
    ports
}

/// A key and a certificate signed by the CA at `ca_crt`/`ca_key`, in `dir`.
fn sign(dir: &Path, name: &str, subj: &str, san: Option<&str>, ca_crt: &Path, ca_key: &Path) {
    let key = dir.join(format!("{name}.key"));
    let csr = dir.join(format!("{name}.csr"));
    let ext = dir.join(format!("{name}.ext"));
    let crt = dir.join(format!("{name}.crt"));
    let run = |args: &[&std::ffi::OsStr]| {
        let out = Command::new("openssl")
            .args(args)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let os = |s: &str| std::ffi::OsString::from(s);
    run(&[
        &os("ecparam"),
        &os("-name"),
        &os("prime256v1"),
        &os("-genkey"),
        &os("-noout"),
        &os("-out"),
        key.as_os_str(),
    ]);
    run(&[
        &os("req"),
        &os("-new"),
        &os("-key"),
        key.as_os_str(),
        &os("-subj"),
        &os(subj),
        &os("-out"),
        csr.as_os_str(),
    ]);
    let mut e = String::from(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n\
         extendedKeyUsage=serverAuth,clientAuth\n",
    );
    if let Some(san) = san {
        e.push_str(&format!("subjectAltName={san}\n"));
    }
    std::fs::write(&ext, e).unwrap();
    // A serial of its own: -CAcreateserial would write next to the shared CA.
    let serial = format!("0x{}", crate::common::unique());
    run(&[
        &os("x509"),
        &os("-req"),
        &os("-in"),
        csr.as_os_str(),
        &os("-CA"),
        ca_crt.as_os_str(),
        &os("-CAkey"),
        ca_key.as_os_str(),
        &os("-set_serial"),
        &os(&serial),
        &os("-days"),
        &os("2"),
        &os("-sha256"),
        &os("-extfile"),
        ext.as_os_str(),
        &os("-out"),
        crt.as_os_str(),
    ]);
}

impl PrivateCluster {
    /// Starts a cluster of `members` and waits (30 s at most) until every
    /// member is healthy; `None` when the test cannot run (see `testbed`).
    /// Panics, with the members' log tails, when it does not come up.
    pub fn start(test: &str, members: usize) -> Option<PrivateCluster> {
        Self::start_with(test, members, true)
    }

    /// As [`Self::start`]; without `client_cert_auth` the members take
    /// clients without a certificate (TLS with the server's only), as a
    /// cluster whose users log in with passwords does.
    pub fn start_with(
        test: &str,
        members: usize,
        client_cert_auth: bool,
    ) -> Option<PrivateCluster> {
        assert!(members > 0);
        let bed = crate::common::testbed::testbed(test)?;
        let etcd = crate::common::testbed::peer(test, "etcd")?;
        crate::common::testbed::peer(test, "etcdctl")?;
        let ca = PathBuf::from(bed.var("TESTBED_CA"));
        let ca_key = Path::new(bed.var("TESTBED_DIR")).join("pki/ca.key");
        let dir = tempfile::Builder::new()
            .prefix("etcd-cluster-")
            .tempdir()
            .unwrap();
        let pki = dir.path().join("pki");
        std::fs::create_dir(&pki).unwrap();
        sign(
            &pki,
            "server",
            "/CN=private-etcd",
            Some("IP:127.0.0.1,DNS:localhost"),
            &ca,
            &ca_key,
        );
        sign(
            &pki,
            "client",
            "/CN=private-etcd-client",
            None,
            &ca,
            &ca_key,
        );
        let mut cluster = PrivateCluster {
            etcd,
            ca,
            server_cert: pki.join("server.crt"),
            server_key: pki.join("server.key"),
            client_cert: pki.join("client.crt"),
            client_key: pki.join("client.key"),
            token: format!("private-{}", crate::common::unique()),
            members: vec![],
            client_cert_auth,
            dir,
        };
        // A port another process took between free_ports and etcd's bind
        // fails the start: then again with new ports, a new token, empty dirs.
        for attempt in 1..=3 {
            match cluster.try_start(members) {
                Ok(()) => return Some(cluster),
                Err(e) if attempt < 3 && e.contains("address already in use") => {
                    eprintln!("{test}: private etcd: {e}; again with other ports");
                    cluster.kill_all();
                    cluster.token = format!("private-{}", crate::common::unique());
                }
                Err(e) => panic!("{test}: private etcd cluster did not start: {e}"),
            }
        }
        unreachable!()
    }

    fn try_start(&mut self, n: usize) -> Result<(), String> {
        let ports = free_ports(2 * n);
        let attempt = self.dir.path().join(format!("run-{}", self.token));
        self.members = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: ports[2 * i],
                peer_port: ports[2 * i + 1],
                data_dir: attempt.join(format!("m{i}.data")),
                log: attempt.join(format!("m{i}.log")),
                child: Mutex::new(None),
            })
            .collect();
        std::fs::create_dir_all(&attempt).unwrap();
        for i in 0..n {
            self.spawn(i, "new");
        }
        let end = Instant::now() + Duration::from_secs(30);
        for i in 0..n {
            self.try_wait_healthy(i, end.saturating_duration_since(Instant::now()))?;
        }
        Ok(())
    }

    fn initial_cluster(&self) -> String {
        self.members
            .iter()
            .map(|m| format!("{}=https://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, i: usize, state: &str) {
        let initial = self.initial_cluster();
        let m = &self.members[i];
        assert!(m.child.lock().unwrap().is_none(), "member {i} runs already");
        let client = format!("https://127.0.0.1:{}", m.client_port);
        let peer = format!("https://127.0.0.1:{}", m.peer_port);
        let log = File::options()
            .create(true)
            .append(true)
            .open(&m.log)
            .unwrap();
        let mut cmd = Command::new(&self.etcd);
        // etcd takes ETCD_* for its flags and dies on one a flag also
        // sets: the test bed exports the plugin's ETCD_CERT_FILE and others.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ETCD_") {
                cmd.env_remove(k);
            }
        }
        // etcd reads ETCD_* variables as flags (and refuses one that a flag
        // shadows): the test bed's environment exports some for clients.
        for (k, _) in std::env::vars() {
            if k.starts_with("ETCD_") {
                cmd.env_remove(k);
            }
        }
        cmd.arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&m.data_dir)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial])
            .args(["--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", state])
            .arg("--cert-file")
            .arg(&self.server_cert)
            .arg("--key-file")
            .arg(&self.server_key)
            // A trusted CA makes etcd ask every client for a certificate.
            .args(if self.client_cert_auth {
                vec![
                    OsStr::new("--client-cert-auth"),
                    OsStr::new("--trusted-ca-file"),
                    self.ca.as_os_str(),
                ]
            } else {
                vec![]
            })
            .arg("--peer-cert-file")
            .arg(&self.server_cert)
            .arg("--peer-key-file")
            .arg(&self.server_key)
            .arg("--peer-client-cert-auth")
            .arg("--peer-trusted-ca-file")
            .arg(&self.ca)
            .args(["--unsafe-no-fsync", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let child = cmd.spawn().expect("spawn etcd");
        *m.child.lock().unwrap() = Some(child);
    }

    /// The whole cluster, with its client certificate.
    pub fn access(&self) -> EtcdAccess {
        EtcdAccess {
            endpoints: (0..self.members.len()).map(|i| self.endpoint(i)).collect(),
            ca: self.ca.clone(),
            cert: self.client_cert.clone(),
            key: self.client_key.clone(),
        }
    }

    /// Only member `i`'s endpoint.
    pub fn member_access(&self, i: usize) -> EtcdAccess {
        self.access().with_endpoints(&[self.endpoint(i)])
    }

    /// Member `i`'s client URL.
    pub fn endpoint(&self, i: usize) -> String {
        format!("https://127.0.0.1:{}", self.members[i].client_port)
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether member `i` was started and has not exited.
    pub fn is_running(&self, i: usize) -> bool {
        let mut child = self.members[i].child.lock().unwrap();
        if child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_some())
        {
            *child = None;
        }
        child.is_some()
    }

    /// The endpoints of the members that run.
    pub fn running_endpoints(&self) -> Vec<String> {
        (0..self.len())
            .filter(|&i| self.is_running(i))
            .map(|i| self.endpoint(i))
            .collect()
    }

    /// Member `i`'s log.
    pub fn log(&self, i: usize) -> PathBuf {
        self.members[i].log.clone()
    }

    /// The tails of every member's log (for failure messages).
    pub fn log_tails(&self, lines: usize) -> String {
        self.members
            .iter()
            .map(|m| {
                format!(
                    "--- {} ({}):\n{}",
                    m.name,
                    m.log.display(),
                    tail(&m.log, lines)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Kills member `i` (SIGKILL) and waits for it to exit.
    pub fn stop_member(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.lock().unwrap().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` again on its data dir (`--initial-cluster-state
    /// existing`); returns at once: `wait_healthy` for it to serve.
    pub fn start_member(&mut self, i: usize) {
        self.spawn(i, "existing");
    }

    /// Whether member `i` answers /health with `"health":"true"` (it runs
    /// and sees a leader).
    pub fn is_healthy(&self, i: usize) -> bool {
        let out = Command::new("curl")
            .args(["-sf", "--max-time", "2"])
            .arg("--cacert")
            .arg(&self.ca)
            .arg("--cert")
            .arg(&self.client_cert)
            .arg("--key")
            .arg(&self.client_key)
            .arg(format!("{}/health", self.endpoint(i)))
            .output()
            .expect("curl");
        out.status.success()
            && serde_json::from_slice::<Value>(&out.stdout).is_ok_and(|v| v["health"] == "true")
    }

    /// Waits until member `i` is healthy; panics after `timeout`, or when
    /// it is stopped or exits, with its log's tail.
    pub fn wait_healthy(&self, i: usize, timeout: Duration) {
        if let Err(e) = self.try_wait_healthy(i, timeout) {
            panic!("{e}");
        }
    }

    fn try_wait_healthy(&self, i: usize, timeout: Duration) -> Result<(), String> {
        let end = Instant::now() + timeout;
        let why = loop {
            if self.is_healthy(i) {
                return Ok(());
            }
            if !self.is_running(i) {
                break "is not running".to_string();
            }
            if Instant::now() >= end {
                break format!("is not healthy after {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let log = &self.members[i].log;
        Err(format!(
            "etcd member {i} ({}) {why}; the tail of {}:\n{}",
            self.endpoint(i),
            log.display(),
            tail(log, 30)
        ))
    }

    /// Member `i`'s (member ID, the leader it knows: 0 for none), from
    /// `endpoint status`; `None` when it does not answer within 1 s.
    pub fn status(&self, i: usize) -> Option<(u64, u64)> {
        let out = self.member_access(i).etcdctl_output(
            &["--command-timeout=1s", "-w", "json", "endpoint", "status"],
            None,
        );
        if !out.status.success() {
            return None;
        }
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        let status = &v[0]["Status"];
        Some((
            status["header"]["member_id"].as_u64()?,
            status["leader"].as_u64().unwrap_or(0),
        ))
    }

    /// The member that leads, when every running member names the same
    /// leader and that leader runs.
    pub fn leader(&self) -> Option<usize> {
        let running: Vec<usize> = (0..self.len()).filter(|&i| self.is_running(i)).collect();
        let mut ids = Vec::new();
        for &i in &running {
            ids.push((i, self.status(i)?));
        }
        let leader = ids.first()?.1.1;
        if ids.iter().any(|(_, (_, l))| *l != leader) {
            return None;
        }
        ids.iter()
            .find(|(_, (id, _))| *id == leader)
            .map(|(i, _)| *i)
    }

    /// Waits until the running members agree on a running leader (see
    /// `leader`); panics after `timeout` with the log tails. A write sent
    /// right after the leader died can be lost (a follower forwards it to
    /// the dead leader) and time out: wait for this first.
    pub fn wait_leader(&self, timeout: Duration) -> usize {
        let end = Instant::now() + timeout;
        loop {
            if let Some(l) = self.leader() {
                return l;
            }
            assert!(
                Instant::now() < end,
                "no leader among the running members after {timeout:?}:\n{}",
                self.log_tails(20)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until every running member is healthy (see `wait_healthy`).
    pub fn wait_all_healthy(&self, timeout: Duration) {
        let end = Instant::now() + timeout;
        for i in 0..self.len() {
            if self.is_running(i) {
                self.wait_healthy(i, end.saturating_duration_since(Instant::now()));
            }
        }
    }

    fn kill_all(&mut self) {
        for i in 0..self.members.len() {
            self.stop_member(i);
        }
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        self.kill_all();
    }
}
