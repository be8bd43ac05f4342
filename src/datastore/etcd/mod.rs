//! The etcd v3 datastore: Calico's keys and values ([`codec`]) on an etcd
//! cluster, every write a transaction compared on the key's mod_revision
//! (or, for a create, on its version being 0). resourceVersion is the
//! key's mod_revision, as in Calico.

pub mod codec;

use std::time::SystemTime;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::{
    DatastoreError, Kind, ListFilter, Precondition, Store, Write, meta_field, random_uuid,
    rfc3339_utc,
};
use crate::etcd::{Compare, EtcdClient, Op, OpResponse, Read, Txn};

/// Calico's objects on an etcd v3 cluster.
pub struct EtcdStore {
    client: EtcdClient,
}

impl EtcdStore {
    pub fn new(client: EtcdClient) -> EtcdStore {
        EtcdStore { client }
    }

    /// The cluster's status (for `calico -t`).
    pub async fn status(&self) -> Result<String, DatastoreError> {
        Ok(self.client.status().await?)
    }

    fn decode_one(
        kind: &Kind,
        kv: &crate::etcd::KeyValue,
    ) -> Result<Option<Value>, DatastoreError> {
        codec::decode(kind, kv)
    }
}

fn set_meta(object: &mut Value, field: &str, value: Value) -> Result<(), DatastoreError> {
    let meta = object
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| DatastoreError::Other("object without metadata".into()))?;
    meta.insert(field.to_string(), value);
    Ok(())
}

fn revision_of(object: &Value, kind: &Kind) -> Result<i64, DatastoreError> {
    let rv = meta_field(object, "resourceVersion");
    rv.parse().map_err(|_| {
        DatastoreError::Other(format!(
            "{} update without a valid resourceVersion ({rv:?})",
            kind.name
        ))
    })
}

/// How long one write waits for its answer before it is sent again. A
/// write proposed through a member whose leader has just died is lost with
/// that leader, and etcd answers it only at its own request timeout (7 s
/// by default; etcd-io/etcd#5214), past a call's deadline, while electing
/// a new leader takes a second or two. Every write here is a
/// compare-and-swap, so sending one again is safe: one that was applied
/// after all fails its compare the second time, and is then recognised by
/// what the key holds.
const WRITE_ATTEMPT: std::time::Duration = std::time::Duration::from_secs(2);

