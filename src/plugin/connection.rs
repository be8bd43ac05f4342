//! `calico -t` (calico-behaviour.md §1.2): does the configured datastore
//! answer? ClusterInformation `default` must read back with
//! `datastoreReady: true` and, when a kubeconfig is configured, the API
//! server must answer `/version`; each within [`PROBE_TIMEOUT`].

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::cni::{Error, NetConf, Result};
use crate::datastore::open::open;
use crate::k8s::K8sClient;

/// How long each probe may take, as in Calico.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Probes the datastore `conf` names (`vars`: the process's variables,
/// where etcd settings the config leaves out are read).
pub async fn test_connection(conf: &NetConf, vars: &HashMap<String, String>) -> Result<()> {
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let k8s = conf.k8s_config();
    let opened = open(conf, vars, deadline, None, || async {
        Ok(K8sClient::new(&k8s, deadline).await?)
    })
    .await?;
    let ready = tokio::time::timeout_at(deadline, opened.store.cluster_ready())
        .await
        .map_err(|_| Error::timed_out("no answer from the datastore within 2s"))?
        .map_err(|e| e.context("error getting ClusterInformation"))?;
    if !ready {
        return Err(Error::datastore(
            "ClusterInformation default is missing or not datastoreReady",
        ));
    }
    if !conf.kubernetes.kubeconfig.is_empty() {
        let deadline = Instant::now() + PROBE_TIMEOUT;
        let client = K8sClient::new(&k8s, deadline).await?;
        let version = tokio::time::timeout_at(
            deadline,
            client.get_json("error getting /version", "/version"),
        )
        .await
        .map_err(|_| Error::timed_out("no answer from the API server within 2s"))??;
        tracing::debug!(?version, "the API server answers");
    }
    Ok(())
}
