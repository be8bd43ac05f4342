//! The durable release queue (field-problems: addresses leaked and pods
//! stuck in Terminating when DEL meets a down datastore). A DEL whose
//! local teardown completed but whose datastore part (IPAM release,
//! endpoint delete) failed records what it owes in the [`Journal`] and
//! still fails with a retryable error, as before. Every later invocation
//! on the node first drains what is due, within a small budget: a drain is
//! the DEL of that attachment again, with no netns (its interface is gone),
//! so it releases exactly what that DEL releases — the handle of that
//! container ID, the record guarded by that container ID — and never an
//! address or endpoint of a newer sandbox. An ADD of the very attachment
//! supersedes its entry (the new sandbox owns the identity; its DEL
//! releases everything under it). STATUS and GC drain every entry, not
//! only the due ones, and STATUS reports the entries that cannot drain.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::cni::env::{CniEnv, Command, Invocation};
use crate::cni::{Error, NetConf, Request, Result, Version};
use crate::plugin::context::Context;
use crate::plugin::journal::{Journal, KEPT_VARS, Owed, now_secs};

/// How long an ADD, DEL or CHECK may spend draining before its own work.
pub const DRAIN_BUDGET: Duration = Duration::from_secs(1);
/// How long STATUS and GC may spend draining.
pub const FULL_DRAIN_BUDGET: Duration = Duration::from_secs(3);

fn journal(conf: &NetConf) -> Journal {
    Journal::new(conf.release_queue_dir())
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

/// Whether a failed DEL is worth trying again later: not for a config or
/// environment it will never accept.
fn retryable(e: &Error) -> bool {
    !matches!(
        e,
        Error::InvalidConfig(_)
            | Error::Decode(_)
            | Error::InvalidEnv { .. }
            | Error::MissingEnv(_)
            | Error::IncompatibleVersion { .. }
            | Error::VerbNotAllowed { .. }
            | Error::UnsupportedField(_)
    )
}

/// Runs the DEL of `ctx` and accounts for it in the queue: done, its entry
/// (when `queued`: the queue holds one) goes; failed (retryably), what it
/// owes is recorded.
pub async fn del_and_account(ctx: &Context, queued: bool) -> Result<()> {
    let result = crate::plugin::cmd_del(ctx).await;
    let req = &ctx.req;
    let j = journal(&req.conf);
    let (network, cid, ifname) = (
        req.conf.name.clone(),
        req.env.container_id.clone(),
        req.env.ifname.clone(),
    );
    match &result {
        Ok(()) if queued => {
            blocking(move || j.remove(&network, &cid, &ifname)).await;
        }
        Ok(()) => {}
        Err(e) if retryable(e) => {
            let vars: HashMap<String, String> = KEPT_VARS
                .iter()
                .filter_map(|k| req.env.vars.get(*k).map(|v| (k.to_string(), v.clone())))
                .collect();
            let owed = Owed {
                network,
                container_id: cid,
                ifname,
                config: req.raw.clone(),
                vars,
                error: e.to_string(),
                attempts: 0,
                since: now_secs(),
                next_attempt: 0,
            };
            match blocking(move || j.record(owed)).await {
                Some(Ok(())) => tracing::warn!("DEL incomplete; what it owes is queued: {e}"),
                Some(Err(io)) => {
                    tracing::error!("DEL incomplete and its release could not be queued: {io}")
                }
                None => {}
            }
        }
        Err(_) => {}
    }
    result
}

/// The DEL request of an entry: its config and CNI variables, no netns,
/// bounded by `deadline`.
fn del_request(owed: &Owed, deadline: Instant) -> Result<Request> {
    let mut vars = owed.vars.clone();
    vars.insert("CNI_COMMAND".into(), "DEL".into());
    vars.insert("CNI_NETNS".into(), String::new());
    let env: CniEnv = match CniEnv::from_vars(vars)? {
        Invocation::Command(env) => *env,
        Invocation::About => return Err(Error::Internal("a queued DEL without a command".into())),
    };
    Ok(Request {
        env,
        conf: NetConf::from_value(&owed.config)?,
        version: Version::from_config(owed.config.get("cniVersion").and_then(|v| v.as_str()))?,
        raw: owed.config.clone(),
        deadline,
    })
}

/// Whether `owed` is the entry of the current call's attachment.
pub fn is_current(ctx: &Context, owed: &Owed) -> bool {
    let req = &ctx.req;
    owed.network == req.conf.name
        && owed.container_id == req.env.container_id
        && owed.ifname == req.env.ifname
}

/// Drains the queue of the current call's config before its verb runs:
/// due entries (every entry when `all`), within `budget`. An ADD of an
/// attachment with an entry supersedes it; the current DEL's own entry is
/// left to it. Returns the entries left afterwards.
pub async fn drain(ctx: &Context, all: bool, budget: Duration) -> Vec<Owed> {
    let req = &ctx.req;
    let j = journal(&req.conf);
    let entries = {
        let j = j.clone();
        blocking(move || j.entries()).await.unwrap_or_default()
    };
    if entries.is_empty() {
        return entries;
    }
    let end = Instant::now() + budget;
    let work = async {
        for owed in &entries {
            if is_current(ctx, owed) {
                if req.env.command == Command::Add {
                    tracing::info!(container = %owed.container_id, "a new ADD supersedes the queued release");
                    let (j, o) = (j.clone(), owed.clone());
                    blocking(move || j.remove(&o.network, &o.container_id, &o.ifname)).await;
                }
                continue;
            }
            if !all && owed.next_attempt > now_secs() {
                continue;
            }
            let request = match del_request(owed, end) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(container = %owed.container_id, "a queued release cannot be read back: {e}");
                    continue;
                }
            };
            let queued = Context::new(request);
            match Box::pin(del_and_account(&queued, true)).await {
                Ok(()) => tracing::info!(
                    container = %owed.container_id,
                    network = %owed.network,
                    attempts = owed.attempts + 1,
                    "a queued release was made"
                ),
                Err(e) => {
                    tracing::info!(container = %owed.container_id, "a queued release failed again: {e}")
                }
            }
        }
    };
    if tokio::time::timeout_at(end, work).await.is_err() {
        tracing::info!("the release queue's budget ran out; the rest waits for the next call");
    }
    blocking(move || j.entries()).await.unwrap_or_default()
}
