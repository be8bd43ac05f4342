//! CmdAddK8s (§4.3): a Kubernetes pod's ADD. The pod and its namespace come
//! from the API server, Calico's annotation rules shape the IPAM config and
//! the endpoint, and the endpoint is recorded in the configured datastore
//! (the pod's annotations in KDD).

use std::collections::BTreeMap;

use crate::cni::delegate::Delegate;
use crate::cni::env::Command;
use crate::cni::{CniResult, Error, Request, Result};
use crate::datastore::model::WorkloadEndpoint;
use crate::k8s::K8sClient;
use crate::k8s::rules::{
    AddressSource, address_source, allowed_source_prefixes, apply_pool_annotations,
    container_routes, endpoint_for_pod, floating_ips, namespace_annotations, needs_pod_cidrs,
    pod_annotations, release_pod_cidrs, requested_mac, substitute_pod_cidrs,
};
use crate::plugin::add::{Plan, add_endpoint, find_existing};
use crate::plugin::{
    ensure_ready, host_prefix, host_veth_name, identifiers, interface_prefix, ipam, nodename,
    open_datastore,
};

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

/// The IPAM config a rollback (or DEL) hands to the IPAM plugin.
pub fn release_config(req: &Request) -> serde_json::Value {
    let mut config = req.raw.clone();
    if req.conf.ipam.kind == "host-local" {
        release_pod_cidrs(&mut config);
    }
    config
}

/// CmdAddK8s.
pub async fn cmd_add_k8s(req: &Request, mtu: u32) -> Result<CniResult> {
    let (namespace, pod_name) = req.env.args.k8s_pod().expect("called for k8s pods only");
    let node = nodename(req);
    let ids = identifiers(req, &node);
    let ipam_type = req.conf.ipam.kind.clone();

    // The IPAM process starts now and waits for its (rewritten) config.
    let ipam = ipam(req);
    let ipam_process = ipam.spawn(Command::Add).await?;
    let client = K8sClient::from_conf(&req.conf, req.deadline).await?;
    let store = open_datastore(req).await?;
    ensure_ready(store.as_ref()).await?;
    let existing = find_existing(store.as_ref(), &ids, namespace).await?;

    // host-local: usePodCidr from the node, and the configured routes.
    let mut ipam_config = req.raw.clone();
    let mut routes = Vec::new();
    if ipam_type == "host-local" {
        if needs_pod_cidrs(&ipam_config) {
            let node_name = if req.conf.kubernetes.node_name.is_empty() {
                node.clone()
            } else {
                req.conf.kubernetes.node_name.clone()
            };
            let cidrs = pod_cidrs(&client, &node_name).await?;
            substitute_pod_cidrs(&mut ipam_config, &cidrs, &node_name)?;
        }
        routes = container_routes(&ipam_config, req.conf.include_default_routes, true, true)?;
    }

    // The pod and its namespace (policy k8s only).
    let endpoint_name = existing.as_ref().map(|w| w.spec.endpoint.clone());
    let endpoint = endpoint_name.as_deref().unwrap_or(&req.env.ifname);
    let (mut wep, ns_ann, pod_ann) = if req.conf.k8s_policy() {
        let ns = client
            .namespace(namespace)
            .await?
            .ok_or_else(|| Error::Kubernetes(format!("namespace {namespace} does not exist")))?;
        let pod = client.pod(namespace, pod_name).await?.ok_or_else(|| {
            Error::Kubernetes(format!("pod {namespace}/{pod_name} does not exist"))
        })?;
        let wep = endpoint_for_pod(&pod, &node, endpoint, interface_prefix(req).as_deref());
        (wep, namespace_annotations(&ns), pod_annotations(&pod))
    } else {
        let mut ids = ids.clone();
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
        host_veth: host_veth_name(req),
        mtu,
        routes,
        container_mac,
        ipam_release_config: release_config(req),
        fixed_ips: None,
        finalize,
    };
    match source {
        AddressSource::Ipam => {
            let ipam_add = ipam.add_on(&ipam_config, Some(ipam_process));
            add_endpoint(req, store.as_ref(), plan, Some(ipam_add)).await
        }
        AddressSource::IpAddrsNoIpam(ips) => {
            drop(ipam_process);
            plan.fixed_ips = Some(ips.into_iter().map(|ip| host_prefix(&ip.into())).collect());
            let none: Option<std::future::Ready<Result<CniResult>>> = None;
            add_endpoint(req, store.as_ref(), plan, none).await
        }
        AddressSource::IpAddrs(ips) => {
            drop(ipam_process);
            // One IPAM ADD per requested address, each with IP=<ip>.
            let config = ipam_config.clone();
            let ipam_add = async move {
                let mut merged = CniResult::default();
                for ip in ips {
                    let one = Delegate {
                        extra_args: Some(format!("IP={ip}")),
                        ..ipam.clone()
                    };
                    let result = one
                        .add(&config)
                        .await
                        .map_err(|e| e.context("error getting IP from IPAM"))?;
                    merged.ips.extend(result.ips);
                }
                Ok(merged)
            };
            add_endpoint(req, store.as_ref(), plan, Some(ipam_add)).await
        }
    }
}
