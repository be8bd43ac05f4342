//! GC (spec 1.1.0): what this network left on this node for attachments
//! that are not among `cni.dev/valid-attachments` is removed — the
//! WorkloadEndpoint records (on the embedded and etcd datastores; on the
//! Kubernetes datastore the record is the pod's address annotations, which
//! are cleared as DEL clears them when they still name the collected
//! container), their host veths, and the IPAM allocations (calico-ipam's
//! handles of this network on this node; a delegated IPAM gets GC with
//! the same list, and host-local, which collects nothing itself, has its
//! reservations collected here). Without the list nothing is removed. Every item is
//! tried; the errors are reported together at the end.

use std::collections::HashSet;

use crate::cni::env::Command;
use crate::cni::request::Attachment;
use crate::cni::{Error, Result};
use crate::dataplane::linux::delete_host_veth;
use crate::datastore::model::WorkloadEndpoint;
use crate::datastore::{ListFilter, Precondition};
use crate::ipam::host_local_gc;
use crate::plugin::context::Context;

/// cmdGC.
pub async fn cmd_gc(ctx: &Context) -> Result<()> {
    let mut errors = Vec::new();
    let valid = ctx.req.valid_attachments()?;
    match &valid {
        Some(valid) => {
            if let Err(e) = remove_stale_endpoints(ctx, valid).await {
                errors.push(e.to_string());
            }
        }
        None => tracing::info!("GC without cni.dev/valid-attachments: nothing is collected"),
    }
    // The IPAM's own GC, with the same list (it decides without one).
    let ipam = match ctx.ipam().await {
        Ok(ipam) => ipam.run_v11_verb(Command::Gc, &ctx.req.raw).await,
        Err(e) => Err(e),
    };
    if let Err(e) = ipam {
        errors.push(e.to_string());
    }
    // host-local collects nothing itself: its reservations, as it keeps them.
    if let Some(valid) = valid
        && ctx.req.conf.ipam.kind == "host-local"
        && let Err(e) = collect_host_local(ctx, valid).await
    {
        errors.push(e.to_string());
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::Datastore(format!("GC: {}", errors.join("; "))))
    }
}

/// host-local's reservations of this network for attachments not in
/// `valid`, released under its lock (file I/O on the blocking pool).
async fn collect_host_local(ctx: &Context, valid: Vec<Attachment>) -> Result<()> {
    let ipam = ctx.req.raw.get("ipam").cloned().unwrap_or_default();
    let dir = host_local_gc::network_dir(&ipam, &ctx.req.conf.name);
    let deadline = ctx.deadline().into_std();
    let collected =
        tokio::task::spawn_blocking(move || host_local_gc::collect(&dir, &valid, deadline))
            .await
            .map_err(|e| Error::Internal(format!("host-local GC stopped: {e}")))?
            .map_err(|e| Error::Ipam(format!("host-local GC: {e}")))?;
    if !collected.released.is_empty() {
        tracing::info!(released = ?collected.released, kept = collected.kept, "host-local GC");
    }
    Ok(())
}

/// Whether `wep` is one of this network's: a plain CNI endpoint carries the
/// network's profile; a Kubernetes one is this network's when calico-ipam
/// of this network allocated for its container.
fn of_this_network(ctx: &Context, wep: &WorkloadEndpoint, ours: &HashSet<String>) -> bool {
    let network = &ctx.req.conf.name;
    match wep.spec.orchestrator.as_str() {
        "k8s" => ours.contains(&wep.spec.container_id),
        _ => wep.spec.profiles.iter().any(|p| p == network),
    }
}

/// Removes a stale endpoint record (exactly as read: a writer that changed
/// it since wins) and, with `veth`, its host veth first.
async fn collect(
    store: &dyn crate::datastore::Store,
    wep: &WorkloadEndpoint,
    veth: bool,
) -> std::result::Result<(), String> {
    let name = &wep.spec.interface_name;
    if veth && !name.is_empty() {
        match delete_host_veth(name).await {
            Ok(true) => tracing::info!(veth = %name, "GC removed a stale host veth"),
            Ok(false) => {}
            Err(e) => return Err(format!("host veth {name}: {e}")),
        }
    }
    let meta = &wep.metadata;
    match store
        .delete::<WorkloadEndpoint>(&meta.namespace, &meta.name, &Precondition::exactly(meta))
        .await
    {
        Ok(()) | Err(crate::datastore::DatastoreError::NotFound(_)) => {
            tracing::info!(
                endpoint = %meta.name,
                container = %wep.spec.container_id,
                "GC removed a stale endpoint record"
            );
            Ok(())
        }
        Err(e) => Err(format!("endpoint {}: {e}", meta.name)),
    }
}

