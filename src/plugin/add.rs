//! cmdAdd: the common prelude (calico-behaviour.md §4.1), the workload kind's plan
//! ([`crate::plugin::workload`]), and the creation of a new endpoint —
//! addresses, DoNetworking, the record, the profile — every step undone
//! ([`crate::plugin::rollback`]) if a later one fails.

use std::sync::Arc;

use ipnet::IpNet;
use serde_json::Value;

use crate::cni::env::Command;
use crate::cni::result::{CniResult, IpConfig};
use crate::cni::{Error, Result};
use crate::dataplane::routes::{container_routes_for, host_prefix};
use crate::dataplane::{
    DeviceKind, Networking, NetworkingOutcome, PreparedPod, WorkloadInfo, WorkloadPort,
};
use crate::datastore::model::WorkloadEndpoint;
use crate::ipam::{Ipam, Pending};
use crate::plugin::context::Context;
use crate::plugin::endpoint::{endpoint_result, ensure_profile, write_record};
use crate::plugin::pair_ahead::{PairAhead, pair_networking};
use crate::plugin::rollback::Undo;
use crate::plugin::workload::{AddPlan, Addresses, Plan, Workload};

/// cmdAdd.
pub async fn cmd_add(ctx: &Context, workload: &dyn Workload) -> Result<CniResult> {
    let req = &ctx.req;
    ctx.inject_fault("start")?;
    // Prelude: everything that can be refused before any state changes.
    req.conf.check_nodename_file()?;
    let mtu = req.conf.resolve_mtu()?;
    let device = validate_dataplane(ctx)?;
    if !req.conf.readiness_gates.is_empty() {
        crate::plugin::readiness::wait_for_gates(&req.conf.readiness_gates, ctx.deadline()).await?;
    }
    // The IPAM plugin is started now and waits for its config on stdin: its
    // start-up overlaps the lookups of the plan. It is killed unused if the
    // plan needs no address from it (nothing happens before it reads stdin).
    let ipam = ctx.ipam().await?;
    let pending = ipam.start(Command::Add).await?;
    // The pod's interface pair is made while the plan reads the datastore
    // and the IPAM allocates, where its names are free.
    let mut ahead = PairAhead::start(ctx, mtu, device);
    let plan = ahead.alongside(workload.plan_add(ctx, mtu)).await;
    match plan {
        Ok(AddPlan::Create(plan)) => {
            let mut undo = Undo::default();
            let outcome =
                create_endpoint(ctx, ipam.as_ref(), *plan, device, pending, ahead, &mut undo).await;
            if outcome.is_err() {
                undo.run(ctx).await;
            }
            outcome
        }
        Ok(AddPlan::Done(result)) => {
            tokio::join!(ahead.discard(ctx), ipam.discard(pending));
            Ok(result)
        }
        Err(e) => {
            // (On the cleanup budget: the error may be the deadline's.)
            let cleanup = match ctx.ipam_for_cleanup().await {
                Ok(cleanup) => cleanup,
                Err(_) => Arc::clone(ipam),
            };
            tokio::join!(ahead.discard(ctx), cleanup.discard(pending));
            Err(e)
        }
    }
}

/// Checks that need nothing but the config (the dataplane choice); the
/// interface pair `device_type` asks for.
pub fn validate_dataplane(ctx: &Context) -> Result<DeviceKind> {
    let req = &ctx.req;
    let device = device_kind(&req.conf.device_type)?;
    match req
        .conf
        .dataplane_options
        .get("type")
        .and_then(Value::as_str)
    {
        None => Ok(()),
        Some("grpc") => match req.conf.dataplane_options.get("socket") {
            Some(Value::String(s)) if !s.is_empty() => Ok(()),
            _ => Err(Error::invalid_config(
                "GRPC dataplane socket not configured",
            )),
        },
        Some(other) => Err(Error::invalid_config(format!(
            "invalid dataplane type: {other}"
        ))),
    }?;
    Ok(device)
}

/// `device_type`: empty or `veth`, or `netkit`; anything else is refused
/// with Calico's message.
pub fn device_kind(device_type: &str) -> Result<DeviceKind> {
    match device_type {
        "" | "veth" => Ok(DeviceKind::Veth),
        "netkit" => Ok(DeviceKind::Netkit),
        other => Err(Error::invalid_config(format!(
            "unknown device_type {other:?} in CNI config (supported: \"veth\", \"netkit\")"
        ))),
    }
}

