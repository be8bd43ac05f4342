//! The orchestration layer of the `calico` plugin. One call: an invocation
//! [`context::Context`] built once, the workload kind chosen once
//! ([`workload::of`]: a plain container or a Kubernetes pod), and the verb
//! — cmdAdd ([`add`]; CmdAddK8s is the Kubernetes kind's plan,
//! [`workload::kubernetes`]), cmdDel ([`del`], with the kind's CmdDelK8s
//! rule), CHECK ([`check`]), STATUS ([`status`]), GC ([`gc`]) — driving
//! IPAM, the dataplane and the datastore through the context. Shared steps
//! have their own modules: the endpoint record ([`endpoint`]), the undo of
//! a failed ADD ([`rollback`]), DEL's local part ([`teardown`]). The
//! release queue ([`release_queue`], [`journal`]) wraps the verbs: ADD, DEL
//! and CHECK first replay what their network owes, STATUS and GC what
//! every network owes, and a DEL that could not finish its datastore part
//! is recorded after it.

pub mod add;
pub mod check;
pub mod connection;
pub mod context;
pub mod del;
pub mod endpoint;
pub mod gc;
pub mod journal;
pub mod pair_ahead;
pub mod policy_wait;
pub mod readiness;
pub mod release_queue;
pub mod rollback;
pub mod status;
pub mod status_cache;
pub mod status_watch;
pub mod teardown;
#[cfg(test)]
mod tests;
pub mod workload;

use crate::cni::{CniResult, Command, Request, Result};

pub use add::cmd_add;
pub use check::cmd_check;
pub use context::Context;
pub use del::cmd_del;
pub use gc::cmd_gc;
pub use status::cmd_status;

/// Answers one calico verb.
pub async fn handle(req: Request) -> Result<Option<CniResult>> {
    dispatch(&Context::new(req)).await
}

/// The verb of `ctx`'s request, inside the release queue.
pub async fn dispatch(ctx: &Context) -> Result<Option<CniResult>> {
    let workload = workload::of(ctx);
    match ctx.req.env.command {
        Command::Add => {
            release_queue::drain_own(ctx).await;
            cmd_add(ctx, workload).await.map(Some)
        }
        Command::Del => {
            // Its own entry, if the queue holds one, is settled by this DEL.
            let queued = release_queue::drain_own(ctx).await;
            let result = cmd_del(ctx, workload).await;
            release_queue::account(ctx, queued, &result).await;
            result.map(|()| None)
        }
        Command::Check => {
            release_queue::drain_own(ctx).await;
            cmd_check(ctx, workload).await.map(|()| None)
        }
        Command::Status => {
            release_queue::sweep(ctx).await;
            cmd_status(ctx).await.map(|()| None)
        }
        Command::Gc => {
            release_queue::sweep(ctx).await;
            cmd_gc(ctx).await.map(|()| None)
        }
        Command::Version => unreachable!("VERSION is answered at the edge"),
    }
}
