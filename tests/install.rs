//! `calico install`: Calico's install-cni contract. The binaries replace
//! the old ones while those run (no ETXTBSY, never a partial file: a
//! runtime executing the installed plugin in a loop meanwhile always gets
//! a whole one); the network config rendered from the stock Kubernetes
//! and etcd templates (written here from their field lists) is what
//! Calico's install-cni writes for the same environment (its rule: the
//! placeholders replaced as text, byte for byte); run in a pod on the test
//! bed's API server, it writes a kubeconfig whose token (minted for the
//! CNI's ServiceAccount with calico-node's permission) the plugin uses;
//! `--watch` renews that token and re-renders on a template change while
//! plugin calls keep working.

mod common;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

/// A host as the installer's container sees it (`--host-root`).
struct Host {
    dir: tempfile::TempDir,
}

impl Host {
    fn new() -> Host {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("opt/cni/bin")).unwrap();
        std::fs::create_dir_all(dir.path().join("etc/cni/net.d")).unwrap();
        Host { dir }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn bin(&self, name: &str) -> PathBuf {
        self.root().join("opt/cni/bin").join(name)
    }

    fn net_d(&self, name: &str) -> PathBuf {
        self.root().join("etc/cni/net.d").join(name)
    }

    /// `calico install --host-root <root> ARGS` with exactly `env`.
    fn install(&self, args: &[&str], env: &[(&str, &str)]) -> Outcome {
        let mut full = vec!["install", "--host-root", self.root().to_str().unwrap()];
        full.extend_from_slice(args);
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .chain([("PATH".to_string(), "/usr/bin:/bin".to_string())])
            .collect();
        exec_args(CALICO, &full, &env, "")
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// A directory holding `calico`: this build's binary with `extra` bytes
/// appended (trailing bytes an ELF loader ignores: a different file that
/// runs the same), and `calico-ipam` a link to it, as an image holds them.
fn image(extra: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(CALICO).unwrap();
    bytes.extend(std::iter::repeat_n(0u8, extra));
    let calico = dir.path().join("calico");
    std::fs::write(&calico, bytes).unwrap();
    std::fs::set_permissions(&calico, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("calico", dir.path().join("calico-ipam")).unwrap();
    std::os::unix::fs::symlink("calico", dir.path().join("install")).unwrap();
    dir
}

#[test]
fn binaries_are_replaced_while_the_old_ones_run() {
    let host = Host::new();
    // The old plugin, running (a long sleep under the plugin's name).
    // Copied by a child process, not in this one: a file this process
    // holds open for writing is inherited by any child another test's
    // thread forks meanwhile, and exec'ing it then fails with ETXTBSY
    // until that child has exec'd (the race is the test harness's, not
    // the installer's).
    let copied = Command::new("cp")
        .arg("/bin/sleep")
        .arg(host.bin("calico"))
        .status()
        .unwrap();
    assert!(copied.success());
    let mut old = Command::new(host.bin("calico"))
        .arg("300")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // A runtime executing the installed plugin meanwhile.
    let stop = Arc::new(AtomicBool::new(false));
    let runtime = {
        let (stop, calico) = (stop.clone(), host.bin("calico"));
        std::thread::spawn(move || {
            let mut failures = Vec::new();
            let mut runs = 0;
            while !stop.load(Ordering::Relaxed) {
                match Command::new(&calico).arg("-v").output() {
                    Ok(out) if out.status.success() || out.status.code() == Some(0) => {}
                    // The old binary (sleep) answers -v with its usage
                    // error: whole, and not ours yet.
                    Ok(out) if String::from_utf8_lossy(&out.stderr).contains("invalid option") => {}
                    Ok(out) => failures.push(format!("{out:?}")),
                    Err(e) => failures.push(e.to_string()),
                }
                runs += 1;
            }
            (runs, failures)
        })
    };
    let (a, b) = (image(0), image(4096));
    for round in 0..6 {
        let from = if round % 2 == 0 { &a } else { &b };
        let out = host.install(
            &["--binaries", from.path().to_str().unwrap()],
            &[("SLEEP", "false"), ("KUBERNETES_NODE_NAME", "node-1")],
        );
        assert_eq!(out.code, 0, "round {round}: {out:?}");
        assert!(
            out.stdout
                .contains(&format!("wrote {}", host.bin("calico").display())),
            "round {round}: {}",
            out.stdout
        );
        assert_eq!(
            std::fs::read(host.bin("calico")).unwrap(),
            std::fs::read(from.path().join("calico")).unwrap()
        );
    }
    stop.store(true, Ordering::Relaxed);
    let (runs, failures) = runtime.join().unwrap();
    assert!(runs > 0);
    assert!(
        failures.is_empty(),
        "{} of {runs} runs failed, the first: {:?}",
        failures.len(),
        &failures[..failures.len().min(3)]
    );
    // The old process runs on, from the file it started with.
    assert!(old.try_wait().unwrap().is_none(), "the old binary stopped");
    let exe = std::fs::read_link(format!("/proc/{}/exe", old.id())).unwrap();
    assert!(exe.to_string_lossy().ends_with("(deleted)"), "{exe:?}");
    old.kill().unwrap();
    old.wait().unwrap();

    // The layout: calico-ipam a link to calico, no `install`, no temporary
    // file; an identical install leaves every file alone.
    assert_eq!(
        std::fs::read_link(host.bin("calico-ipam")).unwrap(),
        Path::new("calico")
    );
    assert_eq!(mode(&host.bin("calico")), 0o755);
    let names: Vec<String> = std::fs::read_dir(host.root().join("opt/cni/bin"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(sorted, ["calico", "calico-ipam"], "{names:?}");
    let out = host.install(
        &["--binaries", b.path().to_str().unwrap()],
        &[("SLEEP", "false"), ("KUBERNETES_NODE_NAME", "node-1")],
    );
    assert!(
        out.stdout
            .contains(&format!("unchanged {}", host.bin("calico").display())),
        "{}",
        out.stdout
    );
    // The installed plugin answers as calico and as calico-ipam.
    for name in ["calico", "calico-ipam"] {
        let v = Command::new(host.bin(name)).arg("-v").output().unwrap();
        let v = String::from_utf8_lossy(&v.stdout).into_owned();
        assert!(
            v.starts_with(&format!(
                "v3.32.1\ncalico-cni {} (commit ",
                env!("CARGO_PKG_VERSION")
            )),
            "{name}: {v}"
        );
    }
    // UPDATE_CNI_BINARIES=false keeps what is there; SKIP_CNI_BINARIES
    // leaves a name out.
    std::fs::write(host.bin("calico"), b"#!/bin/sh\necho kept\n").unwrap();
    std::fs::remove_file(host.bin("calico-ipam")).unwrap();
    let out = host.install(
        &["--binaries", a.path().to_str().unwrap()],
        &[
            ("SLEEP", "false"),
            ("UPDATE_CNI_BINARIES", "false"),
            ("SKIP_CNI_BINARIES", "calico-ipam"),
        ],
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        std::fs::read(host.bin("calico")).unwrap(),
        b"#!/bin/sh\necho kept\n"
    );
    assert!(!host.bin("calico-ipam").exists());
    // A host with no CNI directories yet: they are made (as Calico's
    // install-cni makes them), the binaries and the config written there.
    let bare = tempfile::tempdir().unwrap();
    let install_bare = || {
        exec_args(
            CALICO,
            &["install", "--host-root", bare.path().to_str().unwrap()],
            &HashMap::from([("SLEEP".to_string(), "false".to_string())]),
            "",
        )
    };
    let out = install_bare();
    assert_eq!(out.code, 0, "{out:?}");
    let bin = bare.path().join("opt/cni/bin");
    assert!(bin.is_dir());
    assert_eq!(
        std::fs::read(bin.join("calico")).unwrap(),
        std::fs::read(CALICO).unwrap()
    );
    assert_eq!(
        std::fs::read_link(bin.join("calico-ipam")).unwrap(),
        Path::new("calico")
    );
    assert!(
        bare.path()
            .join("etc/cni/net.d/10-calico.conflist")
            .is_file()
    );
    // With no binary directory that can be made or written, the install
    // fails.
    std::fs::remove_dir_all(bare.path().join("opt")).unwrap();
    std::fs::write(bare.path().join("opt"), "not a directory").unwrap();
    let out = install_bare();
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr.contains("no CNI binary directory is writable"),
        "{out:?}"
    );
}

/// The stock Kubernetes-datastore template of calico.yaml, from its field
/// list.
fn kdd_template() -> String {
    r#"{
  "name": "k8s-pod-network",
  "cniVersion": "0.3.1",
  "plugins": [
    {
      "type": "calico",
      "log_level": "info",
      "log_file_path": "/var/log/calico/cni/cni.log",
      "datastore_type": "kubernetes",
      "nodename": "__KUBERNETES_NODE_NAME__",
      "mtu": __CNI_MTU__,
      "ipam": {
          "type": "calico-ipam"
      },
      "policy": {
          "type": "k8s"
      },
      "kubernetes": {
          "kubeconfig": "__KUBECONFIG_FILEPATH__"
      }
    },
    {
      "type": "portmap",
      "snat": true,
      "capabilities": {"portMappings": true}
    }
  ]
}"#
    .to_string()
}

/// The stock etcd template of calico-etcd.yaml, from its field list.
fn etcd_template() -> String {
    r#"{
  "name": "k8s-pod-network",
  "cniVersion": "0.3.1",
  "plugins": [
    {
      "type": "calico",
      "log_level": "info",
      "log_file_path": "/var/log/calico/cni/cni.log",
      "etcd_endpoints": "__ETCD_ENDPOINTS__",
      "etcd_key_file": "__ETCD_KEY_FILE__",
      "etcd_cert_file": "__ETCD_CERT_FILE__",
      "etcd_ca_cert_file": "__ETCD_CA_CERT_FILE__",
      "mtu": __CNI_MTU__,
      "ipam": {
          "type": "calico-ipam"
      },
      "policy": {
          "type": "k8s"
      },
      "kubernetes": {
          "kubeconfig": "__KUBECONFIG_FILEPATH__"
      }
    },
    {
      "type": "portmap",
      "snat": true,
      "capabilities": {"portMappings": true}
    }
  ]
}"#
    .to_string()
}

#[test]
fn the_network_config_is_what_calicos_install_writes() {
    // Calico's install-cni replaces each placeholder as text: the expected
    // file is the template with exactly those replacements.
    let host = Host::new();
    let template = kdd_template();
    let out = host.install(
        &["--binaries", "none"],
        &[
            ("CNI_CONF_NAME", "10-calico.conflist"),
            ("CNI_NETWORK_CONFIG", &template),
            ("KUBERNETES_NODE_NAME", "node-7"),
            ("CNI_MTU", "1440"),
            ("SLEEP", "false"),
        ],
    );
    assert_eq!(out.code, 0, "{out:?}");
    let expected = template
        .replace("__KUBERNETES_NODE_NAME__", "node-7")
        .replace(
            "__KUBECONFIG_FILEPATH__",
            "/etc/cni/net.d/calico-kubeconfig",
        )
        .replace("__CNI_MTU__", "1440");
    let written = host.net_d("10-calico.conflist");
    assert_eq!(std::fs::read_to_string(&written).unwrap(), expected);
    // Calico's install-cni writes it 0600 (0644 only in its own tests).
    assert_eq!(mode(&written), 0o600);
    assert!(
        !host.net_d("calico-kubeconfig").exists(),
        "not in a pod: no kubeconfig"
    );

    // The etcd manifest: TLS files from TLS_ASSETS_DIR beside the config
    // (their modes kept), their paths as the node sees them; a new config
    // name replaces the old file.
    let secrets = tempfile::tempdir().unwrap();
    for (name, content) in [
        ("etcd-ca", "CA"),
        ("etcd-cert", "CERT"),
        ("etcd-key", "KEY"),
    ] {
        let path = secrets.path().join(name);
        std::fs::write(&path, content).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
    }
    let template = etcd_template();
    let out = host.install(
        &["--binaries", "none"],
        &[
            ("CNI_CONF_NAME", "10-calico-etcd.conflist"),
            ("CNI_OLD_CONF_NAME", "10-calico.conflist"),
            ("CNI_NET_DIR", "/etc/cni/net.d"),
            ("CNI_NETWORK_CONFIG", &template),
            ("ETCD_ENDPOINTS", "https://10.0.0.1:2379"),
            ("TLS_ASSETS_DIR", secrets.path().to_str().unwrap()),
            ("SLEEP", "false"),
        ],
    );
    assert_eq!(out.code, 0, "{out:?}");
    let expected = template
        .replace(
            "__KUBECONFIG_FILEPATH__",
            "/etc/cni/net.d/calico-kubeconfig",
        )
        .replace("__CNI_MTU__", "1500")
        .replace("__ETCD_CERT_FILE__", "/etc/cni/net.d/calico-tls/etcd-cert")
        .replace("__ETCD_CA_CERT_FILE__", "/etc/cni/net.d/calico-tls/etcd-ca")
        .replace("__ETCD_KEY_FILE__", "/etc/cni/net.d/calico-tls/etcd-key")
        .replace("__ETCD_ENDPOINTS__", "https://10.0.0.1:2379");
    assert_eq!(
        std::fs::read_to_string(host.net_d("10-calico-etcd.conflist")).unwrap(),
        expected
    );
    assert!(
        !host.net_d("10-calico.conflist").exists(),
        "the old name removed"
    );
    for (name, content) in [
        ("etcd-ca", "CA"),
        ("etcd-cert", "CERT"),
        ("etcd-key", "KEY"),
    ] {
        let path = host.net_d("calico-tls").join(name);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), content);
        assert_eq!(mode(&path), 0o400, "{name}");
    }
    // A template that does not render to a JSON object changes nothing.
    let before = std::fs::read(host.net_d("10-calico-etcd.conflist")).unwrap();
    let out = host.install(
        &["--binaries", "none"],
        &[
            ("CNI_CONF_NAME", "10-calico-etcd.conflist"),
            ("CNI_NETWORK_CONFIG", "{\"mtu\": __CNI_MTU__"),
            ("SLEEP", "false"),
        ],
    );
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.contains("not valid JSON"), "{out:?}");
    assert_eq!(
        std::fs::read(host.net_d("10-calico-etcd.conflist")).unwrap(),
        before
    );
}

