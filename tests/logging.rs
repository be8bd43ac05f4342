//! Logging goes to the configured file (and stderr), never to stdout, and
//! never carries secrets; a panic still answers with a CNI error JSON; a
//! full log file is rotated, by concurrent plugins, into a gzipped backup.

mod common;

use common::{CALICO, env_of, exec};
use serde_json::{Value, json};
use std::io::Read;

const SECRET: &str = "s3cr3t-token-value-never-logged";

fn run(extra: &[(&str, &str)], dir: &std::path::Path, ipam: &str) -> common::Outcome {
    run_with(extra, dir, ipam, &json!({}))
}

/// `run`, the keys of `conf_extra` added to (or replacing those of) the
/// network config.
fn run_with(
    extra: &[(&str, &str)],
    dir: &std::path::Path,
    ipam: &str,
    conf_extra: &Value,
) -> common::Outcome {
    let mut conf = json!({
        "cniVersion": "1.0.0", "name": "net1", "type": "calico", "nodename": "n",
        "log_level": "DEBUG",
        "log_file_path": dir.join("nested/dir/cni.log"),
        "mtu_file": dir.join("mtu"),
        "local_datastore_path": dir.join("store.db"),
        "policy": {"k8s_auth_token": SECRET},
        "ipam": {"type": ipam}
    });
    for (k, v) in conf_extra.as_object().unwrap() {
        conf[k] = v.clone();
    }
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

/// Whether `line` is one the plugin writes: an RFC 3339 UTC time, a level.
fn is_log_line(line: &str) -> bool {
    let mut words = line.split_whitespace();
    let time_ok = words
        .next()
        .is_some_and(|t| t.ends_with('Z') && t.parse::<jiff::Timestamp>().is_ok());
    let level_ok = words
        .next()
        .is_some_and(|l| ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&l));
    time_ok && level_ok
}

/// Whether `name` is lumberjack's `cni-2006-01-02T15-04-05.000.log.gz`.
fn is_gz_backup_name(name: &str) -> bool {
    let Some(stamp) = name
        .strip_prefix("cni-")
        .and_then(|n| n.strip_suffix(".log.gz"))
    else {
        return false;
    };
    let shape = "dddd-dd-ddTdd-dd-dd.ddd";
    stamp.len() == shape.len()
        && stamp
            .chars()
            .zip(shape.chars())
            .all(|(c, s)| if s == 'd' { c.is_ascii_digit() } else { c == s })
}

#[test]
fn a_full_log_is_rotated_by_concurrent_plugins_into_one_gzipped_backup() {
    const MIB: usize = 1024 * 1024;
    const CONCURRENT: usize = 6;
    let dir = tempfile::tempdir().unwrap();
    let log_dir = dir.path().join("nested/dir");
    let log = log_dir.join("cni.log");
    std::fs::create_dir_all(&log_dir).unwrap();
    // Lines as the plugin writes them, to 1500 bytes short of 1 MiB: room
    // for one invocation's lines (about 600 bytes), not for seven.
    let mut prefill = String::new();
    while prefill.len() < MIB - 1500 - 100 {
        let n = prefill.len();
        prefill += &format!("2024-01-02T03:04:05.000000Z  INFO prefilled at={n}\n");
    }
    std::fs::write(&log, &prefill).unwrap();
    let plugin = |i: usize| {
        let store = dir.path().join(format!("store{i}.db"));
        let id = format!("rotating{i}");
        let conf = json!({"log_file_max_size": 1, "local_datastore_path": store});
        run_with(
            &[("CNI_CONTAINERID", &id)],
            dir.path(),
            "missing-ipam",
            &conf,
        )
    };
    let mut outs = vec![plugin(0)];
    assert_eq!(std::fs::read_dir(&log_dir).unwrap().count(), 2, "log, lock");
    outs.extend(std::thread::scope(|s| {
        let runs: Vec<_> = (1..=CONCURRENT)
            .map(|i| s.spawn(move || plugin(i)))
            .collect();
        runs.into_iter()
            .map(|r| r.join().unwrap())
            .collect::<Vec<_>>()
    }));
    for out in &outs {
        assert_eq!(out.code, 1, "{}", out.stderr);
        assert!(out.json()["msg"].is_string(), "stdout is the error alone");
        assert!(!out.stderr.contains("calico: "), "{}", out.stderr);
    }

    let mut names: Vec<String> = std::fs::read_dir(&log_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 3, "one backup: {names:?}");
    assert!(is_gz_backup_name(&names[0]), "{names:?}");
    assert_eq!(names[1..], ["cni.log", "cni.log.lock"]);

    let mut backup = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(log_dir.join(&names[0])).unwrap())
        .read_to_string(&mut backup)
        .unwrap();
    let live = std::fs::read_to_string(&log).unwrap();
    assert!(backup.len() <= MIB && live.len() <= MIB);
    let plugins_part = backup
        .strip_prefix(&prefill)
        .expect("the backup is the old file, from its first byte");
    let plugin_lines: Vec<&str> = plugins_part.lines().chain(live.lines()).collect();
    for line in &plugin_lines {
        assert!(is_log_line(line), "not a log line: {line:?}");
    }
    for i in 0..=CONCURRENT {
        let invoked = format!("invoked command=\"ADD\" container=rotating{i} ");
        let found = plugin_lines.iter().filter(|l| l.contains(&invoked)).count();
        assert_eq!(found, 1, "rotating{i}: {found} lines");
    }
    assert!(
        plugins_part.contains("container=rotating0 "),
        "the first run's lines fitted in the old file"
    );
}
