//! `calico-ipam -upgrade`: Calico's migration of a node from host-local
//! IPAM to calico-ipam (its cni-plugin/pkg/upgrade), as calico-node's
//! `upgrade-ipam` init container runs it, with the datastore settings of
//! its environment (`DATASTORE_TYPE`, `KUBECONFIG`; the Kubernetes
//! datastore: Calico's migration reads the node's pods and its podCIDR
//! from the API server) and the node named by `KUBERNETES_NODE_NAME`.
//!
//! In Calico's order: nothing to do without host-local's data directory
//! (`/var/lib/cni/networks/k8s-pod-network`); the node's IPIP tunnel
//! address (the IPv4 podCIDR's first address after the one written,
//! assigned to `ipip-tunnel-addr-<node>` and recorded in the node's
//! `projectcalico.org/IPv4IPIPTunnelAddr` annotation) when it has none; an
//! empty directory is removed; else the cluster's CNI is held off
//! (ClusterInformation `datastoreReady: false`), the host's `calico` and
//! `host-local` binaries (`/host/opt/cni/bin`) are removed, in-flight calls
//! get 5 s, host-local's lock is taken, and each allocation file of a pod
//! still on the node (matched by its podIP) becomes that address assigned to
//! `k8s-pod-network.<container ID>` with the node, pod and namespace
//! attributes, the file removed after; files of no pod are removed,
//! `last_reserved_ip*` too. Then the CNI is let back in and the directory
//! removed. Attempts repeat every second until one succeeds (Calico: for
//! ever; here for [`GIVE_UP_AFTER`]).
//!
//! Every step can be repeated, so a migration killed at any point is
//! finished by running it again: an address already assigned to the same
//! handle is taken as done and its handle's count made right (a kill
//! between the block's write and the handle's leaves it short); a file is
//! removed only after its address is recorded. Better than Calico: IPv6
//! allocation files migrate (Calico's parse of `<ip>/32` fails on them,
//! and so does its migration, for ever).
//!
//! `CALICO_UPGRADE_HOST_LOCAL_DIR` and `CALICO_UPGRADE_CNI_BIN_DIR` move the
//! two paths (for tests, and for a container that mounts them elsewhere).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use super::Outcome;
use super::progress::Progress;
use crate::cni::NetConf;
use crate::datastore::ipam_model::{ATTR_NAMESPACE, ATTR_NODE, ATTR_POD};
use crate::datastore::model::ClusterInformation;
use crate::datastore::open::open;
use crate::datastore::{DatastoreError, Store};
use crate::ipam::calico::IpamError;
use crate::ipam::calico::operator::NodeAddresses;
use crate::k8s::K8sClient;

/// host-local's data directory for Calico's network.
pub const HOST_LOCAL_DIR: &str = "/var/lib/cni/networks/k8s-pod-network";
/// Where calico-node mounts the host's CNI binaries.
pub const CNI_BIN_DIR: &str = "/host/opt/cni/bin";
/// The annotation holding a node's IPIP tunnel address (Calico's Node
/// `spec.bgp.ipv4IPIPTunnelAddr` on the Kubernetes datastore).
pub const TUNNEL_ANNOTATION: &str = "projectcalico.org/IPv4IPIPTunnelAddr";
/// Calico's allocation attribute `type` for an IPIP tunnel address.
const ATTR_TYPE: &str = "type";
const TYPE_IPIP: &str = "ipipTunnelAddress";
/// How long in-flight host-local calls get once the binaries are gone.
const SETTLE: Duration = Duration::from_secs(5);
/// Attempts stop after this long (Calico's loop never does).
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(600);
/// How long one attempt's requests may take.
const ATTEMPT_DEADLINE: Duration = Duration::from_secs(60);

/// Where the migration reads and removes files.
#[derive(Debug, Clone)]
pub struct Paths {
    pub data_dir: PathBuf,
    pub cni_bin_dir: PathBuf,
}

