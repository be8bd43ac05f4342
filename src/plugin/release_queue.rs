//! The durable release queue (for the addresses leaked and the pods stuck
//! in Terminating when a DEL meets a down datastore). It wraps the
//! verbs from the dispatcher: a DEL whose local teardown completed but whose
//! datastore part (IPAM release, endpoint delete) failed is recorded after
//! it ([`account`]) in the [`Journal`] and still fails with a retryable
//! error. A replay is the DEL of
//! that attachment again, with no netns (its interface is gone), so it
//! releases exactly what that DEL releases — the handle of that container
//! ID, the record guarded by that container ID — and never an address or
//! endpoint of a newer sandbox. An ADD of the very attachment supersedes
//! its entry (the new sandbox owns the identity; its DEL releases
//! everything under it).
//!
//! What a call pays, and when an entry is tried:
//! - ADD, DEL and CHECK look only at their own network's entries (one
//!   directory read; nothing when the network has none) and replay the
//!   ones that are due, each once, within [`DRAIN_BUDGET`], until one
//!   fails (the network's other entries most likely need the same
//!   datastore: they wait for the next call);
//! - each replay has [`REPLAY_BUDGET`]: a datastore that does not answer
//!   costs a call one short attempt, not its whole budget;
//! - STATUS and GC also replay the due entries of every other network
//!   (networks removed from the node included), each once, within
//!   [`SWEEP_BUDGET`], so that every entry is tried and, when it cannot
//!   succeed, given up on;
//! - every failed attempt, whatever the error, counts: `attempts` grows and
//!   the entry is next due after [`backoff`] (5 s doubling to 5 min);
//! - an entry is given up on — moved to the dead letters with one warning,
//!   listed and replayed by `calico ipam queue` — after
//!   [`FUTILE_ATTEMPTS`] failed attempts when its error says it cannot
//!   succeed as recorded (its config no longer parses, its IPAM plugin or
//!   CNI_PATH is gone), and after [`MAX_AGE`] whatever the error (a
//!   datastore decommissioned, credentials refused for days);
//! - owed releases never make STATUS fail: they are logged; STATUS fails
//!   only for what stops this network from serving an ADD.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

use crate::cni::env::{CniEnv, Command, Invocation};
use crate::cni::{Error, NetConf, Request, Result, Version};
use crate::plugin::context::Context;
use crate::plugin::journal::{Journal, KEPT_VARS, Owed, backoff, entry_name, now_secs};

/// How long an ADD, DEL or CHECK may spend on its network's due entries.
pub const DRAIN_BUDGET: Duration = Duration::from_secs(1);
/// How long one replay may take. A healthy one takes milliseconds; a
/// datastore that does not answer would otherwise hold the call for the
/// whole budget (etcd's client pauses and asks again for a while when no
/// member answers, which an ADD that waits for its own answer wants, and a
/// replay, which comes back after its backoff anyway, does not).
pub const REPLAY_BUDGET: Duration = Duration::from_millis(300);
/// How long STATUS and GC may spend on every network's due entries.
pub const SWEEP_BUDGET: Duration = Duration::from_secs(3);
/// Failed attempts after which an entry that cannot succeed as recorded
/// (see [`cannot_succeed`]) is given up on: with the backoff, about ten
/// minutes of calls.
pub const FUTILE_ATTEMPTS: u32 = 5;
/// The age after which an entry is given up on at its next failed
/// attempt, whatever the error.
pub const MAX_AGE: Duration = Duration::from_secs(48 * 3600);

fn journal(conf: &NetConf) -> Journal {
    Journal::new(conf.release_queue_dir())
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    crate::handoff::spawn_blocking(f).await.ok()
}

/// Whether a failed DEL is worth recording: not for a config or
/// environment it will never accept (the runtime's own retry gets the same
/// answer). Of a DEL whose parts failed differently, yes when one part may
/// succeed later (the endpoint's delete once the datastore is back, say).
fn worth_queueing(e: &Error) -> bool {
    match e {
        Error::Several(parts) => parts.iter().any(worth_queueing),
        e => !cannot_succeed(e),
    }
}

