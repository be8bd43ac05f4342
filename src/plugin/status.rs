//! STATUS (spec 1.1.0): whether this network can serve an ADD now — the
//! datastore answers and is ready, the Kubernetes credentials are accepted
//! and not about to expire, and the IPAM can give this node an address.
//! Releases owed by earlier DELs are reported (logged) by the release
//! queue that wraps this verb, never a reason to fail.

use std::time::SystemTime;

use crate::cni::{Error, Result};
use crate::plugin::context::Context;

/// STATUS: ready when the datastore answers and is ready, the Kubernetes
/// token (when one is used) is valid beyond the margin, and the IPAM's
/// STATUS passes; code 50 with the reason otherwise.
pub async fn cmd_status(ctx: &Context) -> Result<()> {
    let req = &ctx.req;
    let not_available = |e: Error| Error::not_available_caused("", e);
    ctx.ensure_ready().await.map_err(not_available)?;
    token_lasts(ctx).await?;
    ctx.ipam()
        .await
        .map_err(not_available)?
        .status(&req.raw)
        .await
        .map_err(|e| {
            Error::not_available_caused(
                format!("IPAM plugin {} is not ready", req.conf.ipam.kind),
                e,
            )
        })
}

/// The token the Kubernetes client presents (when the config names one)
/// expires later than the margin from now.
async fn token_lasts(ctx: &Context) -> Result<()> {
    let conf = &ctx.req.conf;
    let uses_kubernetes =
        crate::datastore::open::presents_kubernetes_token(conf, &ctx.req.env.vars)
            .map_err(|e| Error::not_available_caused("", e))?;
    if !uses_kubernetes {
        return Ok(());
    }
    let client = ctx
        .k8s()
        .await
        .map_err(|e| Error::not_available_caused("", e))?;
    let Some((expires, from)) = client.token_expiry() else {
        return Ok(());
    };
    let margin = conf.token_expiry_margin();
    let now = SystemTime::now();
    if expires > now + margin {
        return Ok(());
    }
    let when = crate::k8s::client::rfc3339(expires);
    Err(Error::not_available(match expires.duration_since(now) {
        Ok(left) => format!(
            "{from} expires at {when}, in {} s (within the {} s margin): it is not being renewed (calico install --watch or calico-node renews it)",
            left.as_secs(),
            margin.as_secs()
        ),
        Err(_) => format!(
            "{from} expired at {when}: it is not being renewed (calico install --watch or calico-node renews it)"
        ),
    }))
}