/// The installer's pod: its ServiceAccount's files (calico-node's
/// identity, allowed to mint tokens for calico-cni-plugin only).
struct Pod {
    dir: tempfile::TempDir,
    _sa: common::testbed::ServiceAccount,
    env: Vec<(String, String)>,
}

fn pod(bed: &'static common::testbed::Testbed) -> Pod {
    let sa = bed.service_account(
        "kube-system",
        json!([{"apiGroups": [""], "resources": ["serviceaccounts/token"],
                "resourceNames": ["calico-cni-plugin"], "verbs": ["create"]}]),
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), &sa.token).unwrap();
    std::fs::copy(bed.ca(), dir.path().join("ca.crt")).unwrap();
    std::fs::write(dir.path().join("namespace"), "kube-system").unwrap();
    let api = bed.api().trim_start_matches("https://").to_string();
    let (host, port) = api.rsplit_once(':').unwrap();
    let env = vec![
        ("KUBERNETES_SERVICE_HOST".to_string(), host.to_string()),
        ("KUBERNETES_SERVICE_PORT".to_string(), port.to_string()),
        (
            "KUBERNETES_NODE_NAME".to_string(),
            "node-install".to_string(),
        ),
        ("SLEEP".to_string(), "false".to_string()),
    ];
    Pod { dir, _sa: sa, env }
}

