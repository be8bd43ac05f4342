//! The `calico-ipam` verbs (calico-behaviour.md §10.1, §10.2), on an
//! opened datastore: what the exec'd personality runs and what the
//! `calico` plugin runs in process when its calico-ipam is this executable.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use ipnet::IpNet;
use tokio::time::Instant;

use super::IpamError;
use super::allocator::{Allocator, AutoAssign};
use super::block::OwnerSlot;
use super::kubevirt::{self, VmiInfo};
use super::lock;
use super::pools::{SelectorLabels, automatic_pools, requested_pools};
use crate::cni::env::CniEnv;
use crate::cni::result::{IpConfig, Route};
use crate::cni::{CniResult, Error, Request, Result};
use crate::datastore::endpoints::NamespaceLabels;
use crate::datastore::ipam_model::{
    ATTR_NAMESPACE, ATTR_NODE, ATTR_POD, ATTR_TIMESTAMP, IpamConfigSpec, IpamHandle, Node,
};
use crate::datastore::names::WepIdentifiers;
use crate::datastore::{Store, go_time_utc};
use crate::ipam::Owner;

/// Where a calico-ipam call works: the datastore, the node, and how the
/// workload namespace's labels are known. The one context of the
/// personality and of calico-ipam in the `calico` plugin's process; the
/// verbs take it with the request they answer.
#[derive(Clone)]
pub struct Call {
    pub store: Arc<dyn Store>,
    /// Where namespace labels are read (the Kubernetes datastore).
    pub namespaces: Option<Arc<dyn NamespaceLabels>>,
    pub host: String,
    /// Namespace labels already read by the caller.
    pub namespace_labels: Option<BTreeMap<String, String>>,
    /// When this call must be done.
    pub deadline: Instant,
    /// The Kubernetes API, for a virt-launcher pod's VM (`None`: no pod is
    /// looked at).
    pub kube: Option<KubeAccess>,
}

/// How calico-ipam reaches the Kubernetes API for a pod's VM: the call's
/// client when it has one, else one made (once) from the config.
#[derive(Clone)]
pub struct KubeAccess {
    config: crate::k8s::K8sConfig,
    client: Arc<tokio::sync::OnceCell<crate::k8s::K8sClient>>,
}

impl KubeAccess {
    pub fn new(config: crate::k8s::K8sConfig, client: Option<crate::k8s::K8sClient>) -> KubeAccess {
        KubeAccess {
            config,
            client: Arc::new(tokio::sync::OnceCell::new_with(client)),
        }
    }

    async fn client(&self, deadline: Instant) -> Result<&crate::k8s::K8sClient> {
        self.client
            .get_or_try_init(|| async {
                Ok::<_, Error>(crate::k8s::K8sClient::new(&self.config, deadline).await?)
            })
            .await
    }
}

/// The handle of an allocation: `<network name>.<container ID>`.
pub fn handle_id(req: &Request) -> String {
    container_handle(&req.conf.name, &req.env.container_id)
}

pub fn container_handle(network: &str, container_id: &str) -> String {
    format!("{network}.{container_id}")
}

/// The handles a DEL releases: `<network>.<container ID>` and the pre-v3
/// one (`<namespace>.<pod>` for pods, else the container ID).
pub fn release_handles(network: &str, env: &CniEnv) -> [String; 2] {
    let legacy = match env.args.k8s_pod() {
        Some((ns, pod)) => format!("{ns}.{pod}"),
        None => env.container_id.clone(),
    };
    [container_handle(network, &env.container_id), legacy]
}

/// What a DEL reads before it writes: IPAMConfig (a cooldown) and its two
/// handles ([`release_handles`]), all at once.
pub struct ReleaseInputs {
    config: IpamConfigSpec,
    names: [String; 2],
    handles: [Option<IpamHandle>; 2],
    /// The host lock's file, opened meanwhile ([`lock::open_ahead`]).
    lock: Option<std::fs::File>,
}

/// [`ReleaseInputs`] read, and the host lock's file (`lock_file`) opened,
/// at once.
pub async fn read_release(
    store: &dyn Store,
    host: &str,
    names: &[String; 2],
    lock_file: PathBuf,
) -> std::result::Result<ReleaseInputs, IpamError> {
    let allocator = Allocator::new(store, host);
    let (read, lock) = tokio::join!(
        ReleaseInputs::read(&allocator, names),
        lock::open_ahead(lock_file)
    );
    Ok(ReleaseInputs { lock, ..read? })
}

