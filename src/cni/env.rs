//! The CNI environment contract: `CNI_*` variables parsed from an injected
//! map (never read from the process environment here), validated per verb.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;

use crate::cni::error::{Error, Result};

/// The CNI verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Status,
    Gc,
    Version,
}

impl Command {
    pub fn parse(text: &str) -> Option<Command> {
        Some(match text {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            "VERSION" => Command::Version,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Status => "STATUS",
            Command::Gc => "GC",
            Command::Version => "VERSION",
        }
    }
}

/// The keys of `CNI_ARGS` this plugin reads. Unknown keys are ignored
/// (Calico always runs with `IgnoreUnknown=1`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    pub k8s_pod_name: Option<String>,
    pub k8s_pod_namespace: Option<String>,
    pub k8s_pod_infra_container_id: Option<String>,
    pub k8s_pod_uid: Option<String>,
    /// An explicitly requested address (`IP=`).
    pub ip: Option<IpAddr>,
    /// Calico's test hook for the WEP namespace in plain-CNI mode.
    pub test_namespace: Option<String>,
}

impl CniArgs {
    /// Parses `K1=V1;K2=V2` the way libcni's `LoadArgs` does (each pair has
    /// exactly one `=`), tolerating unknown keys.
    pub fn parse(text: &str) -> Result<CniArgs> {
        let mut args = CniArgs::default();
        if text.is_empty() {
            return Ok(args);
        }
        for pair in text.split(';') {
            let mut kv = pair.split('=');
            let (Some(key), Some(value), None) = (kv.next(), kv.next(), kv.next()) else {
                return Err(invalid("CNI_ARGS", format!("invalid pair {pair:?}"), text));
            };
            let value = value.to_string();
            match key {
                "K8S_POD_NAME" => args.k8s_pod_name = Some(value),
                "K8S_POD_NAMESPACE" => args.k8s_pod_namespace = Some(value),
                "K8S_POD_INFRA_CONTAINER_ID" => args.k8s_pod_infra_container_id = Some(value),
                "K8S_POD_UID" => args.k8s_pod_uid = Some(value),
                "CNI_TEST_NAMESPACE" => args.test_namespace = Some(value),
                "IP" => {
                    let ip = value.parse::<IpAddr>().map_err(|_| {
                        invalid(
                            "CNI_ARGS",
                            format!("IP={value} is not a valid IP address"),
                            text,
                        )
                    })?;
                    args.ip = Some(ip);
                }
                _ => {}
            }
        }
        Ok(args)
    }

    /// Kubernetes pod name and namespace, when both are present and non-empty.
    pub fn k8s_pod(&self) -> Option<(&str, &str)> {
        match (
            self.k8s_pod_namespace.as_deref(),
            self.k8s_pod_name.as_deref(),
        ) {
            (Some(ns), Some(name)) if !ns.is_empty() && !name.is_empty() => Some((ns, name)),
            _ => None,
        }
    }
}

/// Everything the runtime told this invocation through the environment.
#[derive(Debug, Clone)]
pub struct CniEnv {
    pub command: Command,
    pub container_id: String,
    /// Empty when not given (allowed for DEL).
    pub netns: String,
    pub ifname: String,
    /// The raw `CNI_ARGS` text, as given.
    pub args_raw: String,
    pub args: CniArgs,
    pub path: Vec<PathBuf>,
    /// The complete environment this plugin was started with; delegated
    /// plugins inherit it.
    pub vars: HashMap<String, String>,
}

/// Outcome of reading the environment before any verb runs.
#[derive(Debug)]
pub enum Invocation {
    /// `CNI_COMMAND` is absent: print the about text.
    About,
    Command(Box<CniEnv>),
}

fn invalid(var: &'static str, reason: String, value: &str) -> Error {
    Error::InvalidEnv {
        var,
        reason,
        value: value.to_string(),
    }
}

