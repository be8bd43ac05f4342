//! Calico's network configuration (`NetConf`), decoded the way Go's
//! `encoding/json` decodes it: keys match case-insensitively (an exact match
//! wins), `null` leaves the default, unknown keys are ignored here (the raw
//! document is kept for delegation), and a type mismatch anywhere fails the
//! whole document with the path of the field.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::cni::error::{Error, Result};
use crate::cni::version::Version;
use crate::k8s::K8sConfig;

pub const DEFAULT_NODENAME_FILE: &str = "/var/lib/calico/nodename";
pub const DEFAULT_MTU_FILE: &str = "/var/lib/calico/mtu";
pub const DEFAULT_LOCAL_DATASTORE: &str = "/var/lib/calico/cni-datastore.db";
/// Where DELs that could not reach the datastore record what they owe.
pub const DEFAULT_RELEASE_QUEUE_DIR: &str = "/var/lib/calico/cni-release-queue";
/// Where STATUS keeps its answers between calls (a file per network).
pub const DEFAULT_STATUS_CACHE_DIR: &str = "/var/lib/calico/cni-status";
/// How long a ready STATUS answer is kept between full checks (one of 7
/// API requests on the Kubernetes datastore, 8 dual-stack).
pub const DEFAULT_STATUS_CACHE_SECONDS: u64 = 900;
/// How often one datastore read (ClusterInformation) confirms a kept
/// answer: with a full check every 15 minutes, at most one API request a
/// minute on average.
pub const DEFAULT_STATUS_PROBE_SECONDS: u64 = 120;
pub const DEFAULT_DEADLINE_SECONDS: f64 = 30.0;