/// What an ADD can read before anything else about the call is known
/// (started with the call, while the plugin reads the datastore's
/// readiness and the workload): an auto-assignment's inputs for the
/// families the config asks for, and the node's labels when a pool's
/// selector needs them.
pub struct AddInputs {
    families: (usize, usize),
    inputs: super::allocator::Inputs,
    node_labels: Option<BTreeMap<String, String>>,
    /// The host lock's file, opened meanwhile ([`lock::open_ahead`]).
    lock: Option<std::fs::File>,
    /// The handle written ahead ([`HandleAhead`]), if it was tried.
    handle: Option<HandleAhead>,
}

/// An ADD's handle, to be written ahead while the caller reads the
/// workload: its ID, and the datastore's readiness as the caller reads it
/// (nothing is written until it says ready; `Some(false)`: never).
pub struct HandleAhead {
    id: String,
    ready: tokio::sync::watch::Receiver<Option<bool>>,
    /// What was written: `None` until then, or if it failed (the handle
    /// exists: a retried ADD's).
    written: Option<IpamHandle>,
}

impl HandleAhead {
    pub fn new(id: String, ready: tokio::sync::watch::Receiver<Option<bool>>) -> HandleAhead {
        HandleAhead {
            id,
            ready,
            written: None,
        }
    }
}

/// [`AddInputs`] read, and the host lock's file (`lock_file`) opened, at
/// once; and with `handle`, once the datastore is ready, the handle
/// written ahead (as [`Allocator::create_handle_ahead`] writes it, where it
/// does).
pub async fn read_add(
    store: &dyn Store,
    host: &str,
    families: (usize, usize),
    lock_file: PathBuf,
    handle: Option<HandleAhead>,
) -> std::result::Result<AddInputs, IpamError> {
    let labels = NodeLabels {
        store,
        host,
        node: tokio::sync::OnceCell::new(),
    };
    let auto = AutoAssign {
        num4: families.0,
        num6: families.1,
        handle: "",
        attrs: &BTreeMap::new(),
        pools4: &[],
        pools6: &[],
        max_blocks: 0,
        labels: &labels,
    };
    let allocator = Allocator::new(store, host);
    let write = async {
        let mut ahead = handle?;
        let ready = *ahead.ready.wait_for(Option::is_some).await.ok()?;
        if ready != Some(true) {
            // Not tried: the allocation writes it.
            return None;
        }
        let auto = AutoAssign {
            handle: &ahead.id,
            ..auto
        };
        allocator.create_handle_ahead(&auto, &lock_file).await;
        ahead.written = allocator.take_ahead_handle();
        Some(ahead)
    };
    let (inputs, lock, handle) = tokio::join!(
        read_ahead_counted(store, &allocator, &auto, &lock_file),
        lock::open_ahead(lock_file.clone()),
        write
    );
    let inputs = match inputs {
        Ok(inputs) => inputs,
        Err(e) => {
            // (The call reads again; the handle is written again with it.)
            if let Some(written) = handle.and_then(|h| h.written) {
                allocator.delete_handle_ahead(&written).await;
            }
            return Err(e);
        }
    };
    Ok(AddInputs {
        families,
        inputs,
        node_labels: labels.node.get().cloned(),
        lock,
        handle,
    })
}

/// An auto-assignment's inputs read ahead of the lock of `lock_file`,
/// this host's claims counted first (under the lock, an unchanged count
/// spares reading its affinities again). Where reads made at once go as
/// one request (etcd), they are held back while the count is read, so
/// that these still go with the call's others (its readiness).
async fn read_ahead_counted(
    store: &dyn Store,
    allocator: &Allocator<'_>,
    auto: &AutoAssign<'_>,
    lock_file: &std::path::Path,
) -> std::result::Result<super::allocator::Inputs, IpamError> {
    let hold = store.hold_reads();
    let claims = super::block_cache::claims_started(lock_file).await;
    let reads = allocator.read_ahead(auto);
    tokio::pin!(reads);
    // Polled once, the reads are made (waiting in the batch); then the
    // batch may go.
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(reads.as_mut().poll(cx))).await;
    drop(hold);
    let inputs = match first {
        std::task::Poll::Ready(inputs) => inputs,
        std::task::Poll::Pending => reads.await,
    }?;
    Ok(inputs.after_claims(claims))
}

