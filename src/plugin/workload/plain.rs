//! A plain CNI container (no Kubernetes pod in CNI_ARGS): cmdAdd's plain
//! path (calico-behaviour.md §4.2). Its endpoint is named after the container, labelled from
//! Mesos' `args`, profiled with the network's name; the same container
//! joining again (a repeat ADD, another network) reuses its endpoint.

use ipnet::IpNet;
use serde_json::Value;

use super::{AddPlan, Addresses, Plan, Workload};
use crate::cni::error::{Kind, Unsupported};
use crate::cni::{CniResult, Error, Result};
use crate::datastore::model::WorkloadEndpoint;
use crate::datastore::names::sanitize_mesos_label;
use crate::plugin::context::{Context, datastore_err};
use crate::plugin::endpoint::{endpoint_result, ensure_profile};

pub struct PlainContainer;

#[async_trait::async_trait]
impl Workload for PlainContainer {
    async fn plan_add(&self, ctx: &Context, mtu: u32) -> Result<AddPlan> {
        let req = &ctx.req;
        if req.conf.feature_control.ip_addrs_no_ipam {
            return Err(Error::unsupported(Unsupported::FeatureForRuntime(
                "ip_addrs_no_ipam",
            )));
        }
        // Is there an endpoint for this workload already? Read while the
        // datastore's readiness is (nothing is written before it is known
        // ready, and not being ready is the error reported first), with
        // the network's profile, which the new endpoint will need (a
        // failure is met again, and reported, then).
        let (ready, existing, _) = tokio::join!(
            ctx.ensure_ready(),
            async {
                ctx.endpoints()
                    .await?
                    .find(&ctx.namespace, &ctx.ids)
                    .await
                    .map_err(datastore_err("error listing WorkloadEndpoints"))
            },
            async {
                if req.conf.policy.kind.is_empty() {
                    let _ = ctx.network_profile_exists().await;
                }
            }
        );
        ready?;
        tracing::debug!("datastore ready");
        let existing = existing?;
        if let Some(wep) = existing {
            return join_existing(ctx, wep, mtu).await.map(AddPlan::Done);
        }
        let name = ctx.endpoint_name()?;
        let mut wep = WorkloadEndpoint::new(&ctx.namespace, &name);
        mesos_labels(&req.conf.args, &mut wep);
        wep.spec.endpoint = req.env.ifname.clone();
        wep.spec.node = ctx.node.clone();
        wep.spec.orchestrator = "cni".into();
        wep.spec.container_id = req.env.container_id.clone();
        wep.spec.profiles = vec![req.conf.name.clone()];
        Ok(AddPlan::Create(Box::new(Plan {
            policy_wait: None,
            wep,
            host_veth: ctx.host_veth.clone(),
            mtu,
            routes: Vec::new(),
            container_mac: None,
            addresses: Addresses::Ipam(req.raw.clone()),
            release_config: crate::ipam::release_config(req),
            replaces: None,
            finalize: Box::new(|_, _| Ok(())),
        })))
    }

    /// The host veth is named after the container ID: this sandbox's.
    fn owns_host_veth(&self, _ctx: &Context, _record: Option<&WorkloadEndpoint>) -> bool {
        true
    }

    /// A plain container always gets the default routes.
    fn container_routes(&self, _ctx: &Context) -> Result<Vec<IpNet>> {
        Ok(Vec::new())
    }
}

/// Labels from Mesos' `args`.
fn mesos_labels(args: &serde_json::Map<String, Value>, wep: &mut WorkloadEndpoint) {
    let labels = args
        .get("org.apache.mesos")
        .and_then(|m| m.pointer("/network_info/labels/labels"))
        .and_then(Value::as_array);
    for label in labels.into_iter().flatten() {
        let (Some(k), Some(v)) = (
            label.get("key").and_then(Value::as_str),
            label.get("value").and_then(Value::as_str),
        ) else {
            continue;
        };
        if k == "projectcalico.org/namespace" {
            wep.metadata.namespace = sanitize_mesos_label(v);
        } else {
            wep.metadata
                .labels
                .insert(sanitize_mesos_label(k), sanitize_mesos_label(v));
        }
    }
}

/// The same container joins again (repeat ADD, or another network): the
/// profile is added, the result rebuilt from the endpoint; no IPAM, no
/// networking.
async fn join_existing(ctx: &Context, mut wep: WorkloadEndpoint, mtu: u32) -> Result<CniResult> {
    tracing::info!(endpoint = %wep.metadata.name, "endpoint already exists; reusing it");
    let profile = ctx.req.conf.name.clone();
    if !wep.spec.profiles.contains(&profile) {
        wep.spec.profiles.push(profile);
    }
    let wep = ctx
        .endpoints()
        .await?
        .update(&mut wep)
        .await
        .map_err(datastore_err("error updating WorkloadEndpoint"))?;
    ensure_profile(ctx).await?;
    let ips: Vec<IpNet> = wep
        .spec
        .ip_networks
        .iter()
        .map(|s| {
            s.parse::<IpNet>().map_err(|e| {
                Error::caused(Kind::Datastore, format!("bad ipNetworks entry {s:?}"), e)
            })
        })
        .collect::<Result<_>>()?;
    let spec = &wep.spec;
    let mut result = endpoint_result(ctx, (&spec.interface_name, &spec.mac, mtu), &ips, None);
    result.interfaces[1].name = wep.spec.endpoint.clone();
    Ok(result)
}