impl Paths {
    pub fn from_vars(vars: &HashMap<String, String>) -> Paths {
        let var = |k: &str, default: &str| {
            PathBuf::from(vars.get(k).filter(|v| !v.is_empty()).map_or(default, |v| v))
        };
        Paths {
            data_dir: var("CALICO_UPGRADE_HOST_LOCAL_DIR", HOST_LOCAL_DIR),
            cni_bin_dir: var("CALICO_UPGRADE_CNI_BIN_DIR", CNI_BIN_DIR),
        }
    }
}

/// What the migration is doing and how far it is, on stderr (the process's
/// one stderr: one reporter for the process).
static PROGRESS: std::sync::LazyLock<Progress> =
    std::sync::LazyLock::new(|| Progress::stderr("calico-ipam -upgrade"));

fn say(line: &str) {
    PROGRESS.note(&format!("calico-ipam -upgrade: {line}"));
    tracing::info!("{line}");
}

/// `calico-ipam -upgrade`.
pub fn run(vars: &HashMap<String, String>) -> Outcome {
    let Some(node) = vars
        .get("KUBERNETES_NODE_NAME")
        .filter(|n| !n.is_empty())
        .cloned()
    else {
        return Outcome::failed(
            "calico-ipam -upgrade",
            "KUBERNETES_NODE_NAME not specified, refusing to migrate...",
        );
    };
    let mut conf = NetConf {
        datastore_type: "kubernetes".into(),
        ..NetConf::default()
    };
    if let Some(kc) = vars.get("KUBECONFIG").filter(|k| !k.is_empty()) {
        conf.kubernetes.kubeconfig = kc.clone();
    }
    let paths = Paths::from_vars(vars);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return Outcome::failed("calico-ipam -upgrade", &format!("no runtime: {e}"));
        }
    };
    say(&format!(
        "migrating from host-local to calico-ipam (node {node})..."
    ));
    let started = std::time::Instant::now();
    let mut attempts = 0;
    loop {
        attempts += 1;
        match runtime.block_on(attempt(&conf, vars, &node, &paths)) {
            Ok(()) => {
                say("migration from host-local to calico-ipam complete");
                PROGRESS.finish();
                return Outcome::default();
            }
            Err(e) if started.elapsed() < GIVE_UP_AFTER => {
                say(&format!("failed to migrate ipam, retrying...: {e}"));
                PROGRESS.phase(
                    &format!(
                        "attempt {} in 1 s ({} of {} spent)",
                        attempts + 1,
                        super::progress::duration_text(started.elapsed()),
                        super::progress::duration_text(GIVE_UP_AFTER)
                    ),
                    None,
                );
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(e) => {
                PROGRESS.clear();
                return Outcome::failed(
                    "calico-ipam -upgrade",
                    &format!("gave up after {GIVE_UP_AFTER:?}: {e}"),
                );
            }
        }
    }
}

/// One attempt, on a datastore opened for it.
async fn attempt(
    conf: &NetConf,
    vars: &HashMap<String, String>,
    node: &str,
    paths: &Paths,
) -> Result<(), String> {
    if !paths.data_dir.exists() {
        say("host-local IPAM data dir not found; no migration necessary");
        return Ok(());
    }
    let deadline = Instant::now() + ATTEMPT_DEADLINE;
    PROGRESS.phase("connecting to the datastore", None);
    let client = K8sClient::new(&conf.k8s_config(), deadline)
        .await
        .map_err(|e| format!("the Kubernetes client: {e}"))?;
    let for_store = client.clone();
    let opened = open(conf, vars, deadline, None, || async { Ok(for_store) })
        .await
        .map_err(|e| format!("opening the datastore: {e}"))?;
    migrate(opened.store.as_ref(), &client, node, paths).await
}

