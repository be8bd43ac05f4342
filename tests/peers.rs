//! The real peers say their real versions: each is stamped by
//! `scripts/peers.sh` with the version its wrapper module pins (the ldflags
//! its own project's release build sets), so clients that check a server's
//! version, and people, see v1.36.3 and not `v0.0.0-master+$Format:%H$`.
//! Calico's own binaries are the pinned release.

mod common;

use std::process::Command;

use serde_json::Value;

/// The version `module` has in the wrapper module `peers/<dir>/go.mod`.
fn pinned(dir: &str, module: &str) -> String {
    let path = format!("{}/peers/{dir}/go.mod", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    text.lines()
        .map(str::trim)
        .map(|l| l.trim_start_matches("require").trim())
        .find_map(|l| {
            // (A `tool` line names the module alone: no version.)
            let mut words = l.split_whitespace();
            let version = (words.next() == Some(module)).then(|| words.next())??;
            version.starts_with('v').then(|| version.to_string())
        })
        .unwrap_or_else(|| panic!("{module} in {path}"))
}

fn output(binary: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new(binary).args(args).output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn the_control_plane_says_its_version() {
    let test = "the_control_plane_says_its_version";
    let Some(bed) = common::testbed::testbed(test) else {
        return;
    };
    let want = pinned("kubernetes", "k8s.io/kubernetes");
    let (code, version): (u16, Value) = bed.admin("GET", "/version", None);
    assert_eq!(code, 200, "{version}");
    assert_eq!(version["gitVersion"], want.as_str(), "{version}");
    let minor = want.split('.').nth(1).unwrap();
    assert_eq!(version["major"], "1", "{version}");
    assert_eq!(version["minor"], minor, "{version}");
    assert_eq!(version["gitTreeState"], "clean", "{version}");
    assert!(
        !version["buildDate"].as_str().unwrap().starts_with("1970"),
        "{version}"
    );
    for peer in ["kube-controller-manager", "kube-scheduler", "kubelet"] {
        let said = output(&bed.peer(peer), &["--version"]);
        assert_eq!(said.trim(), format!("Kubernetes {want}"), "{peer}");
    }
}

#[test]
fn every_peer_says_its_version() {
    let test = "every_peer_says_its_version";
    let plugins = pinned("cni", "github.com/containernetworking/plugins");
    let etcd = pinned("etcd", "go.etcd.io/etcd/server/v3");
    let cri = pinned("cri-tools", "sigs.k8s.io/cri-tools");
    let containerd = pinned("containerd", "github.com/containerd/containerd/v2");
    for (peer, args, want) in [
        (
            "host-local",
            &["--version"][..],
            format!("CNI host-local plugin {plugins}"),
        ),
        ("ptp", &["--version"], format!("CNI ptp plugin {plugins}")),
        ("etcd", &["--version"], format!("Git SHA: {etcd}")),
        (
            "etcdctl",
            &["version"],
            format!("etcdctl version: {}", etcd.trim_start_matches('v')),
        ),
        ("crictl", &["--version"], format!("crictl version {cri}")),
        (
            "containerd",
            &["--version"],
            format!("containerd/v2 {containerd}"),
        ),
        ("calico-v3.32.1/calico", &["-v"], "v3.32.1".to_string()),
        (
            "calico-v3.32.1/calicoctl",
            &["version"],
            "Client Version:    v3.32.1".to_string(),
        ),
    ] {
        let Some(binary) = common::testbed::peer(test, peer) else {
            return;
        };
        let out = output(&binary, args);
        assert!(out.contains(&want), "{peer}: {want:?} not in {out:?}");
    }
}
