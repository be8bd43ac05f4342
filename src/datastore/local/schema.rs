//! The store's schema: its tables, created once per file however many
//! processes open a fresh one at once, and the initial ClusterInformation.

use std::time::SystemTime;

use rusqlite::{Connection, TransactionBehavior, params};

use super::CLUSTER_TYPE;
use super::crud::next_revision;
use crate::datastore::model::{ClusterInformation, ClusterInformationSpec, ObjectMeta};
use crate::datastore::{DatastoreError, Resource, random_guid, random_uuid, rfc3339_utc};

/// Bumped (via `PRAGMA user_version`) when the schema changes.
pub(super) const SCHEMA_VERSION: i64 = 1;

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS resources (
    kind      TEXT    NOT NULL,
    namespace TEXT    NOT NULL,
    name      TEXT    NOT NULL,
    uid       TEXT    NOT NULL,
    revision  INTEGER NOT NULL,
    value     TEXT    NOT NULL,
    PRIMARY KEY (kind, namespace, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counter (
    id            INTEGER PRIMARY KEY CHECK (id = 1),
    last_revision INTEGER NOT NULL
);
INSERT OR IGNORE INTO counter (id, last_revision) VALUES (1, 0);
";

pub(super) fn schema_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.pragma_query_value(None, "user_version", |r| r.get::<_, i64>(0))
}

/// Creates the schema and inserts the initial ClusterInformation
/// (`cluster_info`, whose stored JSON is `value`) exactly once per file,
/// however many processes race to do it. `user_version` records that it was
/// done, so a ClusterInformation deleted later is not re-created.
pub(super) fn initialize(
    conn: &mut Connection,
    cluster_info: &ClusterInformation,
    value: &str,
) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // Re-check under the write lock: another process may have won the race.
    if schema_version(&tx)? < SCHEMA_VERSION {
        tx.execute_batch(SCHEMA)?;
        let revision = next_revision(&tx)?;
        tx.execute(
            "INSERT OR IGNORE INTO resources (kind, namespace, name, uid, revision, value)
             VALUES (?1, '', ?2, ?3, ?4, ?5)",
            params![
                ClusterInformation::KIND.name,
                cluster_info.metadata.name,
                cluster_info.metadata.uid,
                revision,
                value
            ],
        )?;
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    }
    tx.commit()
}

pub(super) fn new_cluster_information(ready: bool) -> Result<ClusterInformation, DatastoreError> {
    Ok(ClusterInformation {
        metadata: ObjectMeta {
            uid: random_uuid()?,
            creation_timestamp: rfc3339_utc(SystemTime::now()),
            ..ObjectMeta::named("", ClusterInformation::NAME)
        },
        spec: ClusterInformationSpec {
            cluster_guid: random_guid()?,
            cluster_type: CLUSTER_TYPE.to_string(),
            datastore_ready: Some(ready),
            ..ClusterInformationSpec::default()
        },
        ..ClusterInformation::default()
    })
}
