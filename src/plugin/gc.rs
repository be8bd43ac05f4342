//! GC (spec 1.1.0): what this network left on this node for attachments
//! that are not among `cni.dev/valid-attachments` is removed — the endpoint
//! records (wherever the datastore keeps them: the objects of the embedded
//! and etcd stores; on the Kubernetes datastore the pod's address
//! annotations, cleared as DEL clears them when they still name the
//! collected container — those pods are the ones this network's
//! allocations name, as the CNI may not list pods), their host veths, and
//! the allocations (the IPAM's own GC with the same list). Without the
//! list nothing is removed. Every item is tried; the errors are reported
//! together.

use std::collections::HashSet;

use crate::cni::request::Attachment;
use crate::cni::{Error, Result};
use crate::datastore::Precondition;
use crate::datastore::model::WorkloadEndpoint;
use crate::datastore::names::WepIdentifiers;
use crate::ipam::Owner;
use crate::plugin::context::Context;

/// cmdGC.
pub async fn cmd_gc(ctx: &Context) -> Result<()> {
    let valid = ctx.req.valid_attachments()?;
    let mut outcomes = Vec::new();
    match &valid {
        Some(valid) => outcomes.push(remove_stale_endpoints(ctx, valid).await),
        None => tracing::info!("GC without cni.dev/valid-attachments: nothing is collected"),
    }
    // The IPAM's own GC, with the same list (it decides without one).
    outcomes.push(match ctx.ipam().await {
        Ok(ipam) => ipam.gc(&ctx.req.raw, valid.as_deref()).await,
        Err(e) => Err(e),
    });
    Error::all(outcomes).map_err(|e| e.context("GC"))
}

/// Whether `wep` is one of this network's: a plain CNI endpoint carries the
/// network's profile; a Kubernetes one is this network's when its IPAM
/// allocated for its container.
fn of_this_network(ctx: &Context, wep: &WorkloadEndpoint, ours: &HashSet<&str>) -> bool {
    let network = &ctx.req.conf.name;
    match wep.spec.orchestrator.as_str() {
        "k8s" => ours.contains(wep.spec.container_id.as_str()),
        _ => wep.spec.profiles.iter().any(|p| p == network),
    }
}

/// The records GC looks at: every record the datastore can list, else
/// those of the pods this network's allocations name.
async fn candidates(ctx: &Context, owners: &[Owner]) -> Result<Vec<WorkloadEndpoint>> {
    let records = ctx.endpoints().await?;
    if let Some(all) = records
        .all()
        .await
        .map_err(|e| e.context("error listing WorkloadEndpoints"))?
    {
        return Ok(all);
    }
    let mut found = Vec::new();
    for owner in owners {
        let Some((namespace, pod)) = &owner.pod else {
            continue;
        };
        let ids = WepIdentifiers {
            node: ctx.node.clone(),
            orchestrator: "k8s".into(),
            endpoint: "eth0".into(),
            pod: pod.clone(),
            ..WepIdentifiers::default()
        };
        let Ok(name) = ids.name() else { continue };
        if let Some(wep) = records
            .get(namespace, &name)
            .await
            .map_err(|e| e.context(&format!("error getting pod {namespace}/{pod}")))?
        {
            found.push(wep);
        }
    }
    Ok(found)
}

/// The stale endpoint records of this node and network, with their host
/// veths.
async fn remove_stale_endpoints(ctx: &Context, valid: &[Attachment]) -> Result<()> {
    let keep: HashSet<(&str, &str)> = valid
        .iter()
        .map(|a| (a.container_id.as_str(), a.ifname.as_str()))
        .collect();
    let kept_containers: HashSet<&str> = valid.iter().map(|a| a.container_id.as_str()).collect();
    let owners = ctx.ipam().await?.owners().await?.unwrap_or_default();
    let ours: HashSet<&str> = owners.iter().map(|o| o.container_id.as_str()).collect();
    let in_pods = ctx.endpoints().await?.in_pods();
    let mut outcomes = Vec::new();
    for wep in candidates(ctx, &owners).await? {
        let spec = &wep.spec;
        let stale = spec.node == ctx.node
            && !spec.container_id.is_empty()
            && !keep.contains(&(spec.container_id.as_str(), spec.endpoint.as_str()))
            && of_this_network(ctx, &wep, &ours)
            // A pod whose addresses are cleared claims nothing any more.
            && !(in_pods && spec.ip_networks.is_empty());
        if !stale {
            continue;
        }
        // The host veth: when no valid attachment of the same container
        // could be using it.
        let veth = !kept_containers.contains(spec.container_id.as_str());
        outcomes.push(collect(ctx, &wep, veth).await);
    }
    Error::all(outcomes)
}

/// Removes a stale endpoint record (exactly as read: a writer that changed
/// it since wins) and, with `veth`, its host veth first.
async fn collect(ctx: &Context, wep: &WorkloadEndpoint, veth: bool) -> Result<()> {
    let name = &wep.spec.interface_name;
    if veth && !name.is_empty() {
        match ctx.dataplane().delete_host_link(name).await {
            Ok(true) => tracing::info!(veth = %name, "GC removed a stale host veth"),
            Ok(false) => {}
            Err(e) => return Err(Error::from(e).context(format!("host veth {name}"))),
        }
    }
    let meta = &wep.metadata;
    match ctx
        .endpoints()
        .await?
        .delete(&meta.namespace, &meta.name, &Precondition::exactly(meta))
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
        Err(e) => Err(e.context(&format!("endpoint {}", meta.name))),
    }
}
