//! What every fuzz target runs: arbitrary bytes fed to the plugin's own
//! parsing entry points, exactly as the plugin calls them. Each function
//! answers with the outcome of its main entry point (`Err` with the
//! message of a rejected input) and must never panic, hang or abort,
//! whatever the bytes.
//!
//! The same file is compiled into tests/fuzz_regressions.rs (`#[path]`),
//! which replays the seed corpus (fuzz/corpus/) and every crash the fuzzer
//! found through these functions, without the fuzzer.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use calico_cni::app::Exit;
use calico_cni::cli::netconf::calico_plugin;
use calico_cni::cni::config::{redact_text, redacted};
use calico_cni::cni::env::{CniArgs, CniEnv, Command, Invocation};
use calico_cni::cni::request::{check_version, decode_config};
use calico_cni::cni::result::to_pretty_json;
use calico_cni::cni::rule_error::RuleError;
use calico_cni::cni::version::{SUPPORTED, Version};
use calico_cni::cni::{CniResult, Error, NetConf, Request};
use calico_cni::ipam::calico::selector::Selector;
use calico_cni::k8s::client::jwt_expiry;
use calico_cni::k8s::{K8sClient, K8sConfig};
use calico_cni::plugin::workload::annotations::{
    self as rules, ANNOTATION_ALLOWED_SOURCE_PREFIXES, ANNOTATION_FLOATING_IPS, ANNOTATION_HW_ADDR,
    ANNOTATION_IP_ADDRS, ANNOTATION_IP_ADDRS_NO_IPAM, ANNOTATION_IP_FAMILIES,
    ANNOTATION_IPV4_POOLS, ANNOTATION_IPV6_POOLS, AddressSource, CALICO_IPAM,
};
use ipnet::IpNet;
use serde_json::{Value, json};

/// Every verb, in the order the targets try them.
pub const COMMANDS: [Command; 6] = [
    Command::Add,
    Command::Del,
    Command::Check,
    Command::Status,
    Command::Gc,
    Command::Version,
];

/// What a target answers: `Err` with the message of a rejected input.
pub type Target = fn(&[u8]) -> Result<(), String>;

/// The fuzz targets, by name (the directories of fuzz/corpus/).
pub const TARGETS: [(&str, Target); 7] = [
    ("netconf", netconf),
    ("cni_env", cni_env),
    ("cni_args", cni_args),
    ("prev_result", prev_result),
    ("annotations", annotations),
    ("selector", selector),
    ("kubeconfig", kubeconfig),
];

/// The error as the plugin answers it (code, message, JSON reply): the
/// rendering must not panic either.
fn render(e: &Error, version: &str) -> String {
    let _ = (e.code(), e.details());
    let _ = Exit::error(e, version);
    e.to_string()
}

