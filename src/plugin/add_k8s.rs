//! CmdAddK8s (§4.3): a Kubernetes pod's ADD. The pod and its namespace come
//! from the API server (read once each, at the same time as the readiness
//! check), Calico's annotation rules shape the IPAM config and the
//! endpoint, and the endpoint is recorded in the configured datastore (the
//! pod's annotations in KDD, conditional on the pod's revision as read).

use std::collections::BTreeMap;

use crate::cni::env::Command;
use crate::cni::{CniResult, Error, Result};
use crate::dataplane::routes::host_prefix;
use crate::datastore::kubernetes::endpoint::endpoint_for_pod;
use crate::datastore::model::WorkloadEndpoint;
use crate::ipam::calico::allocator::Allocator;
use crate::ipam::host_local::{container_routes, needs_pod_cidrs, substitute_pod_cidrs};
use crate::ipam::release_config;
use crate::k8s::K8sClient;
use crate::k8s::objects::{Namespace, Pod};
use crate::plugin::add::{Plan, add_endpoint, find_existing, lookup_prefix};
use crate::plugin::annotations::{
    AddressSource, address_source, allowed_source_prefixes, apply_pool_annotations, floating_ips,
    namespace_annotations, pod_annotations, requested_mac,
};
use crate::plugin::context::{Context, datastore_err};

/// The node's pod CIDRs (`spec.podCIDRs`, else `spec.podCIDR`).
async fn pod_cidrs(client: &K8sClient, node: &str) -> Result<Vec<String>> {
    let node_obj = client
        .node(node)
        .await?
        .ok_or_else(|| Error::Kubernetes(format!("node {node} does not exist")))?;
    let spec = node_obj.spec.unwrap_or_default();
    let mut cidrs = spec.pod_cidrs.unwrap_or_default();
    if cidrs.is_empty()
        && let Some(one) = spec.pod_cidr
    {
        cidrs.push(one);
    }
    Ok(cidrs)
}

/// The pod, read once when the datastore or the policy needs it: through
/// the Kubernetes datastore when it is the one in use (which then knows the
/// revision it read), else with the client.
async fn read_pod(ctx: &Context, namespace: &str, name: &str) -> Result<Option<Pod>> {
    let pod = match ctx.kdd() {
        Some(kdd) => kdd
            .pod(namespace, name)
            .await
            .map_err(datastore_err("error getting pod"))?,
        None if ctx.req.conf.k8s_policy() => ctx.k8s().await?.pod(namespace, name).await?,
        None => return Ok(None),
    };
    pod.map(Some)
        .ok_or_else(|| Error::Kubernetes(format!("pod {namespace}/{name} does not exist")))
}

/// The namespace, when the policy needs it.
async fn read_namespace(ctx: &Context, name: &str) -> Result<Option<Namespace>> {
    if !ctx.req.conf.k8s_policy() {
        return Ok(None);
    }
    let ns = ctx.k8s().await?.namespace(name).await?;
    ns.map(Some)
        .ok_or_else(|| Error::Kubernetes(format!("namespace {name} does not exist")))
}

/// The endpoint already recorded for this pod: in the Kubernetes datastore
/// it is the pod itself (read above); elsewhere a lookup.
async fn existing_endpoint(ctx: &Context, pod: Option<&Pod>) -> Result<Option<WorkloadEndpoint>> {
    match (ctx.kdd(), pod) {
        (Some(kdd), Some(pod)) => {
            let prefix = lookup_prefix(&ctx.ids)?;
            let mut ids = ctx.ids.clone();
            ids.endpoint.clear();
            Ok(kdd
                .endpoint_of(pod, "eth0")
                .filter(|w| {
                    w.metadata.name.starts_with(&prefix) && ids.name_matches(&w.metadata.name)
                })
                .filter(|w| !w.spec.ip_networks.is_empty() || !w.spec.container_id.is_empty()))
        }
        _ => find_existing(ctx.store().await?.as_ref(), &ctx.ids, &ctx.namespace).await,
    }
}

/// The container routes a Kubernetes pod asks for (§4.3 steps 3-4): with
/// host-local, its `ipam.routes` (and the defaults with
/// `include_default_routes`); otherwise none, meaning the defaults.
pub fn pod_routes(ctx: &Context) -> Result<Vec<ipnet::IpNet>> {
    if ctx.req.conf.ipam.kind != "host-local" {
        return Ok(Vec::new());
    }
    Ok(container_routes(
        &ctx.req.raw,
        ctx.req.conf.include_default_routes,
        true,
        true,
    )?)
}