/// Whether an error says the DEL cannot succeed as recorded, however often
/// it is tried: its config or variables are refused, or its IPAM plugin
/// (or the CNI_PATH holding it) is gone — in any of its parts, when
/// several failed (the part that cannot succeed fails every replay).
pub fn cannot_succeed(e: &Error) -> bool {
    if let Error::Several(parts) = e {
        return parts.iter().any(cannot_succeed);
    }
    matches!(
        e,
        Error::InvalidConfig { .. }
            | Error::Decode { .. }
            | Error::InvalidEnv { .. }
            | Error::MissingEnv(_)
            | Error::IncompatibleVersion { .. }
            | Error::VerbNotAllowed { .. }
            | Error::UnsupportedField { .. }
    )
}

/// Why `owed`, which has just failed again with `e`, is given up on; `None`
/// while it is still worth trying.
fn give_up(owed: &Owed, e: &Error) -> Option<String> {
    let age = now_secs().saturating_sub(owed.since);
    if age >= MAX_AGE.as_secs() {
        return Some(format!(
            "still failing after {} h ({} attempts): {e}",
            age / 3600,
            owed.attempts
        ));
    }
    if cannot_succeed(e) && owed.attempts >= FUTILE_ATTEMPTS {
        return Some(format!(
            "cannot succeed as recorded ({} attempts): {e}",
            owed.attempts
        ));
    }
    None
}

/// Accounts for the DEL of `ctx` that ended with `result`: done, its
/// entry (when `queued`: the queue holds one) goes; failed (for a reason a
/// later attempt may not meet), what it owes is recorded.
pub async fn account(ctx: &Context, queued: bool, result: &Result<()>) {
    let req = &ctx.req;
    let j = journal(&req.conf);
    let (network, cid, ifname) = (
        req.conf.name.clone(),
        req.env.container_id.clone(),
        req.env.ifname.clone(),
    );
    match result {
        Ok(()) if queued => {
            blocking(move || j.remove(&network, &cid, &ifname)).await;
        }
        Ok(()) => {}
        Err(e) if worth_queueing(e) => {
            let vars: HashMap<String, String> = KEPT_VARS
                .iter()
                .filter_map(|k| req.env.vars.get(*k).map(|v| (k.to_string(), v.clone())))
                .collect();
            let owed = Owed::new(network, cid, ifname, req.raw.clone(), vars, e.to_string());
            match blocking(move || j.record(owed)).await {
                Some(Ok(_)) => tracing::warn!("DEL incomplete; what it owes is queued: {e}"),
                Some(Err(io)) => {
                    tracing::error!("DEL incomplete and its release could not be queued: {io}")
                }
                None => {}
            }
        }
        Err(_) => {}
    }
}

/// The DEL request of an entry: its config and CNI variables, no netns,
/// bounded by `deadline`.
fn del_request(owed: &Owed, deadline: Instant) -> Result<Request> {
    let mut vars = owed.vars.clone();
    vars.insert("CNI_COMMAND".into(), "DEL".into());
    vars.insert("CNI_NETNS".into(), String::new());
    let env: CniEnv = match CniEnv::from_vars(vars)? {
        Invocation::Command(env) => *env,
        Invocation::About => return Err(Error::internal("a queued DEL without a command")),
    };
    Ok(Request {
        env,
        conf: NetConf::from_value(&owed.config)?,
        version: Version::from_config(owed.config.get("cniVersion").and_then(|v| v.as_str()))?,
        raw: owed.config.clone(),
        deadline,
    })
}

/// How one replay ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replayed {
    Released,
    /// Failed; tried again after its backoff.
    Failed(String),
    /// Failed and given up on (a dead letter now).
    GivenUp(String),
}

