//! The durable release queue: a DEL that cannot reach the datastore
//! completes its local teardown, queues what it owes and fails retryably;
//! STATUS answers not-ready while the datastore is down, and once it is
//! back the next call drains the queue, releasing exactly what the DEL owed
//! and nothing of a newer sandbox of the same pod (on a private three-member
//! etcd cluster whose quorum is taken away). Entries of other networks, or
//! of networks whose config is gone, cost a call nothing and never make
//! STATUS fail; every attempt is counted and backed off; entries that
//! cannot succeed become dead letters an operator lists and replays.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use common::etcd::PrivateCluster;
use common::ipam::{World, address};
use common::*;
use serde_json::{Value, json};

const WEPS: &str = "/calico/resources/v3/projectcalico.org/workloadendpoints";

fn queue(w: &World) -> Vec<Value> {
    entries(&w.dir.path().join("cni-release-queue"))
}

/// The owed entries under a queue directory (one directory per network;
/// the dead letters, `.dead`, apart).
fn entries(queue: &Path) -> Vec<Value> {
    entry_files(queue)
        .iter()
        .map(|p| serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap())
        .collect()
}

fn entry_files(queue: &Path) -> Vec<PathBuf> {
    common::queue_entry_files(queue)
}

#[test]
fn a_del_that_cannot_reach_the_datastore_is_queued_and_drained() {
    let test = "a_del_that_cannot_reach_the_datastore_is_queued_and_drained";
    if !root_or_skip(test) {
        return;
    }
    let Some(bed) = common::testbed::testbed(test) else {
        return;
    };
    let Some(mut cluster) = PrivateCluster::start(test, 3) else {
        return;
    };
    let Some(w) = World::on_etcd(test, cluster.access()) else {
        return;
    };
    let access = cluster.access();
    w.pool(&w.v4(0).to_string(), json!({}));
    let mut conf = w.conf();
    conf["cniVersion"] = json!("1.1.0");
    conf["deadline_seconds"] = json!(4);
    let mut k8s = conf.clone();
    k8s["kubernetes"] = json!({"kubeconfig": bed.cni_kubeconfig()});
    k8s["policy"] = json!({"type": "k8s"});
    let ns = bed.namespace(json!({}), json!({}));
    w.pod(&ns, "pod1", json!({}));
    let args = |cid: &str| {
        format!(
            "K8S_POD_NAMESPACE={};K8S_POD_NAME=pod1;K8S_POD_INFRA_CONTAINER_ID={cid}",
            ns.name
        )
    };

    // A plain container P and sandbox A of pod1.
    let (np, p) = (Netns::new(), container_id());
    w.plugin("ADD", &p, &np.path(), &conf, "", None).assert_ok();
    let (na, a) = (Netns::new(), container_id());
    let ra = w
        .plugin("ADD", &a, &na.path(), &k8s, &args(&a), None)
        .assert_ok()
        .json();
    let ip_a = address(&ra, 0).addr();

    // No quorum: both DELs tear down locally, fail retryably, and queue.
    cluster.stop_member(0);
    cluster.stop_member(1);
    let out = w.plugin("DEL", &p, &np.path(), &conf, "", None);
    assert_eq!(out.error_code(), 11, "{out:?}");
    let out = w.plugin("DEL", &a, &na.path(), &k8s, &args(&a), None);
    assert_eq!(out.error_code(), 11, "{out:?}");
    for (ns, cid) in [(&np, &p), (&na, &a)] {
        assert!(ns.link("eth0").is_none(), "eth0 of {cid} left");
    }
    let q = queue(&w);
    let mut queued: Vec<&str> = q
        .iter()
        .map(|o| o["container_id"].as_str().unwrap())
        .collect();
    queued.sort();
    let mut want = vec![p.as_str(), a.as_str()];
    want.sort();
    assert_eq!(queued, want, "{q:?}");
    // No credential in the entries: the CNI variables only.
    for o in &q {
        let vars = o["vars"].as_object().unwrap();
        assert!(
            vars.keys()
                .all(|k| k.starts_with("CNI_") || k == "FELIX_INTERFACEPREFIX"),
            "{o}"
        );
    }
    // STATUS tells the truth: the datastore cannot serve an ADD.
    let out = w.plugin("STATUS", "", "", &conf, "", None);
    assert_eq!(out.error_code(), 50, "{out:?}");
    // That STATUS replayed each entry once at most (only those already
    // due: the DELs took their deadline, the first pause is 5 s).
    assert!(
        queue(&w).iter().all(|o| o["attempts"].as_u64() <= Some(1)),
        "{:?}",
        queue(&w)
    );
    // (Made due, as time passing would.)
    make_queue_due(&w.dir.path().join("cni-release-queue"));

    // The cluster comes back; before the queue drains, pod1 gets a new
    // sandbox B (same endpoint name, new container ID).
    cluster.start_member(0);
    cluster.start_member(1);
    for i in 0..3 {
        cluster.wait_healthy(i, Duration::from_secs(30));
    }
    // (Its ADD is given another queue, so that it cannot drain this one
    // first, whatever the timing.)
    let elsewhere = tempfile::tempdir().unwrap();
    let mut k8s_b = k8s.clone();
    k8s_b["release_queue_dir"] = json!(elsewhere.path());
    let (nb, b) = (Netns::new(), container_id());
    let rb = w
        .plugin("ADD", &b, &nb.path(), &k8s_b, &args(&b), None)
        .assert_ok()
        .json();
    assert_eq!(queue(&w).len(), 2);
    let ip_b = address(&rb, 0).addr();
    assert_ne!(ip_a, ip_b, "A's address is still held");

    // STATUS drains what is due: P's and A's releases are made, B is kept.
    let out = w.plugin("STATUS", "", "", &conf, "", None);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(queue(&w).is_empty(), "{:?}", queue(&w));
    assert!(w.handle(&format!("net1.{p}")).is_none());
    assert!(w.handle(&format!("net1.{a}")).is_none());
    assert_eq!(w.addresses_of(&format!("net1.{b}")), [ip_b]);
    let name = format!("{}-k8s-pod1-eth0", w.node.replace('-', "--"));
    let (wep, _) = access
        .get(&format!("{WEPS}/{}/{name}", ns.name))
        .expect("B's endpoint");
    assert_eq!(wep["spec"]["containerID"], json!(b));
    let plain = format!("{}-cni-{p}-eth0", w.node.replace('-', "--"));
    assert!(access.get(&format!("{WEPS}/default/{plain}")).is_none());

    w.plugin("DEL", &b, &nb.path(), &k8s, &args(&b), None)
        .assert_ok();
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
    assert!(access.keys(&format!("{WEPS}/")).is_empty());
}

