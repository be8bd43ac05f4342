//! host-local special-casing (calico-behaviour.md §4.3 steps 3-4, §9.1): the `usePodCidr` /
//! `usePodCidrIPv6` placeholders replaced by the Node's pod CIDRs (and by
//! dummy CIDRs for a release), and the container routes a host-local config
//! asks for. Pure: the caller fetches the Node. The functions work on the
//! raw stdin JSON so keys this crate does not model round-trip untouched.

use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::{Map, Value};

use crate::cni::rule_error::{RuleError, parse_cidr, show};
use crate::dataplane::routes::default_routes;

/// `ipam.subnet` placeholder for the node's IPv4 pod CIDR.
pub const USE_POD_CIDR: &str = "usePodCidr";
/// `ipam.subnet` placeholder for the node's IPv6 pod CIDR.
pub const USE_POD_CIDR_IPV6: &str = "usePodCidrIPv6";

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

/// Replaces a placeholder `subnet` of one IPAM dict (or range); true if
/// there was one.
fn rewrite_subnet(
    dict: &mut Map<String, Value>,
    cidr_for: &mut impl FnMut(Family, &Map<String, Value>) -> Result<String, RuleError>,
) -> Result<bool, RuleError> {
    let Some(family) = placeholder(dict.get("subnet")) else {
        return Ok(false);
    };
    let cidr = cidr_for(family, dict)?;
    dict.insert("subnet".to_string(), Value::String(cidr));
    Ok(true)
}

/// Walks `ipam.subnet` then every `ipam.ranges[][].subnet` in order,
/// replacing placeholders through `cidr_for`. True if any was found.
fn rewrite_pod_cidrs(
    conf: &mut Value,
    cidr_for: &mut impl FnMut(Family) -> Result<String, RuleError>,
) -> Result<bool, RuleError> {
    rewrite_pod_cidrs_in(conf, &mut |family, _| cidr_for(family))
}

/// [`rewrite_pod_cidrs`], `cidr_for` also given the range (or the IPAM
/// dict) whose subnet it replaces.
fn rewrite_pod_cidrs_in(
    conf: &mut Value,
    cidr_for: &mut impl FnMut(Family, &Map<String, Value>) -> Result<String, RuleError>,
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

/// DEL, CHECK and the release of a failed ADD, `ipam.type == "host-local"`:
/// each `usePodCidr` / `usePodCidrIPv6` replaced by a CIDR of its family
/// that host-local accepts, without asking the API server for the Node's
/// pod CIDRs (DEL must work while it is down). host-local releases (and
/// checks) by container ID in its data directory, so any valid range does,
/// as long as the config stays valid: Calico's `0.0.0.0/0` and `::/0`
/// overlap every other range of the config, which current host-local
/// refuses ("range set 0 overlaps with 1", and the address is never
/// released). So each placeholder becomes the largest block that contains
/// its own `rangeStart`/`rangeEnd` and overlaps no other range of the
/// config (its other range sets, its `runtimeConfig.ipRanges`, the other
/// placeholders' choices): `0.0.0.0/0` when nothing else is configured,
/// `128.0.0.0/1` beside `10.9.0.0/16`. A malformed structure is left for
/// the IPAM plugin to report.
pub fn release_pod_cidrs(conf: &mut Value) {
    let mut taken = fixed_subnets(conf);
    let _ = rewrite_pod_cidrs_in(conf, &mut |family, range| {
        let anchors: Vec<IpAddr> = ["rangeStart", "rangeEnd"]
            .iter()
            .filter_map(|k| range.get(*k)?.as_str()?.parse().ok())
            .collect();
        let block = free_block(family, &anchors, &taken).unwrap_or(match family {
            Family::V4 => IpNet::V4(Default::default()),
            Family::V6 => IpNet::V6(Default::default()),
        });
        taken.push(block);
        Ok(block.to_string())
    });
}

/// Every literal subnet of the config's ranges (and runtime ranges).
fn fixed_subnets(conf: &Value) -> Vec<IpNet> {
    let subnet = |r: &Value| -> Option<IpNet> {
        let s = r.get("subnet")?.as_str()?;
        if placeholder(Some(&Value::String(s.into()))).is_some() {
            return None;
        }
        s.parse::<IpNet>().ok().map(|n| n.trunc())
    };
    let sets = |v: Option<&Value>| -> Vec<IpNet> {
        v.and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_array)
            .flatten()
            .filter_map(subnet)
            .collect()
    };
    let mut out = Vec::new();
    if let Some(ipam) = conf.get("ipam") {
        out.extend(subnet(ipam));
        out.extend(sets(ipam.get("ranges")));
    }
    out.extend(sets(
        conf.get("runtimeConfig").and_then(|r| r.get("ipRanges")),
    ));
    out
}

fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// The largest block of `family` (the first in address order among
/// equals) that holds every anchor, overlaps nothing in `taken` and still
/// has addresses to allocate for host-local (at most /30, /126).
fn free_block(family: Family, anchors: &[IpAddr], taken: &[IpNet]) -> Option<IpNet> {
    let (root, longest) = match family {
        Family::V4 => (IpNet::V4(Default::default()), 30),
        Family::V6 => (IpNet::V6(Default::default()), 126),
    };
    let holds_anchors = |n: &IpNet| anchors.iter().all(|a| n.contains(a));
    let mut level = vec![root];
    for _ in 0..=longest {
        if let Some(free) = level
            .iter()
            .find(|n| holds_anchors(n) && !taken.iter().any(|t| overlaps(t, n)))
        {
            return Some(*free);
        }
        // Only blocks that are partly taken are worth splitting: a level
        // holds at most two per taken subnet.
        level = level
            .iter()
            .filter_map(|n| n.subnets(n.prefix_len() + 1).ok())
            .flatten()
            .filter(|n| holds_anchors(n) && !taken.iter().any(|t| t.contains(n)))
            .collect();
        if level.is_empty() {
            return None;
        }
    }
    None
}

/// The container routes for `ipam.type == "host-local"` (calico-behaviour.md §4.3 steps 3-4):
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn err<T: std::fmt::Debug>(r: Result<T, RuleError>) -> String {
        r.unwrap_err().to_string()
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn cidrs(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    // -- usePodCidr (calico-behaviour.md §11 item 35) -------------------------------------------

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
    fn release_placeholders_overlap_nothing_else() {
        let release = |ipam: Value| {
            let mut conf = host_local(ipam);
            release_pod_cidrs(&mut conf);
            conf["ipam"].clone()
        };
        // Alone, the whole family (Calico's choice).
        assert_eq!(
            release(json!({"type": "host-local", "subnet": "usePodCidr"}))["subnet"],
            "0.0.0.0/0"
        );
        assert_eq!(
            release(
                json!({"type": "host-local", "ranges": [[{"subnet": "usePodCidr"}], [{"subnet": "usePodCidrIPv6"}]]})
            ),
            json!({"type": "host-local", "ranges": [[{"subnet": "0.0.0.0/0"}], [{"subnet": "::/0"}]]})
        );
        // Beside other ranges and each other: disjoint blocks.
        assert_eq!(
            release(json!({
                "type": "host-local",
                "subnet": "usePodCidr",
                "ranges": [[{"subnet": "usePODcidr"}], [{"subnet": "usePodCidrIPv6"}], [{"subnet": "10.9.0.0/16"}]]
            })),
            json!({
                "type": "host-local",
                "subnet": "128.0.0.0/1",
                "ranges": [[{"subnet": "64.0.0.0/2"}], [{"subnet": "::/0"}], [{"subnet": "10.9.0.0/16"}]]
            })
        );
        // A placeholder's own rangeStart/rangeEnd stay inside its block.
        let out = release(json!({
            "type": "host-local",
            "ranges": [
                [{"subnet": "usePodCidr", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.20"}],
                [{"subnet": "10.0.1.0/24"}],
                [{"subnet": "fd00::/64"}, {"subnet": "usePodCidrIPv6", "rangeStart": "fd00:0:0:1::5"}]
            ],
            "runtimeConfig": {}
        }));
        assert_eq!(out["ranges"][0][0]["subnet"], "10.0.0.0/24");
        assert_eq!(out["ranges"][2][1]["subnet"], "fd00:0:0:1::/64");
        // Runtime ranges are avoided too.
        let mut conf = host_local(json!({"type": "host-local", "subnet": "usePodCidr"}));
        conf["runtimeConfig"] = json!({"ipRanges": [[{"subnet": "0.0.0.0/1"}]]});
        release_pod_cidrs(&mut conf);
        assert_eq!(conf["ipam"]["subnet"], "128.0.0.0/1");
        // Malformed input is left alone.
        let mut bad = json!({"ipam": [1]});
        release_pod_cidrs(&mut bad);
        assert_eq!(bad, json!({"ipam": [1]}));
    }

    #[test]
    fn free_blocks() {
        let nets = |l: &[&str]| -> Vec<IpNet> { l.iter().map(|s| s.parse().unwrap()).collect() };
        assert_eq!(
            free_block(Family::V4, &[], &nets(&["0.0.0.0/1", "128.0.0.0/1"])),
            None
        );
        assert_eq!(
            free_block(
                Family::V4,
                &["10.1.2.3".parse().unwrap()],
                &nets(&["10.1.2.0/25"])
            ),
            None
        );
        assert_eq!(
            free_block(
                Family::V4,
                &["10.1.2.200".parse().unwrap()],
                &nets(&["10.1.2.0/25"])
            ),
            Some("10.1.2.128/25".parse().unwrap())
        );
        // The smallest host-local accepts is a /30.
        assert_eq!(
            free_block(
                Family::V4,
                &["10.0.0.1".parse().unwrap()],
                &nets(&["10.0.0.0/31"])
            ),
            None
        );
        assert_eq!(
            free_block(Family::V6, &[], &nets(&["::/1"])),
            Some("8000::/1".parse().unwrap())
        );
    }

    // -- container routes (calico-behaviour.md §4.3 steps 3-4, §11 item 35) ---------------------

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
}
