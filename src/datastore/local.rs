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
//! [`LocalStore::set_cluster_ready`] instead.

use std::fmt;
use std::fs::{DirBuilder, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior, params};
use serde_json::Value;

use super::model::{ClusterInformation, ClusterInformationSpec, ObjectMeta};
use super::{
    DatastoreError, Kind, ListFilter, Precondition, Resource, Store, Write, meta_field,
    random_guid, random_uuid, rfc3339_utc,
};

/// The `clusterType` of a store created by this plugin.
pub const CLUSTER_TYPE: &str = "calico-cni-local";

/// Bumped (via `PRAGMA user_version`) when the schema changes.
const SCHEMA_VERSION: i64 = 1;

const SCHEMA: &str = "
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

/// An operation waiting for the connection.
type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// The operations waiting for the connection, and a count of posts (a
/// job queued, or the store closed) that a thread waiting awake for work
/// polls without taking the lock: polling the lock itself made every
/// hand-off contend for it (the pushing thread put to sleep on a futex).
#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
    posts: AtomicUsize,
}

/// The queued operations, whether a thread of the blocking pool is already
/// on its way to run them, and whether the store is closed (dropped: no
/// operation will come).
#[derive(Default)]
struct QueueState {
    jobs: Vec<Job>,
    draining: bool,
    closed: bool,
}

impl Queue {
    /// Queues `job`; `true` when no thread is on its way to run it (the
    /// caller starts one).
    fn push(&self, job: Job) -> bool {
        let start = {
            let mut state = lock(&self.state);
            state.jobs.push(job);
            !std::mem::replace(&mut state.draining, true)
        };
        self.post();
        start
    }

    /// No job will come: a waiting thread leaves once the queue is empty.
    fn close(&self) {
        lock(&self.state).closed = true;
        self.post();
    }

    /// Tells a waiting thread that the state changed (after the change).
    fn post(&self) {
        self.posts.fetch_add(1, Ordering::SeqCst);
    }
}

