//! `LocalStore`: the embedded default datastore, one SQLite file shared by
//! every plugin process on the node.
//!
//! # Schema
//!
//! ```sql
//! CREATE TABLE resources (
//!     kind      TEXT    NOT NULL,  -- 'WorkloadEndpoint', 'Profile', 'ClusterInformation'
//!     namespace TEXT    NOT NULL,  -- '' for cluster-scoped kinds
//!     name      TEXT    NOT NULL,
//!     uid       TEXT    NOT NULL,
//!     revision  INTEGER NOT NULL,  -- resourceVersion, as a decimal string
//!     value     TEXT    NOT NULL,  -- the v3 JSON object, without resourceVersion
//!     PRIMARY KEY (kind, namespace, name)
//! ) WITHOUT ROWID;
//! CREATE TABLE counter (id INTEGER PRIMARY KEY CHECK (id = 1), last_revision INTEGER NOT NULL);
//! ```
//!
//! Like etcd's mod revision, `revision` comes from one global counter that
//! every write (create, update, delete) advances, so a resourceVersion is
//! never reused. All writes run in `BEGIN IMMEDIATE` transactions: concurrent
//! plugin processes queue on SQLite's write lock (up to the busy timeout)
//! instead of losing or interleaving updates. The file is in WAL mode, so
//! reads never wait for writers.
//!
//! On first creation the store holds ClusterInformation `default` with
//! `datastoreReady: true`; it is never re-created, so deleting it also makes
//! the store not ready.
//!
//! # Marking the store not ready
//!
//! An operator marks the store not ready (every ADD and DEL then fails with
//! `Calico is currently not ready to process requests`) with the sqlite3 CLI:
//!
//! ```sh
//! sqlite3 -cmd '.timeout 5000' /path/to/store.db "
//! BEGIN IMMEDIATE;
//! UPDATE counter SET last_revision = last_revision + 1 WHERE id = 1;
//! UPDATE resources SET value = json_set(value, '$.spec.datastoreReady', json('false')), revision = (SELECT last_revision FROM counter WHERE id = 1) WHERE kind = 'ClusterInformation' AND namespace = '' AND name = 'default';
//! COMMIT;"
//! ```
//!
//! Use `json('true')` to mark it ready again. Programs can call
//!
//! # Files
//!
//! Here: the store's handle, its opening, and the resource API over the
//! blocking pool. Beside it: `schema` (the tables, their creation once per
//! file, the initial ClusterInformation), `queue` (operations started
//! together handed to one thread of the blocking pool, run in order),
//! `busy` (waits for another process's lock, SQLite's errors as the
//! store's), `checkpoint` (the WAL checkpointed when a handle closes),
//! `crud` (reads and writes of the rows: get, list, create, update,
//! delete, revisions).

mod busy;
mod checkpoint;
mod crud;
mod queue;
mod schema;
#[cfg(test)]
mod tests;

use std::fmt;
use std::fs::{DirBuilder, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags, TransactionBehavior};
use serde_json::Value;

use super::model::ClusterInformation;
use super::{DatastoreError, Kind, ListFilter, Precondition, Resource, Store, Write};
use busy::{BUSY_WAIT_LIMIT_MICROS, retry_while_busy, wait_while_busy};
use crud::{create, delete, get, list, put, scoped, to_value, update, write_together};
use queue::{Job, Queue, drain};
use schema::{SCHEMA_VERSION, initialize, new_cluster_information, schema_version};

/// The `clusterType` of a store created by this plugin.
pub const CLUSTER_TYPE: &str = "calico-cni-local";

/// The embedded SQLite datastore. One handle holds one connection; any
/// number of handles, in any number of processes, may share a file. Every
/// operation runs on tokio's blocking pool, never on the async runtime's
/// thread, and every wait for another process's lock is bounded by the
/// busy timeout given at open.
pub struct LocalStore {
    conn: Arc<Mutex<Connection>>,
    queue: Arc<Queue>,
    /// The WAL file, whose size tells when to checkpoint.
    wal: std::path::PathBuf,
}

impl fmt::Debug for LocalStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalStore").finish_non_exhaustive()
    }
}

