//! The rows: objects read (one, or a list by name prefix or labels) and
//! written (create, compare-and-swap update, delete with preconditions,
//! several in one transaction), each write taking the next revision of
//! the one counter.

use std::time::SystemTime;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde_json::Value;

use crate::datastore::model::ObjectMeta;
use crate::datastore::{
    DatastoreError, Kind, ListFilter, Precondition, Resource, Write, meta_field, random_uuid,
    rfc3339_utc,
};

/// The namespace a kind's objects are keyed by: `""` for cluster-scoped ones.
pub(super) fn scoped<'a>(kind: &Kind, namespace: &'a str) -> &'a str {
    if kind.namespaced { namespace } else { "" }
}

pub(super) fn to_value<R: Resource>(resource: &R) -> Result<Value, DatastoreError> {
    serde_json::to_value(resource)
        .map_err(|e| DatastoreError::Other(format!("encoding {}: {e}", R::KIND.name)))
}

pub(super) fn set_meta(object: &mut Value, field: &str, value: &str) -> Result<(), DatastoreError> {
    let metadata = object
        .as_object_mut()
        .ok_or_else(|| DatastoreError::Other("a resource must be a JSON object".into()))?
        .entry("metadata")
        .or_insert_with(|| Value::Object(Default::default()));
    let metadata = metadata
        .as_object_mut()
        .ok_or_else(|| DatastoreError::Other("metadata must be a JSON object".into()))?;
    if value.is_empty() {
        metadata.remove(field);
    } else {
        metadata.insert(field.to_string(), Value::String(value.to_string()));
    }
    Ok(())
}

pub(super) fn decode(
    kind: &Kind,
    namespace: &str,
    name: &str,
    revision: i64,
    value: &str,
) -> Result<Value, DatastoreError> {
    let mut object: Value = serde_json::from_str(value).map_err(|e| {
        DatastoreError::Other(format!(
            "stored {} is malformed: {e}",
            kind.describe(namespace, name)
        ))
    })?;
    set_meta(&mut object, "resourceVersion", &revision.to_string())?;
    Ok(object)
}

pub(super) fn get(
    conn: &Connection,
    kind: &Kind,
    namespace: &str,
    name: &str,
) -> Result<Option<Value>, DatastoreError> {
    let row = conn
        .prepare_cached(
            "SELECT revision, value FROM resources WHERE kind = ?1 AND namespace = ?2 AND name = ?3",
        )?
        .query_row(params![kind.name, namespace, name], |row| {
            Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?))
        })
        .optional()?;
    row.map(|(revision, value)| decode(kind, namespace, name, revision, &value))
        .transpose()
}

/// Objects of `kind` in `namespace` that pass `filter`, sorted by name (byte order).
pub(super) fn list(
    conn: &Connection,
    kind: &Kind,
    namespace: &str,
    filter: &ListFilter,
) -> Result<Vec<Value>, DatastoreError> {
    let prefix = match filter {
        ListFilter::NamePrefix(p) => p.as_str(),
        _ => "",
    };
    // `name >= prefix` lets SQLite range-scan the primary key; the substr
    // test is exact (no LIKE wildcards to escape).
    // A namespaced kind listed in namespace "" is listed in every one, and
    // only then are the rows sorted: in one namespace (a cluster-scoped
    // kind's is "") the primary key's order is the name's, and a sort
    // would cost an ephemeral b-tree, set up and torn down for each list.
    let every = kind.namespaced && namespace.is_empty();
    let mut statement = conn.prepare_cached(if every {
        "SELECT namespace, name, revision, value FROM resources
         WHERE kind = ?1 AND name >= ?2 AND substr(name, 1, length(?2)) = ?2
         ORDER BY name, namespace"
    } else {
        "SELECT namespace, name, revision, value FROM resources
         WHERE kind = ?1 AND name >= ?2 AND substr(name, 1, length(?2)) = ?2
           AND namespace = ?3
         ORDER BY kind, namespace, name"
    })?;
    let columns = |row: &rusqlite::Row<'_>| {
        Ok((
            row.get::<_, String>(0)?,
            row.get::<_, String>(1)?,
            row.get::<_, i64>(2)?,
            row.get::<_, String>(3)?,
        ))
    };
    let rows = if every {
        statement.query_map(params![kind.name, prefix], columns)?
    } else {
        statement.query_map(params![kind.name, prefix, namespace], columns)?
    };
    let mut found = Vec::new();
    for row in rows {
        let (namespace, name, revision, value) = row?;
        let object = decode(kind, &namespace, &name, revision, &value)?;
        if filter.labels().is_some() {
            let meta: ObjectMeta = serde_json::from_value(object["metadata"].clone())
                .map_err(|e| DatastoreError::Other(format!("stored metadata is malformed: {e}")))?;
            if !filter.admits(&meta) {
                continue;
            }
        }
        found.push(object);
    }
    Ok(found)
}

pub(super) fn exists(
    conn: &Connection,
    kind: &Kind,
    namespace: &str,
    name: &str,
) -> rusqlite::Result<bool> {
    conn.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM resources WHERE kind = ?1 AND namespace = ?2 AND name = ?3)",
    )?
    .query_row(params![kind.name, namespace, name], |row| row.get(0))
}

/// Advances the global revision counter; call only inside a write transaction.
/// Two statements, not one with RETURNING: SQLite answers RETURNING from an
/// ephemeral table, a b-tree with a page cache of its own that every call
/// sets up (touching fresh memory) and tears down.
pub(super) fn next_revision(conn: &Connection) -> rusqlite::Result<i64> {
    conn.prepare_cached("UPDATE counter SET last_revision = last_revision + 1 WHERE id = 1")?
        .execute([])?;
    conn.prepare_cached("SELECT last_revision FROM counter WHERE id = 1")?
        .query_row([], |row| row.get(0))
}

