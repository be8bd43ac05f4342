//! The IPAM plugin exec'd, as libcni runs it (any CNI IPAM plugin:
//! host-local, Calico's own calico-ipam, ...). host-local collects nothing
//! on GC, so its reservations are collected here ([`super::host_local_gc`]);
//! an exec'd calico-ipam's allocations are read and released by address
//! through Calico's IPAM on the call's datastore, as Calico's plugin does
//! through its library.

use std::net::IpAddr;
use std::sync::Arc;

use serde_json::Value;
use tokio::time::Instant;

use super::calico::verbs::{self, Call};
use super::{CALICO_IPAM, Ipam, Owner, Pending, Setup, host_local_gc};
use crate::cni::delegate::Delegate;
use crate::cni::env::Command;
use crate::cni::error::Kind;
use crate::cni::request::Attachment;
use crate::cni::{CniResult, Error, Result};

pub struct ExecIpam {
    plugin: Delegate,
    /// The network's name (its calico-ipam handles are `<network>.<cid>`).
    network: String,
    setup: Setup,
}

impl ExecIpam {
    pub fn new(plugin: Delegate, network: String, setup: Setup) -> ExecIpam {
        ExecIpam {
            plugin,
            network,
            setup,
        }
    }

    /// Calico's IPAM on the call's datastore (an exec'd calico-ipam).
    fn calico(&self) -> Result<Option<Call>> {
        if self.plugin.plugin != CALICO_IPAM {
            return Ok(None);
        }
        let store = self.setup.store.get().cloned().ok_or_else(|| {
            Error::internal("calico-ipam's allocations need the datastore opened")
        })?;
        Ok(Some(Call {
            store,
            namespaces: self.setup.namespaces.clone(),
            host: self.setup.host.clone(),
            namespace_labels: None,
            deadline: self.plugin.deadline,
            kube: None,
        }))
    }

    /// host-local's reservations of this network for attachments not in
    /// `valid`, released under its lock (file I/O on the blocking pool).
    async fn collect_host_local(&self, config: &Value, valid: &[Attachment]) -> Result<()> {
        let ipam = config.get("ipam").cloned().unwrap_or_default();
        let dir = host_local_gc::network_dir(&ipam, &self.network);
        let deadline = self.plugin.deadline.into_std();
        let valid = valid.to_vec();
        let collected =
            crate::handoff::spawn_blocking(move || host_local_gc::collect(&dir, &valid, deadline))
                .await
                .map_err(|e| Error::internal_caused("host-local GC stopped", e))?
                .map_err(|e| Error::caused(Kind::Ipam, "host-local GC", e))?;
        if !collected.released.is_empty() {
            tracing::info!(released = ?collected.released, kept = collected.kept, "host-local GC");
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Ipam for ExecIpam {
    fn kind(&self) -> &str {
        &self.plugin.plugin
    }

    async fn start(&self, command: Command) -> Result<Pending> {
        Ok(Pending(Some(self.plugin.spawn(command).await?), None))
    }

    async fn add(&self, config: &Value, pending: Pending) -> Result<CniResult> {
        self.plugin.add_on(config, pending.0).await
    }

    async fn add_ip(&self, config: &Value, ip: IpAddr) -> Result<CniResult> {
        let one = Delegate {
            extra_args: Some(format!("IP={ip}")),
            ..self.plugin.clone()
        };
        one.add(config).await
    }

    async fn del(&self, config: &Value, pending: Pending) -> Result<()> {
        self.plugin.run_on(Command::Del, config, pending.0).await
    }

    async fn check(&self, config: &Value) -> Result<()> {
        self.plugin.run(Command::Check, config).await
    }

    async fn status(&self, config: &Value) -> Result<()> {
        self.plugin.run_v11_verb(Command::Status, config).await
    }

    /// The plugin's own GC with the same list (it decides without one);
    /// host-local's reservations, which it does not collect, here.
    async fn gc(&self, config: &Value, valid: Option<&[Attachment]>) -> Result<()> {
        let own = self.plugin.run_v11_verb(Command::Gc, config).await;
        if let Some(valid) = valid
            && self.plugin.plugin == "host-local"
        {
            let collected = self.collect_host_local(config, valid).await;
            own.and(collected)
        } else {
            own
        }
    }

    async fn release_ips(&self, ips: &[IpAddr]) -> Result<()> {
        match self.calico()? {
            Some(call) => verbs::release_ips(&call, ips).await,
            None => Err(Error::ipam(format!(
                "releasing addresses directly needs calico-ipam, not {}",
                self.plugin.plugin
            ))),
        }
    }

    async fn owners(&self) -> Result<Option<Vec<Owner>>> {
        match self.calico()? {
            Some(call) => verbs::owners(&call, &self.network).await.map(Some),
            None => Ok(None),
        }
    }

    fn until(&self, deadline: Instant) -> Arc<dyn Ipam> {
        Arc::new(ExecIpam {
            plugin: Delegate {
                deadline,
                ..self.plugin.clone()
            },
            network: self.network.clone(),
            setup: self.setup.clone(),
        })
    }
}
