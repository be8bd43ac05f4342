//! No credential ever reaches a log line: every mode
//! runs at `log_level: debug`, and the log file, stderr and stdout of each
//! call are searched for every secret the call was given — bearer tokens,
//! the PEM body lines of private keys, kubeconfig `client-key-data` /
//! `client-certificate-data` values, the etcd client key.
//!
//! Covered: Kubernetes mode through a token kubeconfig, `policy.k8s_auth_token`,
//! client certificates (embedded in a kubeconfig, and as files), rejected
//! credentials (401: the error message too); the etcd datastore over TLS
//! (the plugin with calico-ipam in process, calico-ipam itself, `calico -t`);
//! delegation (host-local, an IPAM plugin that prints its config on stderr,
//! an exec'd calico-ipam); the calico-ipam personality on the API server
//! with a token in its config.
//!
//! Each call logs to a file of its own, and must have logged at debug level
//! (so that no check passes for want of logs).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use base64::Engine;
use common::ipam::{Backend, World};
use common::testbed::{Namespace, Testbed, testbed};
use common::*;
use serde_json::{Value, json};

const POD_IP: &str = "cni.projectcalico.org/podIP";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A token no API server issued (long and random, as real ones are).
fn bogus_token() -> String {
    format!("bogus-{}-{}-{}", unique(), unique(), unique())
}

/// The secrets of one test, and where its calls log.
struct Secrets {
    /// (what it is, the text that must never be logged)
    values: Vec<(String, String)>,
    logs: PathBuf,
}

impl Secrets {
    fn new(dir: &Path) -> Secrets {
        let logs = dir.join("secret-logs");
        std::fs::create_dir_all(&logs).unwrap();
        Secrets {
            values: Vec::new(),
            logs,
        }
    }

    fn add(&mut self, what: &str, value: &str) {
        let value = value.trim();
        assert!(
            value.len() >= 16,
            "{what}: too short to search for ({} characters)",
            value.len()
        );
        self.values.push((what.to_string(), value.to_string()));
    }

    /// A bearer token.
    fn token(&mut self, what: &str, token: &str) {
        self.add(&format!("token ({what})"), token);
    }

    /// A base64 value (a kubeconfig's `*-data`): whole, and in pieces of
    /// 40 characters (a truncated copy is a leak too).
    fn data(&mut self, what: &str, value: &str) {
        self.add(what, value);
        for (i, piece) in value.as_bytes().chunks(40).enumerate() {
            if piece.len() == 40 {
                self.add(
                    &format!("{what}, piece {i}"),
                    std::str::from_utf8(piece).unwrap(),
                );
            }
        }
    }

    /// A PEM private key file: each base64 body line longer than 20
    /// characters, and the file as a kubeconfig would embed it.
    fn key_file(&mut self, what: &str, path: &Path) {
        let pem = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("{what}: {}: {e}", path.display()));
        assert!(
            pem.contains("PRIVATE KEY"),
            "{}: no private key",
            path.display()
        );
        let mut lines = 0;
        for (i, line) in pem.lines().enumerate() {
            let line = line.trim();
            if line.len() > 20 && !line.starts_with("-----") {
                self.add(
                    &format!("{what} ({}), line {}", path.display(), i + 1),
                    line,
                );
                lines += 1;
            }
        }
        assert!(lines > 0, "{}: no PEM body lines", path.display());
        self.data(&format!("{what} as base64"), &b64(pem.as_bytes()));
    }

    /// Runs `call` with `conf` logging at debug level to a file of its own
    /// (`label`); checks that it logged at debug level to the file and
    /// stderr, and that no secret is in the file, stderr or stdout.
    fn run(&self, label: &str, conf: &Value, call: impl FnOnce(&Value) -> Outcome) -> Outcome {
        let log_path = self.logs.join(format!("{label}.log"));
        let mut conf = conf.clone();
        conf["log_level"] = json!("debug");
        conf["log_file_path"] = json!(log_path);
        let out = call(&conf);
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        assert!(
            log.contains("DEBUG"),
            "{label}: no debug line in {} ({out:?}): {log}",
            log_path.display()
        );
        assert!(
            out.stderr.contains("DEBUG"),
            "{label}: no debug line on stderr: {out:?}"
        );
        self.assert_absent(label, "the log file", &log);
        self.assert_absent(label, "stderr", &out.stderr);
        self.assert_absent(label, "stdout", &out.stdout);
        out
    }

    /// Fails, naming the secret and the line (the secret masked), when
    /// `text` holds any secret.
    fn assert_absent(&self, label: &str, place: &str, text: &str) {
        assert!(!self.values.is_empty(), "{label}: no secrets to look for");
        for (what, value) in &self.values {
            if let Some(line) = text.lines().find(|l| l.contains(value.as_str())) {
                panic!(
                    "{label}: {what} in {place}: {}",
                    line.replace(value.as_str(), "<THE SECRET>")
                );
            }
        }
    }
}