/// `calico ipam pool list` through the installed config: the plugin's
/// datastore access with the kubeconfig's token.
fn pools_through(conflist: &Path) -> Outcome {
    exec_args(
        CALICO,
        &[
            "ipam",
            "pool",
            "list",
            "--config",
            conflist.to_str().unwrap(),
        ],
        &HashMap::new(),
        "",
    )
}

fn kubeconfig_token(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("token:"))
        .unwrap_or_else(|| panic!("no token in {text}"));
    line.split_once(':')
        .unwrap()
        .1
        .trim()
        .trim_matches('"')
        .to_string()
}

#[test]
fn in_a_pod_it_writes_a_kubeconfig_the_plugin_uses() {
    let test = "in_a_pod_it_writes_a_kubeconfig_the_plugin_uses";
    let _api = api_shared();
    let Some(bed) = common::testbed::testbed(test) else {
        return;
    };
    let pod = pod(bed);
    let host = Host::new();
    let net_dir = host.net_d("");
    let mut env: Vec<(&str, &str)> = pod
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let net_dir_text = net_dir.to_str().unwrap().trim_end_matches('/').to_string();
    env.push(("CNI_NET_DIR", &net_dir_text));
    let out = host.install(
        &[
            "--binaries",
            "none",
            "--serviceaccount-dir",
            pod.dir.path().to_str().unwrap(),
        ],
        &env,
    );
    assert_eq!(out.code, 0, "{out:?}");
    let kubeconfig = host.net_d("calico-kubeconfig");
    assert_eq!(mode(&kubeconfig), 0o600);
    let token = kubeconfig_token(&kubeconfig);
    assert_ne!(token, pod._sa.token, "a token of its own, not the pod's");
    // The token is calico-cni-plugin's.
    let claims: Value = {
        use base64::Engine;
        let payload = token.split('.').nth(1).unwrap();
        serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(payload)
                .unwrap(),
        )
        .unwrap()
    };
    assert_eq!(
        claims["sub"], "system:serviceaccount:kube-system:calico-cni-plugin",
        "{claims}"
    );
    // The rendered config points at it, and the plugin reaches the API
    // server with it.
    let conflist = host.net_d("10-calico.conflist");
    let conf: Value = serde_json::from_slice(&std::fs::read(&conflist).unwrap()).unwrap();
    assert_eq!(
        conf["plugins"][0]["kubernetes"]["kubeconfig"],
        json!(kubeconfig.to_str().unwrap())
    );
    let out = pools_through(&conflist);
    assert_eq!(out.code, 0, "{out:?}");
}

