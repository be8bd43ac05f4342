//! STATUS (spec 1.1.0): whether this network can serve an ADD now.

use crate::cni::{Error, Result};
use crate::plugin::context::Context;

/// STATUS: ready when the datastore answers and is ready, and the IPAM's
/// STATUS passes; code 50 with the reason otherwise.
pub async fn cmd_status(ctx: &Context) -> Result<()> {
    let req = &ctx.req;
    let not_available = |e: Error| Error::NotAvailable(e.to_string());
    ctx.ensure_ready().await.map_err(not_available)?;
    ctx.ipam()
        .await
        .map_err(not_available)?
        .status(&req.raw)
        .await
        .map_err(|e| {
            Error::NotAvailable(format!(
                "IPAM plugin {} is not ready: {e}",
                req.conf.ipam.kind
            ))
        })
}
