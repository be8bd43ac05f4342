//! Calico's pod and namespace annotation rules for a Kubernetes ADD (calico-behaviour.md §4.3
//! steps 6-7 and 13-14, calico-behaviour.md §4.5): the pool, address-family, address, MAC,
//! source-prefix and floating-IP annotations, all checked before anything
//! is allocated. Pure: the caller fetches the Pod and Namespace. Every error
//! carries the exact message the `calico` plugin reports.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use serde_json::{Value, json};

use crate::cni::rule_error::{RuleError, parse_cidr, show};
use crate::dataplane::MacAddr;
use crate::datastore::model::IpNat;
use crate::k8s::objects::{Namespace, Pod};

pub const ANNOTATION_IPV4_POOLS: &str = "cni.projectcalico.org/ipv4pools";
pub const ANNOTATION_IPV6_POOLS: &str = "cni.projectcalico.org/ipv6pools";
pub const ANNOTATION_IP_FAMILIES: &str = "cni.projectcalico.org/ipFamilies";
pub const ANNOTATION_IP_ADDRS: &str = "cni.projectcalico.org/ipAddrs";
pub const ANNOTATION_IP_ADDRS_NO_IPAM: &str = "cni.projectcalico.org/ipAddrsNoIpam";
pub const ANNOTATION_HW_ADDR: &str = "cni.projectcalico.org/hwAddr";
pub const ANNOTATION_ALLOWED_SOURCE_PREFIXES: &str = "cni.projectcalico.org/allowedSourcePrefixes";
pub const ANNOTATION_FLOATING_IPS: &str = "cni.projectcalico.org/floatingIPs";
/// The IPAM plugin the pool and address annotations require.
pub const CALICO_IPAM: &str = "calico-ipam";

/// An IPv4-mapped IPv6 address counts as IPv4, as in the reference plugin.
fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// What a pod's and its namespace's annotations decide for the pod's ADD,
/// every rule checked before anything is allocated.
pub struct PodRules {
    /// Where the addresses come from (ipAddrs, ipAddrsNoIpam, the IPAM).
    pub source: AddressSource,
    /// hwAddr.
    pub container_mac: Option<MacAddr>,
    /// allowedSourcePrefixes.
    pub allowed_source_prefixes: Vec<String>,
    /// floatingIPs (applied once the pod's addresses are known), and
    /// whether the feature is on.
    floating: BTreeMap<String, String>,
    floating_enabled: bool,
}

impl PodRules {
    /// The rules of `pod` in `namespace` (both `None` when the policy is
    /// not `k8s`: nothing was read, no annotation applies) under `conf`;
    /// with policy `k8s` and calico-ipam, the pool annotations are written
    /// into `ipam_config`.
    pub fn read(
        namespace: Option<&Namespace>,
        pod: Option<&Pod>,
        conf: &crate::cni::NetConf,
        ipam_config: &mut Value,
    ) -> Result<PodRules, RuleError> {
        let ns_ann = namespace.map(namespace_annotations).unwrap_or_default();
        let pod_ann = pod.map(pod_annotations).unwrap_or_default();
        let ipam_type = conf.ipam.kind.as_str();
        if conf.k8s_policy() && ipam_type == CALICO_IPAM {
            apply_pool_annotations(ipam_config, &ns_ann, &pod_ann)?;
        }
        let source = address_source(&pod_ann, ipam_type, conf.feature_control.ip_addrs_no_ipam)?;
        let rules = PodRules {
            source,
            container_mac: requested_mac(&pod_ann)?,
            allowed_source_prefixes: allowed_source_prefixes(&pod_ann)?,
            floating_enabled: conf.feature_control.floating_ips,
            floating: pod_ann,
        };
        // An unusable floatingIPs annotation fails before any allocation.
        rules.floating_ips(&[])?;
        Ok(rules)
    }

    /// The floatingIPs annotation's NAT mappings for the pod's `ips`.
    pub fn floating_ips(&self, ips: &[IpNet]) -> Result<Vec<IpNat>, RuleError> {
        floating_ips(&self.floating, self.floating_enabled, ips)
    }
}

/// A Pod's annotations (empty when it has none).
pub fn pod_annotations(pod: &Pod) -> BTreeMap<String, String> {
    pod.metadata.annotations.clone().unwrap_or_default()
}

