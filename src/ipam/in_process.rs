//! calico-ipam in the `calico` plugin's process (when the `calico-ipam`
//! that `CNI_PATH` finds is this executable): the personality's verbs on
//! the call's own datastore, with no second exec. Each verb answers the
//! request the exec'd plugin would have been given: the call's variables
//! with the config it is handed (and `IP=` for an explicit address).

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;
use tokio::time::Instant;

use super::calico::lock;
use super::calico::verbs::{self, Call};
use super::{Ahead, Ipam, Owner, Pending, Setup};
use crate::cni::env::{CniEnv, Command};
use crate::cni::request::Attachment;
use crate::cni::{CniResult, NetConf, Request, Result, Version};
use crate::datastore::Store;

pub struct InProcessIpam {
    env: CniEnv,
    network: String,
    /// The addresses per family the call's config asks for.
    families: (usize, usize),
    setup: Setup,
    store: Arc<dyn Store>,
    deadline: Instant,
    /// The host lock's file (`ipam_lock_file`), opened with the reads
    /// ahead.
    lock_file: PathBuf,
}

impl InProcessIpam {
    pub fn new(
        req: &Request,
        store: Arc<dyn Store>,
        setup: Setup,
        deadline: Instant,
    ) -> InProcessIpam {
        InProcessIpam {
            env: req.env.clone(),
            network: req.conf.name.clone(),
            families: verbs::families(&req.conf),
            setup,
            store,
            deadline,
            lock_file: lock::lock_path(&req.conf.ipam_lock_file),
        }
    }

    /// The calico-ipam call context: this call's store, node and the
    /// namespace labels as far as they are known.
    fn call(&self) -> Call {
        Call {
            store: Arc::clone(&self.store),
            namespaces: self.setup.namespaces.clone(),
            host: self.setup.host.clone(),
            namespace_labels: self.setup.namespace_labels.get().cloned(),
            deadline: self.deadline,
            kube: self.setup.kube.clone(),
        }
    }

    /// The request calico-ipam answers for `command` on `config`.
    fn request(&self, command: Command, config: &Value, ip: Option<IpAddr>) -> Result<Request> {
        tracing::debug!(verb = command.as_str(), "calico-ipam in process");
        let mut env = self.env.clone();
        env.command = command;
        if ip.is_some() {
            env.args.ip = ip;
        }
        Ok(Request {
            env,
            raw: config.clone(),
            conf: NetConf::from_value(config)?,
            version: Version::from_config(config.get("cniVersion").and_then(Value::as_str))?,
            deadline: self.deadline,
        })
    }
}

#[async_trait::async_trait]
impl Ipam for InProcessIpam {
    fn kind(&self) -> &str {
        super::CALICO_IPAM
    }

    /// An ADD's reads (IPAMConfig, the pools, the reservations, this
    /// host's affinities) or a DEL's (IPAMConfig, the handles) start now,
    /// in a task of their own, while the caller reads the workload or
    /// waits for the kernel to delete the interface. A DEL writes nothing
    /// until the call is made; an ADD's task writes the container's handle
    /// as soon as the caller has read that the datastore is ready (for an
    /// automatic assignment of one address where the handle and the block
    /// are separate writes: the Kubernetes datastore), so that the
    /// allocation finds it written. An ADD that allocates otherwise (a
    /// VM's handle, the pod's addresses) or not at all deletes it
    /// ([`Ipam::discard`]).
    async fn start(&self, command: Command) -> Result<Pending> {
        let store = Arc::clone(&self.store);
        let host = self.setup.host.clone();
        let deadline = self.deadline;
        let lock_file = self.lock_file.clone();
        let ahead = match command {
            Command::Add => {
                let families = self.families;
                let handle = self.env.args.ip.is_none().then(|| {
                    verbs::HandleAhead::new(
                        verbs::container_handle(&self.network, &self.env.container_id),
                        self.setup.ready.subscribe(),
                    )
                });
                Ahead::Assignment(tokio::spawn(read_ahead(deadline, async move {
                    verbs::read_add(store.as_ref(), &host, families, lock_file, handle).await
                })))
            }
            Command::Del => {
                let handles = verbs::release_handles(&self.network, &self.env);
                Ahead::Release(tokio::spawn(read_ahead(deadline, async move {
                    verbs::read_release(store.as_ref(), &host, &handles, lock_file).await
                })))
            }
            _ => return Ok(Pending::none()),
        };
        Ok(Pending(None, Some(ahead)))
    }