/// The migration proper (see the module's documentation).
pub async fn migrate(
    store: &dyn Store,
    client: &K8sClient,
    node: &str,
    paths: &Paths,
) -> Result<(), String> {
    let allocator = NodeAddresses::new(store, node);
    PROGRESS.phase("checking the node's IPIP tunnel address", None);
    tunnel_address(&allocator, client, node).await?;

    let mut entries = std::fs::read_dir(&paths.data_dir)
        .map_err(|e| format!("failed to open host-local IPAM data dir: {e}"))?;
    if entries.next().is_none() {
        say("host-local IPAM data dir empty; removing it");
        return std::fs::remove_dir(&paths.data_dir)
            .map_err(|e| format!("failed to remove host-local IPAM data dir: {e}"));
    }
    say("host-local IPAM data dir is not empty, migrating...");

    PROGRESS.phase("holding off the cluster's CNI (datastoreReady false)", None);
    set_ready(store, false).await?;
    say("datastore readiness set to false");
    for binary in ["calico", "host-local"] {
        let path = paths.cni_bin_dir.join(binary);
        match std::fs::remove_file(&path) {
            Ok(()) => say(&format!("removed cni binary {}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("failed to remove binary {}: {e}", path.display())),
        }
    }
    crate::fault::kill_point("upgrade-not-ready");
    PROGRESS.phase(
        &format!(
            "giving in-flight CNI calls {}",
            super::progress::duration_text(SETTLE)
        ),
        None,
    );
    tokio::time::sleep(SETTLE).await;

    PROGRESS.phase("taking host-local's lock", None);
    let lock = lock_host_local(&paths.data_dir).await?;
    PROGRESS.phase("listing the node's pods", None);
    let pods: BTreeMap<String, (String, String)> = client
        .pods_on_node(node)
        .await
        .map_err(|e| format!("failed to list pods: {e}"))?
        .into_iter()
        .filter_map(|p| {
            let ip = p
                .status
                .as_ref()?
                .pod_ip
                .clone()
                .filter(|ip| !ip.is_empty())?;
            let m = p.metadata;
            Some((
                ip,
                (m.namespace.unwrap_or_default(), m.name.unwrap_or_default()),
            ))
        })
        .collect();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&paths.data_dir)
        .map_err(|e| format!("failed to read {}: {e}", paths.data_dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    PROGRESS.phase("migrating allocation files", Some(files.len() as u64));
    for (i, file) in files.iter().enumerate() {
        migrate_file(&allocator, file, &pods, node).await?;
        PROGRESS.tick(i as u64 + 1);
    }
    drop(lock);

    PROGRESS.phase(
        "letting the cluster's CNI back in (datastoreReady true)",
        None,
    );
    set_ready(store, true).await?;
    say("datastore readiness set to true");
    crate::fault::kill_point("upgrade-ready");
    if let Err(e) = std::fs::remove_dir_all(&paths.data_dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        say(&format!("failed to remove host-local IPAM data dir: {e}"));
    }
    Ok(())
}

/// The node's IPIP tunnel address, when it has none and its podCIDR is
/// IPv4: the podCIDR's address with its last byte incremented (Calico's
/// choice, host-local's gateway), assigned and annotated.
async fn tunnel_address(
    allocator: &NodeAddresses<'_>,
    client: &K8sClient,
    node: &str,
) -> Result<(), String> {
    let k8s_node = client
        .node(node, false)
        .await
        .map_err(|e| format!("failed to get k8s node resource: {e}"))?
        .ok_or_else(|| format!("failed to get k8s node resource: node {node} not found"))?;
    let annotated = k8s_node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(TUNNEL_ANNOTATION))
        .is_some_and(|a| !a.is_empty());
    if annotated {
        return Ok(());
    }
    let cidr = k8s_node
        .spec
        .as_ref()
        .and_then(|s| s.pod_cidr.clone())
        .unwrap_or_default();
    let ip: IpAddr = cidr
        .split('/')
        .next()
        .and_then(|a| a.parse().ok())
        .filter(|_| cidr.contains('/'))
        .ok_or_else(|| format!("PodCIDR {cidr} did not parse successfully"))?;
    let IpAddr::V4(v4) = ip else {
        say("IPv6 podCIDR - no need to migrate IPIP address");
        return Ok(());
    };
    let mut octets = v4.octets();
    octets[3] = octets[3].wrapping_add(1);
    let tunnel = IpAddr::from(octets);
    let handle = format!("ipip-tunnel-addr-{node}");
    let attrs = BTreeMap::from([
        (ATTR_NODE.to_string(), node.to_string()),
        (ATTR_TYPE.to_string(), TYPE_IPIP.to_string()),
    ]);
    assign(allocator, tunnel, &handle, &attrs).await?;
    let annotations = serde_json::Map::from_iter([(
        TUNNEL_ANNOTATION.to_string(),
        serde_json::Value::String(tunnel.to_string()),
    )]);
    client
        .annotate_node(node, &annotations)
        .await
        .map_err(|e| format!("failed to update node: {e}"))?;
    say(&format!(
        "assigned IPIP tunnel address {tunnel} to node {node}"
    ));
    Ok(())
}

/// Assigns `ip` to `handle`; one already assigned (a repeated step) is
/// fine, its handle's count made right.
async fn assign(
    allocator: &NodeAddresses<'_>,
    ip: IpAddr,
    handle: &str,
    attrs: &BTreeMap<String, String>,
) -> Result<(), String> {
    match allocator.assign(ip, handle, attrs).await {
        Ok(_) => Ok(()),
        Err(IpamError::InUse(m)) => {
            say(&format!("{ip} already assigned, continuing ({m})"));
            allocator
                .reconcile(ip, handle)
                .await
                .map(|_| ())
                .map_err(|e| format!("failed to check the handle of {ip}: {e}"))
        }
        Err(e) => Err(format!("failed to assign IP {ip} to calico backend: {e}")),
    }
}

/// One file of host-local's directory.
async fn migrate_file(
    allocator: &NodeAddresses<'_>,
    file: &Path,
    pods: &BTreeMap<String, (String, String)>,
    node: &str,
) -> Result<(), String> {
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_string();
    let remove = || match std::fs::remove_file(file) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("failed to remove file {}: {e}", file.display())),
    };
    if name.contains("last") {
        return remove();
    }
    if name == "lock" {
        return Ok(());
    }
    let ip: IpAddr = name
        .parse()
        .map_err(|e| format!("failed to parse IP {name}: {e}"))?;
    let content = std::fs::read_to_string(file)
        .map_err(|e| format!("failed to read file {}: {e}", file.display()))?;
    let container_id = content
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    let Some((namespace, pod)) = pods.get(&name) else {
        say(&format!(
            "pod not found for IP {name}, deleting and continuing"
        ));
        return remove();
    };
    let handle = format!("k8s-pod-network.{container_id}");
    let attrs = BTreeMap::from([
        (ATTR_NODE.to_string(), node.to_string()),
        (ATTR_POD.to_string(), pod.clone()),
        (ATTR_NAMESPACE.to_string(), namespace.clone()),
    ]);
    assign(allocator, ip, &handle, &attrs).await?;
    crate::fault::kill_point("upgrade-assigned");
    say(&format!(
        "{ip} of {namespace}/{pod} assigned in Calico IPAM"
    ));
    remove()
}