/// An entry's schedule moved to the past (its modification time is when it
/// is next due), as if its backoff had passed.
fn make_due(entry: &Path) {
    let f = std::fs::File::options().write(true).open(entry).unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(1))
        .unwrap();
}

/// A stand-in for an IPAM plugin whose datastore can go away: every call
/// is logged (`<command> <container ID>`), ADD gives the next address of
/// its /24, DEL fails retryably (code 11) while `broken` exists.
struct FlakyIpam {
    dir: tempfile::TempDir,
}

impl FlakyIpam {
    fn new(subnet: &str) -> FlakyIpam {
        let dir = tempfile::tempdir().unwrap();
        let prefix = subnet.trim_end_matches(".0/24");
        let d = dir.path().display();
        let script = format!(
            r#"#!/bin/sh
cat >/dev/null
echo "$CNI_COMMAND $CNI_CONTAINERID" >>{d}/calls
case "$CNI_COMMAND" in
ADD)
  n=$(( $(cat {d}/n 2>/dev/null || echo 1) + 1 )); echo $n >{d}/n
  printf '{{"cniVersion":"1.0.0","ips":[{{"address":"{prefix}.%s/24"}}]}}' $n ;;
DEL)
  if [ -e {d}/broken ]; then
    printf '{{"cniVersion":"1.0.0","code":11,"msg":"IPAM datastore unreachable"}}'; exit 1
  fi ;;
VERSION)
  printf '{{"cniVersion":"1.0.0","supportedVersions":["0.3.1","0.4.0","1.0.0","1.1.0"]}}' ;;
