//! Address management behind one seam, [`Ipam`]: the IPAM plugin a
//! network config names, exec'd ([`exec`]: any CNI IPAM plugin, with
//! host-local's special cases, [`host_local`], and the GC host-local lacks,
//! [`host_local_gc`]), or Calico's IPAM in this process ([`in_process`]:
//! when the configured IPAM is calico-ipam and the `calico-ipam` found in
//! `CNI_PATH` is this very executable). Calico's IPAM itself is
//! [`calico`]; the `calico-ipam` personality of this executable is
//! [`personality`]. Nothing outside this module builds an allocator.

pub mod calico;
mod exec;
#[cfg(any(test, feature = "test-fakes"))]
pub mod fake;
pub mod host_local;
pub mod host_local_gc;
mod in_process;
mod personality;
mod same_executable;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use serde_json::Value;
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::cni::delegate::{Delegate, Running, find_in_path};
use crate::cni::env::Command;
use crate::cni::request::Attachment;
use crate::cni::{CniResult, NetConf, Request, Result};
use crate::datastore::Store;
use crate::datastore::endpoints::NamespaceLabels;

pub use exec::ExecIpam;
pub use in_process::InProcessIpam;
pub use personality::handle;

/// The IPAM plugin's type that this executable implements.
pub const CALICO_IPAM: &str = "calico-ipam";

/// An IPAM call started early, so that its start overlaps other work (the
/// reads of the workload, for an ADD; the kernel's deletion of the
/// interface, for a DEL): an exec'd plugin's start-up (it acts on nothing
/// until it is given its config), or, in process, an assignment's or a
/// release's reads (it writes nothing until it is called).
pub struct Pending(Option<Running>, Option<Ahead>);

/// Reads made ahead in a task of their own (`None`: they failed, and the
/// call reads again); the task is stopped if the call is not made.
enum Ahead {
    Release(tokio::task::JoinHandle<Option<calico::verbs::ReleaseInputs>>),
    Assignment(tokio::task::JoinHandle<Option<calico::verbs::AddInputs>>),
}

impl Drop for Ahead {
    fn drop(&mut self) {
        match self {
            Ahead::Release(task) => task.abort(),
            Ahead::Assignment(task) => task.abort(),
        }
    }
}

impl Pending {
    /// Nothing started: the call starts when it is made.
    pub fn none() -> Pending {
        Pending(None, None)
    }
}

/// Whose an allocation is: a container, and its pod when the allocation
/// records one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub container_id: String,
    pub pod: Option<(String, String)>,
}

/// The addresses of one network, for one call.
#[async_trait::async_trait]
pub trait Ipam: Send + Sync {
    /// The configured IPAM type (`host-local`, `calico-ipam`, ...).
    fn kind(&self) -> &str;

    /// Starts `command` now; [`Ipam::add`] and [`Ipam::del`] finish it.
    async fn start(&self, command: Command) -> Result<Pending>;

    /// ADD with `config`, on what `pending` started.
    async fn add(&self, config: &Value, pending: Pending) -> Result<CniResult>;

    /// ADD of exactly `ip` (`IP=<ip>` in CNI_ARGS).
    async fn add_ip(&self, config: &Value, ip: IpAddr) -> Result<CniResult>;

    /// An ADD's `pending` not used for an allocation (the addresses came
    /// from elsewhere, or the ADD ended before it): whatever it wrote ahead
    /// is taken back.
    async fn discard(&self, pending: Pending) {
        drop(pending);
    }

    /// DEL with `config`, on what `pending` started: releases what this
    /// container holds.
    async fn del(&self, config: &Value, pending: Pending) -> Result<()>;

    async fn check(&self, config: &Value) -> Result<()>;

    /// STATUS (spec 1.1.0): can the IPAM serve an ADD?
    async fn status(&self, config: &Value) -> Result<()>;

    /// GC (spec 1.1.0) with the valid attachments (`None`: no list given,
    /// nothing is collected).
    async fn gc(&self, config: &Value, valid: Option<&[Attachment]>) -> Result<()>;

    /// Releases `ips` whoever holds them (a re-created pod's `ipAddrs`).
    async fn release_ips(&self, ips: &[IpAddr]) -> Result<()>;

    /// The owners of this network's allocations on this node, or `None`
    /// when this IPAM keeps no record they can be read from.
    async fn owners(&self) -> Result<Option<Vec<Owner>>>;

    /// The same IPAM with its work bound to `deadline` (a cleanup budget).
    fn until(&self, deadline: Instant) -> Arc<dyn Ipam>;
}

/// What the IPAM of one call is opened with besides the request.
#[derive(Clone)]
pub struct Setup {
    /// The node this plugin runs on.
    pub host: String,
    /// The call's datastore once it is opened (an exec'd calico-ipam
    /// releases addresses directly on it).
    pub store: Arc<OnceCell<Arc<dyn Store>>>,
    /// Where namespace labels are read, when the datastore can.
    pub namespaces: Option<Arc<dyn NamespaceLabels>>,
    /// The workload namespace's labels, once the caller has read them.
    pub namespace_labels: Arc<OnceLock<BTreeMap<String, String>>>,
    /// The Kubernetes API for a virt-launcher pod's VM (Kubernetes pods).
    pub kube: Option<calico::verbs::KubeAccess>,
    /// The datastore's readiness as the caller read it: `Some(true)` once
    /// it said ready (an ADD's handle may then be written ahead),
    /// `Some(false)` once the call will not allocate.
    pub ready: Arc<tokio::sync::watch::Sender<Option<bool>>>,
}

/// The IPAM of `req` bounded by `deadline`: calico-ipam in this process
/// when `in_process` (what [`runs_in_process`] said; `store` must be open),
/// else the plugin exec'd.
pub fn open(
    req: &Request,
    setup: Setup,
    in_process: bool,
    deadline: Instant,
) -> Result<Arc<dyn Ipam>> {
    if in_process {
        let store = setup.store.get().cloned().ok_or_else(|| {
            crate::cni::Error::internal("calico-ipam in process needs the datastore")
        })?;
        return Ok(Arc::new(InProcessIpam::new(req, store, setup, deadline)));
    }
    Ok(Arc::new(ExecIpam::new(
        delegate(req, deadline),
        req.conf.name.clone(),
        setup,
    )))
}

/// The IPAM plugin of this request, bounded by `deadline`.
pub fn delegate(req: &Request, deadline: Instant) -> Delegate {
    Delegate {
        plugin: req.conf.ipam.kind.clone(),
        path: req.env.path.clone().into(),
        env: Arc::new(req.env.vars.clone()),
        extra_args: None,
        deadline,
    }
}

/// The config the IPAM plugin gets to release an allocation (DEL, and the
/// rollback of a failed ADD) or to check it (CHECK): the request's own,
/// with host-local's `usePodCidr` placeholders made valid without the
/// Node's pod CIDRs (see [`host_local::release_pod_cidrs`]).
pub fn release_config(req: &Request) -> Value {
    let mut config = req.raw.clone();
    if req.conf.ipam.kind == "host-local" {
        host_local::release_pod_cidrs(&mut config);
    }
    config
}

/// Whether calico-ipam runs in this process: it is the configured IPAM and
/// the `calico-ipam` that `CNI_PATH` finds is this executable.
pub fn runs_in_process(conf: &NetConf, path: &[PathBuf]) -> bool {
    if conf.ipam.kind != CALICO_IPAM {
        return false;
    }
    let (Ok(found), Ok(me)) = (find_in_path(CALICO_IPAM, path), std::env::current_exe()) else {
        return false;
    };
    same_executable::same_executable(&found, &me)
}
