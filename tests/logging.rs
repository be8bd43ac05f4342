//! Logging goes to the configured file (and stderr), never to stdout, and
//! never carries secrets; a panic still answers with a CNI error JSON.

mod common;

use common::{CALICO, env_of, exec};
use serde_json::json;

const SECRET: &str = "s3cr3t-token-value-never-logged";

fn run(extra: &[(&str, &str)], dir: &std::path::Path, ipam: &str) -> common::Outcome {
    let conf = json!({
        "cniVersion": "1.0.0", "name": "net1", "type": "calico", "nodename": "n",
        "log_level": "DEBUG",
        "log_file_path": dir.join("nested/dir/cni.log"),
        "mtu_file": dir.join("mtu"),
        "local_datastore_path": dir.join("store.db"),
        "policy": {"k8s_auth_token": SECRET},
        "ipam": {"type": ipam}
    });
    let mut env = env_of(&[
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "logging1"),
        ("CNI_NETNS", "/var/run/netns/unused"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", dir.to_str().unwrap()),
    ]);
    for (k, v) in extra {
        env.insert(k.to_string(), v.to_string());
    }
    exec(CALICO, &env, &conf.to_string())
}

#[test]
fn logs_go_to_the_file_and_stderr_never_stdout_and_hold_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(&[], dir.path(), "missing-ipam");
    assert_eq!(out.code, 1);
    // stdout is exactly one error JSON document.
    let reply = out.json();
    let msg = reply["msg"].as_str().unwrap();
    let log = std::fs::read_to_string(dir.path().join("nested/dir/cni.log")).unwrap();
    assert!(log.contains("invoked"), "debug line missing: {log}");
    assert!(log.contains(msg), "error {msg:?} not logged: {log}");
    assert!(!log.contains(SECRET), "secret in log file");
    assert!(!out.stderr.contains(SECRET), "secret on stderr");
    assert!(out.stderr.contains("invoked"), "stderr carries the log too");
}

#[test]
fn a_panic_still_answers_with_error_json() {
    if !cfg!(feature = "fault-injection") {
        common::cannot_run(
            "a_panic_still_answers_with_error_json",
            "build with --features fault-injection",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        &[("CALICO_CNI_FAIL_AFTER", "panic")],
        dir.path(),
        "host-local",
    );
    assert_eq!(out.code, 1);
    let reply = out.json();
    assert_eq!(reply["code"], 999);
    assert!(
        reply["msg"]
            .as_str()
            .unwrap()
            .contains("panicked during ADD"),
        "{reply}"
    );
    assert!(!out.stdout.contains("stack backtrace"));
}