/// Replays `owed` (the entry at its path) once, bounded by `deadline`, and
/// records how it ended: the entry removed, rescheduled with one more
/// failed attempt, or moved to the dead letters.
pub async fn replay(j: &Journal, mut owed: Owed, deadline: Instant) -> Replayed {
    let outcome = match del_request(&owed, deadline) {
        Ok(request) => {
            let queued = Context::new(request);
            let workload = crate::plugin::workload::of(&queued);
            match tokio::time::timeout_at(
                deadline,
                Box::pin(crate::plugin::del::cmd_del(&queued, workload)),
            )
            .await
            {
                Ok(result) => result,
                Err(_) => Err(Error::timed_out("the replay ran out of its budget")),
            }
        }
        Err(e) => Err(e),
    };
    let (network, cid) = (owed.network.clone(), owed.container_id.clone());
    match outcome {
        Ok(()) => {
            let (j, o) = (j.clone(), owed.clone());
            blocking(move || j.remove(&o.network, &o.container_id, &o.ifname)).await;
            tracing::info!(container = %cid, %network, attempts = owed.attempts + 1, "a queued release was made");
            Replayed::Released
        }
        Err(e) => {
            let now = now_secs();
            owed.attempts += 1;
            owed.last_attempt = now;
            owed.error = e.to_string();
            owed.next_attempt = now + backoff(owed.attempts).as_secs();
            let j = j.clone();
            match give_up(&owed, &e) {
                Some(reason) => {
                    tracing::warn!(
                        container = %cid,
                        %network,
                        "a queued release is given up on and kept as a dead letter ({}): {reason}",
                        "`calico ipam queue list --dead`, `calico ipam queue replay`"
                    );
                    let r = reason.clone();
                    if let Some(Err(io)) = blocking(move || j.dead_letter(owed, &r)).await {
                        tracing::error!("cannot move the entry to the dead letters: {io}");
                    }
                    Replayed::GivenUp(reason)
                }
                None => {
                    tracing::info!(container = %cid, %network, attempts = owed.attempts, "a queued release failed again: {e}");
                    if let Some(Err(io)) = blocking(move || j.write(&owed)).await {
                        tracing::error!("cannot reschedule the queued release: {io}");
                    }
                    Replayed::Failed(e.to_string())
                }
            }
        }
    }
}

/// Replays the due entries at `paths`, each once and within
/// [`REPLAY_BUDGET`], until `end`; with `until_a_failure`, none after one
/// that failed and is still owed.
async fn replay_due(j: &Journal, paths: Vec<PathBuf>, end: Instant, until_a_failure: bool) {
    let work = async {
        for path in paths {
            let (jr, p) = (j.clone(), path.clone());
            let Some(Some(owed)) = blocking(move || jr.read(&p)).await else {
                continue;
            };
            let until = end.min(Instant::now() + REPLAY_BUDGET);
            if let Replayed::Failed(_) = replay(j, owed, until).await
                && until_a_failure
            {
                tracing::info!(
                    "a queued release failed; the network's other due entries wait for the next call"
                );
                break;
            }
        }
    };
    if tokio::time::timeout_at(end, work).await.is_err() {
        tracing::info!("the release queue's budget ran out; the rest waits for the next call");
    }
}

/// Before ADD, DEL or CHECK: this network's due entries replayed (the
/// current attachment's aside: an ADD supersedes it, a DEL settles it).
/// Returns whether the queue holds the current attachment's entry.
pub async fn drain_own(ctx: &Context) -> bool {
    let req = &ctx.req;
    let j = journal(&req.conf);
    let listing = {
        let (j, network) = (j.clone(), req.conf.name.clone());
        blocking(move || j.list(&network)).await.unwrap_or_default()
    };
    if listing.entries.is_empty() {
        return false;
    }
    let current = entry_name(&req.env.container_id, &req.env.ifname);
    let holds_current = listing.holds(&current);
    if holds_current && req.env.command == Command::Add {
        tracing::info!(container = %req.env.container_id, "a new ADD supersedes the queued release");
        let (jr, network, cid, ifname) = (
            j.clone(),
            req.conf.name.clone(),
            req.env.container_id.clone(),
            req.env.ifname.clone(),
        );
        blocking(move || jr.remove(&network, &cid, &ifname)).await;
    }
    let due: Vec<PathBuf> = listing
        .due()
        .filter(|p| p.file_name().is_none_or(|n| *n != *current))
        .map(PathBuf::from)
        .collect();
    if !due.is_empty() {
        replay_due(&j, due, Instant::now() + DRAIN_BUDGET, true).await;
    }
    holds_current && req.env.command != Command::Add
}

