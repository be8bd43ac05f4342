//! The `calico-ipam` personality: address management by this executable
//! itself. Not built yet: it allocates nothing, so there is nothing to
//! release, check or collect.

use crate::cni::{CniResult, Command, Error, Request, Result};

/// Answers one calico-ipam verb.
pub async fn handle(req: Request) -> Result<Option<CniResult>> {
    match req.env.command {
        Command::Version => unreachable!("VERSION is answered at the edge"),
        // Nothing is allocated by this personality yet, so there is nothing
        // to release, check or collect.
        Command::Del | Command::Check | Command::Gc => Ok(None),
        Command::Add => Err(Error::UnsupportedField(
            "ipam.type \"calico-ipam\" is not available in this build yet: use host-local".into(),
        )),
        Command::Status => Err(Error::NotAvailable(
            "calico-ipam address management is not available in this build yet".into(),
        )),
    }
}
