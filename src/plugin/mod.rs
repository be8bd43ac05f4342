//! The orchestration layer: the `calico` plugin's verbs — cmdAdd
//! ([`add`]), CmdAddK8s ([`add_k8s`]), cmdDel ([`del`]), CmdDelK8s
//! ([`del_k8s`]), CHECK ([`check`]), STATUS and GC ([`status`]) — each
//! driving IPAM, the dataplane and the datastore from one invocation
//! [`context::Context`] built once per call.

pub mod add;
pub mod add_k8s;
pub mod annotations;
mod check;
pub mod connection;
pub mod context;
mod del;
mod del_k8s;
pub mod gc;
pub mod journal;
pub mod readiness;
pub mod release_queue;
mod status;

use crate::cni::{CniResult, Command, Request, Result};

pub use add::cmd_add;
pub use add_k8s::cmd_add_k8s;
pub use check::cmd_check;
pub use context::Context;
pub use del::cmd_del;
pub use del_k8s::cmd_del_k8s;
pub use gc::cmd_gc;
pub use status::cmd_status;

/// Answers one calico verb. ADD, DEL and CHECK first replay their own
/// network's due releases (owed by earlier DELs); STATUS and GC every
/// network's. Owed releases are reported, never a reason for STATUS to
/// fail.
pub async fn handle(req: Request) -> Result<Option<CniResult>> {
    let ctx = Context::new(req);
    match ctx.req.env.command {
        Command::Add => {
            release_queue::drain_own(&ctx).await;
            cmd_add(&ctx).await.map(Some)
        }
        Command::Del => {
            // Its own entry, if the queue holds one, goes when it succeeds.
            let queued = release_queue::drain_own(&ctx).await;
            release_queue::del_and_account(&ctx, queued)
                .await
                .map(|()| None)
        }
        Command::Check => {
            release_queue::drain_own(&ctx).await;
            cmd_check(&ctx).await.map(|()| None)
        }
        Command::Status => {
            release_queue::sweep(&ctx).await;
            cmd_status(&ctx).await.map(|()| None)
        }
        Command::Gc => {
            release_queue::sweep(&ctx).await;
            cmd_gc(&ctx).await.map(|()| None)
        }
        Command::Version => unreachable!("VERSION is answered at the edge"),
    }
}

/// A test-only fault: fails the ADD right after `step` (or panics at
/// `start` for `panic`) when the environment asks for it (built only with the `fault-injection` feature).
#[cfg(feature = "fault-injection")]
pub fn inject_fault(ctx: &Context, step: &str) -> Result<()> {
    match ctx
        .req
        .env
        .vars
        .get("CALICO_CNI_FAIL_AFTER")
        .map(String::as_str)
    {
        Some("panic") if step == "start" => panic!("injected panic"),
        Some(s) if s == step => Err(crate::cni::Error::Internal(format!(
            "injected failure after {step}"
        ))),
        _ => Ok(()),
    }
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn inject_fault(_ctx: &Context, _step: &str) -> Result<()> {
    Ok(())
}
