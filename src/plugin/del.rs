//! cmdDel (§9.1): idempotent, and the local teardown (IPAM release keyed by
//! this container ID, the interface in this sandbox's netns) always runs,
//! on a budget of its own, even when the datastore is unavailable;
//! datastore errors are reported after it.

use crate::cni::env::Command;
use crate::cni::{Error, Result};
use crate::dataplane::linux::{CleanupOutcome, clean_up_namespace, delete_host_veth};
use crate::datastore::model::WorkloadEndpoint;
use crate::datastore::{DatastoreError, Precondition};
use crate::plugin::context::{Context, datastore_err};

/// What the record part learns for the local part: the endpoint found
/// for this sandbox (if any), sent as soon as it has been read.
pub type RecordFound = tokio::sync::oneshot::Sender<Option<WorkloadEndpoint>>;

/// The local part of a DEL: the interface in the sandbox's netns (or, when
/// the netns is gone, the host veth when `owns_veth` says the record makes
/// it this container's), then the IPAM release of `release` (keyed by the
/// container ID), bounded by the cleanup budget rather than the call's
/// deadline. The address is released only once the interface that held it
/// (and its host route) is gone: released earlier, a new pod on this node
/// could be given it while the old route still points at the old veth.
pub async fn local_teardown(
    ctx: &Context,
    release: &serde_json::Value,
    record: tokio::sync::oneshot::Receiver<Option<WorkloadEndpoint>>,
    owns_veth: impl FnOnce(Option<&WorkloadEndpoint>) -> bool,
) -> (Result<()>, Result<()>) {
    let started = tokio::time::Instant::now();
    let req = &ctx.req;
    let deadline = req.deadline + crate::plugin::context::CLEANUP_GRACE;
    // An exec'd IPAM is started now so that its start-up overlaps the
    // kernel's work below; it reads its config first, so it releases
    // nothing until it is given it, after the interface is gone.
    let exec = ctx.ipam_exec_until(deadline);
    let early = match &exec {
        Some(plugin) => Some(plugin.spawn(Command::Del).await),
        None => None,
    };
    let cleanup = clean_up_namespace(&req.env.netns, &req.env.ifname, deadline)
        .await
        .map_err(Error::from);
    tracing::debug!("netns cleanup done after {:?}", started.elapsed());
    crate::fault::kill_point("del-netns");
    let cleanup = match cleanup {
        Ok(CleanupOutcome::NetnsGone) => {
            // The sandbox is gone but its host veth may not be: it is
            // removed only when it is certainly this container's.
            let found = tokio::time::timeout_at(req.deadline, record)
                .await
                .ok()
                .and_then(|r| r.ok())
                .flatten();
            if owns_veth(found.as_ref()) {
                remove_orphan_veth(ctx, deadline).await
            } else {
                Ok(())
            }
        }
        Ok(CleanupOutcome::LinkGone | CleanupOutcome::Deleted) => Ok(()),
        Err(e) => Err(e),
    };
    let ipam = match (&exec, early) {
        (Some(plugin), Some(Ok(running))) => {
            plugin.run_on(Command::Del, release, Some(running)).await
        }
        (_, Some(Err(e))) => Err(e),
        _ => match ctx.ipam_until(deadline).await {
            Ok(ipam) => ipam.run(Command::Del, release).await,
            Err(e) => Err(e),
        },
    };
    tracing::debug!("IPAM DEL done after {:?}", started.elapsed());
    crate::fault::kill_point("del-ipam");
    (ipam, cleanup)
}

/// Deletes the host veth of a sandbox whose netns is gone, by `deadline`.
async fn remove_orphan_veth(ctx: &Context, deadline: tokio::time::Instant) -> Result<()> {
    let veth = &ctx.host_veth;
    match tokio::time::timeout_at(deadline, delete_host_veth(veth)).await {
        Ok(Ok(true)) => {
            tracing::info!(%veth, "removed the host veth of a sandbox whose netns is gone");
            Ok(())
        }
        Ok(Ok(false)) => Ok(()),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => Err(Error::TryAgainLater(format!(
            "timed out deleting the host veth {veth}"
        ))),
    }
}

/// cmdDel.
pub async fn cmd_del(ctx: &Context) -> Result<()> {
    let req = &ctx.req;
    req.conf.check_nodename_file()?;
    if req.env.args.k8s_pod().is_some() {
        return crate::plugin::cmd_del_k8s(ctx).await;
    }
    // The host veth of a sandbox whose netns is gone is removed when it is
    // recorded as this container's, or (plain CNI) named after this
    // container ID.
    let plain = ctx.ids.orchestrator == "cni";
    let owns_veth = |w: Option<&WorkloadEndpoint>| {
        plain || w.is_some_and(|w| w.spec.interface_name == ctx.host_veth)
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let release = crate::ipam::release_config(req);
    let ((ipam_result, cleanup), record_result) = tokio::join!(
        local_teardown(ctx, &release, rx, owns_veth),
        remove_record(ctx, tx)
    );
    crate::fault::kill_point("del-endpoint");
    cleanup?;
    ipam_result?;
    record_result
}

/// Looks the endpoint record up and deletes it when it is this container's,
/// guarded by its uid so that a newer sandbox's record is never removed.
/// The record read is handed to the local part through `found`.
async fn remove_record(ctx: &Context, found_tx: RecordFound) -> Result<()> {
    let found = async {
        let name = ctx.endpoint_name()?;
        let store = ctx.store().await?;
        ctx.ensure_ready().await?;
        store
            .get::<WorkloadEndpoint>(&ctx.namespace, &name)
            .await
            .map_err(datastore_err("error getting WorkloadEndpoint"))
    };
    let w = match found.await {
        Ok(Some(w)) => w,
        Ok(None) => {
            let _ = found_tx.send(None);
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let _ = found_tx.send(Some(w.clone()));
    if !(w.spec.container_id.is_empty() || w.spec.container_id == ctx.req.env.container_id) {
        tracing::info!(owner = %w.spec.container_id, "endpoint belongs to another container; left alone");
        return Ok(());
    }
    let pre = Precondition {
        resource_version: None,
        uid: Some(w.metadata.uid.clone()).filter(|u| !u.is_empty()),
    };
    let store = ctx.store().await?;
    match store
        .delete::<WorkloadEndpoint>(&w.metadata.namespace, &w.metadata.name, &pre)
        .await
    {
        Ok(()) | Err(DatastoreError::NotFound(_)) => Ok(()),
        Err(e) => Err(e.context("error deleting WorkloadEndpoint")),
    }
}