/// What [`read_add`] wrote ahead, taken back: the ADD's addresses come
/// from elsewhere (or it ends before its allocation).
pub async fn discard_add(store: &dyn Store, host: &str, inputs: Option<AddInputs>) {
    if let Some(written) = inputs.and_then(|i| i.handle).and_then(|h| h.written) {
        Allocator::new(store, host)
            .delete_handle_ahead(&written)
            .await;
    }
}

/// The addresses per family an ADD with this config asks for: one IPv4
/// unless `assign_ipv4` is `"false"`, one IPv6 when `assign_ipv6` is
/// `"true"`.
pub fn families(conf: &crate::cni::NetConf) -> (usize, usize) {
    (
        usize::from(conf.ipam.assign_ipv4.as_deref() != Some("false")),
        usize::from(conf.ipam.assign_ipv6.as_deref() == Some("true")),
    )
}

impl ReleaseInputs {
    async fn read(
        allocator: &Allocator<'_>,
        names: &[String; 2],
    ) -> std::result::Result<ReleaseInputs, IpamError> {
        let (config, current, legacy) = futures::future::try_join3(
            allocator.config(),
            allocator.read_handle(&names[0]),
            allocator.read_handle(&names[1]),
        )
        .await?;
        Ok(ReleaseInputs {
            config,
            names: names.clone(),
            handles: [current, legacy],
            lock: None,
        })
    }
}

/// The node name as calico-ipam determines it (no nodename-file gate).
pub fn node_name(req: &Request) -> String {
    req.conf.determine_nodename(|| {
        nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_default()
            .trim()
            .to_lowercase()
    })
}

/// The full WorkloadEndpoint name must be constructible (calico-behaviour.md §10.1 step 1).
fn check_identifiers(req: &Request, host: &str) -> Result<()> {
    let (orchestrator, pod) = match req.env.args.k8s_pod() {
        Some((_, pod)) => ("k8s", pod.to_string()),
        None => ("cni", String::new()),
    };
    let ids = WepIdentifiers {
        node: host.to_string(),
        orchestrator: orchestrator.into(),
        endpoint: req.env.ifname.clone(),
        workload: String::new(),
        pod,
        container_id: req.env.container_id.clone(),
    };
    ids.name()
        .map(|_| ())
        .map_err(|e| Error::invalid_config_caused("error constructing WorkloadEndpoint name", e))
}

struct Labels<'a> {
    call: &'a Call,
    req: &'a Request,
    /// The node's labels, once read.
    node: tokio::sync::OnceCell<BTreeMap<String, String>>,
}

impl<'a> Labels<'a> {
    fn new(call: &'a Call, req: &'a Request) -> Labels<'a> {
        Labels {
            call,
            req,
            node: tokio::sync::OnceCell::new(),
        }
    }

    /// The node's labels as read early.
    fn seed_node(&self, labels: BTreeMap<String, String>) {
        let _ = self.node.set(labels);
    }
}

/// The node's labels alone (what an early read's pool selectors need).
struct NodeLabels<'a> {
    store: &'a dyn Store,
    host: &'a str,
    node: tokio::sync::OnceCell<BTreeMap<String, String>>,
}

#[async_trait::async_trait]
impl SelectorLabels for NodeLabels<'_> {
    async fn node_labels(&self) -> std::result::Result<BTreeMap<String, String>, IpamError> {
        self.node
            .get_or_try_init(|| node_labels_of(self.store, self.host))
            .await
            .cloned()
    }

    async fn namespace_labels(&self) -> std::result::Result<BTreeMap<String, String>, IpamError> {
        Ok(BTreeMap::new())
    }
}

/// The labels of node `host`, as the datastore's cache holds it.
async fn node_labels_of(
    store: &dyn Store,
    host: &str,
) -> std::result::Result<BTreeMap<String, String>, IpamError> {
    match store.get_cached::<Node>("", host).await {
        Ok(Some(node)) => Ok(node.metadata.labels),
        Ok(None) => Err(IpamError::NoPools(format!(
            "failed to get node for host {host}: resource does not exist: Node({host})"
        ))),
        Err(source) => Err(IpamError::Datastore {
            what: format!("failed to get node for host {host}"),
            source,
        }),
    }
}

