//! Which pools an allocation may use (calico-behaviour.md §10.3): the
//! requested ones (by CIDR or name, all present and enabled), else the
//! enabled Automatic pools of the family whose nodeSelector and
//! namespaceSelector match; and the order in which a host walks a pool's
//! blocks (from an index derived from the host name, so hosts spread out).

use std::collections::BTreeMap;

use ipnet::IpNet;

use super::IpamError;
use super::selector::Selector;
use crate::datastore::ipam_model::IpPool;

/// The pool use this plugin allocates for.
pub const USE_WORKLOAD: &str = "Workload";

/// The family's pools named (by CIDR or by name) in `requested`.
pub fn requested_pools(
    all: &[IpPool],
    requested: &[String],
    v6: bool,
) -> Result<Vec<IpPool>, IpamError> {
    let mut out = Vec::new();
    for entry in requested {
        let by_name = all.iter().find(|p| p.metadata.name == *entry);
        let cidr = match (entry.parse::<IpNet>(), by_name) {
            (Ok(net), _) => net.trunc(),
            (Err(_), Some(pool)) => pool.spec.network().ok_or_else(|| {
                IpamError::Invalid(format!(
                    "error parsing pool {entry:?}: bad CIDR {:?}",
                    pool.spec.cidr
                ))
            })?,
            (Err(e), None) => {
                return Err(IpamError::Invalid(format!(
                    "error parsing pool {entry:?}: {e}"
                )));
            }
        };
        if cidr.addr().is_ipv6() != v6 {
            let family = if v6 { "IPv6" } else { "IPv4" };
            return Err(IpamError::Invalid(format!(
                "{:?} isn't a {family} address",
                cidr.addr().to_string()
            )));
        }
        let pool = all
            .iter()
            .find(|p| p.spec.network() == Some(cidr) && !p.spec.disabled)
            .ok_or_else(|| {
                IpamError::Invalid(format!(
                    "the given pool ({cidr}) does not exist, or is not enabled"
                ))
            })?;
        out.push(pool.clone());
    }
    Ok(out)
}

/// The labels selectors are matched against, read only when a selector
/// needs them.
#[async_trait::async_trait]
pub trait SelectorLabels: Send + Sync {
    async fn node_labels(&self) -> Result<BTreeMap<String, String>, IpamError>;
    async fn namespace_labels(&self) -> Result<BTreeMap<String, String>, IpamError>;
}

fn parse_selector(pool: &IpPool, text: &str) -> Result<Selector, IpamError> {
    Selector::parse(text).map_err(|e| {
        IpamError::Invalid(format!(
            "IP pool {:?} has an invalid selector: {e}",
            pool.metadata.name
        ))
    })
}

/// Whether an enabled pool's node selector asks for the node's labels
/// (anything but `all()` or empty; an invalid one is left for the
/// assignment to refuse).
pub fn pools_select_nodes(pools: &[IpPool]) -> bool {
    pools
        .iter()
        .filter(|p| !p.spec.disabled)
        .any(|p| Selector::parse(&p.spec.node_selector).is_ok_and(|s| !s.matches_everything()))
}

