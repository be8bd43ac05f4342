//! The datastore watch of `calico install --watch` in a pod: two objects
//! followed with the pod's own credentials (calico-node's, which may list
//! and watch both) — ClusterInformation `default` (its `datastoreReady`)
//! and the CNI's ServiceAccount (deleted, every token made for it is
//! refused) — and the verdict written for STATUS
//! ([`status_watch`](crate::plugin::status_watch)) at every change and
//! every heartbeat. Each object costs one list, then one watch request per
//! [`WATCH_SECONDS`] or so (taken up again from the last resourceVersion);
//! a watch that fails is a not-ready verdict until one is open again
//! (tried every [`RETRY`]). Credentials that may not list or watch them
//! (403) end the watch without a report: STATUS then keeps to its probe.
//! The node's Lease is followed too, as the sign that the API server's
//! storage takes writes ([`storage_beat`](super::storage_beat)); when the
//! credentials may not watch it, that sign alone is left out.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::jitter::jitter;
use super::kubeconfig::InCluster;
use super::storage_beat::{READ_TIMEOUT, ReadFailure, StorageBeat};
use super::{DEADLINE, Settings};
use crate::cni::NetConf;
use crate::cni::config::DEFAULT_STATUS_CACHE_DIR;
use crate::k8s::client::{CALICO_CRD_GROUP, CALICO_CRD_VERSION, CALICO_V3_GROUP, Watched};
use crate::k8s::{K8sClient, K8sError};
use crate::plugin::status_watch::{self, HEARTBEAT, Report, Verdict};

/// How long the server keeps one watch (the actual figure is spread over
/// ±20% so that nodes do not come back together).
pub const WATCH_SECONDS: u64 = 600;

/// The wait before a failed watch is tried again.
const RETRY: Duration = Duration::from_secs(5);

/// One object followed, and what it must be for a ready datastore.
#[derive(Debug, Clone)]
struct Followed {
    what: String,
    /// The collections it may be in (the first served is used).
    paths: Vec<String>,
    name: String,
    kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    ClusterInformation,
    ServiceAccount,
    /// The node's Lease: its renewals are the storage's heartbeat; as an
    /// object it says nothing of readiness.
    NodeLease,
}

impl Followed {
    /// Whether the object as it is (`None`: absent) is a ready datastore's.
    fn verdict(&self, object: Option<&Value>) -> Verdict {
        match (self.kind, object) {
            (Kind::ClusterInformation, Some(o))
                if o.pointer("/spec/datastoreReady") == Some(&Value::Bool(true)) =>
            {
                Verdict::Ready
            }
            (Kind::ClusterInformation, Some(_)) => Verdict::NotReady(format!(
                "{} says the datastore is not ready (spec.datastoreReady is not true)",
                self.what
            )),
            (Kind::ClusterInformation, None) => Verdict::NotReady(format!(
                "there is no {}: the datastore has not been made ready",
                self.what
            )),
            (Kind::ServiceAccount, Some(_)) => Verdict::Ready,
            (Kind::ServiceAccount, None) => Verdict::NotReady(format!(
                "{} does not exist: the API server refuses the CNI's tokens",
                self.what
            )),
            (Kind::NodeLease, _) => Verdict::Ready,
        }
    }
}

/// The objects followed for `cluster` in `namespace` (and the Lease of
/// `node`, when it is known).
fn followed(cluster: &InCluster, namespace: &str, node: Option<&str>) -> Vec<Followed> {
    let lease = node.map(|node| Followed {
        what: format!("Lease kube-node-lease/{node}"),
        paths: vec!["/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases".into()],
        name: node.to_string(),
        kind: Kind::NodeLease,
    });
    let mut objects = vec![
        Followed {
            what: "ClusterInformation default".into(),
            paths: vec![
                format!("/apis/{CALICO_CRD_GROUP}/{CALICO_CRD_VERSION}/clusterinformations"),
                format!("/apis/{CALICO_V3_GROUP}/clusterinformations"),
            ],
            name: "default".into(),
            kind: Kind::ClusterInformation,
        },
        Followed {
            what: format!("ServiceAccount {namespace}/{}", cluster.service_account),
            paths: vec![format!("/api/v1/namespaces/{namespace}/serviceaccounts")],
            name: cluster.service_account.clone(),
            kind: Kind::ServiceAccount,
        },
    ];
    objects.extend(lease);
    objects
}

