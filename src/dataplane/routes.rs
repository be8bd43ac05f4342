//! The pod's routes as Calico lays them out: addresses as host routes
//! (/32, /128) and a default route per address family.

use std::str::FromStr;

use ipnet::IpNet;

/// An address as the pod carries it: /32 or /128.
pub fn host_prefix(ip: &IpNet) -> IpNet {
    IpNet::new(ip.addr(), ip.max_prefix_len()).expect("max prefix length is valid")
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

/// The default routes for the families of `ips`.
pub fn default_routes_for(ips: &[IpNet]) -> Vec<IpNet> {
    default_routes(
        ips.iter().any(|ip| ip.addr().is_ipv4()),
        ips.iter().any(|ip| ip.addr().is_ipv6()),
    )
}

/// The container routes of a pod with addresses `ips`: `wanted` (empty
/// means a default route per family), keeping only routes of the families
/// the pod has addresses in.
pub fn container_routes_for(wanted: Vec<IpNet>, ips: &[IpNet]) -> Vec<IpNet> {
    if wanted.is_empty() {
        return default_routes_for(ips);
    }
    wanted
        .into_iter()
        .filter(|r| {
            ips.iter()
                .any(|ip| ip.addr().is_ipv6() == r.addr().is_ipv6())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn routes_follow_the_pods_families() {
        let v4 = nets(&["10.0.0.5/32"]);
        let dual = nets(&["10.0.0.5/32", "fd00::5/128"]);
        assert_eq!(container_routes_for(vec![], &v4), nets(&["0.0.0.0/0"]));
        assert_eq!(
            container_routes_for(vec![], &dual),
            nets(&["0.0.0.0/0", "::/0"])
        );
        let custom = nets(&["10.123.0.0/16", "dead:beef::/96"]);
        assert_eq!(
            container_routes_for(custom.clone(), &v4),
            nets(&["10.123.0.0/16"])
        );
        assert_eq!(container_routes_for(custom.clone(), &dual), custom);
        assert_eq!(
            host_prefix(&"10.0.0.5/24".parse().unwrap()),
            "10.0.0.5/32".parse::<IpNet>().unwrap()
        );
    }
}
