//! The CNI contract, through the built binary: VERSION, the environment and
//! config validation errors, version gates and argv[0] personalities.

mod common;

use common::{CALICO, env_of, exec};
use serde_json::json;

const CONF: &str = r#"{"cniVersion":"1.0.0","name":"net1","type":"calico","nodename":"n","ipam":{"type":"host-local","subnet":"10.1.2.0/24"}}"#;

fn full_env(command: &str) -> Vec<(&'static str, String)> {
    vec![
        ("CNI_COMMAND", command.to_string()),
        ("CNI_CONTAINERID", "abc123".into()),
        ("CNI_NETNS", "/var/run/netns/does-not-exist".into()),
        ("CNI_IFNAME", "eth0".into()),
        ("CNI_PATH", "/usr/lib/cni".into()),
    ]
}

fn run(pairs: &[(&str, String)], stdin: &str) -> common::Outcome {
    let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    exec(CALICO, &env_of(&pairs), stdin)
}

#[test]
fn version_lists_every_supported_version() {
    let out = run(
        &[("CNI_COMMAND", "VERSION".into())],
        r#"{"cniVersion":"0.3.1"}"#,
    );
    out.assert_ok();
    assert_eq!(
        out.json(),
        json!({"cniVersion": "1.1.0",
               "supportedVersions": ["0.1.0","0.2.0","0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]})
    );
}

#[test]
fn each_missing_variable_is_named_with_code_4() {
    for (command, var) in [
        ("ADD", "CNI_CONTAINERID"),
        ("ADD", "CNI_NETNS"),
        ("ADD", "CNI_IFNAME"),
        ("ADD", "CNI_PATH"),
        ("DEL", "CNI_CONTAINERID"),
        ("DEL", "CNI_IFNAME"),
        ("CHECK", "CNI_NETNS"),
    ] {
        let env: Vec<_> = full_env(command)
            .into_iter()
            .filter(|(k, _)| *k != var)
            .collect();
        let out = run(&env, CONF);
        assert_eq!(
            out.error_code(),
            4,
            "{command} without {var}: {}",
            out.stdout
        );
        let msg = out.json()["msg"].as_str().unwrap().to_string();
        assert!(msg.contains(var), "{command} without {var}: {msg}");
    }
}

#[test]
fn invalid_variables_give_code_4_naming_them() {
    for (var, value) in [
        ("CNI_CONTAINERID", "a/b"),
        ("CNI_CONTAINERID", "-leading"),
        ("CNI_IFNAME", "name-longer-than-15"),
        ("CNI_IFNAME", "eth:0"),
        ("CNI_ARGS", "K8S_POD_NAME"),
        ("CNI_ARGS", "IP=not-an-ip"),
        ("CNI_COMMAND", "FROBNICATE"),
    ] {
        let mut env = full_env("ADD");
        env.retain(|(k, _)| *k != var);
        env.push((var, value.into()));
        let out = run(&env, CONF);
        assert_eq!(out.error_code(), 4, "{var}={value}: {}", out.stdout);
        let reply = out.json();
        let text = format!("{} {}", reply["msg"], reply["details"]);
        assert!(text.contains(var), "{var}={value}: {text}");
    }
}

#[test]
fn config_errors() {
    let env = full_env("ADD");
    assert_eq!(run(&env, "{not json").error_code(), 6);
    assert_eq!(
        run(&env, r#"{"cniVersion":"1.0.0","type":"calico"}"#).error_code(),
        7
    );
    let out = run(&env, r#"{"cniVersion":"9.9.9","name":"n"}"#);
    assert_eq!(out.error_code(), 1);
    assert!(out.json()["details"].as_str().unwrap().contains("9.9.9"));
    let out = run(&env, r#"{"cniVersion":"1.0.0","name":"n","mtu":"1500"}"#);
    assert_eq!(out.error_code(), 7);
    assert!(
        out.json()["msg"].as_str().unwrap().contains("mtu"),
        "{}",
        out.stdout
    );
    // A deadline out of any sane range is a config error, not a panic.
    for deadline in ["1e12", "0", "-5"] {
        let out = run(
            &env,
            &format!(r#"{{"cniVersion":"1.0.0","name":"n","deadline_seconds":{deadline}}}"#),
        );
        assert_eq!(out.error_code(), 7, "{deadline}: {}", out.stdout);
        assert!(
            out.json()["msg"]
                .as_str()
                .unwrap()
                .contains("deadline_seconds")
        );
    }
}

#[test]
fn verb_version_gates() {
    let out = run(&full_env("CHECK"), &CONF.replace("1.0.0", "0.3.1"));
    assert_eq!(out.error_code(), 1);
    assert_eq!(out.json()["msg"], "config version does not allow CHECK");
    let out = run(&full_env("STATUS"), CONF);
    assert_eq!(out.error_code(), 1);
    assert_eq!(out.json()["msg"], "config version does not allow STATUS");
    let out = run(&full_env("GC"), CONF);
    assert_eq!(out.error_code(), 1);
}

#[test]
fn error_json_is_on_stdout_labelled_with_the_config_version() {
    let out = run(
        &full_env("ADD"),
        r#"{"cniVersion":"0.4.0","type":"calico"}"#,
    );
    assert_eq!(out.code, 1);
    assert_eq!(out.json()["cniVersion"], "0.4.0");
}

fn linked_as(name: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join(name);
    std::os::unix::fs::symlink(CALICO, &link).unwrap();
    let path = link.to_str().unwrap().to_string();
    (dir, path)
}

#[test]
fn personalities_by_argv0() {
    let (_d, ipam) = linked_as("calico-ipam");
    let out = exec(&ipam, &env_of(&[("CNI_COMMAND", "VERSION")]), "");
    out.assert_ok();
    assert!(out.json()["supportedVersions"].is_array());
    let out = exec(&ipam, &env_of(&[]), "");
    assert_eq!(out.code, 0);
    assert!(out.stderr.contains("Calico CNI IPAM"), "{}", out.stderr);

    // Another name: under a runtime (CNI_COMMAND), the config's choice
    // (tests/calico_ipam.rs `another_name_under_a_runtime`); else refused.
    let (_d, other) = linked_as("not-calico");
    let out = exec(&other, &env_of(&[("CNI_COMMAND", "VERSION")]), "");
    out.assert_ok();
    assert!(out.json()["supportedVersions"].is_array());
    let out = exec(&other, &env_of(&[]), "");
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("Unknown binary name: not-calico"),
        "{}",
        out.stderr
    );
}

#[test]
fn about_text_and_version_flag() {
    let out = exec(CALICO, &env_of(&[]), "");
    assert_eq!(out.code, 0);
    assert!(out.stdout.is_empty());
    assert!(out.stderr.contains("Calico CNI plugin"), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("CNI protocol versions supported: 0.1.0"),
        "{}",
        out.stderr
    );

    let out = std::process::Command::new(CALICO)
        .arg("-v")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        env!("CARGO_PKG_VERSION")
    );
}

/// A contract variable that is not UTF-8 (Latin-1 bytes in CNI_ARGS, say)
/// is an invalid-environment error, code 4, never a panic; a variable of
/// someone else's that is not UTF-8 is none of ours.
#[test]
fn non_utf8_environment() {
    use std::io::Write;
    use std::os::unix::ffi::OsStrExt;
    use std::process::{Command, Stdio};
    let spawn = |name: &str, value: &[u8]| {
        let mut child = Command::new(CALICO)
            .env_clear()
            .envs(full_env("ADD"))
            .env(name, std::ffi::OsStr::from_bytes(value))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let _ = child.stdin.take().unwrap().write_all(CONF.as_bytes());
        let out = child.wait_with_output().unwrap();
        (
            out.status.code(),
            serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&out.stdout))),
        )
    };
    let (code, reply) = spawn("CNI_ARGS", b"K8S_POD_NAME=caf\xe9");
    assert_eq!(code, Some(1));
    assert_eq!(reply["code"], 4, "{reply}");
    assert_eq!(
        reply["msg"], "CNI_ARGS: the value is not valid UTF-8",
        "{reply}"
    );
    // Someone else's variable: ignored, and the ADD goes on to fail on the
    // missing netns instead.
    let (code, reply) = spawn("SOME_LOCALE_THING", b"caf\xe9");
    assert_eq!(code, Some(1));
    assert_ne!(reply["code"], 4, "{reply}");
    assert!(!reply["msg"].as_str().unwrap().contains("UTF-8"), "{reply}");
}

/// Calico's binaries read their flags with Go's `flag` package: parsing
/// stops at the first argument that is not a flag and the rest is ignored,
/// so a tool that passes the network config as an argument (Calico's own
/// do, for DEL) gets a working plugin. ADD and DEL with such arguments, for
/// both personalities, and nothing left.
#[test]
fn arguments_after_the_flags_are_ignored_as_go_does() {
    let test = "arguments_after_the_flags_are_ignored_as_go_does";
    if !common::root_or_skip(test) {
        return;
    }
    let s = common::Setup::new("1.0.0", false);
    let ns = common::Netns::new();
    let cid = common::container_id();
    let conf_file = s.dir.path().join("10-calico.conf");
    std::fs::write(&conf_file, s.conf.to_string()).unwrap();
    let conf_path = conf_file.to_str().unwrap();
    let env = |command: &str| {
        env_of(&[
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", &cid),
            ("CNI_NETNS", &ns.path()),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", common::CNI_BIN),
        ])
    };
    let conf = s.conf.to_string();
    let out = common::exec_args(CALICO, &[conf_path, "-v", "--bogus"], &env("ADD"), &conf);
    assert_eq!(s.reservations().len(), 1);
    assert!(ns.link("eth0").is_some());
    // Flags first, then the config path; `--` then anything.
    let mut check = s.conf.clone();
    check["prevResult"] = out.assert_ok().json();
    let out = common::exec_args(
        CALICO,
        &["-v=false", conf_path],
        &env("CHECK"),
        &check.to_string(),
    );
    assert_eq!(out.code, 0, "{out:?}");
    let out = common::exec_args(CALICO, &["--", "-t", conf_path], &env("DEL"), &conf);
    out.assert_ok();
    assert!(s.reservations().is_empty(), "{:?}", s.reservations());
    assert!(ns.link("eth0").is_none());
    assert!(s.endpoints().is_empty());

    // calico-ipam likewise.
    let (_d, ipam) = linked_as("calico-ipam");
    let out = common::exec_args(&ipam, &["ipam", "pool", "list"], &env("VERSION"), "");
    out.assert_ok();
    assert!(out.json()["supportedVersions"].is_array());
}

/// What Calico's v3.32.1 binaries answer for a command line, ours answers:
/// the same exit code and, for help and usage errors, the same text.
#[test]
fn flags_answer_as_calicos_binary_does() {
    let test = "flags_answer_as_calicos_binary_does";
    let Some(theirs) = common::testbed::peer(test, "calico-v3.32.1/calico") else {
        return;
    };
    let theirs_ipam = theirs.with_file_name("calico-ipam");
    let (_d, ours_ipam) = linked_as("calico-ipam");
    let lines: &[&[&str]] = &[
        &["-h"],
        &["--help"],
        &["-help=1"],
        &["-bogus"],
        &["--bogus=1"],
        &["-v=maybe"],
        &["---v"],
        &["-=x"],
        &["-t=x"],
        &["-upgrade"],
        &["foo"],
        &["foo", "-bogus"],
        &["--", "-bogus"],
        &["-", "-bogus"],
        &["-v=false"],
        &["-v=0", "-v=F"],
    ];
    for (ours, theirs) in [
        (CALICO, theirs.to_str().unwrap()),
        (ours_ipam.as_str(), theirs_ipam.to_str().unwrap()),
    ] {
        for args in lines {
            if ours == ours_ipam && args[0] == "-upgrade" {
                // calico-ipam's host-local migration: not built yet (it
                // refuses, exit 1 as Calico's without its variables).
                continue;
            }
            let a = common::exec_args(ours, args, &env_of(&[]), "");
            let b = common::exec_args(theirs, args, &env_of(&[]), "");
            assert_eq!(
                a.code, b.code,
                "{theirs} {args:?}: ours {a:?}, Calico's {b:?}"
            );
            assert_eq!(a.stdout, b.stdout, "{theirs} {args:?}");
            if b.stderr.contains("Usage") && b.code == 0 && ours == CALICO {
                // Help: Calico's text, then our subcommands.
                assert!(
                    a.stderr.starts_with(&b.stderr) && a.stderr.contains("calico status"),
                    "{theirs} {args:?}: {}",
                    a.stderr
                );
            } else if b.stderr.contains("Usage") {
                assert_eq!(a.stderr, b.stderr, "{theirs} {args:?}");
            } else {
                // The about text: the same first words, our own version.
                let first = |s: &str| s.split(" v").next().unwrap_or("").to_string();
                assert_eq!(
                    first(&a.stderr).split(' ').take(3).collect::<Vec<_>>(),
                    first(&b.stderr).split(' ').take(3).collect::<Vec<_>>(),
                    "{theirs} {args:?}: {a:?} {b:?}"
                );
            }
        }
        // -v prints a version and nothing else, whatever follows.
        for args in [&["-v"][..], &["--v", "foo"], &["-v=true", "foo", "-bogus"]] {
            let a = common::exec_args(ours, args, &env_of(&[]), "");
            let b = common::exec_args(theirs, args, &env_of(&[]), "");
            assert_eq!((a.code, b.code), (0, 0), "{args:?}");
            assert_eq!(a.stdout.lines().count(), 1, "{a:?}");
            assert_eq!(b.stdout.lines().count(), 1, "{b:?}");
        }
    }
}