/// A valid environment for `command`, as kubelet gives it.
fn env(command: Command) -> CniEnv {
    let vars: HashMap<String, String> = [
        ("CNI_COMMAND", command.as_str()),
        ("CNI_CONTAINERID", "0123456789abcdef"),
        ("CNI_NETNS", "/var/run/netns/cni-fuzz"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    match CniEnv::from_vars(vars) {
        Ok(Invocation::Command(env)) => *env,
        other => unreachable!("the fixed environment is valid: {other:?}"),
    }
}

/// The pure accessors the verbs call on a decoded config (none that reads
/// a file the config names).
fn use_conf(conf: &NetConf) {
    let _ = conf.version();
    let _ = conf.deadline();
    let _ = (conf.nodename_file(), conf.mtu_file());
    let _ = (conf.local_datastore_path(), conf.release_queue_dir());
    let _ = (conf.num_queues(), conf.k8s_policy(), conf.k8s_config());
    if let Some(prev) = &conf.prev_result
        && let Ok(version) = conf.version()
        && let Ok((result, _)) = CniResult::parse(prev, version)
    {
        let _ = result.to_version(version);
    }
}

/// Target `netconf`: the network config on stdin (`Request::new` for every
/// verb: JSON, name, version gates, `NetConf`) and, as `calico -t` and the
/// `ipam` subcommands read it, a config file that may be a conflist.
pub fn netconf(data: &[u8]) -> Result<(), String> {
    let label = "1.1.0";
    for command in COMMANDS {
        match Request::new(env(command), data) {
            Ok(req) => {
                use_conf(&req.conf);
                let _ = req.remaining();
                let _ = req.valid_attachments().map_err(|e| render(&e, label));
                let shown = redacted(&req.raw);
                let _ = redact_text(&shown.to_string(), &req.raw);
                let _ = redact_text(&String::from_utf8_lossy(data), &req.raw);
            }
            Err(e) => {
                render(&e, label);
            }
        }
    }
    if let Ok(document) = serde_json::from_slice::<Value>(data)
        && let Ok(plugin) = calico_plugin(&document, Path::new("/etc/cni/net.d/10-fuzz.conflist"))
        && let Ok(conf) = NetConf::from_value(&plugin)
    {
        use_conf(&conf);
    }
    let raw = decode_config(data).map_err(|e| render(&e, label))?;
    for command in COMMANDS {
        let _ = check_version(command, &raw).map_err(|e| render(&e, label));
    }
    NetConf::from_value(&raw)
        .map(|conf| use_conf(&conf))
        .map_err(|e| render(&e, label))
}

/// `K=V` entries of `data`, one per line or NUL-terminated (as in
/// /proc/<pid>/environ); an entry without `=` is a variable set to "".
fn vars_of(data: &[u8]) -> HashMap<String, String> {
    let text = String::from_utf8_lossy(data);
    text.split(['\n', '\0'])
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            let (k, v) = entry.split_once('=').unwrap_or((entry, ""));
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// Target `cni_env`: the `CNI_*` environment (`CniEnv::from_vars`, with
/// its CNI_ARGS), then a request on a minimal config, as `app::run` does.
pub fn cni_env(data: &[u8]) -> Result<(), String> {
    let label = "1.1.0";
    let env = match CniEnv::from_vars(vars_of(data)).map_err(|e| render(&e, label))? {
        Invocation::About => return Ok(()),
        Invocation::Command(env) => *env,
    };
    let _ = env.args.k8s_pod();
    let stdin = br#"{"cniVersion":"1.1.0","name":"k8s-pod-network","type":"calico"}"#;
    Request::new(env, stdin)
        .map(|_| ())
        .map_err(|e| render(&e, label))
}

/// Target `cni_args`: the `CNI_ARGS` text alone (`CniArgs::parse`), and as
/// the `CNI_ARGS` of a valid ADD environment.
pub fn cni_args(data: &[u8]) -> Result<(), String> {
    let text = String::from_utf8_lossy(data);
    let parsed = CniArgs::parse(&text);
    if let Ok(args) = &parsed {
        let _ = args.k8s_pod();
    }
    let mut vars: HashMap<String, String> = env(Command::Add).vars;
    vars.insert("CNI_ARGS".into(), text.to_string());
    let via_env = CniEnv::from_vars(vars);
    // The same text must get the same answer both ways.
    assert_eq!(
        parsed.is_ok(),
        via_env.is_ok(),
        "CNI_ARGS {text:?}: CniArgs::parse and CniEnv::from_vars disagree"
    );
    parsed.map(|_| ()).map_err(|e| render(&e, "1.1.0"))
}

/// Every supported version.
fn versions() -> impl Iterator<Item = Version> {
    SUPPORTED
        .iter()
        .map(|v| Version::parse(v).expect("supported versions parse"))
}

/// Target `prev_result`: a result (a `prevResult`, or what a delegated IPAM
/// plugin printed) read as every version it may be labelled with
/// (`CniResult::parse`), then printed in every version (`to_version`, the
/// plugin's output and the conversion for a fallback plugin); what is
/// printed must read back.
pub fn prev_result(data: &[u8]) -> Result<(), String> {
    let text = String::from_utf8_lossy(data);
    // As delegate.rs reads a plugin's stdout: blank is no result.
    let value: Value = if text.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).map_err(|e| e.to_string())?
    };
    let mut first = None;
    for default_version in versions() {
        let (result, _) = match CniResult::parse(&value, default_version) {
            Ok(parsed) => parsed,
            Err(e) => {
                first.get_or_insert_with(|| render(&e, "1.1.0"));
                continue;
            }
        };
        for version in versions() {
            let Ok(printed) = result.to_version(version) else {
                continue;
            };
            let _ = to_pretty_json(&printed);
            if let Err(e) = CniResult::parse(&printed, version) {
                panic!(
                    "the {version} result the plugin printed does not read back: {e}: {printed}"
                );
            }
        }
    }
    first.map_or(Ok(()), Err)
}

/// The annotation keys, by their short names (the part after
/// `cni.projectcalico.org/`).
const ANNOTATIONS: [&str; 8] = [
    ANNOTATION_IPV4_POOLS,
    ANNOTATION_IPV6_POOLS,
    ANNOTATION_IP_FAMILIES,
    ANNOTATION_IP_ADDRS,
    ANNOTATION_IP_ADDRS_NO_IPAM,
    ANNOTATION_HW_ADDR,
    ANNOTATION_ALLOWED_SOURCE_PREFIXES,
    ANNOTATION_FLOATING_IPS,
];

/// Every annotation rule of a Kubernetes ADD on one pod's and namespace's
/// annotations, in the plugin's order; the first error.
fn annotation_rules(
    namespace: &BTreeMap<String, String>,
    pod: &BTreeMap<String, String>,
    calico_ipam: bool,
    features: bool,
) -> Result<(), String> {
    let ipam_type = if calico_ipam {
        CALICO_IPAM
    } else {
        "host-local"
    };
    let mut conf = json!({"cniVersion": "1.1.0", "name": "k8s-pod-network", "type": "calico",
        "ipam": {"type": ipam_type}});
    let mut first: Option<String> = None;
    let mut note = |r: Result<(), String>| {
        if let Err(e) = r {
            first.get_or_insert(e);
        }
    };
    let rule = |e: RuleError| render(&e.into(), "1.1.0");
    let original = conf.clone();
    note(rules::apply_pool_annotations(&mut conf, namespace, pod).map_err(rule));
    // The rewritten config must still decode.
    if conf != original {
        note(
            NetConf::from_value(&conf)
                .map(|_| ())
                .map_err(|e| render(&e, "1.1.0")),
        );
    }
    let mut pod_ips: Vec<IpNet> = vec![
        "10.0.0.5/32".parse().expect("a CIDR"),
        "fd00::5/128".parse().expect("a CIDR"),
    ];
    match rules::address_source(pod, ipam_type, features) {
        Ok(AddressSource::IpAddrs(ips) | AddressSource::IpAddrsNoIpam(ips)) => {
            pod_ips = ips.into_iter().map(host_net).collect();
        }
        Ok(AddressSource::Ipam) => {}
        Err(e) => note(Err(rule(e))),
    }
    note(rules::requested_mac(pod).map(|_| ()).map_err(rule));
    note(
        rules::allowed_source_prefixes(pod)
            .map(|_| ())
            .map_err(rule),
    );
    note(
        rules::floating_ips(pod, features, &pod_ips)
            .map(|_| ())
            .map_err(rule),
    );
    first.map_or(Ok(()), Err)
}

/// An address as the single-address network Calico assigns it.
fn host_net(ip: IpAddr) -> IpNet {
    IpNet::from(ip)
}

/// Target `annotations`: lines `key=value` (`ns:key=value` for the
/// namespace's; a key without `/` is under `cni.projectcalico.org/`) run
/// through every annotation rule with calico-ipam and without, features on
/// and off (the answer is calico-ipam's, features on); then the whole input
/// as the value of each annotation alone.
pub fn annotations(data: &[u8]) -> Result<(), String> {
    let text = String::from_utf8_lossy(data);
    let (mut namespace, mut pod) = (BTreeMap::new(), BTreeMap::new());
    for line in text.lines() {
        let (map, line) = match line.strip_prefix("ns:") {
            Some(rest) => (&mut namespace, rest),
            None => (&mut pod, line),
        };
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = if key.contains('/') {
            key.to_string()
        } else {
            format!("cni.projectcalico.org/{key}")
        };
        map.insert(key, value.to_string());
    }
    // The answer: calico-ipam with both features on; the other set-ups run
    // for their own checks.
    let answer = annotation_rules(&namespace, &pod, true, true);
    let _ = annotation_rules(&namespace, &pod, true, false);
    let _ = annotation_rules(&namespace, &pod, false, true);
    let none = BTreeMap::new();
    for key in ANNOTATIONS {
        let alone = BTreeMap::from([(key.to_string(), text.to_string())]);
        let _ = annotation_rules(&none, &alone, true, true);
    }
    answer
}

/// Label sets every parsed selector is matched against.
fn label_sets() -> Vec<BTreeMap<String, String>> {
    let set = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>()
    };
    vec![
        set(&[]),
        set(&[("a", ""), ("b", "c"), ("x", "a")]),
        set(&[
            ("kubernetes.io/hostname", "node-1"),
            ("projectcalico.org/name", "default"),
            ("zone", "us-east-1a"),
        ]),
    ]
}

