//! The Kubernetes datastore (KDD). WorkloadEndpoints are not stored objects
//! but views of Pods ([`endpoint`]), so their records are this backend's
//! [`Endpoints`] rather than the resource API's: a lookup is one pod GET
//! (none when the call has read the pod already); a write is a
//! strategic-merge PATCH of the pod's `status` subresource carrying the
//! `cni.projectcalico.org/podIP`, `podIPs` and `containerID` annotations and
//! the pod's resourceVersion as read (so a concurrent writer makes it 409);
//! a delete clears podIP/podIPs under resourceVersion and uid
//! preconditions. Profiles are synthesised from namespaces and service
//! accounts (read-only). Every other kind is its Calico custom resource
//! ([`crd`]: `crd.projectcalico.org/v1`, or Calico v3.32's native
//! `projectcalico.org/v3` CRDs as `calico_api_group` / `CALICO_API_GROUP`
//! or, unset, discovery decide), written with PUT on the resourceVersion
//! read and deleted with uid/resourceVersion preconditions.
//!
//! Discovery costs nothing where the v1 CRDs are served (most clusters,
//! and every one whose config names the group, as the tigera operator's
//! does): the store starts with v1, and only a Calico request the API
//! server answers "no such resource" asks which groups it serves (once per
//! call), settling on v3 by Calico's rule.

pub mod crd;
pub mod endpoint;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use self::endpoint::{
    ANNOTATION_CONTAINER_ID, ANNOTATION_POD_IP, ANNOTATION_POD_IPS, endpoint_for_pod,
    pod_ip_annotations, pod_ip_networks,
};
use super::endpoints::{Endpoints, NamespaceLabels};
use super::ipam_model::Node;
use super::model::{API_VERSION, Profile, WorkloadEndpoint};
use super::names::WepIdentifiers;
use super::{Backend, DatastoreError, Kind, ListFilter, Precondition, Resource, Store, meta_field};
use crate::k8s::client::{CalicoApiGroup, Freshness, K8sClient, K8sError, segment};
use crate::k8s::objects::Pod;

/// Attempts at a conditional create that keeps meeting concurrent writers.
const CREATE_ATTEMPTS: usize = 3;

/// The Kubernetes datastore of one invocation. Its client remembers the
/// pods the call has read, so that each pod is read once and a write is
/// conditional on the revision that was read.
pub struct KubernetesStore {
    client: K8sClient,
    /// FELIX_INTERFACEPREFIX, for host veth names.
    interface_prefix: Option<String>,
    /// Where Calico's objects are, shared with the store's clones.
    group: Arc<Mutex<GroupChoice>>,
    /// The discovered group: asked once, however many requests find their
    /// group not served at once.
    discovered: Arc<tokio::sync::OnceCell<CalicoApiGroup>>,
}

/// The API group in use, and whether it is settled (configured, or
/// discovered) or assumed (v1, until the API server says otherwise).
#[derive(Debug, Clone, Copy)]
struct GroupChoice {
    group: CalicoApiGroup,
    settled: bool,
}

impl From<K8sError> for DatastoreError {
    /// A conflict is the outcome callers act on; the rest is kept as the
    /// API server's failure.
    fn from(e: K8sError) -> Self {
        match e {
            K8sError::Conflict(m) => DatastoreError::Conflict(m),
            K8sError::AlreadyExists(m) => DatastoreError::AlreadyExists(m),
            e => DatastoreError::Kubernetes(e),
        }
    }
}

fn malformed(e: serde_json::Error) -> DatastoreError {
    DatastoreError::Other(format!("malformed object: {e}"))
}

impl KubernetesStore {
    /// A store on `client`; `group` is the configured API group of
    /// Calico's CRDs (`None`: discovered when needed).
    pub fn new(
        client: K8sClient,
        interface_prefix: Option<String>,
        group: Option<CalicoApiGroup>,
    ) -> KubernetesStore {
        KubernetesStore {
            client,
            interface_prefix,
            group: Arc::new(Mutex::new(GroupChoice {
                group: group.unwrap_or(CalicoApiGroup::CrdV1),
                settled: group.is_some(),
            })),
            discovered: Arc::default(),
        }
    }

