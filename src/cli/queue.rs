//! `calico ipam queue list|replay`: the node's release queue (what DELs
//! that could not reach their datastore still owe) and its dead letters,
//! for an operator to see and to settle by hand.

use std::collections::HashMap;
use std::path::PathBuf;

use tokio::time::Instant;

use crate::cni::config::DEFAULT_RELEASE_QUEUE_DIR;
use crate::plugin::journal::{Journal, Owed, now_secs};
use crate::plugin::release_queue::{Replayed, replay as replay_one};

/// Where the queue is: a network config's `release_queue_dir` (the
/// config named, else the CNI config directory's first, else the default
/// directory), or a directory given outright.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    Config(Option<PathBuf>),
    Dir(PathBuf),
}

fn journal(place: &Place, vars: &HashMap<String, String>) -> Result<Journal, String> {
    Ok(Journal::new(match place {
        Place::Dir(dir) => dir.clone(),
        Place::Config(Some(path)) => super::netconf::load(Some(path), vars)?.release_queue_dir(),
        // No config on the node (the network may be gone): the default.
        Place::Config(None) => match super::netconf::load(None, vars) {
            Ok(conf) => conf.release_queue_dir(),
            Err(_) => PathBuf::from(DEFAULT_RELEASE_QUEUE_DIR),
        },
    }))
}

fn ago(t: u64) -> String {
    let s = now_secs().saturating_sub(t);
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

fn next(o: &Owed) -> String {
    let now = now_secs();
    if o.dead_since.is_some() {
        "-".into()
    } else if o.next_attempt <= now {
        "due".into()
    } else {
        format!("in {}s", o.next_attempt - now)
    }
}

/// The entries (or dead letters) as a table or as JSON (an array of the
/// entries as stored).
pub fn list(
    place: &Place,
    vars: &HashMap<String, String>,
    json: bool,
    dead: bool,
) -> Result<String, String> {
    let j = journal(place, vars)?;
    let entries: Vec<Owed> = if dead { j.dead() } else { j.pending() }
        .into_iter()
        .map(|(_, o)| o)
        .collect();
    if json {
        let mut out = serde_json::to_string_pretty(&entries).expect("entries serialize");
        out.push('\n');
        return Ok(out);
    }
    let mut rows = vec![[
        "NETWORK".to_string(),
        "CONTAINER".into(),
        "IFNAME".into(),
        "AGE".into(),
        "ATTEMPTS".into(),
        "NEXT".into(),
        if dead { "REASON" } else { "LAST ERROR" }.into(),
    ]];
    for o in &entries {
        rows.push([
            o.network.clone(),
            o.container_id.clone(),
            o.ifname.clone(),
            ago(o.since),
            o.attempts.to_string(),
            next(o),
            o.dead_reason.clone().unwrap_or_else(|| o.error.clone()),
        ]);
    }
    let widths: Vec<usize> = (0..6)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in &rows {
        for (c, w) in widths.iter().enumerate() {
            out.push_str(&format!("{:<w$}   ", r[c], w = *w));
        }
        out.push_str(&r[6]);
        out.push('\n');
    }
    if entries.is_empty() {
        out = format!(
            "no {} in {}\n",
            if dead {
                "dead letters"
            } else {
                "owed releases"
            },
            j.dir().display()
        );
    }
    Ok(out)
}

/// Replays the entries (with `dead`, the dead letters, put back first)
/// whose container ID is in `containers` (all when empty), each once now.
/// Returns the report and whether every replay released.
pub fn replay(
    place: &Place,
    vars: &HashMap<String, String>,
    dead: bool,
    containers: &[String],
) -> Result<(String, bool), String> {
    let j = journal(place, vars)?;
    let picked = |o: &Owed| containers.is_empty() || containers.contains(&o.container_id);
    if dead {
        for (_, o) in j.dead().into_iter().filter(|(_, o)| picked(o)) {
            j.revive(o)
                .map_err(|e| format!("putting a dead letter back: {e}"))?;
        }
    }
    let entries: Vec<Owed> = j
        .pending()
        .into_iter()
        .map(|(_, o)| o)
        .filter(|o| picked(o))
        .collect();
    if entries.is_empty() {
        return Ok((
            format!("nothing to replay in {}\n", j.dir().display()),
            true,
        ));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let mut out = String::new();
    let mut all = true;
    for o in entries {
        let what = format!("{} {} {}", o.network, o.container_id, o.ifname);
        let deadline = Instant::now() + super::DEADLINE;
        let outcome = runtime.block_on(replay_one(&j, o, deadline));
        match outcome {
            Replayed::Released => out.push_str(&format!("{what}: released\n")),
            Replayed::Failed(e) => {
                all = false;
                out.push_str(&format!("{what}: failed: {e}\n"));
            }
            Replayed::GivenUp(e) => {
                all = false;
                out.push_str(&format!("{what}: failed, given up (a dead letter): {e}\n"));
            }
        }
    }
    Ok((out, all))
}
