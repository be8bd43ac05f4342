//! A Kubernetes pod (`K8S_POD_NAMESPACE` and `K8S_POD_NAME` in CNI_ARGS):
//! CmdAddK8s (calico-behaviour.md §4.3) and CmdDelK8s' rule (§9.2). The pod and its namespace
//! come from the API server (read once each, at the same time as the
//! readiness check), Calico's annotation rules ([`super::annotations`])
//! shape the IPAM config and the endpoint, and host-local's `usePodCidr`
//! takes the Node's pod CIDRs.

use ipnet::IpNet;

use super::annotations::{AddressSource, PodRules};
use super::{AddPlan, Addresses, Plan, Workload};
use crate::cni::{Error, Result};
use crate::dataplane::routes::host_prefix;
use crate::datastore::kubernetes::endpoint::endpoint_for_pod;
use crate::datastore::model::WorkloadEndpoint;
use crate::ipam::host_local::{container_routes, needs_pod_cidrs, substitute_pod_cidrs};
use crate::k8s::K8sClient;
use crate::k8s::objects::{Namespace, Pod};
use crate::plugin::context::{Context, datastore_err};
use crate::plugin::policy_wait::PolicyWait;

pub struct KubernetesPod;

/// The node's pod CIDRs (`spec.podCIDRs`, else `spec.podCIDR`).
async fn pod_cidrs(client: &K8sClient, node: &str) -> Result<Vec<String>> {
    let node_obj = client
        .node(node, true)
        .await?
        .ok_or_else(|| Error::kubernetes(format!("node {node} does not exist")))?;
    let spec = node_obj.spec.unwrap_or_default();
    let mut cidrs = spec.pod_cidrs.unwrap_or_default();
    if cidrs.is_empty()
        && let Some(one) = spec.pod_cidr
    {
        cidrs.push(one);
    }
    Ok(cidrs)
}

/// The pod, read once when the policy needs it or the datastore keeps the
/// endpoint record in it (the client remembers it for the record), as the
/// API server's watch cache holds it (the record's write is conditional on
/// the resourceVersion read, so a stale pod is read again there).
async fn read_pod(ctx: &Context, namespace: &str, name: &str) -> Result<Option<Pod>> {
    let needed = ctx.req.conf.k8s_policy() || ctx.endpoints().await?.in_pods();
    if !needed {
        return Ok(None);
    }
    let pod = ctx.k8s().await?.pod_cached(namespace, name).await?;
    pod.map(Some)
        .ok_or_else(|| Error::kubernetes(format!("pod {namespace}/{name} does not exist")))
}

/// The namespace, when the policy needs it.
async fn read_namespace(ctx: &Context, name: &str) -> Result<Option<Namespace>> {
    if !ctx.req.conf.k8s_policy() {
        return Ok(None);
    }
    let ns = ctx.k8s().await?.namespace(name).await?;
    ns.map(Some)
        .ok_or_else(|| Error::kubernetes(format!("namespace {name} does not exist")))
}

/// The endpoint record a bare pod (no policy k8s: nothing read from the
/// pod) gets: name, node, pod, interface, the network's profile.
fn bare_endpoint(ctx: &Context, endpoint: &str) -> Result<WorkloadEndpoint> {
    let mut ids = ctx.ids.clone();
    ids.endpoint = endpoint.to_string();
    let name = ids
        .name()
        .map_err(|e| Error::invalid_config_caused("error constructing WorkloadEndpoint name", e))?;
    let mut wep = WorkloadEndpoint::new(&ctx.namespace, &name);
    wep.spec.orchestrator = "k8s".into();
    wep.spec.node = ctx.node.clone();
    wep.spec.pod = ctx.ids.pod.clone();
    wep.spec.endpoint = endpoint.to_string();
    wep.spec.profiles = vec![ctx.req.conf.name.clone()];
    Ok(wep)
}

#[async_trait::async_trait]
impl Workload for KubernetesPod {
    /// CmdAddK8s.
    async fn plan_add(&self, ctx: &Context, mtu: u32) -> Result<AddPlan> {
        cmd_add_k8s(ctx, mtu)
            .await
            .map(|p| AddPlan::Create(Box::new(p)))
    }