/// Where STATUS looks for the report: the status cache's directory of the
/// installed network config's `calico` plugin (the default when it cannot
/// be read).
pub fn report_dir(settings: &Settings) -> PathBuf {
    let conflist = settings.net_d().join(&settings.conf_name);
    std::fs::read(&conflist)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
        .and_then(|list| {
            let plugin = list
                .get("plugins")?
                .as_array()?
                .iter()
                .find(|p| p.get("type").and_then(Value::as_str) == Some("calico"))?
                .clone();
            NetConf::from_value(&plugin).ok()
        })
        .map_or_else(
            || PathBuf::from(DEFAULT_STATUS_CACHE_DIR),
            |conf| conf.status_cache_dir(),
        )
}

/// Follows the objects (the Lease of `node` among them, when known) and
/// keeps the report in `dir` until the process ends; returns only if the
/// pod's own credentials cannot be read.
pub async fn run(cluster: InCluster, dir: PathBuf, node: Option<String>) {
    let namespace = match cluster.own_credentials() {
        Ok((namespace, _, _)) => namespace,
        Err(e) => {
            tracing::warn!("no datastore watch for STATUS: {e}");
            return;
        }
    };
    let objects = followed(&cluster, &namespace, node.as_deref());
    let lease = objects.iter().position(|o| o.kind == Kind::NodeLease);
    let mut beat = node
        .filter(|_| lease.is_some())
        .map(|node| StorageBeat::new(&node, Instant::now()));
    let (tx, mut rx) = mpsc::unbounded_channel();
    for (i, object) in objects.iter().cloned().enumerate() {
        let (cluster, tx) = (cluster.clone(), tx.clone());
        tokio::spawn(async move { follow(&cluster, &object, i, &tx).await });
    }
    drop(tx);
    let mut verdicts: Vec<Option<Verdict>> = vec![None; objects.len()];
    let mut server = String::new();
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    loop {
        let read_at = beat.as_ref().map(StorageBeat::read_at);
        tokio::select! {
            news = rx.recv() => {
                let Some((i, at, verdict)) = news else { return };
                let verdict = match verdict {
                    Some(verdict) => verdict,
                    // The Lease not ours to watch: its sign is left out.
                    None if Some(i) == lease => {
                        beat = None;
                        Verdict::Ready
                    }
                    // Not ours to report: STATUS keeps to its probe.
                    None => {
                        let _ = std::fs::remove_file(status_watch::path_in(&dir));
                        return;
                    }
                };
                if !at.is_empty() {
                    server = at;
                }
                if Some(i) == lease
                    && verdict == Verdict::Ready
                    && let Some(beat) = beat.as_mut()
                {
                    beat.renewed(Instant::now());
                }
                verdicts[i] = Some(verdict);
            }
            _ = sleep_until(read_at), if read_at.is_some() => {
                if let (Some(beat), Some(i)) = (beat.as_mut(), lease) {
                    let read = read_as_of_now(&cluster, &objects[i]).await;
                    let verdict = beat.read(Instant::now(), read);
                    if verdict != Verdict::Ready {
                        tracing::warn!("datastore watch: {verdict:?}");
                    }
                    verdicts[i] = Some(verdict);
                }
            }
            _ = heartbeat.tick() => {}
        }
        // Nothing said until every object has been seen once.
        let Some(all) = verdicts.iter().cloned().collect::<Option<Vec<_>>>() else {
            continue;
        };
        write(
            &dir,
            &Report::new(&server, combined(all), SystemTime::now()),
        );
    }
}