esac
"#
        );
        let path = dir.path().join("flaky-ipam");
        std::fs::write(&path, script).unwrap();
        let mut perms = std::fs::metadata(&path).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&path, perms).unwrap();
        FlakyIpam { dir }
    }

    fn path(&self) -> String {
        format!("{}:{}", self.dir.path().display(), common::CNI_BIN)
    }

    fn broken(&self, broken: bool) {
        let flag = self.dir.path().join("broken");
        if broken {
            std::fs::write(flag, b"").unwrap();
        } else {
            let _ = std::fs::remove_file(flag);
        }
    }

    /// The calls made so far of `command` for container `cid`.
    fn calls(&self, command: &str, cid: &str) -> usize {
        std::fs::read_to_string(self.dir.path().join("calls"))
            .unwrap_or_default()
            .lines()
            .filter(|l| *l == format!("{command} {cid}"))
            .count()
    }
}

/// A plain-CNI network `name` with the flaky IPAM, its queue at `queue`.
fn flaky_conf(s: &Setup, name: &str, queue: &Path) -> Value {
    let mut conf = s.conf.clone();
    conf["name"] = json!(name);
    conf["ipam"] = json!({"type": "flaky-ipam"});
    conf["release_queue_dir"] = json!(queue);
    conf
}

fn run_in(s: &Setup, command: &str, cid: &str, netns: &str, conf: &Value, path: &str) -> Outcome {
    s.run_with(command, cid, netns, "eth0", conf, &[("CNI_PATH", path)])
}

/// Stale entries of networks whose config is gone: `count` entries of
/// network `name` whose IPAM plugin (and the CNI_PATH holding it) has been
/// removed, every one due. One is made by a real DEL that could not reach
/// its IPAM's datastore; the rest are copies of it under other container
/// IDs, as more such DELs would have left them.
fn stale_entries(s: &Setup, name: &str, queue: &Path, count: usize) -> Vec<String> {
    let ipam = FlakyIpam::new(&s.subnet);
    let conf = flaky_conf(s, name, queue);
    let ns = Netns::new();
    let cid = container_id();
    run_in(s, "ADD", &cid, &ns.path(), &conf, &ipam.path()).assert_ok();
    ipam.broken(true);
    let out = run_in(s, "DEL", &cid, &ns.path(), &conf, &ipam.path());
    assert_eq!(out.error_code(), 11, "{out:?}");
    drop(ipam); // The plugin and its CNI_PATH directory are gone.
    let dir = queue.join(name);
    let first = entry_files(queue)
        .into_iter()
        .find(|p| p.starts_with(&dir))
        .expect("the DEL's entry");
    let entry: Value = serde_json::from_slice(&std::fs::read(&first).unwrap()).unwrap();
    let mut cids = vec![cid];
    for _ in 1..count {
        let other = container_id();
        let mut e = entry.clone();
        e["container_id"] = json!(other);
        e["vars"]["CNI_CONTAINERID"] = json!(other);
        std::fs::write(dir.join(format!("{other}+eth0.json")), e.to_string()).unwrap();
        cids.push(other);
    }
    for f in entry_files(queue) {
        if f.starts_with(&dir) {
            make_due(&f);
        }
    }
    cids
}

/// The entries of network `name`, by container ID.
fn of_network(queue: &Path, name: &str) -> Vec<Value> {
    entries(queue)
        .into_iter()
        .filter(|e| e["network"] == json!(name))
        .collect()
}

fn dead_letters(queue: &Path) -> Vec<Value> {
    let Ok(networks) = std::fs::read_dir(queue.join(".dead")) else {
        return Vec::new();
    };
    networks
        .filter_map(Result::ok)
        .filter_map(|n| std::fs::read_dir(n.path()).ok())
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .map(|e| serde_json::from_slice(&std::fs::read(e.path()).unwrap()).unwrap())
        .collect()
}

