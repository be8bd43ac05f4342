//! cmdDel (calico-behaviour.md §9.1) and, through the workload kind, CmdDelK8s (§9.2):
//! idempotent; the local part ([`crate::plugin::teardown`]: the interface,
//! the IPAM release keyed by this container ID) always runs, on a budget of
//! its own, even when the datastore is unavailable; the record part
//! ([`crate::plugin::endpoint::remove_record`]) runs beside it, and never
//! removes a newer sandbox's record. Every error is reported.

use crate::cni::{Error, Result};
use crate::plugin::context::Context;
use crate::plugin::endpoint::remove_record;
use crate::plugin::teardown::local_teardown;
use crate::plugin::workload::Workload;

/// cmdDel.
pub async fn cmd_del(ctx: &Context, workload: &dyn Workload) -> Result<()> {
    let req = &ctx.req;
    req.conf.check_nodename_file()?;
    let release = crate::ipam::release_config(req);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let ((released, cleanup), record) = tokio::join!(
        local_teardown(ctx, &release, rx, |w| workload.owns_host_veth(ctx, w)),
        remove_record(ctx, tx)
    );
    crate::fault::kill_point("del-endpoint");
    Error::all([cleanup, released, record])
}
