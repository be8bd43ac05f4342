//! The invocation context: everything one call derives from its request,
//! built once — the workload's identifiers, the node name, the deadline and
//! the cleanup budget, the one Kubernetes API client, the datastore (its
//! resource API and its endpoint records), the IPAM and the dataplane. The
//! client, the datastore and the IPAM are opened on first use (a DEL must
//! get its local teardown done even when the datastore cannot be opened)
//! and then shared by every step; the dataplane's host socket likewise.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::cni::{Error, Request, Result};
use crate::dataplane::Dataplane;
use crate::datastore::endpoints::{Endpoints, NamespaceLabels};
use crate::datastore::names::{WepIdentifiers, veth_name_for_container, veth_name_for_workload};
use crate::datastore::{DatastoreError, Store};
use crate::ipam::Ipam;
use crate::k8s::K8sClient;

/// How long cleanup may take after the deadline it follows: the rollback
/// of a failed ADD, and DEL's local teardown (the interface and the IPAM
/// release), are never starved by a deadline already spent.
pub const CLEANUP_GRACE: Duration = Duration::from_secs(5);

pub use crate::datastore::Backend;
pub use crate::datastore::open::datastore_kind;

/// The datastore of a call, once opened.
struct Datastore {
    endpoints: Arc<dyn Endpoints>,
    namespaces: Option<Arc<dyn NamespaceLabels>>,
}

/// One invocation.
pub struct Context {
    pub req: Request,
    /// The node this plugin runs on.
    pub node: String,
    /// The workload's identifiers (calico-behaviour.md §5.1), endpoint = CNI_IFNAME.
    pub ids: WepIdentifiers,
    /// The namespace its WorkloadEndpoint lives in.
    pub namespace: String,
    /// The host side of its veth pair.
    pub host_veth: String,
    /// FELIX_INTERFACEPREFIX.
    pub interface_prefix: Option<String>,
    dataplane: Arc<dyn Dataplane>,
    client: OnceCell<K8sClient>,
    /// Shared with the IPAM, which may need the store once it is open.
    store: Arc<OnceCell<Arc<dyn Store>>>,
    datastore: OnceCell<Datastore>,
    ipam: OnceCell<Arc<dyn Ipam>>,
    namespace_labels: Arc<OnceLock<BTreeMap<String, String>>>,
    /// The datastore's readiness, once read (shared with the IPAM).
    ready: Arc<tokio::sync::watch::Sender<Option<bool>>>,
    /// Whether the network's profile exists, once read.
    profile: OnceCell<bool>,
}

impl Context {
    /// The context of `req` on this kernel's dataplane.
    pub fn new(req: Request) -> Context {
        let dataplane = crate::dataplane::open(&req.conf.dataplane_options);
        Context::with_dataplane(req, dataplane)
    }

    /// The context of `req` on `dataplane` (tests: a recording fake).
    pub fn with_dataplane(req: Request, dataplane: Arc<dyn Dataplane>) -> Context {
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
        Context {
            req,
            node,
            ids,
            namespace,
            host_veth,
            interface_prefix,
            dataplane,
            client: OnceCell::new(),
            store: Arc::new(OnceCell::new()),
            datastore: OnceCell::new(),
            ipam: OnceCell::new(),
            namespace_labels: Arc::new(OnceLock::new()),
            ready: Arc::new(tokio::sync::watch::Sender::new(None)),
            profile: OnceCell::new(),
        }
    }

    /// This call's IPAM is `ipam` (tests: a recording fake).
    pub fn with_ipam(self, ipam: Arc<dyn Ipam>) -> Context {
        let _ = self.ipam.set(ipam);
        self
    }

