//! `calico-ipam -upgrade` (Calico's host-local → calico-ipam migration) on
//! the test bed's API server: a node with pods whose addresses host-local
//! gave (its data directory as host-local leaves it: one file per address
//! holding the container ID, `last_reserved_ip.0`, `lock`), migrated into
//! Calico's IPAM — every pod still on the node keeps its address under
//! `k8s-pod-network.<container ID>` with its node, pod and namespace, a file
//! of no pod is dropped, the node gets its IPIP tunnel address, the host's
//! calico and host-local binaries go and the others stay, the cluster's CNI
//! is held off (datastoreReady false) while it runs and let back in after,
//! the directory is removed. Killed at any step, a second run finishes it
//! with the same end state.
//!
//! ClusterInformation is the cluster's: the tests of this binary take turns
//! (and cargo runs no other test binary meanwhile).

mod common;

use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::ipam::{Backend, World, block_allocations};
use common::*;
use ipnet::IpNet;
use serde_json::json;

static TURN: Mutex<()> = Mutex::new(());

const CLUSTER_INFO: &str = "/apis/crd.projectcalico.org/v1/clusterinformations/default";

/// One node's host-local world: pods with addresses, the data directory,
/// a CNI binary directory.
struct Node<'w> {
    w: &'w World,
    dir: tempfile::TempDir,
    /// (address, container ID, Some(pod) when a pod on the node has it).
    files: Vec<(IpAddr, String, Option<String>)>,
    namespace: common::testbed::Namespace,
    pod_cidr: IpNet,
}

fn node_pod_cidr(w: &World) -> IpNet {
    let bed = w.bed();
    let path = format!("/api/v1/nodes/{}", w.node);
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let node = bed.get(&path).expect("the world's node");
        if let Some(cidr) = node["spec"]["podCIDR"].as_str() {
            return cidr.parse().unwrap();
        }
        assert!(Instant::now() < end, "no podCIDR for {}: {node}", w.node);
        std::thread::sleep(Duration::from_millis(200));
    }
}

