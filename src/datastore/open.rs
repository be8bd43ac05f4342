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
use crate::etcd::{Credentials, EtcdClient, EtcdConfig};
use crate::k8s::K8sClient;
use crate::k8s::client::CalicoApiGroup;

/// The datastore type as Calico's client settles it ([`setting`]:
/// `CALICO_DATASTORE_TYPE`, then `datastore_type`, then
/// `DATASTORE_TYPE`), else etcd when endpoints are configured (in the
/// config or the environment), else Kubernetes when a kubeconfig is, else
/// the embedded local store.
pub fn datastore_kind(c: &NetConf, vars: &HashMap<String, String>) -> Result<Backend> {
    let etcd = || {
        !setting(&c.etcd_endpoints, vars, "ETCD_ENDPOINTS").is_empty()
            || !setting(&c.etcd_discovery_srv, vars, "ETCD_DISCOVERY_SRV").is_empty()
    };
    match setting(&c.datastore_type, vars, "DATASTORE_TYPE").as_str() {
        "local" => Ok(Backend::Local),
        "kubernetes" => Ok(Backend::Kubernetes),
        "etcdv3" => Ok(Backend::Etcd),
        "" if etcd() => Ok(Backend::Etcd),
        "" if !c.kubernetes.kubeconfig.is_empty() => Ok(Backend::Kubernetes),
        "" => Ok(Backend::Local),
        other => Err(Error::invalid_config(format!(
            "unknown datastore_type {other:?} (supported: local, kubernetes, etcdv3)"
        ))),
    }
}

/// Whether a call on this config presents a Kubernetes API token (whose
/// expiry a readiness check must judge): the datastore it selects
/// ([`datastore_kind`]) is reached through the Kubernetes API, or the
/// config names a kubeconfig or token for the pod and policy reads a call
/// makes on any datastore.
pub fn presents_kubernetes_token(c: &NetConf, vars: &HashMap<String, String>) -> Result<bool> {
    Ok(datastore_kind(c, vars)?.through_kubernetes_api()
        || !c.kubernetes.kubeconfig.is_empty()
        || !c.policy.k8s_auth_token.is_empty())
}

/// The embedded store the config names, opened off the runtime thread.
pub async fn open_local(conf: &NetConf, busy: Duration) -> Result<Arc<LocalStore>> {
    let path = conf.local_datastore_path();
    let store = crate::handoff::spawn_blocking(move || LocalStore::open(&path, busy))
        .await
        .map_err(|e| Error::internal_caused("opening the datastore", e))?
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
    match datastore_kind(conf, vars)? {
        Backend::Local => {
            let busy = deadline.saturating_duration_since(Instant::now());
            Ok(Opened::stored(open_local(conf, busy).await?))
        }
        Backend::Kubernetes => {
            let group = CalicoApiGroup::from_setting(&setting(
                &conf.calico_api_group,
                vars,
                "CALICO_API_GROUP",
            ));
            let kdd = Arc::new(KubernetesStore::new(
                client().await?,
                interface_prefix,
                group,
            ));
            Ok(Opened {
                store: Arc::clone(&kdd) as Arc<dyn Store>,
                endpoints: Arc::clone(&kdd) as Arc<dyn Endpoints>,
                namespaces: Some(kdd),
            })
        }
        Backend::Etcd => {
            let created = async {
                let config = etcd_config(conf, vars)?.resolved(deadline).await;
                Ok::<_, Error>(config.and_then(|c| EtcdClient::new(&c, deadline)))
            };
            let client = created
                .await?
                .map_err(|e| Error::caused(Kind::Datastore, "error creating calico client", e))?;
            Ok(Opened::stored(Arc::new(EtcdStore::new(client))))
        }
    }
}

/// A datastore setting as Calico's client ends up with it: Calico exports
/// the config's value as `<NAME>` and then reads `CALICO_<NAME>`, else
/// `<NAME>`, from its environment — so `CALICO_<NAME>` in the call's
/// variables beats the config, which beats `<NAME>`.
fn setting(from_conf: &str, vars: &HashMap<String, String>, name: &str) -> String {
    let var = |n: &str| vars.get(n).filter(|v| !v.is_empty()).cloned();
    var(&format!("CALICO_{name}"))
        .or_else(|| (!from_conf.is_empty()).then(|| from_conf.to_string()))
        .or_else(|| var(name))
        .unwrap_or_default()
}