impl LocalStore {
    /// Opens (creating if needed) the store at `path`. Parent directories are
    /// created with mode 0755 and the file with mode 0600. `busy_timeout`
    /// bounds every wait for another process's lock, including the one-off
    /// schema creation when many processes open a fresh file at once.
    pub fn open(path: &Path, busy_timeout: Duration) -> Result<LocalStore, DatastoreError> {
        let deadline = Instant::now() + busy_timeout;
        let unavailable = |what: &str, e: &dyn fmt::Display| {
            DatastoreError::Unavailable(format!("{what} {}: {e}", path.display()))
        };

        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)
                .map_err(|e| unavailable("creating the directory of", &e))?;
        }
        // Create the file ourselves so it gets our mode; SQLite gives its
        // -wal and -shm files the same mode.
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|e| unavailable("creating", &e))?;

        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut conn =
            Connection::open_with_flags(path, flags).map_err(|e| unavailable("opening", &e))?;
        BUSY_WAIT_LIMIT_MICROS.store(
            u64::try_from(busy_timeout.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        conn.busy_handler(Some(wait_while_busy))?;

        // Switching to WAL needs an exclusive lock, and SQLite may report
        // SQLITE_BUSY here without consulting the busy handler, so retry.
        let mode: String = retry_while_busy(deadline, || {
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        })?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(unavailable(
                "enabling WAL on",
                &format!("journal mode stayed {mode:?}"),
            ));
        }
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        // Every plugin process opens and closes the store once. By default
        // the last connection to close checkpoints and deletes the WAL
        // (several fsyncs), and the next one recreates it: on the hot path
        // of every ADD and DEL. SQLite's automatic checkpoint does not fit
        // either: each new process rebuilds the WAL index from the file and
        // sees every frame as not yet checkpointed, so once the WAL passes
        // the threshold every process checkpoints it again. Instead the WAL
        // is kept across processes and truncated by a full checkpoint once
        // it passes WAL_CHECKPOINT_FRAMES (see `Drop`).
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )?;
        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        // The initial ClusterInformation is made (random ids and all) only
        // for a file that has no schema yet.
        let schema = retry_while_busy(deadline, || schema_version(&conn))?;
        if schema < SCHEMA_VERSION {
            let cluster_info = new_cluster_information(true)?;
            let value = to_value(&cluster_info)?.to_string();
            retry_while_busy(deadline, || initialize(&mut conn, &cluster_info, &value))?;
        }

        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        Ok(LocalStore {
            conn: Arc::new(Mutex::new(conn)),
            queue: Arc::default(),
            wal: wal.into(),
        })
    }

    /// Sets ClusterInformation `default`'s `spec.datastoreReady`, creating the
    /// object if it was deleted.
    pub fn set_cluster_ready(&self, ready: bool) -> Result<(), DatastoreError> {
        let kind = ClusterInformation::KIND;
        let mut conn = lock(&self.conn);
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let info = match get(&tx, kind, "", ClusterInformation::NAME)? {
            Some(mut info) => {
                info["spec"]["datastoreReady"] = Value::Bool(ready);
                info
            }
            None => to_value(&new_cluster_information(ready)?)?,
        };
        put(&tx, kind, info)?;
        tx.commit()?;
        Ok(())
    }

    /// Runs `op` on the connection on tokio's blocking pool. Operations
    /// started while another is queued or running join it: one thread
    /// takes the connection once and runs them all in order (the reads a
    /// call makes at once cost one hand-off to the pool, not one each).
    /// Both sides of the hand-off wait awake a moment for the other
    /// ([`crate::handoff`]): the caller's runtime for the answer, the
    /// thread for the call's next operation.
    async fn blocking<T: Send + 'static>(
        &self,
        op: impl FnOnce(&mut Connection) -> Result<T, DatastoreError> + Send + 'static,
    ) -> Result<T, DatastoreError> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let in_flight = crate::handoff::InFlight::new();
        let job: Job = Box::new(move |conn| {
            let _ = answer.send(op(conn));
            drop(in_flight);
        });
        if self.queue.push(job) {
            // Not counted as the call's blocking work (`handoff::spawn_blocking`):
            // every job answers a caller that awaits it, and once the store
            // is dropped the thread only waits to leave.
            let (conn, queue) = (Arc::clone(&self.conn), Arc::clone(&self.queue));
            drop(tokio::task::spawn_blocking(move || drain(&conn, &queue)));
        }
        answered
            .await
            .map_err(|_| DatastoreError::Other("the datastore's worker failed".into()))?
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves no transaction open (rusqlite
    // rolls back on drop), so the connection stays usable.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[async_trait::async_trait]
impl Store for LocalStore {
    async fn get_object(
        &self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, DatastoreError> {
        let (namespace, name) = (scoped(kind, namespace).to_string(), name.to_string());
        self.blocking(move |conn| get(conn, kind, &namespace, &name))
            .await
    }

    async fn list_objects(
        &self,
        kind: &'static Kind,
        namespace: &str,
        filter: &ListFilter,
    ) -> Result<Vec<Value>, DatastoreError> {
        let (namespace, filter) = (scoped(kind, namespace).to_string(), filter.clone());
        self.blocking(move |conn| list(conn, kind, &namespace, &filter))
            .await
    }

    async fn create_object(
        &self,
        kind: &'static Kind,
        object: Value,
    ) -> Result<Value, DatastoreError> {
        self.blocking(move |conn| create(conn, kind, object)).await
    }

    async fn update_object(
        &self,
        kind: &'static Kind,
        object: Value,
    ) -> Result<Value, DatastoreError> {
        self.blocking(move |conn| update(conn, kind, object)).await
    }

    async fn delete_object(
        &self,
        kind: &'static Kind,
        namespace: &str,
        name: &str,
        precondition: &Precondition,
    ) -> Result<(), DatastoreError> {
        let (namespace, name) = (scoped(kind, namespace).to_string(), name.to_string());
        let precondition = precondition.clone();
        self.blocking(move |conn| delete(conn, kind, &namespace, &name, &precondition))
            .await
    }

    fn writes_together(&self) -> bool {
        true
    }

    async fn write_together(&self, writes: Vec<Write>) -> Result<Vec<Value>, DatastoreError> {
        self.blocking(move |conn| write_together(conn, writes))
            .await
    }

    fn backend(&self) -> super::Backend {
        super::Backend::Local
    }
}
