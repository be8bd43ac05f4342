//! The endpoint records: where a workload's WorkloadEndpoint is kept,
//! behind one trait ([`Endpoints`]), because the backends keep it
//! differently. The embedded store and etcd store the object itself
//! ([`StoredEndpoints`], on the resource API); the Kubernetes datastore
//! keeps it in the pod (its status annotations: `super::kubernetes`).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::model::WorkloadEndpoint;
use super::names::WepIdentifiers;
use super::{DatastoreError, ListFilter, Precondition, Store};

/// A workload's endpoint records, on one backend.
#[async_trait::async_trait]
pub trait Endpoints: Send + Sync {
    /// The record called `name` in `namespace` as it is now, `None` when
    /// absent.
    async fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<WorkloadEndpoint>, DatastoreError>;

    /// The record of the workload `ids` names, on whichever interface it
    /// was made for (its name prefix, then Calico's NameMatches); it may be
    /// as this call last read it.
    async fn find(
        &self,
        namespace: &str,
        ids: &WepIdentifiers,
    ) -> Result<Option<WorkloadEndpoint>, DatastoreError>;

    /// Creates the record; `AlreadyExists` when the workload has one.
    async fn create(&self, wep: &mut WorkloadEndpoint) -> Result<WorkloadEndpoint, DatastoreError>;

    /// Replaces the record on the revision it carries (`Conflict` when it
    /// changed since).
    async fn update(&self, wep: &mut WorkloadEndpoint) -> Result<WorkloadEndpoint, DatastoreError>;

    /// Deletes the record under `precondition`; `NotFound` when absent.
    async fn delete(
        &self,
        namespace: &str,
        name: &str,
        precondition: &Precondition,
    ) -> Result<(), DatastoreError>;

    /// Every record of every namespace, or `None` when the backend cannot
    /// list them (the Kubernetes datastore: the CNI may not list pods).
    async fn all(&self) -> Result<Option<Vec<WorkloadEndpoint>>, DatastoreError>;

    /// Whether the records live in the workloads' pods (an ADD then reads
    /// the pod anyway, and the record's revision is the pod's).
    fn in_pods(&self) -> bool {
        false
    }
}

/// The labels of namespaces, where the backend can read them (pool
/// namespaceSelectors match them).
#[async_trait::async_trait]
pub trait NamespaceLabels: Send + Sync {
    async fn namespace_labels(
        &self,
        namespace: &str,
    ) -> Result<BTreeMap<String, String>, DatastoreError>;
}

/// Records stored as objects of the resource API (the embedded store,
/// etcd).
pub struct StoredEndpoints {
    store: Arc<dyn Store>,
}

impl StoredEndpoints {
    pub fn new(store: Arc<dyn Store>) -> StoredEndpoints {
        StoredEndpoints { store }
    }
}

#[async_trait::async_trait]
impl Endpoints for StoredEndpoints {
    async fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<WorkloadEndpoint>, DatastoreError> {
        self.store.get(namespace, name).await
    }

    async fn find(
        &self,
        namespace: &str,
        ids: &WepIdentifiers,
    ) -> Result<Option<WorkloadEndpoint>, DatastoreError> {
        let prefix = ids.lookup_prefix()?;
        Ok(self
            .store
            .list::<WorkloadEndpoint>(namespace, &ListFilter::NamePrefix(prefix))
            .await?
            .into_iter()
            .find(|w| ids.name_matches_any_interface(&w.metadata.name)))
    }

    async fn create(&self, wep: &mut WorkloadEndpoint) -> Result<WorkloadEndpoint, DatastoreError> {
        self.store.create(wep).await
    }

    async fn update(&self, wep: &mut WorkloadEndpoint) -> Result<WorkloadEndpoint, DatastoreError> {
        self.store.update(wep).await
    }

    async fn delete(
        &self,
        namespace: &str,
        name: &str,
        precondition: &Precondition,
    ) -> Result<(), DatastoreError> {
        self.store
            .delete::<WorkloadEndpoint>(namespace, name, precondition)
            .await
    }

    async fn all(&self) -> Result<Option<Vec<WorkloadEndpoint>>, DatastoreError> {
        self.store.list("", &ListFilter::All).await.map(Some)
    }
}