/// A Namespace's annotations (empty when it has none).
pub fn namespace_annotations(namespace: &Namespace) -> BTreeMap<String, String> {
    namespace.metadata.annotations.clone().unwrap_or_default()
}

/// The pod's non-empty value of `key`, else the namespace's non-empty value.
fn pod_over_namespace<'a>(
    key: &str,
    namespace: &'a BTreeMap<String, String>,
    pod: &'a BTreeMap<String, String>,
) -> Option<&'a str> {
    [pod, namespace]
        .into_iter()
        .filter_map(|annotations| annotations.get(key))
        .map(String::as_str)
        .find(|v| !v.is_empty())
}

/// Parses a JSON list of strings; `null` counts as an empty list.
fn string_list(raw: &str) -> Result<Vec<String>, serde_json::Error> {
    serde_json::from_str::<Option<Vec<String>>>(raw).map(Option::unwrap_or_default)
}

/// calico-behaviour.md §4.3 step 6 (policy `k8s` with `calico-ipam` only): the
/// `ipv4pools` / `ipv6pools` / `ipFamilies` annotations of the namespace,
/// each overridden by the pod's when non-empty, written into the config as
/// `ipam.ipv4_pools` / `ipam.ipv6_pools` and `ipam.assign_ipv4` /
/// `ipam.assign_ipv6` (`"true"`/`"false"`). Nothing is written on error.
pub fn apply_pool_annotations(
    conf: &mut Value,
    namespace_annotations: &BTreeMap<String, String>,
    pod_annotations: &BTreeMap<String, String>,
) -> Result<(), RuleError> {
    let get = |key| pod_over_namespace(key, namespace_annotations, pod_annotations);
    let (v4_pools, v6_pools, families) = (
        get(ANNOTATION_IPV4_POOLS),
        get(ANNOTATION_IPV6_POOLS),
        get(ANNOTATION_IP_FAMILIES),
    );
    if v4_pools.is_none() && v6_pools.is_none() && families.is_none() {
        return Ok(());
    }

    let mut updates: Vec<(&str, Value)> = Vec::new();
    for (key, annotation, raw) in [
        ("ipv4_pools", ANNOTATION_IPV4_POOLS, v4_pools),
        ("ipv6_pools", ANNOTATION_IPV6_POOLS, v6_pools),
    ] {
        if let Some(raw) = raw {
            // Calico returns the bare JSON error; the annotation's name is
            // what an operator needs to find the culprit.
            let pools = serde_json::from_str::<Option<Vec<String>>>(raw).map_err(|e| {
                RuleError(format!(
                    "failed to parse {raw:?} for annotation {annotation:?}: {e}"
                ))
            })?;
            updates.push((key, json!(pools)));
        }
    }
    if let Some(raw) = families {
        let list = string_list(raw).map_err(|e| RuleError(e.to_string()))?;
        let (mut v4, mut v6) = (false, false);
        for family in &list {
            match family.as_str() {
                "IPv4" => v4 = true,
                "IPv6" => v6 = true,
                _ => return Err(RuleError(format!("error parsing ipFamilies: {raw}"))),
            }
        }
        updates.push(("assign_ipv4", Value::String(v4.to_string())));
        updates.push(("assign_ipv6", Value::String(v6.to_string())));
    }

    let ipam = match conf.get_mut("ipam") {
        Some(Value::Object(ipam)) => ipam,
        other => {
            return Err(RuleError(format!(
                "failed to parse IPAM data; was expecting a dict, not: {}",
                show(other.map(|v| &*v))
            )));
        }
    };
    for (key, value) in updates {
        ipam.insert(key.to_string(), value);
    }
    Ok(())
}

/// Where a pod's addresses come from (calico-behaviour.md §4.3 step 7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressSource {
    /// No address annotation: run the IPAM plugin.
    Ipam,
    /// `cni.projectcalico.org/ipAddrs`: ask calico-ipam for each address
    /// (`IP=<ip>` in CNI_ARGS).
    IpAddrs(Vec<IpAddr>),
    /// `cni.projectcalico.org/ipAddrsNoIpam`: use the addresses as they are,
    /// without any IPAM record.
    IpAddrsNoIpam(Vec<IpAddr>),
}

