//! The test bed of `scripts/testbed.sh`: a real etcd, kube-apiserver and
//! kube-controller-manager on loopback, Calico's CRDs, the CNI's
//! ServiceAccount and token kubeconfig. One per test run: `scripts/test.sh`
//! starts it and exports its environment; a test run by hand starts it here
//! (`up` is idempotent) when the environment does not name one.
//!
//! The admin's requests go through `curl` with the admin client certificate,
//! so that nothing the tests do as the admin shares code with the plugin's
//! own API client.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use serde_json::{Value, json};

/// What `scripts/testbed.sh env` exports.
pub struct Testbed {
    env: HashMap<String, String>,
}

static TESTBED: OnceLock<Result<Testbed, String>> = OnceLock::new();

/// The test bed, started if needed; `None` (the test skips, saying why)
/// when it cannot start outside CI. Under CI=true a test bed that cannot
/// start fails the test.
pub fn testbed(test: &str) -> Option<&'static Testbed> {
    if !nix::unistd::geteuid().is_root() {
        crate::common::cannot_run(test, "the test bed needs root");
        return None;
    }
    match TESTBED.get_or_init(Testbed::locate) {
        Ok(t) => Some(t),
        Err(e) => {
            crate::common::cannot_run(test, &format!("the test bed did not start: {e}"));
            None
        }
    }
}

fn parse_exports(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim_matches('\'').to_string()))
        .collect()
}