/// Runs queued operations until none is left, nor comes within
/// [`crate::handoff::SPIN`] (a panicking one answers nothing: its caller
/// sees the worker fail). Once the store is closed it leaves as soon as
/// the queue is empty: the runtime's shutdown may wait for this thread.
fn drain(conn: &Mutex<Connection>, queue: &Queue) {
    let mut conn = lock(conn);
    loop {
        let seen = queue.posts.load(Ordering::SeqCst);
        let jobs = {
            let mut state = lock(&queue.state);
            if state.jobs.is_empty() && state.closed {
                state.draining = false;
                return;
            }
            std::mem::take(&mut state.jobs)
        };
        if jobs.is_empty() {
            // The next job is usually microseconds away: wait for it awake.
            let posted = || (queue.posts.load(Ordering::SeqCst) != seen).then_some(());
            if crate::handoff::wait_for(posted).is_none() {
                let mut state = lock(&queue.state);
                if state.jobs.is_empty() {
                    state.draining = false;
                    return;
                }
            }
            continue;
        }
        for job in jobs {
            let conn = &mut *conn;
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || job(conn)));
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves no transaction open (rusqlite
    // rolls back on drop), so the connection stays usable.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The namespace a kind's objects are keyed by: `""` for cluster-scoped ones.
fn scoped<'a>(kind: &Kind, namespace: &'a str) -> &'a str {
    if kind.namespaced { namespace } else { "" }
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

impl From<rusqlite::Error> for DatastoreError {
    fn from(e: rusqlite::Error) -> Self {
        let message = format!("sqlite: {e}");
        match e.sqlite_error_code() {
            Some(
                ErrorCode::DatabaseBusy
                | ErrorCode::DatabaseLocked
                | ErrorCode::CannotOpen
                | ErrorCode::ReadOnly
                | ErrorCode::DiskFull
                | ErrorCode::SystemIoFailure,
            ) => DatastoreError::Unavailable(message),
            _ => DatastoreError::Other(message),
        }
    }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// Runs `op` until it stops failing with SQLITE_BUSY or `deadline` passes.
fn retry_while_busy<T>(
    deadline: Instant,
    mut op: impl FnMut() -> rusqlite::Result<T>,
) -> Result<T, DatastoreError> {
    loop {
        match op() {
            Err(e) if is_busy(&e) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            other => return other.map_err(DatastoreError::from),
        }
    }
}

/// Creates the schema and inserts the initial ClusterInformation
/// (`cluster_info`, whose stored JSON is `value`) exactly once per file,
/// however many processes race to do it. `user_version` records that it was
/// done, so a ClusterInformation deleted later is not re-created.
/// How long a connection waits for another process's write lock in total.
static BUSY_WAIT_LIMIT_MICROS: AtomicU64 = AtomicU64::new(0);
/// One wait for a busy lock. SQLite's own handler sleeps 1, 2, 5, 10 … 100
/// ms between tries, which turns a few concurrent plugins' sub-millisecond
/// transactions into tens of milliseconds of waiting; short sleeps keep the
/// wait close to the holder's transaction time.
const BUSY_WAIT_STEP: Duration = Duration::from_micros(200);

/// SQLite's busy handler: `true` to try again after a short sleep.
fn wait_while_busy(attempt: i32) -> bool {
    let waited = u64::try_from(attempt).unwrap_or(0) * BUSY_WAIT_STEP.as_micros() as u64;
    if waited >= BUSY_WAIT_LIMIT_MICROS.load(Ordering::Relaxed) {
        return false;
    }
    std::thread::sleep(BUSY_WAIT_STEP);
    true
}

/// Frames in the WAL past which a closing connection checkpoints it (each
/// new process reads the whole WAL once, so it is kept short).
const WAL_CHECKPOINT_FRAMES: u64 = 64;
/// A WAL frame: a 24-byte header and one page.
const WAL_FRAME_BYTES: u64 = 24 + 4096;

impl Drop for LocalStore {
    fn drop(&mut self) {
        // A thread waiting for the next operation leaves now (and with it
        // the connection's lock, which the checkpoint takes).
        self.queue.close();
        let frames = std::fs::metadata(&self.wal).map_or(0, |m| m.len() / WAL_FRAME_BYTES);
        if frames < WAL_CHECKPOINT_FRAMES {
            return;
        }
        let conn = &mut *lock(&self.conn);
        // Fail fast when another process is reading or writing: one of the
        // next closers will do it.
        let _ = conn.busy_handler(None::<fn(i32) -> bool>);
        // First the frames are copied into the database (and both files
        // synced) by a passive checkpoint, which no other process's reads
        // or writes wait for; then, when that copied them all, a truncating
        // one starts the WAL over, holding the write lock only for the
        // truncation (a truncating checkpoint alone holds it through the
        // copy and both fsyncs: every write of a burst waited behind it).
        let checkpoint = |mode: &str| {
            conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })
        };
        let outcome = match checkpoint("PASSIVE") {
            Ok((busy, log, copied)) if busy != 0 || copied < log => Ok(false),
            Ok(_) => checkpoint("TRUNCATE").map(|(busy, _, _)| busy == 0),
            Err(e) => Err(e),
        };
        match outcome {
            Ok(true) => tracing::debug!(frames, "checkpointed and truncated the WAL"),
            Ok(false) => tracing::debug!(frames, "WAL checkpoint deferred: the store is busy"),
            Err(e) => tracing::debug!(frames, "WAL checkpoint failed: {e}"),
        }
    }
}

fn schema_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.pragma_query_value(None, "user_version", |r| r.get::<_, i64>(0))
}