/// The endpoint's addresses, as `addresses` says to get them.
async fn allocate(ipam: &dyn Ipam, addresses: Addresses, pending: Pending) -> Result<CniResult> {
    match addresses {
        Addresses::Ipam(config) => {
            let result = ipam.add(&config, pending).await;
            crate::fault::kill_point("ipam");
            result
        }
        Addresses::Fixed(ips) => {
            ipam.discard(pending).await;
            Ok(CniResult {
                ips: ips
                    .into_iter()
                    .map(|address| IpConfig {
                        address,
                        gateway: None,
                        interface: None,
                    })
                    .collect(),
                ..CniResult::default()
            })
        }
        Addresses::Each {
            config,
            ips,
            release_first,
        } => {
            ipam.discard(pending).await;
            if !release_first.is_empty() {
                ipam.release_ips(&release_first).await?;
            }
            let mut merged = CniResult::default();
            for ip in ips {
                let result = ipam
                    .add_ip(&config, ip)
                    .await
                    .map_err(|e| e.context("error getting IP from IPAM"))?;
                merged.ips.extend(result.ips);
            }
            Ok(merged)
        }
    }
}

/// Creates a new endpoint from `plan`: DoNetworking (the addresses taken
/// while the interface pair is made, or taken from `ahead`), the record,
/// the profile. What is done is noted in `undo` before it is attempted.
async fn create_endpoint(
    ctx: &Context,
    ipam: &dyn Ipam,
    plan: Plan,
    device: DeviceKind,
    pending: Pending,
    ahead: PairAhead<'_>,
    undo: &mut Undo,
) -> Result<CniResult> {
    let Plan {
        mut wep,
        host_veth,
        mtu,
        routes,
        container_mac,
        addresses,
        release_config,
        replaces,
        finalize,
        policy_wait,
    } = plan;
    let networking = Networking {
        routes,
        workload: workload_info(&wep),
        ..pair_networking(ctx, host_veth.clone(), mtu, device, container_mac)
    };
    // (Noted before the attempt: a deadline can cut the work short after
    // the pair exists; deleting one never made is harmless. Likewise the
    // allocation: once the IPAM has its config, a failure — even its own,
    // or a deadline that kills it mid-way — is followed by a DEL, which is
    // harmless when it holds nothing.)
    undo.host_veth = Some(host_veth.clone());
    if !matches!(addresses, Addresses::Fixed(_)) {
        undo.ipam_release = Some(release_config);
    }
    // calico-ipam's auto-assignment answers a KubeVirt migration target
    // with no routes: its host routes wait for the migration to complete.
    let routes_from_ipam =
        matches!(addresses, Addresses::Ipam(_)) && ipam.kind() == crate::ipam::CALICO_IPAM;
    let (ipam_result, ips, prepared, networking) = allocate_and_prepare(
        ctx,
        networking,
        ahead,
        allocate(ipam, addresses, pending),
        routes_from_ipam,
    )
    .await?;
    wep.spec.ip_networks = ips.iter().map(|ip| ip.to_string()).collect();
    finalize(&mut wep, &ips)?;

    // The endpoint record (a remote dataplane may name the host interface
    // otherwise) and the network's profile (independent: a profile is made
    // once and never changed). Where the dataplane is local the record is
    // known before the links are configured, and a new record is written
    // meanwhile: an ADD that fails after either takes both back (`undo`).
    // (A record this ADD takes over from an earlier container is written
    // once the pod's network is complete, as Calico does.)
    let known = prepared.outcome_ahead().filter(|_| replaces.is_none());
    let (outcome, (stored, profile)) = match known {
        Some(known) => {
            fill_record(&mut wep, &known, &host_veth);
            tokio::join!(
                finish_networking(ctx, &prepared, &networking),
                store_record(ctx, &mut wep, replaces.as_deref())
            )
        }
        None => {
            let outcome = finish_networking(ctx, &prepared, &networking).await?;
            fill_record(&mut wep, &outcome, &host_veth);
            let record = store_record(ctx, &mut wep, replaces.as_deref()).await;
            (Ok(outcome), record)
        }
    };
    if let Ok(stored) = &stored {
        undo.endpoint = Some((
            wep.metadata.namespace.clone(),
            wep.metadata.name.clone(),
            stored.metadata.uid.clone(),
        ));
        tracing::debug!("endpoint stored");
    }
    outcome?;
    stored?;
    crate::fault::kill_point("endpoint");
    ctx.inject_fault("endpoint")?;
    profile?;
    ctx.inject_fault("profile")?;
    let host_veth = wep.spec.interface_name.clone();
    let mac = wep.spec.mac.clone();

    // Check that the result prints in the config's version before committing.
    let result = endpoint_result(ctx, (&host_veth, &mac, mtu), &ips, Some(&ipam_result));
    result.to_version(ctx.req.version)?;

    // The endpoint's policy in place (Felix's status file), if asked: a
    // timeout only warns.
    if let Some(wait) = policy_wait {
        let workload = format!("{}/{}", wep.metadata.namespace, wep.spec.pod);
        wait.wait(
            &wep.spec.orchestrator,
            &workload,
            &wep.spec.endpoint,
            ctx.deadline(),
        )
        .await;
    }
    Ok(result)
}