/// The enabled Automatic pools of the family that allow workloads and
/// whose selectors match this node and namespace.
pub async fn automatic_pools(
    all: &[IpPool],
    v6: bool,
    host: &str,
    labels: &dyn SelectorLabels,
) -> Result<Vec<IpPool>, IpamError> {
    let enabled: Vec<&IpPool> = all
        .iter()
        .filter(|p| !p.spec.disabled)
        .filter(|p| p.spec.network().is_some_and(|n| n.addr().is_ipv6() == v6))
        .filter(|p| p.spec.effective_block_size() <= if v6 { 128 } else { 32 })
        .collect();
    if enabled.is_empty() {
        return Err(IpamError::NoPools("cannot find a qualified ippool".into()));
    }
    let for_use: Vec<&IpPool> = enabled
        .into_iter()
        .filter(|p| p.spec.uses().iter().any(|u| u == USE_WORKLOAD))
        .collect();
    if for_use.is_empty() {
        return Err(IpamError::NoPools(format!(
            "cannot find a qualified ippool, no pools match the required use ({USE_WORKLOAD})"
        )));
    }
    let (mut node, mut namespace) = (None, None);
    let mut out = Vec::new();
    for pool in for_use.into_iter().filter(|p| p.spec.is_automatic()) {
        let node_sel = parse_selector(pool, &pool.spec.node_selector)?;
        if !node_sel.matches_everything() {
            if node.is_none() {
                node = Some(labels.node_labels().await?);
            }
            if !node_sel.matches(node.as_ref().expect("read above")) {
                continue;
            }
        }
        let ns_sel = parse_selector(pool, &pool.spec.namespace_selector)?;
        if !ns_sel.matches_everything() {
            if namespace.is_none() {
                namespace = Some(labels.namespace_labels().await?);
            }
            if !ns_sel.matches(namespace.as_ref().expect("read above")) {
                continue;
            }
        }
        out.push(pool.clone());
    }
    if out.is_empty() {
        return Err(IpamError::NoPools(format!(
            "no configured Calico pools for node {host}"
        )));
    }
    Ok(out)
}

/// The pool's blocks of its block size, in the order `host` tries them:
/// from an index derived from the host name, wrapping around. Yields at
/// most `limit` CIDRs (pools may hold 2^58 blocks).
pub fn blocks_for_host(pool: &IpNet, block_size: u8, host: &str, limit: usize) -> Vec<IpNet> {
    if block_size < pool.prefix_len() || block_size > pool.max_prefix_len() {
        return Vec::new();
    }
    let bits = u32::from(block_size - pool.prefix_len());
    let count: u128 = if bits >= 127 {
        u128::MAX
    } else {
        1u128 << bits
    };
    let start = host_seed(host) % count;
    let step_bits = u32::from(pool.max_prefix_len() - block_size);
    let base = match pool.network() {
        std::net::IpAddr::V4(a) => u128::from(u32::from(a)),
        std::net::IpAddr::V6(a) => u128::from(a),
    };
    let take = count.min(limit as u128) as usize;
    (0..take as u128)
        .map(|i| {
            let index = (start + i) % count;
            let addr = base + (index << step_bits);
            match pool {
                IpNet::V4(_) => {
                    IpNet::new(std::net::Ipv4Addr::from(addr as u32).into(), block_size)
                }
                IpNet::V6(_) => IpNet::new(std::net::Ipv6Addr::from(addr).into(), block_size),
            }
            .expect("a block size within the family")
        })
        .collect()
}