/// The etcd cluster the config names: `etcd_endpoints` (comma-separated;
/// else the deprecated `etcd_scheme`://`etcd_authority`), the TLS files;
/// each falls back to the environment (`ETCD_ENDPOINTS`, ...) as in
/// Calico.
pub fn etcd_config(conf: &NetConf, vars: &HashMap<String, String>) -> Result<EtcdConfig> {
    let discovery = setting(&conf.etcd_discovery_srv, vars, "ETCD_DISCOVERY_SRV");
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
    match (endpoints.is_empty(), discovery.is_empty()) {
        (false, false) => {
            return Err(Error::invalid_config(
                "multiple discovery or bootstrap options specified, use either \"etcd_endpoints\" or \"etcd_discovery_srv\"",
            ));
        }
        (true, true) => {
            return Err(Error::invalid_config(
                "datastore_type is etcdv3 but no etcd_endpoints are configured",
            ));
        }
        _ => {}
    }
    let file = |v: String| (!v.is_empty()).then(|| std::path::PathBuf::from(v));
    // The environment only (no config key), used when both are set.
    let (username, password) = (
        setting("", vars, "ETCD_USERNAME"),
        setting("", vars, "ETCD_PASSWORD"),
    );
    let credentials = (!username.is_empty() && !password.is_empty())
        .then_some(Credentials { username, password });
    Ok(EtcdConfig {
        credentials,
        discovery_srv: (!discovery.is_empty()).then_some(discovery),
        endpoints,
        ca_cert_file: file(setting(&conf.etcd_ca_cert_file, vars, "ETCD_CA_CERT_FILE")),
        cert_file: file(setting(&conf.etcd_cert_file, vars, "ETCD_CERT_FILE")),
        key_file: file(setting(&conf.etcd_key_file, vars, "ETCD_KEY_FILE")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_datastore_type_follows_calicos_precedence() {
        let mut conf = NetConf::default();
        let none = vars(&[]);
        assert_eq!(datastore_kind(&conf, &none).unwrap(), Backend::Local);
        // DATASTORE_TYPE from the environment, when the config says none.
        let env = vars(&[("DATASTORE_TYPE", "kubernetes")]);
        assert_eq!(datastore_kind(&conf, &env).unwrap(), Backend::Kubernetes);
        // The config beats DATASTORE_TYPE...
        conf.datastore_type = "local".into();
        assert_eq!(datastore_kind(&conf, &env).unwrap(), Backend::Local);
        // ... and CALICO_DATASTORE_TYPE beats the config.
        let calico = vars(&[
            ("CALICO_DATASTORE_TYPE", "etcdv3"),
            ("DATASTORE_TYPE", "kubernetes"),
        ]);
        assert_eq!(datastore_kind(&conf, &calico).unwrap(), Backend::Etcd);
        // No type anywhere: etcd when endpoints are known, config or
        // environment.
        conf.datastore_type.clear();
        let endpoints = vars(&[("ETCD_ENDPOINTS", "https://127.0.0.1:2379")]);
        assert_eq!(datastore_kind(&conf, &endpoints).unwrap(), Backend::Etcd);
        let bad = vars(&[("DATASTORE_TYPE", "etcdv2")]);
        assert!(
            datastore_kind(&conf, &bad)
                .unwrap_err()
                .to_string()
                .contains("unknown datastore_type \"etcdv2\"")
        );
    }

    #[test]
    fn the_token_judged_is_the_one_the_selected_datastore_presents() {
        let mut conf = NetConf {
            datastore_type: "kubernetes".into(),
            ..NetConf::default()
        };
        assert!(presents_kubernetes_token(&conf, &vars(&[])).unwrap());
        // The environment selects the embedded store: no token.
        let local = vars(&[("CALICO_DATASTORE_TYPE", "local")]);
        assert!(!presents_kubernetes_token(&conf, &local).unwrap());
        // The Kubernetes datastore selected by the environment alone.
        conf.datastore_type.clear();
        let kdd = vars(&[("DATASTORE_TYPE", "kubernetes")]);
        assert!(presents_kubernetes_token(&conf, &kdd).unwrap());
        // Any datastore, with a kubeconfig for the pod and policy reads.
        conf.kubernetes.kubeconfig = "/etc/cni/net.d/calico-kubeconfig".into();
        assert!(presents_kubernetes_token(&conf, &local).unwrap());
    }

    #[test]
    fn etcd_settings_follow_calicos_precedence() {
        let mut conf = NetConf {
            etcd_endpoints: "https://conf:2379".into(),
            ..NetConf::default()
        };
        let env = vars(&[("ETCD_ENDPOINTS", "https://env:2379")]);
        assert_eq!(
            etcd_config(&conf, &env).unwrap().endpoints,
            ["https://conf:2379"]
        );
        let calico = vars(&[("CALICO_ETCD_ENDPOINTS", "https://a:2379,https://b:2379")]);
        assert_eq!(
            etcd_config(&conf, &calico).unwrap().endpoints,
            ["https://a:2379", "https://b:2379"]
        );
        conf.etcd_endpoints.clear();
        assert_eq!(
            etcd_config(&conf, &env).unwrap().endpoints,
            ["https://env:2379"]
        );
    }
}