/// Waits until `at` (for ever when `None`).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// One read of `object` as of now (through to the storage), bounded by
/// [`READ_TIMEOUT`].
async fn read_as_of_now(cluster: &InCluster, object: &Followed) -> Result<(), ReadFailure> {
    let read = async {
        let client = client(cluster).await.map_err(ReadFailure::Credentials)?;
        match client
            .list_named(&object.what, &object.paths[0], &object.name)
            .await
        {
            Ok(_) => Ok(()),
            Err(e @ (K8sError::Unauthorized(_) | K8sError::Forbidden(_))) => {
                Err(ReadFailure::Credentials(e.to_string()))
            }
            Err(e) => Err(ReadFailure::Storage(e.to_string())),
        }
    };
    tokio::time::timeout(READ_TIMEOUT, read)
        .await
        .unwrap_or_else(|_| {
            Err(ReadFailure::Storage(format!(
                "no answer within {} s",
                READ_TIMEOUT.as_secs()
            )))
        })
}

/// The objects' verdicts as one: not ready if any says so, else unknown
/// if any watch fails, else ready.
fn combined(all: Vec<Verdict>) -> Verdict {
    let reasons = |pick: fn(&Verdict) -> Option<&String>| -> Vec<String> {
        all.iter().filter_map(pick).cloned().collect()
    };
    let not_ready = reasons(|v| match v {
        Verdict::NotReady(why) => Some(why),
        _ => None,
    });
    let unknown = reasons(|v| match v {
        Verdict::Unknown(why) => Some(why),
        _ => None,
    });
    if !not_ready.is_empty() {
        Verdict::NotReady(not_ready.join("; "))
    } else if !unknown.is_empty() {
        Verdict::Unknown(unknown.join("; "))
    } else {
        Verdict::Ready
    }
}

fn write(dir: &Path, report: &Report) {
    if let Err(e) = status_watch::store(dir, report) {
        tracing::warn!(
            "could not write the datastore watch's report in {}: {e}",
            dir.display()
        );
    }
}

/// One object's verdicts, sent as (its index, the server, the verdict;
/// `None`: the credentials may not watch it).
type Verdicts = mpsc::UnboundedSender<(usize, String, Option<Verdict>)>;

