//! STATUS (spec 1.1.0).

use crate::cni::env::Command;
use crate::cni::{Error, Result};
use crate::plugin::context::Context;

/// STATUS: ready when the datastore answers and is ready, and the IPAM
/// plugin's STATUS passes; code 50 with the reason otherwise.
pub async fn cmd_status(ctx: &Context) -> Result<()> {
    let req = &ctx.req;
    let not_available = |e: Error| Error::NotAvailable(e.to_string());
    ctx.ensure_ready().await.map_err(not_available)?;
    ctx.ipam()
        .await
        .map_err(not_available)?
        .run_v11_verb(Command::Status, &req.raw)
        .await
        .map_err(|e| {
            Error::NotAvailable(format!(
                "IPAM plugin {} is not ready: {e}",
                req.conf.ipam.kind
            ))
        })
}
