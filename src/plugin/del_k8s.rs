//! CmdDelK8s (§9.2). Unlike Calico, the local teardown (the interface in
//! this sandbox's netns, and the IPAM release keyed by this container ID)
//! always completes, whatever the API server does; only the record is left
//! alone when it cannot be read, or belongs to a newer sandbox.

use crate::cni::{Error, Result};
use crate::datastore::model::WorkloadEndpoint;
use crate::datastore::{DatastoreError, Precondition};
use crate::ipam::release_config;
use crate::plugin::context::{Context, datastore_err};
use crate::plugin::del::{RecordFound, local_teardown};

/// Attempts at deleting the record when it keeps changing underneath.
const DELETE_ATTEMPTS: usize = 6;

/// The record part: look the endpoint up and, unless it belongs to another
/// container, clear it under resourceVersion and uid preconditions,
/// retrying on conflict. The first read is handed to the local part
/// through `found_tx`.
async fn remove_record(ctx: &Context, found_tx: RecordFound) -> Result<()> {
    let mut found_tx = Some(found_tx);
    let opened = async {
        let name = ctx.endpoint_name()?;
        let store = ctx.store().await?;
        ctx.ensure_ready().await?;
        Ok::<_, Error>((name, store))
    };
    let (name, store) = opened.await?;
    let namespace = &ctx.namespace;
    for attempt in 1..=DELETE_ATTEMPTS {
        let wep = match store.get::<WorkloadEndpoint>(namespace, &name).await {
            Ok(Some(w)) => w,
            Ok(None) => {
                tracing::info!(endpoint = %name, "endpoint does not exist; nothing to remove");
                return Ok(());
            }
            Err(e) => return Err(e.context(&format!("error getting WorkloadEndpoint {name}"))),
        };
        if let Some(tx) = found_tx.take() {
            let _ = tx.send(Some(wep.clone()));
        }
        if !wep.spec.container_id.is_empty() && wep.spec.container_id != ctx.req.env.container_id {
            tracing::info!(owner = %wep.spec.container_id, "endpoint belongs to a newer sandbox; left alone");
            return Ok(());
        }
        let pre = Precondition {
            resource_version: Some(wep.metadata.resource_version.clone()).filter(|v| !v.is_empty()),
            uid: Some(wep.metadata.uid.clone()).filter(|v| !v.is_empty()),
        };
        match store
            .delete::<WorkloadEndpoint>(namespace, &name, &pre)
            .await
        {
            Ok(()) | Err(DatastoreError::NotFound(_)) => return Ok(()),
            Err(DatastoreError::Conflict(e)) if attempt < DELETE_ATTEMPTS => {
                tracing::info!(
                    attempt,
                    "endpoint changed while deleting it ({e}); retrying"
                );
            }
            Err(DatastoreError::Conflict(e)) => {
                return Err(Error::Datastore(format!(
                    "error deleting endpoint: endpoint was modified before it could be deleted: {e}"
                )));
            }
            Err(e) => return Err(datastore_err("error deleting endpoint")(e)),
        }
    }
    unreachable!("the last attempt returns")
}

/// CmdDelK8s.
pub async fn cmd_del_k8s(ctx: &Context) -> Result<()> {
    let release = release_config(&ctx.req);
    // The host veth of a pod is named after the pod, not the sandbox: when
    // the netns is gone it is removed only when the record says it is this
    // container's.
    let owns_veth = |w: Option<&WorkloadEndpoint>| {
        w.is_some_and(|w| {
            w.spec.container_id == ctx.req.env.container_id
                && w.spec.interface_name == ctx.host_veth
        })
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let ((ipam_result, cleanup), record_result) = tokio::join!(
        local_teardown(ctx, &release, rx, owns_veth),
        remove_record(ctx, tx)
    );
    crate::fault::kill_point("del-endpoint");
    cleanup?;
    ipam_result?;
    record_result
}
