//! cmdDel (§9.1): idempotent, and the local teardown (IPAM release keyed by
//! this container ID, the interface in this sandbox's netns) always runs,
//! even when the datastore is unavailable; datastore errors are reported
//! after it.

use crate::cni::env::Command;
use crate::cni::{Error, Request, Result};
use crate::dataplane::linux::{CleanupOutcome, clean_up_namespace, delete_host_veth};
use crate::datastore::model::WorkloadEndpoint;
use crate::datastore::{Datastore, DatastoreError, Precondition};
use crate::plugin::{
    ensure_ready, host_veth_name, identifiers, ipam, nodename, open_datastore, wep_namespace,
};

/// The endpoint record of this container, if the datastore can tell.
async fn lookup(
    req: &Request,
    name: &Result<String>,
) -> (
    Option<std::sync::Arc<dyn Datastore>>,
    Result<Option<WorkloadEndpoint>>,
) {
    let store = match open_datastore(req).await {
        Ok(s) => s,
        Err(e) => return (None, Err(e)),
    };
    if let Err(e) = ensure_ready(store.as_ref()).await {
        return (Some(store), Err(e));
    }
    let name = match name {
        Ok(n) => n,
        Err(e) => return (Some(store), Err(Error::InvalidConfig(e.to_string()))),
    };
    let found = store
        .get_workload_endpoint(&wep_namespace(req), name)
        .await
        .map_err(|e| Error::Datastore(format!("error getting WorkloadEndpoint: {e}")));
    (Some(store), found)
}

/// cmdDel.
pub async fn cmd_del(req: &Request) -> Result<()> {
    req.conf.check_nodename_file()?;
    if req.env.args.k8s_pod().is_some() {
        return crate::k8s::cmd_del_k8s(req).await;
    }
    let node = nodename(req);
    let ids = identifiers(req, &node);
    let name = ids.name().map_err(|e| {
        Error::InvalidConfig(format!("error constructing WorkloadEndpoint name: {e}"))
    });
    // The three parts run at once: the kernel's veth teardown (on its own
    // thread), the IPAM plugin's release (its own process) and the record.
    let started = tokio::time::Instant::now();
    let cleanup = clean_up_namespace(&req.env.netns, &req.env.ifname, req.deadline);
    let ipam = ipam(req);
    let (ipam_result, cleanup, (wep, record_result)) = tokio::join!(
        async {
            let r = ipam.run(Command::Del, &req.raw).await;
            tracing::debug!("IPAM DEL done after {:?}", started.elapsed());
            r
        },
        async {
            let r = cleanup.await;
            tracing::debug!("netns cleanup done after {:?}", started.elapsed());
            r
        },
        async {
            let r = remove_record(req, &name).await;
            tracing::debug!("record removal done after {:?}", started.elapsed());
            r
        }
    );

    if let Ok(CleanupOutcome::NetnsGone) = cleanup {
        // The sandbox is gone but its host veth may not be. It is removed
        // only when it is certainly this container's: recorded as this
        // container's, or (plain CNI) named after this container ID.
        let veth = host_veth_name(req);
        let recorded = wep.as_ref().is_some_and(|w| w.spec.interface_name == veth);
        if (recorded || ids.orchestrator == "cni") && delete_host_veth(&veth).await? {
            tracing::info!(%veth, "removed the host veth of a sandbox whose netns is gone");
        }
    }
    cleanup?;
    ipam_result?;
    record_result
}

/// Looks the endpoint record up and deletes it when it is this container's,
/// guarded by its uid so that a newer sandbox's record is never removed.
/// Returns the record it removed, if any.
async fn remove_record(
    req: &Request,
    name: &Result<String>,
) -> (Option<WorkloadEndpoint>, Result<()>) {
    let (store, wep) = lookup(req, name).await;
    let w = match wep {
        Ok(Some(w)) => w,
        Ok(None) => return (None, Ok(())),
        Err(e) => return (None, Err(e)),
    };
    if !(w.spec.container_id.is_empty() || w.spec.container_id == req.env.container_id) {
        tracing::info!(owner = %w.spec.container_id, "endpoint belongs to another container; left alone");
        return (None, Ok(()));
    }
    let Some(store) = store else {
        return (None, Ok(()));
    };
    let pre = Precondition {
        resource_version: None,
        uid: Some(w.metadata.uid.clone()).filter(|u| !u.is_empty()),
    };
    let result = match store
        .delete_workload_endpoint(&w.metadata.namespace, &w.metadata.name, pre)
        .await
    {
        Ok(()) | Err(DatastoreError::NotFound(_)) => Ok(()),
        Err(e) => Err(Error::Datastore(format!(
            "error deleting WorkloadEndpoint: {e}"
        ))),
    };
    (Some(w), result)
}
