//! The undo of a failed ADD: what it has done so far, undone in reverse
//! on a budget of its own (the ADD's deadline may be what failed it), every
//! step tried and every failure logged.

use serde_json::Value;

use crate::datastore::Precondition;
use crate::ipam::Pending;
use crate::plugin::context::Context;

/// What an ADD has done so far.
#[derive(Default)]
pub struct Undo {
    /// The IPAM was given a config: release with this one.
    pub ipam_release: Option<Value>,
    /// A host veth that may have been made.
    pub host_veth: Option<String>,
    /// (namespace, name, uid) of an endpoint record this ADD created.
    pub endpoint: Option<(String, String, String)>,
}

impl Undo {
    /// Undoes every step: the record, the host veth (its peer goes with
    /// it), the allocation.
    pub async fn run(self, ctx: &Context) {
        let deadline = ctx.cleanup_deadline();
        let bounded = |what: &'static str| {
            move |_| tracing::error!("rollback: {what} did not finish within the cleanup budget")
        };
        if let Some((ns, name, uid)) = self.endpoint {
            let pre = Precondition {
                resource_version: None,
                uid: Some(uid),
            };
            let deleted = async {
                match ctx.endpoints().await {
                    Ok(records) => records
                        .delete(&ns, &name, &pre)
                        .await
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                }
            };
            match tokio::time::timeout_at(deadline, deleted).await {
                Ok(Err(e)) => {
                    tracing::error!("rollback: failed to delete WorkloadEndpoint {ns}/{name}: {e}")
                }
                Err(e) => bounded("deleting the WorkloadEndpoint")(e),
                Ok(Ok(())) => {}
            }
        }
        if let Some(veth) = self.host_veth {
            match tokio::time::timeout_at(deadline, ctx.dataplane().delete_host_link(&veth)).await {
                Ok(Err(e)) => tracing::error!("rollback: failed to delete veth {veth}: {e}"),
                Err(e) => bounded("deleting the host veth")(e),
                Ok(Ok(_)) => {}
            }
        }
        if let Some(config) = self.ipam_release {
            let released = async {
                ctx.ipam_for_cleanup()
                    .await?
                    .del(&config, Pending::none())
                    .await
            };
            if let Err(e) = released.await {
                tracing::error!("rollback: failed to release the IPAM allocation: {e}");
            }
        }
    }
}
