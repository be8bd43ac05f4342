//! CmdDelK8s (§9.2). Unlike Calico, the local teardown (the interface in
//! this sandbox's netns, and the IPAM release keyed by this container ID)
//! always completes, whatever the API server does; only the record is left
//! alone when it cannot be read, or belongs to a newer sandbox.

use crate::cni::env::Command;
use crate::cni::{Error, Request, Result};
use crate::dataplane::linux::{CleanupOutcome, clean_up_namespace, delete_host_veth};
use crate::datastore::model::WorkloadEndpoint;
use crate::datastore::{DatastoreError, Precondition};
use crate::k8s::add::release_config;
use crate::plugin::{ensure_ready, host_veth_name, identifiers, ipam, nodename, open_datastore};

/// Attempts at deleting the record when it keeps changing underneath.
const DELETE_ATTEMPTS: usize = 6;

/// The record part: look the endpoint up and, unless it belongs to another
/// container, clear it under resourceVersion and uid preconditions,
/// retrying on conflict. Returns the endpoint found (if it was this
/// container's).
async fn remove_record(req: &Request) -> (Option<WorkloadEndpoint>, Result<()>) {
    let (namespace, _) = req.env.args.k8s_pod().expect("k8s pods only");
    let name = match identifiers(req, &nodename(req)).name() {
        Ok(n) => n,
        Err(e) => {
            return (
                None,
                Err(Error::InvalidConfig(format!(
                    "error constructing WorkloadEndpoint name: {e}"
                ))),
            );
        }
    };
    let store = match open_datastore(req).await {
        Ok(s) => s,
        Err(e) => return (None, Err(e)),
    };
    if let Err(e) = ensure_ready(store.as_ref()).await {
        return (None, Err(e));
    }
    for attempt in 1..=DELETE_ATTEMPTS {
        let wep = match store.get_workload_endpoint(namespace, &name).await {
            Ok(Some(w)) => w,
            Ok(None) => {
                tracing::info!(endpoint = %name, "endpoint does not exist; nothing to remove");
                return (None, Ok(()));
            }
            Err(e) => {
                return (
                    None,
                    Err(Error::Datastore(format!(
                        "error getting WorkloadEndpoint {name}: {e}"
                    ))),
                );
            }
        };
        if !wep.spec.container_id.is_empty() && wep.spec.container_id != req.env.container_id {
            tracing::info!(owner = %wep.spec.container_id, "endpoint belongs to a newer sandbox; left alone");
            return (None, Ok(()));
        }
        let pre = Precondition {
            resource_version: Some(wep.metadata.resource_version.clone()).filter(|v| !v.is_empty()),
            uid: Some(wep.metadata.uid.clone()).filter(|v| !v.is_empty()),
        };
        match store.delete_workload_endpoint(namespace, &name, pre).await {
            Ok(()) | Err(DatastoreError::NotFound(_)) => return (Some(wep), Ok(())),
            Err(DatastoreError::Conflict(e)) if attempt < DELETE_ATTEMPTS => {
                tracing::info!(
                    attempt,
                    "endpoint changed while deleting it ({e}); retrying"
                );
            }
            Err(DatastoreError::Conflict(e)) => {
                return (
                    Some(wep),
                    Err(Error::Datastore(format!(
                        "error deleting endpoint: endpoint was modified before it could be deleted: {e}"
                    ))),
                );
            }
            Err(e) => {
                return (
                    Some(wep),
                    Err(Error::Datastore(format!("error deleting endpoint: {e}"))),
                );
            }
        }
    }
    unreachable!("the last attempt returns")
}

/// CmdDelK8s.
pub async fn cmd_del_k8s(req: &Request) -> Result<()> {
    let cleanup = clean_up_namespace(&req.env.netns, &req.env.ifname, req.deadline);
    let ipam = ipam(req);
    let release = release_config(req);
    let (ipam_result, cleanup, (wep, record_result)) = tokio::join!(
        ipam.run(Command::Del, &release),
        cleanup,
        remove_record(req)
    );
    if let Ok(CleanupOutcome::NetnsGone) = cleanup {
        // The host veth of a pod is named after the pod, not the sandbox:
        // it is removed only when the record says it is this container's.
        let veth = host_veth_name(req);
        if wep.as_ref().is_some_and(|w| {
            w.spec.container_id == req.env.container_id && w.spec.interface_name == veth
        }) && delete_host_veth(&veth).await?
        {
            tracing::info!(%veth, "removed the host veth of a sandbox whose netns is gone");
        }
    }
    cleanup?;
    ipam_result?;
    record_result
}
