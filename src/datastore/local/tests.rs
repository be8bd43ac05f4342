//! The store against a real SQLite file: its operations, its checkpoints,
//! concurrent writers in threads and processes.

use std::collections::BTreeSet;
use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use super::checkpoint::{WAL_CHECKPOINT_FRAMES, WAL_FRAME_BYTES};
use super::*;
use crate::datastore::model::{LABEL_NAMESPACE, LABEL_ORCHESTRATOR, Profile, WorkloadEndpoint};

/// The typed resource API of a store.
trait Typed {
    fn s(&self) -> &dyn Store;
}

impl Typed for LocalStore {
    fn s(&self) -> &dyn Store {
        self
    }
}

const TIMEOUT: Duration = Duration::from_secs(30);

fn run<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
        .block_on(future)
}

fn store_in(dir: &tempfile::TempDir) -> (PathBuf, LocalStore) {
    let path = dir.path().join("nested/dir/store.db");
    let store = LocalStore::open(&path, TIMEOUT).expect("open");
    (path, store)
}

fn k8s_wep(namespace: &str, name: &str) -> WorkloadEndpoint {
    let mut wep = WorkloadEndpoint::new(namespace, name);
    wep.spec.orchestrator = "k8s".into();
    wep.spec.node = "node1".into();
    wep.spec.endpoint = "eth0".into();
    wep.spec.ip_networks = vec!["10.0.0.1/32".into()];
    wep
}

/// Operations started together share one hand-off to the blocking
/// pool and run in the order they were started: a read started after
/// a write sees it; the queue serves the next batch once one is done.
#[test]
fn operations_started_together_run_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store) = store_in(&dir);
    run(async {
        let s = store.s();
        let mut ops: Vec<std::pin::Pin<Box<dyn Future<Output = Option<String>> + '_>>> = Vec::new();
        for i in 0..10 {
            let name = format!("wep-{i}");
            ops.push(Box::pin(async move {
                s.create(&mut k8s_wep("ns", &name)).await.unwrap();
                None
            }));
            let name = format!("wep-{i}");
            ops.push(Box::pin(async move {
                s.get::<WorkloadEndpoint>("ns", &name)
                    .await
                    .unwrap()
                    .map(|w| w.metadata.name)
            }));
        }
        let answers = futures::future::join_all(ops).await;
        for (i, pair) in answers.chunks(2).enumerate() {
            assert_eq!(pair[1].as_deref(), Some(format!("wep-{i}").as_str()));
        }
        // Later, alone: served by a new hand-off.
        let all = s
            .list::<WorkloadEndpoint>("ns", &ListFilter::NamePrefix(String::new()))
            .await
            .unwrap();
        assert_eq!(all.len(), 10);
    });
}

/// `.cargo/config.toml` builds the bundled SQLite for the store: the
/// modules every connection would register at open left out, the page
/// cache's bulk allocation and the memory statistics off.
#[test]
fn sqlite_is_built_for_the_store() {
    let conn = Connection::open_in_memory().unwrap();
    let options: Vec<String> = conn
        .prepare("PRAGMA compile_options")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for left_out in [
        "ENABLE_FTS3",
        "ENABLE_FTS5",
        "ENABLE_RTREE",
        "ENABLE_DBSTAT_VTAB",
        "ENABLE_STAT4",
        "SOUNDEX",
    ] {
        assert!(
            !options.iter().any(|o| o == left_out),
            "{left_out} in {options:?}"
        );
    }
    for set in ["DEFAULT_PCACHE_INITSZ=0", "DEFAULT_MEMSTATUS=0"] {
        assert!(options.iter().any(|o| o == set), "{set} not in {options:?}");
    }
}

/// What one plugin process does to the store at `path`: open it,
/// create one endpoint (`ns/name`), close it.
fn one_call_writes(path: &Path, name: &str) {
    let store = LocalStore::open(path, TIMEOUT).unwrap();
    run(store.s().create(&mut k8s_wep("ns", name).clone())).unwrap();
}

/// The size of the WAL file of the store at `path` (0 when absent).
fn wal_bytes(path: &Path) -> u64 {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(wal).map_or(0, |m| m.len())
}

