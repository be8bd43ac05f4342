//! The Kubernetes datastore (KDD): WorkloadEndpoints are not stored objects
//! but views of Pods. A lookup is one pod GET; a write is a strategic-merge
//! PATCH of the pod's `status` subresource carrying the
//! `cni.projectcalico.org/podIP`, `podIPs` and `containerID` annotations; a
//! delete clears podIP/podIPs under resourceVersion and uid preconditions.
//! ClusterInformation is the `crd.projectcalico.org/v1` object `default`.

use crate::k8s::objects::Pod;
use serde_json::json;

use super::model::{Profile, WorkloadEndpoint};
use super::names::WepIdentifiers;
use super::{Datastore, DatastoreError, Precondition};
use crate::k8s::client::{K8sClient, K8sError, PatchError};
use crate::k8s::rules::{endpoint_for_pod, pod_ip_annotations};

pub const ANNOTATION_POD_IP: &str = "cni.projectcalico.org/podIP";
pub const ANNOTATION_POD_IPS: &str = "cni.projectcalico.org/podIPs";
pub const ANNOTATION_CONTAINER_ID: &str = "cni.projectcalico.org/containerID";

/// The Kubernetes datastore of one invocation.
pub struct KubernetesStore {
    client: K8sClient,
    /// FELIX_INTERFACEPREFIX, for host veth names.
    interface_prefix: Option<String>,
}

impl From<K8sError> for DatastoreError {
    fn from(e: K8sError) -> Self {
        DatastoreError::Unavailable(e.to_string())
    }
}

/// The pod's addresses as Calico reads them: none for finished pods or
/// pods being deleted with an emptied podIP; else the status IPs, else the
/// podIPs / podIP annotations.
fn pod_ip_networks(pod: &Pod) -> Vec<String> {
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    let phase = status.phase.as_deref().unwrap_or("");
    if matches!(phase, "Failed" | "Succeeded" | "Completed") {
        return Vec::new();
    }
    if pod.metadata.deletion_timestamp.is_some()
        && annotations
            .get(ANNOTATION_POD_IP)
            .is_some_and(|v| v.is_empty())
    {
        return Vec::new();
    }
    let with_prefix = |ip: &str| {
        if ip.contains('/') {
            ip.to_string()
        } else if ip.contains(':') {
            format!("{ip}/128")
        } else {
            format!("{ip}/32")
        }
    };
    let from_status: Vec<String> = status
        .pod_ips
        .unwrap_or_default()
        .iter()
        .map(|p| with_prefix(&p.ip))
        .filter(|s| !s.is_empty())
        .collect();
    if !from_status.is_empty() {
        return from_status;
    }
    for key in [ANNOTATION_POD_IPS, ANNOTATION_POD_IP] {
        if let Some(v) = annotations.get(key).filter(|v| !v.is_empty()) {
            return v.split(',').map(|s| with_prefix(s.trim())).collect();
        }
    }
    Vec::new()
}

impl KubernetesStore {
    pub fn new(client: K8sClient, interface_prefix: Option<String>) -> KubernetesStore {
        KubernetesStore {
            client,
            interface_prefix,
        }
    }

    /// The WorkloadEndpoint a pod stands for, with `endpoint` as its
    /// interface; `None` for pods not (yet) on a node or on the host network.
    fn endpoint_of(&self, pod: &Pod, endpoint: &str) -> Option<WorkloadEndpoint> {
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
        let ids = WepIdentifiers::parse(name).map_err(|e| DatastoreError::Other(e.to_string()))?;
        if ids.orchestrator != "k8s" || ids.pod.is_empty() {
            return Err(DatastoreError::Other(format!(
                "insufficient identifiers: {name:?} names no Kubernetes pod"
            )));
        }
        Ok(ids)
    }

    async fn patch(
        &self,
        namespace: &str,
        pod: &str,
        body: serde_json::Value,
    ) -> Result<Pod, DatastoreError> {
        match self.client.patch_pod_status(namespace, pod, &body).await {
            Ok(Some(pod)) => Ok(pod),
            Ok(None) => Err(DatastoreError::NotFound(format!("Pod({namespace}/{pod})"))),
            Err(PatchError::Conflict(m)) => Err(DatastoreError::Conflict(m)),
            Err(PatchError::Other(e)) => Err(e.into()),
        }
    }

    async fn write(&self, wep: &WorkloadEndpoint) -> Result<WorkloadEndpoint, DatastoreError> {
        let ids = Self::pod_of(&wep.metadata.name)?;
        let body = pod_ip_annotations(&wep.spec.ip_networks, &wep.spec.container_id);
        let pod = self.patch(&wep.metadata.namespace, &ids.pod, body).await?;
        let mut stored = wep.clone();
        stored.metadata.resource_version = pod.metadata.resource_version.unwrap_or_default();
        stored.metadata.uid = pod.metadata.uid.unwrap_or_default();
        Ok(stored)
    }
}

#[async_trait::async_trait]
impl Datastore for KubernetesStore {
    async fn cluster_ready(&self) -> Result<bool, DatastoreError> {
        let info = self
            .client
            .calico_resource("ClusterInformation", "clusterinformations", "default")
            .await?;
        Ok(info.is_some_and(|o| o.pointer("/spec/datastoreReady") == Some(&json!(true))))
    }

    async fn get_workload_endpoint(
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

    /// A single pod GET (the "force get" of Calico's KDD lookup): the pod's
    /// endpoint if its name starts with the prefix.
    async fn list_workload_endpoints(
        &self,
        namespace: &str,
        name_prefix: &str,
    ) -> Result<Vec<WorkloadEndpoint>, DatastoreError> {
        let ids = Self::pod_of(name_prefix)?;
        let Some(pod) = self.client.pod(namespace, &ids.pod).await? else {
            return Ok(Vec::new());
        };
        Ok(self
            .endpoint_of(&pod, "eth0")
            .filter(|w| w.metadata.name.starts_with(name_prefix))
            .into_iter()
            .collect())
    }

    async fn create_workload_endpoint(
        &self,
        wep: &WorkloadEndpoint,
    ) -> Result<WorkloadEndpoint, DatastoreError> {
        self.write(wep).await
    }

    async fn update_workload_endpoint(
        &self,
        wep: &WorkloadEndpoint,
    ) -> Result<WorkloadEndpoint, DatastoreError> {
        self.write(wep).await
    }

    async fn delete_workload_endpoint(
        &self,
        namespace: &str,
        name: &str,
        precondition: Precondition,
    ) -> Result<(), DatastoreError> {
        let ids = Self::pod_of(name)?;
        let mut metadata = serde_json::Map::new();
        metadata.insert(
            "annotations".into(),
            json!({ANNOTATION_POD_IP: "", ANNOTATION_POD_IPS: ""}),
        );
        if let Some(rv) = precondition.resource_version {
            metadata.insert("resourceVersion".into(), rv.into());
        }
        if let Some(uid) = precondition.uid {
            metadata.insert("uid".into(), uid.into());
        }
        self.patch(namespace, &ids.pod, json!({ "metadata": metadata }))
            .await
            .map(|_| ())
    }

    /// Profiles are synthesised from namespaces and service accounts in KDD.
    async fn get_profile(&self, _name: &str) -> Result<Option<Profile>, DatastoreError> {
        Ok(None)
    }

    async fn create_profile(&self, profile: &Profile) -> Result<Profile, DatastoreError> {
        Err(DatastoreError::Other(format!(
            "profile {} cannot be created: profiles are read-only in the Kubernetes datastore (use policy type k8s)",
            profile.metadata.name
        )))
    }
}
