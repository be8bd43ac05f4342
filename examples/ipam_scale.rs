//! IPAM at scale: many simulated nodes allocating pods' addresses from one
//! IPv4 pool through Calico's allocator (the library calico-ipam runs in
//! process), concurrently from several processes, on the test bed's real
//! etcd cluster or its real Kubernetes API server; then every address
//! released. Prints allocations per second, p50/p99 per allocation and
//! release, conflicts retried (compare-and-swap losses seen by the store),
//! duplicates and leaks. With the test bed up (`scripts/testbed.sh up`):
//!
//!     eval "$(bash scripts/testbed.sh env)"
//!     cargo run --release --example ipam_scale -- --backend etcd --nodes 1000 --pods 110
//!     cargo run --release --example ipam_scale -- --backend kdd --nodes 100 --pods 110
//!
//! Options: `--procs P` worker processes (default 4), `--concurrency C`
//! nodes in flight per process (default 8), `--pool CIDR` (default
//! 100.64.0.0/14, /26 blocks). Each node is served by one task, its pods
//! one after the other, as the host lock serializes them on a real node.
//! The run's objects (pool, blocks, affinities, handles) are removed at
//! the end. Exits non-zero on a duplicate, a failed allocation or a leak.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use calico_cni::datastore::etcd::EtcdStore;
use calico_cni::datastore::ipam_model::{
    BlockAffinity, IpPool, IpPoolSpec, IpamBlock, IpamHandle, cidr_of_block_name,
};
use calico_cni::datastore::kubernetes::KubernetesStore;
use calico_cni::datastore::{DatastoreError, Kind, ListFilter, Precondition, Resource, Store};
use calico_cni::etcd::EtcdClient;
use calico_cni::ipam::calico::IpamError;
use calico_cni::ipam::calico::allocator::{Allocator, AutoAssign};
use calico_cni::ipam::calico::pools::SelectorLabels;
use calico_cni::k8s::{K8sClient, K8sConfig};
use ipnet::IpNet;
use serde_json::{Value, json};

#[path = "common/testbed.rs"]
mod testbed;

use testbed::{Failure, deadline, etcd_config, var};

#[derive(Clone)]
struct Options {
    backend: String,
    nodes: usize,
    pods: usize,
    procs: usize,
    concurrency: usize,
    pool: IpNet,
    run: String,
    worker: Option<usize>,
}

fn options() -> Result<Options, Failure> {
    let mut o = Options {
        backend: "etcd".into(),
        nodes: 1000,
        pods: 110,
        procs: 4,
        concurrency: 8,
        pool: "100.64.0.0/14".parse()?,
        run: format!("{:x}", std::process::id()),
        worker: None,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--backend" => o.backend = value,
            "--nodes" => o.nodes = value.parse()?,
            "--pods" => o.pods = value.parse()?,
            "--procs" => o.procs = value.parse()?,
            "--concurrency" => o.concurrency = value.parse()?,
            "--pool" => o.pool = value.parse()?,
            "--run" => o.run = value,
            "--worker" => o.worker = Some(value.parse()?),
            other => return Err(format!("unknown option {other}").into()),
        }
        i += 2;
    }
    if !["etcd", "kdd"].contains(&o.backend.as_str()) {
        return Err("--backend is etcd or kdd".into());
    }
    Ok(o)
}

/// The datastore: on the API server, with the CNI's own credentials for
/// the workers and the admin's for the coordinator (the CNI may not
/// create or delete IPPools).
async fn open(backend: &str, admin: bool) -> Result<Arc<dyn Store>, Failure> {
    Ok(match backend {
        "etcd" => Arc::new(EtcdStore::new(EtcdClient::new(
            &etcd_config()?,
            deadline(),
        )?)),
        _ => {
            let conf = K8sConfig {
                kubeconfig: Some(
                    var(if admin {
                        "KUBECONFIG"
                    } else {
                        "CALICO_CNI_KUBECONFIG"
                    })?
                    .into(),
                ),
                ..K8sConfig::default()
            };
            Arc::new(KubernetesStore::new(
                K8sClient::new(&conf, deadline()).await?,
                None,
                None,
            ))
        }
    })
}

/// The store, counting the compare-and-swap losses it reports.
struct Counting {
    inner: Arc<dyn Store>,
    conflicts: AtomicU64,
}

impl Counting {
    fn count<T>(&self, r: Result<T, DatastoreError>) -> Result<T, DatastoreError> {
        if matches!(
            r,
            Err(DatastoreError::Conflict(_) | DatastoreError::AlreadyExists(_))
        ) {
            self.conflicts.fetch_add(1, Ordering::Relaxed);
        }
        r
    }
}

