//! Commands README.md shows that no other test ran, run as the README
//! shows them, with their effects read back: `calico install --help`; the
//! check-and-repair workflow on a locked datastore (lock, check, `release
//! --from-report` without `--force`, unlock: on the embedded store with the
//! sqlite3 CLI as the store's documentation says, on etcd with calicoctl's
//! `datastore migrate lock`); `calico ipam queue list` and `queue replay`
//! on the live entries of the config's own queue; `calico -t` with a whole
//! conflist on stdin.

mod common;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use calico_cni::datastore::ipam_model::IpamHandle;
use calico_cni::datastore::local::LocalStore;
use calico_cni::datastore::model::{ClusterInformation, WorkloadEndpoint};
use common::ipam::{Backend, World};
use common::*;
use serde_json::{Value, json};

/// `calico ARGS...` with exactly `vars` (and PATH): (exit code, stdout,
/// stderr).
fn calico(args: &[&str], vars: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(CALICO)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(vars.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `calico ipam ARGS... --config CONF`.
fn ipam_cli(conf: &Path, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["ipam"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--config", conf.to_str().unwrap()]);
    calico(&all, &[])
}

/// A conflist (network `net1`) whose one plugin is `plugin` (a single
/// plugin's config, its `name` and `cniVersion` moved to the list), as
/// the README's commands name it: `--config …/10-calico.conflist`.
fn conflist(plugin: &Value) -> Value {
    let mut plugin = plugin.clone();
    let obj = plugin.as_object_mut().unwrap();
    let name = obj.remove("name").unwrap_or(json!("net1"));
    let version = obj.remove("cniVersion").unwrap_or(json!("1.0.0"));
    json!({"name": name, "cniVersion": version, "plugins": [plugin]})
}

// ---------------------------------------------------------------------
// `calico install --help`

/// `calico install --help` (and `-h`) exits 0 and prints the usage, naming
/// the flags the README's `calico install --host-root / --binaries DIR|none
/// [--watch]` uses and every variable the README says it lists; it installs
/// nothing (a host root given before it stays empty). (The usage is on
/// stdout today; it is looked for on stdout or stderr, so that moving it
/// does not fail this test.)
#[test]
fn install_help_prints_the_usage_and_installs_nothing() {
    let host = tempfile::tempdir().unwrap();
    let root = host.path().to_str().unwrap();
    for args in [
        vec!["install", "--help"],
        vec!["install", "-h"],
        vec![
            "install",
            "--host-root",
            root,
            "--binaries",
            "none",
            "--help",
        ],
    ] {
        let (code, stdout, stderr) = calico(&args, &[("SLEEP", "false")]);
        assert_eq!(code, 0, "calico {args:?}: {stdout}{stderr}");
        // The usage, whole, on one of the two streams.
        let usage = [&stdout, &stderr]
            .into_iter()
            .find(|s| s.contains("calico install"))
            .unwrap_or_else(|| panic!("calico {args:?} printed no usage: {stdout:?} / {stderr:?}"));
        assert!(usage.contains("Usage:"), "{usage}");
        for flag in [
            "--host-root",
            "--binaries DIR|none",
            "--watch",
            "--serviceaccount-dir",
            "--mtu-file",
            "--help",
        ] {
            assert!(usage.contains(flag), "no {flag} in:\n{usage}");
        }
        // "`calico install --help` lists every variable": those the
        // README's install section names.
        for var in [
            "CNI_CONF_NAME",
            "CNI_NETWORK_CONFIG",
            "CNI_NETWORK_CONFIG_FILE",
            "KUBERNETES_NODE_NAME",
            "CNI_MTU",
            "SLEEP",
            "SKIP_CNI_BINARIES",
            "UPDATE_CNI_BINARIES",
            "CALICO_CNI_SERVICE_ACCOUNT",
            "TLS_ASSETS_DIR",
            "CNI_TOKEN_REFRESH_INTERVAL",
            "KUBERNETES_SERVICE_HOST",
            "ETCD_ENDPOINTS",
            "CALICO_API_GROUP",
        ] {
            assert!(usage.contains(var), "no {var} in:\n{usage}");
        }
        // Help only: nothing else printed, nothing installed.
        let other = if std::ptr::eq(usage, &stdout) {
            &stderr
        } else {
            &stdout
        };
        assert!(
            !other.contains("calico install"),
            "the usage twice: {other}"
        );
        assert_eq!(
            std::fs::read_dir(host.path()).unwrap().count(),
            0,
            "calico {args:?} wrote under the host root"
        );
    }
}

// ---------------------------------------------------------------------
// The locked repair: lock, check, release --from-report without --force,
// unlock.

/// `calico ipam check --show-problem-ips` with the report written to
/// `report`: the text printed, and the report.
fn check(conf: &Path, report: &Path) -> (String, Value) {
    let (code, text, err) = ipam_cli(
        conf,
        &[
            "check",
            "--show-problem-ips",
            "--report",
            report.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "check: {text}{err}");
    let report: Value = serde_json::from_slice(&std::fs::read(report).unwrap()).unwrap();
    (text, report)
}

/// Whether ClusterInformation `default` says the datastore is ready.
fn datastore_ready(w: &World) -> Option<bool> {
    w.get::<ClusterInformation>("default")
        .expect("ClusterInformation default")["spec"]["datastoreReady"]
        .as_bool()
}

/// The workflow of README's "Check and repair" on a locked datastore, on
/// world `w`, locked and unlocked by `lock(true|false)`: a leaked address
/// and a handle holding nothing are freed by `release --from-report`
/// without `--force` while the datastore is locked (the address in use is
/// kept); meanwhile the CNI is held off (an ADD is refused with Calico's
/// not-ready message); a report made before the lock is refused as stale;
/// once unlocked, ADDs work again.
fn locked_release(w: &World, lock: &dyn Fn(bool)) {
    let pool = w.v4(0);
    w.pool(&pool.to_string(), json!({"blockSize": 28}));
    let mut plugin = w.conf();
    plugin["ipam"]["ipv4_pools"] = json!([pool.to_string()]);
    let conf_path = w.dir.path().join("10-calico.conflist");
    std::fs::write(&conf_path, conflist(&plugin).to_string()).unwrap();

    // Two addresses: one a workload uses, one leaked; a handle holding
    // nothing.
    let cids: Vec<String> = (0..2).map(|_| container_id()).collect();
    let ips: Vec<IpAddr> = cids
        .iter()
        .map(|cid| {
            let out = w.ipam("ADD", cid, &plugin, "");
            assert_eq!(out.code, 0, "{out:?}");
            common::ipam::address(&out.json(), 0).addr()
        })
        .collect();
    let (kept, leaked) = (ips[0], ips[1]);
    let dashed = kept.to_string().replace('.', "");
    w.create::<WorkloadEndpoint>(json!({
        "metadata": {"name": format!("{}-cni-c{dashed}-eth0", w.node), "namespace": "default"},
        "spec": {"orchestrator": "cni", "node": w.node, "endpoint": "eth0",
                 "containerID": format!("c{dashed}"), "interfaceName": "cali0123456789a",
                 "ipNetworks": [format!("{kept}/32")]}
    }));
    let orphan = format!("net1.orphan-{}", unique());
    let block = ipnet::IpNet::new(kept, 28).unwrap().trunc();
    w.create::<IpamHandle>(json!({
        "metadata": {"name": w.handle_name(&orphan)},
        "spec": {"handleID": orphan, "block": {block.to_string(): 1}, "deleted": false}
    }));

    // A report made before the lock.
    let early = w.dir.path().join("early-report.json");
    let (_, early_report) = check(&conf_path, &early);
    assert_eq!(early_report["datastoreLocked"], json!(false));

    // Lock.
    lock(true);
    assert_eq!(datastore_ready(w), Some(false), "the lock did not hold");
    // Nothing allocates meanwhile: the CNI is held off.
    let netns = Netns::new();
    let held = container_id();
    let out = w.plugin("ADD", &held, &netns.path(), &plugin, "", None);
    assert_ne!(out.code, 0, "an ADD while locked: {out:?}");
    assert!(
        out.json()["msg"]
            .as_str()
            .unwrap_or_default()
            .starts_with("Calico is currently not ready to process requests"),
        "{out:?}"
    );
    assert!(netns.link("eth0").is_none());

    // The report made before the lock is older than ClusterInformation.
    let (code, out, err) = ipam_cli(
        &conf_path,
        &["release", "--from-report", early.to_str().unwrap()],
    );
    assert_eq!(code, 1, "a stale report: {out}{err}");
    assert!(err.contains("stale"), "{err}");
    assert!(w.addresses_of(&format!("net1.{}", cids[1])) == [leaked]);

    // Check again, locked; release from that report without --force.
    let report_path = w.dir.path().join("report.json");
    let (text, report) = check(&conf_path, &report_path);
    assert!(
        text.contains(&format!("  {leaked} leaked; attrs Main:net1.{}", cids[1])),
        "{text}"
    );
    assert_eq!(report["datastoreLocked"], json!(true), "{report:#}");
    let (code, released, err) = ipam_cli(
        &conf_path,
        &["release", "--from-report", report_path.to_str().unwrap()],
    );
    assert_eq!(code, 0, "release without --force, locked: {released}{err}");
    assert!(
        !format!("{released}{err}").contains("not locked"),
        "{released}{err}"
    );
    assert!(
        released.contains("Released 1 IPs successfully"),
        "{released}"
    );
    assert!(
        released.contains("Released 1 handles; 0 skipped; 0 errors."),
        "{released}"
    );
    let left: Vec<IpAddr> = w.allocations().into_iter().map(|(ip, _)| ip).collect();
    assert_eq!(left, [kept], "what is left allocated");
    assert!(w.handle(&orphan).is_none(), "the empty handle is left");
    assert!(w.handle(&format!("net1.{}", cids[1])).is_none());
    assert!(w.handle(&format!("net1.{}", cids[0])).is_some());

    // Unlock: the CNI serves again.
    lock(false);
    assert_eq!(datastore_ready(w), Some(true), "the unlock did not hold");
    let r = w
        .plugin("ADD", &held, &netns.path(), &plugin, "", None)
        .assert_ok()
        .json();
    assert!(netns.link("eth0").is_some());
    assert!(pool.contains(&common::ipam::address(&r, 0).addr()));
    w.plugin("DEL", &held, &netns.path(), &plugin, "", None)
        .assert_ok();
    assert_eq!(w.ipam("DEL", &cids[0], &plugin, "").code, 0);
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
}

/// The sqlite3 CLI on the embedded store's file, as the store's
/// documentation tells an operator to mark it not ready (and ready).
fn sqlite3_set_ready(sqlite3: &Path, store: &Path, ready: bool) {
    let sql = format!(
        "BEGIN IMMEDIATE;
UPDATE counter SET last_revision = last_revision + 1 WHERE id = 1;
UPDATE resources SET value = json_set(value, '$.spec.datastoreReady', json('{ready}')), revision = (SELECT last_revision FROM counter WHERE id = 1) WHERE kind = 'ClusterInformation' AND namespace = '' AND name = 'default';
COMMIT;"
    );
    let out = Command::new(sqlite3)
        .args(["-cmd", ".timeout 5000"])
        .arg(store)
        .arg(sql)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sqlite3: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// The locked repair on the embedded store, locked and unlocked with the
/// sqlite3 CLI (calicoctl has no access to it).
#[test]
fn release_from_a_report_on_the_locked_embedded_store() {
    let test = "release_from_a_report_on_the_locked_embedded_store";
    if !root_or_skip(test) {
        return;
    }
    let Some(sqlite3) = which("sqlite3") else {
        cannot_run(
            test,
            "sqlite3 is not installed (scripts/test.sh installs it)",
        );
        return;
    };
    let Some(w) = World::new(test, Backend::Embedded) else {
        return;
    };
    let store = w.dir.path().join("store.db");
    locked_release(&w, &|locked| sqlite3_set_ready(&sqlite3, &store, !locked));
}

/// The locked repair on etcd (a private cluster: the lock holds off every
/// CNI call of the cluster), locked and unlocked as the README says, with
/// calicoctl's `datastore migrate lock` and `unlock`.
#[test]
fn release_from_a_report_on_etcd_locked_by_calicoctl() {
    let test = "release_from_a_report_on_etcd_locked_by_calicoctl";
    if !root_or_skip(test) {
        return;
    }
    let Some(calicoctl) = common::testbed::peer(test, "calico-v3.32.1/calicoctl") else {
        return;
    };
    let Some(cluster) = common::etcd::PrivateCluster::start(test, 1) else {
        return;
    };
    let Some(w) = World::on_etcd(test, cluster.access()) else {
        return;
    };
    locked_release(&w, &|locked| {
        let verb = if locked { "lock" } else { "unlock" };
        let out = w.calicoctl(&calicoctl, &["datastore", "migrate", verb]);
        let said = if locked {
            "Datastore locked.\n"
        } else {
            "Datastore unlocked.\n"
        };
        assert_eq!(out, said, "calicoctl datastore migrate {verb}");
    });
}

// ---------------------------------------------------------------------
// `calico ipam queue list` and `queue replay`: the live entries.

/// An owed release of the config's own queue (`release_queue_dir` unset:
/// `cni-release-queue` beside `local_datastore_path`), made by a real DEL
/// while the embedded store could not be written (another writer held it
/// past the DEL's deadline): `calico ipam queue list` (with `--config`,
/// and through `CNI_CONF_DIR`) shows it, as a table and as JSON;
/// `calico ipam queue replay` runs it once the store answers; the entry is
/// gone, its address and handle released, its endpoint deleted.
#[test]
fn queue_list_and_replay_the_live_entries_of_the_configs_queue() {
    let test = "queue_list_and_replay_the_live_entries_of_the_configs_queue";
    if !root_or_skip(test) {
        return;
    }
    let Some(w) = World::new(test, Backend::Embedded) else {
        return;
    };
    let pool = w.v4(0);
    w.pool(&pool.to_string(), json!({"blockSize": 28}));
    let mut plugin = w.conf();
    plugin["deadline_seconds"] = json!(2);
    let conf_dir = w.dir.path().join("net.d");
    std::fs::create_dir(&conf_dir).unwrap();
    let conf_path = conf_dir.join("10-calico.conflist");
    std::fs::write(&conf_path, conflist(&plugin).to_string()).unwrap();
    let queue = w.dir.path().join("cni-release-queue");

    let netns = Netns::new();
    let cid = container_id();
    let r = w
        .plugin("ADD", &cid, &netns.path(), &plugin, "", None)
        .assert_ok()
        .json();
    let ip = common::ipam::address(&r, 0).addr();
    let handle = format!("net1.{cid}");
    assert_eq!(w.addresses_of(&handle), [ip]);
    assert_eq!(w.endpoints("default").len(), 1);

    // Nothing owed yet.
    let (code, listed, err) = ipam_cli(&conf_path, &["queue", "list"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        listed,
        format!("no owed releases in {}\n", queue.display()),
        "{err}"
    );

    // The DEL, while another writer holds the store: the interface goes,
    // the release and the endpoint's delete cannot be made.
    {
        let holder = rusqlite::Connection::open(w.dir.path().join("store.db")).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let out = w.plugin("DEL", &cid, &netns.path(), &plugin, "", None);
        assert_ne!(out.code, 0, "a DEL that could not write the store: {out:?}");
        eprintln!("{test}: the DEL answered {}", out.stdout);
        assert!(netns.link("eth0").is_none(), "the interface is left");
        holder.execute_batch("ROLLBACK").unwrap();
    }
    assert_eq!(w.addresses_of(&handle), [ip], "released after all");
    let files = queue_entry_files(&queue);
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].starts_with(queue.join("net1")), "{files:?}");

    // list: the table, with --config.
    let (code, listed, err) = ipam_cli(&conf_path, &["queue", "list"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines.len(), 2, "{listed}");
    for column in [
        "NETWORK",
        "CONTAINER",
        "IFNAME",
        "AGE",
        "ATTEMPTS",
        "NEXT",
        "LAST ERROR",
    ] {
        assert!(lines[0].contains(column), "{listed}");
    }
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(row[..3], ["net1", cid.as_str(), "eth0"], "{listed}");
    assert_eq!(row[4], "0", "attempts: {listed}");
    // (Due, or "in 5s": the first retry's pause.)
    assert!(row[5] == "due" || row[5] == "in", "next: {listed}");

    // list -o json, the config found through CNI_CONF_DIR.
    let (code, json_listed, err) = calico(
        &["ipam", "queue", "list", "-o", "json"],
        &[("CNI_CONF_DIR", conf_dir.to_str().unwrap())],
    );
    assert_eq!(code, 0, "{err}");
    let entries: Value = serde_json::from_str(&json_listed).unwrap();
    let entries = entries.as_array().expect("a JSON array");
    assert_eq!(entries.len(), 1, "{json_listed}");
    let e = &entries[0];
    assert_eq!(
        (&e["network"], &e["container_id"], &e["ifname"]),
        (&json!("net1"), &json!(cid), &json!("eth0")),
        "{e:#}"
    );
    assert_eq!(e["attempts"], json!(0), "{e:#}");
    assert!(e["error"].as_str().is_some_and(|s| !s.is_empty()), "{e:#}");
    assert!(e["dead_since"].is_null(), "{e:#}");
    // (The dead letters are apart.)
    let (code, dead, _) = ipam_cli(&conf_path, &["queue", "list", "--dead"]);
    assert_eq!(code, 0);
    assert!(dead.starts_with("no dead letters in "), "{dead}");

    // replay: the store answers.
    let (code, replayed, err) = ipam_cli(&conf_path, &["queue", "replay"]);
    assert_eq!(code, 0, "{replayed}{err}");
    assert_eq!(replayed, format!("net1 {cid} eth0: released\n"), "{err}");
    assert!(queue_entry_files(&queue).is_empty());
    let (_, listed, _) = ipam_cli(&conf_path, &["queue", "list"]);
    assert_eq!(listed, format!("no owed releases in {}\n", queue.display()));
    assert!(w.addresses_of(&handle).is_empty(), "the address is held");
    assert!(w.handle(&handle).is_none(), "the handle is left");
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
    assert!(w.endpoints("default").is_empty(), "the endpoint is left");

    // Nothing left to replay.
    let (code, again, _) = ipam_cli(&conf_path, &["queue", "replay"]);
    assert_eq!(code, 0);
    assert_eq!(again, format!("nothing to replay in {}\n", queue.display()));
}

// ---------------------------------------------------------------------
// `calico -t` with a conflist on stdin.

/// `calico -t` with `stdin`.
fn test_connection(stdin: &Value) -> Outcome {
    common::exec_args(CALICO, &["-t"], &env_of(&[]), &stdin.to_string())
}

/// `calico -t` reads a whole conflist (the repository's
/// `conf/10-calico-local.conflist`, on a store of this test's own) and
/// tests its calico plugin's datastore: exit 0 and nothing printed while
/// ClusterInformation `default` is ready; `data store connection failed`
/// (code 100) and exit 1 while it is not; a conflist without a calico
/// plugin is refused the same way.
#[test]
fn calico_t_takes_a_conflist() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/10-calico-local.conflist"),
    )
    .unwrap();
    let mut list: Value = serde_json::from_str(&text).unwrap();
    let store_path = dir.path().join("cni-datastore.db");
    list["plugins"][0]["local_datastore_path"] = json!(store_path);
    list["plugins"][0]["log_file_path"] = json!(dir.path().join("log/cni.log"));
    // The node's store, as its first CNI call leaves it.
    let store = LocalStore::open(&store_path, std::time::Duration::from_secs(10)).unwrap();

    let out = test_connection(&list);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, ""),
        "a ready store: {out:?}"
    );
    // The same plugin alone, as it was tested so far: the same answer.
    let mut single = list["plugins"][0].clone();
    single["name"] = list["name"].clone();
    single["cniVersion"] = list["cniVersion"].clone();
    let out = test_connection(&single);
    assert_eq!((out.code, out.stdout.as_str()), (0, ""), "{out:?}");

    // Not ready: code 100.
    store.set_cluster_ready(false).unwrap();
    for stdin in [&list, &single] {
        let out = test_connection(stdin);
        assert_eq!(out.code, 1, "a store not ready: {out:?}");
        let reply = out.json();
        assert_eq!(reply["code"], 100, "{reply}");
        assert_eq!(reply["msg"], "data store connection failed", "{reply}");
        assert!(
            reply["details"]
                .as_str()
                .unwrap_or_default()
                .contains("datastoreReady"),
            "{reply}"
        );
    }
    store.set_cluster_ready(true).unwrap();
    assert_eq!(test_connection(&list).code, 0);

    // A conflist without a calico plugin.
    let mut other = list.clone();
    other["plugins"] = json!([{"type": "portmap", "capabilities": {"portMappings": true}}]);
    let out = test_connection(&other);
    assert_eq!(out.code, 1, "{out:?}");
    let reply = out.json();
    assert_eq!(reply["code"], 100, "{reply}");
    assert!(
        reply["details"]
            .as_str()
            .unwrap_or_default()
            .contains("no calico plugin"),
        "{reply}"
    );
}
