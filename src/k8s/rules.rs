//! The Kubernetes ADD path's pure rules (§4.3, §4.5, §4.6, §6.1): the
//! host-local `usePodCidr` rewrite and custom routes, the pool, address,
//! MAC, source-prefix and floating-IP annotations, the Pod -> WorkloadEndpoint
//! conversion and the KDD pod-IP patch body.
//!
//! Nothing here performs I/O: callers fetch the Node, Namespace and Pod and
//! pass in what is needed. The config functions work on the raw stdin JSON so
//! keys this crate does not model round-trip untouched. Every error carries
//! the exact message the `calico` plugin reports.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::str::FromStr;

use crate::k8s::objects::{Container, Namespace, Pod};
use ipnet::IpNet;
use serde_json::{Map, Value, json};

use crate::dataplane::MacAddr;
use crate::datastore::model::{
    EndpointPort, IpNat, LABEL_NAMESPACE, LABEL_ORCHESTRATOR, WorkloadEndpoint,
};
use crate::datastore::names::{WepIdentifiers, veth_name_for_workload};

/// `ipam.subnet` placeholder for the node's IPv4 pod CIDR.
pub const USE_POD_CIDR: &str = "usePodCidr";
/// `ipam.subnet` placeholder for the node's IPv6 pod CIDR.
pub const USE_POD_CIDR_IPV6: &str = "usePodCidrIPv6";

pub const ANNOTATION_IPV4_POOLS: &str = "cni.projectcalico.org/ipv4pools";
pub const ANNOTATION_IPV6_POOLS: &str = "cni.projectcalico.org/ipv6pools";
pub const ANNOTATION_IP_FAMILIES: &str = "cni.projectcalico.org/ipFamilies";
pub const ANNOTATION_IP_ADDRS: &str = "cni.projectcalico.org/ipAddrs";
pub const ANNOTATION_IP_ADDRS_NO_IPAM: &str = "cni.projectcalico.org/ipAddrsNoIpam";
pub const ANNOTATION_HW_ADDR: &str = "cni.projectcalico.org/hwAddr";
pub const ANNOTATION_ALLOWED_SOURCE_PREFIXES: &str = "cni.projectcalico.org/allowedSourcePrefixes";
pub const ANNOTATION_FLOATING_IPS: &str = "cni.projectcalico.org/floatingIPs";
pub const ANNOTATION_POD_IP: &str = "cni.projectcalico.org/podIP";
pub const ANNOTATION_POD_IPS: &str = "cni.projectcalico.org/podIPs";
pub const ANNOTATION_CONTAINER_ID: &str = "cni.projectcalico.org/containerID";

/// WorkloadEndpoint label carrying the pod's service account.
pub const LABEL_SERVICE_ACCOUNT: &str = "projectcalico.org/serviceaccount";
/// The orchestrator of every Kubernetes WorkloadEndpoint.
pub const ORCHESTRATOR_K8S: &str = "k8s";
/// The IPAM plugin the pool and address annotations require.
pub const CALICO_IPAM: &str = "calico-ipam";

/// Service-account names this long or longer get no label (label values
/// are limited to 63 characters).
const MAX_SERVICE_ACCOUNT_LABEL_LEN: usize = 63;

/// A rule rejected the config or an annotation; the text is the message the
/// plugin reports.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RuleError(pub String);

impl RuleError {
    fn new(msg: impl Into<String>) -> RuleError {
        RuleError(msg.into())
    }
}

impl From<RuleError> for crate::cni::Error {
    fn from(e: RuleError) -> Self {
        crate::cni::Error::InvalidConfig(e.0)
    }
}

/// Compact JSON text of a value for an error message (`null` when absent).
fn show(v: Option<&Value>) -> String {
    v.map_or_else(|| "null".to_string(), Value::to_string)
}

/// The parse error of a malformed CIDR, worded like the reference plugin.
fn parse_cidr(s: &str) -> Result<IpNet, RuleError> {
    IpNet::from_str(s).map_err(|_| RuleError(format!("invalid CIDR address: {s}")))
}

/// An IPv4-mapped IPv6 address counts as IPv4, as in the reference plugin.
fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

// ---------------------------------------------------------------------------
// host-local special-casing (§4.3 steps 3-4, §9.1)
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

/// Which placeholder, if any, a `subnet` value is (compared case-insensitively).
fn placeholder(subnet: Option<&Value>) -> Option<Family> {
    let s = subnet?.as_str()?;
    if s.eq_ignore_ascii_case(USE_POD_CIDR) {
        Some(Family::V4)
    } else if s.eq_ignore_ascii_case(USE_POD_CIDR_IPV6) {
        Some(Family::V6)
    } else {
        None
    }
}

fn expecting_dict(v: Option<&Value>) -> RuleError {
    RuleError(format!(
        "failed to parse host-local IPAM data; was expecting a dict, not: {}",
        show(v)
    ))
}