/// One short-lived process after another (each opens, writes, closes):
/// the WAL stays short, everything written survives, and the file
/// never needs more than the occasional checkpoint.
#[test]
fn wal_stays_short_across_short_lived_openers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    for i in 0..200 {
        one_call_writes(&path, &format!("wep-{i:03}"));
    }
    let wal = wal_bytes(&path);
    assert!(
        wal <= (WAL_CHECKPOINT_FRAMES + 8) * WAL_FRAME_BYTES,
        "WAL grew to {wal} bytes"
    );
    let store = LocalStore::open(&path, TIMEOUT).unwrap();
    assert_eq!(
        run(store
            .s()
            .list::<WorkloadEndpoint>("ns", &ListFilter::NamePrefix(("wep-").to_string())))
        .unwrap()
        .len(),
        200
    );
}

/// A reader holding an old snapshot (another process mid-call) keeps
/// the WAL from being started over: closers past the threshold defer
/// (nothing is lost); once it is gone, the next closer checkpoints and
/// truncates the WAL.
#[test]
fn a_checkpoint_defers_while_a_reader_holds_the_wal_and_truncates_after() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    drop(LocalStore::open(&path, TIMEOUT).unwrap());
    let wal_frames = || wal_bytes(&path) / WAL_FRAME_BYTES;
    let reader = Connection::open(&path).unwrap();
    // (As the plugin's own connections: closing it checkpoints nothing.)
    reader
        .set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )
        .unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let _: i64 = reader
        .query_row("SELECT count(*) FROM resources", [], |r| r.get(0))
        .unwrap();
    for i in 0..60 {
        one_call_writes(&path, &format!("wep-{i:03}"));
    }
    let held = wal_frames();
    assert!(held > WAL_CHECKPOINT_FRAMES + 8, "{held} frames");
    reader.execute_batch("COMMIT").unwrap();
    drop(reader);
    one_call_writes(&path, "wep-last");
    assert_eq!(wal_frames(), 0);
    let store = LocalStore::open(&path, TIMEOUT).unwrap();
    assert_eq!(
        run(store
            .s()
            .list::<WorkloadEndpoint>("ns", &ListFilter::NamePrefix(String::new())))
        .unwrap()
        .len(),
        61
    );
}

#[test]
fn create_get_and_forced_fields() {
    let dir = tempfile::tempdir().unwrap();
    let (path, store) = store_in(&dir);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(path.parent().unwrap()), 0o755);

    let mut wep = k8s_wep("ns1", "node1-k8s-mypod-eth0");
    wep.metadata
        .labels
        .insert(LABEL_NAMESPACE.into(), "spoofed".into());
    wep.metadata.uid = "caller-chosen".into();
    let created = run(store.s().create(&mut wep.clone())).unwrap();

    let meta = &created.metadata;
    assert_eq!(meta.labels[LABEL_NAMESPACE], "ns1");
    assert_eq!(meta.labels[LABEL_ORCHESTRATOR], "k8s");
    assert_eq!(meta.uid.len(), 36);
    assert_ne!(meta.uid, "caller-chosen");
    assert!(meta.resource_version.parse::<i64>().unwrap() > 0);
    let ts = meta.creation_timestamp.as_bytes();
    assert_eq!((ts.len(), ts[10], ts[19]), (20, b'T', b'Z'));

    let fetched = run(store
        .s()
        .get::<WorkloadEndpoint>("ns1", "node1-k8s-mypod-eth0"))
    .unwrap();
    assert_eq!(fetched.as_ref(), Some(&created));
    assert_eq!(
        run(store
            .s()
            .get::<WorkloadEndpoint>("ns2", "node1-k8s-mypod-eth0"))
        .unwrap(),
        None
    );

    // resourceVersion lives only in the revision column.
    let conn = Connection::open(&path).unwrap();
    let value: String = conn
        .query_row(
            "SELECT value FROM resources WHERE kind = 'WorkloadEndpoint'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(!value.contains("resourceVersion"), "{value}");
    assert!(value.contains(&created.metadata.uid));
}