/// CmdAddK8s.
pub async fn cmd_add_k8s(ctx: &Context, mtu: u32) -> Result<CniResult> {
    let req = &ctx.req;
    let (namespace, pod_name) = req.env.args.k8s_pod().expect("called for k8s pods only");
    let node = &ctx.node;
    let ipam_type = req.conf.ipam.kind.clone();

    // The IPAM process starts now and waits for its (rewritten) config.
    let ipam = ctx.ipam().await?;
    let ipam_process = ipam.start(Command::Add).await?;
    let store = ctx.store().await?.as_ref();
    // Readiness, the pod and its namespace: independent, so at once.
    let (ready, pod, ns) = tokio::join!(
        ctx.ensure_ready(),
        read_pod(ctx, namespace, pod_name),
        read_namespace(ctx, namespace)
    );
    ready?;
    let (pod, ns) = (pod?, ns?);
    if let Some(ns) = &ns {
        ctx.set_namespace_labels(ns.metadata.labels.clone().unwrap_or_default());
    }
    let existing = existing_endpoint(ctx, pod.as_ref()).await?;

    // host-local: usePodCidr from the node, and the configured routes.
    let mut ipam_config = req.raw.clone();
    let routes = pod_routes(ctx)?;
    if ipam_type == "host-local" && needs_pod_cidrs(&ipam_config) {
        let node_name = if req.conf.kubernetes.node_name.is_empty() {
            node.clone()
        } else {
            req.conf.kubernetes.node_name.clone()
        };
        let cidrs = pod_cidrs(ctx.k8s().await?, &node_name).await?;
        substitute_pod_cidrs(&mut ipam_config, &cidrs, &node_name)?;
    }

    // The endpoint: from the pod and its namespace (policy k8s), else bare.
    let endpoint_name = existing.as_ref().map(|w| w.spec.endpoint.clone());
    let endpoint = endpoint_name.as_deref().unwrap_or(&req.env.ifname);
    let (mut wep, ns_ann, pod_ann) = match (&ns, &pod) {
        (Some(ns), Some(pod)) => {
            let wep = endpoint_for_pod(pod, node, endpoint, ctx.interface_prefix.as_deref());
            (wep, namespace_annotations(ns), pod_annotations(pod))
        }
        _ => {
            let mut ids = ctx.ids.clone();
            ids.endpoint = endpoint.to_string();
            let name = ids.name().map_err(|e| {
                Error::InvalidConfig(format!("error constructing WorkloadEndpoint name: {e}"))
            })?;
            let mut wep = WorkloadEndpoint::new(namespace, &name);
            wep.spec.orchestrator = "k8s".into();
            wep.spec.node = node.clone();
            wep.spec.pod = pod_name.to_string();
            wep.spec.endpoint = endpoint.to_string();
            wep.spec.profiles = vec![req.conf.name.clone()];
            (wep, BTreeMap::new(), BTreeMap::new())
        }
    };
    if let Some(existing) = &existing {
        wep.metadata.name = existing.metadata.name.clone();
        wep.metadata.resource_version = existing.metadata.resource_version.clone();
        wep.metadata.uid = existing.metadata.uid.clone();
    }
    wep.spec.container_id = req.env.container_id.clone();

    // Annotation rules, all checked before anything is allocated.
    if req.conf.k8s_policy() && ipam_type == "calico-ipam" {
        apply_pool_annotations(&mut ipam_config, &ns_ann, &pod_ann)?;
    }
    let source = address_source(
        &pod_ann,
        &ipam_type,
        req.conf.feature_control.ip_addrs_no_ipam,
    )?;
    let container_mac = requested_mac(&pod_ann)?;
    wep.spec.allow_spoofed_source_prefixes = allowed_source_prefixes(&pod_ann)?;
    let floating_enabled = req.conf.feature_control.floating_ips;
    // An unusable floatingIPs annotation fails before any allocation.
    floating_ips(&pod_ann, floating_enabled, &[])?;
    let finalize_annotations = pod_ann.clone();
    let finalize = Box::new(move |wep: &mut WorkloadEndpoint, ips: &[ipnet::IpNet]| {
        wep.spec.ip_nats = floating_ips(&finalize_annotations, floating_enabled, ips)?;
        Ok(())
    });

    let mut plan = Plan {
        wep,
        host_veth: ctx.host_veth.clone(),
        mtu,
        routes,
        container_mac,
        ipam_release_config: release_config(req),
        fixed_ips: None,
        replaces: existing.as_ref().map(|w| w.spec.container_id.clone()),
        finalize,
    };
    match source {
        AddressSource::Ipam => {
            let ipam_add = ipam.add_on(&ipam_config, Some(ipam_process));
            add_endpoint(ctx, store, plan, Some(ipam_add)).await
        }
        AddressSource::IpAddrsNoIpam(ips) => {
            drop(ipam_process);
            plan.fixed_ips = Some(ips.into_iter().map(|ip| host_prefix(&ip.into())).collect());
            let none: Option<std::future::Ready<Result<CniResult>>> = None;
            add_endpoint(ctx, store, plan, none).await
        }
        AddressSource::IpAddrs(ips) => {
            drop(ipam_process);
            // A re-created pod: its old endpoint's addresses go first.
            if let Some(old) = existing.as_ref().filter(|w| !w.spec.ip_networks.is_empty()) {
                let held: Vec<std::net::IpAddr> = old
                    .spec
                    .ip_networks
                    .iter()
                    .filter_map(|n| n.parse::<ipnet::IpNet>().ok())
                    .map(|n| n.addr())
                    .collect();
                Allocator::new(store, node)
                    .release_ips(&held)
                    .await
                    .map_err(|e| Error::Ipam(format!("failed to release ipAddrs: {e}")))?;
            }
            // One IPAM ADD per requested address, each with IP=<ip>.
            let config = ipam_config.clone();
            let ipam_add = async move {
                let mut merged = CniResult::default();
                for ip in ips {
                    let result = ipam
                        .add_ip(&config, ip)
                        .await
                        .map_err(|e| e.context("error getting IP from IPAM"))?;
                    merged.ips.extend(result.ips);
                }
                Ok(merged)
            };
            add_endpoint(ctx, store, plan, Some(ipam_add)).await
        }
    }
}
