//! Calico's sysctls (calico-behaviour.md §7.2): which keys, with which values, on which side.
//! Values are written as the bare digit, no newline, like Calico.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;

use crate::dataplane::DataplaneError;
use crate::dataplane::netlink::Ipv4Conf;

/// One sysctl write; `required: false` failures are only logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sysctl {
    /// Path under `/proc/sys/`, e.g. `net/ipv4/conf/cali123/proxy_arp`.
    pub key: String,
    pub value: &'static str,
    pub required: bool,
}

fn set(key: String, value: &'static str) -> Sysctl {
    Sysctl {
        key,
        value,
        required: true,
    }
}

fn try_set(key: String, value: &'static str) -> Sysctl {
    Sysctl {
        key,
        value,
        required: false,
    }
}

/// The host veth's IPv4 settings, given through netlink with its up (the
/// same values `/proc/sys/net/ipv4/conf/<h>/` then shows): no file to
/// open, write and close for each, and no flush of the node's route cache
/// that a changed `forwarding` or `route_localnet` file triggers (BENCHMARKS.md,
/// "The dataplane: the veth pair, netlink and sysctls").
pub fn host_ipv4(has_v4: bool) -> Ipv4Conf {
    Ipv4Conf {
        forwarding: has_v4,
        proxy_arp: has_v4,
        route_localnet: has_v4,
    }
}

/// The host veth's ARP proxy delay (`net/ipv4/neigh/<h>/proxy_delay`), in
/// ms, set through netlink for an IPv4 pod; a failure is only logged.
pub const HOST_PROXY_DELAY_MS: u64 = 0;

/// Host-side sysctls for host veth `h` written in /proc/sys (the IPv4 ones
/// go through netlink: [`host_ipv4`], [`HOST_PROXY_DELAY_MS`]).
pub fn host_side(h: &str, has_v6: bool) -> Vec<Sysctl> {
    let mut out = Vec::new();
    if has_v6 {
        out.push(set(format!("net/ipv6/conf/{h}/accept_dad"), "0"));
        out.push(set(format!("net/ipv6/conf/{h}/disable_ipv6"), "0"));
        out.push(set(format!("net/ipv6/conf/{h}/proxy_ndp"), "1"));
        out.push(set(format!("net/ipv6/conf/{h}/forwarding"), "1"));
    }
    out.push(try_set(format!("net/ipv6/conf/{h}/accept_ra"), "0"));
    out
}

/// Container-side sysctls for container interface `ifname`.
pub fn container_side(
    ifname: &str,
    has_v4: bool,
    has_v6: bool,
    allow_forwarding: bool,
) -> Vec<Sysctl> {
    let fwd = if allow_forwarding { "1" } else { "0" };
    let mut out = Vec::new();
    if has_v6 {
        out.push(set(format!("net/ipv6/conf/{ifname}/accept_dad"), "0"));
        for dev in ["all", "default", "lo"] {
            out.push(set(format!("net/ipv6/conf/{dev}/disable_ipv6"), "0"));
        }
        out.push(set("net/ipv6/conf/all/forwarding".into(), fwd));
    }
    if has_v4 {
        out.push(set("net/ipv4/ip_forward".into(), fwd));
    }
    out
}

/// The pod-side sysctl every IPv4 pod gets, opened with the pod's netlink
/// socket (see [`Opened`]).
pub const OPENED_WITH_POD_SOCKET: &[&str] = &["net/ipv4/ip_forward"];

/// Sysctl files opened ahead inside a namespace. A `/proc/sys/net` file
/// belongs to the namespace of the thread that opened it, so writes to it
/// go there from any thread: a pod's sysctls opened by the thread that
/// makes its netlink socket need no second thread inside the pod netns.
#[derive(Debug, Default)]
pub struct Opened(Vec<(&'static str, File)>);

impl Opened {
    /// Opens `keys` for writing in the calling thread's namespace; a key
    /// that cannot be opened is left to [`apply`] (which reports why).
    pub fn open(keys: &[&'static str]) -> Opened {
        Opened(
            keys.iter()
                .filter_map(|&key| {
                    let file = std::fs::OpenOptions::new()
                        .write(true)
                        .open(format!("/proc/sys/{key}"))
                        .ok()?;
                    Some((key, file))
                })
                .collect(),
        )
    }

    fn file(&self, key: &str) -> Option<&File> {
        self.0.iter().find(|(k, _)| *k == key).map(|(_, f)| f)
    }
}

/// Writes the sysctls `opened` holds files for; returns the others, for
/// [`apply`] in their namespace.
pub fn apply_opened(sysctls: &[Sysctl], opened: &Opened) -> Result<Vec<Sysctl>, DataplaneError> {
    let mut rest = Vec::new();
    for s in sysctls {
        match opened.file(&s.key) {
            Some(file) => outcome(s, file.write_all_at(s.value.as_bytes(), 0))?,
            None => rest.push(s.clone()),
        }
    }
    Ok(rest)
}

/// Writes sysctls in the calling thread's network namespace.
pub fn apply(sysctls: &[Sysctl]) -> Result<(), DataplaneError> {
    for s in sysctls {
        let path = format!("/proc/sys/{}", s.key);
        let result = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| f.write_all(s.value.as_bytes()));
        outcome(s, result)?;
    }
    Ok(())
}

/// A write's result as the ADD sees it: a failure of a required sysctl is
/// its error, another's only logged.
fn outcome(s: &Sysctl, result: std::io::Result<()>) -> Result<(), DataplaneError> {
    match result {
        Ok(()) => Ok(()),
        Err(e) if !s.required => {
            tracing::warn!("failed to set {}={}: {e}", s.key.replace('/', "."), s.value);
            Ok(())
        }
        Err(e) => Err(DataplaneError::Sysctl(format!(
            "failed to set {}={}: {e}",
            s.key.replace('/', "."),
            s.value
        ))),
    }
}

/// Reads one sysctl in the calling thread's namespace (for CHECK and tests).
pub fn read(key: &str) -> std::io::Result<String> {
    std::fs::read_to_string(format!("/proc/sys/{key}")).map(|s| s.trim().to_string())
}
