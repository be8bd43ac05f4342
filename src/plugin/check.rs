//! CHECK: everything ADD made, verified against prevResult — the
//! interfaces, addresses and routes (the dataplane), the endpoint record,
//! and the IPAM's own CHECK.

use std::path::Path;

use ipnet::IpNet;

use crate::cni::result::CniResult;
use crate::cni::{Error, Result};
use crate::dataplane::routes::{container_routes_for, host_prefix};
use crate::dataplane::{MacAddr, Networking};
use crate::plugin::context::{Context, datastore_err};
use crate::plugin::workload::Workload;

/// cmdCheck.
pub async fn cmd_check(ctx: &Context, workload: &dyn Workload) -> Result<()> {
    let req = &ctx.req;
    let prev = req
        .conf
        .prev_result
        .as_ref()
        .ok_or_else(|| Error::invalid_config("CHECK requires prevResult"))?;
    let (prev, _) = CniResult::parse(prev, req.version)?;
    let container = prev
        .interfaces
        .iter()
        .position(|i| {
            i.name == req.env.ifname && i.sandbox.as_deref().is_some_and(|s| !s.is_empty())
        })
        .ok_or_else(|| {
            Error::dataplane(format!(
                "prevResult has no interface {} in a sandbox",
                req.env.ifname
            ))
        })?;
    let expected_mac = match &prev.interfaces[container].mac {
        Some(m) => Some(m.parse::<MacAddr>().map_err(Error::dataplane)?),
        None => None,
    };
    let ips: Vec<IpNet> = prev
        .ips
        .iter()
        .filter(|ip| ip.interface.is_none_or(|i| i == container))
        .map(|ip| host_prefix(&ip.address))
        .collect();
    if ips.is_empty() {
        return Err(Error::dataplane(
            "prevResult has no addresses for the container interface",
        ));
    }
    let host_veth = prev
        .interfaces
        .iter()
        .find(|i| i.sandbox.as_deref().unwrap_or("").is_empty())
        .map(|i| i.name.clone())
        .unwrap_or_else(|| ctx.host_veth.clone());
    let expected = Networking {
        ifname: req.env.ifname.clone(),
        host_veth,
        routes: container_routes_for(workload.container_routes(ctx)?, &ips),
        ips: ips.clone(),
        mtu: 0,
        queues: 1,
        device: Default::default(),
        container_mac: None,
        allow_ip_forwarding: false,
        skip_host_routes: false,
        deadline: ctx.deadline(),
        ipam_addresses: Vec::new(),
        workload: Default::default(),
    };
    ctx.dataplane()
        .check(Path::new(&req.env.netns), &expected, expected_mac)
        .await?;

    // The endpoint record.
    ctx.ensure_ready().await?;
    let name = ctx.endpoint_name()?;
    let wep = ctx
        .endpoints()
        .await?
        .get(&ctx.namespace, &name)
        .await
        .map_err(datastore_err("error getting WorkloadEndpoint"))?
        .ok_or_else(|| Error::datastore(format!("WorkloadEndpoint {name} does not exist")))?;
    if wep.spec.container_id != req.env.container_id {
        return Err(Error::datastore(format!(
            "WorkloadEndpoint {name} belongs to container {}, not {}",
            wep.spec.container_id, req.env.container_id
        )));
    }
    for ip in &ips {
        if !wep.spec.ip_networks.contains(&ip.to_string()) {
            return Err(Error::datastore(format!(
                "WorkloadEndpoint {name} does not list {ip}"
            )));
        }
    }
    // host-local's placeholders made valid, as for DEL: it checks by
    // container ID, not by range.
    let config = crate::ipam::release_config(req);
    ctx.ipam().await?.check(&config).await
}