impl EtcdStore {
    /// Runs `txn`, sent again each time an attempt goes [`WRITE_ATTEMPT`]
    /// unanswered, until the call's deadline; also says whether an attempt
    /// went unanswered (it may have been applied).
    async fn txn_settled(
        &self,
        txn: &Txn,
    ) -> Result<(crate::etcd::TxnResponse, bool), DatastoreError> {
        let deadline = self.client.deadline();
        let mut unanswered = false;
        loop {
            let until = deadline.min(Instant::now() + WRITE_ATTEMPT);
            match self.client.until(until).txn(txn).await {
                Ok(answer) => return Ok((answer, unanswered)),
                Err(crate::etcd::EtcdError::Timeout(e)) if until < deadline => {
                    tracing::info!("an etcd write went unanswered ({e}); sending it again");
                    unanswered = true;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Writes every one of `puts` in one transaction when each one's
    /// compare holds: the objects as stored (their resourceVersion the
    /// revision that wrote them), or, when a compare failed, the writes and
    /// the answer (with every key as it is, when `read_back`).
    async fn puts_if(
        &self,
        puts: Vec<Put>,
        read_back: bool,
    ) -> Result<Result<Vec<Value>, (Vec<Put>, crate::etcd::TxnResponse)>, DatastoreError> {
        let mut txn = Txn::default();
        for put in &puts {
            txn.compare.push(put.compare());
            txn.success
                .push(Op::Put(put.key.clone(), put.value.clone()));
            if read_back {
                txn.failure.push(Op::Get(put.key.clone()));
            }
        }
        let (answer, unanswered) = self.txn_settled(&txn).await?;
        let revisions = if answer.succeeded {
            vec![answer.revision; puts.len()]
        } else {
            // An earlier attempt, unanswered, may have been the one applied:
            // then every key holds exactly what it wrote.
            let mut applied = Vec::new();
            if unanswered {
                for put in &puts {
                    match self.client.get(&put.key).await? {
                        Some(kv) if kv.value == put.value => applied.push(kv.mod_revision),
                        _ => break,
                    }
                }
            }
            if applied.len() < puts.len() {
                return Ok(Err((puts, answer)));
            }
            applied
        };
        let mut stored = Vec::with_capacity(puts.len());
        for (put, revision) in puts.into_iter().zip(revisions) {
            let mut object = put.object;
            set_meta(&mut object, "resourceVersion", json!(revision.to_string()))?;
            stored.push(object);
        }
        Ok(Ok(stored))
    }
}

/// One object's write in a transaction, encoded once: its key and value,
/// and the revision an update is compared on (`None`: a create, compared
/// on the key having no version).
struct Put {
    kind: &'static Kind,
    object: Value,
    key: String,
    value: Vec<u8>,
    revision: Option<i64>,
}

impl Put {
    /// A creation (a v3 resource's uid and creationTimestamp set).
    fn create(kind: &'static Kind, mut object: Value) -> Result<Put, DatastoreError> {
        if kind.etcd == super::EtcdLayout::V3 {
            set_meta(&mut object, "uid", json!(random_uuid()?))?;
            set_meta(
                &mut object,
                "creationTimestamp",
                json!(rfc3339_utc(SystemTime::now())),
            )?;
        }
        let (key, value) = codec::encode(kind, &object)?;
        Ok(Put {
            kind,
            object,
            key,
            value,
            revision: None,
        })
    }

    /// An update on the revision the object was read at.
    fn update(kind: &'static Kind, object: Value) -> Result<Put, DatastoreError> {
        let revision = revision_of(&object, kind)?;
        let (key, value) = codec::encode(kind, &object)?;
        Ok(Put {
            kind,
            object,
            key,
            value,
            revision: Some(revision),
        })
    }

    fn compare(&self) -> Compare {
        match self.revision {
            None => Compare::Version(self.key.clone(), 0),
            Some(r) => Compare::ModRevision(self.key.clone(), r),
        }
    }

    /// `Kind(ns/name)` of the object.
    fn describe(&self) -> String {
        self.kind.describe(
            meta_field(&self.object, "namespace"),
            meta_field(&self.object, "name"),
        )
    }

    /// Why this write, in a transaction that failed, failed, from its key
    /// as the failure branch read it; `None` when its compare held.
    fn refusal(&self, read: Option<&OpResponse>) -> Option<DatastoreError> {
        let current = match read {
            Some(OpResponse::Get(kv)) => kv.as_ref(),
            _ => None,
        };
        match (self.revision, current) {
            (None, Some(_)) => Some(DatastoreError::AlreadyExists(self.describe())),
            (None, None) => None,
            (Some(_), None) => Some(DatastoreError::NotFound(self.describe())),
            (Some(r), Some(kv)) if kv.mod_revision != r => Some(DatastoreError::Conflict(format!(
                "{} is at revision {}, not {r}",
                self.describe(),
                kv.mod_revision
            ))),
            (Some(_), Some(_)) => None,
        }
    }
}

impl EtcdStore {
    /// Every write in one transaction (see [`Store::write_together`]);
    /// a create alone skips reading its key back (its only refusal is
    /// that the key exists).
    async fn write_all(&self, puts: Vec<Put>) -> Result<Vec<Value>, DatastoreError> {
        let read_back = !(puts.len() == 1 && puts[0].revision.is_none());
        match self.puts_if(puts, read_back).await? {
            Ok(stored) => Ok(stored),
            Err((puts, answer)) => {
                let refused = puts
                    .iter()
                    .enumerate()
                    .find_map(|(i, put)| put.refusal(answer.responses.get(i)));
                Err(refused.unwrap_or_else(|| match puts.as_slice() {
                    [put] if put.revision.is_none() => {
                        DatastoreError::AlreadyExists(put.describe())
                    }
                    [put] => DatastoreError::Conflict(put.describe()),
                    _ => DatastoreError::Conflict("a write of several objects was refused".into()),
                }))
            }
        }
    }
}

impl EtcdStore {
    /// The object as the member that answers has it (a serializable
    /// read); `None` when that member has no such key.
    async fn read_local(
        &self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Option<Value>>, DatastoreError> {
        let key = codec::key_of(kind, namespace, name)?;
        match self.client.get_local(&key).await? {
            Some(kv) => Self::decode_one(kind, &kv).map(Some),
            None => Ok(None),
        }
    }

    async fn list_read(
        &self,
        kind: &'static Kind,
        namespace: &str,
        filter: &ListFilter,
        read: Read,
    ) -> Result<Vec<Value>, DatastoreError> {
        let prefix = codec::list_prefix(kind, namespace, filter);
        let kvs = if prefix.ends_with('/') || matches!(filter, ListFilter::NamePrefix(_)) {
            match read {
                Read::Serializable => self.client.list_local(&prefix).await?,
                Read::Linearizable => self.client.list(&prefix, false).await?,
            }
        } else {
            self.client.get(&prefix).await?.into_iter().collect()
        };
        let mut objects = Vec::with_capacity(kvs.len());
        for kv in &kvs {
            let Some(object) = Self::decode_one(kind, kv)? else {
                continue;
            };
            let meta: super::model::ObjectMeta = serde_json::from_value(object["metadata"].clone())
                .map_err(|e| {
                    DatastoreError::Other(format!("malformed metadata at {}: {e}", kv.key))
                })?;
            if filter.admits(&meta) {
                objects.push(object);
            }
        }
        objects.sort_by(|a, b| meta_field(a, "name").cmp(meta_field(b, "name")));
        Ok(objects)
    }
}

#[async_trait::async_trait]
impl Store for EtcdStore {
    async fn get_object(
        &self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, DatastoreError> {
        let key = codec::key_of(kind, namespace, name)?;
        let found = self.client.get(&key).await?;
        found.map_or(Ok(None), |kv| Self::decode_one(kind, &kv))
    }

    /// As the member that answers has it (a serializable read: no round
    /// to the leader), and as of now when that member lacks it.
    async fn get_object_cached(
        &self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, DatastoreError> {
        match self.read_local(kind, namespace, name).await? {
            Some(object) => Ok(object),
            None => self.get_object(kind, namespace, name).await,
        }
    }

    async fn get_object_cached_or_absent(
        &self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, DatastoreError> {
        Ok(self.read_local(kind, namespace, name).await?.flatten())
    }

    /// As the member that answers has them (a serializable read, as the
    /// API server's watch cache serves the Kubernetes datastore's lists).
    async fn list_objects(
        &self,
        kind: &'static Kind,
        namespace: &str,
        filter: &ListFilter,
    ) -> Result<Vec<Value>, DatastoreError> {
        self.list_read(kind, namespace, filter, Read::Serializable)
            .await
    }

    async fn list_objects_latest(
        &self,
        kind: &'static Kind,
        namespace: &str,
        filter: &ListFilter,
    ) -> Result<Vec<Value>, DatastoreError> {
        self.list_read(kind, namespace, filter, Read::Linearizable)
            .await
    }

    async fn create_object(
        &self,
        kind: &'static Kind,
        object: Value,
    ) -> Result<Value, DatastoreError> {
        let stored = self.write_all(vec![Put::create(kind, object)?]).await?;
        Ok(stored.into_iter().next().unwrap_or_default())
    }

    async fn update_object(
        &self,
        kind: &'static Kind,
        object: Value,
    ) -> Result<Value, DatastoreError> {
        let stored = self.write_all(vec![Put::update(kind, object)?]).await?;
        Ok(stored.into_iter().next().unwrap_or_default())
    }

    fn writes_together(&self) -> bool {
        true
    }

    fn reads_together(&self) -> bool {
        true
    }

    fn hold_reads(&self) -> super::ReadsHold {
        super::ReadsHold::new(self.client.hold_reads())
    }

    async fn write_together(&self, writes: Vec<Write>) -> Result<Vec<Value>, DatastoreError> {
        let puts = writes
            .into_iter()
            .map(|write| match write {
                Write::Create(kind, object) => Put::create(kind, object),
                Write::Update(kind, object) => Put::update(kind, object),
            })
            .collect::<Result<Vec<Put>, DatastoreError>>()?;
        self.write_all(puts).await
    }

    async fn delete_object(
        &self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
        precondition: &Precondition,
    ) -> Result<(), DatastoreError> {
        let key = codec::key_of(kind, namespace, name)?;
        let what = kind.describe(namespace, name);
        // The revision the delete is compared on: the one required, else
        // the one read (so that a uid checked is the uid deleted).
        let revision = match (&precondition.resource_version, &precondition.uid) {
            (Some(rv), None) => Some(rv.parse::<i64>().map_err(|_| {
                DatastoreError::Other(format!("{what}: invalid resourceVersion {rv:?}"))
            })?),
            (rv, Some(uid)) => {
                let Some(kv) = self.client.get(&key).await? else {
                    return Err(DatastoreError::NotFound(what));
                };
                let current = Self::decode_one(kind, &kv)?.unwrap_or(Value::Null);
                let stored_uid = meta_field(&current, "uid");
                if !stored_uid.is_empty() && stored_uid != uid {
                    return Err(DatastoreError::Conflict(format!(
                        "{what} has uid {stored_uid}, not {uid}"
                    )));
                }
                if let Some(rv) = rv
                    && rv != &kv.mod_revision.to_string()
                {
                    return Err(DatastoreError::Conflict(format!(
                        "{what} is at revision {}, not {rv}",
                        kv.mod_revision
                    )));
                }
                Some(kv.mod_revision)
            }
            (None, None) => None,
        };
        let (answer, unanswered) = self
            .txn_settled(&Txn {
                compare: revision
                    .map(|r| Compare::ModRevision(key.clone(), r))
                    .into_iter()
                    .collect(),
                success: vec![Op::Delete(key.clone())],
                failure: vec![Op::Get(key.clone())],
            })
            .await?;
        match (answer.succeeded, answer.responses.first()) {
            (true, Some(OpResponse::Delete(n))) if *n > 0 => Ok(()),
            // Gone: deleted by an earlier attempt whose answer was lost.
            (true, _) | (false, Some(OpResponse::Get(None)) | None) if unanswered => Ok(()),
            (true, _) => Err(DatastoreError::NotFound(what)),
            (false, Some(OpResponse::Get(Some(kv)))) => Err(DatastoreError::Conflict(format!(
                "{what} is at revision {}, not {}",
                kv.mod_revision,
                revision.unwrap_or_default()
            ))),
            (false, _) => Err(DatastoreError::NotFound(what)),
        }
    }

    async fn list_names(
        &self,
        kind: &'static Kind,
        namespace: &str,
    ) -> Result<Vec<String>, DatastoreError> {
        let prefix = codec::list_prefix(kind, namespace, &ListFilter::All);
        let kvs = self.client.list(&prefix, true).await?;
        let mut names: Vec<String> = kvs
            .iter()
            .filter_map(|kv| codec::name_of_key(kind, &kv.key))
            .collect();
        names.sort();
        Ok(names)
    }

    fn backend(&self) -> super::Backend {
        super::Backend::Etcd
    }

    /// The endpoints and the cluster's ID (a cluster rebuilt on the same
    /// endpoints starts its revisions again: a copy of the old one's block
    /// could match a new block's revision). `None` until a member has
    /// answered.
    fn identity(&self) -> Option<String> {
        let cluster = self.client.cluster_id()?;
        Some(format!(
            "etcdv3 {} cluster {cluster}",
            self.client.endpoints().join(",")
        ))
    }

    fn until(&self, deadline: Instant) -> Option<std::sync::Arc<dyn Store>> {
        Some(std::sync::Arc::new(EtcdStore {
            client: self.client.until(deadline),
        }))
    }
}