#[test]
fn create_twice_is_already_exists() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store) = store_in(&dir);
    let wep = k8s_wep("ns1", "node1-k8s-mypod-eth0");
    run(store.s().create(&mut wep.clone())).unwrap();
    let err = run(store.s().create(&mut wep.clone())).unwrap_err();
    assert!(matches!(err, DatastoreError::AlreadyExists(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        "resource already exists: WorkloadEndpoint(ns1/node1-k8s-mypod-eth0)"
    );
}

#[test]
fn list_by_prefix_within_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store) = store_in(&dir);
    for (ns, name) in [
        ("ns1", "node1-k8s-mypod-eth0"),
        ("ns1", "node1-k8s-mypod--1-eth0"),
        ("ns1", "node1-k8s-other-eth0"),
        ("ns1", "node1xk8s-mypod-eth0"),
        ("ns2", "node1-k8s-mypod-eth0"),
    ] {
        run(store.s().create(&mut k8s_wep(ns, name).clone())).unwrap();
    }
    let names = |ns: &str, prefix: &str| -> Vec<String> {
        run(store
            .s()
            .list::<WorkloadEndpoint>(ns, &ListFilter::NamePrefix((prefix).to_string())))
        .unwrap()
        .into_iter()
        .map(|w| format!("{}/{}", w.metadata.namespace, w.metadata.name))
        .collect()
    };
    assert_eq!(
        names("ns1", "node1-k8s-mypod-"),
        ["ns1/node1-k8s-mypod--1-eth0", "ns1/node1-k8s-mypod-eth0"]
    );
    assert_eq!(
        names("ns2", "node1-k8s-mypod-"),
        ["ns2/node1-k8s-mypod-eth0"]
    );
    assert_eq!(
        names("ns1", "node1"),
        [
            "ns1/node1-k8s-mypod--1-eth0",
            "ns1/node1-k8s-mypod-eth0",
            "ns1/node1-k8s-other-eth0",
            "ns1/node1xk8s-mypod-eth0"
        ]
    );
    // Every namespace: by name, then namespace.
    assert_eq!(
        names("", "node1-k8s-mypod-"),
        [
            "ns1/node1-k8s-mypod--1-eth0",
            "ns1/node1-k8s-mypod-eth0",
            "ns2/node1-k8s-mypod-eth0"
        ]
    );
    assert!(names("ns1", "node1_").is_empty());
    assert!(names("ns1", "node1%").is_empty());
    assert!(names("ns3", "").is_empty());
}

#[test]
fn update_is_compare_and_swap() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store) = store_in(&dir);
    let created = run(store.s().create(&mut k8s_wep("ns1", "w").clone())).unwrap();

    let mut changed = created.clone();
    changed.spec.profiles = vec!["kns.ns1".into()];
    changed.metadata.uid = "ignored".into();
    changed.metadata.creation_timestamp = "1999-01-01T00:00:00Z".into();
    changed.metadata.labels.clear();
    let updated = run(store.s().update(&mut changed.clone())).unwrap();
    assert_eq!(updated.metadata.uid, created.metadata.uid);
    assert_eq!(
        updated.metadata.creation_timestamp,
        created.metadata.creation_timestamp
    );
    assert_eq!(updated.metadata.labels[LABEL_NAMESPACE], "ns1");
    assert_ne!(
        updated.metadata.resource_version,
        created.metadata.resource_version
    );
    assert_eq!(
        run(store.s().get::<WorkloadEndpoint>("ns1", "w")).unwrap(),
        Some(updated)
    );

    // `changed` still carries the old resourceVersion.
    let err = run(store.s().update(&mut changed.clone())).unwrap_err();
    assert!(matches!(err, DatastoreError::Conflict(_)), "{err:?}");

    let mut missing = changed.clone();
    missing.metadata.name = "absent".into();
    let err = run(store.s().update(&mut missing.clone())).unwrap_err();
    assert!(matches!(err, DatastoreError::NotFound(_)), "{err:?}");

    let mut unversioned = changed;
    unversioned.metadata.resource_version.clear();
    let err = run(store.s().update(&mut unversioned.clone())).unwrap_err();
    assert!(matches!(err, DatastoreError::Other(_)), "{err:?}");
}

#[test]
fn delete_checks_preconditions() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store) = store_in(&dir);
    let created = run(store.s().create(&mut k8s_wep("ns1", "w").clone())).unwrap();
    let delete = |precondition| {
        run(store
            .s()
            .delete::<WorkloadEndpoint>("ns1", "w", &precondition))
    };

    let err = delete(Precondition {
        uid: Some("someone-else".into()),
        ..Default::default()
    })
    .unwrap_err();
    assert!(matches!(err, DatastoreError::Conflict(_)), "{err:?}");

    let err = delete(Precondition {
        resource_version: Some("999999".into()),
        ..Default::default()
    })
    .unwrap_err();
    assert!(matches!(err, DatastoreError::Conflict(_)), "{err:?}");

    delete(Precondition {
        resource_version: Some(created.metadata.resource_version.clone()),
        uid: Some(created.metadata.uid.clone()),
    })
    .unwrap();
    assert_eq!(
        run(store.s().get::<WorkloadEndpoint>("ns1", "w")).unwrap(),
        None
    );

    let err = delete(Precondition::default()).unwrap_err();
    assert!(matches!(err, DatastoreError::NotFound(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        "resource does not exist: WorkloadEndpoint(ns1/w)"
    );
}

#[test]
fn profiles() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store) = store_in(&dir);
    assert_eq!(run(store.s().get::<Profile>("", "net1")).unwrap(), None);

    let profile = Profile::for_network("net1", false);
    let created = run(store.s().create(&mut profile.clone())).unwrap();
    assert_eq!(created.spec, profile.spec);
    assert!(!created.metadata.uid.is_empty());
    assert_eq!(
        run(store.s().get::<Profile>("", "net1")).unwrap(),
        Some(created)
    );

    let err = run(store.s().create(&mut profile.clone())).unwrap_err();
    assert_eq!(err.to_string(), "resource already exists: Profile(net1)");
}