/// `calico -t` with `conf` on stdin.
fn test_connection(conf: &Value) -> Outcome {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(CALICO)
        .arg("-t")
        .env_clear()
        .envs(env_of(&[]))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    Outcome {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// An executable script `name` in `dir`.
fn script(dir: &Path, name: &str, body: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

// ---------------------------------------------------------------------------
// Kubernetes mode.

/// Pods of a namespace of this test's own, run with host-local and the
/// Kubernetes datastore, straight against the test bed's API server.
struct K8s {
    bed: &'static Testbed,
    ns: Namespace,
    setup: Setup,
    netns: Netns,
    secrets: Secrets,
}

impl K8s {
    fn new(test: &str) -> Option<K8s> {
        if !root_or_skip(test) {
            return None;
        }
        let bed = testbed(test)?;
        let ns = bed.namespace(json!({}), json!({}));
        let setup = Setup::new("1.0.0", false);
        let secrets = Secrets::new(setup.dir.path());
        Some(K8s {
            bed,
            ns,
            setup,
            netns: Netns::new(),
            secrets,
        })
    }

    /// The config with `creds` (`kubernetes` and `policy` keys) merged in.
    fn conf(&self, creds: Value) -> Value {
        let mut conf = self.setup.conf.clone();
        conf["datastore_type"] = json!("kubernetes");
        conf["policy"] = json!({"type": "k8s"});
        conf["deadline_seconds"] = json!(10);
        for (section, fields) in creds.as_object().unwrap() {
            for (k, v) in fields.as_object().unwrap() {
                conf[section][k] = v.clone();
            }
        }
        conf
    }

    /// A kubeconfig of this test's own for the API server with `user`.
    fn kubeconfig(&self, name: &str, user: Value) -> PathBuf {
        self.bed
            .kubeconfig(self.setup.dir.path(), name, self.bed.api(), user)
    }

    fn pod(&self, name: &str) {
        self.ns.create_pod(json!({
            "metadata": {"name": name},
            "spec": {"nodeName": "test-node", "containers": [{"name": "c", "image": "i"}]}
        }));
    }

    fn run(&self, label: &str, command: &str, pod: &str, cid: &str, conf: &Value) -> Outcome {
        let args = format!(
            "K8S_POD_NAMESPACE={};K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID={cid}",
            self.ns.name
        );
        let netns = self.netns.path();
        self.secrets.run(label, conf, |conf| {
            self.setup
                .run_with(command, cid, &netns, "eth0", conf, &[("CNI_ARGS", &args)])
        })
    }

    /// ADD, CHECK and DEL of a new pod `pod` with `conf`; each must succeed
    /// (the credentials work) and log no secret.
    fn add_check_del(&self, pod: &str, conf: &Value) {
        self.pod(pod);
        let cid = container_id();
        let result = self
            .run(&format!("{pod}-add"), "ADD", pod, &cid, conf)
            .assert_ok()
            .json();
        let ip = result["ips"][0]["address"].as_str().unwrap().to_string();
        let annotations = &self.ns.pod(pod).unwrap()["metadata"]["annotations"];
        assert_eq!(
            annotations[POD_IP],
            json!(ip),
            "{pod}: the ADD reached the API"
        );
        let mut check = conf.clone();
        check["prevResult"] = result;
        self.run(&format!("{pod}-check"), "CHECK", pod, &cid, &check)
            .assert_ok();
        self.run(&format!("{pod}-del"), "DEL", pod, &cid, conf)
            .assert_ok();
        let annotations = &self.ns.pod(pod).unwrap()["metadata"]["annotations"];
        assert_eq!(annotations[POD_IP], "", "{pod}: the DEL reached the API");
    }

    /// ADD and DEL of a new pod `pod` with credentials the API server
    /// rejects: both fail, and neither the message nor the logs hold them.
    fn rejected(&self, pod: &str, conf: &Value) {
        self.pod(pod);
        let cid = container_id();
        let out = self.run(&format!("{pod}-add"), "ADD", pod, &cid, conf);
        assert_ne!(out.code, 0, "{pod}: {out:?}");
        let msg = out.json()["msg"].as_str().unwrap().to_string();
        assert!(msg.contains("401"), "{pod}: the rejection: {msg}");
        let out = self.run(&format!("{pod}-del"), "DEL", pod, &cid, conf);
        assert_ne!(out.code, 0, "{pod}: DEL reports the API failure: {out:?}");
        assert!(!host_link_exists(&veth_name(&self.ns.name, pod)), "{pod}");
    }
}

fn veth_name(namespace: &str, pod: &str) -> String {
    calico_cni::datastore::names::veth_name_for_workload(namespace, pod, None)
}

#[test]
fn k8s_token_kubeconfig_and_policy_token() {
    let Some(mut c) = K8s::new("k8s_token_kubeconfig_and_policy_token") else {
        return;
    };
    let cni_token = c.bed.cni_token();
    c.secrets.token("the CNI kubeconfig", &cni_token);
    let minted = c.bed.token("kube-system", "calico-cni-plugin", 600);
    c.secrets.token("policy.k8s_auth_token", &minted);
    let own = c.bed.token("kube-system", "calico-cni-plugin", 600);
    c.secrets.token("a kubeconfig of the test's own", &own);

    // The CNI's own kubeconfig, as installed.
    let conf = c.conf(json!({"kubernetes": {"kubeconfig": c.bed.cni_kubeconfig()}}));
    c.add_check_del("kubeconfig", &conf);
    let out = c.secrets.run("kubeconfig-t", &conf, test_connection);
    assert_eq!(out.code, 0, "calico -t: {out:?}");

    // A token kubeconfig written here.
    let kc = c.kubeconfig("own.kubeconfig", json!({"token": own}));
    let conf = c.conf(json!({"kubernetes": {"kubeconfig": kc}}));
    c.add_check_del("own-kubeconfig", &conf);

    // The token in the network config: with the API root and CA alone,
    // and overriding a kubeconfig's token.
    let conf = c.conf(json!({"kubernetes": {"k8s_api_root": c.bed.api()},
        "policy": {"k8s_auth_token": minted, "k8s_certificate_authority": c.bed.ca()}}));
    c.add_check_del("policy-token", &conf);
    let conf = c.conf(json!({"kubernetes": {"kubeconfig": kc},
        "policy": {"k8s_auth_token": minted}}));
    c.add_check_del("policy-token-over-kubeconfig", &conf);
    let out = c.secrets.run("policy-token-t", &conf, test_connection);
    assert_eq!(out.code, 0, "calico -t: {out:?}");
}

#[test]
fn k8s_client_certificates() {
    let Some(mut c) = K8s::new("k8s_client_certificates") else {
        return;
    };
    let cert = PathBuf::from(c.bed.var("TESTBED_ADMIN_CERT"));
    let key = PathBuf::from(c.bed.var("TESTBED_ADMIN_KEY"));
    c.secrets.key_file("the admin's private key", &key);
    let cert_data = b64(&std::fs::read(&cert).unwrap());
    let key_data = b64(&std::fs::read(&key).unwrap());
    c.secrets.data("client-certificate-data", &cert_data);
    c.secrets.data("client-key-data", &key_data);

    // Embedded in a kubeconfig.
    let kc = c.kubeconfig(
        "certs.kubeconfig",
        json!({"client-certificate-data": cert_data, "client-key-data": key_data}),
    );
    let conf = c.conf(json!({"kubernetes": {"kubeconfig": kc}}));
    c.add_check_del("data-kubeconfig", &conf);
    let out = c.secrets.run("data-kubeconfig-t", &conf, test_connection);
    assert_eq!(out.code, 0, "calico -t: {out:?}");

    // Files named by a kubeconfig, and by the network config.
    let kc = c.kubeconfig(
        "files.kubeconfig",
        json!({"client-certificate": cert, "client-key": key}),
    );
    let conf = c.conf(json!({"kubernetes": {"kubeconfig": kc}}));
    c.add_check_del("file-kubeconfig", &conf);
    let conf = c.conf(json!({"kubernetes": {"k8s_api_root": c.bed.api()},
        "policy": {"k8s_client_certificate": cert, "k8s_client_key": key,
                   "k8s_certificate_authority": c.bed.ca()}}));
    c.add_check_del("policy-files", &conf);
}

#[test]
fn k8s_rejected_credentials() {
    let Some(mut c) = K8s::new("k8s_rejected_credentials") else {
        return;
    };
    let in_kubeconfig = bogus_token();
    c.secrets
        .token("a rejected kubeconfig token", &in_kubeconfig);
    let in_policy = bogus_token();
    c.secrets
        .token("a rejected policy.k8s_auth_token", &in_policy);
    // A JWT signed with the cluster's key, expired: its claims are parsed
    // for the message.
    let uid = c
        .bed
        .get("/api/v1/namespaces/kube-system/serviceaccounts/calico-cni-plugin")
        .unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let expired = c.bed.signed_jwt(
        "kube-system",
        "calico-cni-plugin",
        &uid,
        std::time::SystemTime::now() - std::time::Duration::from_secs(3600),
    );
    c.secrets.token("an expired JWT", &expired);
    let token_file_token = bogus_token();
    c.secrets.token("a rejected tokenFile", &token_file_token);

    let kc = c.kubeconfig("bogus.kubeconfig", json!({"token": in_kubeconfig}));
    c.rejected(
        "bogus-kubeconfig",
        &c.conf(json!({"kubernetes": {"kubeconfig": kc}})),
    );
    let out = c.secrets.run(
        "bogus-kubeconfig-t",
        &c.conf(json!({"kubernetes": {"kubeconfig": kc}})),
        test_connection,
    );
    assert_ne!(out.code, 0, "calico -t with a rejected token: {out:?}");

    c.rejected(
        "bogus-policy-token",
        &c.conf(json!({"kubernetes": {"k8s_api_root": c.bed.api()},
            "policy": {"k8s_auth_token": in_policy, "k8s_certificate_authority": c.bed.ca()}})),
    );
    let kc = c.kubeconfig("expired.kubeconfig", json!({"token": expired}));
    c.rejected(
        "expired-jwt",
        &c.conf(json!({"kubernetes": {"kubeconfig": kc}})),
    );
    let token_file = c.setup.dir.path().join("token");
    std::fs::write(&token_file, &token_file_token).unwrap();
    let kc = c.kubeconfig("file.kubeconfig", json!({"tokenFile": token_file}));
    c.rejected(
        "bogus-token-file",
        &c.conf(json!({"kubernetes": {"kubeconfig": kc}})),
    );
}

// ---------------------------------------------------------------------------
// The etcd datastore.

#[test]
fn etcd_mode_with_tls() {
    let test = "etcd_mode_with_tls";
    if !root_or_skip(test) {
        return;
    }
    let Some(w) = World::new(test, Backend::Etcd) else {
        return;
    };
    let mut secrets = Secrets::new(w.dir.path());
    let access = w.etcd_access().clone();
    secrets.key_file("the etcd client key", &access.key);
    secrets.add(
        "the etcd client key file",
        &std::fs::read_to_string(&access.key).unwrap(),
    );
    w.pool(&w.v4(0).to_string(), json!({}));
    let conf = w.conf();
    assert_eq!(conf["etcd_key_file"], json!(access.key));

    // The calico plugin, calico-ipam in process.
    let netns = Netns::new();
    let cid = container_id();
    secrets
        .run("plugin-add", &conf, |conf| {
            w.plugin("ADD", &cid, &netns.path(), conf, "", None)
        })
        .assert_ok();
    assert_eq!(w.addresses_of(&format!("net1.{cid}")).len(), 1);
    secrets
        .run("plugin-del", &conf, |conf| {
            w.plugin("DEL", &cid, &netns.path(), conf, "", None)
        })
        .assert_ok();
    assert!(w.handle(&format!("net1.{cid}")).is_none());

    // calico-ipam itself.
    let cid = container_id();
    secrets
        .run("ipam-add", &conf, |conf| w.ipam("ADD", &cid, conf, ""))
        .assert_ok();
    assert_eq!(w.addresses_of(&format!("net1.{cid}")).len(), 1);
    secrets
        .run("ipam-del", &conf, |conf| w.ipam("DEL", &cid, conf, ""))
        .assert_ok();
    assert!(w.handle(&format!("net1.{cid}")).is_none());

    // calico -t, the first endpoint down (the failover is logged at
    // debug level); and with a client certificate the key does not match.
    let mut t = conf.clone();
    t["etcd_endpoints"] = json!(format!("https://127.0.0.1:1,{}", access.endpoints_csv()));
    let out = secrets.run("t", &t, test_connection);
    assert_eq!(out.code, 0, "calico -t: {out:?}");
    let mut mismatched = t.clone();
    mismatched["etcd_cert_file"] = json!(access.ca);
    let log = secrets.logs.join("t-mismatched.log");
    mismatched["log_level"] = json!("debug");
    mismatched["log_file_path"] = json!(log);
    let out = test_connection(&mismatched);
    assert_eq!(
        out.code, 1,
        "calico -t with a key of another certificate: {out:?}"
    );
    // It fails before any request: an error line only.
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(text.contains("ERROR"), "{text}");
    for (place, text) in [
        ("log", &text),
        ("stderr", &out.stderr),
        ("stdout", &out.stdout),
    ] {
        secrets.assert_absent("t-mismatched", place, text);
    }
}

// ---------------------------------------------------------------------------
// Delegation.

#[test]
fn delegated_ipam_configs_are_redacted() {
    let test = "delegated_ipam_configs_are_redacted";
    if !root_or_skip(test) {
        return;
    }
    if !Path::new(CNI_BIN).join("host-local").exists() {
        cannot_run(
            test,
            "host-local is not installed (containernetworking-plugins)",
        );
        return;
    }
    let setup = Setup::new("1.0.0", false);
    let mut secrets = Secrets::new(setup.dir.path());
    let token = bogus_token();
    secrets.token("policy.k8s_auth_token", &token);
    let ipam_token = bogus_token();
    secrets.token("a token in the ipam section", &ipam_token);
    let key_data = b64(format!("-----BEGIN PRIVATE KEY-----\n{}\n", bogus_token()).as_bytes());
    secrets.data("client-key-data in the ipam section", &key_data);
    let mut conf = setup.conf.clone();
    conf["policy"] = json!({"k8s_auth_token": token});
    conf["ipam"]["auth_token"] = json!(ipam_token);
    conf["ipam"]["client-key-data"] = json!(key_data);
    let netns = Netns::new();

    // host-local, and an IPAM plugin that prints the config it was given
    // on stderr (which the calico plugin logs) before running host-local.
    let fake = setup.dir.path().join("fake-bin");
    script(
        &fake,
        "echo-ipam",
        &format!(
            "#!/bin/sh\nconf=$(cat)\necho \"echo-ipam got: $conf\" >&2\n\
             printf '%s' \"$conf\" | exec {CNI_BIN}/host-local\n"
        ),
    );
    let path = format!("{}:{CNI_BIN}", fake.display());
    for ipam in ["host-local", "echo-ipam"] {
        let mut conf = conf.clone();
        conf["ipam"]["type"] = json!(ipam);
        let cid = container_id();
        let run = |verb: &str, conf: &Value| {
            secrets.run(&format!("{ipam}-{}", verb.to_lowercase()), conf, |conf| {
                setup.run_with(
                    verb,
                    &cid,
                    &netns.path(),
                    "eth0",
                    conf,
                    &[("CNI_PATH", &path)],
                )
            })
        };
        let add = run("ADD", &conf);
        let result = add.assert_ok().json();
        assert!(
            add.stderr.contains("<redacted>"),
            "{ipam}: the config is logged, redacted: {}",
            add.stderr
        );
        if ipam == "echo-ipam" {
            assert!(
                add.stderr.contains("echo-ipam got:"),
                "the delegated plugin's stderr is logged: {}",
                add.stderr
            );
        }
        let mut check = conf.clone();
        check["prevResult"] = result;
        run("CHECK", &check).assert_ok();
        run("DEL", &conf).assert_ok();
        assert!(setup.reservations().is_empty(), "{ipam}");
    }
}

#[test]
fn an_execd_calico_ipam_logs_no_secret() {
    let test = "an_execd_calico_ipam_logs_no_secret";
    if !root_or_skip(test) {
        return;
    }
    let Some(w) = World::new(test, Backend::Embedded) else {
        return;
    };
    w.pool(&w.v4(0).to_string(), json!({}));
    let mut secrets = Secrets::new(w.dir.path());
    let token = bogus_token();
    secrets.token("policy.k8s_auth_token", &token);
    let mut conf = w.conf();
    conf["policy"] = json!({"k8s_auth_token": token});
    // Not this binary (a script): exec'd, its debug log on its stderr,
    // which the calico plugin logs.
    let wrapped = w.dir.path().join("wrapped");
    script(
        &wrapped,
        "calico-ipam",
        &format!("#!/bin/bash\nexec -a calico-ipam {CALICO} \"$@\"\n"),
    );
    let path = format!("{}:{CNI_BIN}", wrapped.display());
    let netns = Netns::new();
    let cid = container_id();
    let add = secrets.run("add", &conf, |conf| {
        w.plugin("ADD", &cid, &netns.path(), conf, "", Some(&path))
    });
    add.assert_ok();
    assert!(
        !add.stderr.contains("calico-ipam in process"),
        "exec'd: {}",
        add.stderr
    );
    assert!(
        add.stderr.contains("delegated plugin stderr"),
        "the child's log is logged: {}",
        add.stderr
    );
    assert_eq!(w.addresses_of(&format!("net1.{cid}")).len(), 1);
    secrets
        .run("del", &conf, |conf| {
            w.plugin("DEL", &cid, &netns.path(), conf, "", Some(&path))
        })
        .assert_ok();
    assert!(w.allocations().is_empty());
}

// ---------------------------------------------------------------------------
// The calico-ipam personality, exec'd directly.

#[test]
fn calico_ipam_with_a_token_in_its_config() {
    let test = "calico_ipam_with_a_token_in_its_config";
    let Some(w) = World::new(test, Backend::Kdd) else {
        return;
    };
    let bed = w.bed();
    let mut secrets = Secrets::new(w.dir.path());
    secrets.token("the CNI kubeconfig", &bed.cni_token());
    let token = bed.token("kube-system", "calico-cni-plugin", 600);
    secrets.token("policy.k8s_auth_token", &token);
    let rejected = bogus_token();
    secrets.token("a rejected policy.k8s_auth_token", &rejected);
    w.pool(&w.v4(0).to_string(), json!({}));

    for (label, conf) in [
        ("kubeconfig", w.conf()),
        ("token", {
            let mut conf = w.conf();
            conf["policy"] = json!({"k8s_auth_token": token});
            conf
        }),
    ] {
        let cid = container_id();
        let add = secrets.run(&format!("{label}-add"), &conf, |conf| {
            w.ipam("ADD", &cid, conf, "")
        });
        add.assert_ok();
        assert_eq!(w.addresses_of(&format!("net1.{cid}")).len(), 1, "{label}");
        secrets
            .run(&format!("{label}-del"), &conf, |conf| {
                w.ipam("DEL", &cid, conf, "")
            })
            .assert_ok();
    }

    let mut conf = w.conf();
    conf["policy"] = json!({"k8s_auth_token": rejected});
    let out = secrets.run("rejected-add", &conf, |conf| {
        w.ipam("ADD", &container_id(), conf, "")
    });
    assert_ne!(out.code, 0, "{out:?}");
    let msg = out.json()["msg"].as_str().unwrap().to_string();
    assert!(msg.contains("401"), "{msg}");
}
