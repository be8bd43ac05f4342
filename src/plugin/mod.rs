//! The `calico` plugin's verbs: cmdAdd (`add`), cmdDel (`del`), CHECK,
//! STATUS and GC, orchestrating IPAM, the dataplane and the datastore.

pub mod add;
mod check;
mod del;
pub mod readiness;
mod status;

use std::sync::Arc;

use ipnet::IpNet;

use crate::cni::delegate::Delegate;
use crate::cni::{CniResult, Command, Error, Request, Result};
use crate::datastore::kubernetes::KubernetesStore;
use crate::datastore::local::LocalStore;
use crate::datastore::names::{WepIdentifiers, veth_name_for_container, veth_name_for_workload};
use crate::datastore::{Datastore, DatastoreError};
use crate::k8s::K8sClient;

pub use add::cmd_add;
pub use check::cmd_check;
pub use del::cmd_del;
pub use status::{cmd_gc, cmd_status};

/// Answers one calico verb.
pub async fn handle(req: Request) -> Result<Option<CniResult>> {
    match req.env.command {
        Command::Add => cmd_add(&req).await.map(Some),
        Command::Del => cmd_del(&req).await.map(|()| None),
        Command::Check => cmd_check(&req).await.map(|()| None),
        Command::Status => cmd_status(&req).await.map(|()| None),
        Command::Gc => cmd_gc(&req).await.map(|()| None),
        Command::Version => unreachable!("VERSION is answered at the edge"),
    }
}

/// Which datastore the config selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatastoreKind {
    Local,
    Kubernetes,
    Etcd,
}

/// `datastore_type`, else etcd when endpoints are configured, else
/// Kubernetes when a kubeconfig is, else the embedded local store.
pub fn datastore_kind(req: &Request) -> Result<DatastoreKind> {
    let c = &req.conf;
    match c.datastore_type.as_str() {
        "local" => Ok(DatastoreKind::Local),
        "kubernetes" => Ok(DatastoreKind::Kubernetes),
        "etcdv3" => Ok(DatastoreKind::Etcd),
        "" if !c.etcd_endpoints.is_empty() || !c.etcd_discovery_srv.is_empty() => {
            Ok(DatastoreKind::Etcd)
        }
        "" if !c.kubernetes.kubeconfig.is_empty() => Ok(DatastoreKind::Kubernetes),
        "" => Ok(DatastoreKind::Local),
        other => Err(Error::InvalidConfig(format!(
            "unknown datastore_type {other:?} (supported: local, kubernetes, etcdv3)"
        ))),
    }
}

/// Opens the configured datastore.
pub async fn open_datastore(req: &Request) -> Result<Arc<dyn Datastore>> {
    match datastore_kind(req)? {
        DatastoreKind::Local => {
            let store = LocalStore::open(&req.conf.local_datastore_path(), req.remaining())
                .map_err(|e| Error::Datastore(format!("error creating calico client: {e}")))?;
            Ok(Arc::new(store))
        }
        DatastoreKind::Kubernetes => {
            let client = K8sClient::from_conf(&req.conf, req.deadline).await?;
            Ok(Arc::new(KubernetesStore::new(client, interface_prefix(req))))
        }
        DatastoreKind::Etcd => Err(Error::UnsupportedField(
            "datastore_type \"etcdv3\" is not supported by this build yet; use \"local\" or \"kubernetes\"".into(),
        )),
    }
}

/// FELIX_INTERFACEPREFIX, as the plugin's environment gives it.
pub fn interface_prefix(req: &Request) -> Option<String> {
    req.env
        .vars
        .get("FELIX_INTERFACEPREFIX")
        .filter(|p| !p.is_empty())
        .cloned()
}

/// The ClusterInformation readiness gate.
pub async fn ensure_ready(store: &dyn Datastore) -> Result<()> {
    match store.cluster_ready().await {
        Ok(true) => Ok(()),
        Ok(false) => Err(Error::Datastore(
            "Calico is currently not ready to process requests".into(),
        )),
        Err(e) => Err(Error::Datastore(format!(
            "error getting ClusterInformation: {e}"
        ))),
    }
}

/// The delegated IPAM plugin of this request.
pub fn ipam(req: &Request) -> Delegate<'_> {
    Delegate {
        plugin: &req.conf.ipam.kind,
        path: &req.env.path,
        env: &req.env.vars,
        extra_args: None,
        deadline: req.deadline,
    }
}

/// The node this plugin runs on.
pub fn nodename(req: &Request) -> String {
    req.conf.determine_nodename(|| {
        nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_default()
    })
}

/// Identifiers of this workload (§5.1), with the endpoint set to CNI_IFNAME.
pub fn identifiers(req: &Request, node: &str) -> WepIdentifiers {
    let (orchestrator, pod) = match req.env.args.k8s_pod() {
        Some((_, pod)) => ("k8s", pod.to_string()),
        None => ("cni", String::new()),
    };
    WepIdentifiers {
        node: node.to_string(),
        orchestrator: orchestrator.into(),
        endpoint: req.env.ifname.clone(),
        workload: String::new(),
        pod,
        container_id: req.env.container_id.clone(),
    }
}

/// The namespace the WorkloadEndpoint lives in.
pub fn wep_namespace(req: &Request) -> String {
    match (req.env.args.k8s_pod(), &req.env.args.test_namespace) {
        (Some((ns, _)), _) => ns.to_string(),
        (None, Some(ns)) if !ns.is_empty() => ns.clone(),
        _ => "default".into(),
    }
}

/// The host-side veth name for this workload: from the pod's namespace and
/// name in Kubernetes mode, from the container ID otherwise.
pub fn host_veth_name(req: &Request) -> String {
    match req.env.args.k8s_pod() {
        Some((ns, pod)) => veth_name_for_workload(ns, pod, interface_prefix(req).as_deref()),
        None => veth_name_for_container(&req.env.container_id),
    }
}

/// An address as the pod carries it: /32 or /128.
pub fn host_prefix(ip: &IpNet) -> IpNet {
    IpNet::new(ip.addr(), ip.max_prefix_len()).expect("max prefix length is valid")
}

/// The container's routes in plain-CNI mode: a default route per family.
pub fn default_routes(ips: &[IpNet]) -> Vec<IpNet> {
    crate::k8s::rules::default_routes(
        ips.iter().any(|ip| ip.addr().is_ipv4()),
        ips.iter().any(|ip| ip.addr().is_ipv6()),
    )
}

fn datastore_err(what: &str) -> impl Fn(DatastoreError) -> Error + '_ {
    move |e| Error::Datastore(format!("{what}: {e}"))
}

/// A test-only fault: fails the ADD right after `step` (or panics at
/// `start` for `panic`) when the environment asks for it (built only with the `fault-injection` feature).
#[cfg(feature = "fault-injection")]
pub fn inject_fault(req: &Request, step: &str) -> Result<()> {
    match req
        .env
        .vars
        .get("CALICO_CNI_FAIL_AFTER")
        .map(String::as_str)
    {
        Some("panic") if step == "start" => panic!("injected panic"),
        Some(s) if s == step => Err(Error::Internal(format!("injected failure after {step}"))),
        _ => Ok(()),
    }
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn inject_fault(_req: &Request, _step: &str) -> Result<()> {
    Ok(())
}
