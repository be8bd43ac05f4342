//! One connection per call to a server that speaks HTTP/2 (the Kubernetes
//! API server, etcd's gateway): the call's first request goes alone, and
//! requests made meanwhile wait for its answer, then share the connection
//! it opened. Without the wait, each request in flight before the first
//! connection is up opens a connection of its own — a TCP and TLS
//! handshake on both sides apiece — only for all but one to be dropped
//! once ALPN has settled on HTTP/2 (hyper's pool learns the protocol only
//! from a finished handshake). A request that got no answer (a connection
//! error) lets the next one go alone in turn.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{Mutex, MutexGuard};

#[derive(Debug, Default)]
pub struct ConnectionGate {
    open: AtomicBool,
    first: Mutex<()>,
}

impl ConnectionGate {
    /// Held while the first request is in flight; `None` once a request
    /// has been answered (everyone goes at once).
    pub async fn turn(&self) -> Option<MutexGuard<'_, ()>> {
        if self.open.load(Ordering::Acquire) {
            return None;
        }
        let turn = self.first.lock().await;
        (!self.open.load(Ordering::Acquire)).then_some(turn)
    }

    /// A request got an answer: the connection is up and pooled.
    pub fn answered(&self) {
        self.open.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_goes_alone_and_the_rest_together_once_answered() {
        let gate = ConnectionGate::default();
        let first = gate.turn().await.expect("the first request's turn");
        // A second request waits while the first is in flight.
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(20), gate.turn());
        assert!(waiting.await.is_err(), "waits for the first");
        // Unanswered (a connection error): the next one goes alone.
        drop(first);
        let second = gate.turn().await.expect("alone in turn");
        gate.answered();
        drop(second);
        assert!(gate.turn().await.is_none(), "all at once from now on");
    }
}
