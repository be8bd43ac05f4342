//! The objects the plugin reads and patches through the client: the pod
//! (read once per call and remembered), its namespace, the node, the pods
//! on a node, a Calico CRD object, the API groups served.

use serde_json::Value;

use super::requests::query_escape;
use super::{CALICO_CRD_GROUP, CALICO_CRD_VERSION, Freshness, K8sClient, K8sError, segment};
use crate::k8s::objects::{Namespace, Node, Pod};

impl K8sClient {
    pub async fn pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, K8sError> {
        self.read_pod(namespace, name, false).await
    }

    /// [`K8sClient::pod`] as the API server's watch cache holds it (the
    /// kubelet that runs the call learnt of the pod from a watch the cache
    /// serves). A write on the pod carries the resourceVersion read, so a
    /// stale read makes that write fail and read again.
    pub async fn pod_cached(&self, namespace: &str, name: &str) -> Result<Option<Pod>, K8sError> {
        self.read_pod(namespace, name, true).await
    }

    /// The pod, remembered for the rest of the call.
    async fn read_pod(
        &self,
        namespace: &str,
        name: &str,
        cached: bool,
    ) -> Result<Option<Pod>, K8sError> {
        let path = format!(
            "/api/v1/namespaces/{}/pods/{}",
            segment(namespace)?,
            segment(name)?
        );
        let what = format!("error getting pod {namespace}/{name}");
        let pod = self.get(&what, &path, Freshness::cached(cached)).await?;
        self.remember(namespace, name, pod.as_ref());
        Ok(pod)
    }

    /// The pod as this call read it, else read now.
    pub async fn pod_once(&self, namespace: &str, name: &str) -> Result<Option<Pod>, K8sError> {
        match self.cached_pod(namespace, name) {
            Some(pod) => Ok(Some(pod)),
            None => self.pod(namespace, name).await,
        }
    }

    /// A namespace, for its labels and annotations (never written here):
    /// as the watch cache holds it.
    pub async fn namespace(&self, name: &str) -> Result<Option<Namespace>, K8sError> {
        let path = format!("/api/v1/namespaces/{}", segment(name)?);
        self.get(
            &format!("error getting namespace {name}"),
            &path,
            Freshness::Cached,
        )
        .await
    }

    /// A node; `cached`: as the watch cache holds it (its labels and pod
    /// CIDRs for a decision, no write).
    pub async fn node(&self, name: &str, cached: bool) -> Result<Option<Node>, K8sError> {
        let path = format!("/api/v1/nodes/{}", segment(name)?);
        self.get(
            &format!("error getting node {name}"),
            &path,
            Freshness::cached(cached),
        )
        .await
    }

    /// Every pod bound to `node`, in all namespaces.
    pub async fn pods_on_node(&self, node: &str) -> Result<Vec<Pod>, K8sError> {
        let path = format!(
            "/api/v1/pods?fieldSelector={}",
            query_escape(&format!("spec.nodeName={node}"))
        );
        let what = format!("error listing the pods of node {node}");
        let list: Option<Value> = self
            .call(&what, Self::request(http::Method::GET, &path, None, None))
            .await?;
        let items = list
            .and_then(|mut l| l.get_mut("items").map(Value::take))
            .unwrap_or(Value::Array(Vec::new()));
        serde_json::from_value(items).map_err(|e| K8sError::Api(format!("{what}: {e}")))
    }

    /// Merge PATCH of a node's annotations; `Ok(None)` when it does not exist.
    pub async fn annotate_node(
        &self,
        name: &str,
        annotations: &serde_json::Map<String, Value>,
    ) -> Result<Option<Node>, K8sError> {
        let path = format!("/api/v1/nodes/{}", segment(name)?);
        let what = format!("error annotating node {name}");
        let patch = serde_json::json!({"metadata": {"annotations": annotations}});
        let request = Self::request(
            http::Method::PATCH,
            &path,
            Some("application/merge-patch+json"),
            Some(&patch),
        );
        self.call(&what, request).await
    }

    /// Strategic-merge PATCH of a pod's `status` subresource; `Ok(None)`
    /// when the pod does not exist. A 409 (a failed resourceVersion or uid
    /// precondition) is [`K8sError::Conflict`].
    pub async fn patch_pod_status(
        &self,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> Result<Option<Pod>, K8sError> {
        let path = format!(
            "/api/v1/namespaces/{}/pods/{}/status",
            segment(namespace)?,
            segment(name)?
        );
        let what = format!("error patching pod {namespace}/{name}");
        let request = Self::request(
            http::Method::PATCH,
            &path,
            Some("application/strategic-merge-patch+json"),
            Some(patch),
        );
        let patched: Option<Pod> = self.call(&what, request).await?;
        self.remember(namespace, name, patched.as_ref());
        Ok(patched)
    }

    /// One cluster-scoped Calico CRD object (crd.projectcalico.org/v1), as JSON.
    pub async fn calico_resource(
        &self,
        kind: &str,
        plural: &str,
        name: &str,
    ) -> Result<Option<Value>, K8sError> {
        let path = format!(
            "/apis/{CALICO_CRD_GROUP}/{CALICO_CRD_VERSION}/{plural}/{}",
            segment(name)?
        );
        self.get_json(&format!("error getting {kind}({name})"), &path)
            .await
    }

    /// The API groups the server serves (`/apis`).
    pub async fn served_groups(&self) -> Result<Vec<String>, K8sError> {
        let list: Option<Value> = self
            .call(
                "error discovering the API groups",
                Self::request(http::Method::GET, "/apis", None, None),
            )
            .await?;
        Ok(list
            .as_ref()
            .and_then(|l| l.get("groups"))
            .and_then(Value::as_array)
            .map(|groups| {
                groups
                    .iter()
                    .filter_map(|g| g.get("name").and_then(Value::as_str))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default())
    }
}