/// What STATUS and GC found in the queue after their sweep.
#[derive(Debug, Default)]
pub struct Sweep {
    /// Entries still owed, by every network.
    pub pending: Vec<Owed>,
    /// Dead letters.
    pub dead: usize,
}

/// STATUS and GC: the due entries of this network, then of every other,
/// replayed once each within [`SWEEP_BUDGET`]; then what is left, logged.
pub async fn sweep(ctx: &Context) -> Sweep {
    let req = &ctx.req;
    let j = journal(&req.conf);
    let (due, own) = {
        let (j, own) = (j.clone(), req.conf.name.clone());
        blocking(move || {
            let mut networks = j.networks();
            // Its own network first.
            networks.sort_by_key(|n| *n != own);
            let due: Vec<PathBuf> = networks
                .iter()
                .flat_map(|n| {
                    let listing = j.list(n);
                    listing.due().map(PathBuf::from).collect::<Vec<_>>()
                })
                .collect();
            (due, own)
        })
        .await
        .unwrap_or_default()
    };
    if !due.is_empty() {
        replay_due(&j, due, Instant::now() + SWEEP_BUDGET, false).await;
    }
    let sweep = blocking(move || Sweep {
        pending: j.pending().into_iter().map(|(_, o)| o).collect(),
        dead: j.dead().len(),
    })
    .await
    .unwrap_or_default();
    if !sweep.pending.is_empty() || sweep.dead > 0 {
        let mine = sweep.pending.iter().filter(|o| o.network == own).count();
        let oldest = sweep.pending.first();
        tracing::warn!(
            owed = sweep.pending.len(),
            this_network = mine,
            dead_letters = sweep.dead,
            "releases owed by earlier DELs on this node{} (`calico ipam queue list`)",
            oldest.map_or(String::new(), |o| format!(
                "; oldest: network {} container {} since {} s, {} attempts, last error: {}",
                o.network,
                o.container_id,
                now_secs().saturating_sub(o.since),
                o.attempts,
                o.error
            ))
        );
    }
    sweep
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::error::Kind;

    fn unreachable() -> Error {
        Error::Failed {
            kind: Kind::Datastore,
            what: "error deleting the WorkloadEndpoint".into(),
            source: Some("connection refused".into()),
        }
    }

    fn plugin_gone() -> Error {
        Error::invalid_config("failed to find plugin \"calico-ipam\" in path [/gone]")
    }

    /// A DEL whose IPAM plugin is gone while its datastore was down: queued
    /// (the endpoint's delete can succeed later), and given up on after
    /// its futile attempts (its IPAM part fails every replay).
    #[test]
    fn a_del_failing_in_several_parts_is_judged_by_each() {
        let both = Error::Several(vec![plugin_gone(), unreachable()]);
        assert!(worth_queueing(&both));
        assert!(cannot_succeed(&both));
        let mut owed = Owed::new(
            "net".into(),
            "cid".into(),
            "eth0".into(),
            serde_json::json!({}),
            HashMap::new(),
            both.to_string(),
        );
        owed.attempts = FUTILE_ATTEMPTS - 1;
        assert_eq!(give_up(&owed, &both), None);
        owed.attempts = FUTILE_ATTEMPTS;
        assert!(give_up(&owed, &both).is_some());

        let retryable = Error::Several(vec![unreachable(), unreachable()]);
        assert!(worth_queueing(&retryable));
        assert!(!cannot_succeed(&retryable));
        assert_eq!(give_up(&owed, &retryable), None);

        let hopeless = Error::Several(vec![plugin_gone(), plugin_gone()]);
        assert!(!worth_queueing(&hopeless));
    }
}
