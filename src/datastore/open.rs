//! Which datastore a network config selects, and opening it: the code the
//! `calico` plugin's invocation context and the `calico-ipam` personality
//! share.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::endpoints::{Endpoints, NamespaceLabels, StoredEndpoints};
use super::etcd::EtcdStore;
use super::kubernetes::KubernetesStore;
use super::local::LocalStore;
use super::{Backend, Store};
use crate::cni::error::Kind;
use crate::cni::{Error, NetConf, Result};
use crate::etcd::{EtcdClient, EtcdConfig};
use crate::k8s::K8sClient;

/// `datastore_type`, else etcd when endpoints are configured, else
/// Kubernetes when a kubeconfig is, else the embedded local store.
pub fn datastore_kind(c: &NetConf) -> Result<Backend> {
    match c.datastore_type.as_str() {
        "local" => Ok(Backend::Local),
        "kubernetes" => Ok(Backend::Kubernetes),
        "etcdv3" => Ok(Backend::Etcd),
        "" if !c.etcd_endpoints.is_empty() || !c.etcd_discovery_srv.is_empty() => Ok(Backend::Etcd),
        "" if !c.kubernetes.kubeconfig.is_empty() => Ok(Backend::Kubernetes),
        "" => Ok(Backend::Local),
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

/// An opened datastore: its resource API, where it keeps the endpoint
/// records, and (the Kubernetes datastore) where namespace labels are read.
pub struct Opened {
    pub store: Arc<dyn Store>,
    pub endpoints: Arc<dyn Endpoints>,
    pub namespaces: Option<Arc<dyn NamespaceLabels>>,
}

impl Opened {
    /// A store whose endpoint records are objects of its resource API.
    fn stored(store: Arc<dyn Store>) -> Opened {
        Opened {
            endpoints: Arc::new(StoredEndpoints::new(Arc::clone(&store))),
            store,
            namespaces: None,
        }
    }
}

/// Opens the datastore the config selects; `client` makes the Kubernetes
/// API client when needed (`interface_prefix`: FELIX_INTERFACEPREFIX);
/// `vars` are the call's variables (etcd settings the config leaves out
/// are read there, as Calico reads them from its environment).
pub async fn open<F, Fut>(
    conf: &NetConf,
    vars: &HashMap<String, String>,
    deadline: Instant,
    interface_prefix: Option<String>,
    client: F,
) -> Result<Opened>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<K8sClient>>,
{
    match datastore_kind(conf)? {
        Backend::Local => {
            let busy = deadline.saturating_duration_since(Instant::now());
            Ok(Opened::stored(open_local(conf, busy).await?))
        }
        Backend::Kubernetes => {
            let kdd = Arc::new(KubernetesStore::new(client().await?, interface_prefix));
            Ok(Opened {
                store: Arc::clone(&kdd) as Arc<dyn Store>,
                endpoints: Arc::clone(&kdd) as Arc<dyn Endpoints>,
                namespaces: Some(kdd),
            })
        }
        Backend::Etcd => {
            let client = EtcdClient::new(&etcd_config(conf, vars)?, deadline)
                .map_err(|e| Error::caused(Kind::Datastore, "error creating calico client", e))?;
            Ok(Opened::stored(Arc::new(EtcdStore::new(client))))
        }
    }
}

/// A setting from the config, else from the call's variables as Calico's
/// client reads them from its environment (`CALICO_<NAME>` or `<NAME>`).
fn setting(from_conf: &str, vars: &HashMap<String, String>, name: &str) -> String {
    if !from_conf.is_empty() {
        return from_conf.to_string();
    }
    [format!("CALICO_{name}"), name.to_string()]
        .iter()
        .find_map(|n| vars.get(n).filter(|v| !v.is_empty()).cloned())
        .unwrap_or_default()
}

/// The etcd cluster the config names: `etcd_endpoints` (comma-separated;
/// else the deprecated `etcd_scheme`://`etcd_authority`), the TLS files;
/// each falls back to the environment (`ETCD_ENDPOINTS`, ...) as in
/// Calico.
pub fn etcd_config(conf: &NetConf, vars: &HashMap<String, String>) -> Result<EtcdConfig> {
    if !setting(&conf.etcd_discovery_srv, vars, "ETCD_DISCOVERY_SRV").is_empty() {
        return Err(Error::UnsupportedField(
            "etcd_discovery_srv (DNS SRV discovery) is not supported; list the members in etcd_endpoints".into(),
        ));
    }
    let mut endpoints: Vec<String> = setting(&conf.etcd_endpoints, vars, "ETCD_ENDPOINTS")
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_string)
        .collect();
    if endpoints.is_empty() {
        let authority = setting(&conf.etcd_authority, vars, "ETCD_AUTHORITY");
        if !authority.is_empty() {
            let scheme = setting(&conf.etcd_scheme, vars, "ETCD_SCHEME");
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
        ca_cert_file: file(setting(&conf.etcd_ca_cert_file, vars, "ETCD_CA_CERT_FILE")),
        cert_file: file(setting(&conf.etcd_cert_file, vars, "ETCD_CERT_FILE")),
        key_file: file(setting(&conf.etcd_key_file, vars, "ETCD_KEY_FILE")),
    })
}
