//! `device_type: "netkit"`, as root, on the running kernel: on a kernel
//! without netkit (this machine's: CONFIG_NETKIT is not set) the pod gets
//! a veth pair — the kernel answered EOPNOTSUPP and the plugin fell back,
//! as Calico does — and works; on a kernel with netkit it gets a netkit
//! pair laid out as Calico lays it out. Each test runs only where the
//! kernel lets it and says why it skips elsewhere (neither kernel can
//! stage the other's case). The request's bytes are checked against the
//! kernel's attributes in the unit test
//! `dataplane::netlink::tests::the_netkit_request_is_the_kernels_layout_byte_for_byte`.

mod common;

use std::io::Read;

use common::*;
use serde_json::{Value, json};

/// Whether the running kernel has netkit, from its build config
/// (/proc/config.gz, else /boot/config-<release>); `None` when neither
/// can be read, with the reason.
fn kernel_has_netkit() -> Result<bool, String> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|r| r.trim().to_string())
        .unwrap_or_default();
    let config = match std::fs::File::open("/proc/config.gz") {
        Ok(f) => {
            let mut text = String::new();
            flate2::read::GzDecoder::new(f)
                .read_to_string(&mut text)
                .map_err(|e| format!("/proc/config.gz: {e}"))?;
            text
        }
        Err(_) => std::fs::read_to_string(format!("/boot/config-{release}")).map_err(|e| {
            format!("no kernel config to read (/proc/config.gz, /boot/config-{release}): {e}")
        })?,
    };
    Ok(config
        .lines()
        .any(|l| l == "CONFIG_NETKIT=y" || l == "CONFIG_NETKIT=m"))
}

/// The host link's kind (`ip -d`), its MTU and MAC.
fn host_link(name: &str) -> (String, u64, String) {
    let links = host_ip_json(&["-d", "link", "show", name]);
    let l = &links[0];
    (
        l["linkinfo"]["info_kind"]
            .as_str()
            .unwrap_or("")
            .to_string(),
        l["mtu"].as_u64().unwrap_or(0),
        l["address"].as_str().unwrap_or("").to_string(),
    )
}

fn pod_link(ns: &Netns) -> (String, u64) {
    let links = ns.ip_json(&["-d", "link", "show", "eth0"]);
    let l = &links[0];
    (
        l["linkinfo"]["info_kind"]
            .as_str()
            .unwrap_or("")
            .to_string(),
        l["mtu"].as_u64().unwrap_or(0),
    )
}

fn addr_of(result: &Value) -> String {
    result["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string()
}

/// Two pods with `device_type` netkit and MTU 1400: each pod's pair is of
/// `kind`, the MTU set on both ends, the host end with Calico's MAC; the
/// pods reach each other and the host reaches them; CHECK passes; DEL
/// leaves nothing.
fn netkit_pods_work(s: &Setup, kind: &str) {
    let (a, b) = (Netns::new(), Netns::new());
    let (ca, cb) = (container_id(), container_id());
    let ra = s.run("ADD", &ca, &a.path(), "eth0").assert_ok().json();
    let rb = s.run("ADD", &cb, &b.path(), "eth0").assert_ok().json();
    for (r, ns) in [(&ra, &a), (&rb, &b)] {
        let host = r["interfaces"][0]["name"].as_str().unwrap();
        assert_eq!(
            host_link(host),
            (kind.to_string(), 1400, "ee:ee:ee:ee:ee:ee".to_string()),
            "{host}"
        );
        assert_eq!(pod_link(ns), (kind.to_string(), 1400));
    }
    let (ipa, ipb) = (addr_of(&ra), addr_of(&rb));
    assert_ping(Some(&a), &ipb, "pod to pod");
    assert_ping(None, &ipa, "host to pod");
    let mut check = s.conf.clone();
    check["prevResult"] = ra.clone();
    s.run_with("CHECK", &ca, &a.path(), "eth0", &check, &[])
        .assert_ok();
    for (c, ns, r) in [(&ca, &a, &ra), (&cb, &b, &rb)] {
        s.run("DEL", c, &ns.path(), "eth0").assert_ok();
        let host = r["interfaces"][0]["name"].as_str().unwrap();
        assert!(!host_link_exists(host), "{host} left");
        assert!(ns.link("eth0").is_none());
    }
    assert!(s.reservations().is_empty());
    assert!(s.endpoints().is_empty());
}

fn netkit_setup() -> Setup {
    let mut s = Setup::new("1.0.0", false);
    s.conf["device_type"] = json!("netkit");
    s.conf["mtu"] = json!(1400);
    s
}

/// Whether `test`, which needs a kernel with (`with`) or without netkit,
/// can run here; says why when it cannot (neither kernel can stage the
/// other's case, so the other test runs instead).
fn kernel_is(test: &str, with: bool) -> bool {
    if !root_or_skip(test) {
        return false;
    }
    match kernel_has_netkit() {
        Ok(has) if has == with => true,
        Ok(has) => {
            let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
            let (what, other) = if has {
                (
                    "has netkit, so it never answers EOPNOTSUPP",
                    "netkit_on_a_kernel_with_netkit",
                )
            } else {
                (
                    "is built without netkit (CONFIG_NETKIT is not set), so only the veth fallback can be tested here",
                    "netkit_falls_back_to_veth_on_a_kernel_without_it",
                )
            };
            eprintln!(
                "skipping {test}: this kernel ({}) {what} ({other})",
                release.trim()
            );
            false
        }
        Err(why) => {
            cannot_run(test, &why);
            false
        }
    }
}

#[test]
fn netkit_falls_back_to_veth_on_a_kernel_without_it() {
    if !kernel_is("netkit_falls_back_to_veth_on_a_kernel_without_it", false) {
        return;
    }
    let s = netkit_setup();
    netkit_pods_work(&s, "veth");
    let log = std::fs::read_to_string(s.dir.path().join("log/cni.log")).unwrap();
    assert!(
        log.contains("netkit not supported on this kernel; falling back to veth")
            // EOPNOTSUPP, whose words are the libc's ("Operation not
            // supported" on glibc, "Not supported" on musl).
            && log.contains("(os error 95)"),
        "{log}"
    );
}

#[test]
fn netkit_on_a_kernel_with_netkit() {
    if !kernel_is("netkit_on_a_kernel_with_netkit", true) {
        return;
    }
    let s = netkit_setup();
    netkit_pods_work(&s, "netkit");
}

/// Any other device_type is refused with Calico's message before anything
/// is done.
#[test]
fn an_unknown_device_type_is_refused() {
    if !root_or_skip("an_unknown_device_type_is_refused") {
        return;
    }
    let mut s = Setup::new("1.0.0", false);
    s.conf["device_type"] = json!("macvlan");
    let ns = Netns::new();
    let out = s.run("ADD", &container_id(), &ns.path(), "eth0");
    assert_eq!(out.error_code(), 7, "{out:?}");
    assert_eq!(
        out.json()["msg"],
        "unknown device_type \"macvlan\" in CNI config (supported: \"veth\", \"netkit\")"
    );
    assert!(ns.link("eth0").is_none());
    assert!(s.reservations().is_empty());
    assert!(s.endpoints().is_empty());
}