#[test]
fn cluster_readiness() {
    let dir = tempfile::tempdir().unwrap();
    let (path, store) = store_in(&dir);
    assert!(run(store.s().cluster_ready()).unwrap());
    let info = run(store
        .s()
        .get::<ClusterInformation>("", ClusterInformation::NAME))
    .unwrap()
    .unwrap();
    assert_eq!(info.spec.cluster_type, CLUSTER_TYPE);
    assert_eq!(info.spec.cluster_guid.len(), 32);

    store.set_cluster_ready(false).unwrap();
    assert!(!run(store.s().cluster_ready()).unwrap());
    let after = run(store
        .s()
        .get::<ClusterInformation>("", ClusterInformation::NAME))
    .unwrap()
    .unwrap();
    assert_eq!(after.spec.cluster_guid, info.spec.cluster_guid);

    store.set_cluster_ready(true).unwrap();
    assert!(run(store.s().cluster_ready()).unwrap());

    // Deleting the object makes the store not ready, and reopening does
    // not bring it back.
    let conn = Connection::open(&path).unwrap();
    conn.execute(
        "DELETE FROM resources WHERE kind = 'ClusterInformation'",
        [],
    )
    .unwrap();
    assert!(!run(store.s().cluster_ready()).unwrap());
    let reopened = LocalStore::open(&path, TIMEOUT).unwrap();
    assert!(!run(reopened.s().cluster_ready()).unwrap());
    assert_eq!(
        run(reopened
            .s()
            .get::<ClusterInformation>("", ClusterInformation::NAME))
        .unwrap(),
        None
    );
}

/// The SQL in the module documentation works as documented.
#[test]
fn operator_sql_marks_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    let (path, store) = store_in(&dir);
    let before = run(store
        .s()
        .get::<ClusterInformation>("", ClusterInformation::NAME))
    .unwrap()
    .unwrap();
    let sql = "BEGIN IMMEDIATE;
UPDATE counter SET last_revision = last_revision + 1 WHERE id = 1;
UPDATE resources SET value = json_set(value, '$.spec.datastoreReady', json('false')), revision = (SELECT last_revision FROM counter WHERE id = 1) WHERE kind = 'ClusterInformation' AND namespace = '' AND name = 'default';
COMMIT;";
    let docs = include_str!("mod.rs").replace("\n//! ", "\n");
    assert!(docs.contains(sql), "module docs must show the tested SQL");

    Connection::open(&path).unwrap().execute_batch(sql).unwrap();
    assert!(!run(store.s().cluster_ready()).unwrap());
    let after = run(store
        .s()
        .get::<ClusterInformation>("", ClusterInformation::NAME))
    .unwrap()
    .unwrap();
    assert_eq!(after.spec.datastore_ready, Some(false));
    assert_eq!(after.spec.cluster_guid, before.spec.cluster_guid);
    let revision = |i: &ClusterInformation| i.metadata.resource_version.parse::<i64>().unwrap();
    assert!(revision(&after) > revision(&before));

    let again = Connection::open(&path).unwrap();
    again
        .execute_batch(&sql.replace("json('false')", "json('true')"))
        .unwrap();
    assert!(run(store.s().cluster_ready()).unwrap());
}