/// Replaces a placeholder `subnet` of one IPAM dict; true if there was one.
fn rewrite_subnet(
    dict: &mut Map<String, Value>,
    cidr_for: &mut impl FnMut(Family) -> Result<String, RuleError>,
) -> Result<bool, RuleError> {
    let Some(family) = placeholder(dict.get("subnet")) else {
        return Ok(false);
    };
    let cidr = cidr_for(family)?;
    dict.insert("subnet".to_string(), Value::String(cidr));
    Ok(true)
}

/// Walks `ipam.subnet` then every `ipam.ranges[][].subnet` in order,
/// replacing placeholders through `cidr_for`. True if any was found.
fn rewrite_pod_cidrs(
    conf: &mut Value,
    cidr_for: &mut impl FnMut(Family) -> Result<String, RuleError>,
) -> Result<bool, RuleError> {
    let ipam = match conf.get_mut("ipam") {
        Some(Value::Object(ipam)) => ipam,
        other => return Err(expecting_dict(other.map(|v| &*v))),
    };
    let mut used = rewrite_subnet(ipam, cidr_for)?;
    match ipam.get_mut("ranges") {
        None | Some(Value::Null) => {}
        Some(Value::Array(range_sets)) => {
            for range_set in range_sets {
                let Value::Array(ranges) = range_set else {
                    return Err(RuleError(format!(
                        "failed to parse host-local IPAM range set; was expecting a list, not: {range_set}"
                    )));
                };
                for range in ranges {
                    let Value::Object(range) = range else {
                        return Err(expecting_dict(Some(range)));
                    };
                    used |= rewrite_subnet(range, cidr_for)?;
                }
            }
        }
        Some(other) => {
            return Err(RuleError(format!(
                "failed to parse host-local IPAM ranges section; was expecting a list, not: {other}"
            )));
        }
    }
    Ok(used)
}

/// Whether `ipam.subnet` or any `ipam.ranges[][].subnet` is `usePodCidr` or
/// `usePodCidrIPv6` (any case), i.e. whether the Node's pod CIDRs must be
/// fetched before [`substitute_pod_cidrs`]. A malformed structure gives
/// false; [`substitute_pod_cidrs`] then reports it.
pub fn needs_pod_cidrs(conf: &Value) -> bool {
    let Some(ipam) = conf.get("ipam").and_then(Value::as_object) else {
        return false;
    };
    if placeholder(ipam.get("subnet")).is_some() {
        return true;
    }
    ipam.get("ranges")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_array)
        .flatten()
        .any(|range| placeholder(range.get("subnet")).is_some())
}

/// The node's pod CIDRs split by family, as given in `spec.podCIDRs`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct PodCidrs {
    v4: Option<String>,
    v6: Option<String>,
}

fn split_pod_cidrs(pod_cidrs: &[String], node: &str) -> Result<PodCidrs, RuleError> {
    if pod_cidrs.is_empty() {
        return Err(RuleError(format!("no podCidr for node {node}")));
    }
    let mut split = PodCidrs::default();
    for cidr in pod_cidrs {
        match parse_cidr(cidr)? {
            IpNet::V4(_) => split.v4 = Some(cidr.clone()),
            IpNet::V6(_) => split.v6 = Some(cidr.clone()),
        }
    }
    if pod_cidrs.len() > 1 && (split.v4.is_none() || split.v6.is_none()) {
        return Err(RuleError::new(
            "ClusterCIDR contains two ranges of the same type",
        ));
    }
    Ok(split)
}

/// ADD, `ipam.type == "host-local"`: replaces `usePodCidr` / `usePodCidrIPv6`
/// (case-insensitive) in `ipam.subnet` and every `ipam.ranges[][].subnet`
/// with the node's IPv4 / IPv6 pod CIDR from `pod_cidrs` (the Node's
/// `spec.podCIDRs`). Returns whether any placeholder was found; the pod
/// CIDRs are only examined (and so only need fetching) when one is, see
/// [`needs_pod_cidrs`]. `node` names the node in errors.
pub fn substitute_pod_cidrs(
    conf: &mut Value,
    pod_cidrs: &[String],
    node: &str,
) -> Result<bool, RuleError> {
    let split = split_pod_cidrs(pod_cidrs, node);
    rewrite_pod_cidrs(conf, &mut |family| {
        let split = split.as_ref().map_err(Clone::clone)?;
        match family {
            Family::V4 => split.v4.clone().ok_or_else(|| {
                RuleError::new("usePodCidr found but there is no IPv4 CIDR configured")
            }),
            Family::V6 => split.v6.clone().ok_or_else(|| {
                RuleError::new("usePodCidrIPv6 found but there is no IPv6 CIDR configured")
            }),
        }
    })
}

