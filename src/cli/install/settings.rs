//! What an install is told: the command line (`--host-root`, `--watch`,
//! ...) and Calico's install-cni environment, read as Calico reads it (a
//! default applies only when a variable is unset; booleans as Go parses
//! them).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::InstallError;
use super::kubeconfig::{InCluster, TOKEN_SECONDS, server_url};
use super::template::{DEFAULT_TEMPLATE, Values};

pub const USAGE: &str = "\
Usage:
  calico install [--watch] [--host-root DIR] [--binaries DIR|none]
                 [--serviceaccount-dir DIR] [--mtu-file FILE]

Installs this plugin on the node as Calico's install-cni does, from the same
environment: the binaries into <root>/opt/cni/bin (created when missing) and
<root>/secondary-bin-dir (when writable; calico-ipam a link to calico), the
etcd TLS files of
TLS_ASSETS_DIR into <root>/etc/cni/net.d/calico-tls, the CNI kubeconfig with a
token minted for the CNI's ServiceAccount (when run in a pod), and the network
config (mode 0600, as Calico's) rendered from CNI_NETWORK_CONFIG_FILE,
CNI_NETWORK_CONFIG or the built-in template. Every file is replaced atomically; identical files are
left alone. Run as `install` (Calico's image layout) it stays up unless
SLEEP=false, as Calico's does.

Options:
  --watch                  stay up: renew the token before a quarter of its life
                           is left (CNI_TOKEN_REFRESH_INTERVAL overrides), and
                           re-render when the template, the MTU file or the TLS
                           files change
  --host-root DIR          where the host's directories are mounted (default /host)
  --binaries DIR|none      copy every file of DIR (default: this executable as
                           calico, or all of /opt/cni/bin when it runs from there)
  --serviceaccount-dir DIR the pod's ServiceAccount files (default
                           /var/run/secrets/kubernetes.io/serviceaccount)
  --mtu-file FILE          calico-node's MTU file, the MTU when CNI_MTU is unset
                           (default /var/lib/calico/mtu; else 1500)
  -h, --help               print this help

Environment (Calico's): CNI_NET_DIR, CNI_CONF_NAME, CNI_OLD_CONF_NAME,
CNI_NETWORK_CONFIG, CNI_NETWORK_CONFIG_FILE, SKIP_CNI_BINARIES,
UPDATE_CNI_BINARIES, TLS_ASSETS_DIR, SLEEP, SKIP_TLS_VERIFY, CNI_MTU,
KUBERNETES_NODE_NAME, KUBERNETES_SERVICE_HOST/PORT/PROTOCOL, DATASTORE_TYPE,
LOG_LEVEL, LOG_FILE_PATH, LOG_FILE_MAX_SIZE/AGE/COUNT, ETCD_ENDPOINTS,
ETCD_DISCOVERY_SRV, REQUIRE_MTU_FILE, CALICO_API_GROUP, KUBECONFIG,
CALICO_CNI_SERVICE_ACCOUNT, CNI_TOKEN_REFRESH_INTERVAL.
";

/// Where the binaries come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binaries {
    /// This executable, as `calico` with `calico-ipam` a link to it.
    Executable(PathBuf),
    /// Every file of a directory (Calico's image: `/opt/cni/bin`), links
    /// to siblings kept as links.
    Directory(PathBuf),
    /// None (`--binaries none`).
    Skip,
}

/// Everything one install needs to know.
#[derive(Debug, Clone)]
pub struct Settings {
    pub host_root: PathBuf,
    pub binaries: Binaries,
    pub skip_binaries: Vec<String>,
    pub update_binaries: bool,
    /// `CNI_NET_DIR`: the network config directory as the node sees it.
    pub net_dir: String,
    pub conf_name: String,
    pub old_conf_name: String,
    /// `CNI_NETWORK_CONFIG_FILE`, read afresh for every render.
    pub template_file: Option<PathBuf>,
    /// `CNI_NETWORK_CONFIG`.
    pub template: Option<String>,
    pub tls_assets_dir: PathBuf,
    /// Stay up after the install.
    pub watch: bool,
    /// Set when the installer runs in a pod.
    pub in_cluster: Option<InCluster>,
    /// The pod's own token (`__SERVICEACCOUNT_TOKEN__`), when in a pod.
    pub serviceaccount_dir: PathBuf,
    /// `CNI_TOKEN_REFRESH_INTERVAL`: renew the token this often.
    pub refresh_interval: Option<Duration>,
    /// calico-node's MTU file: `__CNI_MTU__` when `CNI_MTU` is unset, and
    /// a watch re-renders when it changes.
    pub mtu_file: PathBuf,
    vars: HashMap<String, String>,
}

/// Go's `strconv.ParseBool`.
fn go_bool(name: &str, value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        other => Err(format!("{name}={other:?} is not a boolean")),
    }
}