/// The reproduction of the node-wide tax: 50 entries left by DELs of a
/// network whose IPAM plugin and CNI_PATH are gone. A healthy network's
/// ADD, CHECK and DEL do not touch them (not one replay: their files are
/// unchanged); its STATUS answers ready. STATUS replays each due entry
/// once, counting the attempt and backing it off (a second STATUS at once
/// replays none); entries that cannot succeed become dead letters after
/// five attempts, with one warning each; `calico ipam queue` lists them
/// and, once the plugin is back, replays one.
#[test]
fn other_networks_stale_entries_cost_nothing_and_never_make_status_fail() {
    let test = "other_networks_stale_entries_cost_nothing_and_never_make_status_fail";
    if !root_or_skip(test) {
        return;
    }
    let s = Setup::new("1.1.0", false);
    let queue = s.dir.path().join("queue");
    let stale = format!("gone-{}", unique());
    let cids = stale_entries(&s, &stale, &queue, 50);
    let snapshot = |q: &Path| -> Vec<(PathBuf, Vec<u8>, SystemTime)> {
        entry_files(q)
            .into_iter()
            .map(|p| {
                let m = std::fs::metadata(&p).unwrap().modified().unwrap();
                (p.clone(), std::fs::read(&p).unwrap(), m)
            })
            .collect()
    };
    let before = snapshot(&queue);
    assert_eq!(before.len(), 50);

    // The healthy network (host-local, the embedded store) shares the queue.
    let mut healthy = s.conf.clone();
    healthy["release_queue_dir"] = json!(queue);
    let ns = Netns::new();
    let cid = container_id();
    let result = s
        .run_with("ADD", &cid, &ns.path(), "eth0", &healthy, &[])
        .assert_ok()
        .json();
    let mut check = healthy.clone();
    check["prevResult"] = result;
    assert_eq!(
        s.run_with("CHECK", &cid, &ns.path(), "eth0", &check, &[])
            .code,
        0
    );
    s.run_with("DEL", &cid, &ns.path(), "eth0", &healthy, &[])
        .assert_ok();
    assert_eq!(
        snapshot(&queue),
        before,
        "a healthy network's calls replayed others' entries"
    );
    let out = s.run_with("STATUS", "", "", "eth0", &healthy, &[]);
    assert_eq!(out.code, 0, "owed releases alone made STATUS fail: {out:?}");

    // That STATUS replayed each due entry once: one attempt each, backed off.
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let after = of_network(&queue, &stale);
    assert_eq!(after.len(), 50);
    for e in &after {
        assert_eq!(e["attempts"], 1, "{e}");
        assert!(e["next_attempt"].as_u64().unwrap() > now, "{e}");
        assert!(
            e["error"]
                .as_str()
                .unwrap()
                .contains("failed to find plugin"),
            "{e}"
        );
    }
    let out = s.run_with("STATUS", "", "", "eth0", &healthy, &[]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        of_network(&queue, &stale)
            .iter()
            .all(|e| e["attempts"] == 1),
        "replayed before its backoff"
    );

    // Four more attempts (each after its backoff): dead letters.
    for attempt in 2..=5 {
        for f in entry_files(&queue) {
            make_due(&f);
        }
        let out = s.run_with("STATUS", "", "", "eth0", &healthy, &[]);
        assert_eq!(out.code, 0, "{out:?}");
        if attempt < 5 {
            assert!(
                of_network(&queue, &stale)
                    .iter()
                    .all(|e| e["attempts"] == attempt)
            );
        }
    }
    assert!(
        of_network(&queue, &stale).is_empty(),
        "{:?}",
        of_network(&queue, &stale)
    );
    let dead = dead_letters(&queue);
    assert_eq!(dead.len(), 50);
    assert!(
        dead.iter()
            .all(|e| e["attempts"] == 5 && e["dead_reason"].is_string()),
        "{:?}",
        dead[0]
    );
    let log = std::fs::read_to_string(s.dir.path().join("log/cni.log")).unwrap();
    assert_eq!(
        log.matches("is given up on").count(),
        50,
        "one warning per dead letter"
    );

    // The operator sees them, and replays one once its plugin is back.
    let q = queue.display().to_string();
    let list = common::exec_args(
        CALICO,
        &["ipam", "queue", "list", "--dead", "--dir", &q],
        &env_of(&[]),
        "",
    );
    assert_eq!(list.code, 0, "{list:?}");
    assert_eq!(list.stdout.lines().count(), 51, "{}", list.stdout);
    assert!(list.stdout.contains(&cids[7]), "{}", list.stdout);
    let json_list = common::exec_args(
        CALICO,
        &["ipam", "queue", "list", "--dead", "-o", "json", "--dir", &q],
        &env_of(&[]),
        "",
    );
    let parsed: Value = serde_json::from_str(&json_list.stdout).unwrap();
    assert_eq!(parsed.as_array().map(Vec::len), Some(50));
    let back = FlakyIpam::new(&s.subnet);
    let mut entry: Value = dead
        .iter()
        .find(|e| e["container_id"] == json!(cids[7]))
        .unwrap()
        .clone();
    // (The plugin is back, in another directory: the entry is pointed at it.)
    entry["vars"]["CNI_PATH"] = json!(back.path());
    let file = queue
        .join(".dead")
        .join(&stale)
        .join(format!("{}+eth0.json", cids[7]));
    std::fs::write(&file, entry.to_string()).unwrap();
    let replay = common::exec_args(
        CALICO,
        &["ipam", "queue", "replay", "--dead", "--dir", &q, &cids[7]],
        &env_of(&[]),
        "",
    );
    assert_eq!(replay.code, 0, "{replay:?}");
    assert!(replay.stdout.contains("released"), "{}", replay.stdout);
    assert_eq!(back.calls("DEL", &cids[7]), 1);
    assert_eq!(dead_letters(&queue).len(), 49);
    assert!(of_network(&queue, &stale).is_empty());
}

