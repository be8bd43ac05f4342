//! Operations started together handed to one thread of the blocking
//! pool, which takes the connection once and runs them in order.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use rusqlite::Connection;

use super::lock;

/// An operation waiting for the connection.
pub(super) type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// The operations waiting for the connection, and a count of posts (a
/// job queued, or the store closed) that a thread waiting awake for work
/// polls without taking the lock: polling the lock itself made every
/// hand-off contend for it (the pushing thread put to sleep on a futex).
#[derive(Default)]
pub(super) struct Queue {
    state: Mutex<QueueState>,
    posts: AtomicUsize,
}

/// The queued operations, whether a thread of the blocking pool is already
/// on its way to run them, and whether the store is closed (dropped: no
/// operation will come).
#[derive(Default)]
pub(super) struct QueueState {
    jobs: Vec<Job>,
    draining: bool,
    closed: bool,
}

impl Queue {
    /// Queues `job`; `true` when no thread is on its way to run it (the
    /// caller starts one).
    pub(super) fn push(&self, job: Job) -> bool {
        let start = {
            let mut state = lock(&self.state);
            state.jobs.push(job);
            !std::mem::replace(&mut state.draining, true)
        };
        self.post();
        start
    }

    /// No job will come: a waiting thread leaves once the queue is empty.
    pub(super) fn close(&self) {
        lock(&self.state).closed = true;
        self.post();
    }

    /// Tells a waiting thread that the state changed (after the change).
    pub(super) fn post(&self) {
        self.posts.fetch_add(1, Ordering::SeqCst);
    }
}

/// Runs queued operations until none is left, nor comes within
/// [`crate::handoff::SPIN`] (a panicking one answers nothing: its caller
/// sees the worker fail). Once the store is closed it leaves as soon as
/// the queue is empty: the runtime's shutdown may wait for this thread.
pub(super) fn drain(conn: &Mutex<Connection>, queue: &Queue) {
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