/// DEL (and release-on-failure), `ipam.type == "host-local"`: replaces
/// `usePodCidr` by `0.0.0.0/0` and `usePodCidrIPv6` by `::/0` so host-local
/// accepts the config; it releases by container ID, so any valid CIDR does.
/// A malformed structure is left for the IPAM plugin to report.
pub fn release_pod_cidrs(conf: &mut Value) {
    let _ = rewrite_pod_cidrs(conf, &mut |family| {
        Ok(match family {
            Family::V4 => "0.0.0.0/0".to_string(),
            Family::V6 => "::/0".to_string(),
        })
    });
}

/// Calico's default container routes for the address families present.
pub fn default_routes(has_v4: bool, has_v6: bool) -> Vec<IpNet> {
    let mut routes = Vec::new();
    if has_v4 {
        routes.push(IpNet::from_str("0.0.0.0/0").expect("valid CIDR"));
    }
    if has_v6 {
        routes.push(IpNet::from_str("::/0").expect("valid CIDR"));
    }
    routes
}

/// The container routes for `ipam.type == "host-local"` (§4.3 steps 3-4):
/// every `ipam.routes[].dst` (as its network; the gateway is ignored) or,
/// when there are none, the default routes for the families present. With
/// `include_default_routes` the defaults are prepended to custom routes.
/// For other IPAM types use [`default_routes`].
pub fn container_routes(
    conf: &Value,
    include_default_routes: bool,
    has_v4: bool,
    has_v6: bool,
) -> Result<Vec<IpNet>, RuleError> {
    let ipam = match conf.get("ipam") {
        Some(Value::Object(ipam)) => ipam,
        other => return Err(expecting_dict(other)),
    };
    let mut custom = Vec::new();
    match ipam.get("routes") {
        None | Some(Value::Null) => {}
        Some(Value::Array(entries)) => {
            for entry in entries {
                let Value::Object(route) = entry else {
                    return Err(RuleError(format!(
                        "invalid IPAM routes section; expecting each route to be a dict, not: {entry}"
                    )));
                };
                let Some(dst) = route.get("dst") else {
                    continue;
                };
                let Value::String(dst) = dst else {
                    return Err(RuleError(format!(
                        "invalid IPAM routes section; expecting 'dst' to be a string, not: {dst}"
                    )));
                };
                custom.push(parse_cidr(dst)?.trunc());
            }
        }
        Some(other) => {
            return Err(RuleError(format!(
                "failed to parse host-local IPAM routes section; expecting list, not: {other}"
            )));
        }
    }
    if custom.is_empty() || include_default_routes {
        let mut routes = default_routes(has_v4, has_v6);
        routes.extend(custom);
        Ok(routes)
    } else {
        Ok(custom)
    }
}

// ---------------------------------------------------------------------------
// Annotations
// ---------------------------------------------------------------------------

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

/// §4.3 step 6 (policy `k8s` with `calico-ipam` only): the
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

/// Where a pod's addresses come from (§4.3 step 7).
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

/// §4.3 step 7: the address source chosen by the pod's `ipAddrs` /
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

/// §4.5: the container MAC requested by `cni.projectcalico.org/hwAddr`, if
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

/// §4.3 step 13: `cni.projectcalico.org/allowedSourcePrefixes`, each CIDR
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

/// §4.3 step 14: `cni.projectcalico.org/floatingIPs` as NAT mappings, in
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

// ---------------------------------------------------------------------------
// Pod -> WorkloadEndpoint (§4.3 step 5, §4.6) and the KDD patch (§6.1)
// ---------------------------------------------------------------------------

/// §4.6: a container port that is named or bound to a host port, with a
/// TCP (also for an empty protocol), UDP or SCTP protocol.
fn endpoint_ports(containers: &[Container]) -> impl Iterator<Item = EndpointPort> + '_ {
    containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = u16::try_from(p.container_port).ok().filter(|&n| n != 0)?;
            let host_port = u16::try_from(p.host_port.unwrap_or(0)).ok()?;
            let name = p.name.clone().unwrap_or_default();
            if host_port == 0 && name.is_empty() {
                return None;
            }
            let protocol = match p.protocol.as_deref().unwrap_or("") {
                "" | "TCP" => "TCP",
                "UDP" => "UDP",
                "SCTP" => "SCTP",
                _ => return None,
            };
            Some(EndpointPort {
                name,
                protocol: protocol.to_string(),
                port,
                host_port,
                host_ip: p.host_ip.clone().unwrap_or_default(),
            })
        })
}

