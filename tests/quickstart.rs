//! The quickstart (`cargo run --release --example quickstart`) on a machine
//! with nothing but the kernel and our binary: run with an empty PATH (no
//! `ip`, no `ping`, no shell), it must wire two pods, reach them and leave
//! nothing behind.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

#[test]
fn the_quickstart_needs_nothing_but_the_plugin() {
    let test = "the_quickstart_needs_nothing_but_the_plugin";
    if !root_or_skip(test) {
        return;
    }
    // Built by `cargo test` beside the binary it runs (target/<triple>/debug).
    let example = Path::new(CALICO)
        .with_file_name("examples")
        .join("quickstart");
    if !example.exists() {
        cannot_run(test, &format!("{} is not built", example.display()));
        return;
    }
    // A pool of this test's own (the tests run in parallel).
    let pool = Setup::new("1.0.0", false).subnet;
    let out = Command::new(&example)
        .env_clear()
        .env("PATH", "")
        .env("QUICKSTART_POOL", &pool)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for line in [
        "== TCP pod a -> pod b",
        "echo from ",
        "hello from pod a",
        "hello from the host",
        "== left behind: host veths [], host routes [], allocated addresses 0, WorkloadEndpoints 0",
    ] {
        assert!(stdout.contains(line), "{line:?} missing:\n{stdout}");
    }
    // The pods' addresses came from its pool, and were listed in the pods.
    let prefix = pool.trim_end_matches(".0/24");
    assert!(
        stdout.contains(&format!("eth0             UP     {prefix}.")),
        "{stdout}"
    );
}