#[test]
fn concurrent_creates_from_separate_connections() {
    const THREADS: usize = 8;
    const PER_THREAD: usize = 25;
    let dir = tempfile::tempdir().unwrap();
    let (path, store) = store_in(&dir);
    let path = Arc::new(path);

    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let path = Arc::clone(&path);
            std::thread::spawn(move || {
                let store = LocalStore::open(&path, TIMEOUT).unwrap();
                for i in 0..PER_THREAD {
                    let wep = k8s_wep("ns1", &format!("node1-k8s-pod{t}x{i}-eth0"));
                    run(store.s().create(&mut wep.clone())).unwrap();
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }

    let all = run(store
        .s()
        .list::<WorkloadEndpoint>("ns1", &ListFilter::NamePrefix(("").to_string())))
    .unwrap();
    assert_eq!(all.len(), THREADS * PER_THREAD);
    let revisions: BTreeSet<&str> = all
        .iter()
        .map(|w| w.metadata.resource_version.as_str())
        .collect();
    assert_eq!(revisions.len(), THREADS * PER_THREAD);
}

#[test]
fn racing_updates_lose_nothing() {
    const THREADS: usize = 8;
    const UPDATES_PER_THREAD: usize = 10;
    let dir = tempfile::tempdir().unwrap();
    let (path, store) = store_in(&dir);
    run(store.s().create(&mut k8s_wep("ns1", "shared").clone())).unwrap();
    let path = Arc::new(path);

    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let path = Arc::clone(&path);
            std::thread::spawn(move || {
                let store = LocalStore::open(&path, TIMEOUT).unwrap();
                let mut conflicts = 0;
                for i in 0..UPDATES_PER_THREAD {
                    loop {
                        let mut wep = run(store.s().get::<WorkloadEndpoint>("ns1", "shared"))
                            .unwrap()
                            .unwrap();
                        wep.spec.profiles.push(format!("t{t}-{i}"));
                        match run(store.s().update(&mut wep.clone())) {
                            Ok(_) => break,
                            Err(DatastoreError::Conflict(_)) => conflicts += 1,
                            Err(e) => panic!("update failed: {e}"),
                        }
                    }
                }
                conflicts
            })
        })
        .collect();
    let conflicts: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();

    let wep = run(store.s().get::<WorkloadEndpoint>("ns1", "shared"))
        .unwrap()
        .unwrap();
    assert_eq!(wep.spec.profiles.len(), THREADS * UPDATES_PER_THREAD);
    let distinct: BTreeSet<&String> = wep.spec.profiles.iter().collect();
    assert_eq!(distinct.len(), THREADS * UPDATES_PER_THREAD);
    eprintln!("racing updates: {conflicts} conflicts retried");
}

const CHILD_PATH_ENV: &str = "CALICO_CNI_TEST_LOCALSTORE_PATH";
const CHILD_INDEX_ENV: &str = "CALICO_CNI_TEST_LOCALSTORE_INDEX";

/// Not a test on its own: the body of each child process spawned by
/// `many_processes_open_a_fresh_file_at_once` (run with `--ignored`).
#[test]
#[ignore = "the child process of many_processes_open_a_fresh_file_at_once"]
fn child_opens_store_and_creates_one_wep() {
    let (Ok(path), Ok(index)) = (
        std::env::var(CHILD_PATH_ENV),
        std::env::var(CHILD_INDEX_ENV),
    ) else {
        panic!(
            "run only as a child of many_processes_open_a_fresh_file_at_once ({CHILD_PATH_ENV}, {CHILD_INDEX_ENV} unset)"
        );
    };
    let path = PathBuf::from(path);
    // Wait for the starting gun so that all children open together.
    let go = path.with_extension("go");
    while !go.exists() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let store = LocalStore::open(&path, TIMEOUT).unwrap();
    let wep = k8s_wep("ns1", &format!("child-{index}"));
    run(store.s().create(&mut wep.clone())).unwrap();
}

#[test]
fn many_processes_open_a_fresh_file_at_once() {
    const PROCESSES: usize = 50;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fresh/store.db");
    let exe = std::env::current_exe().unwrap();

    let children: Vec<_> = (0..PROCESSES)
        .map(|i| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "datastore::local::tests::child_opens_store_and_creates_one_wep",
                    "--ignored",
                    "--test-threads=1",
                    "--quiet",
                ])
                .env(CHILD_PATH_ENV, &path)
                .env(CHILD_INDEX_ENV, i.to_string())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path.with_extension("go"), b"").unwrap();
    for mut child in children {
        assert!(child.wait().unwrap().success(), "a child process failed");
    }

    let store = LocalStore::open(&path, TIMEOUT).unwrap();
    let weps = run(store
        .s()
        .list::<WorkloadEndpoint>("ns1", &ListFilter::NamePrefix(("child-").to_string())))
    .unwrap();
    assert_eq!(weps.len(), PROCESSES);
    assert!(run(store.s().cluster_ready()).unwrap());
    let conn = Connection::open(&path).unwrap();
    let infos: i64 = conn
        .query_row(
            "SELECT count(*) FROM resources WHERE kind = 'ClusterInformation'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(infos, 1);
}