/// What the queue costs a call whose network owes nothing, read from the
/// system calls (strace): one look at its own network's directory, whatever
/// other networks owe; nothing of theirs is opened.
#[test]
fn a_call_with_nothing_owed_looks_at_one_directory() {
    let test = "a_call_with_nothing_owed_looks_at_one_directory";
    if !root_or_skip(test) {
        return;
    }
    let Ok(strace) = which("strace") else {
        common::cannot_run(
            test,
            "strace is not installed (scripts/test.sh installs it)",
        );
        return;
    };
    let s = Setup::new("1.0.0", false);
    let queue = s.dir.path().join("queue");
    stale_entries(&s, &format!("gone-{}", unique()), &queue, 50);
    let mut healthy = s.conf.clone();
    healthy["release_queue_dir"] = json!(queue);
    let ns = Netns::new();
    let cid = container_id();
    let trace = s.dir.path().join("trace");
    for command in ["ADD", "DEL"] {
        let mut env = env_of(&[
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", &cid),
            ("CNI_NETNS", &ns.path()),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", common::CNI_BIN),
        ]);
        env.insert("PATH".into(), std::env::var("PATH").unwrap_or_default());
        // One file per thread (`-ff`): a call's threads' syscalls are not
        // split into unfinished and resumed halves.
        let prefix = trace.join(command);
        std::fs::create_dir_all(&trace).unwrap();
        let out = std::process::Command::new(&strace)
            .args(["-ff", "-qq", "-o"])
            .arg(&prefix)
            .args(["-e", "trace=%file,%desc", CALICO])
            .env_clear()
            .envs(&env)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(healthy.to_string().as_bytes())?;
                child.wait_with_output()
            })
            .unwrap();
        assert!(
            out.status.success(),
            "{command}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let text: String = std::fs::read_dir(&trace)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{command}.")))
            })
            .map(|p| std::fs::read_to_string(p).unwrap())
            .collect();
        let touching: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(&queue.display().to_string()))
            .collect();
        assert_eq!(touching.len(), 1, "{command}: {touching:#?}");
        assert!(
            touching[0].contains(&format!("{}/net1\"", queue.display()))
                && touching[0].contains("ENOENT"),
            "{command}: {touching:?}"
        );
    }
}