#[async_trait::async_trait]
impl SelectorLabels for Labels<'_> {
    async fn node_labels(&self) -> std::result::Result<BTreeMap<String, String>, IpamError> {
        self.node
            .get_or_try_init(|| node_labels_of(self.call.store.as_ref(), &self.call.host))
            .await
            .cloned()
    }

    async fn namespace_labels(&self) -> std::result::Result<BTreeMap<String, String>, IpamError> {
        if let Some(labels) = &self.call.namespace_labels {
            return Ok(labels.clone());
        }
        match (&self.call.namespaces, self.req.env.args.k8s_pod()) {
            (Some(namespaces), Some((ns, _))) => {
                namespaces
                    .namespace_labels(ns)
                    .await
                    .map_err(|source| IpamError::Datastore {
                        what: format!("failed to get namespace {ns}"),
                        source,
                    })
            }
            _ => Ok(BTreeMap::new()),
        }
    }
}

fn timed_out(what: &str) -> Error {
    Error::timed_out(format!(
        "calico-ipam: {what} did not finish before the deadline"
    ))
}

/// The marker that the one-time affinity labelling ran: beside the lock
/// file (`/var/run/calico/cni/ipam_upgraded` by default).
fn upgrade_marker(lock_file: &Path) -> PathBuf {
    lock_file
        .parent()
        .unwrap_or(Path::new("/var/run/calico"))
        .join("cni")
        .join("ipam_upgraded")
}

/// The VM behind the request's pod, when it is a virt-launcher pod (by its
/// name first: no other pod costs a request) and the call can ask the API
/// server; `for_delete`: a VMI already gone is no error, nor a pod gone.
async fn vm_of(call: &Call, req: &Request, for_delete: bool) -> Result<Option<VmiInfo>> {
    let (Some(kube), Some((namespace, pod))) = (&call.kube, req.env.args.k8s_pod()) else {
        return Ok(None);
    };
    if !pod.starts_with(kubevirt::LAUNCHER_PREFIX) {
        return Ok(None);
    }
    let failed = |e: &dyn std::fmt::Display| Error::ipam(format!("failed to get VMI info: {e}"));
    let client = kube.client(call.deadline).await?;
    let Some(found) = client
        .pod_once(namespace, pod)
        .await
        .map_err(|e| failed(&e))?
    else {
        if for_delete {
            return Ok(None);
        }
        return Err(failed(&format!("pods {pod:?} not found")));
    };
    let info = if for_delete {
        kubevirt::lookup_for_delete(client, &found).await
    } else {
        kubevirt::lookup(client, &found).await
    };
    info.map_err(|e| failed(&e))
}

/// The allocation attributes of the request: node, timestamp, the pod's
/// namespace and name, and a VM's.
fn attributes(call: &Call, req: &Request, vm: Option<&VmiInfo>) -> BTreeMap<String, String> {
    let mut attrs = BTreeMap::from([
        (ATTR_NODE.to_string(), call.host.clone()),
        (ATTR_TIMESTAMP.to_string(), go_time_utc(SystemTime::now())),
    ]);
    if let Some((ns, pod)) = req.env.args.k8s_pod() {
        attrs.insert(ATTR_NAMESPACE.into(), ns.to_string());
        attrs.insert(ATTR_POD.into(), pod.to_string());
    }
    if let Some(vm) = vm {
        attrs.insert(kubevirt::ATTR_VMI_NAME.into(), vm.name.clone());
        attrs.insert(kubevirt::ATTR_VMI_UID.into(), vm.vmi_uid.clone());
        if let Some(uid) = &vm.vm_uid {
            attrs.insert(kubevirt::ATTR_VM_UID.into(), uid.clone());
        }
        if let Some(uid) = &vm.migration_uid {
            attrs.insert(kubevirt::ATTR_VMIM_UID.into(), uid.clone());
        }
    }
    attrs
}

/// ADD: an explicit address (`IP=`, given back as /32 or /128) or
/// auto-assignment (each address with its block's prefix); one route per
/// address. A KubeVirt VM's pod (VM address persistence on, the default)
/// is allocated under the VM's handle: a VM's later pod takes the VM's
/// addresses as their active owner (a restart) or, a live migration's
/// target, as their alternate owner, with no routes (its node programs no
/// host route until the migration completes); a target whose VM has no
/// address is refused.
pub async fn add(call: &Call, req: &Request) -> Result<CniResult> {
    add_from(call, req, std::future::ready(None)).await
}