/// How long before its token expires STATUS reports the Kubernetes
/// credentials as failing: a renewer (calico-node, `calico install
/// --watch`) renews a 24 h token every few hours, so one an hour from its
/// end is not being renewed.
pub const DEFAULT_TOKEN_EXPIRY_MARGIN_SECONDS: u64 = 3600;
/// The longest `deadline_seconds` accepted: an hour, far past any
/// runtime's own timeout (kubelet's is 2 minutes).
pub const MAX_DEADLINE_SECONDS: f64 = 3600.0;
pub const NODENAME_FILE_HINT: &str =
    "check that the calico/node container is running and has mounted /var/lib/calico/";

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct IpamConf {
    #[serde(rename = "type")]
    pub kind: String,
    pub subnet: String,
    pub assign_ipv4: Option<String>,
    pub assign_ipv6: Option<String>,
    pub ipv4_pools: Vec<String>,
    pub ipv6_pools: Vec<String>,
    #[serde(rename = "Name")]
    pub name: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Policy {
    #[serde(rename = "type")]
    pub kind: String,
    pub k8s_api_root: String,
    pub k8s_auth_token: String,
    pub k8s_client_certificate: String,
    pub k8s_client_key: String,
    pub k8s_certificate_authority: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Kubernetes {
    pub kubeconfig: String,
    pub k8s_api_root: String,
    pub node_name: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct FeatureControl {
    pub ip_addrs_no_ipam: bool,
    pub floating_ips: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ContainerSettings {
    pub allow_ip_forwarding: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RuntimeDns {
    pub servers: Vec<String>,
    pub domain: String,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RuntimeConfig {
    pub dns: RuntimeDns,
}

/// Every key of Calico's NetConf, plus this plugin's own documented keys
/// (`deadline_seconds`, `mtu_file`, `local_datastore_path`).
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct NetConf {
    #[serde(rename = "cniVersion")]
    pub cni_version: String,
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub mode: String,
    pub vxlan_mac_prefix: String,
    pub vxlan_vni: u64,
    pub ipam: IpamConf,
    pub qps: i64,
    pub burst: i64,
    pub args: Map<String, Value>,
    pub mtu: i64,
    pub num_queues: i64,
    pub nodename: String,
    pub nodename_file: String,
    pub nodename_file_optional: bool,
    pub ipam_lock_file: String,
    pub datastore_type: String,
    pub etcd_endpoints: String,
    pub etcd_discovery_srv: String,
    pub etcd_scheme: String,
    pub etcd_key_file: String,
    pub etcd_cert_file: String,
    pub etcd_ca_cert_file: String,
    pub etcd_authority: String,
    pub log_level: String,
    pub log_file_path: String,
    pub log_file_max_size: i64,
    pub log_file_max_age: i64,
    pub log_file_max_count: i64,
    pub policy: Policy,
    pub kubernetes: Kubernetes,
    pub feature_control: FeatureControl,
    pub container_settings: ContainerSettings,
    pub include_default_routes: bool,
    pub dataplane_options: Map<String, Value>,
    pub device_type: String,
    pub windows_pod_deletion_timestamp_timeout: i64,
    pub windows_use_single_network: bool,
    pub windows_disable_default_deny_all_policy: bool,
    #[serde(rename = "windows_loopback_DSR")]
    pub windows_loopback_dsr: bool,
    #[serde(rename = "RuntimeConfig")]
    pub runtime_config: RuntimeConfig,
    pub readiness_gates: Vec<String>,
    pub policy_setup_timeout_seconds: i64,
    pub endpoint_status_dir: String,
    pub hostname: String,
    pub require_mtu_file: bool,
    pub calico_api_group: String,
    #[serde(rename = "prevResult")]
    pub prev_result: Option<Value>,

    /// Overall deadline of one invocation, in seconds. Every network,
    /// datastore and delegated-plugin wait is bounded by it.
    pub deadline_seconds: f64,
    /// Where the MTU written by calico/node is read from.
    pub mtu_file: String,
    /// The embedded datastore's file (datastore_type `local`).
    pub local_datastore_path: String,
    /// The durable queue of releases owed by DELs that could not finish.
    pub release_queue_dir: String,
    /// STATUS answers not ready when the Kubernetes token expires within
    /// this many seconds (0 or absent: [`DEFAULT_TOKEN_EXPIRY_MARGIN_SECONDS`]).
    pub token_expiry_margin_seconds: u64,
    /// How long a ready STATUS answer is kept between full checks, in
    /// seconds (absent: [`DEFAULT_STATUS_CACHE_SECONDS`]; 0: never kept).
    pub status_cache_seconds: Option<u64>,
    /// How often, within that, one datastore read confirms a kept answer,
    /// in seconds (absent: [`DEFAULT_STATUS_PROBE_SECONDS`]; 0: never).
    pub status_probe_seconds: Option<u64>,
}

impl Default for NetConf {
    fn default() -> Self {
        NetConf {
            cni_version: String::new(),
            name: String::new(),
            kind: String::new(),
            mode: String::new(),
            vxlan_mac_prefix: String::new(),
            vxlan_vni: 0,
            ipam: IpamConf::default(),
            qps: 0,
            burst: 0,
            args: Map::new(),
            mtu: 0,
            num_queues: 0,
            nodename: String::new(),
            nodename_file: String::new(),
            nodename_file_optional: false,
            ipam_lock_file: String::new(),
            datastore_type: String::new(),
            etcd_endpoints: String::new(),
            etcd_discovery_srv: String::new(),
            etcd_scheme: String::new(),
            etcd_key_file: String::new(),
            etcd_cert_file: String::new(),
            etcd_ca_cert_file: String::new(),
            etcd_authority: String::new(),
            log_level: String::new(),
            log_file_path: String::new(),
            log_file_max_size: 100,
            log_file_max_age: 30,
            log_file_max_count: 10,
            policy: Policy::default(),
            kubernetes: Kubernetes::default(),
            feature_control: FeatureControl::default(),
            container_settings: ContainerSettings::default(),
            include_default_routes: false,
            dataplane_options: Map::new(),
            device_type: String::new(),
            windows_pod_deletion_timestamp_timeout: 600,
            windows_use_single_network: false,
            windows_disable_default_deny_all_policy: false,
            windows_loopback_dsr: false,
            runtime_config: RuntimeConfig::default(),
            readiness_gates: Vec::new(),
            policy_setup_timeout_seconds: 0,
            endpoint_status_dir: String::new(),
            hostname: String::new(),
            require_mtu_file: false,
            calico_api_group: String::new(),
            prev_result: None,
            deadline_seconds: DEFAULT_DEADLINE_SECONDS,
            mtu_file: String::new(),
            local_datastore_path: String::new(),
            release_queue_dir: String::new(),
            token_expiry_margin_seconds: 0,
            status_cache_seconds: None,
            status_probe_seconds: None,
        }
    }
}

/// A struct's JSON keys and, for nested structs, their own key lists.
struct Field(&'static str, Option<Schema>);
type Schema = &'static [Field];

const IPAM_KEYS: Schema = &[
    Field("type", None),
    Field("subnet", None),
    Field("assign_ipv4", None),
    Field("assign_ipv6", None),
    Field("ipv4_pools", None),
    Field("ipv6_pools", None),
    Field("Name", None),
];
const POLICY_KEYS: Schema = &[
    Field("type", None),
    Field("k8s_api_root", None),
    Field("k8s_auth_token", None),
    Field("k8s_client_certificate", None),
    Field("k8s_client_key", None),
    Field("k8s_certificate_authority", None),
];
const KUBERNETES_KEYS: Schema = &[
    Field("kubeconfig", None),
    Field("k8s_api_root", None),
    Field("node_name", None),
];
const FEATURE_KEYS: Schema = &[Field("ip_addrs_no_ipam", None), Field("floating_ips", None)];
const CONTAINER_KEYS: Schema = &[Field("allow_ip_forwarding", None)];
const DNS_KEYS: Schema = &[
    Field("servers", None),
    Field("domain", None),
    Field("searches", None),
    Field("options", None),
];
const RUNTIME_KEYS: Schema = &[Field("dns", Some(DNS_KEYS))];
const NETCONF_KEYS: Schema = &[
    Field("cniVersion", None),
    Field("name", None),
    Field("type", None),
    Field("mode", None),
    Field("vxlan_mac_prefix", None),
    Field("vxlan_vni", None),
    Field("ipam", Some(IPAM_KEYS)),
    Field("qps", None),
    Field("burst", None),
    Field("args", None),
    Field("mtu", None),
    Field("num_queues", None),
    Field("nodename", None),
    Field("nodename_file", None),
    Field("nodename_file_optional", None),
    Field("ipam_lock_file", None),
    Field("datastore_type", None),
    Field("etcd_endpoints", None),
    Field("etcd_discovery_srv", None),
    Field("etcd_scheme", None),
    Field("etcd_key_file", None),
    Field("etcd_cert_file", None),
    Field("etcd_ca_cert_file", None),
    Field("etcd_authority", None),
    Field("log_level", None),
    Field("log_file_path", None),
    Field("log_file_max_size", None),
    Field("log_file_max_age", None),
    Field("log_file_max_count", None),
    Field("policy", Some(POLICY_KEYS)),
    Field("kubernetes", Some(KUBERNETES_KEYS)),
    Field("feature_control", Some(FEATURE_KEYS)),
    Field("container_settings", Some(CONTAINER_KEYS)),
    Field("include_default_routes", None),
    Field("dataplane_options", None),
    Field("device_type", None),
    Field("windows_pod_deletion_timestamp_timeout", None),
    Field("windows_use_single_network", None),
    Field("windows_disable_default_deny_all_policy", None),
    Field("windows_loopback_DSR", None),
    Field("RuntimeConfig", Some(RUNTIME_KEYS)),
    Field("readiness_gates", None),
    Field("policy_setup_timeout_seconds", None),
    Field("endpoint_status_dir", None),
    Field("hostname", None),
    Field("require_mtu_file", None),
    Field("calico_api_group", None),
    Field("prevResult", None),
    Field("deadline_seconds", None),
    Field("mtu_file", None),
    Field("local_datastore_path", None),
    Field("release_queue_dir", None),
    Field("token_expiry_margin_seconds", None),
    Field("status_cache_seconds", None),
    Field("status_probe_seconds", None),
];

/// Rewrites `obj`'s keys to the schema's spelling the way Go's decoder
/// matches them: an exact key wins, otherwise the first key that matches
/// case-insensitively. Known keys set to `null` are dropped (Go leaves the
/// field unchanged); unknown keys are dropped too (only the typed view is
/// built from the result).
fn canonicalize(obj: &Map<String, Value>, schema: Schema) -> Map<String, Value> {
    let mut out = Map::new();
    for Field(key, nested) in schema {
        let found = obj.get(*key).or_else(|| {
            obj.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(key))
                .map(|(_, v)| v)
        });
        let Some(value) = found else { continue };
        let value = match (value, nested) {
            (Value::Null, _) => continue,
            (Value::Object(inner), Some(nested)) => Value::Object(canonicalize(inner, nested)),
            (v, _) => v.clone(),
        };
        out.insert((*key).to_string(), value);
    }
    out
}

impl NetConf {
    /// Decodes the (already syntax-checked) config document.
    pub fn from_value(raw: &Value) -> Result<NetConf> {
        let obj = raw
            .as_object()
            .ok_or_else(|| Error::decode("network config is not a JSON object"))?;
        let canonical = Value::Object(canonicalize(obj, NETCONF_KEYS));
        let conf: NetConf = serde_path_to_error::deserialize(canonical).map_err(|e| {
            Error::invalid_config(format!(
                "failed to load netconf: field {:?}: {}",
                e.path().to_string(),
                e.inner()
            ))
        })?;
        if !(conf.deadline_seconds > 0.0 && conf.deadline_seconds <= MAX_DEADLINE_SECONDS) {
            return Err(Error::invalid_config(format!(
                "failed to load netconf: deadline_seconds must be more than 0 and at most {MAX_DEADLINE_SECONDS}, not {}",
                conf.deadline_seconds
            )));
        }
        Ok(conf)
    }

    /// The config's version; absent means 0.1.0, unsupported is code 1.
    pub fn version(&self) -> Result<Version> {
        Ok(Version::from_config(Some(&self.cni_version))?)
    }

    pub fn deadline(&self) -> Duration {
        Duration::from_secs_f64(self.deadline_seconds)
    }

    pub fn nodename_file(&self) -> &Path {
        Path::new(if self.nodename_file.is_empty() {
            DEFAULT_NODENAME_FILE
        } else {
            &self.nodename_file
        })
    }

    pub fn mtu_file(&self) -> &Path {
        Path::new(if self.mtu_file.is_empty() {
            DEFAULT_MTU_FILE
        } else {
            &self.mtu_file
        })
    }

    pub fn local_datastore_path(&self) -> PathBuf {
        PathBuf::from(if self.local_datastore_path.is_empty() {
            DEFAULT_LOCAL_DATASTORE
        } else {
            &self.local_datastore_path
        })
    }

    /// [`NetConf::token_expiry_margin_seconds`], its default applied.
    pub fn token_expiry_margin(&self) -> std::time::Duration {
        std::time::Duration::from_secs(match self.token_expiry_margin_seconds {
            0 => DEFAULT_TOKEN_EXPIRY_MARGIN_SECONDS,
            n => n,
        })
    }

    /// `release_queue_dir`; else `cni-release-queue` beside the embedded
    /// datastore when its path is configured; else the default.
    pub fn release_queue_dir(&self) -> PathBuf {
        if !self.release_queue_dir.is_empty() {
            return PathBuf::from(&self.release_queue_dir);
        }
        self.beside_local_datastore("cni-release-queue", DEFAULT_RELEASE_QUEUE_DIR)
    }

    /// [`NetConf::status_cache_seconds`], its default applied (zero: the
    /// cache is off).
    pub fn status_cache_window(&self) -> Duration {
        Duration::from_secs(
            self.status_cache_seconds
                .unwrap_or(DEFAULT_STATUS_CACHE_SECONDS),
        )
    }

    /// [`NetConf::status_probe_seconds`], its default applied (zero: no
    /// probe between full checks).
    pub fn status_probe_interval(&self) -> Duration {
        Duration::from_secs(
            self.status_probe_seconds
                .unwrap_or(DEFAULT_STATUS_PROBE_SECONDS),
        )
    }

    /// Where STATUS keeps its answers: `cni-status` beside the embedded
    /// datastore when its path is configured (as the release queue); else
    /// the default.
    pub fn status_cache_dir(&self) -> PathBuf {
        self.beside_local_datastore("cni-status", DEFAULT_STATUS_CACHE_DIR)
    }

    /// `name` beside `local_datastore_path` when it is configured, else
    /// `default`: the node's state the plugin keeps under /var/lib/calico.
    fn beside_local_datastore(&self, name: &str, default: &str) -> PathBuf {
        match Path::new(&self.local_datastore_path).parent() {
            Some(dir) if !self.local_datastore_path.is_empty() => dir.join(name),
            _ => PathBuf::from(default),
        }
    }

    /// Number of veth tx/rx queues (≤ 0 means 1).
    pub fn num_queues(&self) -> u32 {
        u32::try_from(self.num_queues)
            .ok()
            .filter(|n| *n > 0)
            .unwrap_or(1)
    }

    /// Calico's node-name precedence (calico-behaviour.md §3.1): `nodename`, then the whole
    /// nodename file (not trimmed), then `hostname`, then the OS hostname
    /// trimmed and lower-cased.
    pub fn determine_nodename(&self, os_hostname: impl FnOnce() -> String) -> String {
        if !self.nodename.is_empty() {
            return self.nodename.clone();
        }
        if let Ok(name) = std::fs::read_to_string(self.nodename_file())
            && !name.is_empty()
        {
            return name;
        }
        if !self.hostname.is_empty() {
            tracing::warn!("the hostname key is deprecated; use nodename");
            return self.hostname.clone();
        }
        os_hostname().trim().to_lowercase()
    }

    /// The nodename-file gate of ADD and DEL: unless the file is optional (or
    /// `nodename` is configured, which is all the file would tell us), it
    /// must exist.
    pub fn check_nodename_file(&self) -> Result<()> {
        if self.nodename_file_optional || !self.nodename.is_empty() {
            return Ok(());
        }
        let path = self.nodename_file();
        std::fs::metadata(path).map(|_| ()).map_err(|e| {
            Error::invalid_config(format!(
                "stat {}: {}: {NODENAME_FILE_HINT}",
                path.display(),
                e
            ))
        })
    }

    /// The MTU for the pod's interfaces (calico-behaviour.md §3.2): the config's `mtu`, else the
    /// MTU file's value, else 0 (kernel default). A malformed file is an
    /// error even when `mtu` is set; a missing one only with `require_mtu_file`.
    pub fn resolve_mtu(&self) -> Result<u32> {
        let path = self.mtu_file();
        let from_file = match std::fs::read_to_string(path) {
            Ok(text) => text.trim().parse::<u32>().map_err(|e| {
                Error::invalid_config_caused(
                    format!("failed to read MTU file {}", path.display()),
                    e,
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !self.require_mtu_file => 0,
            Err(e) => {
                return Err(Error::invalid_config_caused(
                    format!("failed to read MTU file: open {}", path.display()),
                    e,
                ));
            }
        };
        if self.mtu < 0 || self.mtu > i64::from(u16::MAX) {
            return Err(Error::invalid_config(format!("invalid mtu {}", self.mtu)));
        }
        Ok(if self.mtu == 0 {
            from_file
        } else {
            self.mtu as u32
        })
    }

    /// `policy.type` is `k8s`.
    pub fn k8s_policy(&self) -> bool {
        self.policy.kind == "k8s"
    }

    /// The Kubernetes API client's config: `kubernetes.kubeconfig`, the
    /// `kubernetes.k8s_api_root` / `policy.k8s_api_root` overrides,
    /// `policy.k8s_auth_token` and the certificate files.
    pub fn k8s_config(&self) -> K8sConfig {
        let set = |s: &String| (!s.is_empty()).then(|| s.clone());
        K8sConfig {
            kubeconfig: set(&self.kubernetes.kubeconfig).map(PathBuf::from),
            api_root: set(&self.kubernetes.k8s_api_root).or_else(|| set(&self.policy.k8s_api_root)),
            token: set(&self.policy.k8s_auth_token),
            certificate_authority: set(&self.policy.k8s_certificate_authority),
            client_certificate: set(&self.policy.k8s_client_certificate),
            client_key: set(&self.policy.k8s_client_key),
        }
    }
}

/// Whether a config key holds a secret (its value is never logged).
fn is_secret_key(key: &str) -> bool {
    let lk = key.to_ascii_lowercase();
    lk.contains("token")
        || lk.contains("password")
        || lk.ends_with("key")
        || lk.ends_with("-data")
        || lk == "kubeconfig_inline"
}

/// A copy of the raw config with secrets masked, for debug logging.
pub fn redacted(raw: &Value) -> Value {
    match raw {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let v = if is_secret_key(k) && !v.is_null() {
                        Value::String("<redacted>".into())
                    } else {
                        redacted(v)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(redacted).collect()),
        other => other.clone(),
    }
}

/// The strings `redacted` masks in `raw`, as they are and JSON-escaped.
fn secret_strings(raw: &Value, under_secret: bool, out: &mut Vec<String>) {
    match raw {
        Value::Object(m) => {
            for (k, v) in m {
                secret_strings(v, under_secret || is_secret_key(k), out);
            }
        }
        Value::Array(a) => a.iter().for_each(|v| secret_strings(v, under_secret, out)),
        Value::String(s) if under_secret && !s.is_empty() => {
            let escaped = Value::String(s.clone()).to_string();
            let escaped = &escaped[1..escaped.len() - 1];
            if escaped != s {
                out.push(escaped.to_string());
            }
            out.push(s.clone());
        }
        _ => {}
    }
}

/// `text` with every secret of the config `raw` masked: for what a
/// delegated plugin, which is given the whole config, prints.
pub fn redact_text(text: &str, raw: &Value) -> String {
    let mut secrets = Vec::new();
    secret_strings(raw, false, &mut secrets);
    // Longest first: a secret that contains another is masked whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets
        .iter()
        .fold(text.to_string(), |t, s| t.replace(s.as_str(), "<redacted>"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conf(v: Value) -> Result<NetConf> {
        NetConf::from_value(&v)
    }

    #[test]
    fn stock_calico_conf() {
        let c = conf(json!({
            "name": "k8s-pod-network", "cniVersion": "0.3.1", "type": "calico",
            "log_level": "info", "log_file_path": "/var/log/calico/cni/cni.log",
            "datastore_type": "kubernetes", "nodename": "node1", "mtu": 1440,
            "ipam": {"type": "calico-ipam", "assign_ipv6": "true"},
            "policy": {"type": "k8s"},
            "kubernetes": {"kubeconfig": "/etc/cni/net.d/calico-kubeconfig"}
        }))
        .unwrap();
        assert_eq!(c.ipam.kind, "calico-ipam");
        assert_eq!(c.ipam.assign_ipv6.as_deref(), Some("true"));
        assert_eq!(c.mtu, 1440);
        assert!(c.k8s_policy());
        assert_eq!(c.log_file_max_size, 100);
        assert_eq!(c.deadline(), Duration::from_secs(30));
    }

    #[test]
    fn keys_match_case_insensitively_exact_wins() {
        let c = conf(
            json!({"NAME": "n", "MTU": 1400, "Ipam": {"TYPE": "host-local"},
            "nodename": "exact", "NodeName": "other"}),
        )
        .unwrap();
        assert_eq!(
            (c.name.as_str(), c.mtu, c.ipam.kind.as_str()),
            ("n", 1400, "host-local")
        );
        assert_eq!(c.nodename, "exact");
        let c = conf(json!({"runtimeConfig": {"dns": {"servers": ["1.1.1.1"]}}})).unwrap();
        assert_eq!(c.runtime_config.dns.servers, vec!["1.1.1.1"]);
    }

    #[test]
    fn type_mismatch_names_field_path() {
        let e = conf(json!({"name": "n", "ipam": {"assign_ipv4": true}})).unwrap_err();
        assert_eq!(e.code(), 7);
        let msg = e.to_string();
        assert!(msg.starts_with("failed to load netconf"), "{msg}");
        assert!(msg.contains("ipam.assign_ipv4"), "{msg}");
        let e = conf(json!({"readiness_gates": "http://x"})).unwrap_err();
        assert!(e.to_string().contains("readiness_gates"));
    }

    #[test]
    fn null_keeps_default() {
        let c = conf(json!({"log_file_max_size": null, "ipam": null})).unwrap();
        assert_eq!(c.log_file_max_size, 100);
    }

    #[test]
    fn bad_deadline() {
        assert!(conf(json!({"deadline_seconds": 0})).is_err());
        let huge = conf(json!({"deadline_seconds": 1e12})).unwrap_err();
        assert_eq!(huge.code(), 7, "{huge}");
        assert!(conf(json!({"deadline_seconds": -1})).is_err());
        assert!(conf(json!({"deadline_seconds": 3600})).is_ok());
        assert_eq!(
            conf(json!({"deadline_seconds": 2.5}))
                .unwrap()
                .deadline()
                .as_millis(),
            2500
        );
    }

    #[test]
    fn nodename_precedence() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("nodename");
        let mut c = conf(json!({"nodename_file": file.to_str().unwrap()})).unwrap();
        assert_eq!(
            c.determine_nodename(|| " Host.Example \n".into()),
            "host.example"
        );
        assert!(
            c.check_nodename_file()
                .unwrap_err()
                .to_string()
                .contains(NODENAME_FILE_HINT)
        );
        c.hostname = "named-hostname.somewhere".into();
        assert_eq!(
            c.determine_nodename(String::new),
            "named-hostname.somewhere"
        );
        std::fs::write(&file, "from-file\n").unwrap();
        assert_eq!(
            c.determine_nodename(String::new),
            "from-file\n",
            "not trimmed"
        );
        c.check_nodename_file().unwrap();
        c.nodename = "named-nodename".into();
        assert_eq!(c.determine_nodename(String::new), "named-nodename");
    }

    #[test]
    fn mtu_resolution() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mtu");
        let mut c = conf(json!({"mtu_file": file.to_str().unwrap()})).unwrap();
        assert_eq!(c.resolve_mtu().unwrap(), 0);
        c.require_mtu_file = true;
        assert!(c.resolve_mtu().is_err());
        std::fs::write(&file, "3000\n").unwrap();
        assert_eq!(c.resolve_mtu().unwrap(), 3000);
        c.mtu = 4000;
        assert_eq!(c.resolve_mtu().unwrap(), 4000);
        std::fs::write(&file, "x").unwrap();
        assert!(
            c.resolve_mtu().is_err(),
            "malformed file fails even with mtu set"
        );
    }

    #[test]
    fn redaction() {
        let v = redacted(
            &json!({"policy": {"k8s_auth_token": "s3cret", "type": "k8s"},
            "etcd_key_file": "/k", "x": [{"client-key-data": "abc"}]}),
        );
        let s = v.to_string();
        assert!(!s.contains("s3cret") && !s.contains("abc"), "{s}");
        assert!(s.contains("/k"), "file paths are not secrets: {s}");
    }

    #[test]
    fn redaction_of_text() {
        let raw = json!({"policy": {"k8s_auth_token": "s3cret\"tok"}, "name": "net1",
            "ipam": {"client-key-data": "abc", "type": "host-local"}});
        let text = format!("got {raw} and s3cret\"tok, abc");
        let masked = redact_text(&text, &raw);
        assert!(
            !masked.contains("s3cret") && !masked.contains("abc"),
            "{masked}"
        );
        assert!(
            masked.contains("net1") && masked.contains("host-local"),
            "{masked}"
        );
    }
}

#[cfg(test)]
mod conf_examples {
    use super::*;

    /// Every shipped example config decodes, plugin by plugin.
    #[test]
    fn shipped_examples_decode() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/conf");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("conflist") {
                continue;
            }
            let list: Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            for plugin in list["plugins"].as_array().unwrap() {
                if plugin["type"] == "calico" {
                    let c = NetConf::from_value(plugin).unwrap_or_else(|e| panic!("{path:?}: {e}"));
                    assert!(!c.ipam.kind.is_empty(), "{path:?}");
                    seen += 1;
                }
            }
        }
        assert!(seen >= 3, "found {seen} calico plugin configs");
    }
}
