//! STATUS tells the truth: code 50, with the time, for a Kubernetes token
//! about to expire (a real ServiceAccount token of ten minutes from the
//! test bed's API server), ready again with a margin it outlives; code 50
//! for a node whose pools are exhausted, ready again once an address is
//! free. `calico status` says the same in words.

mod common;

use std::process::Command;

use common::ipam::{Backend, World};
use common::*;
use serde_json::json;

/// `calico status --config CONF` with the world's CNI_PATH (where its
/// calico-ipam is, as /opt/cni/bin on a node): (exit code, stdout, stderr).
fn status_words(w: &World, conf: &std::path::Path) -> (i32, String, String) {
    let out = Command::new(CALICO)
        .arg("status")
        .arg("--config")
        .arg(conf)
        .env_clear()
        .env("CNI_PATH", &w.bin)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_token_about_to_expire_is_reported_before_it_does() {
    let test = "status_token_about_to_expire";
    if !root_or_skip(test) {
        return;
    }
    let Some(w) = World::new(test, Backend::Kdd) else {
        return;
    };
    w.pool(&w.v4(0).to_string(), json!({}));
    let bed = w.bed();
    // The shortest token the API server mints: ten minutes.
    let token = bed.token("kube-system", "calico-cni-plugin", 600);
    let kubeconfig = bed.kubeconfig(
        w.dir.path(),
        "short.kubeconfig",
        bed.var("TESTBED_API"),
        json!({"token": token}),
    );
    let mut conf = w.conf();
    conf["cniVersion"] = json!("1.1.0");
    conf["kubernetes"] = json!({"kubeconfig": kubeconfig});

    // The default margin (an hour): not ready, with the time.
    let out = w.plugin("STATUS", "", "", &conf, "", None);
    assert_eq!(
        (out.code, out.json()["code"].as_i64()),
        (1, Some(50)),
        "{out:?}"
    );
    let msg = out.json()["msg"].as_str().unwrap().to_string();
    assert!(
        msg.contains(&format!("the token in {}", kubeconfig.display()))
            && msg.contains(" expires at 20")
            && msg.contains("(within the 3600 s margin)"),
        "{msg}"
    );
    assert!(!msg.contains(&token), "the token leaked into {msg}");
    let conf_path = w.dir.path().join("short.conf");
    std::fs::write(&conf_path, conf.to_string()).unwrap();
    let (code, words, _) = status_words(&w, &conf_path);
    assert_eq!(code, 1, "{words}");
    assert!(words.contains("expires at"), "{words}");

    // A margin it outlives: ready.
    conf["token_expiry_margin_seconds"] = json!(60);
    w.plugin("STATUS", "", "", &conf, "", None).assert_ok();
    std::fs::write(&conf_path, conf.to_string()).unwrap();
    let (code, words, err) = status_words(&w, &conf_path);
    assert_eq!(code, 0, "{words}{err}");
    assert!(words.contains("ready"), "{words}");
}

/// A world on the embedded store whose one pool is one block of four
/// addresses: the world and the pool.
fn world_of_four(test: &str) -> Option<(World, String)> {
    if !root_or_skip(test) {
        return None;
    }
    let w = World::new(test, Backend::Embedded)?;
    let pool = format!("{}/30", w.v4(0).addr());
    w.pool(&pool, json!({"blockSize": 30}));
    Some((w, pool))
}

/// The four addresses of [`world_of_four`]'s pool, assigned: their
/// containers.
fn exhaust(w: &World, conf: &serde_json::Value) -> Vec<String> {
    let cids: Vec<String> = (0..4).map(|_| container_id()).collect();
    for cid in &cids {
        let out = w.ipam("ADD", cid, conf, "");
        assert_eq!(out.code, 0, "{out:?}");
    }
    cids
}

#[test]
fn an_exhausted_pool_is_reported() {
    let Some((w, pool)) = world_of_four("status_exhausted_pool") else {
        return;
    };
    let mut conf = w.conf();
    conf["cniVersion"] = json!("1.1.0");
    w.plugin("STATUS", "", "", &conf, "", None).assert_ok();
    let cids = exhaust(&w, &conf);
    let out = w.plugin("STATUS", "", "", &conf, "", None);
    assert_eq!(
        (out.code, out.json()["code"].as_i64()),
        (1, Some(50)),
        "{out:?}"
    );
    let msg = out.json()["msg"].as_str().unwrap().to_string();
    assert!(
        msg.contains(&format!(
            "cannot allocate an IPv4 address on node {}: the pools it may use ({pool}) have no free address",
            w.node
        )),
        "{msg}"
    );
    let conf_path = w.dir.path().join("net.conf");
    std::fs::write(&conf_path, conf.to_string()).unwrap();
    let (code, words, _) = status_words(&w, &conf_path);
    assert_eq!(code, 1, "{words}");
    assert!(words.contains("no free address"), "{words}");

    let out = w.ipam("DEL", &cids[0], &conf, "");
    assert_eq!(out.code, 0, "{out:?}");
    w.plugin("STATUS", "", "", &conf, "", None).assert_ok();
    for cid in &cids[1..] {
        assert_eq!(w.ipam("DEL", cid, &conf, "").code, 0);
    }
}

#[test]
fn the_token_judged_is_that_of_the_datastore_the_call_selects() {
    // The config says kubernetes (and names no kubeconfig), the call's
    // environment selects the embedded store (CALICO_DATASTORE_TYPE beats
    // the config, as in Calico): STATUS judges the store it would use, and
    // asks no Kubernetes client for a token.
    let test = "status_token_of_the_selected_datastore";
    if !root_or_skip(test) {
        return;
    }
    let Some(w) = World::new(test, Backend::Embedded) else {
        return;
    };
    w.pool(&w.v4(0).to_string(), json!({}));
    let mut conf = w.conf();
    conf["cniVersion"] = json!("1.1.0");
    conf["datastore_type"] = json!("kubernetes");
    let out = w.plugin_with_env(
        "STATUS",
        "",
        "",
        &conf,
        "",
        &[
            ("CNI_PATH", &w.bin.display().to_string()),
            ("CALICO_DATASTORE_TYPE", "local"),
        ],
    );
    out.assert_ok();
}

#[test]
fn a_config_the_runtime_asks_no_status_of_is_never_called_ready() {
    // Calico's stock conflist is 0.3.1: libcni asks STATUS only of 1.1.0
    // and later. `calico status` says so, makes STATUS's checks all the
    // same, and exits 3 when they pass (1 when they fail), never 0.
    let Some((w, _)) = world_of_four("status_of_an_old_config") else {
        return;
    };
    let conf_path = w.dir.path().join("old.conflist");
    let list = |version: &str| {
        let mut plugin = w.conf();
        plugin.as_object_mut().unwrap().remove("cniVersion");
        plugin.as_object_mut().unwrap().remove("name");
        json!({"cniVersion": version, "name": "k8s-pod-network", "plugins": [plugin]})
    };
    std::fs::write(&conf_path, list("0.3.1").to_string()).unwrap();
    let (code, words, err) = status_words(&w, &conf_path);
    assert_eq!(code, 3, "{words}{err}");
    let lines: Vec<&str> = words.lines().collect();
    assert_eq!(
        lines[0],
        format!(
            "network k8s-pod-network ({}, cniVersion 0.3.1)",
            conf_path.display()
        )
    );
    assert_eq!(
        lines[1],
        "readiness not reported: the runtime does not ask STATUS of this network (cniVersion 0.3.1 predates STATUS, spec 1.1.0)"
    );
    assert!(
        lines[2].starts_with("checks STATUS would make: passed: the datastore answers"),
        "{words}"
    );
    assert!(!words.contains("\nready"), "{words}");

    // Its own version is the one asked: 1.1.0, ready.
    std::fs::write(&conf_path, list("1.1.0").to_string()).unwrap();
    let (code, words, err) = status_words(&w, &conf_path);
    assert_eq!(code, 0, "{words}{err}");
    assert!(
        words.lines().nth(1).unwrap().starts_with("ready: "),
        "{words}"
    );

    // The checks failing on an old config: exit 1, as failed checks.
    let mut conf = w.conf();
    conf["cniVersion"] = json!("1.1.0");
    let cids = exhaust(&w, &conf);
    std::fs::write(&conf_path, list("0.3.1").to_string()).unwrap();
    let (code, words, _) = status_words(&w, &conf_path);
    assert_eq!(code, 1, "{words}");
    assert!(
        words.contains("checks STATUS would make: failed (CNI code 50): ")
            && words.contains("no free address"),
        "{words}"
    );
    for cid in &cids {
        assert_eq!(w.ipam("DEL", cid, &conf, "").code, 0);
    }
}