/// [`add`] from what [`read_add`] reads early (`None`: read now; reads of
/// other families than this request's are read again). An automatic
/// assignment takes the handle [`read_add`] wrote ahead of the lock (as
/// soon as the datastore said ready, while the caller read the workload),
/// or writes it ahead of the lock itself while it waits for those reads;
/// any other assignment deletes a handle written ahead (a VM's handle is
/// another).
pub async fn add_from(
    call: &Call,
    req: &Request,
    early: impl std::future::Future<Output = Option<AddInputs>>,
) -> Result<CniResult> {
    check_identifiers(req, &call.host)?;
    let (num4, num6) = families(&req.conf);
    let allocator = Allocator::new(call.store.as_ref(), &call.host);
    let labels = Labels::new(call, req);
    // What was read early, if for this request's families: its IPAMConfig
    // and the node's labels handed on, its inputs and the lock's file
    // returned.
    // And the handle it wrote ahead, if it tried.
    let settle = |early: Option<AddInputs>| {
        let Some(mut early) = early else {
            return (None, None);
        };
        let handle = early.handle.take();
        if early.families != (num4, num6) {
            return (None, handle);
        }
        allocator.use_config(early.inputs.config().clone());
        if let Some(node) = early.node_labels.take() {
            labels.seed_node(node);
        }
        (Some((early.inputs, early.lock.take())), handle)
    };
    let mut vm = vm_of(call, req, false).await?;
    // An automatic assignment takes what was read early below; any other
    // needs it now (a VM's IPAMConfig).
    let (mut early, (mut settled, mut handle_ahead)) =
        match vm.is_none() && req.env.args.ip.is_none() {
            true => (Some(early), (None, None)),
            false => (None, settle(early.await)),
        };
    if vm.is_some() && !allocator.config().await?.kubevirt_persistence() {
        if vm.as_ref().is_some_and(VmiInfo::is_migration_target) {
            return Err(Error::ipam(
                "live migration target pod is not allowed when KubeVirtVMAddressPersistence is disabled",
            ));
        }
        vm = None;
    }
    let handle = match &vm {
        Some(vm) => kubevirt::handle_id(&req.conf.name, &vm.namespace, &vm.name),
        None => handle_id(req),
    };
    let attrs = attributes(call, req, vm.as_ref());
    let ipam = &req.conf.ipam;
    let auto = AutoAssign {
        num4,
        num6,
        handle: &handle,
        attrs: &attrs,
        pools4: &ipam.ipv4_pools,
        pools6: &ipam.ipv6_pools,
        max_blocks: 0,
        labels: &labels,
    };
    let lock_file = lock::lock_path(&req.conf.ipam_lock_file);
    let work = async {
        // An auto-assignment's reads other than the blocks', all at once
        // and before the host lock: the lock covers the block's read and
        // the writes alone.
        let (ahead, opened) = if vm.is_none() && req.env.args.ip.is_none() {
            // (And the handle, where the lock would cover its write too:
            // written with the reads ahead once the datastore said ready,
            // else now.)
            let (early, ahead) = match early.take() {
                Some(early) => settle(early.await),
                None => (settled.take(), handle_ahead.take()),
            };
            let tried = ahead.is_some();
            if let Some(written) = ahead.and_then(|a| a.written) {
                if written.spec.handle_id == handle {
                    allocator.adopt_ahead_handle(written);
                } else {
                    allocator.delete_handle_ahead(&written).await;
                }
            }
            let read = async {
                match early {
                    Some((inputs, opened)) => Ok((inputs, opened)),
                    None => read_ahead_counted(call.store.as_ref(), &allocator, &auto, &lock_file)
                        .await
                        .map(|i| (i, None)),
                }
            };
            let write = async {
                if !tried {
                    allocator.create_handle_ahead(&auto, &lock_file).await;
                }
            };
            let (read, ()) = tokio::join!(read, write);
            let (inputs, opened) = read?;
            (Some(inputs), opened)
        } else {
            // (A VM's handle, or an explicit address's: not the one written
            // ahead.)
            if let Some(written) = handle_ahead.take().and_then(|a| a.written) {
                allocator.delete_handle_ahead(&written).await;
            }
            (None, settled.take().and_then(|(_, opened)| opened))
        };
        // A call that has to wait asks the lock's holder to allocate for
        // it as well ([`super::intents`]).
        let post = match ahead {
            Some(_) => allocator.intent_post(&auto, &lock_file, call.deadline),
            None => None,
        };
        let lock = lock::acquire_posting(&lock_file, call.deadline, post, opened).await;
        allocator.use_block_cache(lock.block_cache(call.store.identity()));
        allocator.use_intents(lock.intents(call.store.identity()), lock.posted());
        if let Some(vm) = &vm {
            let held = allocator.addresses_of(&handle).await?;
            if held.is_empty() && vm.is_migration_target() {
                return Err(IpamError::Invalid(format!(
                    "migration target pod but no IP allocated to VMI handle {handle}"
                )));
            }
            if !held.is_empty() {
                let slot = if vm.is_migration_target() {
                    OwnerSlot::Alternate
                } else {
                    OwnerSlot::Active
                };
                for &ip in &held {
                    allocator.set_owner(ip, &handle, slot, &attrs, None).await?;
                }
                tracing::info!(%handle, ?held, ?slot, "the VM's addresses, reused");
                let ips: Vec<IpNet> = held.into_iter().map(IpNet::from).collect();
                let mut result = result_for(&ips);
                if vm.is_migration_target() {
                    // No routes: the plugin programs no host route.
                    result.routes.clear();
                }
                return Ok(result);
            }
        }
        if let Some(ip) = req.env.args.ip {
            let marker = upgrade_marker(&lock_file);
            if !marker.exists() {
                let labelled = allocator.label_host_affinities().await?;
                tracing::info!(labelled, "labelled this host's BlockAffinities");
                if let Err(e) = marker
                    .parent()
                    .map_or(Ok(()), std::fs::create_dir_all)
                    .and_then(|()| std::fs::write(&marker, b""))
                {
                    tracing::warn!(marker = %marker.display(), "cannot record the IPAM upgrade: {e}");
                }
            }
            let ip = allocator.assign_ip(ip, &handle, &attrs).await?;
            return Ok::<_, IpamError>(result_for(&[IpNet::from(ip.addr())]));
        }
        let assigned = match allocator.served(&auto).await? {
            Some(served) => served,
            None => allocator.auto_assign_from(&auto, ahead).await?,
        };
        let ips: Vec<IpNet> = assigned.v4.into_iter().chain(assigned.v6).collect();
        Ok(result_for(&ips))
    };
    let result = tokio::time::timeout_at(call.deadline, work).await;
    allocator.delete_unused_handle().await;
    let result = result.map_err(|_| timed_out("the address assignment"))??;
    tracing::info!(%handle, ips = ?result.ips, "calico-ipam assigned");
    Ok(result)
}