/// Stores `object` (replacing any row with its key) under a new revision
/// and returns it with that resourceVersion. Call inside a write transaction.
pub(super) fn put(
    conn: &Connection,
    kind: &Kind,
    mut object: Value,
) -> Result<Value, DatastoreError> {
    set_meta(&mut object, "resourceVersion", "")?;
    if !kind.namespaced {
        set_meta(&mut object, "namespace", "")?;
    }
    let value = object.to_string();
    let revision = next_revision(conn)?;
    conn.prepare_cached(
        "INSERT OR REPLACE INTO resources (kind, namespace, name, uid, revision, value)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        kind.name,
        meta_field(&object, "namespace"),
        meta_field(&object, "name"),
        meta_field(&object, "uid"),
        revision,
        value
    ])?;
    set_meta(&mut object, "resourceVersion", &revision.to_string())?;
    Ok(object)
}

/// The key of `object`: its (scoped) namespace and name, which must be set.
pub(super) fn key_of(kind: &Kind, object: &Value) -> Result<(String, String), DatastoreError> {
    let name = meta_field(object, "name");
    if name.is_empty() {
        return Err(DatastoreError::Other(format!(
            "{} metadata.name must be set",
            kind.name
        )));
    }
    Ok((
        scoped(kind, meta_field(object, "namespace")).to_string(),
        name.to_string(),
    ))
}

pub(super) fn create(
    conn: &mut Connection,
    kind: &Kind,
    object: Value,
) -> Result<Value, DatastoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let stored = create_in(&tx, kind, object)?;
    tx.commit()?;
    Ok(stored)
}

pub(super) fn update(
    conn: &mut Connection,
    kind: &Kind,
    object: Value,
) -> Result<Value, DatastoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let stored = update_in(&tx, kind, object)?;
    tx.commit()?;
    Ok(stored)
}

/// Every write in one transaction: all or, at the first that fails, none.
pub(super) fn write_together(
    conn: &mut Connection,
    writes: Vec<Write>,
) -> Result<Vec<Value>, DatastoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut stored = Vec::with_capacity(writes.len());
    for write in writes {
        stored.push(match write {
            Write::Create(kind, object) => create_in(&tx, kind, object)?,
            Write::Update(kind, object) => update_in(&tx, kind, object)?,
        });
    }
    tx.commit()?;
    Ok(stored)
}

/// Creates `object` inside the write transaction `tx`.
pub(super) fn create_in(
    tx: &Connection,
    kind: &Kind,
    mut object: Value,
) -> Result<Value, DatastoreError> {
    let (namespace, name) = key_of(kind, &object)?;
    set_meta(&mut object, "uid", &random_uuid()?)?;
    set_meta(
        &mut object,
        "creationTimestamp",
        &rfc3339_utc(SystemTime::now()),
    )?;
    if exists(tx, kind, &namespace, &name)? {
        return Err(DatastoreError::AlreadyExists(
            kind.describe(&namespace, &name),
        ));
    }
    put(tx, kind, object)
}

/// Updates `object` on its resourceVersion inside the write transaction `tx`.
pub(super) fn update_in(
    tx: &Connection,
    kind: &Kind,
    mut object: Value,
) -> Result<Value, DatastoreError> {
    let (namespace, name) = key_of(kind, &object)?;
    let described = kind.describe(&namespace, &name);
    let expected = meta_field(&object, "resourceVersion").to_string();
    if expected.is_empty() {
        return Err(DatastoreError::Other(format!(
            "metadata.resourceVersion is required to update {described}"
        )));
    }
    // The stored row's revision, uid and creation time, not the whole
    // object: decoding a block of many allocations only to compare its
    // revision cost more than the rest of the write.
    let (revision, uid, created) = tx
        .prepare_cached(
            "SELECT revision, uid, json_extract(value, '$.metadata.creationTimestamp')
             FROM resources WHERE kind = ?1 AND namespace = ?2 AND name = ?3",
        )?
        .query_row(params![kind.name, namespace, name], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, Option<String>>(2)?,
            ))
        })
        .optional()?
        .ok_or_else(|| DatastoreError::NotFound(described.clone()))?;
    if revision.to_string() != expected {
        return Err(DatastoreError::Conflict(described));
    }
    set_meta(&mut object, "uid", &uid)?;
    set_meta(
        &mut object,
        "creationTimestamp",
        created.as_deref().unwrap_or_default(),
    )?;
    put(tx, kind, object)
}

pub(super) fn delete(
    conn: &mut Connection,
    kind: &Kind,
    namespace: &str,
    name: &str,
    precondition: &Precondition,
) -> Result<(), DatastoreError> {
    let described = kind.describe(namespace, name);
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let (revision, uid) = tx
        .prepare_cached(
            "SELECT revision, uid FROM resources WHERE kind = ?1 AND namespace = ?2 AND name = ?3",
        )?
        .query_row(params![kind.name, namespace, name], |row| {
            Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?))
        })
        .optional()?
        .ok_or_else(|| DatastoreError::NotFound(described.clone()))?;
    let stale_revision = precondition
        .resource_version
        .as_ref()
        .is_some_and(|want| *want != revision.to_string());
    let other_uid = precondition.uid.as_ref().is_some_and(|want| *want != uid);
    if stale_revision || other_uid {
        return Err(DatastoreError::Conflict(described));
    }
    tx.prepare_cached("DELETE FROM resources WHERE kind = ?1 AND namespace = ?2 AND name = ?3")?
        .execute(params![kind.name, namespace, name])?;
    next_revision(&tx)?;
    tx.commit()?;
    Ok(())
}
