//! Which datastore a network config selects, and opening it: the code the
//! `calico` plugin's invocation context and the `calico-ipam` personality
//! share.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Store;
use super::etcd::EtcdStore;
use super::kubernetes::KubernetesStore;
use super::local::LocalStore;
use crate::cni::{Error, NetConf, Result};
use crate::etcd::{EtcdClient, EtcdConfig};
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
        DatastoreKind::Etcd => {
            let client = EtcdClient::new(&etcd_config(conf)?, deadline)
                .map_err(|e| Error::Datastore(format!("error creating calico client: {e}")))?;
            Ok(Opened {
                store: Arc::new(EtcdStore::new(client)),
                kdd: None,
            })
        }
    }
}

/// A setting from the config, else from the environment as Calico's
/// client reads it (`CALICO_<NAME>` or `<NAME>`).
fn setting(from_conf: &str, name: &str) -> String {
    if !from_conf.is_empty() {
        return from_conf.to_string();
    }
    [format!("CALICO_{name}"), name.to_string()]
        .iter()
        .find_map(|n| std::env::var(n).ok().filter(|v| !v.is_empty()))
        .unwrap_or_default()
}

/// The etcd cluster the config names: `etcd_endpoints` (comma-separated;
/// else the deprecated `etcd_scheme`://`etcd_authority`), the TLS files;
/// each falls back to the environment (`ETCD_ENDPOINTS`, ...) as in
/// Calico.
pub fn etcd_config(conf: &NetConf) -> Result<EtcdConfig> {
    if !setting(&conf.etcd_discovery_srv, "ETCD_DISCOVERY_SRV").is_empty() {
        return Err(Error::UnsupportedField(
            "etcd_discovery_srv (DNS SRV discovery) is not supported; list the members in etcd_endpoints".into(),
        ));
    }
    let mut endpoints: Vec<String> = setting(&conf.etcd_endpoints, "ETCD_ENDPOINTS")
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_string)
        .collect();
    if endpoints.is_empty() {
        let authority = setting(&conf.etcd_authority, "ETCD_AUTHORITY");
        if !authority.is_empty() {
            let scheme = setting(&conf.etcd_scheme, "ETCD_SCHEME");
            let scheme = if scheme.is_empty() {
                "http"
            } else {
                scheme.as_str()
            };
            endpoints.push(format!("{scheme}://{authority}"));
        }
    }
    if endpoints.is_empty() {
        return Err(Error::InvalidConfig(
            "datastore_type is etcdv3 but no etcd_endpoints are configured".into(),
        ));
    }
    let file = |v: String| (!v.is_empty()).then(|| std::path::PathBuf::from(v));
    Ok(EtcdConfig {
        endpoints,
        ca_cert_file: file(setting(&conf.etcd_ca_cert_file, "ETCD_CA_CERT_FILE")),
        cert_file: file(setting(&conf.etcd_cert_file, "ETCD_CERT_FILE")),
        key_file: file(setting(&conf.etcd_key_file, "ETCD_KEY_FILE")),
    })
}
