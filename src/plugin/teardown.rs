//! DEL's local part: the interface in the sandbox's netns (or, when the
//! netns is gone, the host veth when the workload kind says the record
//! makes it this sandbox's), then the IPAM release of this container ID —
//! bounded by the cleanup budget rather than the call's deadline, so that
//! it completes even when the datastore is down or slow. The address is
//! released only once the interface that held it (and its host route) is
//! gone: released earlier, a new pod on this node could be given it while
//! the old route still points at the old veth.

use serde_json::Value;

use crate::cni::env::Command;
use crate::cni::{Error, Result};
use crate::dataplane::CleanupOutcome;
use crate::datastore::model::WorkloadEndpoint;
use crate::ipam::Pending;
use crate::plugin::context::{CLEANUP_GRACE, Context};

/// The local part of a DEL with `release` as the IPAM's config; `record`
/// brings the record the record part read (`owns_veth` decides on it).
/// Returns the IPAM release's and the interface's outcomes.
pub async fn local_teardown(
    ctx: &Context,
    release: &Value,
    record: tokio::sync::oneshot::Receiver<Option<WorkloadEndpoint>>,
    owns_veth: impl FnOnce(Option<&WorkloadEndpoint>) -> bool,
) -> (Result<()>, Result<()>) {
    let started = tokio::time::Instant::now();
    let req = &ctx.req;
    let deadline = req.deadline + CLEANUP_GRACE;
    // An exec'd IPAM is started now so that its start-up overlaps the
    // kernel's work below; it reads its config first, so it releases
    // nothing until it is given it, after the interface is gone.
    let ipam = match ctx.ipam().await {
        Ok(ipam) => Ok(ipam.until(deadline)),
        Err(e) => Err(e),
    };
    let pending = match &ipam {
        Ok(ipam) => Some(ipam.start(Command::Del).await),
        Err(_) => None,
    };
    let cleanup = ctx
        .dataplane()
        .clean_up(&req.env.netns, &req.env.ifname, deadline)
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
        Ok(CleanupOutcome::LinkGone | CleanupOutcome::Deleted | CleanupOutcome::Unlisted) => Ok(()),
        Err(e) => Err(e),
    };
    let released = match (ipam, pending) {
        (Ok(ipam), Some(Ok(pending))) => ipam.del(release, pending).await,
        (Ok(_), Some(Err(e))) | (Err(e), _) => Err(e),
        (Ok(ipam), None) => ipam.del(release, Pending::none()).await,
    };
    tracing::debug!("IPAM DEL done after {:?}", started.elapsed());
    crate::fault::kill_point("del-ipam");
    (released, cleanup)
}

/// Deletes the host veth of a sandbox whose netns is gone, by `deadline`.
async fn remove_orphan_veth(ctx: &Context, deadline: tokio::time::Instant) -> Result<()> {
    let veth = &ctx.host_veth;
    match tokio::time::timeout_at(deadline, ctx.dataplane().delete_host_link(veth)).await {
        Ok(Ok(true)) => {
            tracing::info!(%veth, "removed the host veth of a sandbox whose netns is gone");
            Ok(())
        }
        Ok(Ok(false)) => Ok(()),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => Err(Error::timed_out(format!(
            "timed out deleting the host veth {veth}"
        ))),
    }
}