/// Calico's IPAM result: the addresses with their block prefix (an
/// explicit address as /32 or /128), and one route per address whose
/// destination is that same prefixed address, as Calico's calico-ipam
/// prints it (`{"dst": "10.0.0.5/26"}`, the host bits kept).
fn result_for(ips: &[IpNet]) -> CniResult {
    CniResult {
        ips: ips
            .iter()
            .map(|ip| IpConfig {
                address: *ip,
                gateway: None,
                interface: None,
            })
            .collect(),
        routes: ips.iter().map(|ip| Route::to(*ip)).collect(),
        ..CniResult::default()
    }
}

/// DEL: releases `<name>.<container ID>` and the pre-v3 handle; handles
/// that do not exist are fine. A KubeVirt VM's pod gives up its owner slot
/// of the VM's addresses (only while the slot still names it); they are
/// released only when no pod owns them any more and the VM (or a VMI
/// without one) is being deleted.
pub async fn del(call: &Call, req: &Request) -> Result<()> {
    del_from(call, req, None).await
}

/// [`del`] from what [`read_release`] read ahead (`None`: read now).
pub async fn del_from(call: &Call, req: &Request, ahead: Option<ReleaseInputs>) -> Result<()> {
    check_identifiers(req, &call.host)?;
    let mut allocator = Allocator::new(call.store.as_ref(), &call.host);
    let handles = release_handles(&req.conf.name, &req.env);
    let mut ahead = ahead.filter(|a| a.names == handles);
    let opened = ahead.as_mut().and_then(|a| a.lock.take());
    if let Some(a) = &ahead {
        allocator = allocator.with_config(a.config.clone());
    }
    let mut vm = vm_of(call, req, true).await?;
    if vm.is_some() && !allocator.config().await?.kubevirt_persistence() {
        vm = None;
    }
    let lock_file = lock::lock_path(&req.conf.ipam_lock_file);
    let work = async {
        // The handles (and IPAMConfig, for a cooldown) read before the host
        // lock (read ahead by the caller, or now): it covers the blocks'
        // reads and the writes alone.
        let ahead = match (&vm, ahead) {
            (Some(_), _) => [None, None],
            (None, Some(a)) => a.handles.map(Some),
            (None, None) => ReleaseInputs::read(&allocator, &handles)
                .await?
                .handles
                .map(Some),
        };
        let lock = lock::acquire(&lock_file, call.deadline, opened).await;
        allocator.use_block_cache(lock.block_cache(call.store.identity()));
        // An intent its ADD left (it gave up waiting) is served no more.
        allocator.use_intents(lock.intents(call.store.identity()), false);
        allocator.drop_intents(&handles[..1]).await;
        if let (Some(vm), Some((namespace, pod))) = (&vm, req.env.args.k8s_pod()) {
            let handle = kubevirt::handle_id(&req.conf.name, &vm.namespace, &vm.name);
            let held = allocator.addresses_of(&handle).await?;
            let mut owned = false;
            for &ip in &held {
                let Some(attr) = allocator.attributes_of(ip).await? else {
                    continue;
                };
                let names = |m: &BTreeMap<String, String>| {
                    m.get(ATTR_POD).map(String::as_str) == Some(pod)
                        && m.get(ATTR_NAMESPACE).map(String::as_str) == Some(namespace)
                };
                let slot = if names(&attr.secondary) {
                    Some(OwnerSlot::Active)
                } else if names(&attr.alternate) {
                    Some(OwnerSlot::Alternate)
                } else {
                    None
                };
                let attr = match slot {
                    Some(slot) => {
                        let written = allocator
                            .set_owner(ip, &handle, slot, &BTreeMap::new(), Some((namespace, pod)))
                            .await?;
                        tracing::info!(%ip, ?slot, "the pod no longer owns its VM's address");
                        written
                    }
                    None => attr,
                };
                owned |= !attr.secondary.is_empty() || !attr.alternate.is_empty();
            }
            if vm.is_going_away() && !owned {
                if let Some(n) = allocator.release_by_handle(&handle).await? {
                    tracing::info!(%handle, released = n, "the VM is going: its addresses released");
                }
            } else {
                tracing::info!(%handle, owned, going = vm.is_going_away(), "the VM keeps its addresses");
            }
            return Ok(());
        }
        for (handle, read) in handles.iter().zip(ahead) {
            if let Some(n) = allocator.release_handle_from(handle, read).await? {
                tracing::info!(%handle, released = n, "calico-ipam released");
            }
        }
        Ok::<_, IpamError>(())
    };
    tokio::time::timeout_at(call.deadline, work)
        .await
        .map_err(|_| timed_out("the address release"))??;
    Ok(())
}