    fn choice(&self) -> GroupChoice {
        *self.group.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The API group Calico's objects are read and written in now.
    pub fn api_group(&self) -> CalicoApiGroup {
        self.choice().group
    }

    /// Runs a request on Calico's CRDs in the group in use; when the API
    /// server serves no such resource and the group was only assumed, asks
    /// which groups it serves and, if that changes the group, runs it again.
    async fn in_group<T, F, Fut>(&self, request: F) -> Result<T, K8sError>
    where
        F: Fn(CalicoApiGroup) -> Fut,
        Fut: std::future::Future<Output = Result<T, K8sError>>,
    {
        let choice = self.choice();
        match request(choice.group).await {
            Err(K8sError::NotServed(what)) if !choice.settled => {
                let found = *self
                    .discovered
                    .get_or_try_init(|| async {
                        let found = CalicoApiGroup::discovered(&self.client.served_groups().await?);
                        *self.group.lock().unwrap_or_else(|p| p.into_inner()) = GroupChoice {
                            group: found,
                            settled: true,
                        };
                        tracing::info!(
                            "the API server does not serve {}; Calico's objects are in {} (discovered)",
                            choice.group.api_version(),
                            found.api_version()
                        );
                        Ok::<_, K8sError>(found)
                    })
                    .await?;
                if found == choice.group {
                    Err(K8sError::NotServed(what))
                } else {
                    request(found).await
                }
            }
            other => other,
        }
    }

    /// GETs the pod (the client remembers it).
    pub async fn pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, DatastoreError> {
        Ok(self.client.pod(namespace, name).await?)
    }

    /// The WorkloadEndpoint a pod stands for, with `endpoint` as its
    /// interface; `None` for pods not (yet) on a node or on the host network.
    pub fn endpoint_of(&self, pod: &Pod, endpoint: &str) -> Option<WorkloadEndpoint> {
        let spec = pod.spec.as_ref()?;
        let node = spec.node_name.as_deref().filter(|n| !n.is_empty())?;
        if spec.host_network == Some(true) {
            return None;
        }
        let mut wep = endpoint_for_pod(pod, node, endpoint, self.interface_prefix.as_deref());
        wep.metadata.resource_version = pod.metadata.resource_version.clone().unwrap_or_default();
        wep.metadata.uid = pod.metadata.uid.clone().unwrap_or_default();
        wep.spec.ip_networks = pod_ip_networks(pod);
        wep.spec.container_id = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_CONTAINER_ID))
            .cloned()
            .unwrap_or_default();
        Some(wep)
    }

    /// The pod a WorkloadEndpoint name (or name prefix) refers to.
    fn pod_of(name: &str) -> Result<WepIdentifiers, DatastoreError> {
        let ids = WepIdentifiers::parse(name)?;
        if ids.orchestrator != "k8s" || ids.pod.is_empty() {
            return Err(DatastoreError::Other(format!(
                "insufficient identifiers: {name:?} names no Kubernetes pod"
            )));
        }
        Ok(ids)
    }

    async fn patch(&self, namespace: &str, pod: &str, body: Value) -> Result<Pod, DatastoreError> {
        match self.client.patch_pod_status(namespace, pod, &body).await {
            Ok(Some(patched)) => Ok(patched),
            Ok(None) => Err(DatastoreError::NotFound(format!("Pod({namespace}/{pod})"))),
            Err(e) => Err(e.into()),
        }
    }

    /// Records `wep` in its pod's annotations, conditional on the pod's
    /// resourceVersion `read_at`.
    async fn write_endpoint(
        &self,
        wep: &WorkloadEndpoint,
        read_at: &str,
    ) -> Result<Value, DatastoreError> {
        let ids = Self::pod_of(&wep.metadata.name)?;
        let mut body = pod_ip_annotations(&wep.spec.ip_networks, &wep.spec.container_id);
        if !read_at.is_empty() {
            body["metadata"]["resourceVersion"] = json!(read_at);
        }
        let pod = self.patch(&wep.metadata.namespace, &ids.pod, body).await?;
        let mut stored = wep.clone();
        stored.metadata.resource_version = pod.metadata.resource_version.unwrap_or_default();
        stored.metadata.uid = pod.metadata.uid.unwrap_or_default();
        serde_json::to_value(stored).map_err(malformed)
    }

    /// Create: the pod must not stand for an endpoint yet, as last read;
    /// the patch is conditional on that read, so a concurrent writer makes
    /// it read again (bounded).
    async fn create_endpoint(&self, wep: WorkloadEndpoint) -> Result<Value, DatastoreError> {
        let ids = Self::pod_of(&wep.metadata.name)?;
        let namespace = wep.metadata.namespace.clone();
        for attempt in 1..=CREATE_ATTEMPTS {
            let pod = match self.client.cached_pod(&namespace, &ids.pod) {
                Some(pod) if attempt == 1 => pod,
                _ => self.pod(&namespace, &ids.pod).await?.ok_or_else(|| {
                    DatastoreError::NotFound(format!("Pod({namespace}/{})", ids.pod))
                })?,
            };
            if !pod_ip_networks(&pod).is_empty() {
                return Err(DatastoreError::AlreadyExists(
                    WorkloadEndpoint::KIND.describe(&namespace, &wep.metadata.name),
                ));
            }
            let read_at = pod.metadata.resource_version.clone().unwrap_or_default();
            match self.write_endpoint(&wep, &read_at).await {
                Err(DatastoreError::Conflict(e)) if attempt < CREATE_ATTEMPTS => {
                    tracing::info!(
                        attempt,
                        "pod changed while recording its endpoint ({e}); reading it again"
                    );
                }
                other => return other,
            }
        }
        unreachable!("the last attempt returns")
    }

    /// The record as the pod is now (a fresh GET: a caller that retries
    /// after a conflict must see the new revision).
    async fn get_endpoint(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<WorkloadEndpoint>, DatastoreError> {
        let ids = Self::pod_of(name)?;
        let Some(pod) = self.client.pod(namespace, &ids.pod).await? else {
            return Ok(None);
        };
        Ok(self
            .endpoint_of(&pod, &ids.endpoint)
            .filter(|w| w.metadata.name == name))
    }

    async fn delete_endpoint(
        &self,
        namespace: &str,
        name: &str,
        precondition: &Precondition,
    ) -> Result<(), DatastoreError> {
        let ids = Self::pod_of(name)?;
        let mut metadata = serde_json::Map::new();
        metadata.insert(
            "annotations".into(),
            json!({ANNOTATION_POD_IP: "", ANNOTATION_POD_IPS: ""}),
        );
        if let Some(rv) = &precondition.resource_version {
            metadata.insert("resourceVersion".into(), rv.clone().into());
        }
        if let Some(uid) = &precondition.uid {
            metadata.insert("uid".into(), uid.clone().into());
        }
        self.patch(namespace, &ids.pod, json!({ "metadata": metadata }))
            .await
            .map(|_| ())
    }

    /// One object, as current as `fresh` asks.
    async fn get(
        &self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
        fresh: Freshness,
    ) -> Result<Option<Value>, DatastoreError> {
        if kind.name == WorkloadEndpoint::KIND.name {
            return Err(records_elsewhere());
        }
        if kind.name == Profile::KIND.name {
            return Ok(None);
        }
        if kind.name == Node::KIND.name {
            return self.node(name, fresh != Freshness::Latest).await;
        }
        let (scope, name) = (Self::scope(kind, namespace)?, segment(name)?);
        let what = format!("error getting {}", kind.describe(namespace, name));
        let got = self
            .in_group(|group| {
                let path = crd::path(kind, group, scope, name);
                let what = &what;
                async move { self.client.get(what, &path, fresh).await }
            })
            .await;
        match got {
            Ok(object) => Ok(object.map(|o| crd::from_crd(kind, o))),
            // A kind whose CRD the cluster lacks holds nothing.
            Err(K8sError::NotServed(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// A Kubernetes Node as the Calico Node pool nodeSelectors match: its
    /// name and labels.
    async fn node(&self, name: &str, cached: bool) -> Result<Option<Value>, DatastoreError> {
        let Some(node) = self.client.node(name, cached).await? else {
            return Ok(None);
        };
        let m = &node.metadata;
        Ok(Some(json!({
            "kind": "Node",
            "apiVersion": API_VERSION,
            "metadata": {
                "name": m.name.clone().unwrap_or_default(),
                "uid": m.uid.clone().unwrap_or_default(),
                "resourceVersion": m.resource_version.clone().unwrap_or_default(),
                "labels": m.labels.clone().unwrap_or_default(),
            },
            "spec": {}
        })))
    }

    /// A Calico CRD collection (`cached`: from the watch cache).
    async fn list(
        &self,
        kind: &'static Kind,
        namespace: &str,
        filter: &ListFilter,
        cached: bool,
    ) -> Result<Vec<Value>, DatastoreError> {
        if kind.name == WorkloadEndpoint::KIND.name {
            return Err(records_elsewhere());
        }
        if kind.name == Profile::KIND.name {
            return Ok(Vec::new());
        }
        let selector = match filter.labels() {
            Some(labels) => Some(
                labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            _ => None,
        };
        let what = format!("error listing {}", kind.plural);
        let scope = Self::scope(kind, namespace)?;
        let listed = self
            .in_group(|group| {
                let path = crd::collection(kind, group, scope);
                let (what, selector) = (&what, selector.as_deref());
                async move { self.client.list_json(what, &path, selector, cached).await }
            })
            .await;
        let items = match listed {
            Ok(items) => items,
            Err(K8sError::NotServed(_)) => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        let mut objects: Vec<Value> = items
            .into_iter()
            .map(|o| crd::from_crd(kind, o))
            .filter(|o| match filter {
                ListFilter::NamePrefix(p) => meta_field(o, "name").starts_with(p.as_str()),
                _ => true,
            })
            .collect();
        objects.sort_by(|a, b| meta_field(a, "name").cmp(meta_field(b, "name")));
        Ok(objects)
    }

    /// The namespace of a kind's API paths, checked: `""` when cluster-scoped.
    fn scope<'a>(kind: &Kind, namespace: &'a str) -> Result<&'a str, DatastoreError> {
        if kind.namespaced {
            Ok(segment(namespace)?)
        } else {
            Ok("")
        }
    }
}

/// Whether objects of `kind` are written through the resource API here:
/// not WorkloadEndpoints (pods: the endpoint records), not Profiles
/// (synthesised from namespaces and service accounts).
fn writable(kind: &Kind) -> Result<(), DatastoreError> {
    if kind.name == WorkloadEndpoint::KIND.name {
        return Err(records_elsewhere());
    }
    if kind.name == Profile::KIND.name {
        return Err(read_only(kind));
    }
    Ok(())
}

fn read_only(kind: &Kind) -> DatastoreError {
    DatastoreError::Other(format!(
        "{} objects are read-only in the Kubernetes datastore (use policy type k8s)",
        kind.name
    ))
}

#[async_trait::async_trait]
impl Store for KubernetesStore {
    async fn get_object(
        &self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, DatastoreError> {
        self.get(kind, namespace, name, Freshness::Latest).await
    }

    /// From the API server's watch cache (`resourceVersion=0`; read as of
    /// now when the cache lacks the object).
    async fn get_object_cached(
        &self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, DatastoreError> {
        self.get(kind, namespace, name, Freshness::Cached).await
    }

    async fn get_object_cached_or_absent(
        &self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, DatastoreError> {
        self.get(kind, namespace, name, Freshness::CacheOnly).await
    }

    /// Served from the API server's watch cache (a few milliseconds
    /// behind at most; an answer as of now costs 60-70 ms after any write):
    /// every reader of a list re-reads what it acts on, and every write is
    /// conditional (`list_objects_latest` where a stale list could mislead).
    async fn list_objects(
        &self,
        kind: &'static Kind,
        namespace: &str,
        filter: &ListFilter,
    ) -> Result<Vec<Value>, DatastoreError> {
        self.list(kind, namespace, filter, true).await
    }

    async fn list_objects_latest(
        &self,
        kind: &'static Kind,
        namespace: &str,
        filter: &ListFilter,
    ) -> Result<Vec<Value>, DatastoreError> {
        self.list(kind, namespace, filter, false).await
    }

    async fn create_object(
        &self,
        kind: &'static Kind,
        object: Value,
    ) -> Result<Value, DatastoreError> {
        writable(kind)?;
        let namespace = meta_field(&object, "namespace").to_string();
        let name = meta_field(&object, "name").to_string();
        let what = format!("error creating {}", kind.describe(&namespace, &name));
        let scope = Self::scope(kind, &namespace)?;
        let mut object = object;
        if let Some(m) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        let created = self
            .in_group(|group| {
                let collection = crd::collection(kind, group, scope);
                let body = crd::to_crd(kind, group, object.clone());
                let what = &what;
                async move { self.client.create_json(what, &collection, &body).await }
            })
            .await?;
        Ok(crd::from_crd(kind, created))
    }

    async fn update_object(
        &self,
        kind: &'static Kind,
        object: Value,
    ) -> Result<Value, DatastoreError> {
        writable(kind)?;
        let namespace = meta_field(&object, "namespace").to_string();
        let name = meta_field(&object, "name").to_string();
        if meta_field(&object, "resourceVersion").is_empty() {
            return Err(DatastoreError::Other(format!(
                "metadata.resourceVersion is required to update {}",
                kind.describe(&namespace, &name)
            )));
        }
        let what = format!("error updating {}", kind.describe(&namespace, &name));
        let (scope, segment_name) = (Self::scope(kind, &namespace)?, segment(&name)?);
        let stored = self
            .in_group(|group| {
                let path = crd::path(kind, group, scope, segment_name);
                let body = crd::to_crd(kind, group, object.clone());
                let what = &what;
                async move { self.client.replace_json(what, &path, &body).await }
            })
            .await?;
        match stored {
            Some(stored) => Ok(crd::from_crd(kind, stored)),
            None => Err(DatastoreError::NotFound(kind.describe(&namespace, &name))),
        }
    }

    async fn delete_object(
        &self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
        precondition: &Precondition,
    ) -> Result<(), DatastoreError> {
        writable(kind)?;
        let what = format!("error deleting {}", kind.describe(namespace, name));
        let (scope, segment_name) = (Self::scope(kind, namespace)?, segment(name)?);
        self.in_group(|group| {
            let path = crd::path(kind, group, scope, segment_name);
            let what = &what;
            async move {
                self.client
                    .delete_json(
                        what,
                        &path,
                        precondition.uid.as_deref(),
                        precondition.resource_version.as_deref(),
                    )
                    .await
            }
        })
        .await?
        .ok_or_else(|| DatastoreError::NotFound(kind.describe(namespace, name)))
    }

    fn until(&self, deadline: tokio::time::Instant) -> Option<std::sync::Arc<dyn Store>> {
        Some(std::sync::Arc::new(KubernetesStore {
            client: self.client.until(deadline),
            interface_prefix: self.interface_prefix.clone(),
            group: Arc::clone(&self.group),
            discovered: Arc::clone(&self.discovered),
        }))
    }

    fn backend(&self) -> Backend {
        Backend::Kubernetes
    }

    fn identity(&self) -> Option<String> {
        Some(format!("kubernetes {}", self.client.server()))
    }
}

/// WorkloadEndpoints are pods here: [`Endpoints`], not the resource API.
fn records_elsewhere() -> DatastoreError {
    DatastoreError::Other(
        "the Kubernetes datastore keeps WorkloadEndpoints in pods (its endpoint records)".into(),
    )
}

#[async_trait::async_trait]
impl Endpoints for KubernetesStore {
    async fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<WorkloadEndpoint>, DatastoreError> {
        self.get_endpoint(namespace, name).await
    }

    /// The pod's record, if it stands for one (addresses or a container
    /// recorded): one GET, none when the call has read the pod.
    async fn find(
        &self,
        namespace: &str,
        ids: &WepIdentifiers,
    ) -> Result<Option<WorkloadEndpoint>, DatastoreError> {
        let prefix = ids.lookup_prefix()?;
        let pod_ids = Self::pod_of(&prefix)?;
        let Some(pod) = self.client.pod_once(namespace, &pod_ids.pod).await? else {
            return Ok(None);
        };
        Ok(self
            .endpoint_of(&pod, "eth0")
            .filter(|w| {
                w.metadata.name.starts_with(&prefix)
                    && ids.name_matches_any_interface(&w.metadata.name)
            })
            .filter(|w| !w.spec.ip_networks.is_empty() || !w.spec.container_id.is_empty()))
    }

    async fn create(&self, wep: &mut WorkloadEndpoint) -> Result<WorkloadEndpoint, DatastoreError> {
        let stored = self.create_endpoint(wep.clone()).await?;
        serde_json::from_value(stored).map_err(malformed)
    }

    async fn update(&self, wep: &mut WorkloadEndpoint) -> Result<WorkloadEndpoint, DatastoreError> {
        let read_at = wep.metadata.resource_version.clone();
        if read_at.is_empty() {
            return Err(DatastoreError::Other(
                "metadata.resourceVersion is required to update a WorkloadEndpoint".into(),
            ));
        }
        let stored = self.write_endpoint(wep, &read_at).await?;
        serde_json::from_value(stored).map_err(malformed)
    }

    async fn delete(
        &self,
        namespace: &str,
        name: &str,
        precondition: &Precondition,
    ) -> Result<(), DatastoreError> {
        self.delete_endpoint(namespace, name, precondition).await
    }

    async fn all(&self) -> Result<Option<Vec<WorkloadEndpoint>>, DatastoreError> {
        Ok(None)
    }

    fn in_pods(&self) -> bool {
        true
    }
}

#[async_trait::async_trait]
impl NamespaceLabels for KubernetesStore {
    async fn namespace_labels(
        &self,
        namespace: &str,
    ) -> Result<BTreeMap<String, String>, DatastoreError> {
        match self.client.namespace(namespace).await? {
            Some(ns) => Ok(ns.metadata.labels.unwrap_or_default().into_iter().collect()),
            None => Err(DatastoreError::NotFound(format!("Namespace({namespace})"))),
        }
    }
}