/// Validates an address annotation: a non-empty JSON list of IP addresses
/// with at most one per family.
fn annotation_ips(raw: &str, annotation: &str) -> Result<Vec<IpAddr>, RuleError> {
    let list = string_list(raw).map_err(|e| {
        RuleError(format!(
            "failed to parse IPs {raw} for annotation \"{annotation}\": failed to parse '{raw}' as JSON: {e}"
        ))
    })?;
    if list.is_empty() {
        return Err(RuleError(format!(
            "annotation \"{annotation}\" specified but empty"
        )));
    }
    let mut ips = Vec::with_capacity(list.len());
    let (mut has_v4, mut has_v6) = (false, false);
    for entry in &list {
        let ip = IpAddr::from_str(entry)
            .map(canonical_ip)
            .map_err(|_| RuleError(format!("invalid IP format: {entry}")))?;
        let (seen, family) = if ip.is_ipv4() {
            (&mut has_v4, "IPv4")
        } else {
            (&mut has_v6, "IPv6")
        };
        if *seen {
            return Err(RuleError(format!(
                "cannot have more than one {family} address for \"{annotation}\" annotation"
            )));
        }
        *seen = true;
        ips.push(ip);
    }
    Ok(ips)
}

/// calico-behaviour.md §4.3 step 7: the address source chosen by the pod's `ipAddrs` /
/// `ipAddrsNoIpam` annotations (an empty value counts as absent), with every
/// validation of the reference plugin.
pub fn address_source(
    pod_annotations: &BTreeMap<String, String>,
    ipam_type: &str,
    ip_addrs_no_ipam_enabled: bool,
) -> Result<AddressSource, RuleError> {
    let get = |key| {
        pod_annotations
            .get(key)
            .map(String::as_str)
            .filter(|v: &&str| !v.is_empty())
    };
    match (get(ANNOTATION_IP_ADDRS), get(ANNOTATION_IP_ADDRS_NO_IPAM)) {
        (None, None) => Ok(AddressSource::Ipam),
        (Some(_), Some(_)) => Err(RuleError::new(
            "can't have both annotations: 'ipAddrs' and 'ipAddrsNoIpam' in use at the same time",
        )),
        (None, Some(raw)) => {
            if ipam_type != CALICO_IPAM {
                return Err(RuleError(format!(
                    "ipAddrsNoIpam is not compatible with configured IPAM: {ipam_type}"
                )));
            }
            if !ip_addrs_no_ipam_enabled {
                return Err(RuleError::new(
                    "requested feature is not enabled: ip_addrs_no_ipam",
                ));
            }
            annotation_ips(raw, ANNOTATION_IP_ADDRS_NO_IPAM).map(AddressSource::IpAddrsNoIpam)
        }
        (Some(raw), None) => {
            if ipam_type != CALICO_IPAM {
                return Err(RuleError(format!(
                    "ipAddrs is not compatible with configured IPAM: {ipam_type}"
                )));
            }
            annotation_ips(raw, ANNOTATION_IP_ADDRS).map(AddressSource::IpAddrs)
        }
    }
}

/// calico-behaviour.md §4.5: the container MAC requested by `cni.projectcalico.org/hwAddr`, if
/// the annotation is present.
pub fn requested_mac(
    pod_annotations: &BTreeMap<String, String>,
) -> Result<Option<MacAddr>, RuleError> {
    let Some(raw) = pod_annotations.get(ANNOTATION_HW_ADDR) else {
        return Ok(None);
    };
    MacAddr::from_str(raw).map(Some).map_err(|_| {
        RuleError(format!(
            "failed to parse MAC address {raw} provided via {ANNOTATION_HW_ADDR}: address {raw}: invalid MAC address"
        ))
    })
}

/// calico-behaviour.md §4.3 step 13: `cni.projectcalico.org/allowedSourcePrefixes`, each CIDR
/// reduced to its network (`1.1.1.5/24` -> `1.1.1.0/24`), in annotation
/// order. Empty when the annotation is absent.
pub fn allowed_source_prefixes(
    pod_annotations: &BTreeMap<String, String>,
) -> Result<Vec<String>, RuleError> {
    let Some(raw) = pod_annotations.get(ANNOTATION_ALLOWED_SOURCE_PREFIXES) else {
        return Ok(Vec::new());
    };
    let prefixes =
        string_list(raw).map_err(|e| RuleError(format!("failed to parse '{raw}' as JSON: {e}")))?;
    prefixes
        .iter()
        .map(|prefix| {
            parse_cidr(prefix)
                .map(|net| net.trunc().to_string())
                .map_err(|e| RuleError(format!("failed to parse '{prefix}' as a CIDR: {e}")))
        })
        .collect()
}