impl Testbed {
    fn locate() -> Result<Testbed, String> {
        if std::env::var_os("TESTBED_DIR").is_some() && std::env::var_os("TESTBED_API").is_some() {
            let env = std::env::vars()
                .filter(|(k, _)| {
                    k.starts_with("TESTBED_")
                        || k.starts_with("ETCD_")
                        || ["PEERS_BIN", "KUBECONFIG", "CALICO_CNI_KUBECONFIG"]
                            .contains(&k.as_str())
                })
                .collect();
            return Ok(Testbed { env });
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/testbed.sh");
        let up = Command::new("bash")
            .arg(&script)
            .arg("up")
            .stdout(Stdio::null())
            .output()
            .map_err(|e| format!("bash {}: {e}", script.display()))?;
        if !up.status.success() {
            return Err(format!(
                "{} up failed: {}",
                script.display(),
                String::from_utf8_lossy(&up.stderr)
            ));
        }
        let env = Command::new("bash")
            .arg(&script)
            .arg("env")
            .output()
            .map_err(|e| e.to_string())?;
        Ok(Testbed {
            env: parse_exports(&String::from_utf8_lossy(&env.stdout)),
        })
    }

    pub fn var(&self, name: &str) -> &str {
        self.env
            .get(name)
            .unwrap_or_else(|| panic!("the test bed exports no {name}"))
    }

    /// An export of the test bed, `None` when it has none.
    pub fn var_opt(&self, name: &str) -> Option<&str> {
        self.env.get(name).map(String::as_str)
    }

    /// `https://127.0.0.1:PORT`
    pub fn api(&self) -> &str {
        self.var("TESTBED_API")
    }
    pub fn ca(&self) -> PathBuf {
        self.var("TESTBED_CA").into()
    }
    pub fn peer(&self, name: &str) -> PathBuf {
        Path::new(self.var("PEERS_BIN")).join(name)
    }
    pub fn peers_bin(&self) -> &str {
        self.var("PEERS_BIN")
    }
    /// The CNI's own kubeconfig (calico-cni-plugin's token).
    pub fn cni_kubeconfig(&self) -> PathBuf {
        self.var("CALICO_CNI_KUBECONFIG").into()
    }

    /// One admin request: (HTTP status, the body as JSON or a string).
    pub fn admin(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        self.admin_typed(method, path, body, "application/json")
    }

    pub fn admin_typed(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        content_type: &str,
    ) -> (u16, Value) {
        let mut cmd = Command::new("curl");
        cmd.args([
            "-sS",
            "--max-time",
            "30",
            "-X",
            method,
            "-w",
            "\n%{http_code}",
        ])
        .arg("--cacert")
        .arg(self.var("TESTBED_CA"))
        .arg("--cert")
        .arg(self.var("TESTBED_ADMIN_CERT"))
        .arg("--key")
        .arg(self.var("TESTBED_ADMIN_KEY"))
        .args(["-H", &format!("Content-Type: {content_type}")])
        .arg(format!("{}{path}", self.api()));
        if body.is_some() {
            cmd.args(["--data-binary", "@-"]);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("curl");
        if let Some(b) = body {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(b.to_string().as_bytes())
                .unwrap();
        } else {
            drop(child.stdin.take());
        }
        let out = child.wait_with_output().expect("curl");
        assert!(
            out.status.success(),
            "curl {method} {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let (body, code) = text.rsplit_once('\n').expect("curl -w status");
        let value = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.into()));
        (code.trim().parse().expect("status"), value)
    }

    /// GET, `None` on 404.
    pub fn get(&self, path: &str) -> Option<Value> {
        match self.admin("GET", path, None) {
            (200, v) => Some(v),
            (404, _) => None,
            (code, v) => panic!("GET {path}: {code} {v}"),
        }
    }

    /// POST that must create (201).
    pub fn create(&self, path: &str, body: &Value) -> Value {
        let (code, v) = self.admin("POST", path, Some(body));
        assert!(code == 201 || code == 200, "POST {path}: {code} {v}");
        v
    }

    /// DELETE; 404 is fine.
    pub fn delete(&self, path: &str) {
        let (code, v) = self.admin("DELETE", path, None);
        assert!(
            code == 200 || code == 202 || code == 404,
            "DELETE {path}: {code} {v}"
        );
    }

    /// A merge patch (`sub` is "" or "/status"), returned once the API
    /// server's watch cache serves it (see [`Testbed::await_cached`]).
    pub fn merge_patch(&self, path: &str, patch: &Value) -> Value {
        let (code, v) =
            self.admin_typed("PATCH", path, Some(patch), "application/merge-patch+json");
        assert_eq!(code, 200, "PATCH {path}: {v}");
        // (An object on its way out — a finalizer removed — is no one's
        // configuration: not waited for.)
        if v["metadata"]["deletionTimestamp"].is_null() {
            let object = path.strip_suffix("/status").unwrap_or(path);
            self.await_cached(object, v["metadata"]["resourceVersion"].as_str());
        }
        v
    }

    /// Waits (10 s at most) until the API server's watch cache serves the
    /// object at `path` at resourceVersion `rv` or later (`None`: until it
    /// serves it as gone). The plugin reads configuration — IPAMConfig,
    /// a node's labels, a namespace — from that cache, which trails a write
    /// by milliseconds: a test that changes one and calls the plugin right
    /// away waits for it, as an operator's change precedes the pods it is
    /// for by far more.
    pub fn await_cached(&self, path: &str, rv: Option<&str>) {
        let number = |v: &str| v.parse::<u64>().ok();
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let (code, v) = self.admin("GET", &format!("{path}?resourceVersion=0"), None);
            let served = match rv {
                Some(rv) => {
                    code == 200
                        && v["metadata"]["resourceVersion"].as_str().and_then(number) >= number(rv)
                }
                None => code == 404,
            };
            if served {
                return;
            }
            assert!(
                Instant::now() < end,
                "the watch cache does not serve {path} at {rv:?}: {code} {v}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A namespace of the test's own, deleted on drop.
    pub fn namespace(&'static self, labels: Value, annotations: Value) -> Namespace {
        let name = format!("t{}", crate::common::unique());
        self.create(
            "/api/v1/namespaces",
            &json!({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": name, "labels": labels, "annotations": annotations}}),
        );
        Namespace { bed: self, name }
    }

    /// A Node, deleted on drop, once kube-controller-manager's node IPAM
    /// gave it a spec.podCIDR.
    pub fn node(&'static self, name: &str) -> Node {
        self.create(
            "/api/v1/nodes",
            &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}),
        );
        let node = Node {
            bed: self,
            name: name.into(),
        };
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let n = self.get(&format!("/api/v1/nodes/{name}")).expect("node");
            if n["spec"]["podCIDR"].is_string() {
                return node;
            }
            assert!(Instant::now() < end, "node {name} got no podCIDR: {n}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A TokenRequest for `namespace/sa`, valid `seconds`.
    pub fn token(&self, namespace: &str, sa: &str, seconds: u64) -> String {
        let v = self.create(
            &format!("/api/v1/namespaces/{namespace}/serviceaccounts/{sa}/token"),
            &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                    "spec": {"expirationSeconds": seconds}}),
        );
        v["status"]["token"].as_str().expect("token").to_string()
    }

    /// A ServiceAccount in `namespace` bound to a ClusterRole with `rules`,
    /// both of this test's own (removed on drop); its token.
    pub fn service_account(&'static self, namespace: &str, rules: Value) -> ServiceAccount {
        let name = format!("sa-{}", crate::common::unique());
        self.create(
            &format!("/api/v1/namespaces/{namespace}/serviceaccounts"),
            &json!({"apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": name, "namespace": namespace}}),
        );
        self.create(
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                    "metadata": {"name": name}, "rules": rules}),
        );
        self.create(
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": name},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                    "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]}),
        );
        let token = self.token(namespace, &name, 3600);
        ServiceAccount {
            bed: self,
            namespace: namespace.into(),
            name,
            token,
        }
    }

    /// The rules of the CNI's ClusterRole (testbed/rbac.json).
    pub fn cni_rules(&self) -> Value {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("testbed/rbac.json");
        let objects: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        objects
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["kind"] == "ClusterRole")
            .expect("ClusterRole")["rules"]
            .clone()
    }

    /// A kubeconfig in `dir` for `server` (the API server or a proxy in
    /// front of it, both serving certificates of the test bed's CA) with
    /// the user entry `user` (`{"token": ..}`, `{"tokenFile": ..}`).
    pub fn kubeconfig(&self, dir: &Path, name: &str, server: &str, user: Value) -> PathBuf {
        let ca = std::fs::read(self.ca()).unwrap();
        let kc = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "testbed", "cluster": {"server": server,
                "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(ca)}}],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "testbed", "context": {"cluster": "testbed", "user": "user"}}],
            "current-context": "testbed"
        });
        let path = dir.join(name);
        std::fs::write(&path, kc.to_string()).unwrap();
        path
    }

    /// A fault proxy in front of the API server and a kubeconfig in `dir`
    /// (file `name`) that reaches it through the proxy with the CNI's token.
    #[allow(dead_code)]
    pub fn cni_through_proxy(
        &self,
        dir: &Path,
        name: &str,
    ) -> (crate::common::faultproxy::FaultProxy, PathBuf) {
        let proxy = crate::common::faultproxy::FaultProxy::start(
            self.api(),
            &self.ca(),
            self.var("TESTBED_PROXY_CERT").as_ref(),
            self.var("TESTBED_PROXY_KEY").as_ref(),
        );
        let kubeconfig =
            self.kubeconfig(dir, name, &proxy.url(), json!({"token": self.cni_token()}));
        (proxy, kubeconfig)
    }

    /// The token in the CNI's kubeconfig.
    pub fn cni_token(&self) -> String {
        let kc: Value =
            serde_json::from_slice(&std::fs::read(self.cni_kubeconfig()).unwrap()).unwrap();
        kc["users"][0]["user"]["token"]
            .as_str()
            .expect("token")
            .to_string()
    }

    /// A service-account JWT for `namespace/sa` signed with the test bed's
    /// signing key, expiring at `exp` (it may lie in the past).
    pub fn signed_jwt(&self, namespace: &str, sa: &str, uid: &str, exp: SystemTime) -> String {
        let b64 = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_secs();
        let exp = secs(exp);
        let header = json!({"alg": "RS256", "typ": "JWT"});
        let claims = json!({
            "iss": self.api(), "aud": [self.api()], "sub": format!("system:serviceaccount:{namespace}:{sa}"),
            "iat": exp - 3600, "nbf": exp - 3600, "exp": exp,
            "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": sa, "uid": uid}}
        });
        let signing_input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let mut child = Command::new("openssl")
            .args(["dgst", "-sha256", "-sign", self.var("TESTBED_SA_KEY")])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("openssl");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(signing_input.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "openssl dgst -sign failed");
        format!("{signing_input}.{}", b64(&out.stdout))
    }
}