    /// CmdDelK8s' rule: the host veth is named after the pod, not the
    /// sandbox, so with the netns gone it is removed only when the record
    /// says it is this container's.
    fn owns_host_veth(&self, ctx: &Context, record: Option<&WorkloadEndpoint>) -> bool {
        record.is_some_and(|w| {
            w.spec.container_id == ctx.req.env.container_id
                && w.spec.interface_name == ctx.host_veth
        })
    }

    /// calico-behaviour.md §4.3 steps 3-4: with host-local, its `ipam.routes` (and the
    /// defaults with `include_default_routes`); otherwise none, meaning the
    /// defaults.
    fn container_routes(&self, ctx: &Context) -> Result<Vec<IpNet>> {
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
}

/// CmdAddK8s: the pod's endpoint planned from the pod, its namespace and
/// their annotations; everything checked before anything is allocated.
async fn cmd_add_k8s(ctx: &Context, mtu: u32) -> Result<Plan> {
    let req = &ctx.req;
    // (Calico refuses a negative setting only once everything is written;
    // here it is refused before anything is.)
    let policy_wait = PolicyWait::from_conf(&req.conf)?;
    let (namespace, pod_name) = (ctx.namespace.as_str(), ctx.ids.pod.as_str());
    let ipam_type = req.conf.ipam.kind.as_str();
    let endpoints = ctx.endpoints().await?;
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
    let existing = endpoints
        .find(namespace, &ctx.ids)
        .await
        .map_err(datastore_err("error listing WorkloadEndpoints"))?;

    // host-local: usePodCidr from the node, and the configured routes.
    let mut ipam_config = req.raw.clone();
    let routes = KubernetesPod.container_routes(ctx)?;
    if ipam_type == "host-local" && needs_pod_cidrs(&ipam_config) {
        let node_name = if req.conf.kubernetes.node_name.is_empty() {
            ctx.node.clone()
        } else {
            req.conf.kubernetes.node_name.clone()
        };
        let cidrs = pod_cidrs(ctx.k8s().await?, &node_name).await?;
        substitute_pod_cidrs(&mut ipam_config, &cidrs, &node_name)?;
    }

    // The endpoint: from the pod and its namespace (policy k8s), else bare.
    let endpoint_name = existing.as_ref().map(|w| w.spec.endpoint.clone());
    let endpoint = endpoint_name.as_deref().unwrap_or(&req.env.ifname);
    let (mut wep, rules) = match (&ns, &pod) {
        (Some(ns), Some(pod)) => (
            endpoint_for_pod(pod, &ctx.node, endpoint, ctx.interface_prefix.as_deref()),
            PodRules::read(Some(ns), Some(pod), &req.conf, &mut ipam_config)?,
        ),
        _ => (
            bare_endpoint(ctx, endpoint)?,
            PodRules::read(None, None, &req.conf, &mut ipam_config)?,
        ),
    };
    if let Some(existing) = &existing {
        wep.metadata.name = existing.metadata.name.clone();
        wep.metadata.resource_version = existing.metadata.resource_version.clone();
        wep.metadata.uid = existing.metadata.uid.clone();
    }
    wep.spec.container_id = req.env.container_id.clone();
    wep.spec.allow_spoofed_source_prefixes = rules.allowed_source_prefixes.clone();
    let (source, container_mac) = (rules.source.clone(), rules.container_mac);
    let finalize = Box::new(move |wep: &mut WorkloadEndpoint, ips: &[IpNet]| {
        wep.spec.ip_nats = rules.floating_ips(ips)?;
        Ok(())
    });
    let addresses = match source {
        AddressSource::Ipam => Addresses::Ipam(ipam_config),
        AddressSource::IpAddrsNoIpam(ips) => {
            Addresses::Fixed(ips.into_iter().map(|ip| host_prefix(&ip.into())).collect())
        }
        AddressSource::IpAddrs(ips) => Addresses::Each {
            config: ipam_config,
            ips,
            // A re-created pod: its old endpoint's addresses go first.
            release_first: existing
                .iter()
                .flat_map(|w| &w.spec.ip_networks)
                .filter_map(|n| n.parse::<IpNet>().ok())
                .map(|n| n.addr())
                .collect(),
        },
    };
    Ok(Plan {
        wep,
        host_veth: ctx.host_veth.clone(),
        mtu,
        routes,
        container_mac,
        addresses,
        release_config: crate::ipam::release_config(req),
        replaces: existing.as_ref().map(|w| w.spec.container_id.clone()),
        finalize,
        policy_wait,
    })
}