/// calico-behaviour.md §4.3 step 14: `cni.projectcalico.org/floatingIPs` as NAT mappings, in
/// annotation order: entries containing `:` map to the pod's IPv6 address,
/// others to its IPv4 address (entries of a family the pod lacks are
/// skipped). The annotation needs `feature_control.floating_ips`.
pub fn floating_ips(
    pod_annotations: &BTreeMap<String, String>,
    enabled: bool,
    pod_ips: &[IpNet],
) -> Result<Vec<IpNat>, RuleError> {
    let Some(raw) = pod_annotations.get(ANNOTATION_FLOATING_IPS) else {
        return Ok(Vec::new());
    };
    if !enabled {
        return Err(RuleError::new(
            "requested feature is not enabled: floating_ips",
        ));
    }
    let externals =
        string_list(raw).map_err(|e| RuleError(format!("failed to parse '{raw}' as JSON: {e}")))?;
    let (mut pod_v4, mut pod_v6) = (None, None);
    for net in pod_ips {
        match canonical_ip(net.addr()) {
            ip @ IpAddr::V4(_) => pod_v4 = Some(ip),
            ip @ IpAddr::V6(_) => pod_v6 = Some(ip),
        }
    }
    Ok(externals
        .into_iter()
        .filter_map(|external| {
            let internal = if external.contains(':') {
                pod_v6
            } else {
                pod_v4
            }?;
            Some(IpNat {
                internal_ip: internal.to_string(),
                external_ip: external,
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn err<T: std::fmt::Debug>(r: Result<T, RuleError>) -> String {
        r.unwrap_err().to_string()
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    // -- pool annotations (calico-behaviour.md §4.3 step 6, §11 item 36) ------------------------

    fn calico_ipam() -> Value {
        json!({"name": "net", "ipam": {"type": "calico-ipam", "custom": "kept"}})
    }

    #[test]
    fn namespace_pools_are_the_default() {
        let mut conf = calico_ipam();
        let ns = ann(&[(ANNOTATION_IPV4_POOLS, r#"["50.60.0.0/28","60.70.0.0/28"]"#)]);
        apply_pool_annotations(&mut conf, &ns, &BTreeMap::new()).unwrap();
        assert_eq!(
            conf,
            json!({"name": "net", "ipam": {
                "type": "calico-ipam",
                "custom": "kept",
                "ipv4_pools": ["50.60.0.0/28", "60.70.0.0/28"]
            }})
        );
    }

    #[test]
    fn pod_pools_override_namespace_independently() {
        let mut conf = calico_ipam();
        let ns = ann(&[
            (ANNOTATION_IPV4_POOLS, r#"["50.55.0.0/16"]"#),
            (ANNOTATION_IPV6_POOLS, r#"["fd00::/64"]"#),
        ]);
        let pod = ann(&[
            (ANNOTATION_IPV4_POOLS, r#"["50.70.0.0/16"]"#),
            (ANNOTATION_IPV6_POOLS, ""),
            (ANNOTATION_IP_FAMILIES, r#"["IPv6"]"#),
        ]);
        apply_pool_annotations(&mut conf, &ns, &pod).unwrap();
        let ipam = &conf["ipam"];
        assert_eq!(ipam["ipv4_pools"], json!(["50.70.0.0/16"]));
        assert_eq!(ipam["ipv6_pools"], json!(["fd00::/64"]));
        assert_eq!(ipam["assign_ipv4"], "false");
        assert_eq!(ipam["assign_ipv6"], "true");
        assert_eq!(ipam["custom"], "kept");
    }

    #[test]
    fn ip_families() {
        let mut conf = calico_ipam();
        let ns = ann(&[(ANNOTATION_IP_FAMILIES, r#"["IPv4","IPv6"]"#)]);
        apply_pool_annotations(&mut conf, &ns, &BTreeMap::new()).unwrap();
        assert_eq!(conf["ipam"]["assign_ipv4"], "true");
        assert_eq!(conf["ipam"]["assign_ipv6"], "true");
        assert!(conf["ipam"].get("ipv4_pools").is_none());

        let mut conf = calico_ipam();
        let pod = ann(&[(ANNOTATION_IP_FAMILIES, r#"["IPv4","ipv6"]"#)]);
        assert_eq!(
            err(apply_pool_annotations(&mut conf, &BTreeMap::new(), &pod)),
            r#"error parsing ipFamilies: ["IPv4","ipv6"]"#
        );
        assert_eq!(conf, calico_ipam(), "nothing written on error");
    }

    #[test]
    fn no_pool_annotations_leaves_conf_alone() {
        let mut conf = json!({"ipam": "not even a dict"});
        let empty = ann(&[(ANNOTATION_IPV4_POOLS, "")]);
        apply_pool_annotations(&mut conf, &empty, &empty).unwrap();
        assert_eq!(conf, json!({"ipam": "not even a dict"}));
    }

    /// JSON errors carry serde's text (and, for pools, the annotation's name).
    #[test]
    fn pool_json_errors_name_the_problem() {
        let serde_msg = |raw: &str| {
            serde_json::from_str::<Option<Vec<String>>>(raw)
                .unwrap_err()
                .to_string()
        };
        for (key, raw) in [
            (ANNOTATION_IPV4_POOLS, "[50.60.0.0/28]"),
            (ANNOTATION_IPV6_POOLS, "[1]"),
            (ANNOTATION_IP_FAMILIES, "IPv4"),
        ] {
            let pod = ann(&[(key, raw)]);
            let mut conf = calico_ipam();
            let got = err(apply_pool_annotations(&mut conf, &BTreeMap::new(), &pod));
            assert!(got.ends_with(&serde_msg(raw)), "{key}: {got}");
            if key != ANNOTATION_IP_FAMILIES {
                assert!(got.contains(key), "{key}: {got}");
            }
            assert_eq!(conf, calico_ipam());
        }
    }

    #[test]
    fn pools_need_an_ipam_dict() {
        let pod = ann(&[(ANNOTATION_IPV4_POOLS, r#"["p"]"#)]);
        assert_eq!(
            err(apply_pool_annotations(
                &mut json!({"ipam": 1}),
                &BTreeMap::new(),
                &pod
            )),
            "failed to parse IPAM data; was expecting a dict, not: 1"
        );
    }

    // -- address source (calico-behaviour.md §4.3 step 7, §11 item 39) --------------------------

    #[test]
    fn no_address_annotation_uses_ipam() {
        assert_eq!(
            address_source(&BTreeMap::new(), "host-local", false).unwrap(),
            AddressSource::Ipam
        );
        let empty = ann(&[(ANNOTATION_IP_ADDRS, ""), (ANNOTATION_IP_ADDRS_NO_IPAM, "")]);
        assert_eq!(
            address_source(&empty, "calico-ipam", true).unwrap(),
            AddressSource::Ipam
        );
    }

    #[test]
    fn ip_addrs_no_ipam() {
        let pod = ann(&[(ANNOTATION_IP_ADDRS_NO_IPAM, r#"["10.0.0.1"]"#)]);
        assert_eq!(
            address_source(&pod, "calico-ipam", true).unwrap(),
            AddressSource::IpAddrsNoIpam(vec![ip("10.0.0.1")])
        );
        assert_eq!(
            err(address_source(&pod, "calico-ipam", false)),
            "requested feature is not enabled: ip_addrs_no_ipam"
        );
        assert_eq!(
            err(address_source(&pod, "host-local", true)),
            "ipAddrsNoIpam is not compatible with configured IPAM: host-local"
        );
        let two = ann(&[(ANNOTATION_IP_ADDRS_NO_IPAM, r#"["10.0.0.1","10.0.0.2"]"#)]);
        assert_eq!(
            err(address_source(&two, "calico-ipam", true)),
            "cannot have more than one IPv4 address for \"cni.projectcalico.org/ipAddrsNoIpam\" annotation"
        );
    }

    #[test]
    fn ip_addrs() {
        let pod = ann(&[(ANNOTATION_IP_ADDRS, r#"["20.0.0.111"]"#)]);
        assert_eq!(
            address_source(&pod, "calico-ipam", false).unwrap(),
            AddressSource::IpAddrs(vec![ip("20.0.0.111")])
        );
        assert_eq!(
            err(address_source(&pod, "host-local", false)),
            "ipAddrs is not compatible with configured IPAM: host-local"
        );
        let dual = ann(&[(ANNOTATION_IP_ADDRS, r#"["fd80:20::7", "20.0.0.7"]"#)]);
        assert_eq!(
            address_source(&dual, "calico-ipam", false).unwrap(),
            AddressSource::IpAddrs(vec![ip("fd80:20::7"), ip("20.0.0.7")])
        );
        let two_v6 = ann(&[(ANNOTATION_IP_ADDRS, r#"["fd80::1","fd80::2"]"#)]);
        assert_eq!(
            err(address_source(&two_v6, "calico-ipam", false)),
            "cannot have more than one IPv6 address for \"cni.projectcalico.org/ipAddrs\" annotation"
        );
        // An IPv4-mapped IPv6 address counts as IPv4.
        let mapped = ann(&[(ANNOTATION_IP_ADDRS, r#"["::ffff:20.0.0.7","20.0.0.8"]"#)]);
        assert!(err(address_source(&mapped, "calico-ipam", false)).contains("one IPv4"));
    }

    #[test]
    fn address_annotation_errors() {
        let both = ann(&[
            (ANNOTATION_IP_ADDRS, r#"["10.0.0.1"]"#),
            (ANNOTATION_IP_ADDRS_NO_IPAM, r#"["10.0.0.2"]"#),
        ]);
        assert_eq!(
            err(address_source(&both, "calico-ipam", true)),
            "can't have both annotations: 'ipAddrs' and 'ipAddrsNoIpam' in use at the same time"
        );

        let empty = ann(&[(ANNOTATION_IP_ADDRS, "[]")]);
        assert_eq!(
            err(address_source(&empty, "calico-ipam", true)),
            "annotation \"cni.projectcalico.org/ipAddrs\" specified but empty"
        );
        let null = ann(&[(ANNOTATION_IP_ADDRS_NO_IPAM, "null")]);
        assert_eq!(
            err(address_source(&null, "calico-ipam", true)),
            "annotation \"cni.projectcalico.org/ipAddrsNoIpam\" specified but empty"
        );

        let bad_ip = ann(&[(ANNOTATION_IP_ADDRS, r#"["10.0.0.300"]"#)]);
        assert_eq!(
            err(address_source(&bad_ip, "calico-ipam", true)),
            "invalid IP format: 10.0.0.300"
        );
        let cidr = ann(&[(ANNOTATION_IP_ADDRS, r#"["10.0.0.1/32"]"#)]);
        assert_eq!(
            err(address_source(&cidr, "calico-ipam", true)),
            "invalid IP format: 10.0.0.1/32"
        );

        let raw = "10.0.0.1";
        let not_json = ann(&[(ANNOTATION_IP_ADDRS, raw)]);
        let got = err(address_source(&not_json, "calico-ipam", true));
        let prefix = format!(
            "failed to parse IPs {raw} for annotation \"cni.projectcalico.org/ipAddrs\": failed to parse '{raw}' as JSON: "
        );
        assert!(got.starts_with(&prefix), "{got}");
        assert!(got.len() > prefix.len(), "{got}");
    }

    // -- hwAddr (calico-behaviour.md §4.5, §11 item 40) -----------------------------------------

    #[test]
    fn hw_addr() {
        assert_eq!(requested_mac(&BTreeMap::new()).unwrap(), None);
        let pod = ann(&[(ANNOTATION_HW_ADDR, "ca:fe:ca:fe:ca:fe")]);
        assert_eq!(
            requested_mac(&pod).unwrap(),
            Some(MacAddr([0xca, 0xfe, 0xca, 0xfe, 0xca, 0xfe]))
        );
        let pod = ann(&[(ANNOTATION_HW_ADDR, "invalid MAC address")]);
        assert_eq!(
            err(requested_mac(&pod)),
            "failed to parse MAC address invalid MAC address provided via cni.projectcalico.org/hwAddr: address invalid MAC address: invalid MAC address"
        );
    }

    // -- allowedSourcePrefixes (calico-behaviour.md §4.3 step 13, §11 item 37) -------------------

    #[test]
    fn source_prefixes() {
        assert!(
            allowed_source_prefixes(&BTreeMap::new())
                .unwrap()
                .is_empty()
        );
        let pod = ann(&[(
            ANNOTATION_ALLOWED_SOURCE_PREFIXES,
            r#"["8.8.8.8/32","1.1.1.0/24"]"#,
        )]);
        assert_eq!(
            allowed_source_prefixes(&pod).unwrap(),
            ["8.8.8.8/32", "1.1.1.0/24"]
        );
        let pod = ann(&[(
            ANNOTATION_ALLOWED_SOURCE_PREFIXES,
            r#"["1.1.1.5/24","2001:db8::17/64"]"#,
        )]);
        assert_eq!(
            allowed_source_prefixes(&pod).unwrap(),
            ["1.1.1.0/24", "2001:db8::/64"]
        );
    }

    #[test]
    fn source_prefix_errors() {
        let pod = ann(&[(ANNOTATION_ALLOWED_SOURCE_PREFIXES, r#"["1.1.1.1"]"#)]);
        assert_eq!(
            err(allowed_source_prefixes(&pod)),
            "failed to parse '1.1.1.1' as a CIDR: invalid CIDR address: 1.1.1.1"
        );
        let pod = ann(&[(ANNOTATION_ALLOWED_SOURCE_PREFIXES, "1.1.1.0/24")]);
        let got = err(allowed_source_prefixes(&pod));
        assert!(
            got.starts_with("failed to parse '1.1.1.0/24' as JSON: "),
            "{got}"
        );
    }

    // -- floatingIPs (calico-behaviour.md §4.3 step 14, §11 item 38) -----------------------------

    #[test]
    fn floating_ips_single_stack() {
        let pod = ann(&[(ANNOTATION_FLOATING_IPS, r#"["1.1.1.1"]"#)]);
        assert_eq!(
            floating_ips(&pod, true, &nets(&["10.0.0.5/32"])).unwrap(),
            [IpNat {
                internal_ip: "10.0.0.5".into(),
                external_ip: "1.1.1.1".into()
            }]
        );
        assert_eq!(
            err(floating_ips(&pod, false, &nets(&["10.0.0.5/32"]))),
            "requested feature is not enabled: floating_ips"
        );
        assert!(
            floating_ips(&BTreeMap::new(), false, &nets(&["10.0.0.5/32"]))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn floating_ips_dual_stack() {
        let pod = ann(&[(ANNOTATION_FLOATING_IPS, r#"["1.1.1.1","2001:647f::21"]"#)]);
        let got = floating_ips(&pod, true, &nets(&["fd80:24e2::7/128", "10.0.0.5/32"])).unwrap();
        assert_eq!(
            got,
            [
                IpNat {
                    internal_ip: "10.0.0.5".into(),
                    external_ip: "1.1.1.1".into()
                },
                IpNat {
                    internal_ip: "fd80:24e2::7".into(),
                    external_ip: "2001:647f::21".into()
                }
            ]
        );
        // A family the pod lacks gives no mapping.
        let got = floating_ips(&pod, true, &nets(&["10.0.0.5/32"])).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].external_ip, "1.1.1.1");
    }

    #[test]
    fn floating_ips_bad_json() {
        let pod = ann(&[(ANNOTATION_FLOATING_IPS, "1.1.1.1")]);
        let got = err(floating_ips(&pod, true, &nets(&["10.0.0.5/32"])));
        assert!(
            got.starts_with("failed to parse '1.1.1.1' as JSON: "),
            "{got}"
        );
    }

    #[test]
    fn annotation_helpers() {
        let p = pod(json!({"metadata": {"name": "p", "annotations": {"a": "b"}}}));
        assert_eq!(pod_annotations(&p), ann(&[("a", "b")]));
        assert!(pod_annotations(&Pod::default()).is_empty());
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": "ns", "annotations": {"c": "d"}}}))
                .unwrap();
        assert_eq!(namespace_annotations(&ns), ann(&[("c", "d")]));
    }

    fn pod(value: Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn canonical_ip_maps_v4_in_v6() {
        assert_eq!(
            canonical_ip(IpAddr::V6(Ipv4Addr::new(1, 2, 3, 4).to_ipv6_mapped())),
            IpAddr::V4(Ipv4Addr::new(1, 2, 3, 4))
        );
        assert_eq!(
            canonical_ip(IpAddr::V6(Ipv6Addr::LOCALHOST)),
            IpAddr::V6(Ipv6Addr::LOCALHOST)
        );
    }
}
