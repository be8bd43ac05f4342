//! Calico's datastore as the plugin sees it: one generic, revision-checked
//! resource API ([`Store`]) that every backend implements — the embedded
//! SQLite store ([`local`]), the Kubernetes datastore ([`kubernetes`]),
//! etcd v3 ([`etcd`]) —
//! over typed resources ([`model`]) that know where they live on each
//! backend ([`Kind`]), and the names derived from workload identity
//! ([`names`]).
//!
//! Every write is compare-and-swap: `create` fails with `AlreadyExists`,
//! `update` carries the resourceVersion it read and fails with `Conflict`
//! when the object changed since, `delete` takes resourceVersion and uid
//! preconditions. Errors keep their kind up to the CNI edge (a timeout is
//! code 11, rejected credentials code 103, the rest code 100).

pub mod endpoints;
pub mod etcd;
pub mod ipam_model;
pub mod kubernetes;
pub mod local;
pub mod model;
pub mod names;
pub mod open;

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

use model::{ClusterInformation, ObjectMeta};

/// The datastores: which one a config selects and a store is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The embedded SQLite store.
    Local,
    /// The Kubernetes API server (Calico's CRDs, pods).
    Kubernetes,
    /// etcd v3, in Calico's key layout.
    Etcd,
}

impl Backend {
    /// Whether the backend is reached through the Kubernetes API client:
    /// its token is then the datastore's credential, and whether the
    /// network can serve an ADD depends on that token outliving the
    /// readiness margin.
    pub fn through_kubernetes_api(self) -> bool {
        matches!(self, Backend::Kubernetes)
    }
}

/// Where the objects of one kind live on each backend.
#[derive(Debug)]
pub struct Kind {
    /// The v3 kind, e.g. `WorkloadEndpoint`; the SQLite key's first part.
    pub name: &'static str,
    /// The CRD plural (`crd.projectcalico.org/v1/<plural>`; v3 CRDs rename
    /// one, see `kubernetes::crd`) and the path segment of its etcd keys.
    pub plural: &'static str,
    pub namespaced: bool,
    /// How the objects are laid out on etcd.
    pub etcd: EtcdLayout,
}

/// Calico's etcd layout of a kind: v3 resources as their JSON under
/// `/calico/resources/v3/projectcalico.org/`, the IPAM objects in
/// libcalico-go's model format under `/calico/ipam/v2/` (keyed by what
/// they are about: a block by its CIDR, an affinity by node and CIDR).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtcdLayout {
    V3,
    IpamBlock,
    BlockAffinity,
    IpamHandle,
    IpamConfig,
}

impl Kind {
    /// `/calico/resources/v3/projectcalico.org/<plural>[/<namespace>]/<name>`
    pub fn v3_etcd_key(&self, namespace: &str, name: &str) -> String {
        if self.namespaced {
            format!(
                "/calico/resources/v3/projectcalico.org/{}/{namespace}/{name}",
                self.plural
            )
        } else {
            format!(
                "/calico/resources/v3/projectcalico.org/{}/{name}",
                self.plural
            )
        }
    }

    /// `Kind(ns/name)`, `Kind(name)` for error messages.
    pub fn describe(&self, namespace: &str, name: &str) -> String {
        if namespace.is_empty() {
            format!("{}({name})", self.name)
        } else {
            format!("{}({namespace}/{name})", self.name)
        }
    }
}

/// Implements [`Resource`] for a type with a `metadata` field: its
/// [`Kind`] (v3 name, plural, whether namespaced, etcd layout) and, when
/// given, the hook run before every write.
macro_rules! impl_resource {
    ($ty:ty, $kind:literal, $plural:literal, namespaced: $namespaced:literal, $etcd:ident
     $(, before_write: $hook:expr)?) => {
        impl $crate::datastore::Resource for $ty {
            const KIND: &'static $crate::datastore::Kind = &$crate::datastore::Kind {
                name: $kind,
                plural: $plural,
                namespaced: $namespaced,
                etcd: $crate::datastore::EtcdLayout::$etcd,
            };
            fn metadata(&self) -> &$crate::datastore::model::ObjectMeta {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut $crate::datastore::model::ObjectMeta {
                &mut self.metadata
            }
            $(fn before_write(&mut self) {
                let hook: fn(&mut Self) = $hook;
                hook(self)
            })?
        }
    };
}
pub(crate) use impl_resource;