/// A child process killed (and reaped) when this goes.
struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// [`watch_command`] running with only `env`, its output dropped.
fn watching<K, V>(host: &Host, sa_dir: &Path, env: &HashMap<K, V>) -> Kill
where
    K: AsRef<std::ffi::OsStr>,
    V: AsRef<std::ffi::OsStr>,
{
    Kill(
        watch_command(host, sa_dir)
            .env_clear()
            .envs(env)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// `calico install --watch --binaries none` on `host`, the pod's
/// ServiceAccount files in `sa_dir`.
fn watch_command(host: &Host, sa_dir: &Path) -> Command {
    let mut cmd = Command::new(CALICO);
    cmd.args([
        "install",
        "--watch",
        "--binaries",
        "none",
        "--host-root",
        host.root().to_str().unwrap(),
        "--serviceaccount-dir",
        sa_dir.to_str().unwrap(),
    ]);
    cmd
}

#[test]
fn watch_renews_the_token_and_re_renders_while_plugin_calls_work() {
    let test = "watch_renews_the_token_and_re_renders_while_plugin_calls_work";
    let _api = api_shared();
    let Some(bed) = common::testbed::testbed(test) else {
        return;
    };
    let pod = pod(bed);
    let host = Host::new();
    let net_dir_text = host
        .net_d("")
        .to_str()
        .unwrap()
        .trim_end_matches('/')
        .to_string();
    let template_file = host.root().join("template.json");
    std::fs::write(&template_file, template_with_state_in(&host)).unwrap();
    let mut env: HashMap<String, String> = pod.env.iter().cloned().collect();
    env.extend([
        ("CNI_NET_DIR".to_string(), net_dir_text),
        (
            "CNI_NETWORK_CONFIG_FILE".to_string(),
            template_file.display().to_string(),
        ),
        ("CNI_TOKEN_REFRESH_INTERVAL".to_string(), "1s".to_string()),
        ("CNI_MTU".to_string(), "1400".to_string()),
    ]);
    let mut watch = watching(&host, pod.dir.path(), &env);
    let kubeconfig = host.net_d("calico-kubeconfig");
    let conflist = host.net_d("10-calico.conflist");
    let until = Instant::now() + Duration::from_secs(30);
    while !(kubeconfig.exists() && conflist.exists()) {
        assert!(Instant::now() < until, "the watch installed nothing");
        assert!(watch.0.try_wait().unwrap().is_none(), "the watch stopped");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut tokens = vec![kubeconfig_token(&kubeconfig)];
    let end = Instant::now() + Duration::from_secs(6);
    let mut calls = 0;
    while Instant::now() < end {
        let out = pools_through(&conflist);
        assert_eq!(out.code, 0, "call {calls}: {out:?}");
        calls += 1;
        let token = kubeconfig_token(&kubeconfig);
        if tokens.last() != Some(&token) {
            tokens.push(token);
        }
    }
    assert!(tokens.len() >= 3, "{} tokens in 6 s", tokens.len());
    // A template change is rendered within seconds.
    std::fs::write(
        &template_file,
        template_with_state_in(&host).replace("\"info\"", "\"debug\""),
    )
    .unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let conf: Value = serde_json::from_slice(&std::fs::read(&conflist).unwrap()).unwrap();
        if conf["plugins"][0]["log_level"] == "debug" {
            assert_eq!(conf["plugins"][0]["mtu"], 1400);
            break;
        }
        assert!(
            Instant::now() < until,
            "the template change was not rendered"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(watch.0.try_wait().unwrap().is_none(), "the watch stopped");
}

/// The KDD template with the plugin's node state (`local_datastore_path`,
/// and so STATUS's cache and the datastore watch's report beside it) in
/// `host`'s directory rather than the node's /var/lib/calico.
fn template_with_state_in(host: &Host) -> String {
    let state = host.root().join("state/store.db");
    kdd_template().replace(
        "\"log_level\": \"info\",",
        &format!(
            "\"log_level\": \"info\",\n      \"local_datastore_path\": \"{}\",",
            state.display()
        ),
    )
}

/// `calico install --watch` in a pod (its ServiceAccount's files), the
/// KDD template's network config with its state beside the host, a pool
/// for STATUS's IPAM check, and the config STATUS is called with.
struct WatchedNode {
    w: common::ipam::World,
    cni: common::testbed::ServiceAccount,
    _watcher: common::testbed::ServiceAccount,
    _sa_dir: tempfile::TempDir,
    host: Host,
    watch: Kill,
    conf: Value,
}

impl WatchedNode {
    /// The watcher's identity may watch ClusterInformation and
    /// ServiceAccounts, plus `extra_rules`.
    fn start(test: &str, extra_rules: Value) -> Option<WatchedNode> {
        let bed = common::testbed::testbed(test)?;
        let w = common::ipam::World::new(test, common::ipam::Backend::Kdd)?;
        w.pool(&w.v4(0).to_string(), json!({}));
        let cni = bed.service_account("kube-system", bed.cni_rules());
        let mut rules = vec![
            json!({"apiGroups": [""], "resources": ["serviceaccounts/token"],
                   "resourceNames": [cni.name], "verbs": ["create"]}),
            json!({"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["list", "watch"]}),
            json!({"apiGroups": ["crd.projectcalico.org", "projectcalico.org"],
                   "resources": ["clusterinformations"], "verbs": ["list", "watch"]}),
        ];
        rules.extend(extra_rules.as_array().cloned().unwrap_or_default());
        let watcher = bed.service_account("kube-system", Value::Array(rules));
        let sa_dir = tempfile::tempdir().unwrap();
        std::fs::write(sa_dir.path().join("token"), &watcher.token).unwrap();
        std::fs::copy(bed.ca(), sa_dir.path().join("ca.crt")).unwrap();
        std::fs::write(sa_dir.path().join("namespace"), "kube-system").unwrap();
        let host = Host::new();
        let template_file = host.root().join("template.json");
        std::fs::write(
            &template_file,
            template_with_state_in(&host).replace("\"0.3.1\"", "\"1.1.0\""),
        )
        .unwrap();
        let api = bed.api().trim_start_matches("https://").to_string();
        let (api_host, api_port) = api.rsplit_once(':').unwrap();
        let net_dir = host.net_d("");
        let env: HashMap<&str, &str> = HashMap::from([
            ("KUBERNETES_SERVICE_HOST", api_host),
            ("KUBERNETES_SERVICE_PORT", api_port),
            ("KUBERNETES_NODE_NAME", &w.node),
            ("SLEEP", "false"),
            (
                "CNI_NET_DIR",
                net_dir.to_str().unwrap().trim_end_matches('/'),
            ),
            ("CNI_NETWORK_CONFIG_FILE", template_file.to_str().unwrap()),
            ("CALICO_CNI_SERVICE_ACCOUNT", &cni.name),
        ]);
        let watch = watching(&host, sa_dir.path(), &env);
        let mut node = WatchedNode {
            w,
            cni,
            _watcher: watcher,
            _sa_dir: sa_dir,
            host,
            watch,
            conf: Value::Null,
        };
        node.await_report("ready", Duration::from_secs(30));
        let conflist: Value =
            serde_json::from_slice(&std::fs::read(node.host.net_d("10-calico.conflist")).unwrap())
                .unwrap();
        let mut conf = conflist["plugins"][0].clone();
        conf["name"] = conflist["name"].clone();
        conf["cniVersion"] = json!("1.1.0");
        conf["status_probe_seconds"] = json!(1);
        conf["log_level"] = json!("debug");
        conf["log_file_path"] = json!(node.host.root().join("cni.log"));
        node.conf = conf;
        Some(node)
    }

    /// The watch's report, when one parses.
    fn report(&self) -> Option<Value> {
        let file = self
            .host
            .root()
            .join("state/cni-status/datastore-watch.json");
        serde_json::from_slice(&std::fs::read(file).ok()?).ok()
    }

    /// Waits (up to `within`) for a report of `verdict`, the watch running
    /// all along; how long it took.
    fn await_report(&mut self, verdict: &str, within: Duration) -> Duration {
        let began = Instant::now();
        while self.report().is_none_or(|r| r["verdict"] != verdict) {
            assert!(
                began.elapsed() < within,
                "no {verdict} report within {within:?}: {:?}",
                self.report()
            );
            assert!(
                self.watch.0.try_wait().unwrap().is_none(),
                "the watch stopped"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        began.elapsed()
    }

    /// STATUS with the installed config, and how long it took.
    fn status(&self) -> (Outcome, Duration) {
        let cni_path = self.w.bin.display().to_string();
        let vars = env_of(&[("CNI_COMMAND", "STATUS"), ("CNI_PATH", &cni_path)]);
        let t0 = Instant::now();
        let out = exec(CALICO, &vars, &self.conf.to_string());
        (out, t0.elapsed())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.host.root().join("cni.log")).unwrap_or_default()
    }
}

/// The API server to this binary's tests: shared (read) by those that use
/// it, taken whole (write) by the one that stops its etcd.
static API: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn api_shared() -> std::sync::RwLockReadGuard<'static, ()> {
    API.read().unwrap_or_else(|e| e.into_inner())
}

/// In a pod, `--watch` follows the datastore for STATUS with the pod's
/// own credentials: its report is ready while ClusterInformation is and
/// the CNI's ServiceAccount exists, and STATUS takes it for its probe (no
/// request); the ServiceAccount deleted (every token made for it refused,
/// which nothing on the node can see), the report and STATUS turn not
/// ready within seconds, not at the next probe. (Its identity may not
/// watch Leases: the storage's heartbeat is left out, the rest stands.)
#[test]
fn the_watch_tells_status_at_once_when_the_cni_service_account_goes() {
    let test = "the_watch_tells_status_at_once_when_the_cni_service_account_goes";
    let _api = api_shared();
    let Some(mut node) = WatchedNode::start(test, json!([])) else {
        return;
    };
    node.status().0.assert_ok();
    std::thread::sleep(Duration::from_millis(1100));
    node.status().0.assert_ok();
    assert!(
        node.log().contains("confirmed by the datastore watch"),
        "the report did not stand for the probe: {}",
        node.log()
    );

    let deleted = Instant::now();
    node.cni.delete();
    node.await_report("not-ready", Duration::from_secs(30));
    let noticed = deleted.elapsed();
    let report = node.report().unwrap();
    let reason = report["reason"].as_str().unwrap().to_string();
    assert!(
        reason.contains(&format!(
            "ServiceAccount kube-system/{} does not exist",
            node.cni.name
        )),
        "{reason}"
    );
    let (out, took) = node.status();
    assert_eq!(
        (out.code, out.json()["code"].as_i64()),
        (1, Some(50)),
        "{out:?}"
    );
    let not_ready = deleted.elapsed();
    eprintln!(
        "{test}: the report turned not ready {} ms after the ServiceAccount's deletion; STATUS answered not ready {} ms after it (the call took {} ms)",
        noticed.as_millis(),
        not_ready.as_millis(),
        took.as_millis()
    );
    assert!(not_ready < Duration::from_secs(30), "{not_ready:?}");
    assert!(
        node.watch.0.try_wait().unwrap().is_none(),
        "the watch stopped"
    );
}

/// The API server's etcd stopped (SIGSTOP) behind a live API server: the
/// watches stay open and quiet (the server's watch cache serves them), but
/// the node's Lease, renewed every 2 s here as kubelet renews it, is seen
/// renewed no more; the watch reads it as of now, that read gets no
/// answer, and the report and STATUS turn not ready within 30 s of the
/// stop. etcd continued, renewals are seen again and the report is ready;
/// renewals stopped with etcd well (kubelet down), it stays ready.
#[test]
fn the_watch_tells_status_when_etcd_stops_behind_the_api_server() {
    let test = "the_watch_tells_status_when_etcd_stops_behind_the_api_server";
    let _api = API.write().unwrap_or_else(|e| e.into_inner());
    let Some(mut node) = WatchedNode::start(
        test,
        json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                "verbs": ["get", "list", "watch"]}]),
    ) else {
        return;
    };
    let bed = node.w.bed();
    let lease_path = format!(
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{}",
        node.w.node
    );
    bed.create(
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
        &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": node.w.node},
                "spec": {"holderIdentity": node.w.node, "leaseDurationSeconds": 40}}),
    );
    // kubelet's part: the Lease renewed every 2 s until told to stop.
    let renewing = Arc::new(AtomicBool::new(true));
    let renewer = {
        let (renewing, path) = (renewing.clone(), lease_path.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while renewing.load(Ordering::SeqCst) {
                n += 1;
                let at = format!("2026-01-01T00:00:{:02}.{n:06}Z", n % 60);
                bed.admin_typed(
                    "PATCH",
                    &path,
                    Some(&json!({"spec": {"renewTime": at}})),
                    "application/merge-patch+json",
                );
                std::thread::sleep(Duration::from_secs(2));
            }
        })
    };
    let stop_renewing = || {
        renewing.store(false, Ordering::SeqCst);
    };
    // The Lease's first renewals seen, the storage's read not yet made.
    std::thread::sleep(Duration::from_secs(5));
    node.status().0.assert_ok();

    let etcd_pid: i32 = std::fs::read_to_string(Path::new(bed.var("TESTBED_DIR")).join("etcd.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let stopped = Stopped::new(etcd_pid);
    node.await_report("not-ready", Duration::from_secs(30));
    let noticed = stopped.since.elapsed();
    let reason = node.report().unwrap()["reason"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        reason.contains(&format!("Lease kube-node-lease/{}", node.w.node))
            && reason.contains("storage"),
        "{reason}"
    );
    let (out, took) = node.status();
    let not_ready = stopped.since.elapsed();
    assert_eq!(
        (out.code, out.json()["code"].as_i64()),
        (1, Some(50)),
        "{out:?}"
    );
    assert!(
        out.json()["msg"].as_str().unwrap_or("").contains("storage")
            || out.json()["details"]
                .as_str()
                .unwrap_or("")
                .contains("storage"),
        "{out:?}"
    );
    eprintln!(
        "{test}: etcd stopped: the report turned not ready after {} ms, STATUS answered not ready {} ms after the stop (the call took {} ms)",
        noticed.as_millis(),
        not_ready.as_millis(),
        took.as_millis()
    );
    assert!(not_ready < Duration::from_secs(30), "{not_ready:?}");

    drop(stopped);
    let back = node.await_report("ready", Duration::from_secs(60));
    eprintln!(
        "{test}: etcd continued: the report ready again after {} ms",
        back.as_millis()
    );
    // (The API server's answers may lag a few seconds behind etcd's.)
    let until = Instant::now() + Duration::from_secs(30);
    while node.status().0.code != 0 {
        assert!(
            Instant::now() < until,
            "STATUS stayed not ready: {:?}",
            node.status().0
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    // kubelet gone, etcd well: the storage answers the read; still ready.
    stop_renewing();
    renewer.join().unwrap();
    let quiet = Instant::now();
    while quiet.elapsed() < Duration::from_secs(25) {
        let verdict = node.report().map(|r| r["verdict"].clone());
        assert_eq!(verdict, Some(json!("ready")), "{:?}", node.report());
        std::thread::sleep(Duration::from_millis(200));
    }
    bed.delete(&lease_path);
}

/// A process stopped (SIGSTOP) until this goes (SIGCONT).
struct Stopped {
    pid: nix::unistd::Pid,
    since: Instant,
}

impl Stopped {
    fn new(pid: i32) -> Stopped {
        let pid = nix::unistd::Pid::from_raw(pid);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
        Stopped {
            pid,
            since: Instant::now(),
        }
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGCONT);
    }
}

/// scripts/image.sh builds the CNI image the DaemonSet change names: an OCI
/// archive whose one layer is /opt/cni/bin with this build as calico,
/// calico-ipam and install links to it (and what --add gives), install the
/// entrypoint; it says where the archive is and what it holds.
#[test]
fn the_image_script_builds_the_cni_image() {
    let test = "the_image_script_builds_the_cni_image";
    if ["jq", "tar", "gzip", "sha256sum"].iter().any(|t| {
        Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .output()
            .map_or(true, |o| !o.status.success())
    }) {
        cannot_run(test, "needs jq, tar, gzip and sha256sum");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let tar = work.path().join("out/image.tar");
    let out = Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/image.sh"))
        .args(["--binary", CALICO, "--out", tar.to_str().unwrap()])
        .args(["--add", "/bin/true"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let name = format!("calico-cni-rs:{}", env!("CARGO_PKG_VERSION"));
    assert!(
        stdout.starts_with(&format!("image {name}: {} (", tar.display())),
        "{stdout}"
    );
    for line in [
        "entrypoint: /opt/cni/bin/install (calico install: Calico's install-cni), user 0:0",
        "  /opt/cni/bin/calico-ipam -> calico",
        "  /opt/cni/bin/install -> calico",
        "calico -v: v3.32.1 calico-cni ",
    ] {
        assert!(stdout.contains(line), "{line:?} not in {stdout}");
    }

    // The archive, read as a runtime reads it: index, manifest, config, layer.
    let oci = work.path().join("oci");
    std::fs::create_dir(&oci).unwrap();
    run_ok(
        "tar",
        &["-xf", tar.to_str().unwrap(), "-C", oci.to_str().unwrap()],
    );
    let read = |p: &Path| -> Value { serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap() };
    let blob = |digest: &Value| {
        oci.join("blobs/sha256")
            .join(digest.as_str().unwrap().trim_start_matches("sha256:"))
    };
    let index = read(&oci.join("index.json"));
    let entry = &index["manifests"][0];
    assert_eq!(
        entry["annotations"]["io.containerd.image.name"],
        json!(name)
    );
    let manifest = read(&blob(&entry["digest"]));
    let config = read(&blob(&manifest["config"]["digest"]));
    assert_eq!(
        config["config"]["Entrypoint"],
        json!(["/opt/cni/bin/install"])
    );
    let rootfs = work.path().join("rootfs");
    std::fs::create_dir(&rootfs).unwrap();
    let layer = blob(&manifest["layers"][0]["digest"]);
    run_ok(
        "tar",
        &[
            "-xzf",
            layer.to_str().unwrap(),
            "-C",
            rootfs.to_str().unwrap(),
        ],
    );
    let bin = rootfs.join("opt/cni/bin");
    assert_eq!(
        std::fs::read(bin.join("calico")).unwrap(),
        std::fs::read(CALICO).unwrap()
    );
    assert_eq!(mode(&bin.join("calico")), 0o755);
    for link in ["calico-ipam", "install"] {
        assert_eq!(
            std::fs::read_link(bin.join(link)).unwrap(),
            Path::new("calico")
        );
    }
    assert!(bin.join("true").is_file());
    let mut names: Vec<String> = std::fs::read_dir(&bin)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["calico", "calico-ipam", "install", "true"]);
}

/// `--watch` says what it is doing through its log (stderr, plain lines
/// when it is not a terminal): the install, the watch with its counts, a
/// re-render; stdout is what it wrote, as without the watch. Runs without
/// the test bed (not in a pod: no token to renew).
#[test]
fn watch_logs_what_it_does_on_stderr_and_prints_what_it_wrote() {
    let host = Host::new();
    let template_file = host.root().join("template.json");
    std::fs::write(&template_file, kdd_template()).unwrap();
    let no_pod = tempfile::tempdir().unwrap();
    let mut watch = watch_command(&host, no_pod.path())
        .env_clear()
        .env("CNI_NETWORK_CONFIG_FILE", &template_file)
        .env("KUBERNETES_NODE_NAME", "node-7")
        .env("CNI_MTU", "1440")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let conflist = host.net_d("10-calico.conflist");
    let until = Instant::now() + Duration::from_secs(20);
    while !conflist.exists() {
        assert!(Instant::now() < until, "the watch installed nothing");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(1500));
    std::fs::write(
        &template_file,
        kdd_template().replace("\"info\"", "\"debug\""),
    )
    .unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&conflist)
        .unwrap()
        .contains("\"debug\"")
    {
        assert!(
            Instant::now() < until,
            "the template change was not rendered"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(300));
    watch.kill().unwrap();
    let out = watch.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    let written = format!("wrote {}\n", conflist.display());
    assert_eq!(stdout, written.repeat(2), "{stderr}");
    let logged: Vec<&str> = stderr
        .lines()
        .map(|l| l.split_once(" INFO ").map_or(l, |(_, m)| m.trim_start()))
        .collect();
    assert_eq!(
        logged,
        [
            "installing...",
            "watching the network config's inputs (0 looks, 0 re-renders)...",
            "network config re-rendered",
        ],
        "{stderr}"
    );
    assert!(!stderr.contains('\r'), "{stderr:?}");
}