/// The WorkloadEndpoint of a Kubernetes pod on `node` with interface
/// `endpoint` (§4.3 step 5 and 8): name, namespace, labels (pod labels plus
/// namespace, orchestrator and service-account labels), generateName, the
/// pod's annotations, and spec orchestrator/node/pod/endpoint,
/// serviceAccountName, profiles (`kns.<ns>`, `ksa.<ns>.<sa>`), ports and the
/// host-side interface name (`interface_prefix` = `FELIX_INTERFACEPREFIX`).
/// The caller fills in ipNetworks, mac and containerID. The name is left
/// empty if the identifiers cannot form one (the caller has already built
/// and validated the same name).
pub fn endpoint_for_pod(
    pod: &Pod,
    node: &str,
    endpoint: &str,
    interface_prefix: Option<&str>,
) -> WorkloadEndpoint {
    let meta = &pod.metadata;
    let namespace = meta.namespace.clone().unwrap_or_default();
    let pod_name = meta.name.clone().unwrap_or_default();
    let spec = pod.spec.as_ref();
    let service_account = spec
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_default();

    let name = WepIdentifiers {
        node: node.to_string(),
        orchestrator: ORCHESTRATOR_K8S.to_string(),
        endpoint: endpoint.to_string(),
        pod: pod_name.clone(),
        ..WepIdentifiers::default()
    }
    .name()
    .unwrap_or_default();
    let mut wep = WorkloadEndpoint::new(&namespace, &name);

    let mut labels = meta.labels.clone().unwrap_or_default();
    labels.insert(LABEL_NAMESPACE.to_string(), namespace.clone());
    labels.insert(LABEL_ORCHESTRATOR.to_string(), ORCHESTRATOR_K8S.to_string());
    if !service_account.is_empty() && service_account.len() < MAX_SERVICE_ACCOUNT_LABEL_LEN {
        labels.insert(LABEL_SERVICE_ACCOUNT.to_string(), service_account.clone());
    }
    wep.metadata.labels = labels;
    wep.metadata.generate_name = meta.generate_name.clone().unwrap_or_default();
    wep.metadata.annotations = meta.annotations.clone().unwrap_or_default();

    let mut profiles = vec![format!("kns.{namespace}")];
    if !service_account.is_empty() {
        profiles.push(format!("ksa.{namespace}.{service_account}"));
    }
    let ports = spec.map_or_else(Vec::new, |s| {
        endpoint_ports(&s.containers)
            .chain(endpoint_ports(s.init_containers.as_deref().unwrap_or(&[])))
            .collect()
    });

    let s = &mut wep.spec;
    s.orchestrator = ORCHESTRATOR_K8S.to_string();
    s.node = node.to_string();
    s.pod = pod_name.clone();
    s.endpoint = endpoint.to_string();
    s.service_account_name = service_account;
    s.profiles = profiles;
    s.ports = ports;
    s.interface_name = veth_name_for_workload(&namespace, &pod_name, interface_prefix);
    wep
}