/// A stored resource of one kind, with its metadata.
pub trait Resource: serde::Serialize + serde::de::DeserializeOwned + Send + Sync {
    const KIND: &'static Kind;
    fn metadata(&self) -> &ObjectMeta;
    fn metadata_mut(&mut self) -> &mut ObjectMeta;
    /// Adjusts the object before every create and update (forced labels).
    fn before_write(&mut self) {}
}

/// A datastore operation's failure. The outcomes a caller acts on (not
/// found, already there, a compare-and-swap lost) are variants of their
/// own whatever the backend; any other failure of a remote backend keeps
/// that backend's typed error as it came.
#[derive(Debug, thiserror::Error)]
pub enum DatastoreError {
    #[error("resource does not exist: {0}")]
    NotFound(String),
    #[error("resource already exists: {0}")]
    AlreadyExists(String),
    #[error("update conflict: {0}")]
    Conflict(String),
    /// The embedded store cannot be used (busy, unreadable, disk full).
    #[error("datastore unavailable: {0}")]
    Unavailable(String),
    /// The etcd cluster's failure (unreachable, timed out, credentials
    /// refused, any other answer).
    #[error(transparent)]
    Etcd(#[from] crate::etcd::EtcdError),
    /// The API server's failure other than a conflict.
    #[error(transparent)]
    Kubernetes(crate::k8s::K8sError),
    /// A record name that does not parse or cannot be made.
    #[error(transparent)]
    Name(#[from] names::NameError),
    #[error("{0}")]
    Other(String),
}

impl DatastoreError {
    /// The CNI error for this failure of `what` (e.g. "error getting
    /// WorkloadEndpoint"), keeping its kind: a timeout is "try again later"
    /// (11), rejected credentials are code 103, the rest a datastore error
    /// (100).
    pub fn context(self, what: &str) -> crate::cni::Error {
        crate::cni::Error::caused(self.kind(), what, self)
    }

    /// Which kind of failure this is for the CNI edge.
    pub fn kind(&self) -> crate::cni::error::Kind {
        use crate::cni::error::Kind;
        use crate::etcd::EtcdError;
        use crate::k8s::K8sError;
        match self {
            DatastoreError::Etcd(EtcdError::Timeout(_))
            | DatastoreError::Kubernetes(K8sError::Timeout(_)) => Kind::TimedOut,
            DatastoreError::Etcd(EtcdError::Unauthorized(_))
            | DatastoreError::Kubernetes(K8sError::Unauthorized(_)) => Kind::Unauthorized,
            _ => Kind::Datastore,
        }
    }
}

impl From<DatastoreError> for crate::cni::Error {
    fn from(e: DatastoreError) -> Self {
        crate::cni::Error::caused(e.kind(), "", e)
    }
}

/// Conditions a delete must meet; each is checked only when `Some`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Precondition {
    pub resource_version: Option<String>,
    pub uid: Option<String>,
}

impl Precondition {
    /// Exactly the object as read: its revision, and its uid when it has one.
    pub fn exactly(meta: &ObjectMeta) -> Precondition {
        Precondition {
            resource_version: Some(meta.resource_version.clone()),
            uid: Some(meta.uid.clone()).filter(|u| !u.is_empty()),
        }
    }
}

/// Which objects of a kind (in one namespace) a list returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListFilter {
    All,
    /// Names starting with this prefix.
    NamePrefix(String),
    /// Objects carrying every one of these labels with these values.
    Labels(BTreeMap<String, String>),
    /// A node's BlockAffinities carrying these labels (on etcd, the keys
    /// under the node; elsewhere, the labels alone).
    Node {
        node: String,
        labels: BTreeMap<String, String>,
    },
}