#[async_trait::async_trait]
impl Store for Counting {
    async fn get_object(
        &self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, DatastoreError> {
        self.inner.get_object(kind, namespace, name).await
    }
    async fn list_objects(
        &self,
        kind: &'static Kind,
        namespace: &str,
        filter: &ListFilter,
    ) -> Result<Vec<Value>, DatastoreError> {
        self.inner.list_objects(kind, namespace, filter).await
    }
    async fn create_object(
        &self,
        kind: &'static Kind,
        object: Value,
    ) -> Result<Value, DatastoreError> {
        self.count(self.inner.create_object(kind, object).await)
    }
    async fn update_object(
        &self,
        kind: &'static Kind,
        object: Value,
    ) -> Result<Value, DatastoreError> {
        self.count(self.inner.update_object(kind, object).await)
    }
    async fn delete_object(
        &self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
        precondition: &Precondition,
    ) -> Result<(), DatastoreError> {
        self.count(
            self.inner
                .delete_object(kind, namespace, name, precondition)
                .await,
        )
    }
    fn writes_together(&self) -> bool {
        self.inner.writes_together()
    }
    async fn write_together(
        &self,
        writes: Vec<calico_cni::datastore::Write>,
    ) -> Result<Vec<Value>, DatastoreError> {
        self.count(self.inner.write_together(writes).await)
    }
    async fn list_names(
        &self,
        kind: &'static Kind,
        namespace: &str,
    ) -> Result<Vec<String>, DatastoreError> {
        self.inner.list_names(kind, namespace).await
    }
    fn backend(&self) -> calico_cni::datastore::Backend {
        self.inner.backend()
    }
}

struct NoLabels;

#[async_trait::async_trait]
impl SelectorLabels for NoLabels {
    async fn node_labels(&self) -> Result<BTreeMap<String, String>, IpamError> {
        Ok(BTreeMap::new())
    }
    async fn namespace_labels(&self) -> Result<BTreeMap<String, String>, IpamError> {
        Ok(BTreeMap::new())
    }
}

fn node_name(o: &Options, i: usize) -> String {
    format!("scale-{}-{i}", o.run)
}

fn pool_name(o: &Options) -> String {
    format!("scale-{}", o.run)
}

fn handle_id(o: &Options, node: usize, pod: usize) -> String {
    format!("scale.{}-{node}-{pod}", o.run)
}

/// One phase of a worker over its nodes, `concurrency` nodes at a time,
/// each node's pods one after the other: their allocation times (ms) and
/// failures.
async fn phase(o: &Options, store: &Arc<Counting>, me: usize, release: bool) -> (Vec<f64>, u64) {
    let mine: Vec<usize> = (0..o.nodes).filter(|n| n % o.procs == me).collect();
    let queue = Arc::new(std::sync::Mutex::new(mine));
    let local = tokio::task::LocalSet::new();
    let mut tasks = Vec::new();
    for _ in 0..o.concurrency {
        let (store, queue, o) = (Arc::clone(store), Arc::clone(&queue), o.clone());
        tasks.push(local.spawn_local(async move {
            let (mut times, mut failures) = (Vec::new(), 0u64);
            loop {
                let Some(n) = queue.lock().unwrap().pop() else {
                    break;
                };
                let node = node_name(&o, n);
                let allocator = Allocator::new(store.as_ref(), &node);
                let attrs = BTreeMap::from([("node".to_string(), node.clone())]);
                let pools = [pool_name(&o)];
                for p in 0..o.pods {
                    let handle = handle_id(&o, n, p);
                    let t = Instant::now();
                    if release {
                        match allocator.release_by_handle(&handle).await {
                            Ok(_) => times.push(t.elapsed().as_secs_f64() * 1e3),
                            Err(e) => {
                                failures += 1;
                                eprintln!("release {handle}: {e}");
                            }
                        }
                        continue;
                    }
                    let req = AutoAssign {
                        num4: 1,
                        num6: 0,
                        handle: &handle,
                        attrs: &attrs,
                        pools4: &pools,
                        pools6: &[],
                        max_blocks: 0,
                        labels: &NoLabels,
                    };
                    match allocator.auto_assign(&req).await {
                        Ok(got) if got.v4.len() == 1 => {
                            times.push(t.elapsed().as_secs_f64() * 1e3);
                            println!(
                                "{}",
                                json!({"ip": got.v4[0].addr().to_string(), "handle": handle})
                            );
                        }
                        Ok(got) => {
                            failures += 1;
                            eprintln!("{handle}: got {got:?}");
                        }
                        Err(e) => {
                            failures += 1;
                            eprintln!("{handle}: {e}");
                        }
                    }
                }
            }
            (times, failures)
        }));
    }
    local
        .run_until(async {
            let (mut times, mut failures) = (Vec::new(), 0);
            for t in tasks {
                let (t, f) = t.await.expect("task");
                times.extend(t);
                failures += f;
            }
            (times, failures)
        })
        .await
}

/// One worker process: allocates for its nodes (one JSON line per
/// address), reports, waits for the coordinator's go on stdin, releases,
/// reports.
async fn worker(o: Options, me: usize) -> Result<(), Failure> {
    let store = Arc::new(Counting {
        inner: open(&o.backend, false).await?,
        conflicts: AtomicU64::new(0),
    });
    let (times, failures) = phase(&o, &store, me, false).await;
    println!(
        "{}",
        json!({"phase": "allocate", "ms": times, "failures": failures,
               "conflicts": store.conflicts.load(Ordering::Relaxed)})
    );
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    let before = store.conflicts.load(Ordering::Relaxed);
    let (times, failures) = phase(&o, &store, me, true).await;
    println!(
        "{}",
        json!({"phase": "release", "ms": times, "failures": failures,
               "conflicts": store.conflicts.load(Ordering::Relaxed) - before})
    );
    Ok(())
}

/// What the workers reported for one phase.
#[derive(Default)]
struct Phase {
    ms: Vec<f64>,
    failures: u64,
    conflicts: u64,
    elapsed: Duration,
}

impl Phase {
    fn add(&mut self, v: &Value) {
        self.ms
            .extend(v["ms"].as_array().unwrap().iter().filter_map(Value::as_f64));
        self.failures += v["failures"].as_u64().unwrap_or(0);
        self.conflicts += v["conflicts"].as_u64().unwrap_or(0);
    }