    /// This call's datastore is `store`, its endpoint records `endpoints`
    /// (tests: a recording wrapper).
    pub fn with_datastore(self, store: Arc<dyn Store>, endpoints: Arc<dyn Endpoints>) -> Context {
        let _ = self.store.set(store);
        let _ = self.datastore.set(Datastore {
            endpoints,
            namespaces: None,
        });
        self
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
            Error::invalid_config_caused("error constructing WorkloadEndpoint name", e)
        })
    }

    /// The pod's network.
    pub fn dataplane(&self) -> &dyn Dataplane {
        self.dataplane.as_ref()
    }

    /// The one Kubernetes API client of this call.
    pub async fn k8s(&self) -> Result<&K8sClient> {
        self.client
            .get_or_try_init(|| async {
                Ok::<_, Error>(K8sClient::new(&self.req.conf.k8s_config(), self.deadline()).await?)
            })
            .await
    }

    async fn datastore(&self) -> Result<&Datastore> {
        self.datastore
            .get_or_try_init(|| async {
                let opened = crate::datastore::open::open(
                    &self.req.conf,
                    &self.req.env.vars,
                    self.deadline(),
                    self.interface_prefix.clone(),
                    || async { Ok(self.k8s().await?.clone()) },
                )
                .await?;
                let _ = self.store.set(opened.store);
                Ok::<_, Error>(Datastore {
                    endpoints: opened.endpoints,
                    namespaces: opened.namespaces,
                })
            })
            .await
    }

    /// The datastore the config names, opened once.
    pub async fn store(&self) -> Result<&Arc<dyn Store>> {
        self.datastore().await?;
        Ok(self.store.get().expect("set when the datastore opened"))
    }

    /// Where the datastore keeps the endpoint records.
    pub async fn endpoints(&self) -> Result<&dyn Endpoints> {
        Ok(self.datastore().await?.endpoints.as_ref())
    }

    /// The ClusterInformation readiness gate.
    /// Whether the network's profile (named after it) exists, read once
    /// per call as the datastore's cache holds it (a profile is made once
    /// and never changed); a failed read is not remembered.
    pub async fn network_profile_exists(&self) -> Result<bool> {
        let name = &self.req.conf.name;
        self.profile
            .get_or_try_init(|| async {
                self.store()
                    .await?
                    .get_cached::<crate::datastore::model::Profile>("", name)
                    .await
                    .map(|p| p.is_some())
                    .map_err(|e| e.context(&format!("error getting profile {name}")))
            })
            .await
            .copied()
    }

    pub async fn ensure_ready(&self) -> Result<()> {
        match self.store().await?.cluster_ready().await {
            Ok(true) => {
                self.ready.send_replace(Some(true));
                Ok(())
            }
            Ok(false) => Err(Error::datastore(
                "Calico is currently not ready to process requests",
            )),
            Err(e) => Err(e.context("error getting ClusterInformation")),
        }
    }

    /// The IPAM of this call, bounded by its deadline: calico-ipam in
    /// process (on this call's datastore) when it is this executable, else
    /// the plugin exec'd (which needs no datastore).
    pub async fn ipam(&self) -> Result<&Arc<dyn Ipam>> {
        self.ipam
            .get_or_try_init(|| async {
                let in_process = crate::ipam::runs_in_process(&self.req.conf, &self.req.env.path);
                let namespaces = if in_process {
                    self.datastore().await?.namespaces.clone()
                } else {
                    self.datastore.get().and_then(|d| d.namespaces.clone())
                };
                let kube = self.req.env.args.k8s_pod().map(|_| {
                    crate::ipam::calico::verbs::KubeAccess::new(
                        self.req.conf.k8s_config(),
                        self.client.get().cloned(),
                    )
                });
                let setup = crate::ipam::Setup {
                    host: self.node.clone(),
                    store: Arc::clone(&self.store),
                    namespaces,
                    namespace_labels: Arc::clone(&self.namespace_labels),
                    kube,
                    ready: Arc::clone(&self.ready),
                };
                crate::ipam::open(&self.req, setup, in_process, self.deadline())
            })
            .await
    }

    /// The IPAM for cleanup that starts now (its own grace budget).
    pub async fn ipam_for_cleanup(&self) -> Result<Arc<dyn Ipam>> {
        Ok(self.ipam().await?.until(self.cleanup_deadline()))
    }

    /// A test-only fault: fails the ADD right after `step` (or panics at
    /// `start` for `panic`) when the call's variables ask for it
    /// (`CALICO_CNI_FAIL_AFTER`; built only with the `fault-injection`
    /// feature).
    #[cfg(feature = "fault-injection")]
    pub fn inject_fault(&self, step: &str) -> Result<()> {
        match self
            .req
            .env
            .vars
            .get("CALICO_CNI_FAIL_AFTER")
            .map(String::as_str)
        {
            Some("panic") if step == "start" => panic!("injected panic"),
            Some(s) if s == step => Err(Error::internal(format!("injected failure after {step}"))),
            _ => Ok(()),
        }
    }

    #[cfg(not(feature = "fault-injection"))]
    #[inline(always)]
    pub fn inject_fault(&self, _step: &str) -> Result<()> {
        Ok(())
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