fn which(name: &str) -> Result<PathBuf, ()> {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
        .ok_or(())
}

/// This network's entries still drain: an entry is replayed by the next
/// call of its network only once it is due, once per call, its failures
/// counted and backed off, and the release is made once the IPAM answers.
#[test]
fn a_due_entry_of_this_network_is_drained_with_backoff() {
    let test = "a_due_entry_of_this_network_is_drained_with_backoff";
    if !root_or_skip(test) {
        return;
    }
    let s = Setup::new("1.0.0", false);
    let queue = s.dir.path().join("queue");
    let ipam = FlakyIpam::new(&s.subnet);
    let conf = flaky_conf(&s, "flaky", &queue);
    let add = |cid: &str, ns: &Netns| {
        run_in(&s, "ADD", cid, &ns.path(), &conf, &ipam.path()).assert_ok();
    };
    let (na, a) = (Netns::new(), container_id());
    add(&a, &na);
    ipam.broken(true);
    let out = run_in(&s, "DEL", &a, &na.path(), &conf, &ipam.path());
    assert_eq!(out.error_code(), 11, "{out:?}");
    assert!(na.link("eth0").is_none(), "the local teardown is done");
    let owed = of_network(&queue, "flaky");
    assert_eq!(owed.len(), 1);
    assert_eq!(owed[0]["attempts"], 0);
    assert_eq!(ipam.calls("DEL", &a), 1);

    // Not due yet: the next call leaves it.
    let (nb, b) = (Netns::new(), container_id());
    add(&b, &nb);
    assert_eq!(ipam.calls("DEL", &a), 1);

    // Due, still failing: one attempt, counted, backed off.
    make_due(&entry_files(&queue)[0]);
    let (nc, c) = (Netns::new(), container_id());
    add(&c, &nc);
    assert_eq!(ipam.calls("DEL", &a), 2, "one replay per call");
    let owed = of_network(&queue, "flaky");
    assert_eq!(owed[0]["attempts"], 1, "{}", owed[0]);
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let next = owed[0]["next_attempt"].as_u64().unwrap();
    assert!(
        (now + 8..=now + 11).contains(&next),
        "10 s after the 1st failed attempt: {next} vs {now}"
    );
    // Right away again: backed off.
    let (nd, d) = (Netns::new(), container_id());
    add(&d, &nd);
    assert_eq!(ipam.calls("DEL", &a), 2);

    // The IPAM is back and the entry due: the next call releases it.
    ipam.broken(false);
    make_due(&entry_files(&queue)[0]);
    let (ne, e) = (Netns::new(), container_id());
    add(&e, &ne);
    assert_eq!(ipam.calls("DEL", &a), 3);
    assert!(of_network(&queue, "flaky").is_empty());
    for (ns, cid) in [(&nb, &b), (&nc, &c), (&nd, &d), (&ne, &e)] {
        run_in(&s, "DEL", cid, &ns.path(), &conf, &ipam.path()).assert_ok();
    }
    assert!(entries(&queue).is_empty());
}