    fn line(&mut self, what: &str) -> String {
        self.ms.sort_by(f64::total_cmp);
        format!(
            "{what}: {} in {:.1}s = {:.0}/s; p50 {:.1} ms, p99 {:.1} ms; conflicts retried {}; failures {}",
            self.ms.len(),
            self.elapsed.as_secs_f64(),
            self.ms.len() as f64 / self.elapsed.as_secs_f64().max(1e-9),
            percentile(&self.ms, 0.5),
            percentile(&self.ms, 0.99),
            self.conflicts,
            self.failures
        )
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// The run's objects left in the datastore: allocated addresses in the
/// pool's blocks, handles of the run; then everything of the run removed.
async fn leaks_and_cleanup(o: &Options, store: &dyn Store) -> Result<(usize, usize), Failure> {
    let prefix = format!("scale.{}-", o.run);
    let blocks = store.list::<IpamBlock>("", &ListFilter::All).await?;
    let ours: Vec<&IpamBlock> = blocks
        .iter()
        .filter(|b| {
            b.spec
                .cidr
                .parse::<IpNet>()
                .is_ok_and(|c| o.pool.contains(&c))
        })
        .collect();
    let allocated: usize = ours
        .iter()
        .map(|b| b.spec.allocations.iter().filter(|a| a.is_some()).count())
        .sum();
    let handles: Vec<String> = store
        .list_names(IpamHandle::KIND, "")
        .await?
        .into_iter()
        .filter(|h| h.to_lowercase().starts_with(&prefix))
        .collect();
    let none = Precondition::default();
    for h in &handles {
        let _ = store.delete_object(IpamHandle::KIND, "", h, &none).await;
    }
    for b in &ours {
        let _ = store
            .delete_object(IpamBlock::KIND, "", &b.metadata.name, &none)
            .await;
    }
    let nodes: HashSet<String> = (0..o.nodes).map(|i| node_name(o, i)).collect();
    for a in store.list::<BlockAffinity>("", &ListFilter::All).await? {
        if nodes.contains(&a.spec.node) {
            let _ = store
                .delete_object(BlockAffinity::KIND, "", &a.metadata.name, &none)
                .await;
        }
    }
    let _ = store
        .delete_object(IpPool::KIND, "", &pool_name(o), &none)
        .await;
    Ok((allocated, handles.len()))
}

async fn coordinate(o: Options) -> Result<bool, Failure> {
    let store = open(&o.backend, true).await?;
    // No other pool or block may overlap the run's pool.
    for b in store.list_names(IpamBlock::KIND, "").await? {
        if cidr_of_block_name(&b).is_some_and(|c| o.pool.contains(&c.addr())) {
            return Err(format!("block {b} already exists in {}", o.pool).into());
        }
    }
    let mut pool = IpPool::new(
        &pool_name(&o),
        IpPoolSpec {
            cidr: o.pool.to_string(),
            block_size: 26,
            node_selector: "all()".into(),
            allowed_uses: vec!["Workload".into(), "Tunnel".into()],
            // Manual, and requested by name: nothing else sharing the
            // cluster allocates from it.
            assignment_mode: "Manual".into(),
            ..IpPoolSpec::default()
        },
    );
    store.create(&mut pool).await?;
    let exe = std::env::current_exe()?;
    let started = Instant::now();
    let mut children = Vec::new();
    for w in 0..o.procs {
        let child = Command::new(&exe)
            .args(["--backend", &o.backend, "--run", &o.run])
            .args([
                "--nodes",
                &o.nodes.to_string(),
                "--pods",
                &o.pods.to_string(),
            ])
            .args(["--procs", &o.procs.to_string()])
            .args(["--concurrency", &o.concurrency.to_string()])
            .args(["--pool", &o.pool.to_string(), "--worker", &w.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        children.push(child);
    }
    // Every worker's stdout, line by line, on a thread of its own.
    let (tx, rx) = std::sync::mpsc::channel::<Value>();
    for c in children.iter_mut() {
        let (out, tx) = (c.stdout.take().unwrap(), tx.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    let _ = tx.send(v);
                }
            }
        });
    }
    drop(tx);
    // Allocation: every address live at once at its end, so one seen twice
    // is a duplicate.
    let mut owner: HashMap<String, String> = HashMap::new();
    let mut duplicates = Vec::new();
    let (mut alloc, mut release) = (Phase::default(), Phase::default());
    let mut reported = 0;
    while reported < o.procs {
        let Ok(v) = rx.recv() else { break };
        if v["phase"] == "allocate" {
            alloc.add(&v);
            reported += 1;
        } else if let (Some(ip), Some(h)) = (v["ip"].as_str(), v["handle"].as_str())
            && let Some(prev) = owner.insert(ip.to_string(), h.to_string())
        {
            duplicates.push(format!("{ip}: {prev} and {h}"));
        }
    }
    alloc.elapsed = started.elapsed();
    // The store agrees: as many addresses allocated in the pool's blocks.
    let in_store: usize = store
        .list::<IpamBlock>("", &ListFilter::All)
        .await?
        .iter()
        .filter(|b| {
            b.spec
                .cidr
                .parse::<IpNet>()
                .is_ok_and(|c| o.pool.contains(&c))
        })
        .map(|b| b.spec.allocations.iter().filter(|a| a.is_some()).count())
        .sum();
    let released_at = Instant::now();
    for c in children.iter_mut() {
        use std::io::Write;
        c.stdin.take().unwrap().write_all(b"release\n")?;
    }
    while let Ok(v) = rx.recv() {
        if v["phase"] == "release" {
            release.add(&v);
        }
    }
    release.elapsed = released_at.elapsed();
    let mut failed_workers = 0;
    for mut c in children {
        if !c.wait()?.success() {
            failed_workers += 1;
        }
    }
    let (allocated_left, handles_left) = leaks_and_cleanup(&o, store.as_ref()).await?;
    let total = alloc.ms.len();
    println!(
        "ipam_scale {}: {} nodes x {} pods = {} addresses from {} (/26 blocks), {} processes x {} nodes in flight",
        o.backend,
        o.nodes,
        o.pods,
        o.nodes * o.pods,
        o.pool,
        o.procs,
        o.concurrency
    );
    println!("  {}", alloc.line("allocate"));
    println!("  {}", release.line("release"));
    println!(
        "  duplicates {} {:?}; allocated in the store at the end of allocation {in_store}; leaks after release: {allocated_left} addresses, {handles_left} handles; failed workers {failed_workers}",
        duplicates.len(),
        duplicates.iter().take(5).collect::<Vec<_>>()
    );
    Ok(alloc.failures + release.failures == 0
        && failed_workers == 0
        && duplicates.is_empty()
        && in_store == total
        && allocated_left == 0
        && handles_left == 0
        && total == o.nodes * o.pods)
}

fn main() {
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("ipam_scale: {e}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match o.worker {
        Some(me) => {
            if let Err(e) = rt.block_on(worker(o, me)) {
                eprintln!("ipam_scale worker {me}: {e}");
                std::process::exit(1);
            }
        }
        None => match rt.block_on(coordinate(o)) {
            Ok(true) => {}
            Ok(false) => std::process::exit(1),
            Err(e) => {
                eprintln!("ipam_scale: {e}");
                std::process::exit(1);
            }
        },
    }
}