fn initialize(
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

fn new_cluster_information(ready: bool) -> Result<ClusterInformation, DatastoreError> {
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

fn to_value<R: Resource>(resource: &R) -> Result<Value, DatastoreError> {
    serde_json::to_value(resource)
        .map_err(|e| DatastoreError::Other(format!("encoding {}: {e}", R::KIND.name)))
}

fn set_meta(object: &mut Value, field: &str, value: &str) -> Result<(), DatastoreError> {
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

fn decode(
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

fn get(
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
fn list(
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

fn exists(conn: &Connection, kind: &Kind, namespace: &str, name: &str) -> rusqlite::Result<bool> {
    conn.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM resources WHERE kind = ?1 AND namespace = ?2 AND name = ?3)",
    )?
    .query_row(params![kind.name, namespace, name], |row| row.get(0))
}

/// Advances the global revision counter; call only inside a write transaction.
/// Two statements, not one with RETURNING: SQLite answers RETURNING from an
/// ephemeral table, a b-tree with a page cache of its own that every call
/// sets up (touching fresh memory) and tears down.
fn next_revision(conn: &Connection) -> rusqlite::Result<i64> {
    conn.prepare_cached("UPDATE counter SET last_revision = last_revision + 1 WHERE id = 1")?
        .execute([])?;
    conn.prepare_cached("SELECT last_revision FROM counter WHERE id = 1")?
        .query_row([], |row| row.get(0))
}

/// Stores `object` (replacing any row with its key) under a new revision
/// and returns it with that resourceVersion. Call inside a write transaction.
fn put(conn: &Connection, kind: &Kind, mut object: Value) -> Result<Value, DatastoreError> {
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
fn key_of(kind: &Kind, object: &Value) -> Result<(String, String), DatastoreError> {
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

fn create(conn: &mut Connection, kind: &Kind, object: Value) -> Result<Value, DatastoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let stored = create_in(&tx, kind, object)?;
    tx.commit()?;
    Ok(stored)
}

fn update(conn: &mut Connection, kind: &Kind, object: Value) -> Result<Value, DatastoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let stored = update_in(&tx, kind, object)?;
    tx.commit()?;
    Ok(stored)
}

/// Every write in one transaction: all or, at the first that fails, none.
fn write_together(conn: &mut Connection, writes: Vec<Write>) -> Result<Vec<Value>, DatastoreError> {
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
fn create_in(tx: &Connection, kind: &Kind, mut object: Value) -> Result<Value, DatastoreError> {
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
fn update_in(tx: &Connection, kind: &Kind, mut object: Value) -> Result<Value, DatastoreError> {
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

fn delete(
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::future::Future;
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;
    use std::process::Command;
    use std::sync::Arc;

    use super::*;
    use crate::datastore::model::{LABEL_NAMESPACE, LABEL_ORCHESTRATOR, Profile, WorkloadEndpoint};

    /// The typed resource API of a store.
    trait Typed {
        fn s(&self) -> &dyn Store;
    }

    impl Typed for LocalStore {
        fn s(&self) -> &dyn Store {
            self
        }
    }

    const TIMEOUT: Duration = Duration::from_secs(30);

    fn run<F: Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(future)
    }

    fn store_in(dir: &tempfile::TempDir) -> (PathBuf, LocalStore) {
        let path = dir.path().join("nested/dir/store.db");
        let store = LocalStore::open(&path, TIMEOUT).expect("open");
        (path, store)
    }

    fn k8s_wep(namespace: &str, name: &str) -> WorkloadEndpoint {
        let mut wep = WorkloadEndpoint::new(namespace, name);
        wep.spec.orchestrator = "k8s".into();
        wep.spec.node = "node1".into();
        wep.spec.endpoint = "eth0".into();
        wep.spec.ip_networks = vec!["10.0.0.1/32".into()];
        wep
    }

    /// Operations started together share one hand-off to the blocking
    /// pool and run in the order they were started: a read started after
    /// a write sees it; the queue serves the next batch once one is done.
    #[test]
    fn operations_started_together_run_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let (_, store) = store_in(&dir);
        run(async {
            let s = store.s();
            let mut ops: Vec<std::pin::Pin<Box<dyn Future<Output = Option<String>> + '_>>> =
                Vec::new();
            for i in 0..10 {
                let name = format!("wep-{i}");
                ops.push(Box::pin(async move {
                    s.create(&mut k8s_wep("ns", &name)).await.unwrap();
                    None
                }));
                let name = format!("wep-{i}");
                ops.push(Box::pin(async move {
                    s.get::<WorkloadEndpoint>("ns", &name)
                        .await
                        .unwrap()
                        .map(|w| w.metadata.name)
                }));
            }
            let answers = futures::future::join_all(ops).await;
            for (i, pair) in answers.chunks(2).enumerate() {
                assert_eq!(pair[1].as_deref(), Some(format!("wep-{i}").as_str()));
            }
            // Later, alone: served by a new hand-off.
            let all = s
                .list::<WorkloadEndpoint>("ns", &ListFilter::NamePrefix(String::new()))
                .await
                .unwrap();
            assert_eq!(all.len(), 10);
        });
    }

    /// `.cargo/config.toml` builds the bundled SQLite for the store: the
    /// modules every connection would register at open left out, the page
    /// cache's bulk allocation and the memory statistics off.
    #[test]
    fn sqlite_is_built_for_the_store() {
        let conn = Connection::open_in_memory().unwrap();
        let options: Vec<String> = conn
            .prepare("PRAGMA compile_options")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        for left_out in [
            "ENABLE_FTS3",
            "ENABLE_FTS5",
            "ENABLE_RTREE",
            "ENABLE_DBSTAT_VTAB",
            "ENABLE_STAT4",
            "SOUNDEX",
        ] {
            assert!(
                !options.iter().any(|o| o == left_out),
                "{left_out} in {options:?}"
            );
        }
        for set in ["DEFAULT_PCACHE_INITSZ=0", "DEFAULT_MEMSTATUS=0"] {
            assert!(options.iter().any(|o| o == set), "{set} not in {options:?}");
        }
    }

    /// What one plugin process does to the store at `path`: open it,
    /// create one endpoint (`ns/name`), close it.
    fn one_call_writes(path: &Path, name: &str) {
        let store = LocalStore::open(path, TIMEOUT).unwrap();
        run(store.s().create(&mut k8s_wep("ns", name).clone())).unwrap();
    }

    /// The size of the WAL file of the store at `path` (0 when absent).
    fn wal_bytes(path: &Path) -> u64 {
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        std::fs::metadata(wal).map_or(0, |m| m.len())
    }

    /// One short-lived process after another (each opens, writes, closes):
    /// the WAL stays short, everything written survives, and the file
    /// never needs more than the occasional checkpoint.
    #[test]
    fn wal_stays_short_across_short_lived_openers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        for i in 0..200 {
            one_call_writes(&path, &format!("wep-{i:03}"));
        }
        let wal = wal_bytes(&path);
        assert!(
            wal <= (WAL_CHECKPOINT_FRAMES + 8) * WAL_FRAME_BYTES,
            "WAL grew to {wal} bytes"
        );
        let store = LocalStore::open(&path, TIMEOUT).unwrap();
        assert_eq!(
            run(store
                .s()
                .list::<WorkloadEndpoint>("ns", &ListFilter::NamePrefix(("wep-").to_string())))
            .unwrap()
            .len(),
            200
        );
    }

    /// A reader holding an old snapshot (another process mid-call) keeps
    /// the WAL from being started over: closers past the threshold defer
    /// (nothing is lost); once it is gone, the next closer checkpoints and
    /// truncates the WAL.
    #[test]
    fn a_checkpoint_defers_while_a_reader_holds_the_wal_and_truncates_after() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        drop(LocalStore::open(&path, TIMEOUT).unwrap());
        let wal_frames = || wal_bytes(&path) / WAL_FRAME_BYTES;
        let reader = Connection::open(&path).unwrap();
        // (As the plugin's own connections: closing it checkpoints nothing.)
        reader
            .set_db_config(
                rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
                true,
            )
            .unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let _: i64 = reader
            .query_row("SELECT count(*) FROM resources", [], |r| r.get(0))
            .unwrap();
        for i in 0..60 {
            one_call_writes(&path, &format!("wep-{i:03}"));
        }
        let held = wal_frames();
        assert!(held > WAL_CHECKPOINT_FRAMES + 8, "{held} frames");
        reader.execute_batch("COMMIT").unwrap();
        drop(reader);
        one_call_writes(&path, "wep-last");
        assert_eq!(wal_frames(), 0);
        let store = LocalStore::open(&path, TIMEOUT).unwrap();
        assert_eq!(
            run(store
                .s()
                .list::<WorkloadEndpoint>("ns", &ListFilter::NamePrefix(String::new())))
            .unwrap()
            .len(),
            61
        );
    }

    #[test]
    fn create_get_and_forced_fields() {
        let dir = tempfile::tempdir().unwrap();
        let (path, store) = store_in(&dir);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o755);

        let mut wep = k8s_wep("ns1", "node1-k8s-mypod-eth0");
        wep.metadata
            .labels
            .insert(LABEL_NAMESPACE.into(), "spoofed".into());
        wep.metadata.uid = "caller-chosen".into();
        let created = run(store.s().create(&mut wep.clone())).unwrap();

        let meta = &created.metadata;
        assert_eq!(meta.labels[LABEL_NAMESPACE], "ns1");
        assert_eq!(meta.labels[LABEL_ORCHESTRATOR], "k8s");
        assert_eq!(meta.uid.len(), 36);
        assert_ne!(meta.uid, "caller-chosen");
        assert!(meta.resource_version.parse::<i64>().unwrap() > 0);
        let ts = meta.creation_timestamp.as_bytes();
        assert_eq!((ts.len(), ts[10], ts[19]), (20, b'T', b'Z'));

        let fetched = run(store
            .s()
            .get::<WorkloadEndpoint>("ns1", "node1-k8s-mypod-eth0"))
        .unwrap();
        assert_eq!(fetched.as_ref(), Some(&created));
        assert_eq!(
            run(store
                .s()
                .get::<WorkloadEndpoint>("ns2", "node1-k8s-mypod-eth0"))
            .unwrap(),
            None
        );

        // resourceVersion lives only in the revision column.
        let conn = Connection::open(&path).unwrap();
        let value: String = conn
            .query_row(
                "SELECT value FROM resources WHERE kind = 'WorkloadEndpoint'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert!(!value.contains("resourceVersion"), "{value}");
        assert!(value.contains(&created.metadata.uid));
    }

    #[test]
    fn create_twice_is_already_exists() {
        let dir = tempfile::tempdir().unwrap();
        let (_, store) = store_in(&dir);
        let wep = k8s_wep("ns1", "node1-k8s-mypod-eth0");
        run(store.s().create(&mut wep.clone())).unwrap();
        let err = run(store.s().create(&mut wep.clone())).unwrap_err();
        assert!(matches!(err, DatastoreError::AlreadyExists(_)), "{err:?}");
        assert_eq!(
            err.to_string(),
            "resource already exists: WorkloadEndpoint(ns1/node1-k8s-mypod-eth0)"
        );
    }

    #[test]
    fn list_by_prefix_within_namespace() {
        let dir = tempfile::tempdir().unwrap();
        let (_, store) = store_in(&dir);
        for (ns, name) in [
            ("ns1", "node1-k8s-mypod-eth0"),
            ("ns1", "node1-k8s-mypod--1-eth0"),
            ("ns1", "node1-k8s-other-eth0"),
            ("ns1", "node1xk8s-mypod-eth0"),
            ("ns2", "node1-k8s-mypod-eth0"),
        ] {
            run(store.s().create(&mut k8s_wep(ns, name).clone())).unwrap();
        }
        let names = |ns: &str, prefix: &str| -> Vec<String> {
            run(store
                .s()
                .list::<WorkloadEndpoint>(ns, &ListFilter::NamePrefix((prefix).to_string())))
            .unwrap()
            .into_iter()
            .map(|w| format!("{}/{}", w.metadata.namespace, w.metadata.name))
            .collect()
        };
        assert_eq!(
            names("ns1", "node1-k8s-mypod-"),
            ["ns1/node1-k8s-mypod--1-eth0", "ns1/node1-k8s-mypod-eth0"]
        );
        assert_eq!(
            names("ns2", "node1-k8s-mypod-"),
            ["ns2/node1-k8s-mypod-eth0"]
        );
        assert_eq!(
            names("ns1", "node1"),
            [
                "ns1/node1-k8s-mypod--1-eth0",
                "ns1/node1-k8s-mypod-eth0",
                "ns1/node1-k8s-other-eth0",
                "ns1/node1xk8s-mypod-eth0"
            ]
        );
        // Every namespace: by name, then namespace.
        assert_eq!(
            names("", "node1-k8s-mypod-"),
            [
                "ns1/node1-k8s-mypod--1-eth0",
                "ns1/node1-k8s-mypod-eth0",
                "ns2/node1-k8s-mypod-eth0"
            ]
        );
        assert!(names("ns1", "node1_").is_empty());
        assert!(names("ns1", "node1%").is_empty());
        assert!(names("ns3", "").is_empty());
    }

    #[test]
    fn update_is_compare_and_swap() {
        let dir = tempfile::tempdir().unwrap();
        let (_, store) = store_in(&dir);
        let created = run(store.s().create(&mut k8s_wep("ns1", "w").clone())).unwrap();

        let mut changed = created.clone();
        changed.spec.profiles = vec!["kns.ns1".into()];
        changed.metadata.uid = "ignored".into();
        changed.metadata.creation_timestamp = "1999-01-01T00:00:00Z".into();
        changed.metadata.labels.clear();
        let updated = run(store.s().update(&mut changed.clone())).unwrap();
        assert_eq!(updated.metadata.uid, created.metadata.uid);
        assert_eq!(
            updated.metadata.creation_timestamp,
            created.metadata.creation_timestamp
        );
        assert_eq!(updated.metadata.labels[LABEL_NAMESPACE], "ns1");
        assert_ne!(
            updated.metadata.resource_version,
            created.metadata.resource_version
        );
        assert_eq!(
            run(store.s().get::<WorkloadEndpoint>("ns1", "w")).unwrap(),
            Some(updated)
        );

        // `changed` still carries the old resourceVersion.
        let err = run(store.s().update(&mut changed.clone())).unwrap_err();
        assert!(matches!(err, DatastoreError::Conflict(_)), "{err:?}");

        let mut missing = changed.clone();
        missing.metadata.name = "absent".into();
        let err = run(store.s().update(&mut missing.clone())).unwrap_err();
        assert!(matches!(err, DatastoreError::NotFound(_)), "{err:?}");

        let mut unversioned = changed;
        unversioned.metadata.resource_version.clear();
        let err = run(store.s().update(&mut unversioned.clone())).unwrap_err();
        assert!(matches!(err, DatastoreError::Other(_)), "{err:?}");
    }

    #[test]
    fn delete_checks_preconditions() {
        let dir = tempfile::tempdir().unwrap();
        let (_, store) = store_in(&dir);
        let created = run(store.s().create(&mut k8s_wep("ns1", "w").clone())).unwrap();
        let delete = |precondition| {
            run(store
                .s()
                .delete::<WorkloadEndpoint>("ns1", "w", &precondition))
        };

        let err = delete(Precondition {
            uid: Some("someone-else".into()),
            ..Default::default()
        })
        .unwrap_err();
        assert!(matches!(err, DatastoreError::Conflict(_)), "{err:?}");

        let err = delete(Precondition {
            resource_version: Some("999999".into()),
            ..Default::default()
        })
        .unwrap_err();
        assert!(matches!(err, DatastoreError::Conflict(_)), "{err:?}");

        delete(Precondition {
            resource_version: Some(created.metadata.resource_version.clone()),
            uid: Some(created.metadata.uid.clone()),
        })
        .unwrap();
        assert_eq!(
            run(store.s().get::<WorkloadEndpoint>("ns1", "w")).unwrap(),
            None
        );

        let err = delete(Precondition::default()).unwrap_err();
        assert!(matches!(err, DatastoreError::NotFound(_)), "{err:?}");
        assert_eq!(
            err.to_string(),
            "resource does not exist: WorkloadEndpoint(ns1/w)"
        );
    }

    #[test]
    fn profiles() {
        let dir = tempfile::tempdir().unwrap();
        let (_, store) = store_in(&dir);
        assert_eq!(run(store.s().get::<Profile>("", "net1")).unwrap(), None);

        let profile = Profile::for_network("net1", false);
        let created = run(store.s().create(&mut profile.clone())).unwrap();
        assert_eq!(created.spec, profile.spec);
        assert!(!created.metadata.uid.is_empty());
        assert_eq!(
            run(store.s().get::<Profile>("", "net1")).unwrap(),
            Some(created)
        );

        let err = run(store.s().create(&mut profile.clone())).unwrap_err();
        assert_eq!(err.to_string(), "resource already exists: Profile(net1)");
    }

    #[test]
    fn cluster_readiness() {
        let dir = tempfile::tempdir().unwrap();
        let (path, store) = store_in(&dir);
        assert!(run(store.s().cluster_ready()).unwrap());
        let info = run(store
            .s()
            .get::<ClusterInformation>("", ClusterInformation::NAME))
        .unwrap()
        .unwrap();
        assert_eq!(info.spec.cluster_type, CLUSTER_TYPE);
        assert_eq!(info.spec.cluster_guid.len(), 32);

        store.set_cluster_ready(false).unwrap();
        assert!(!run(store.s().cluster_ready()).unwrap());
        let after = run(store
            .s()
            .get::<ClusterInformation>("", ClusterInformation::NAME))
        .unwrap()
        .unwrap();
        assert_eq!(after.spec.cluster_guid, info.spec.cluster_guid);

        store.set_cluster_ready(true).unwrap();
        assert!(run(store.s().cluster_ready()).unwrap());

        // Deleting the object makes the store not ready, and reopening does
        // not bring it back.
        let conn = Connection::open(&path).unwrap();
        conn.execute(
            "DELETE FROM resources WHERE kind = 'ClusterInformation'",
            [],
        )
        .unwrap();
        assert!(!run(store.s().cluster_ready()).unwrap());
        let reopened = LocalStore::open(&path, TIMEOUT).unwrap();
        assert!(!run(reopened.s().cluster_ready()).unwrap());
        assert_eq!(
            run(reopened
                .s()
                .get::<ClusterInformation>("", ClusterInformation::NAME))
            .unwrap(),
            None
        );
    }

    /// The SQL in the module documentation works as documented.
    #[test]
    fn operator_sql_marks_not_ready() {
        let dir = tempfile::tempdir().unwrap();
        let (path, store) = store_in(&dir);
        let before = run(store
            .s()
            .get::<ClusterInformation>("", ClusterInformation::NAME))
        .unwrap()
        .unwrap();
        let sql = "BEGIN IMMEDIATE;
UPDATE counter SET last_revision = last_revision + 1 WHERE id = 1;
UPDATE resources SET value = json_set(value, '$.spec.datastoreReady', json('false')), revision = (SELECT last_revision FROM counter WHERE id = 1) WHERE kind = 'ClusterInformation' AND namespace = '' AND name = 'default';
COMMIT;";
        let docs = include_str!("local.rs").replace("\n//! ", "\n");
        assert!(docs.contains(sql), "module docs must show the tested SQL");

        Connection::open(&path).unwrap().execute_batch(sql).unwrap();
        assert!(!run(store.s().cluster_ready()).unwrap());
        let after = run(store
            .s()
            .get::<ClusterInformation>("", ClusterInformation::NAME))
        .unwrap()
        .unwrap();
        assert_eq!(after.spec.datastore_ready, Some(false));
        assert_eq!(after.spec.cluster_guid, before.spec.cluster_guid);
        let revision = |i: &ClusterInformation| i.metadata.resource_version.parse::<i64>().unwrap();
        assert!(revision(&after) > revision(&before));

        let again = Connection::open(&path).unwrap();
        again
            .execute_batch(&sql.replace("json('false')", "json('true')"))
            .unwrap();
        assert!(run(store.s().cluster_ready()).unwrap());
    }

    #[test]
    fn concurrent_creates_from_separate_connections() {
        const THREADS: usize = 8;
        const PER_THREAD: usize = 25;
        let dir = tempfile::tempdir().unwrap();
        let (path, store) = store_in(&dir);
        let path = Arc::new(path);

        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let path = Arc::clone(&path);
                std::thread::spawn(move || {
                    let store = LocalStore::open(&path, TIMEOUT).unwrap();
                    for i in 0..PER_THREAD {
                        let wep = k8s_wep("ns1", &format!("node1-k8s-pod{t}x{i}-eth0"));
                        run(store.s().create(&mut wep.clone())).unwrap();
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().unwrap();
        }

        let all = run(store
            .s()
            .list::<WorkloadEndpoint>("ns1", &ListFilter::NamePrefix(("").to_string())))
        .unwrap();
        assert_eq!(all.len(), THREADS * PER_THREAD);
        let revisions: BTreeSet<&str> = all
            .iter()
            .map(|w| w.metadata.resource_version.as_str())
            .collect();
        assert_eq!(revisions.len(), THREADS * PER_THREAD);
    }

    #[test]
    fn racing_updates_lose_nothing() {
        const THREADS: usize = 8;
        const UPDATES_PER_THREAD: usize = 10;
        let dir = tempfile::tempdir().unwrap();
        let (path, store) = store_in(&dir);
        run(store.s().create(&mut k8s_wep("ns1", "shared").clone())).unwrap();
        let path = Arc::new(path);

        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let path = Arc::clone(&path);
                std::thread::spawn(move || {
                    let store = LocalStore::open(&path, TIMEOUT).unwrap();
                    let mut conflicts = 0;
                    for i in 0..UPDATES_PER_THREAD {
                        loop {
                            let mut wep = run(store.s().get::<WorkloadEndpoint>("ns1", "shared"))
                                .unwrap()
                                .unwrap();
                            wep.spec.profiles.push(format!("t{t}-{i}"));
                            match run(store.s().update(&mut wep.clone())) {
                                Ok(_) => break,
                                Err(DatastoreError::Conflict(_)) => conflicts += 1,
                                Err(e) => panic!("update failed: {e}"),
                            }
                        }
                    }
                    conflicts
                })
            })
            .collect();
        let conflicts: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();

        let wep = run(store.s().get::<WorkloadEndpoint>("ns1", "shared"))
            .unwrap()
            .unwrap();
        assert_eq!(wep.spec.profiles.len(), THREADS * UPDATES_PER_THREAD);
        let distinct: BTreeSet<&String> = wep.spec.profiles.iter().collect();
        assert_eq!(distinct.len(), THREADS * UPDATES_PER_THREAD);
        eprintln!("racing updates: {conflicts} conflicts retried");
    }

    const CHILD_PATH_ENV: &str = "CALICO_CNI_TEST_LOCALSTORE_PATH";
    const CHILD_INDEX_ENV: &str = "CALICO_CNI_TEST_LOCALSTORE_INDEX";

    /// Not a test on its own: the body of each child process spawned by
    /// `many_processes_open_a_fresh_file_at_once` (run with `--ignored`).
    #[test]
    #[ignore = "the child process of many_processes_open_a_fresh_file_at_once"]
    fn child_opens_store_and_creates_one_wep() {
        let (Ok(path), Ok(index)) = (
            std::env::var(CHILD_PATH_ENV),
            std::env::var(CHILD_INDEX_ENV),
        ) else {
            panic!(
                "run only as a child of many_processes_open_a_fresh_file_at_once ({CHILD_PATH_ENV}, {CHILD_INDEX_ENV} unset)"
            );
        };
        let path = PathBuf::from(path);
        // Wait for the starting gun so that all children open together.
        let go = path.with_extension("go");
        while !go.exists() {
            std::thread::sleep(Duration::from_millis(1));
        }
        let store = LocalStore::open(&path, TIMEOUT).unwrap();
        let wep = k8s_wep("ns1", &format!("child-{index}"));
        run(store.s().create(&mut wep.clone())).unwrap();
    }

    #[test]
    fn many_processes_open_a_fresh_file_at_once() {
        const PROCESSES: usize = 50;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fresh/store.db");
        let exe = std::env::current_exe().unwrap();

        let children: Vec<_> = (0..PROCESSES)
            .map(|i| {
                Command::new(&exe)
                    .args([
                        "--exact",
                        "datastore::local::tests::child_opens_store_and_creates_one_wep",
                        "--ignored",
                        "--test-threads=1",
                        "--quiet",
                    ])
                    .env(CHILD_PATH_ENV, &path)
                    .env(CHILD_INDEX_ENV, i.to_string())
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path.with_extension("go"), b"").unwrap();
        for mut child in children {
            assert!(child.wait().unwrap().success(), "a child process failed");
        }

        let store = LocalStore::open(&path, TIMEOUT).unwrap();
        let weps = run(store
            .s()
            .list::<WorkloadEndpoint>("ns1", &ListFilter::NamePrefix(("child-").to_string())))
        .unwrap();
        assert_eq!(weps.len(), PROCESSES);
        assert!(run(store.s().cluster_ready()).unwrap());
        let conn = Connection::open(&path).unwrap();
        let infos: i64 = conn
            .query_row(
                "SELECT count(*) FROM resources WHERE kind = 'ClusterInformation'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(infos, 1);
    }
}