/// A namespace of one test; deleted (with its pods) on drop.
pub struct Namespace {
    bed: &'static Testbed,
    pub name: String,
}

impl Namespace {
    pub fn pod_path(&self, pod: &str) -> String {
        format!("/api/v1/namespaces/{}/pods/{pod}", self.name)
    }

    /// Creates a pod from `pod` (its metadata.namespace is filled in).
    pub fn create_pod(&self, mut pod: Value) -> Value {
        pod["apiVersion"] = json!("v1");
        pod["kind"] = json!("Pod");
        pod["metadata"]["namespace"] = json!(self.name);
        self.bed
            .create(&format!("/api/v1/namespaces/{}/pods", self.name), &pod)
    }

    pub fn pod(&self, name: &str) -> Option<Value> {
        self.bed.get(&self.pod_path(name))
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        // Pods first, without grace, so that nothing waits for a kubelet.
        let _ = self.bed.admin(
            "DELETE",
            &format!("/api/v1/namespaces/{}/pods?gracePeriodSeconds=0", self.name),
            None,
        );
        let _ = self
            .bed
            .admin("DELETE", &format!("/api/v1/namespaces/{}", self.name), None);
    }
}

/// A Node of one test; deleted on drop.
pub struct Node {
    bed: &'static Testbed,
    pub name: String,
}