/// `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`, the spec's container ID (and network name) rule.
pub fn valid_identifier(id: &str) -> bool {
    let mut chars = id.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// libcni's interface name rules.
pub fn validate_ifname(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() {
        return Err("interface name is empty".into());
    }
    if name.len() > 15 {
        return Err(format!(
            "interface name is too long ({} bytes, at most 15)",
            name.len()
        ));
    }
    if name == "." || name == ".." {
        return Err("interface name is . or ..".into());
    }
    if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return Err("interface name contains / or : or whitespace characters".into());
    }
    Ok(())
}

/// The contract's variables: one of them that is not UTF-8 is an error.
const CONTRACT_VARS: [&str; 6] = [
    "CNI_COMMAND",
    "CNI_CONTAINERID",
    "CNI_NETNS",
    "CNI_IFNAME",
    "CNI_ARGS",
    "CNI_PATH",
];

/// The process environment as text: a contract variable whose value is not
/// UTF-8 is an invalid-environment error (code 4); any other variable that
/// is not UTF-8 (name or value) is none of ours and is left out.
pub fn vars_from_os(
    vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Result<HashMap<String, String>> {
    let mut out = HashMap::new();
    for (name, value) in vars {
        let Ok(name) = name.into_string() else {
            continue;
        };
        match value.into_string() {
            Ok(value) => {
                out.insert(name, value);
            }
            Err(value) => {
                if let Some(var) = CONTRACT_VARS.iter().find(|v| **v == name) {
                    return Err(invalid(
                        var,
                        "the value is not valid UTF-8".to_string(),
                        &value.to_string_lossy(),
                    ));
                }
            }
        }
    }
    Ok(out)
}

impl CniEnv {
    /// Reads and validates the contract from `vars` (the process environment,
    /// injected so that tests can drive it).
    pub fn from_vars(vars: HashMap<String, String>) -> Result<Invocation> {
        let get = |k: &str| vars.get(k).cloned().unwrap_or_default();
        let command_text = match vars.get("CNI_COMMAND") {
            None => return Ok(Invocation::About),
            Some(c) => c.clone(),
        };
        let command = Command::parse(&command_text).ok_or_else(|| {
            invalid(
                "CNI_COMMAND",
                format!("unknown CNI_COMMAND: {command_text}"),
                &command_text,
            )
        })?;

        let (container_id, netns, ifname, path) = (
            get("CNI_CONTAINERID"),
            get("CNI_NETNS"),
            get("CNI_IFNAME"),
            get("CNI_PATH"),
        );
        // Which variables each verb needs (libcni skel's table).
        let needs: &[(&'static str, &str)] = match command {
            Command::Add | Command::Check => &[
                ("CNI_CONTAINERID", &container_id),
                ("CNI_NETNS", &netns),
                ("CNI_IFNAME", &ifname),
                ("CNI_PATH", &path),
            ],
            Command::Del => &[
                ("CNI_CONTAINERID", &container_id),
                ("CNI_IFNAME", &ifname),
                ("CNI_PATH", &path),
            ],
            Command::Status | Command::Gc => &[("CNI_PATH", &path)],
            Command::Version => &[],
        };
        let missing: Vec<&'static str> = needs
            .iter()
            .filter(|(_, v)| v.is_empty())
            .map(|(k, _)| *k)
            .collect();
        if !missing.is_empty() {
            return Err(Error::MissingEnv(missing));
        }
        if !container_id.is_empty() && !valid_identifier(&container_id) {
            return Err(invalid(
                "CNI_CONTAINERID",
                "invalid characters in containerID".into(),
                &container_id,
            ));
        }
        if matches!(command, Command::Add | Command::Check | Command::Del) {
            validate_ifname(&ifname).map_err(|r| invalid("CNI_IFNAME", r, &ifname))?;
        }
        let args_raw = get("CNI_ARGS");
        let args = if command == Command::Version {
            CniArgs::default()
        } else {
            CniArgs::parse(&args_raw)?
        };
        let path = std::env::split_paths(&path)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
        Ok(Invocation::Command(Box::new(CniEnv {
            command,
            container_id,
            netns,
            ifname,
            args_raw,
            args,
            path,
            vars,
        })))
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn non_utf8_contract_vars_are_rejected_and_others_left_out() {
        use std::ffi::OsString;
        use std::os::unix::ffi::OsStringExt;
        let latin1 = || OsString::from_vec(b"K8S_POD_NAME=caf\xe9".to_vec());
        let e = vars_from_os([
            (OsString::from("CNI_COMMAND"), OsString::from("ADD")),
            (OsString::from("CNI_ARGS"), latin1()),
        ])
        .unwrap_err();
        assert_eq!(e.code(), 4, "{e}");
        assert!(
            e.to_string()
                .contains("CNI_ARGS: the value is not valid UTF-8"),
            "{e}"
        );
        let vars = vars_from_os([
            (OsString::from("CNI_COMMAND"), OsString::from("VERSION")),
            (OsString::from("LANG_SOMETHING"), latin1()),
            (OsString::from_vec(b"X\xff".to_vec()), OsString::from("1")),
        ])
        .unwrap();
        assert_eq!(vars.len(), 1);
        assert_eq!(vars["CNI_COMMAND"], "VERSION");
    }
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn parse(pairs: &[(&str, &str)]) -> Result<CniEnv> {
        match CniEnv::from_vars(vars(pairs))? {
            Invocation::Command(e) => Ok(*e),
            Invocation::About => panic!("about"),
        }
    }

    const ADD: &[(&str, &str)] = &[
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "abc123"),
        ("CNI_NETNS", "/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
    ];

    #[test]
    fn full_add_env() {
        let e = parse(ADD).unwrap();
        assert_eq!(e.command, Command::Add);
        assert_eq!(e.path.len(), 2);
    }

    #[test]
    fn no_command_is_about() {
        assert!(matches!(
            CniEnv::from_vars(vars(&[])).unwrap(),
            Invocation::About
        ));
    }

    #[test]
    fn missing_vars_are_named() {
        let e = parse(&[("CNI_COMMAND", "ADD"), ("CNI_CONTAINERID", "x")]).unwrap_err();
        assert_eq!(e.code(), 4);
        assert_eq!(
            e.to_string(),
            "required env variables [CNI_NETNS,CNI_IFNAME,CNI_PATH] missing"
        );
    }

    #[test]
    fn del_netns_optional() {
        let mut v: Vec<_> = ADD
            .iter()
            .filter(|(k, _)| *k != "CNI_NETNS")
            .cloned()
            .collect();
        v[0] = ("CNI_COMMAND", "DEL");
        assert!(parse(&v).unwrap().netns.is_empty());
    }

    #[test]
    fn bad_values() {
        let with = |k: &'static str, val: &'static str| {
            let mut v: Vec<_> = ADD.iter().filter(|(kk, _)| *kk != k).cloned().collect();
            v.push((k, val));
            parse(&v).unwrap_err()
        };
        let e = with("CNI_CONTAINERID", "a/b");
        assert_eq!((e.code(), e.details().unwrap()), (4, "a/b".to_string()));
        assert!(e.to_string().starts_with("CNI_CONTAINERID"));
        for bad in ["waytoolonginterfacename", "a:b", "a b", "..", "a/b"] {
            let e = with("CNI_IFNAME", bad);
            assert!(e.to_string().starts_with("CNI_IFNAME"), "{bad}: {e}");
        }
        assert!(
            with("CNI_COMMAND", "FROB")
                .to_string()
                .contains("unknown CNI_COMMAND")
        );
        assert!(
            with("CNI_ARGS", "a=b;c")
                .to_string()
                .starts_with("CNI_ARGS")
        );
    }

    #[test]
    fn cni_args() {
        let a = CniArgs::parse(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_UID=u;IP=10.0.0.1;Other=x",
        )
        .unwrap();
        assert_eq!(a.k8s_pod(), Some(("ns", "p")));
        assert_eq!(a.ip, Some("10.0.0.1".parse().unwrap()));
        assert!(CniArgs::parse("IP=nope").is_err());
        assert!(CniArgs::parse("a=b;").is_err(), "empty pair is invalid");
        assert!(CniArgs::parse("a=b=c").is_err());
        assert_eq!(CniArgs::parse("K8S_POD_NAME=p").unwrap().k8s_pod(), None);
    }
}