/// CHECK: the handle exists and holds the addresses of prevResult.
pub async fn check(call: &Call, req: &Request) -> Result<()> {
    let handle = handle_id(req);
    let held = tokio::time::timeout_at(
        call.deadline,
        Allocator::new(call.store.as_ref(), &call.host).addresses_of(&handle),
    )
    .await
    .map_err(|_| timed_out("the check"))??;
    let Some(prev) = req.raw.get("prevResult") else {
        return Ok(());
    };
    let wanted: Vec<String> = prev
        .get("ips")
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
        .filter_map(|ip| ip.get("address").and_then(|a| a.as_str()))
        .filter_map(|a| a.parse::<IpNet>().ok())
        .map(|n| n.addr().to_string())
        .collect();
    for ip in wanted {
        if !held.iter().any(|h| h.to_string() == ip) {
            return Err(Error::ipam(format!(
                "calico-ipam: {ip} of prevResult is not allocated to handle {handle}"
            )));
        }
    }
    Ok(())
}

/// GC (spec 1.1.0): releases the handles of this network on this node
/// (`<network>.<container ID>`, with an address attributed to this node)
/// whose container is not among `cni.dev/valid-attachments`; without the
/// list, nothing. Every stale handle is tried; the errors are reported
/// together.
pub async fn gc(call: &Call, req: &Request) -> Result<()> {
    let Some(valid) = req.valid_attachments()? else {
        tracing::info!("GC without cni.dev/valid-attachments: nothing is collected");
        return Ok(());
    };
    let keep: std::collections::HashSet<&str> =
        valid.iter().map(|a| a.container_id.as_str()).collect();
    let prefix = format!("{}.", req.conf.name);
    let allocator = Allocator::new(call.store.as_ref(), &call.host);
    let lock_file = lock::lock_path(&req.conf.ipam_lock_file);
    let work = async {
        let lock = lock::acquire(&lock_file, call.deadline, None).await;
        let mut handles = allocator.host_handles(&prefix).await?;
        // With the lock held no call of this host is between its handle
        // and its block write, but for one that wrote its handle ahead of
        // the lock within a call's deadline: an older handle holding
        // nothing was left by a killed ADD. (Without the lock, one may be
        // in flight.)
        if lock.is_held() {
            let in_flight = req.conf.deadline();
            handles.extend(allocator.orphan_host_handles(&prefix, in_flight).await?);
        }
        let mut errors = Vec::new();
        for handle in handles {
            let cid = &handle[prefix.len()..];
            // A VM's handle is no container's: its pods' DELs decide.
            if keep.contains(cid) || cid.starts_with(kubevirt::HANDLE_INFIX) {
                continue;
            }
            match allocator.release_by_handle(&handle).await {
                Ok(n) => tracing::info!(%handle, released = ?n, "GC released a stale allocation"),
                Err(e) => errors.push(format!("{handle}: {e}")),
            }
        }
        Ok::<_, IpamError>(errors)
    };
    let errors = tokio::time::timeout_at(call.deadline, work)
        .await
        .map_err(|_| timed_out("garbage collection"))??;
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::ipam(format!(
            "calico-ipam GC could not release: {}",
            errors.join("; ")
        )))
    }
}