impl ListFilter {
    /// Whether an object's name and labels pass the filter.
    pub fn admits(&self, meta: &ObjectMeta) -> bool {
        match self {
            ListFilter::All => true,
            ListFilter::NamePrefix(prefix) => meta.name.starts_with(prefix.as_str()),
            ListFilter::Labels(wanted) | ListFilter::Node { labels: wanted, .. } => wanted
                .iter()
                .all(|(k, v)| meta.labels.get(k).is_some_and(|have| have == v)),
        }
    }

    /// The labels the filter asks for, if any.
    pub fn labels(&self) -> Option<&BTreeMap<String, String>> {
        match self {
            ListFilter::Labels(l) | ListFilter::Node { labels: l, .. } => Some(l),
            _ => None,
        }
    }
}

/// The resource API every backend implements, on objects in their v3 JSON
/// form (`kind`, `apiVersion: projectcalico.org/v3`, `metadata`, `spec`),
/// with `metadata.resourceVersion` the backend's revision of the object.
#[async_trait::async_trait]
pub trait Store: Send + Sync {
    /// The object, `None` when absent.
    async fn get_object(
        &self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, DatastoreError>;

    /// The object as a cache in front of the datastore may hold it (the
    /// Kubernetes API server's watch cache; an etcd member's own view), a
    /// few milliseconds behind the latest write at most, and as of now
    /// when the cache lacks it: for configuration read to decide (IPAMConfig,
    /// a node's labels), never for what a write's precondition rests on.
    async fn get_object_cached(
        &self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, DatastoreError> {
        self.get_object(kind, namespace, name).await
    }

    /// As [`Store::get_object_cached`], the cache's "absent" taken as it
    /// is: for an object whose absence means defaults (IPAMConfig, which
    /// most clusters never create), so that they do not pay a second read
    /// on every call.
    async fn get_object_cached_or_absent(
        &self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, DatastoreError> {
        self.get_object_cached(kind, namespace, name).await
    }

    /// The objects in `namespace` (`""` for cluster-scoped kinds; for a
    /// namespaced kind, every namespace) that pass `filter`, sorted by name.
    async fn list_objects(
        &self,
        kind: &'static Kind,
        namespace: &str,
        filter: &ListFilter,
    ) -> Result<Vec<Value>, DatastoreError>;

    /// As [`Store::list_objects`], certainly as of now: where lists may
    /// be served from a cache a few milliseconds behind (the Kubernetes
    /// API server's watch cache), this one is not. For an answer a stale
    /// list could make wrong (no pool for a pool just made).
    async fn list_objects_latest(
        &self,
        kind: &'static Kind,
        namespace: &str,
        filter: &ListFilter,
    ) -> Result<Vec<Value>, DatastoreError> {
        self.list_objects(kind, namespace, filter).await
    }

    /// Creates the object; `AlreadyExists` when one with its key exists.
    /// Returns it as stored (uid, creationTimestamp, resourceVersion set).
    async fn create_object(
        &self,
        kind: &'static Kind,
        object: Value,
    ) -> Result<Value, DatastoreError>;

    /// Replaces the object if its stored resourceVersion is still
    /// `metadata.resourceVersion` (required): `Conflict` when it changed,
    /// `NotFound` when it is gone.
    async fn update_object(
        &self,
        kind: &'static Kind,
        object: Value,
    ) -> Result<Value, DatastoreError>;

    /// Deletes the object: `NotFound` when absent, `Conflict` when a
    /// precondition does not hold.
    async fn delete_object(
        &self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
        precondition: &Precondition,
    ) -> Result<(), DatastoreError>;

    /// Whether this datastore writes several objects in one transaction
    /// ([`Store::write_together`]): the embedded store and etcd do; the
    /// Kubernetes API does not.
    fn writes_together(&self) -> bool {
        false
    }

    /// Whether reads made at once go to the datastore as one request (etcd:
    /// [`crate::etcd`]'s batch), so that a read that may turn out unneeded
    /// costs next to nothing when made with others.
    fn reads_together(&self) -> bool {
        false
    }

    /// Holds back the reads made at once (where [`Store::reads_together`])
    /// until the hold is dropped: reads its holder makes once a short
    /// local step is done still go with those made before it.
    fn hold_reads(&self) -> ReadsHold {
        ReadsHold::default()
    }

    /// Applies every one of `writes` or none (one transaction), each on
    /// its own precondition as [`Store::create_object`] and
    /// [`Store::update_object`] check it: the objects as stored, in order,
    /// or the first failed precondition's error (`AlreadyExists`,
    /// `Conflict`, `NotFound`) with nothing written. Only where
    /// [`Store::writes_together`]; elsewhere an error and nothing written.
    async fn write_together(&self, writes: Vec<Write>) -> Result<Vec<Value>, DatastoreError> {
        Err(DatastoreError::Other(format!(
            "this datastore writes objects one at a time, not {} together",
            writes.len()
        )))
    }

    /// The names of the objects of `kind` in `namespace`, sorted (a backend
    /// that can list keys alone does, instead of whole objects).
    async fn list_names(
        &self,
        kind: &'static Kind,
        namespace: &str,
    ) -> Result<Vec<String>, DatastoreError> {
        let objects = self.list_objects(kind, namespace, &ListFilter::All).await?;
        Ok(objects
            .iter()
            .map(|o| meta_field(o, "name").to_string())
            .collect())
    }

    /// Which datastore this is.
    fn backend(&self) -> Backend;

    /// What tells this datastore from others of its backend (the API
    /// server's URL; etcd's endpoints and cluster ID): node-local copies of
    /// its objects are kept under this name. `None`: no copies are kept
    /// (the local store, whose reads cost no round trip; etcd before a
    /// member has answered).
    fn identity(&self) -> Option<String> {
        None
    }

    /// The same store with its requests bound to `deadline` instead (a
    /// cleanup budget); `None` when this store's requests are not bound
    /// to a deadline of their own, so it serves as it is.
    fn until(&self, _deadline: tokio::time::Instant) -> Option<std::sync::Arc<dyn Store>> {
        None
    }
}

/// [`Store::hold_reads`]'s hold (nothing where reads are not batched).
#[derive(Default)]
pub struct ReadsHold(#[allow(dead_code)] Option<Box<dyn std::any::Any + Send + Sync>>);

impl ReadsHold {
    pub fn new(hold: impl std::any::Any + Send + Sync) -> ReadsHold {
        ReadsHold(Some(Box::new(hold)))
    }
}

/// One write of [`Store::write_together`], its object in v3 JSON form.
#[derive(Debug, Clone)]
pub enum Write {
    /// Created: fails with `AlreadyExists` when the key is taken.
    Create(&'static Kind, Value),
    /// Replaced on its `metadata.resourceVersion`: `Conflict` when it
    /// changed since, `NotFound` when it is gone.
    Update(&'static Kind, Value),
}

impl Write {
    /// The creation of `resource` (its write hook run).
    pub fn create<R: Resource>(resource: &mut R) -> Result<Write, DatastoreError> {
        resource.before_write();
        Ok(Write::Create(R::KIND, encode(resource)?))
    }

    /// The update of `resource` on the revision it was read at (its write
    /// hook run).
    pub fn update<R: Resource>(resource: &mut R) -> Result<Write, DatastoreError> {
        resource.before_write();
        Ok(Write::Update(R::KIND, encode(resource)?))
    }

    pub fn kind(&self) -> &'static Kind {
        match self {
            Write::Create(kind, _) | Write::Update(kind, _) => kind,
        }
    }

    pub fn object(&self) -> &Value {
        match self {
            Write::Create(_, object) | Write::Update(_, object) => object,
        }
    }

    /// `Kind(ns/name)` of the object written.
    pub fn describe(&self) -> String {
        let object = self.object();
        self.kind()
            .describe(meta_field(object, "namespace"), meta_field(object, "name"))
    }
}

/// A metadata field of a resource in its JSON form (`""` when absent).
pub fn meta_field<'a>(object: &'a Value, field: &str) -> &'a str {
    object
        .pointer(&format!("/metadata/{field}"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// A resource from its v3 JSON form.
pub fn decode<R: Resource>(value: Value) -> Result<R, DatastoreError> {
    serde_json::from_value(value)
        .map_err(|e| DatastoreError::Other(format!("stored {} is malformed: {e}", R::KIND.name)))
}

fn encode<R: Resource>(resource: &R) -> Result<Value, DatastoreError> {
    serde_json::to_value(resource)
        .map_err(|e| DatastoreError::Other(format!("encoding {}: {e}", R::KIND.name)))
}

/// The typed face of the resource API.
impl dyn Store + '_ {
    pub async fn get<R: Resource>(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<R>, DatastoreError> {
        self.get_object(R::KIND, namespace, name)
            .await?
            .map(decode)
            .transpose()
    }

    pub async fn get_cached<R: Resource>(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<R>, DatastoreError> {
        self.get_object_cached(R::KIND, namespace, name)
            .await?
            .map(decode)
            .transpose()
    }

    pub async fn get_cached_or_absent<R: Resource>(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<R>, DatastoreError> {
        self.get_object_cached_or_absent(R::KIND, namespace, name)
            .await?
            .map(decode)
            .transpose()
    }

    pub async fn list<R: Resource>(
        &self,
        namespace: &str,
        filter: &ListFilter,
    ) -> Result<Vec<R>, DatastoreError> {
        self.list_objects(R::KIND, namespace, filter)
            .await?
            .into_iter()
            .map(decode)
            .collect()
    }

    pub async fn list_latest<R: Resource>(
        &self,
        namespace: &str,
        filter: &ListFilter,
    ) -> Result<Vec<R>, DatastoreError> {
        self.list_objects_latest(R::KIND, namespace, filter)
            .await?
            .into_iter()
            .map(decode)
            .collect()
    }

    pub async fn create<R: Resource>(&self, resource: &mut R) -> Result<R, DatastoreError> {
        resource.before_write();
        decode(self.create_object(R::KIND, encode(resource)?).await?)
    }

    pub async fn update<R: Resource>(&self, resource: &mut R) -> Result<R, DatastoreError> {
        resource.before_write();
        decode(self.update_object(R::KIND, encode(resource)?).await?)
    }

    pub async fn delete<R: Resource>(
        &self,
        namespace: &str,
        name: &str,
        precondition: &Precondition,
    ) -> Result<(), DatastoreError> {
        self.delete_object(R::KIND, namespace, name, precondition)
            .await
    }

    /// Deletes a cluster-scoped resource exactly as read (see
    /// [`Precondition::exactly`]); gone already is fine.
    pub async fn delete_as_read<R: Resource>(&self, resource: &R) -> Result<(), DatastoreError> {
        let meta = resource.metadata();
        match self
            .delete::<R>("", &meta.name, &Precondition::exactly(meta))
            .await
        {
            Ok(()) | Err(DatastoreError::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Deletes a cluster-scoped resource softly, as Calico's IPAM does:
    /// `mark` applied and written on the revision read (readers then skip
    /// it), then deleted on the revision that wrote.
    pub async fn soft_delete<R: Resource>(
        &self,
        resource: &mut R,
        mark: impl FnOnce(&mut R),
    ) -> Result<(), DatastoreError> {
        mark(resource);
        let marked = self.update(resource).await?;
        self.delete_as_read(&marked).await
    }

    /// ClusterInformation `default` has spec.datastoreReady == true (an
    /// absent object or field is "not ready"), as the datastore's cache
    /// holds it: the flag holds new calls off while a migration runs, and
    /// the migration gives calls in flight seconds to finish after setting
    /// it (`calico-ipam -upgrade`: 5 s), against the cache's milliseconds.
    pub async fn cluster_ready(&self) -> Result<bool, DatastoreError> {
        let info = self
            .get_cached::<ClusterInformation>("", ClusterInformation::NAME)
            .await?;
        Ok(info.and_then(|i| i.spec.datastore_ready) == Some(true))
    }
}

/// `time` as RFC 3339 in UTC with whole seconds, e.g. `2026-11-30T01:02:03Z`.
pub fn rfc3339_utc(time: SystemTime) -> String {
    // Times before 1970 do not occur for "now"; clamp rather than fail.
    let secs = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    jiff::Timestamp::from_second(i64::try_from(secs).unwrap_or(i64::MAX))
        .unwrap_or(jiff::Timestamp::MAX)
        .to_string()
}

/// `time` in Go's default format in UTC, as Calico's allocation
/// timestamps are written: `2026-11-30 01:02:03.123456789 +0000 UTC`
/// (fractional seconds without trailing zeros, none when whole).
pub fn go_time_utc(time: SystemTime) -> String {
    let at = jiff::Timestamp::try_from(time).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    at.strftime("%Y-%m-%d %H:%M:%S%.f +0000 UTC").to_string()
}

/// A random (version 4) UUID in its hyphenated form.
pub(crate) fn random_uuid() -> Result<String, DatastoreError> {
    Ok(uuid::Uuid::new_v4().hyphenated().to_string())
}

/// A random 32-hex-digit identifier (Calico's clusterGUID format).
pub(crate) fn random_guid() -> Result<String, DatastoreError> {
    Ok(uuid::Uuid::new_v4().simple().to_string())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn formats_rfc3339() {
        let at = |secs| rfc3339_utc(UNIX_EPOCH + Duration::from_secs(secs));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_709_251_199), "2024-02-29T23:59:59Z");
        assert_eq!(at(1_796_000_523), "2026-11-30T01:02:03Z");
        assert_eq!(at(4_107_542_400), "2100-03-01T00:00:00Z");
        let go = |secs, nanos| go_time_utc(UNIX_EPOCH + Duration::new(secs, nanos));
        assert_eq!(go(1_796_000_523, 0), "2026-11-30 01:02:03 +0000 UTC");
        assert_eq!(
            go(1_796_000_523, 437_945_770),
            "2026-11-30 01:02:03.43794577 +0000 UTC"
        );
    }

    #[test]
    fn uuids_are_v4_and_distinct() {
        let a = random_uuid().unwrap();
        let b = random_uuid().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        let groups: Vec<&str> = a.split('-').collect();
        assert_eq!(
            groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(groups[2].starts_with('4'));
        assert!(matches!(groups[3].as_bytes()[0], b'8' | b'9' | b'a' | b'b'));
        assert_eq!(random_guid().unwrap().len(), 32);
    }

    #[test]
    fn converts_to_cni_error_keeping_the_kind() {
        let e: crate::cni::Error = DatastoreError::NotFound("Profile(net1)".into()).into();
        assert_eq!(e.code(), crate::cni::error::code::DATASTORE);
        assert_eq!(e.to_string(), "resource does not exist: Profile(net1)");
        let e = DatastoreError::Etcd(crate::etcd::EtcdError::Timeout("no answer".into()))
            .context("error getting X");
        assert_eq!(e.code(), crate::cni::error::code::TRY_AGAIN_LATER);
        assert_eq!(e.to_string(), "error getting X: no answer");
        let e = DatastoreError::Kubernetes(crate::k8s::K8sError::Unauthorized("rejected".into()))
            .context("error getting X");
        assert_eq!(e.code(), crate::cni::error::code::UNAUTHORIZED);
        let e = DatastoreError::Conflict("WorkloadEndpoint(a/b)".into()).context("error updating");
        assert_eq!(e.code(), crate::cni::error::code::DATASTORE);
    }

    #[test]
    fn list_filters() {
        let mut meta = ObjectMeta::named("ns", "node1-k8s-pod-eth0");
        meta.labels.insert("a".into(), "1".into());
        assert!(ListFilter::All.admits(&meta));
        assert!(ListFilter::NamePrefix("node1-k8s-".into()).admits(&meta));
        assert!(!ListFilter::NamePrefix("node2".into()).admits(&meta));
        let labels = |k: &str, v: &str| ListFilter::Labels(BTreeMap::from([(k.into(), v.into())]));
        assert!(labels("a", "1").admits(&meta));
        assert!(!labels("a", "2").admits(&meta));
        assert!(!labels("b", "1").admits(&meta));
    }
}
