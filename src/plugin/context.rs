//! The invocation context: everything one call derives from its request,
//! built once — the workload's identifiers, the node name, the deadline and
//! the cleanup budget, the one Kubernetes API client, the datastore and the
//! IPAM driver. The client and the datastore are opened on first use (a DEL
//! must get its local teardown done even when they cannot be opened) and
//! then shared by every step.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::cni::delegate::Delegate;
use crate::cni::{Error, Request, Result};
use crate::datastore::kubernetes::KubernetesStore;
use crate::datastore::names::{WepIdentifiers, veth_name_for_container, veth_name_for_workload};
use crate::datastore::{DatastoreError, Store};
use crate::ipam::{Driver, InProcess};
use crate::k8s::K8sClient;

/// How long cleanup may take after the deadline it follows: the rollback
/// of a failed ADD, and DEL's local teardown (the interface and the IPAM
/// release), are never starved by a deadline already spent.
pub const CLEANUP_GRACE: Duration = Duration::from_secs(5);

pub use crate::datastore::open::{DatastoreKind, datastore_kind};

/// One invocation.
pub struct Context {
    pub req: Request,
    /// The node this plugin runs on.
    pub node: String,
    /// The workload's identifiers (§5.1), endpoint = CNI_IFNAME.
    pub ids: WepIdentifiers,
    /// The namespace its WorkloadEndpoint lives in.
    pub namespace: String,
    /// The host side of its veth pair.
    pub host_veth: String,
    /// FELIX_INTERFACEPREFIX.
    pub interface_prefix: Option<String>,
    client: OnceCell<K8sClient>,
    store: OnceCell<Arc<dyn Store>>,
    kdd: OnceCell<Arc<KubernetesStore>>,
    /// calico-ipam is this executable: it runs in process.
    ipam_in_process: bool,
    namespace_labels: OnceLock<BTreeMap<String, String>>,
}

impl Context {
    pub fn new(req: Request) -> Context {
        let node = req.conf.determine_nodename(|| {
            nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_default()
        });
        let interface_prefix = req
            .env
            .vars
            .get("FELIX_INTERFACEPREFIX")
            .filter(|p| !p.is_empty())
            .cloned();
        let (orchestrator, pod, namespace, host_veth) = match req.env.args.k8s_pod() {
            Some((ns, pod)) => (
                "k8s",
                pod.to_string(),
                ns.to_string(),
                veth_name_for_workload(ns, pod, interface_prefix.as_deref()),
            ),
            None => (
                "cni",
                String::new(),
                match &req.env.args.test_namespace {
                    Some(ns) if !ns.is_empty() => ns.clone(),
                    _ => "default".into(),
                },
                veth_name_for_container(&req.env.container_id),
            ),
        };
        let ids = WepIdentifiers {
            node: node.clone(),
            orchestrator: orchestrator.into(),
            endpoint: req.env.ifname.clone(),
            workload: String::new(),
            pod,
            container_id: req.env.container_id.clone(),
        };
        let ipam_in_process = crate::ipam::runs_in_process(&req.conf, &req.env.path);
        Context {
            ipam_in_process,
            namespace_labels: OnceLock::new(),
            req,
            node,
            ids,
            namespace,
            host_veth,
            interface_prefix,
            client: OnceCell::new(),
            store: OnceCell::new(),
            kdd: OnceCell::new(),
        }
    }

    pub fn deadline(&self) -> Instant {
        self.req.deadline
    }

    /// Time left before the deadline.
    pub fn remaining(&self) -> Duration {
        self.req.remaining()
    }

    /// When cleanup that starts now must be done: the grace budget from now,
    /// or the deadline if that is later.
    pub fn cleanup_deadline(&self) -> Instant {
        self.deadline().max(Instant::now() + CLEANUP_GRACE)
    }

    /// The WorkloadEndpoint's name.
    pub fn endpoint_name(&self) -> Result<String> {
        self.ids.name().map_err(|e| {
            Error::InvalidConfig(format!("error constructing WorkloadEndpoint name: {e}"))
        })
    }

    /// The one Kubernetes API client of this call.
    pub async fn k8s(&self) -> Result<&K8sClient> {
        self.client
            .get_or_try_init(|| async {
                Ok::<_, Error>(K8sClient::new(&self.req.conf.k8s_config(), self.deadline()).await?)
            })
            .await
    }

    /// The datastore the config names, opened once.
    pub async fn store(&self) -> Result<&Arc<dyn Store>> {
        self.store
            .get_or_try_init(|| async {
                let opened = crate::datastore::open::open(
                    &self.req.conf,
                    self.deadline(),
                    self.interface_prefix.clone(),
                    || async { Ok(self.k8s().await?.clone()) },
                )
                .await?;
                if let Some(kdd) = opened.kdd {
                    let _ = self.kdd.set(kdd);
                }
                Ok(opened.store)
            })
            .await
    }

    /// The Kubernetes datastore, when it is the one opened.
    pub fn kdd(&self) -> Option<&KubernetesStore> {
        self.kdd.get().map(Arc::as_ref)
    }

    /// The ClusterInformation readiness gate.
    pub async fn ensure_ready(&self) -> Result<()> {
        match self.store().await?.cluster_ready().await {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::Datastore(
                "Calico is currently not ready to process requests".into(),
            )),
            Err(e) => Err(e.context("error getting ClusterInformation")),
        }
    }

    /// The IPAM of this call, bounded by its deadline.
    pub async fn ipam(&self) -> Result<Driver<'_>> {
        self.ipam_until(self.deadline()).await
    }

    /// The IPAM for cleanup that starts now (its own grace budget).
    pub async fn ipam_for_cleanup(&self) -> Result<Driver<'_>> {
        self.ipam_until(self.cleanup_deadline()).await
    }

    /// The IPAM plugin to exec, bounded by `deadline`; `None` when
    /// calico-ipam runs in process. Needs no datastore.
    pub fn ipam_exec_until(&self, deadline: Instant) -> Option<Delegate<'_>> {
        (!self.ipam_in_process).then(|| crate::ipam::delegate(&self.req, deadline))
    }

    /// The IPAM bounded by `deadline`: calico-ipam in process (on this
    /// call's datastore) when it is this executable, else the plugin exec'd.
    pub async fn ipam_until(&self, deadline: Instant) -> Result<Driver<'_>> {
        let exec = crate::ipam::delegate(&self.req, deadline);
        let in_process = if self.ipam_in_process {
            let store = self.store().await?;
            // A later deadline (cleanup) needs the store's requests bound
            // to it: the call's own may be what has just passed.
            let store = match deadline > self.deadline() {
                true => store.until(deadline).unwrap_or_else(|| store.clone()),
                false => store.clone(),
            };
            Some(InProcess {
                req: &self.req,
                store,
                kdd: self.kdd(),
                host: self.node.clone(),
                namespace_labels: &self.namespace_labels,
            })
        } else {
            None
        };
        Ok(Driver { exec, in_process })
    }

    /// Records the workload namespace's labels (read by the Kubernetes
    /// ADD) for pool namespaceSelectors.
    pub fn set_namespace_labels(&self, labels: BTreeMap<String, String>) {
        let _ = self.namespace_labels.set(labels);
    }
}

/// A datastore error of `what`, keeping its kind.
pub fn datastore_err(what: &str) -> impl Fn(DatastoreError) -> Error + '_ {
    move |e| e.context(what)
}