/// Target `selector`: the first line is an IPPool `nodeSelector` /
/// `namespaceSelector` (`Selector::parse`), the other lines `key=value`
/// labels it is evaluated against (with a few fixed label sets); the whole
/// input is parsed as a selector too.
pub fn selector(data: &[u8]) -> Result<(), String> {
    let text = String::from_utf8_lossy(data);
    let (first_line, rest) = text.split_once('\n').unwrap_or((&text, ""));
    let mut labels = label_sets();
    labels.push(
        rest.lines()
            .map(|l| l.split_once('=').unwrap_or((l, "")))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    let _ = Selector::parse(&text);
    let parsed = Selector::parse(first_line).map_err(|e| e.to_string())?;
    for set in &labels {
        let hit = parsed.matches(set);
        if parsed.matches_everything() {
            assert!(hit, "{first_line:?} matches everything but not {set:?}");
        }
    }
    Ok(())
}

thread_local! {
    /// The runtime the plugin's async client constructor runs on, as in
    /// `app::run` (one per thread: tests run in parallel).
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime starts");
}

/// A file of its own for each call (tests run in parallel threads).
fn scratch_path() -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "calico-cni-fuzz-kubeconfig-{}-{}.yaml",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Target `kubeconfig`: the kubeconfig file the network config names,
/// through the plugin's own client constructor (`K8sClient::new`: kube's
/// parser, the context, cluster and user lookup, the token / tokenFile,
/// the TLS set-up), and the JWT expiry read from any token-like word.
pub fn kubeconfig(data: &[u8]) -> Result<(), String> {
    let text = String::from_utf8_lossy(data);
    for word in text.split(|c: char| c.is_whitespace() || c == '"' || c == '\'') {
        let _ = jwt_expiry(word);
    }
    // A kubeconfig's exec credential plugin is a command the client runs:
    // never one the fuzzer made up.
    if text.contains("exec") {
        return Err("exec credential plugins are not run by the fuzzer".into());
    }
    let path = scratch_path();
    std::fs::write(&path, data).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let conf = K8sConfig {
        kubeconfig: Some(path.clone()),
        ..K8sConfig::default()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let built = RUNTIME.with(|runtime| {
        runtime.block_on(async {
            // The overrides of a network config on top of the same file.
            let overridden = K8sConfig {
                api_root: Some("https://127.0.0.1:6443/api/v1".into()),
                token: Some("fuzz-token".into()),
                ..conf.clone()
            };
            let _ = K8sClient::new(&overridden, deadline).await;
            K8sClient::new(&conf, deadline).await.map(|_| ())
        })
    });
    let _ = std::fs::remove_file(&path);
    built.map_err(|e| e.to_string())
}