/// ClusterInformation `default`'s `datastoreReady`, set compare-and-swap
/// (again on a conflict, a few times).
async fn set_ready(store: &dyn Store, ready: bool) -> Result<(), String> {
    let mut last = String::new();
    for _ in 0..5 {
        let mut info = store
            .get::<ClusterInformation>("", ClusterInformation::NAME)
            .await
            .map_err(|e| format!("failed to fetch cluster information: {e}"))?
            .ok_or("failed to fetch cluster information: ClusterInformation default not found")?;
        if info.spec.datastore_ready == Some(ready) {
            return Ok(());
        }
        info.spec.datastore_ready = Some(ready);
        match store.update(&mut info).await {
            Ok(_) => return Ok(()),
            Err(DatastoreError::Conflict(e)) => {
                last = e;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(format!("failed to set datastore readiness to {ready}: {e}")),
        }
    }
    Err(format!(
        "failed to set datastore readiness to {ready}: {last}"
    ))
}

/// host-local's own lock (an exclusive flock of `<dir>/lock`), so that no
/// host-local call still running allocates meanwhile; waited for up to 30 s.
async fn lock_host_local(dir: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, String> {
    let path = dir.join("lock");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("failed to initialize host-local IPAM: {e}"))?;
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(lock),
            Err((f, nix::errno::Errno::EWOULDBLOCK)) if Instant::now() < until => {
                file = f;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err((_, e)) => return Err(format!("failed to acquire lock on host-local IPAM: {e}")),
        }
    }
}
