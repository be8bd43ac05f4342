//! One connection per call to a server that speaks HTTP/2 (the Kubernetes
//! API server, etcd's gateway): the call's first request goes alone, and
//! requests made meanwhile wait until its connection is up — the TLS
//! handshake settled on HTTP/2 ([`Announcing`], the connector's wrapper,
//! says so; hyper pools such a connection before the first request is even
//! sent) or, for a server that chose HTTP/1.1, the first answer — then
//! share the connection it opened. Without the wait, each request in flight
//! before the first connection is up opens a connection of its own — a TCP
//! and TLS handshake on both sides apiece — only for all but one to be
//! dropped once ALPN has settled on HTTP/2 (hyper's pool learns the
//! protocol only from a finished handshake). A request that got no answer
//! (a connection error) lets the next one go alone in turn.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::Connection;
use tokio::sync::{Mutex, MutexGuard, watch};

#[derive(Debug)]
pub struct ConnectionGate {
    /// Whether everyone may go at once.
    open: watch::Sender<bool>,
    first: Mutex<()>,
}

impl Default for ConnectionGate {
    fn default() -> ConnectionGate {
        ConnectionGate {
            open: watch::Sender::new(false),
            first: Mutex::new(()),
        }
    }
}

impl ConnectionGate {
    /// Held while the first request is in flight and its connection not
    /// yet up; `None` once it is (everyone goes at once).
    pub async fn turn(&self) -> Option<MutexGuard<'_, ()>> {
        if *self.open.borrow() {
            return None;
        }
        let mut open = self.open.subscribe();
        tokio::select! {
            biased;
            _ = open.wait_for(|open| *open) => None,
            turn = self.first.lock() => (!*self.open.borrow()).then_some(turn),
        }
    }

    /// The connection is up and pooled: a request got an answer, or (from
    /// [`Announcing`]) a connection settled on HTTP/2, which hyper pools
    /// for every request before it sends the one that opened it.
    pub fn opened(&self) {
        self.open.send_replace(true);
    }
}

/// A connector that tells `gate` when a connection it made settled on
/// HTTP/2.
#[derive(Clone)]
pub struct Announcing<C> {
    inner: C,
    gate: Arc<ConnectionGate>,
}

impl<C> Announcing<C> {
    pub fn new(inner: C, gate: Arc<ConnectionGate>) -> Announcing<C> {
        Announcing { inner, gate }
    }
}

impl<C> tower::Service<http::Uri> for Announcing<C>
where
    C: tower::Service<http::Uri>,
    C::Response: Connection,
    C::Future: Send + 'static,
{
    type Response = C::Response;
    type Error = C::Error;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, C::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), C::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let gate = Arc::clone(&self.gate);
        Box::pin(async move {
            let io = connecting.await?;
            if io.connected().is_negotiated_h2() {
                gate.opened();
            }
            Ok(io)
        })
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
        gate.opened();
        drop(second);
        assert!(gate.turn().await.is_none(), "all at once from now on");
    }

    /// A connection as a connector hands it over, settled on `h2` or not.
    struct Connected(bool);

    impl Connection for Connected {
        fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
            let c = hyper_util::client::legacy::connect::Connected::new();
            if self.0 { c.negotiated_h2() } else { c }
        }
    }

    #[tokio::test]
    async fn the_rest_go_once_the_first_connection_settles_on_http2() {
        use tower::Service;
        let gate = Arc::new(ConnectionGate::default());
        let first = gate.turn().await.expect("the first request's turn");
        let h2 = |yes: bool| {
            tower::service_fn(move |_: http::Uri| async move {
                Ok::<_, std::convert::Infallible>(Connected(yes))
            })
        };
        let uri = http::Uri::from_static("https://127.0.0.1:6443");
        // HTTP/1.1: the others still wait for the first answer.
        let mut connector = Announcing::new(h2(false), Arc::clone(&gate));
        let _ = connector.call(uri.clone()).await;
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(20), gate.turn());
        assert!(waiting.await.is_err(), "waits for the first answer");
        // HTTP/2: they go at once, the first still unanswered.
        let mut connector = Announcing::new(h2(true), Arc::clone(&gate));
        let _ = connector.call(uri).await;
        let went = tokio::time::timeout(std::time::Duration::from_millis(20), gate.turn());
        assert!(
            matches!(went.await, Ok(None)),
            "goes with the first in flight"
        );
        drop(first);
    }
}
