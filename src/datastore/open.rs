//! Which datastore a network config selects, and opening it: the code the
//! `calico` plugin's invocation context and the `calico-ipam` personality
//! share.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Store;
use super::kubernetes::KubernetesStore;
use super::local::LocalStore;
use crate::cni::{Error, NetConf, Result};
use crate::k8s::K8sClient;

/// Which datastore the config selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatastoreKind {
    Local,
    Kubernetes,
    Etcd,
}

/// `datastore_type`, else etcd when endpoints are configured, else
/// Kubernetes when a kubeconfig is, else the embedded local store.
pub fn datastore_kind(c: &NetConf) -> Result<DatastoreKind> {
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

/// The embedded store the config names, opened off the runtime thread.
pub async fn open_local(conf: &NetConf, busy: Duration) -> Result<Arc<LocalStore>> {
    let path = conf.local_datastore_path();
    let store = tokio::task::spawn_blocking(move || LocalStore::open(&path, busy))
        .await
        .map_err(|e| Error::Internal(format!("opening the datastore: {e}")))?
        .map_err(|e| e.context("error creating calico client"))?;
    Ok(Arc::new(store))
}

/// An opened datastore, and the Kubernetes one's own face when it is that.
pub struct Opened {
    pub store: Arc<dyn Store>,
    pub kdd: Option<Arc<KubernetesStore>>,
}

/// Opens the datastore the config selects; `client` makes the Kubernetes
/// API client when needed (`interface_prefix`: FELIX_INTERFACEPREFIX).
pub async fn open<F, Fut>(
    conf: &NetConf,
    deadline: Instant,
    interface_prefix: Option<String>,
    client: F,
) -> Result<Opened>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<K8sClient>>,
{
    match datastore_kind(conf)? {
        DatastoreKind::Local => {
            let busy = deadline.saturating_duration_since(Instant::now());
            Ok(Opened {
                store: open_local(conf, busy).await?,
                kdd: None,
            })
        }
        DatastoreKind::Kubernetes => {
            let kdd = Arc::new(KubernetesStore::new(client().await?, interface_prefix));
            Ok(Opened {
                store: Arc::clone(&kdd) as Arc<dyn Store>,
                kdd: Some(kdd),
            })
        }
        DatastoreKind::Etcd => Err(Error::UnsupportedField(
            "datastore_type \"etcdv3\" is not supported by this build yet; use \"local\" or \"kubernetes\"".into(),
        )),
    }
}