/// A Go duration as Calico's `CNI_TOKEN_REFRESH_INTERVAL` takes it
/// (`90s`, `5m`, `1h30m`, `250ms`).
pub fn go_duration(text: &str) -> Option<Duration> {
    let mut total = 0f64;
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += number * seconds;
        rest = &rest[unit..];
    }
    Some(Duration::from_secs_f64(total))
}

impl Settings {
    /// The command line and the environment; `None` for `--help`.
    /// `as_install`: the executable runs as `install`, where `SLEEP`
    /// defaults to true as in Calico's image.
    pub fn parse(
        args: &[String],
        vars: &HashMap<String, String>,
        as_install: bool,
    ) -> Result<Option<Settings>, String> {
        let mut host_root = PathBuf::from("/host");
        let mut binaries = None;
        let mut sa_dir = PathBuf::from("/var/run/secrets/kubernetes.io/serviceaccount");
        let mut watch = false;
        let mut mtu_file = PathBuf::from("/var/lib/calico/mtu");
        let mut i = 0;
        while i < args.len() {
            let (flag, inline) = match args[i].split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
                _ => (args[i].as_str(), None),
            };
            let mut value = || -> Result<String, String> {
                if let Some(v) = &inline {
                    return Ok(v.clone());
                }
                i += 1;
                args.get(i)
                    .cloned()
                    .ok_or_else(|| format!("{flag} needs a value"))
            };
            match flag {
                "-h" | "--help" => return Ok(None),
                "--watch" => watch = true,
                "--host-root" => host_root = PathBuf::from(value()?),
                "--binaries" => {
                    binaries = Some(match value()?.as_str() {
                        "none" => Binaries::Skip,
                        dir => Binaries::Directory(PathBuf::from(dir)),
                    })
                }
                "--serviceaccount-dir" => sa_dir = PathBuf::from(value()?),
                "--mtu-file" => mtu_file = PathBuf::from(value()?),
                other => return Err(format!("unknown argument {other:?}")),
            }
            i += 1;
        }
        let get = |name: &str, default: &str| -> String {
            vars.get(name)
                .cloned()
                .unwrap_or_else(|| default.to_string())
        };
        let flag = |name: &str, default: bool| -> Result<bool, String> {
            match vars.get(name) {
                None => Ok(default),
                Some(v) => go_bool(name, v),
            }
        };
        let binaries = match binaries {
            Some(b) => b,
            None => {
                let exe = std::env::current_exe()
                    .map_err(|e| format!("cannot find this executable: {e}"))?;
                if exe.parent() == Some(Path::new("/opt/cni/bin")) {
                    Binaries::Directory(PathBuf::from("/opt/cni/bin"))
                } else {
                    Binaries::Executable(exe)
                }
            }
        };
        let skip_binaries = get("SKIP_CNI_BINARIES", "")
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        let sleep = flag("SLEEP", as_install)?;
        let in_cluster = InCluster::detected(&sa_dir).then(|| InCluster {
            dir: sa_dir.clone(),
            server: server_url(
                &get("KUBERNETES_SERVICE_PROTOCOL", "https"),
                &get("KUBERNETES_SERVICE_HOST", ""),
                &get("KUBERNETES_SERVICE_PORT", ""),
            ),
            skip_tls_verify: vars.get("SKIP_TLS_VERIFY").is_some_and(|v| v == "true"),
            kubeconfig: vars
                .get("KUBECONFIG")
                .filter(|k| !k.is_empty())
                .map(PathBuf::from),
            service_account: get("CALICO_CNI_SERVICE_ACCOUNT", "calico-cni-plugin"),
            token_seconds: TOKEN_SECONDS,
        });
        let refresh_interval = match vars.get("CNI_TOKEN_REFRESH_INTERVAL") {
            None => None,
            Some(text) => Some(go_duration(text).ok_or_else(|| {
                format!("CNI_TOKEN_REFRESH_INTERVAL={text:?} is not a duration (e.g. 6h, 90s)")
            })?),
        };
        Ok(Some(Settings {
            host_root,
            binaries,
            skip_binaries,
            update_binaries: flag("UPDATE_CNI_BINARIES", true)?,
            net_dir: get("CNI_NET_DIR", "/etc/cni/net.d"),
            conf_name: get("CNI_CONF_NAME", "10-calico.conflist"),
            old_conf_name: get("CNI_OLD_CONF_NAME", "10-calico.conflist"),
            template_file: vars.get("CNI_NETWORK_CONFIG_FILE").map(PathBuf::from),
            template: vars.get("CNI_NETWORK_CONFIG").cloned(),
            tls_assets_dir: PathBuf::from(get("TLS_ASSETS_DIR", "/calico-secrets")),
            watch: watch || sleep,
            in_cluster,
            serviceaccount_dir: sa_dir,
            refresh_interval,
            mtu_file,
            vars: vars.clone(),
        }))
    }

    /// The host's network config directory, as the installer sees it.
    pub fn net_d(&self) -> PathBuf {
        self.host_root.join("etc/cni/net.d")
    }

    /// The host's CNI binary directories, as the installer sees them.
    pub fn binary_dirs(&self) -> [PathBuf; 2] {
        [
            self.host_root.join("opt/cni/bin"),
            self.host_root.join("secondary-bin-dir"),
        ]
    }

    /// The template: the file, else the variable, else the built-in one.
    pub fn template_text(&self) -> Result<String, InstallError> {
        if let Some(path) = &self.template_file {
            return std::fs::read_to_string(path).map_err(|source| InstallError::Template {
                path: path.clone(),
                source,
            });
        }
        Ok(self
            .template
            .clone()
            .unwrap_or_else(|| DEFAULT_TEMPLATE.to_string()))
    }

    fn var(&self, name: &str, default: &str) -> String {
        self.vars
            .get(name)
            .cloned()
            .unwrap_or_else(|| default.to_string())
    }

    /// The node's name: `KUBERNETES_NODE_NAME`, else the host name in
    /// lower case.
    pub fn node_name(&self) -> String {
        self.vars
            .get("KUBERNETES_NODE_NAME")
            .cloned()
            .unwrap_or_else(|| {
                nix::unistd::gethostname()
                    .map(|h| h.to_string_lossy().trim().to_lowercase())
                    .unwrap_or_default()
            })
    }

    /// `CNI_MTU`; unset, the MTU calico-node detected (its MTU file), else
    /// 1500.
    fn mtu(&self) -> String {
        if let Some(mtu) = self.vars.get("CNI_MTU") {
            return mtu.clone();
        }
        std::fs::read_to_string(&self.mtu_file)
            .ok()
            .and_then(|m| m.trim().parse::<u32>().ok())
            .filter(|m| *m > 0)
            .map_or_else(|| "1500".to_string(), |m| m.to_string())
    }

    /// An etcd TLS file's path as the plugin will read it, when the install
    /// put it there.
    fn tls_path(&self, name: &str) -> String {
        if self.net_d().join("calico-tls").join(name).is_file() {
            format!("{}/calico-tls/{name}", self.net_dir)
        } else {
            String::new()
        }
    }

    /// Every placeholder and its value, in the order they are replaced.
    pub fn values(&self) -> Values {
        let own_token = std::fs::read_to_string(self.serviceaccount_dir.join("token"))
            .map(|t| t.trim().to_string())
            .unwrap_or_default();
        vec![
            ("__LOG_LEVEL__", self.var("LOG_LEVEL", "info")),
            (
                "__LOG_FILE_PATH__",
                self.var("LOG_FILE_PATH", "/var/log/calico/cni/cni.log"),
            ),
            (
                "__LOG_FILE_MAX_SIZE__",
                self.var("LOG_FILE_MAX_SIZE", "100"),
            ),
            ("__LOG_FILE_MAX_AGE__", self.var("LOG_FILE_MAX_AGE", "30")),
            (
                "__LOG_FILE_MAX_COUNT__",
                self.var("LOG_FILE_MAX_COUNT", "10"),
            ),
            (
                "__DATASTORE_TYPE__",
                self.var("DATASTORE_TYPE", "kubernetes"),
            ),
            ("__KUBERNETES_NODE_NAME__", self.node_name()),
            (
                "__KUBECONFIG_FILEPATH__",
                format!("{}/calico-kubeconfig", self.net_dir),
            ),
            ("__CNI_MTU__", self.mtu()),
            (
                "__KUBERNETES_SERVICE_HOST__",
                self.var("KUBERNETES_SERVICE_HOST", ""),
            ),
            (
                "__KUBERNETES_SERVICE_PORT__",
                self.var("KUBERNETES_SERVICE_PORT", ""),
            ),
            ("__SERVICEACCOUNT_TOKEN__", own_token),
            ("__ETCD_CERT_FILE__", self.tls_path("etcd-cert")),
            ("__ETCD_CA_CERT_FILE__", self.tls_path("etcd-ca")),
            ("__ETCD_KEY_FILE__", self.tls_path("etcd-key")),
            ("__ETCD_ENDPOINTS__", self.var("ETCD_ENDPOINTS", "")),
            ("__ETCD_DISCOVERY_SRV__", self.var("ETCD_DISCOVERY_SRV", "")),
            (
                "__REQUIRE_MTU_FILE__",
                self.var("REQUIRE_MTU_FILE", "false"),
            ),
            (
                "__CALICO_API_GROUP__",
                self.var("CALICO_API_GROUP", "crd.projectcalico.org/v1"),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration("90s"), Some(Duration::from_secs(90)));
        assert_eq!(go_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(go_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(go_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(go_duration("6"), None);
        assert_eq!(go_duration("6d"), None);
        assert_eq!(go_duration(""), None);
    }

    #[test]
    fn defaults_apply_only_when_unset() {
        let args: Vec<String> = vec!["--binaries".into(), "none".into()];
        let s = Settings::parse(&args, &vars(&[("CNI_MTU", ""), ("SLEEP", "F")]), true)
            .unwrap()
            .unwrap();
        assert!(!s.watch, "SLEEP=F");
        let values = s.values();
        let get = |p: &str| values.iter().find(|(k, _)| *k == p).unwrap().1.clone();
        assert_eq!(get("__CNI_MTU__"), "", "set to empty stays empty");
        assert_eq!(get("__LOG_FILE_MAX_SIZE__"), "100");
        assert_eq!(
            get("__KUBECONFIG_FILEPATH__"),
            "/etc/cni/net.d/calico-kubeconfig"
        );
        assert_eq!(s.conf_name, "10-calico.conflist");
        // Run as `install`, SLEEP defaults to true; as `calico install`, not.
        assert!(
            Settings::parse(&args, &vars(&[]), true)
                .unwrap()
                .unwrap()
                .watch
        );
        assert!(
            !Settings::parse(&args, &vars(&[]), false)
                .unwrap()
                .unwrap()
                .watch
        );
        let e =
            Settings::parse(&args, &vars(&[("UPDATE_CNI_BINARIES", "yes")]), false).unwrap_err();
        assert!(e.contains("UPDATE_CNI_BINARIES"), "{e}");
        assert!(Settings::parse(&["--bogus".into()], &vars(&[]), false).is_err());
    }
}