/// Follows `object` for ever: a list, then watches from its
/// resourceVersion; every change of verdict sent.
async fn follow(cluster: &InCluster, object: &Followed, index: usize, tx: &Verdicts) {
    let mut from: Option<(String, String)> = None; // (path, resourceVersion)
    loop {
        let client = match client(cluster).await {
            Ok(c) => c,
            Err(e) => {
                let why = format!("watching {}: {e}", object.what);
                let _ = tx.send((index, String::new(), Some(Verdict::Unknown(why))));
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        let server = client.server().to_string();
        let say = |verdict| {
            let _ = tx.send((index, server.clone(), Some(verdict)));
        };
        match watch_once(&client, object, &mut from, &say).await {
            Ok(()) => {}
            // Credentials that may not watch it (install-cni's own, say):
            // no verdict at all, and STATUS keeps to its probe.
            Err(e @ K8sError::Forbidden(_)) => {
                tracing::warn!("no datastore watch for STATUS: {e}");
                let _ = tx.send((index, server.clone(), None));
                return;
            }
            Err(e) => {
                say(Verdict::Unknown(format!("watching {}: {e}", object.what)));
                from = None;
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

/// The client of the pod's own credentials, read afresh (kubelet rotates
/// the token).
async fn client(cluster: &InCluster) -> Result<K8sClient, String> {
    let (_, _, conf) = cluster.own_credentials().map_err(|e| e.to_string())?;
    K8sClient::new(&conf, Instant::now() + DEADLINE)
        .await
        .map_err(|e| e.to_string())
}

/// One list (when there is no resourceVersion to go on from) and one
/// watch, to its end; `from` left where the watch got to (`None`: list
/// again).
async fn watch_once(
    client: &K8sClient,
    object: &Followed,
    from: &mut Option<(String, String)>,
    say: &impl Fn(Verdict),
) -> Result<(), K8sError> {
    let (path, rv) = match from.take() {
        Some(at) => at,
        None => {
            let (path, found, rv) = list(client, object).await?;
            say(object.verdict(found.as_ref()));
            (path, rv)
        }
    };
    // (Spread over ±20%, as token renewals are: nodes do not come back
    // together.)
    let seconds = WATCH_SECONDS * 4 / 5 + (WATCH_SECONDS as f64 * 0.4 * jitter()) as u64;
    let mut events = client
        .watch_named(
            &object.what,
            &path,
            &object.name,
            &rv,
            Duration::from_secs(seconds),
        )
        .await?;
    let mut at = rv;
    while let Some(event) = events.next().await {
        let event = event?;
        if let Some(rv) = event.resource_version() {
            at = rv.to_string();
        }
        match event {
            Watched::Present(o) => say(object.verdict(Some(&o))),
            Watched::Deleted => say(object.verdict(None)),
            Watched::Progress(_) => {}
            Watched::Expired => return Ok(()),
        }
    }
    *from = Some((path, at));
    Ok(())
}

/// The object from the first collection the server serves: (that
/// collection, the object or `None`, the list's resourceVersion).
async fn list(
    client: &K8sClient,
    object: &Followed,
) -> Result<(String, Option<Value>, String), K8sError> {
    let mut last = None;
    for path in &object.paths {
        match client.list_named(&object.what, path, &object.name).await {
            Ok((found, rv)) => return Ok((path.clone(), found, rv)),
            Err(e @ K8sError::NotServed(_)) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| K8sError::NotServed(object.what.clone())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ready_is_datastore_ready_and_the_service_account_present() {
        let cluster = InCluster {
            dir: PathBuf::from("/nonexistent"),
            server: "https://10.96.0.1:443".into(),
            skip_tls_verify: false,
            kubeconfig: None,
            service_account: "calico-cni-plugin".into(),
            token_seconds: 3600,
        };
        let [info, sa, lease] =
            <[Followed; 3]>::try_from(followed(&cluster, "kube-system", Some("node-1"))).unwrap();
        assert_eq!(followed(&cluster, "kube-system", None).len(), 2);
        assert_eq!(
            lease.paths,
            ["/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"]
        );
        assert_eq!(lease.name, "node-1");
        assert_eq!(lease.verdict(None), Verdict::Ready);
        let why = |v: Verdict| match v {
            Verdict::NotReady(why) => why,
            other => panic!("{other:?}"),
        };
        let ready = json!({"spec": {"datastoreReady": true}});
        assert_eq!(info.verdict(Some(&ready)), Verdict::Ready);
        for not in [
            json!({"spec": {"datastoreReady": false}}),
            json!({"spec": {}}),
        ] {
            assert!(why(info.verdict(Some(&not))).contains("not ready"));
        }
        assert!(why(info.verdict(None)).contains("no ClusterInformation default"));
        assert_eq!(sa.verdict(Some(&json!({}))), Verdict::Ready);
        let gone = why(sa.verdict(None));
        assert!(
            gone.contains("ServiceAccount kube-system/calico-cni-plugin does not exist"),
            "{gone}"
        );
        // Not ready wins over a failing watch, which wins over ready.
        let unknown = Verdict::Unknown("refused".into());
        assert_eq!(combined(vec![Verdict::Ready, unknown.clone()]), unknown);
        assert_eq!(combined(vec![unknown, sa.verdict(None)]), sa.verdict(None));
        assert_eq!(combined(vec![Verdict::Ready; 2]), Verdict::Ready);
        assert_eq!(sa.paths, ["/api/v1/namespaces/kube-system/serviceaccounts"]);
    }
}
