//! One 1.1.0 result printed in every supported version, against the JSON
//! each version's spec (and libcni's converters) prescribe.

use calico_cni::cni::{CniResult, Version};
use serde_json::{Value, json};

fn sample() -> Value {
    json!({
        "cniVersion": "1.1.0",
        "interfaces": [
            {"name": "cali0123456789a"},
            {"name": "eth0", "mac": "0a:58:0a:00:00:05", "mtu": 1450, "sandbox": "/var/run/netns/pod"}
        ],
        "ips": [
            {"address": "10.0.0.5/32", "gateway": "169.254.1.1", "interface": 1},
            {"address": "fd00::5/128", "interface": 1}
        ],
        "routes": [
            {"dst": "0.0.0.0/0", "gw": "169.254.1.1", "mtu": 1400},
            {"dst": "::/0"}
        ],
        "dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]}
    })
}

fn print(version: &str) -> Value {
    let (result, _) = CniResult::parse(&sample(), Version::V1_1_0).unwrap();
    result.to_version(Version::parse(version).unwrap()).unwrap()
}

#[test]
fn v1_versions_keep_everything() {
    for v in ["1.0.0", "1.1.0"] {
        let mut expected = sample();
        expected["cniVersion"] = json!(v);
        assert_eq!(print(v), expected, "{v}");
    }
}

#[test]
fn v04_family_adds_ip_versions_and_drops_interface_mtu() {
    for v in ["0.3.0", "0.3.1", "0.4.0"] {
        let expected = json!({
            "cniVersion": v,
            "interfaces": [
                {"name": "cali0123456789a"},
                {"name": "eth0", "mac": "0a:58:0a:00:00:05", "sandbox": "/var/run/netns/pod"}
            ],
            "ips": [
                {"version": "4", "address": "10.0.0.5/32", "gateway": "169.254.1.1", "interface": 1},
                {"version": "6", "address": "fd00::5/128", "interface": 1}
            ],
            "routes": [
                {"dst": "0.0.0.0/0", "gw": "169.254.1.1", "mtu": 1400},
                {"dst": "::/0"}
            ],
            "dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]}
        });
        assert_eq!(print(v), expected, "{v}");
    }
}

#[test]
fn v02_family_keeps_first_address_per_family() {
    for v in ["0.1.0", "0.2.0"] {
        let expected = json!({
            "cniVersion": v,
            "ip4": {"ip": "10.0.0.5/32", "gateway": "169.254.1.1",
                    "routes": [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}]},
            "ip6": {"ip": "fd00::5/128", "routes": [{"dst": "::/0"}]},
            "dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"]}
        });
        assert_eq!(print(v), expected, "{v}");
    }
}

#[test]
fn no_ips_cannot_go_to_020() {
    let empty = CniResult::default();
    let err = empty.to_version(Version::V0_2_0).unwrap_err();
    assert_eq!(err.to_string(), "cannot convert: no valid IP addresses");
    // ...while the newer shapes print it fine.
    assert_eq!(empty.to_version(Version::V0_4_0).unwrap()["ips"], json!([]));
    assert_eq!(
        empty.to_version(Version::V1_0_0).unwrap(),
        json!({"cniVersion": "1.0.0"})
    );
}

#[test]
fn parses_every_version_back() {
    for v in [
        "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
    ] {
        let printed = print(v);
        let (back, version) = CniResult::parse(&printed, Version::V1_1_0).unwrap();
        assert_eq!(version.to_string(), v);
        assert!(
            back.ips
                .iter()
                .any(|ip| ip.address.to_string() == "10.0.0.5/32"),
            "{v}"
        );
    }
    // A result without cniVersion is read as the caller's version (libcni #895).
    let bare = json!({"ip4": {"ip": "10.1.0.2/24"}});
    let (r, v) = CniResult::parse(&bare, Version::V0_2_0).unwrap();
    assert_eq!((r.ips.len(), v), (1, Version::V0_2_0));
}