/// §6.1: the strategic-merge patch body for the pod's `status` subresource
/// recording its addresses (`podIP` = the first, `podIPs` = all joined by
/// `,`) and, when non-empty, the container ID. No addresses -> no
/// annotations at all.
pub fn pod_ip_annotations(ip_networks: &[String], container_id: &str) -> Value {
    let mut annotations = Map::new();
    if let Some(first) = ip_networks.first() {
        annotations.insert(ANNOTATION_POD_IP.to_string(), json!(first));
        annotations.insert(ANNOTATION_POD_IPS.to_string(), json!(ip_networks.join(",")));
        if !container_id.is_empty() {
            annotations.insert(ANNOTATION_CONTAINER_ID.to_string(), json!(container_id));
        }
    }
    json!({ "metadata": { "annotations": annotations } })
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;
    use crate::datastore::model::WorkloadEndpointSpec;

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

    fn cidrs(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    // -- errors -----------------------------------------------------------

    #[test]
    fn rule_error_becomes_invalid_config() {
        let e: crate::cni::Error = RuleError::new("bad thing").into();
        assert!(matches!(&e, crate::cni::Error::InvalidConfig(m) if m == "bad thing"));
        assert_eq!(e.to_string(), "bad thing");
    }

    // -- usePodCidr (§11 item 35) -------------------------------------------

    fn host_local(ipam: Value) -> Value {
        json!({
            "cniVersion": "0.3.1",
            "name": "net10",
            "type": "calico",
            "unknownTopLevel": {"keep": [1, 2]},
            "ipam": ipam
        })
    }

    #[test]
    fn single_subnet_use_pod_cidr() {
        let mut conf = host_local(json!({"type": "host-local", "subnet": "usePodCidr", "x": 1}));
        assert!(needs_pod_cidrs(&conf));
        let used = substitute_pod_cidrs(&mut conf, &cidrs(&["10.0.0.0/24"]), "node1").unwrap();
        assert!(used);
        assert_eq!(
            conf,
            host_local(json!({"type": "host-local", "subnet": "10.0.0.0/24", "x": 1}))
        );
    }

    #[test]
    fn placeholders_are_case_insensitive() {
        let mut conf = host_local(json!({
            "type": "host-local",
            "ranges": [[{"subnet": "USEPODCIDR"}], [{"subnet": "usepodcidripv6"}]]
        }));
        assert!(needs_pod_cidrs(&conf));
        substitute_pod_cidrs(&mut conf, &cidrs(&["10.10.0.0/24", "dead:beef::/96"]), "n").unwrap();
        assert_eq!(conf["ipam"]["ranges"][0][0]["subnet"], "10.10.0.0/24");
        assert_eq!(conf["ipam"]["ranges"][1][0]["subnet"], "dead:beef::/96");
    }

    #[test]
    fn dual_stack_ranges_use_pod_cidrs() {
        let mut conf = host_local(json!({
            "type": "host-local",
            "ranges": [
                [{"subnet": "usePodCidr", "gateway": "10.10.0.1"}],
                [{"subnet": "10.100.0.0/24"}],
                [{"subnet": "usePodCidrIPv6", "extra": true}]
            ],
            "routes": [{"dst": "0.0.0.0/0"}]
        }));
        let used = substitute_pod_cidrs(
            &mut conf,
            &cidrs(&["10.10.0.0/24", "dead:beef::/96"]),
            "node1",
        )
        .unwrap();
        assert!(used);
        assert_eq!(
            conf,
            host_local(json!({
                "type": "host-local",
                "ranges": [
                    [{"subnet": "10.10.0.0/24", "gateway": "10.10.0.1"}],
                    [{"subnet": "10.100.0.0/24"}],
                    [{"subnet": "dead:beef::/96", "extra": true}]
                ],
                "routes": [{"dst": "0.0.0.0/0"}]
            }))
        );
        // Order of podCIDRs does not matter.
        let mut conf2 = host_local(json!({
            "type": "host-local",
            "subnet": "usePodCidrIPv6",
            "ranges": [[{"subnet": "usePodCidr"}]]
        }));
        substitute_pod_cidrs(&mut conf2, &cidrs(&["dead:beef::/96", "10.10.0.0/24"]), "n").unwrap();
        assert_eq!(conf2["ipam"]["subnet"], "dead:beef::/96");
        assert_eq!(conf2["ipam"]["ranges"][0][0]["subnet"], "10.10.0.0/24");
    }

    #[test]
    fn no_placeholder_needs_no_pod_cidrs() {
        let original = host_local(json!({
            "type": "host-local",
            "subnet": "10.0.0.0/8",
            "ranges": [[{"subnet": "10.1.0.0/16"}, {"rangeStart": "x"}]]
        }));
        let mut conf = original.clone();
        assert!(!needs_pod_cidrs(&conf));
        // Empty pod CIDRs are fine when nothing asks for them.
        assert!(!substitute_pod_cidrs(&mut conf, &[], "node1").unwrap());
        assert_eq!(conf, original);
        // A non-string subnet is ignored.
        let mut conf = host_local(json!({"type": "host-local", "subnet": 5}));
        assert!(!substitute_pod_cidrs(&mut conf, &[], "n").unwrap());
    }

    #[test]
    fn pod_cidr_errors() {
        let v4 = host_local(json!({"type": "host-local", "subnet": "usePodCidr"}));
        let v6 = host_local(json!({"type": "host-local", "subnet": "usePodCidrIPv6"}));

        assert_eq!(
            err(substitute_pod_cidrs(&mut v4.clone(), &[], "node1")),
            "no podCidr for node node1"
        );
        assert_eq!(
            err(substitute_pod_cidrs(
                &mut v4.clone(),
                &cidrs(&["10.0.0.0/24", "10.1.0.0/24"]),
                "n"
            )),
            "ClusterCIDR contains two ranges of the same type"
        );
        assert_eq!(
            err(substitute_pod_cidrs(
                &mut v6.clone(),
                &cidrs(&["fd00::/64", "fd01::/64"]),
                "n"
            )),
            "ClusterCIDR contains two ranges of the same type"
        );
        assert_eq!(
            err(substitute_pod_cidrs(
                &mut v4.clone(),
                &cidrs(&["fd00::/64"]),
                "n"
            )),
            "usePodCidr found but there is no IPv4 CIDR configured"
        );
        assert_eq!(
            err(substitute_pod_cidrs(
                &mut v6.clone(),
                &cidrs(&["10.0.0.0/24"]),
                "n"
            )),
            "usePodCidrIPv6 found but there is no IPv6 CIDR configured"
        );
        assert_eq!(
            err(substitute_pod_cidrs(
                &mut v4.clone(),
                &cidrs(&["bogus"]),
                "n"
            )),
            "invalid CIDR address: bogus"
        );
    }

    #[test]
    fn malformed_host_local_structure() {
        let mut conf = json!({"ipam": "nope"});
        assert!(!needs_pod_cidrs(&conf));
        assert_eq!(
            err(substitute_pod_cidrs(&mut conf, &[], "n")),
            "failed to parse host-local IPAM data; was expecting a dict, not: \"nope\""
        );
        assert_eq!(
            err(substitute_pod_cidrs(&mut json!({"name": "x"}), &[], "n")),
            "failed to parse host-local IPAM data; was expecting a dict, not: null"
        );
        assert_eq!(
            err(substitute_pod_cidrs(
                &mut host_local(json!({"type": "host-local", "ranges": {"a": 1}})),
                &[],
                "n"
            )),
            "failed to parse host-local IPAM ranges section; was expecting a list, not: {\"a\":1}"
        );
        assert_eq!(
            err(substitute_pod_cidrs(
                &mut host_local(
                    json!({"type": "host-local", "ranges": [{"subnet": "usePodCidr"}]})
                ),
                &[],
                "n"
            )),
            "failed to parse host-local IPAM range set; was expecting a list, not: {\"subnet\":\"usePodCidr\"}"
        );
        assert_eq!(
            err(substitute_pod_cidrs(
                &mut host_local(json!({"type": "host-local", "ranges": [["10.0.0.0/8"]]})),
                &[],
                "n"
            )),
            "failed to parse host-local IPAM data; was expecting a dict, not: \"10.0.0.0/8\""
        );
        // `ranges: null` is the same as no ranges.
        let mut conf = host_local(json!({"type": "host-local", "ranges": null}));
        assert!(!substitute_pod_cidrs(&mut conf, &[], "n").unwrap());
    }

    #[test]
    fn release_rewrites_to_dummy_cidrs() {
        let mut conf = host_local(json!({
            "type": "host-local",
            "subnet": "usePodCidr",
            "ranges": [[{"subnet": "usePODcidr"}], [{"subnet": "usePodCidrIPv6"}], [{"subnet": "10.9.0.0/16"}]]
        }));
        release_pod_cidrs(&mut conf);
        assert_eq!(
            conf,
            host_local(json!({
                "type": "host-local",
                "subnet": "0.0.0.0/0",
                "ranges": [[{"subnet": "0.0.0.0/0"}], [{"subnet": "::/0"}], [{"subnet": "10.9.0.0/16"}]]
            }))
        );
        // Malformed input is left alone.
        let mut bad = json!({"ipam": [1]});
        release_pod_cidrs(&mut bad);
        assert_eq!(bad, json!({"ipam": [1]}));
    }

    // -- container routes (§4.3 steps 3-4, §11 item 35) ---------------------

    #[test]
    fn no_custom_routes_gives_defaults_for_present_families() {
        let conf = host_local(json!({"type": "host-local", "subnet": "10.0.0.0/24"}));
        assert_eq!(
            container_routes(&conf, false, true, false).unwrap(),
            nets(&["0.0.0.0/0"])
        );
        assert_eq!(
            container_routes(&conf, false, true, true).unwrap(),
            nets(&["0.0.0.0/0", "::/0"])
        );
        assert_eq!(
            container_routes(&conf, true, false, true).unwrap(),
            nets(&["::/0"])
        );
        let conf = host_local(json!({"type": "host-local", "routes": [{"gw": "1.2.3.4"}]}));
        assert_eq!(
            container_routes(&conf, false, true, false).unwrap(),
            nets(&["0.0.0.0/0"])
        );
        let conf = host_local(json!({"type": "host-local", "routes": null}));
        assert_eq!(
            container_routes(&conf, false, true, false).unwrap(),
            nets(&["0.0.0.0/0"])
        );
        assert_eq!(default_routes(false, false), Vec::<IpNet>::new());
    }

    #[test]
    fn custom_routes_replace_or_extend_defaults() {
        let conf = host_local(json!({
            "type": "host-local",
            "ranges": [[{"subnet": "usePodCidr"}], [{"subnet": "usePodCidrIPv6"}]],
            "routes": [
                {"dst": "10.123.0.0/16", "gw": "10.123.0.1"},
                {"dst": "10.124.0.0/16"},
                {"dst": "dead:beef::/96"}
            ]
        }));
        assert_eq!(
            container_routes(&conf, false, true, true).unwrap(),
            nets(&["10.123.0.0/16", "10.124.0.0/16", "dead:beef::/96"])
        );
        assert_eq!(
            container_routes(&conf, true, true, true).unwrap(),
            nets(&[
                "0.0.0.0/0",
                "::/0",
                "10.123.0.0/16",
                "10.124.0.0/16",
                "dead:beef::/96"
            ])
        );
        // Destinations are reduced to their network.
        let conf = host_local(json!({"type": "host-local", "routes": [{"dst": "10.123.4.5/16"}]}));
        assert_eq!(
            container_routes(&conf, false, true, false).unwrap(),
            nets(&["10.123.0.0/16"])
        );
    }

    #[test]
    fn route_errors() {
        let with_routes =
            |routes: Value| host_local(json!({"type": "host-local", "routes": routes}));
        assert_eq!(
            err(container_routes(
                &with_routes(json!({"dst": "1.0.0.0/8"})),
                false,
                true,
                false
            )),
            "failed to parse host-local IPAM routes section; expecting list, not: {\"dst\":\"1.0.0.0/8\"}"
        );
        assert_eq!(
            err(container_routes(
                &with_routes(json!([{"dst": 42}])),
                false,
                true,
                false
            )),
            "invalid IPAM routes section; expecting 'dst' to be a string, not: 42"
        );
        assert_eq!(
            err(container_routes(
                &with_routes(json!([{"dst": "10.0.0.0/33"}])),
                false,
                true,
                false
            )),
            "invalid CIDR address: 10.0.0.0/33"
        );
        assert_eq!(
            err(container_routes(
                &with_routes(json!([{"dst": "10.0.0.1"}])),
                false,
                true,
                false
            )),
            "invalid CIDR address: 10.0.0.1"
        );
        assert_eq!(
            err(container_routes(
                &with_routes(json!(["10.0.0.0/8"])),
                false,
                true,
                false
            )),
            "invalid IPAM routes section; expecting each route to be a dict, not: \"10.0.0.0/8\""
        );
        assert_eq!(
            err(container_routes(&json!({"ipam": 3}), false, true, false)),
            "failed to parse host-local IPAM data; was expecting a dict, not: 3"
        );
    }

    // -- pool annotations (§4.3 step 6, §11 item 36) ------------------------

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

    // -- address source (§4.3 step 7, §11 item 39) --------------------------

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

    // -- hwAddr (§4.5, §11 item 40) -----------------------------------------

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

    // -- allowedSourcePrefixes (§4.3 step 13, §11 item 37) -------------------

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

    // -- floatingIPs (§4.3 step 14, §11 item 38) -----------------------------

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

    // -- Pod -> WorkloadEndpoint (§4.6, §11 items 14, 15, 33) ----------------

    fn pod(value: Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn pod_without_service_account() {
        let p = pod(json!({
            "metadata": {
                "name": "podA",
                "namespace": "default",
                "resourceVersion": "1234",
                "labels": {"labelA": "valueA", "labelB": "valueB"},
                "annotations": {"arbitrary": "annotation"}
            },
            "spec": {"nodeName": "nodeA", "containers": [{"name": "c"}]},
            "status": {"podIP": "192.168.0.1"}
        }));
        let mut wep = endpoint_for_pod(&p, "nodeA", "eth0", None);
        assert_eq!(wep.metadata.name, "nodeA-k8s-podA-eth0");
        assert_eq!(wep.metadata.namespace, "default");
        assert_eq!(
            wep.metadata.labels,
            ann(&[
                ("labelA", "valueA"),
                ("labelB", "valueB"),
                ("projectcalico.org/namespace", "default"),
                ("projectcalico.org/orchestrator", "k8s"),
            ])
        );
        assert_eq!(
            wep.metadata.annotations,
            ann(&[("arbitrary", "annotation")])
        );
        assert_eq!(wep.spec.profiles, ["kns.default"]);
        assert_eq!(wep.spec.interface_name, "cali7f94ce7c295");
        assert!(wep.spec.ports.is_empty());
        assert!(wep.spec.service_account_name.is_empty());

        // The caller completes it.
        wep.spec.ip_networks = vec!["192.168.0.1/32".into()];
        assert_eq!(
            wep.spec,
            WorkloadEndpointSpec {
                orchestrator: "k8s".into(),
                node: "nodeA".into(),
                pod: "podA".into(),
                endpoint: "eth0".into(),
                ip_networks: vec!["192.168.0.1/32".into()],
                profiles: vec!["kns.default".into()],
                interface_name: "cali7f94ce7c295".into(),
                ..Default::default()
            }
        );
    }

    #[test]
    fn pod_with_service_account_and_named_port() {
        let p = pod(json!({
            "metadata": {
                "name": "testpod",
                "generateName": "testpod-",
                "namespace": "test"
            },
            "spec": {
                "serviceAccountName": "default",
                "containers": [{
                    "name": "c",
                    "ports": [{"name": "anamedport", "containerPort": 555}]
                }]
            }
        }));
        let wep = endpoint_for_pod(&p, "node-1", "eth0", Some("eni,veth"));
        assert_eq!(wep.metadata.name, "node--1-k8s-testpod-eth0");
        assert_eq!(wep.metadata.generate_name, "testpod-");
        assert_eq!(
            wep.metadata.labels,
            ann(&[
                ("projectcalico.org/namespace", "test"),
                ("projectcalico.org/orchestrator", "k8s"),
                ("projectcalico.org/serviceaccount", "default"),
            ])
        );
        assert_eq!(wep.spec.profiles, ["kns.test", "ksa.test.default"]);
        assert_eq!(wep.spec.service_account_name, "default");
        assert_eq!(
            wep.spec.ports,
            [EndpointPort {
                name: "anamedport".into(),
                protocol: "TCP".into(),
                port: 555,
                ..Default::default()
            }]
        );
        assert!(wep.spec.interface_name.starts_with("eni"));
        assert_eq!(wep.spec.interface_name.len(), 14);

        let p2 = pod(json!({
            "metadata": {"name": "p", "namespace": "test"},
            "spec": {"serviceAccountName": "testserviceaccount", "containers": []}
        }));
        let wep = endpoint_for_pod(&p2, "n", "eth0", None);
        assert_eq!(
            wep.spec.profiles,
            ["kns.test", "ksa.test.testserviceaccount"]
        );
    }

    #[test]
    fn long_service_account_gets_no_label() {
        let sa62 = "a".repeat(62);
        let sa63 = "a".repeat(63);
        let with_sa = |sa: &str| {
            pod(json!({
                "metadata": {"name": "p", "namespace": "ns"},
                "spec": {"serviceAccountName": sa, "containers": []}
            }))
        };
        let wep = endpoint_for_pod(&with_sa(&sa62), "n", "eth0", None);
        assert_eq!(wep.metadata.labels[LABEL_SERVICE_ACCOUNT], sa62);
        let wep = endpoint_for_pod(&with_sa(&sa63), "n", "eth0", None);
        assert!(!wep.metadata.labels.contains_key(LABEL_SERVICE_ACCOUNT));
        assert_eq!(wep.spec.profiles[1], format!("ksa.ns.{sa63}"));
    }

    #[test]
    fn forced_labels_override_pod_labels() {
        let p = pod(json!({
            "metadata": {
                "name": "p",
                "namespace": "ns",
                "labels": {"projectcalico.org/namespace": "other", "projectcalico.org/orchestrator": "x"}
            },
            "spec": {"containers": []}
        }));
        let wep = endpoint_for_pod(&p, "n", "eth0", None);
        assert_eq!(wep.metadata.labels[LABEL_NAMESPACE], "ns");
        assert_eq!(wep.metadata.labels[LABEL_ORCHESTRATOR], "k8s");
    }

    #[test]
    fn ports_conversion() {
        let p = pod(json!({
            "metadata": {"name": "podA", "namespace": "default"},
            "spec": {
                "containers": [
                    {"name": "c1", "ports": [
                        {"containerPort": 500, "hostPort": 5000},
                        {"name": "udp-port", "containerPort": 600, "protocol": "UDP"},
                        {"name": "sctp-port", "containerPort": 700, "protocol": "SCTP", "hostIP": "10.1.1.1", "hostPort": 7000},
                        {"name": "unkn", "containerPort": 800, "protocol": "unknown"},
                        {"name": "lower", "containerPort": 801, "protocol": "udp"},
                        {"containerPort": 900},
                        {"name": "zero", "containerPort": 0}
                    ]},
                    {"name": "c2", "ports": [{"name": "tcp-port", "containerPort": 1000, "protocol": "TCP"}]}
                ],
                "initContainers": [
                    {"name": "i1", "ports": [{"name": "init-port", "containerPort": 1100}]}
                ]
            }
        }));
        let port =
            |name: &str, protocol: &str, port: u16, host_port: u16, host_ip: &str| EndpointPort {
                name: name.into(),
                protocol: protocol.into(),
                port,
                host_port,
                host_ip: host_ip.into(),
            };
        assert_eq!(
            endpoint_for_pod(&p, "nodeA", "eth0", None).spec.ports,
            [
                port("", "TCP", 500, 5000, ""),
                port("udp-port", "UDP", 600, 0, ""),
                port("sctp-port", "SCTP", 700, 7000, "10.1.1.1"),
                port("tcp-port", "TCP", 1000, 0, ""),
                port("init-port", "TCP", 1100, 0, ""),
            ]
        );
    }

    #[test]
    fn pod_without_spec() {
        let p = pod(json!({"metadata": {"name": "p", "namespace": "ns"}}));
        let wep = endpoint_for_pod(&p, "n", "eth0", None);
        assert_eq!(wep.metadata.name, "n-k8s-p-eth0");
        assert_eq!(wep.spec.profiles, ["kns.ns"]);
        assert!(wep.spec.ports.is_empty());
        assert!(wep.metadata.annotations.is_empty());
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

    // -- KDD patch body (§6.1, §11 item 39) ---------------------------------

    #[test]
    fn pod_ip_patch() {
        assert_eq!(
            pod_ip_annotations(&["20.0.0.111/32".into()], "abc123"),
            json!({"metadata": {"annotations": {
                "cni.projectcalico.org/podIP": "20.0.0.111/32",
                "cni.projectcalico.org/podIPs": "20.0.0.111/32",
                "cni.projectcalico.org/containerID": "abc123"
            }}})
        );
        assert_eq!(
            pod_ip_annotations(&["20.0.0.7/32".into(), "fd80:20::7/128".into()], ""),
            json!({"metadata": {"annotations": {
                "cni.projectcalico.org/podIP": "20.0.0.7/32",
                "cni.projectcalico.org/podIPs": "20.0.0.7/32,fd80:20::7/128"
            }}})
        );
        assert_eq!(
            pod_ip_annotations(&[], "abc123"),
            json!({"metadata": {"annotations": {}}})
        );
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