    async fn add(&self, config: &Value, mut pending: Pending) -> Result<CniResult> {
        // (Called without the datastore's readiness read: nothing is
        // written ahead, the allocation writes the handle itself.)
        self.not_ready_unless_read();
        let req = self.request(Command::Add, config, None)?;
        let early = async move {
            match pending.1 {
                Some(Ahead::Assignment(ref mut reads)) => reads.await.ok().flatten(),
                _ => None,
            }
        };
        verbs::add_from(&self.call(), &req, early).await
    }

    /// The handle written ahead, if any, deleted: the task that writes it
    /// is told not to if it has not yet, and is waited for (within the
    /// call's deadline) if it is writing.
    async fn discard(&self, mut pending: Pending) {
        self.not_ready_unless_read();
        if let Some(Ahead::Assignment(ref mut task)) = pending.1 {
            let inputs = tokio::time::timeout_at(self.deadline, task)
                .await
                .ok()
                .and_then(|joined| joined.ok())
                .flatten();
            verbs::discard_add(self.store.as_ref(), &self.setup.host, inputs).await;
        }
    }

    async fn add_ip(&self, config: &Value, ip: IpAddr) -> Result<CniResult> {
        verbs::add(&self.call(), &self.request(Command::Add, config, Some(ip))?).await
    }

    async fn del(&self, config: &Value, mut pending: Pending) -> Result<()> {
        let req = self.request(Command::Del, config, None)?;
        let ahead = match pending.1 {
            Some(Ahead::Release(ref mut reads)) => reads.await.ok().flatten(),
            _ => None,
        };
        verbs::del_from(&self.call(), &req, ahead).await
    }

    async fn check(&self, config: &Value) -> Result<()> {
        verbs::check(&self.call(), &self.request(Command::Check, config, None)?).await
    }

    async fn status(&self, config: &Value) -> Result<()> {
        let req = self.request(Command::Status, config, None)?;
        verbs::status(&self.call(), &req).await
    }

    async fn gc(&self, config: &Value, _valid: Option<&[Attachment]>) -> Result<()> {
        verbs::gc(&self.call(), &self.request(Command::Gc, config, None)?).await
    }

    async fn release_ips(&self, ips: &[IpAddr]) -> Result<()> {
        verbs::release_ips(&self.call(), ips).await
    }

    async fn owners(&self) -> Result<Option<Vec<Owner>>> {
        verbs::owners(&self.call(), &self.network).await.map(Some)
    }

    /// The same calico-ipam with the store's requests bound to `deadline`
    /// (the call's own may be what has just passed).
    fn until(&self, deadline: Instant) -> Arc<dyn Ipam> {
        let store = self
            .store
            .until(deadline)
            .unwrap_or_else(|| Arc::clone(&self.store));
        Arc::new(InProcessIpam {
            env: self.env.clone(),
            network: self.network.clone(),
            families: self.families,
            setup: self.setup.clone(),
            store,
            deadline,
            lock_file: self.lock_file.clone(),
        })
    }
}

impl InProcessIpam {
    /// Settles the readiness the ADD's task waits for at "not ready"
    /// unless the caller has read it ready.
    fn not_ready_unless_read(&self) {
        self.setup.ready.send_if_modified(|ready| {
            let unset = ready.is_none();
            if unset {
                *ready = Some(false);
            }
            unset
        });
    }
}

/// Reads made ahead, bounded by the call's deadline; `None` when they
/// failed (the call reads again, and meets the failure itself).
async fn read_ahead<T>(
    deadline: Instant,
    read: impl std::future::Future<Output = std::result::Result<T, super::calico::IpamError>>,
) -> Option<T> {
    match tokio::time::timeout_at(deadline, read).await {
        Ok(Ok(inputs)) => Some(inputs),
        Ok(Err(e)) => {
            tracing::debug!("reading ahead: {e}");
            None
        }
        Err(_) => None,
    }
}