/// The Kubernetes datastore: the pods whose address annotations still name
/// a container calico-ipam of this network allocated for on this node and
/// that is not among the valid attachments (the pod outlived a sandbox
/// whose DEL never came) get them cleared, as DEL clears them, and their
/// host veth removed; left as they were, Calico's `ipam check` reports
/// their addresses as in use without an allocation once GC has released
/// them. The pods come from the allocations' attributes (the CNI's role may
/// not list pods). With host-local nothing names the pods: left alone.
async fn clear_stale_pods(ctx: &Context, valid: &[Attachment]) -> Result<()> {
    if ctx.req.conf.ipam.kind != "calico-ipam" {
        return Ok(());
    }
    let (Some(kdd), store) = (ctx.kdd(), ctx.store().await?) else {
        return Ok(());
    };
    let kept: HashSet<&str> = valid.iter().map(|a| a.container_id.as_str()).collect();
    let prefix = format!("{}.", ctx.req.conf.name);
    let handles = crate::ipam::calico::allocator::Allocator::new(store.as_ref(), &ctx.node)
        .host_handle_pods(&prefix)
        .await
        .map_err(Error::from)?;
    let mut errors = Vec::new();
    for (handle, pod) in handles {
        let cid = &handle[prefix.len()..];
        let Some((namespace, name)) = pod else {
            continue;
        };
        if kept.contains(cid) {
            continue;
        }
        let pod = match kdd.pod(&namespace, &name).await {
            Ok(Some(pod)) => pod,
            Ok(None) => continue,
            Err(e) => {
                errors.push(format!("pod {namespace}/{name}: {e}"));
                continue;
            }
        };
        let Some(wep) = kdd.endpoint_of(&pod, "eth0") else {
            continue;
        };
        let spec = &wep.spec;
        if spec.node != ctx.node || spec.container_id != cid || spec.ip_networks.is_empty() {
            continue;
        }
        if let Err(e) = collect(store.as_ref(), &wep, true).await {
            errors.push(e);
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::Datastore(errors.join("; ")))
    }
}

/// The stale endpoints of this node and network, with their host veths.
async fn remove_stale_endpoints(ctx: &Context, valid: &[Attachment]) -> Result<()> {
    let store = ctx.store().await?;
    if ctx.kdd().is_some() {
        return clear_stale_pods(ctx, valid).await;
    }
    let keep: HashSet<(&str, &str)> = valid
        .iter()
        .map(|a| (a.container_id.as_str(), a.ifname.as_str()))
        .collect();
    let kept_containers: HashSet<&str> = valid.iter().map(|a| a.container_id.as_str()).collect();
    // Containers calico-ipam of this network allocated for on this node.
    let ours: HashSet<String> = if ctx.req.conf.ipam.kind == "calico-ipam" {
        let prefix = format!("{}.", ctx.req.conf.name);
        crate::ipam::calico::allocator::Allocator::new(store.as_ref(), &ctx.node)
            .host_handles(&prefix)
            .await
            .map_err(Error::from)?
            .into_iter()
            .map(|h| h[prefix.len()..].to_string())
            .collect()
    } else {
        HashSet::new()
    };
    let endpoints = store
        .list::<WorkloadEndpoint>("", &ListFilter::All)
        .await
        .map_err(|e| e.context("error listing WorkloadEndpoints"))?;
    let mut errors = Vec::new();
    for wep in endpoints {
        let spec = &wep.spec;
        let stale = spec.node == ctx.node
            && !spec.container_id.is_empty()
            && !keep.contains(&(spec.container_id.as_str(), spec.endpoint.as_str()))
            && of_this_network(ctx, &wep, &ours);
        if !stale {
            continue;
        }
        // The host veth: when no valid attachment of the same container
        // could be using it.
        let veth = !kept_containers.contains(spec.container_id.as_str());
        if let Err(e) = collect(store.as_ref(), &wep, veth).await {
            errors.push(e);
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::Datastore(errors.join("; ")))
    }
}