/// The owners of network `network`'s allocations on this node: the
/// containers of its handles (`<network>.<container ID>`), with the pods
/// their allocations' attributes name.
pub async fn owners(call: &Call, network: &str) -> Result<Vec<Owner>> {
    let prefix = format!("{network}.");
    let handles = tokio::time::timeout_at(
        call.deadline,
        Allocator::new(call.store.as_ref(), &call.host).host_handle_pods(&prefix),
    )
    .await
    .map_err(|_| timed_out("reading this node's allocations"))??;
    Ok(handles
        .into_iter()
        .filter(|(handle, _)| !handle[prefix.len()..].starts_with(kubevirt::HANDLE_INFIX))
        .map(|(handle, pod)| Owner {
            container_id: handle[prefix.len()..].to_string(),
            pod,
        })
        .collect())
}

/// Releases `ips` whoever holds them (`ipAddrs` of a re-created pod).
pub async fn release_ips(call: &Call, ips: &[IpAddr]) -> Result<()> {
    tokio::time::timeout_at(
        call.deadline,
        Allocator::new(call.store.as_ref(), &call.host).release_ips(ips),
    )
    .await
    .map_err(|_| timed_out("the address release"))?
    .map_err(|e| Error::from(e).context("failed to release ipAddrs"))?;
    Ok(())
}

/// STATUS: the datastore answers, an enabled pool exists, and this node
/// can be given an address of every family the network assigns, from the
/// pools an ADD would use: a free address in one of its blocks (or, without
/// strict affinity, in any block of those pools), or room for a new block.
/// Namespace selectors are not judged (STATUS has no pod): a pool any
/// namespace could use counts.
pub async fn status(call: &Call, req: &Request) -> Result<()> {
    let allocator = Allocator::new(call.store.as_ref(), &call.host);
    let work = async {
        let all = allocator.pools().await?;
        if !all.iter().any(|p| !p.spec.disabled) {
            return Ok(Err(Error::not_available(
                "calico-ipam cannot allocate: no enabled IP pool is configured",
            )));
        }
        let config = allocator.config().await?;
        let mut any_namespace = all.clone();
        for p in &mut any_namespace {
            p.spec.namespace_selector = "all()".into();
        }
        let labels = Labels::new(call, req);
        let ipam = &req.conf.ipam;
        for (v6, wanted, requested) in [
            (
                false,
                ipam.assign_ipv4.as_deref() != Some("false"),
                &ipam.ipv4_pools,
            ),
            (
                true,
                ipam.assign_ipv6.as_deref() == Some("true"),
                &ipam.ipv6_pools,
            ),
        ] {
            if !wanted {
                continue;
            }
            let pools = if requested.is_empty() {
                automatic_pools(&any_namespace, v6, &call.host, &labels).await?
            } else {
                requested_pools(&all, requested, v6)?
            };
            if !allocator
                .has_room(&pools, config.strict_affinity, config.auto_allocate_blocks)
                .await?
            {
                let names: Vec<&str> = pools.iter().map(|p| p.spec.cidr.as_str()).collect();
                return Ok(Err(Error::not_available(format!(
                    "calico-ipam cannot allocate an IPv{} address on node {}: the pools it may use ({}) have no free address and no room for a new block",
                    if v6 { 6 } else { 4 },
                    call.host,
                    names.join(", ")
                ))));
            }
        }
        Ok::<_, IpamError>(Ok(()))
    };
    tokio::time::timeout_at(call.deadline, work)
        .await
        .map_err(|_| timed_out("judging the IPAM's capacity"))??
}