/// What a remote dataplane is told of the workload: the record's
/// identifiers, labels, annotations and ports.
fn workload_info(wep: &WorkloadEndpoint) -> WorkloadInfo {
    WorkloadInfo {
        name: wep.metadata.name.clone(),
        namespace: wep.metadata.namespace.clone(),
        labels: wep.metadata.labels.clone(),
        annotations: wep.metadata.annotations.clone(),
        endpoint: wep.spec.endpoint.clone(),
        node: wep.spec.node.clone(),
        orchestrator: wep.spec.orchestrator.clone(),
        pod: wep.spec.pod.clone(),
        ports: wep
            .spec
            .ports
            .iter()
            .map(|p| WorkloadPort {
                name: p.name.clone(),
                protocol: p.protocol.clone(),
                port: p.port,
                host_port: p.host_port,
                host_ip: p.host_ip.clone(),
            })
            .collect(),
    }
}

/// The record's interface fields: the container's MAC and the host
/// interface (as the dataplane named it, else the one asked for).
fn fill_record(wep: &mut WorkloadEndpoint, outcome: &NetworkingOutcome, host_veth: &str) {
    wep.spec.mac = outcome.container_mac.to_string();
    wep.spec.interface_name = outcome
        .host_interface
        .clone()
        .unwrap_or_else(|| host_veth.to_string());
}

/// The endpoint record written and the network's profile ensured, at once.
async fn store_record(
    ctx: &Context,
    wep: &mut WorkloadEndpoint,
    replaces: Option<&str>,
) -> (Result<WorkloadEndpoint>, Result<()>) {
    tokio::join!(write_record(ctx, wep, replaces), ensure_profile(ctx))
}

/// DoNetworking's first half (calico-behaviour.md §7): the interface pair
/// made while `addresses` are taken (the pair needs none, and an exec'd
/// IPAM runs in its own process). Returns the IPAM's result, the
/// addresses as /32 and /128, the pair, and the networking completed
/// with them for [`finish_networking`].
async fn allocate_and_prepare(
    ctx: &Context,
    mut networking: Networking,
    ahead: PairAhead<'_>,
    addresses: impl std::future::Future<Output = Result<CniResult>>,
    routes_from_ipam: bool,
) -> Result<(CniResult, Vec<IpNet>, PreparedPod, Networking)> {
    let req = &ctx.req;
    let prepare = async {
        let prepared = ahead.take_or_prepare(ctx, &networking).await?;
        crate::fault::kill_point("veth");
        Ok::<_, Error>(prepared)
    };
    let (ipam_result, prepared) =
        tokio::time::timeout(req.remaining(), async { tokio::join!(addresses, prepare) })
            .await
            .map_err(|_| {
                Error::timed_out("timed out allocating addresses and creating the veth pair")
            })?;
    let ipam_result = ipam_result?;
    let prepared = prepared?;
    tracing::debug!("IPAM and veth pair done");
    ctx.inject_fault("ipam")?;
    if ipam_result.ips.is_empty() {
        return Err(Error::ipam(
            "IPAM plugin returned no IP addresses in result",
        ));
    }
    let ips: Vec<IpNet> = ipam_result
        .ips
        .iter()
        .map(|ip| host_prefix(&ip.address))
        .collect();
    networking.ipam_addresses = ipam_result
        .ips
        .iter()
        .map(|ip| (ip.address, ip.gateway))
        .collect();
    // (A remote dataplane is told the routes as the workload gave them.)
    if !ctx.dataplane().is_remote() {
        networking.routes = container_routes_for(std::mem::take(&mut networking.routes), &ips);
    }
    networking.ips = ips.clone();
    if routes_from_ipam && ipam_result.routes.is_empty() {
        tracing::info!("Skipping host-side route setup (skipHostSideRoutes=true)");
        networking.skip_host_routes = true;
    }
    Ok((ipam_result, ips, prepared, networking))
}

/// DoNetworking's second half: sysctls, links up, container routes and
/// addresses, host routes.
async fn finish_networking(
    ctx: &Context,
    prepared: &PreparedPod,
    networking: &Networking,
) -> Result<NetworkingOutcome> {
    let outcome = tokio::time::timeout(
        ctx.req.remaining(),
        ctx.dataplane().finish(prepared, networking),
    )
    .await
    .map_err(|_| Error::timed_out("timed out setting up the pod network"))??;
    tracing::debug!("networking done");
    ctx.inject_fault("networking")?;
    Ok(outcome)
}
