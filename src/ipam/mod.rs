//! Address management: the IPAM plugin the `calico` plugin delegates to
//! (with host-local's special cases, [`host_local`], and the GC host-local
//! lacks, [`host_local_gc`]), Calico's own IPAM ([`calico`]) and the
//! `calico-ipam` personality ([`personality`]). When
//! the configured IPAM is calico-ipam and the `calico-ipam` found in
//! `CNI_PATH` is this very executable, the [`Driver`] runs it in process
//! instead of exec'ing a second copy of itself.

pub mod calico;
pub mod host_local;
pub mod host_local_gc;
mod personality;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::Value;
use tokio::time::Instant;

use crate::cni::delegate::{Delegate, Running, find_in_path};
use crate::cni::env::Command;
use crate::cni::version::Version;
use crate::cni::{CniResult, NetConf, Request, Result};
use crate::datastore::Store;
use crate::datastore::kubernetes::KubernetesStore;

pub use personality::handle;

/// The IPAM plugin's type that this executable implements.
pub const CALICO_IPAM: &str = "calico-ipam";

/// The IPAM plugin of this request, bounded by `deadline`.
pub fn delegate(req: &Request, deadline: Instant) -> Delegate<'_> {
    Delegate {
        plugin: &req.conf.ipam.kind,
        path: &req.env.path,
        env: &req.env.vars,
        extra_args: None,
        deadline,
    }
}

/// The config the IPAM plugin gets to release an allocation (DEL, and the
/// rollback of a failed ADD) or to check it (CHECK): the request's own,
/// with host-local's `usePodCidr` placeholders made valid without the
/// Node's pod CIDRs (see [`host_local::release_pod_cidrs`]).
pub fn release_config(req: &Request) -> serde_json::Value {
    let mut config = req.raw.clone();
    if req.conf.ipam.kind == "host-local" {
        host_local::release_pod_cidrs(&mut config);
    }
    config
}

/// Whether `a` and `b` are the same executable: one file (a symlink or a
/// hard link to it), or copies with the same bytes.
fn same_executable(a: &Path, b: &Path) -> bool {
    let (Ok(ma), Ok(mb)) = (std::fs::metadata(a), std::fs::metadata(b)) else {
        return false;
    };
    if (ma.dev(), ma.ino()) == (mb.dev(), mb.ino()) {
        return true;
    }
    ma.len() == mb.len() && matches!((std::fs::read(a), std::fs::read(b)), (Ok(x), Ok(y)) if x == y)
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
    same_executable(&found, &me)
}

/// calico-ipam in this process: what it needs besides the request.
pub struct InProcess<'a> {
    pub req: &'a Request,
    /// The datastore, its requests bound to the driver's deadline.
    pub store: std::sync::Arc<dyn Store>,
    pub kdd: Option<&'a KubernetesStore>,
    pub host: String,
    /// The workload namespace's labels, once the caller has read them.
    pub namespace_labels: &'a OnceLock<BTreeMap<String, String>>,
}

/// The IPAM of one call: the plugin exec'd, or calico-ipam in process.
pub struct Driver<'a> {
    pub exec: Delegate<'a>,
    pub in_process: Option<InProcess<'a>>,
}

/// An IPAM ADD under way: the plugin's process, started early so that its
/// start-up overlaps other work (nothing to start in process).
pub enum Started<'a> {
    Process(Box<Running<'a>>),
    InProcess,
}

impl<'a> Driver<'a> {
    /// Starts `command` (the plugin reads its config when given it).
    pub async fn start(&self, command: Command) -> Result<Started<'_>> {
        match self.in_process {
            Some(_) => Ok(Started::InProcess),
            None => Ok(Started::Process(Box::new(self.exec.spawn(command).await?))),
        }
    }

    /// The in-process call for `command` on `config` (an explicit address
    /// as `IP=`).
    fn call_for(
        local: &InProcess<'_>,
        command: Command,
        config: &Value,
        ip: Option<IpAddr>,
        deadline: Instant,
    ) -> Result<Request> {
        let mut env = local.req.env.clone();
        env.command = command;
        if ip.is_some() {
            env.args.ip = ip;
        }
        Ok(Request {
            env,
            raw: config.clone(),
            conf: NetConf::from_value(config)?,
            version: Version::from_config(config.get("cniVersion").and_then(Value::as_str))?,
            deadline,
        })
    }

    async fn in_process_verb(
        &self,
        local: &InProcess<'_>,
        command: Command,
        config: &Value,
        ip: Option<IpAddr>,
    ) -> Result<Option<CniResult>> {
        use calico::verbs;
        let req = Self::call_for(local, command, config, ip, self.exec.deadline)?;
        tracing::debug!(verb = command.as_str(), "calico-ipam in process");
        let call = verbs::Call {
            req: &req,
            store: local.store.as_ref(),
            kdd: local.kdd,
            host: &local.host,
            namespace_labels: local.namespace_labels.get(),
            deadline: self.exec.deadline,
        };
        match command {
            Command::Add => verbs::add(&call).await.map(Some),
            Command::Del => verbs::del(&call).await.map(|()| None),
            Command::Check => verbs::check(&call).await.map(|()| None),
            Command::Status => verbs::status(&call).await.map(|()| None),
            Command::Gc => verbs::gc(&call).await.map(|()| None),
            Command::Version => Ok(None),
        }
    }

    /// ADD, on `started` if it was started early.
    pub async fn add_on(&self, config: &Value, started: Option<Started<'_>>) -> Result<CniResult> {
        match (&self.in_process, started) {
            (Some(local), _) => Ok(self
                .in_process_verb(local, Command::Add, config, None)
                .await?
                .unwrap_or_default()),
            (None, Some(Started::Process(running))) => {
                self.exec.add_on(config, Some(*running)).await
            }
            (None, _) => self.exec.add(config).await,
        }
    }

    /// ADD of exactly `ip` (`IP=<ip>` in CNI_ARGS).
    pub async fn add_ip(&self, config: &Value, ip: IpAddr) -> Result<CniResult> {
        match &self.in_process {
            Some(local) => Ok(self
                .in_process_verb(local, Command::Add, config, Some(ip))
                .await?
                .unwrap_or_default()),
            None => {
                let one = Delegate {
                    extra_args: Some(format!("IP={ip}")),
                    ..self.exec.clone()
                };
                one.add(config).await
            }
        }
    }

    /// DEL or CHECK: only success matters.
    pub async fn run(&self, command: Command, config: &Value) -> Result<()> {
        match &self.in_process {
            Some(local) => self
                .in_process_verb(local, command, config, None)
                .await
                .map(|_| ()),
            None => self.exec.run(command, config).await,
        }
    }

    /// STATUS or GC (spec 1.1.0 verbs).
    pub async fn run_v11_verb(&self, command: Command, config: &Value) -> Result<()> {
        match &self.in_process {
            Some(local) => self
                .in_process_verb(local, command, config, None)
                .await
                .map(|_| ()),
            None => self.exec.run_v11_verb(command, config).await,
        }
    }
}
