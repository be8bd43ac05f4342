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

#[test]
fn an_exhausted_pool_is_reported() {
    let test = "status_exhausted_pool";
    if !root_or_skip(test) {
        return;
    }
    let Some(w) = World::new(test, Backend::Embedded) else {
        return;
    };
    // One block of four addresses.
    let pool = format!("{}/30", w.v4(0).addr());
    w.pool(&pool, json!({"blockSize": 30}));
    let mut conf = w.conf();
    conf["cniVersion"] = json!("1.1.0");
    w.plugin("STATUS", "", "", &conf, "", None).assert_ok();
    let cids: Vec<String> = (0..4).map(|_| container_id()).collect();
    for cid in &cids {
        let out = w.ipam("ADD", cid, &conf, "");
        assert_eq!(out.code, 0, "{out:?}");
    }
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
