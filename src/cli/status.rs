//! `calico status [--config CONFLIST]`: the STATUS verb of a network config
//! (its `calico` plugin, as a runtime would call it, spec 1.1.0), said in
//! words, with this node's release queue beside it: owed releases are
//! reported, never a reason to be not ready.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{Value, json};

use super::Outcome;
use super::netconf::{calico_plugin, config_path};
use crate::cni::Request;
use crate::cni::env::{CniEnv, Invocation};
use crate::plugin::journal::Journal;

/// Runs STATUS for the config, prints what it found; exit 1 when not ready.
pub fn run(config: Option<&Path>, vars: &HashMap<String, String>) -> Outcome {
    let what = "calico status";
    let path = match config_path(config, vars) {
        Ok(p) => p,
        Err(e) => return Outcome::failed(what, &e),
    };
    let plugin = match std::fs::read_to_string(&path)
        .map_err(|e| format!("reading the network config {}: {e}", path.display()))
        .and_then(|t| {
            serde_json::from_str::<Value>(&t)
                .map_err(|e| format!("{}: not JSON: {e}", path.display()))
        })
        .and_then(|d| calico_plugin(&d, &path))
    {
        Ok(mut p) => {
            // STATUS is of spec 1.1.0, whatever the list was written for.
            p["cniVersion"] = json!("1.1.0");
            p
        }
        Err(e) => return Outcome::failed(what, &e),
    };
    let network = plugin["name"].as_str().unwrap_or_default().to_string();
    let mut call_vars: HashMap<String, String> = vars.clone();
    call_vars.insert("CNI_COMMAND".into(), "STATUS".into());
    call_vars
        .entry("CNI_PATH".into())
        .or_insert_with(|| "/opt/cni/bin".into());
    let request = match CniEnv::from_vars(call_vars) {
        Ok(Invocation::Command(env)) => Request::new(*env, plugin.to_string().as_bytes()),
        Ok(Invocation::About) => unreachable!("CNI_COMMAND is set"),
        Err(e) => Err(e),
    };
    let request = match request {
        Ok(r) => r,
        Err(e) => return Outcome::failed(what, &format!("{}: {e}", path.display())),
    };
    let queue = Journal::new(request.conf.release_queue_dir());
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return Outcome::failed(what, &format!("cannot start the runtime: {e}")),
    };
    let verdict = runtime.block_on(crate::plugin::handle(request));
    let owed = queue.pending();
    let dead = queue.dead();
    let mut out = format!("network {network} ({})\n", path.display());
    let code = match &verdict {
        Ok(_) => {
            out += "ready: the datastore answers and is ready, its credentials are accepted and \
                    not about to expire, and the IPAM can give this node an address\n";
            0
        }
        Err(e) => {
            out += &format!("not ready (CNI code {}): {e}\n", e.code());
            1
        }
    };
    out += &format!(
        "release queue: {} release(s) owed by earlier DELs, {} given up on (calico ipam queue list [--dead])\n",
        owed.len(),
        dead.len()
    );
    Outcome {
        stdout: out,
        stderr: String::new(),
        code,
    }
}