impl<'w> Node<'w> {
    fn new(w: &'w World, first: u8) -> Node<'w> {
        let bed = w.bed();
        let namespace = bed.namespace(json!({}), json!({}));
        let v4 = w.v4(0);
        let v6 = w.v6(0);
        let at = |net: &IpNet, n: u32| common::ipam::address_at(&net.trunc(), n as usize);
        let mut files = Vec::new();
        for (i, ip) in [
            at(&v4, u32::from(first)),
            at(&v4, u32::from(first) + 1),
            at(&v6, u32::from(first)),
        ]
        .into_iter()
        .enumerate()
        {
            let pod = format!("pod-{first}-{i}");
            namespace.create_pod(json!({"metadata": {"name": pod},
                "spec": {"nodeName": w.node, "containers": [{"name": "c", "image": "i"}]}}));
            bed.merge_patch(
                &format!("/api/v1/namespaces/{}/pods/{pod}/status", namespace.name),
                &json!({"status": {"podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}]}}),
            );
            files.push((ip, container_id(), Some(pod)));
        }
        // An address whose pod is gone.
        files.push((at(&v4, u32::from(first) + 2), container_id(), None));
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("k8s-pod-network");
        std::fs::create_dir(&data).unwrap();
        for (ip, cid, _) in &files {
            std::fs::write(data.join(ip.to_string()), format!("{cid}\r\neth0")).unwrap();
        }
        std::fs::write(data.join("last_reserved_ip.0"), files[1].0.to_string()).unwrap();
        std::fs::write(data.join("lock"), "").unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        for b in ["calico", "host-local", "portmap"] {
            std::fs::write(bin.join(b), "#!/bin/sh\n").unwrap();
        }
        Node {
            w,
            dir,
            files,
            namespace,
            pod_cidr: node_pod_cidr(w),
        }
    }

    fn data(&self) -> std::path::PathBuf {
        self.dir.path().join("k8s-pod-network")
    }

    fn bin(&self) -> std::path::PathBuf {
        self.dir.path().join("bin")
    }

    /// Starts `calico-ipam -upgrade` (killed after `kill_after`, if set).
    fn start(&self, kill_after: Option<&str>) -> std::process::Child {
        let bed = self.w.bed();
        let mut cmd = std::process::Command::new(self.w.bin.join("calico-ipam"));
        cmd.arg("-upgrade")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("KUBERNETES_NODE_NAME", &self.w.node)
            .env("KUBECONFIG", bed.var("KUBECONFIG"))
            .env("DATASTORE_TYPE", "kubernetes")
            .env("CALICO_UPGRADE_HOST_LOCAL_DIR", self.data())
            .env("CALICO_UPGRADE_CNI_BIN_DIR", self.bin())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        if let Some(step) = kill_after {
            cmd.env("CALICO_CNI_KILL_AFTER", step);
        }
        cmd.spawn().unwrap()
    }

    /// The end state of a finished migration.
    fn assert_migrated(&self) {
        let w = self.w;
        let bed = w.bed();
        assert!(!self.data().exists(), "the data directory is removed");
        assert!(!self.bin().join("calico").exists());
        assert!(!self.bin().join("host-local").exists());
        assert!(self.bin().join("portmap").exists(), "other binaries stay");
        let allocations = w.allocations();
        for (ip, cid, pod) in &self.files {
            let handle = format!("k8s-pod-network.{cid}");
            let holders: Vec<&String> = allocations
                .iter()
                .filter(|(a, _)| a == ip)
                .map(|(_, h)| h)
                .collect();
            match pod {
                Some(pod) => {
                    assert_eq!(holders, [&handle], "{ip} of {pod}: {allocations:?}");
                    let h = w
                        .handle(&handle)
                        .unwrap_or_else(|| panic!("handle {handle}"));
                    let counts: Vec<u64> = h["spec"]["block"]
                        .as_object()
                        .unwrap()
                        .values()
                        .map(|v| v.as_u64().unwrap())
                        .collect();
                    assert_eq!(counts, [1], "{h}");
                    let attrs = w
                        .blocks()
                        .iter()
                        .flat_map(|b| b["spec"]["attributes"].as_array().cloned().unwrap())
                        .find(|a| a["handle_id"] == json!(handle))
                        .unwrap();
                    assert_eq!(
                        attrs["secondary"],
                        json!({"node": w.node, "pod": pod, "namespace": self.namespace.name})
                    );
                }
                None => assert!(holders.is_empty(), "{ip} has no pod: {allocations:?}"),
            }
        }
        let info = bed.get(CLUSTER_INFO).unwrap();
        assert_eq!(info["spec"]["datastoreReady"], json!(true), "{info}");
        // The tunnel address: the podCIDR's next address, assigned and
        // recorded on the node.
        let node = bed.get(&format!("/api/v1/nodes/{}", w.node)).unwrap();
        let tunnel = common::ipam::address_at(&self.pod_cidr.trunc(), 1);
        assert_eq!(
            node["metadata"]["annotations"]["projectcalico.org/IPv4IPIPTunnelAddr"],
            json!(tunnel.to_string())
        );
        let block = IpNet::new(tunnel, 26).unwrap().trunc();
        let name = block.to_string().replace(['.', '/'], "-");
        let stored = bed
            .get(&format!("/apis/crd.projectcalico.org/v1/ipamblocks/{name}"))
            .expect("the tunnel's block");
        let handle = format!("ipip-tunnel-addr-{}", w.node);
        assert!(
            block_allocations(&stored).contains(&(tunnel, handle.clone())),
            "{stored}"
        );
        let recorded = bed
            .get(&format!(
                "/apis/crd.projectcalico.org/v1/ipamhandles/{handle}"
            ))
            .unwrap_or_else(|| panic!("the tunnel's handle {handle}"));
        assert_eq!(
            recorded["spec"]["block"],
            json!({block.to_string(): 1}),
            "{recorded}"
        );
    }
}

impl Drop for Node<'_> {
    /// The tunnel address's objects (outside the world's ranges).
    fn drop(&mut self) {
        let bed = self.w.bed();
        let tunnel = common::ipam::address_at(&self.pod_cidr.trunc(), 1);
        let block = IpNet::new(tunnel, 26).unwrap().trunc();
        let name = block.to_string().replace(['.', '/'], "-");
        let api = "/apis/crd.projectcalico.org/v1";
        bed.delete(&format!(
            "{api}/ipamhandles/ipip-tunnel-addr-{}",
            self.w.node
        ));
        bed.delete(&format!("{api}/blockaffinities/{}-{name}", self.w.node));
        bed.delete(&format!("{api}/ipamblocks/{name}"));
        bed.merge_patch(
            &format!("/api/v1/nodes/{}", self.w.node),
            &json!({"metadata": {"annotations": {"projectcalico.org/IPv4IPIPTunnelAddr": null}}}),
        );
    }
}

fn finish(child: std::process::Child) -> Outcome {
    let out = child.wait_with_output().unwrap();
    Outcome {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn world(test: &str) -> Option<World> {
    let w = World::new(test, Backend::Kdd)?;
    w.pool(&w.v4(0).to_string(), json!({}));
    w.pool(&w.v6(0).to_string(), json!({}));
    Some(w)
}

#[test]
fn host_local_allocations_become_calico_ipam_ones() {
    let test = "host_local_allocations_become_calico_ipam_ones";
    let Some(w) = world(test) else { return };
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let n = Node::new(&w, 10);
    w.pool(&n.pod_cidr.to_string(), json!({}));
    let bed = w.bed();

    let child = n.start(None);
    // While it runs, the cluster's CNI is held off.
    let end = Instant::now() + Duration::from_secs(20);
    let mut held_off = false;
    while Instant::now() < end && !held_off {
        held_off = bed.get(CLUSTER_INFO).unwrap()["spec"]["datastoreReady"] == json!(false);
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = finish(child);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(held_off, "datastoreReady was never false: {out:?}");
    assert!(
        out.stderr
            .contains("migration from host-local to calico-ipam complete"),
        "{out:?}"
    );
    // Its phases, on stderr (not a terminal here): plain lines.
    for phase in [
        "holding off the cluster's CNI (datastoreReady false)...",
        "giving in-flight CNI calls 5.0 s...",
        "migrating allocation files (",
        "letting the cluster's CNI back in (datastoreReady true)...",
        "done in ",
    ] {
        let line = format!("\ncalico-ipam -upgrade: {phase}");
        assert!(out.stderr.contains(&line), "{phase}: {out:?}");
    }
    assert_eq!(out.stdout, "");
    n.assert_migrated();

    // Again: nothing to migrate, nothing changes.
    let before = w.allocations();
    let again = finish(n.start(None));
    assert_eq!(again.code, 0, "{again:?}");
    assert!(again.stderr.contains("no migration necessary"), "{again:?}");
    assert_eq!(w.allocations(), before);

    // Without a node name: Calico's refusal, nothing done.
    let mut cmd = std::process::Command::new(w.bin.join("calico-ipam"));
    let out = cmd.arg("-upgrade").env_clear().output().unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("KUBERNETES_NODE_NAME not specified"));
}

/// Killed after each step (and between an address's block write and its
/// handle write), a second run finishes the migration: the same end state.
#[test]
fn a_migration_killed_at_any_step_is_finished_by_the_next() {
    let test = "a_migration_killed_at_any_step_is_finished_by_the_next";
    let Some(w) = world(test) else { return };
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let mut tunnel_pool = false;
    for (i, step) in [
        "upgrade-not-ready",
        "ipam-assign-block",
        "upgrade-assigned",
        "upgrade-ready",
    ]
    .into_iter()
    .enumerate()
    {
        let n = Node::new(&w, 20 + 4 * i as u8);
        if !tunnel_pool {
            w.pool(&n.pod_cidr.to_string(), json!({}));
            tunnel_pool = true;
        }
        let killed = finish(n.start(Some(step)));
        assert_eq!(killed.code, -1, "{step}: killed by SIGKILL: {killed:?}");
        assert!(killed.stderr.contains("migrating"), "{killed:?}");
        let out = finish(n.start(None));
        assert_eq!(out.code, 0, "after {step}: {out:?}");
        n.assert_migrated();
        eprintln!("{test}: killed after {step}, finished by the next run");
    }
}

/// Without the test bed (an API server that is not there): each attempt
/// says what it is doing on stderr, plain lines when stderr is not a
/// terminal, and when the next one comes; stdout stays empty.
#[test]
fn attempts_say_what_they_are_doing_on_stderr() {
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("k8s-pod-network");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("10.0.0.5"), "c1\neth0\n").unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        json!({
            "apiVersion": "v1", "kind": "Config", "current-context": "x",
            "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        })
        .to_string(),
    )
    .unwrap();
    let ipam = dir.path().join("calico-ipam");
    std::os::unix::fs::symlink(CALICO, &ipam).unwrap();
    let child = Command::new(&ipam)
        .arg("-upgrade")
        .env_clear()
        .env("KUBERNETES_NODE_NAME", "n1")
        .env("KUBECONFIG", &kubeconfig)
        .env("CALICO_UPGRADE_HOST_LOCAL_DIR", &data)
        .env("CALICO_UPGRADE_CNI_BIN_DIR", dir.path().join("bin"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(3500));
    // SAFETY: a signal to the child started above.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "", "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines[..2],
        [
            "calico-ipam -upgrade: migrating from host-local to calico-ipam (node n1)...",
            "calico-ipam -upgrade: connecting to the datastore...",
        ],
        "{stderr}"
    );
    // (Whether the client or the tunnel address's read fails first.)
    let failed = lines
        .iter()
        .position(|l| l.starts_with("calico-ipam -upgrade: failed to migrate ipam, retrying...: "))
        .unwrap_or_else(|| panic!("no failure: {stderr}"));
    assert!(failed <= 3, "{stderr}");
    assert!(
        lines[failed + 1].starts_with("calico-ipam -upgrade: attempt 2 in 1 s ("),
        "{stderr}"
    );
    assert_eq!(
        lines[failed + 2],
        "calico-ipam -upgrade: connecting to the datastore...",
        "{stderr}"
    );
    assert!(!stderr.contains('\r'), "{stderr:?}");
    assert!(data.join("10.0.0.5").exists(), "nothing migrated");
}
