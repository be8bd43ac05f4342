//! CHECK: everything ADD made, verified against prevResult.

use std::path::Path;

use ipnet::IpNet;

use crate::cni::env::Command;
use crate::cni::result::CniResult;
use crate::cni::{Error, Request, Result};
use crate::dataplane::MacAddr;
use crate::dataplane::linux::{Networking, PodNetwork};
use crate::plugin::{
    default_routes, ensure_ready, host_prefix, host_veth_name, identifiers, ipam, nodename,
    open_datastore, wep_namespace,
};

/// cmdCheck.
pub async fn cmd_check(req: &Request) -> Result<()> {
    let prev = req
        .conf
        .prev_result
        .as_ref()
        .ok_or_else(|| Error::InvalidConfig("CHECK requires prevResult".into()))?;
    let (prev, _) = CniResult::parse(prev, req.version)?;
    let container = prev
        .interfaces
        .iter()
        .position(|i| {
            i.name == req.env.ifname && i.sandbox.as_deref().is_some_and(|s| !s.is_empty())
        })
        .ok_or_else(|| {
            Error::Dataplane(format!(
                "prevResult has no interface {} in a sandbox",
                req.env.ifname
            ))
        })?;
    let expected_mac = match &prev.interfaces[container].mac {
        Some(m) => Some(m.parse::<MacAddr>().map_err(Error::Dataplane)?),
        None => None,
    };
    let ips: Vec<IpNet> = prev
        .ips
        .iter()
        .filter(|ip| ip.interface.is_none_or(|i| i == container))
        .map(|ip| host_prefix(&ip.address))
        .collect();
    if ips.is_empty() {
        return Err(Error::Dataplane(
            "prevResult has no addresses for the container interface".into(),
        ));
    }
    let host_veth = prev
        .interfaces
        .iter()
        .find(|i| i.sandbox.as_deref().unwrap_or("").is_empty())
        .map(|i| i.name.clone())
        .unwrap_or_else(|| host_veth_name(req));
    let expected = Networking {
        ifname: req.env.ifname.clone(),
        host_veth,
        routes: default_routes(&ips),
        ips: ips.clone(),
        mtu: 0,
        queues: 1,
        container_mac: None,
        allow_ip_forwarding: false,
        skip_host_routes: false,
        deadline: req.deadline,
    };
    let pod = PodNetwork::open(Path::new(&req.env.netns))?
        .ok_or_else(|| Error::Dataplane(format!("netns {} does not exist", req.env.netns)))?;
    pod.check(&expected, expected_mac).await?;

    // The endpoint record.
    let store = open_datastore(req).await?;
    ensure_ready(store.as_ref()).await?;
    let name = identifiers(req, &nodename(req)).name().map_err(|e| {
        Error::InvalidConfig(format!("error constructing WorkloadEndpoint name: {e}"))
    })?;
    let wep = store
        .get_workload_endpoint(&wep_namespace(req), &name)
        .await
        .map_err(|e| Error::Datastore(format!("error getting WorkloadEndpoint: {e}")))?
        .ok_or_else(|| Error::Datastore(format!("WorkloadEndpoint {name} does not exist")))?;
    if wep.spec.container_id != req.env.container_id {
        return Err(Error::Datastore(format!(
            "WorkloadEndpoint {name} belongs to container {}, not {}",
            wep.spec.container_id, req.env.container_id
        )));
    }
    for ip in &ips {
        if !wep.spec.ip_networks.contains(&ip.to_string()) {
            return Err(Error::Datastore(format!(
                "WorkloadEndpoint {name} does not list {ip}"
            )));
        }
    }
    ipam(req).run(Command::Check, &req.raw).await
}