/// The node's defaults: every network's queue under
/// /var/lib/calico/cni-release-queue (beside the embedded store's default
/// file). Owed releases of a network whose plugin is gone there never make
/// another network's STATUS fail, and its pods' ADD and DEL leave them be.
#[test]
fn owed_releases_in_the_nodes_default_queue_never_make_status_fail() {
    let test = "owed_releases_in_the_nodes_default_queue_never_make_status_fail";
    if !root_or_skip(test) {
        return;
    }
    let queue = PathBuf::from("/var/lib/calico/cni-release-queue");
    let s = Setup::new("1.1.0", false);
    let stale = format!("gone-{}", unique());
    /// Removes this test's network from the node's queue, whatever happens.
    struct Cleanup(PathBuf, PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }
    let _cleanup = Cleanup(queue.join(&stale), queue.join(".dead").join(&stale));
    stale_entries(&s, &stale, &queue, 3);
    // A network with the node's defaults: no queue or store path of its own.
    let mut healthy = s.conf.clone();
    let obj = healthy.as_object_mut().unwrap();
    obj.remove("local_datastore_path");
    obj.insert("name".into(), json!(format!("healthy-{}", unique())));
    let ns = Netns::new();
    let cid = container_id();
    s.run_with("ADD", &cid, &ns.path(), "eth0", &healthy, &[])
        .assert_ok();
    assert!(
        of_network(&queue, &stale)
            .iter()
            .all(|e| e["attempts"] == 0)
    );
    s.run_with("DEL", &cid, &ns.path(), "eth0", &healthy, &[])
        .assert_ok();
    let out = s.run_with("STATUS", "", "", "eth0", &healthy, &[]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        of_network(&queue, &stale)
            .iter()
            .all(|e| e["attempts"] == 1)
    );
    assert!(s.reservations().is_empty());
}

/// A network's entries left by DELs when its old datastore went away for
/// good (the network now on another store): each replay meets a refused
/// connection. An ADD of the network pays for one short attempt — not for
/// the etcd client's pauses and retries of every due entry until the
/// drain's one-second budget is spent — and the network's other due
/// entries wait for the next call, still due.
#[test]
fn a_gone_datastore_costs_an_add_one_short_attempt() {
    let test = "a_gone_datastore_costs_an_add_one_short_attempt";
    if !root_or_skip(test) {
        return;
    }
    let s = Setup::new("1.0.0", false);
    let queue = s.dir.path().join("queue");
    let name = format!("moved-{}", unique());
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let mut old = s.conf.clone();
    old["name"] = json!(name);
    old["release_queue_dir"] = json!(queue);
    old["datastore_type"] = json!("etcdv3");
    old["etcd_endpoints"] = json!(format!("http://127.0.0.1:{port}"));
    let ns = Netns::new();
    let cid = container_id();
    let out = s.run_with("DEL", &cid, &ns.path(), "eth0", &old, &[]);
    assert_ne!(out.code, 0, "a DEL whose datastore refuses: {out:?}");
    let dir = queue.join(&name);
    let first = entry_files(&queue)
        .into_iter()
        .find(|p| p.starts_with(&dir))
        .unwrap_or_else(|| panic!("the DEL's entry: {out:?}"));
    let entry: Value = serde_json::from_slice(&std::fs::read(&first).unwrap()).unwrap();
    for _ in 1..3 {
        let other = container_id();
        let mut e = entry.clone();
        e["container_id"] = json!(other);
        e["vars"]["CNI_CONTAINERID"] = json!(other);
        std::fs::write(dir.join(format!("{other}+eth0.json")), e.to_string()).unwrap();
    }
    for f in entry_files(&queue) {
        make_due(&f);
    }

    let mut now = s.conf.clone();
    now["name"] = json!(name);
    now["release_queue_dir"] = json!(queue);
    let (na, a) = (Netns::new(), container_id());
    let started = std::time::Instant::now();
    s.run_with("ADD", &a, &na.path(), "eth0", &now, &[])
        .assert_ok();
    let took = started.elapsed();
    eprintln!("{test}: the ADD took {took:?}");
    let attempts: Vec<u64> = of_network(&queue, &name)
        .iter()
        .map(|e| e["attempts"].as_u64().unwrap())
        .collect();
    assert_eq!(attempts.len(), 3, "{attempts:?}");
    assert_eq!(
        attempts.iter().sum::<u64>(),
        1,
        "one replay per call once one fails: {attempts:?}"
    );
    // The drain's budget is 1 s; one replay's, 300 ms.
    assert!(
        took < Duration::from_millis(900),
        "the ADD took {took:?}: more than one short attempt"
    );
    s.run_with("DEL", &a, &na.path(), "eth0", &now, &[])
        .assert_ok();
}