/// A stable 64-bit number from the host name (FNV-1a).
pub fn host_seed(host: &str) -> u128 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in host.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    u128::from(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datastore::ipam_model::IpPoolSpec;

    fn pool(name: &str, cidr: &str) -> IpPool {
        IpPool::new(
            name,
            IpPoolSpec {
                cidr: cidr.into(),
                ..Default::default()
            },
        )
    }

    struct Labels(BTreeMap<String, String>, BTreeMap<String, String>);

    #[async_trait::async_trait]
    impl SelectorLabels for Labels {
        async fn node_labels(&self) -> Result<BTreeMap<String, String>, IpamError> {
            Ok(self.0.clone())
        }
        async fn namespace_labels(&self) -> Result<BTreeMap<String, String>, IpamError> {
            Ok(self.1.clone())
        }
    }

    #[test]
    fn only_a_node_selector_other_than_all_needs_the_nodes_labels() {
        let mut everyone = pool("a", "10.0.0.0/16");
        everyone.spec.node_selector = "all()".into();
        let unset = pool("b", "10.1.0.0/16");
        assert!(!pools_select_nodes(&[everyone.clone(), unset.clone()]));
        let mut some = pool("c", "10.2.0.0/16");
        some.spec.node_selector = "rack == 'a'".into();
        assert!(pools_select_nodes(&[everyone, unset, some.clone()]));
        // A disabled pool is never assigned from: its selector is not read.
        some.spec.disabled = true;
        assert!(!pools_select_nodes(&[some]));
    }

    fn run<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn requested_by_name_or_cidr() {
        let mut disabled = pool("off", "10.9.0.0/16");
        disabled.spec.disabled = true;
        let all = [pool("a", "10.0.0.0/16"), pool("b", "fd00::/64"), disabled];
        let got = requested_pools(&all, &["a".into(), "10.0.0.0/16".into()], false).unwrap();
        assert_eq!(got.len(), 2);
        let e = requested_pools(&all, &["192.169.1.0/24".into()], false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the given pool (192.169.1.0/24) does not exist, or is not enabled"
        );
        assert!(requested_pools(&all, &["10.9.0.0/16".into()], false).is_err());
        let e = requested_pools(&all, &["fd00::/64".into()], false).unwrap_err();
        assert_eq!(e.to_string(), "\"fd00::\" isn't a IPv4 address");
        let e = requested_pools(&all, &["nope".into()], false).unwrap_err();
        assert!(
            e.to_string().starts_with("error parsing pool \"nope\""),
            "{e}"
        );
    }

    #[test]
    fn automatic_pools_by_selector_and_use() {
        let mut a = pool("a", "10.0.0.0/16");
        a.spec.node_selector = "zone == 'x'".into();
        let mut b = pool("b", "10.1.0.0/16");
        b.spec.namespace_selector = "team == 'blue'".into();
        let mut tunnel = pool("t", "10.2.0.0/16");
        tunnel.spec.allowed_uses = vec!["Tunnel".into()];
        let mut manual = pool("m", "10.3.0.0/16");
        manual.spec.assignment_mode = "Manual".into();
        let all = [a, b, tunnel.clone(), manual];
        let labels = |n: &[(&str, &str)], s: &[(&str, &str)]| {
            let m = |l: &[(&str, &str)]| {
                l.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            };
            Labels(m(n), m(s))
        };
        let names = |l: &Labels| {
            run(automatic_pools(&all, false, "h", l)).map(|p| {
                p.iter()
                    .map(|p| p.metadata.name.clone())
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(names(&labels(&[("zone", "x")], &[])).unwrap(), ["a"]);
        assert_eq!(
            names(&labels(&[("zone", "x")], &[("team", "blue")])).unwrap(),
            ["a", "b"]
        );
        assert_eq!(
            names(&labels(&[], &[])).unwrap_err().to_string(),
            "no configured Calico pools for node h"
        );
        let e = run(automatic_pools(&[tunnel], false, "h", &labels(&[], &[]))).unwrap_err();
        assert!(
            e.to_string()
                .contains("no pools match the required use (Workload)"),
            "{e}"
        );
        let e = run(automatic_pools(&[], false, "h", &labels(&[], &[]))).unwrap_err();
        assert_eq!(e.to_string(), "cannot find a qualified ippool");
    }

    #[test]
    fn block_walk_is_stable_and_covers_the_pool() {
        let pool: IpNet = "10.0.0.0/24".parse().unwrap();
        let a = blocks_for_host(&pool, 26, "node-a", 100);
        assert_eq!(a.len(), 4);
        assert_eq!(a, blocks_for_host(&pool, 26, "node-a", 100));
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted[0].to_string(), "10.0.0.0/26");
        assert_eq!(sorted[3].to_string(), "10.0.0.192/26");
        let v6: IpNet = "fd00::/64".parse().unwrap();
        let b = blocks_for_host(&v6, 122, "node-a", 3);
        assert_eq!(b.len(), 3);
        assert!(b.iter().all(|n| v6.contains(n) && n.prefix_len() == 122));
    }
}
