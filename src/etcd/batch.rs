//! Reads made together, sent together: the ranges a call asks for at once
//! (an ADD's readiness check, IPAM configuration, pools, reservations and
//! affinities; a DEL's handles) are gathered while the runtime runs every
//! task that is ready, then sent as one read-only transaction rather than
//! a request apiece. On a busy etcd each request through its gateway costs
//! more than the ranges it carries, so a burst of pods waits less on it.
//! A read made alone is sent as a plain range, as before. A caller about
//! to read once a short local step is done (a file read off the runtime
//! thread) holds the batch meanwhile ([`Batch::hold`]), so that its reads
//! still go with the others.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{EtcdError, KeyValue, RangeRequest, Transport};

type Answer = Result<Vec<KeyValue>, EtcdError>;

/// The reads waiting to be sent, with where each answer goes.
#[derive(Default)]
pub struct Batch {
    waiting: Mutex<Vec<(RangeRequest, oneshot::Sender<Answer>)>>,
    /// How many [`Hold`]s are alive, and where their end is told.
    holds: Mutex<usize>,
    released: tokio::sync::Notify,
}

/// While alive, the reads waiting are not sent (up to the deadline): its
/// holder's reads, made before it is dropped, go with them.
pub struct Hold(Arc<Batch>);

impl Drop for Hold {
    fn drop(&mut self) {
        let mut holds = self.0.holds.lock().unwrap_or_else(PoisonError::into_inner);
        *holds -= 1;
        if *holds == 0 {
            self.0.released.notify_waiters();
        }
    }
}

impl Batch {
    /// Reads `range` with the others made meanwhile, on `transport`, by
    /// `deadline`.
    pub async fn read(
        self: &Arc<Self>,
        transport: &Transport,
        range: RangeRequest,
        deadline: Instant,
    ) -> Answer {
        let (answer, answered) = oneshot::channel();
        let first = {
            let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            waiting.push((range, answer));
            waiting.len() == 1
        };
        if first {
            // Sent by a task of its own, so that a reader that stops
            // waiting (a timeout, a select) takes no one else's read with it.
            let batch = Arc::clone(self);
            let transport = transport.clone();
            tokio::spawn(async move {
                // Every task ready now runs before this one goes on.
                tokio::task::yield_now().await;
                batch.send(&transport, deadline).await;
            });
        }
        answered.await.unwrap_or_else(|_| {
            Err(EtcdError::Unavailable(
                "the read was dropped before it was sent".into(),
            ))
        })
    }

    /// Holds the reads back until the [`Hold`] is dropped: the holder's
    /// reads, made meanwhile, are sent with the others'.
    pub fn hold(self: &Arc<Self>) -> Hold {
        *self.holds.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        Hold(Arc::clone(self))
    }

    /// Until no [`Hold`] is alive, or the deadline.
    async fn held_back(&self, deadline: Instant) {
        loop {
            let released = self.released.notified();
            if *self.holds.lock().unwrap_or_else(PoisonError::into_inner) == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                return;
            }
        }
    }

    async fn send(&self, transport: &Transport, deadline: Instant) {
        self.held_back(deadline).await;
        let waiting =
            std::mem::take(&mut *self.waiting.lock().unwrap_or_else(PoisonError::into_inner));
        let (ranges, answers): (Vec<_>, Vec<_>) = waiting.into_iter().unzip();
        let found = match ranges.as_slice() {
            [] => return,
            [range] => transport.range(range, deadline).await.map(|kvs| vec![kvs]),
            _ => {
                tracing::trace!(reads = ranges.len(), "reads sent in one transaction");
                transport.ranges(&ranges, deadline).await
            }
        };
        match found {
            Ok(found) => {
                for (to, kvs) in answers.into_iter().zip(found) {
                    let _ = to.send(Ok(kvs));
                }
            }
            Err(e) => {
                for to in answers {
                    let _ = to.send(Err(e.clone()));
                }
            }
        }
    }
}