impl Node {
    pub fn get(&self) -> Value {
        self.bed
            .get(&format!("/api/v1/nodes/{}", self.name))
            .expect("node")
    }
    pub fn pod_cidr(&self) -> String {
        self.get()["spec"]["podCIDR"].as_str().unwrap().to_string()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self
            .bed
            .admin("DELETE", &format!("/api/v1/nodes/{}", self.name), None);
    }
}

/// A ServiceAccount with a ClusterRole of one test; removed on drop.
pub struct ServiceAccount {
    bed: &'static Testbed,
    pub namespace: String,
    pub name: String,
    pub token: String,
}

impl ServiceAccount {
    /// Deletes the ServiceAccount now (its tokens stop being accepted).
    pub fn delete(&self) {
        self.bed.delete(&format!(
            "/api/v1/namespaces/{}/serviceaccounts/{}",
            self.namespace, self.name
        ));
    }
}

impl Drop for ServiceAccount {
    fn drop(&mut self) {
        self.delete();
        let _ = self.bed.admin(
            "DELETE",
            &format!(
                "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{}",
                self.name
            ),
            None,
        );
        let _ = self.bed.admin(
            "DELETE",
            &format!(
                "/apis/rbac.authorization.k8s.io/v1/clusterroles/{}",
                self.name
            ),
            None,
        );
    }
}

/// Where `scripts/peers.sh` puts the peers' binaries: PEERS_BIN, or the
/// script's cache.
pub fn peers_bin_dir() -> PathBuf {
    match std::env::var("PEERS_BIN") {
        Ok(b) => PathBuf::from(b),
        Err(_) => {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/peers.sh");
            let out = Command::new("bash")
                .arg(script)
                .arg("--print-bin")
                .output()
                .expect("bash scripts/peers.sh --print-bin");
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    }
}

/// A peer binary built by `scripts/peers.sh` (PEERS_BIN, or the script's
/// cache); `None` when it cannot run (see `cannot_run`).
pub fn peer(test: &str, name: &str) -> Option<PathBuf> {
    let path = peers_bin_dir().join(name);
    if path.exists() {
        Some(path)
    } else {
        crate::common::cannot_run(
            test,
            &format!("{} is not built (scripts/peers.sh)", path.display()),
        );
        None
    }
}
