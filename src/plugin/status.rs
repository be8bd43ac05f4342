//! STATUS and GC (spec 1.1.0).

use crate::cni::env::Command;
use crate::cni::{Error, Request, Result};
use crate::plugin::{ensure_ready, ipam, open_datastore};

/// STATUS: ready when the datastore answers and is ready, and the IPAM
/// plugin's STATUS passes; code 50 with the reason otherwise.
pub async fn cmd_status(req: &Request) -> Result<()> {
    let not_available = |e: Error| Error::NotAvailable(e.to_string());
    let store = open_datastore(req).await.map_err(not_available)?;
    ensure_ready(store.as_ref()).await.map_err(not_available)?;
    ipam(req)
        .run_v11_verb(Command::Status, &req.raw)
        .await
        .map_err(|e| {
            Error::NotAvailable(format!(
                "IPAM plugin {} is not ready: {e}",
                req.conf.ipam.kind
            ))
        })
}

/// GC: forwarded to the IPAM plugin (which owns the reservations); the
/// endpoint records of this plugin are removed by DEL.
pub async fn cmd_gc(req: &Request) -> Result<()> {
    ipam(req).run_v11_verb(Command::Gc, &req.raw).await
}
