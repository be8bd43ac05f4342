//! `calico status [--config CONFLIST]`: the STATUS verb of a network config
//! (its `calico` plugin, as a runtime would call it), said in words, with
//! this node's release queue beside it: owed releases are reported, never a
//! reason to be not ready.
//!
//! A runtime asks STATUS only of a config of spec 1.1.0 or later (libcni
//! skips the verb for older ones): for such a config (Calico's stock
//! conflist is 0.3.1) the command says so, runs the checks STATUS would
//! make all the same, and never says "ready": exit 3 when they pass (no
//! readiness is reported to the runtime), 1 when they fail (an ADD would
//! fail too). It always makes the full check: the answer STATUS keeps
//! for the runtime between full checks is neither read nor written.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{Value, json};

use super::Outcome;
use super::netconf::{calico_plugin, config_path};
use crate::cni::env::{CniEnv, Invocation};
use crate::cni::{Request, Version};
use crate::plugin::journal::Journal;

/// Runs STATUS for the config, prints what it found; exit 0 ready, 1 not
/// ready, 3 when the runtime asks no STATUS of it and the checks pass.
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
        Ok(p) => p,
        Err(e) => return Outcome::failed(what, &e),
    };
    let version = plugin["cniVersion"].as_str().unwrap_or("0.1.0").to_string();
    // Whether the runtime asks this network's STATUS at all; when it does
    // not, the checks are made as STATUS of spec 1.1.0.
    let asked = Version::parse(&version).is_ok_and(|v| v >= Version::V1_1_0);
    let mut plugin = plugin;
    if !asked {
        plugin["cniVersion"] = json!(Version::V1_1_0.to_string());
    }
    // An operator asking gets a fresh answer, never the runtime's kept one
    // (a not-ready one removes that, as any failed full check does).
    plugin["status_cache_seconds"] = json!(0);
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
    let mut out = format!(
        "network {network} ({}, cniVersion {version})\n",
        path.display()
    );
    const PASSED: &str = "the datastore answers and is ready, its credentials are accepted and \
                          not about to expire, and the IPAM can give this node an address";
    let code = match (&verdict, asked) {
        (Ok(_), true) => {
            out += &format!("ready: {PASSED}\n");
            0
        }
        (Err(e), true) => {
            out += &format!("not ready (CNI code {}): {e}\n", e.code());
            1
        }
        (verdict, false) => {
            out += &format!(
                "readiness not reported: the runtime does not ask STATUS of this network \
                 (cniVersion {version} predates STATUS, spec 1.1.0)\n"
            );
            match verdict {
                Ok(_) => {
                    out += &format!("checks STATUS would make: passed: {PASSED}\n");
                    3
                }
                Err(e) => {
                    out += &format!(
                        "checks STATUS would make: failed (CNI code {}): {e}\n",
                        e.code()
                    );
                    1
                }
            }
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
