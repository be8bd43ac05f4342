//! CleanUpNamespace on the kernel: the pod's interface deleted inside its
//! netns (its host peer and host routes go with it).
//!
//! A veth's deletion is two things in one request: the kernel unlists the
//! pair (both ends down and gone from their namespaces, their routes
//! flushed, an RTM_DELLINK announced) within a millisecond or two, and
//! then, still inside the request, waits for RCU callbacks and for the
//! devices' last references (10-25 ms on a 2-core node) before it answers.
//! DEL needs only the first: once the interface is unlisted nothing routes
//! to the address any more, so the release can go on. The request is
//! therefore sent from the blocking pool while a socket subscribed to the
//! namespace's link announcements, made inside it beforehand, watches for
//! the interface's RTM_DELLINK; whichever comes first — that announcement
//! or the kernel's answer (an error, or a link that was not there) —
//! decides. The request's thread runs on to the answer by itself; the
//! process does not exit before it.

use std::path::Path;

use futures::StreamExt;
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload};
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::packet_route::link::LinkAttribute;
use rtnetlink::sys::{AsyncSocket, Socket, SocketAddr};
use tokio::time::Instant;

use crate::dataplane::netlink::{io_error, is_not_found, request_acked, sync_socket};
use crate::dataplane::netns::NetNs;
use crate::dataplane::{CleanupOutcome, DataplaneError};

/// Link announcements received before the watched interface's: a pod
/// namespace announces little else (the pair going down first).
type Announcements =
    futures::channel::mpsc::UnboundedReceiver<(NetlinkMessage<RouteNetlinkMessage>, SocketAddr)>;

/// CleanUpNamespace: deletes `ifname` inside the pod netns at `netns_path`
/// by `deadline`. A missing netns or link is success. Resolves as soon as
/// the interface is gone from the namespace (see the module's note).
pub fn clean_up_namespace(
    netns_path: &str,
    ifname: &str,
    deadline: Instant,
) -> impl std::future::Future<Output = Result<CleanupOutcome, DataplaneError>> + use<> {
    let netns_path = netns_path.to_string();
    let ifname = ifname.to_string();
    let opened = if netns_path.is_empty() {
        Ok(None)
    } else {
        NetNs::open(Path::new(&netns_path))
    };
    async move {
        let Some(netns) = opened? else {
            return Ok(CleanupOutcome::NetnsGone);
        };
        let runtime = tokio::runtime::Handle::current();
        let (watching, watched) = tokio::sync::oneshot::channel();
        let name = ifname.clone();
        let answered = crate::handoff::spawn_blocking(move || {
            let (watch, request) = netns.run(|| {
                let _context = runtime.enter();
                (watch_links(), sync_socket(&format!("delete link {name}")))
            })?;
            // Without a watch the answer alone decides.
            let _ = watching.send(watch);
            delete_by_name(&request?, &name)
        });
        let gone = async {
            match watched.await {
                Ok(Ok(announcements)) => unlisted(announcements, &ifname).await,
                Ok(Err(e)) => {
                    tracing::debug!(
                        "no watch on the pod's links ({e}); waiting for the kernel's answer"
                    );
                    std::future::pending().await
                }
                Err(_) => std::future::pending().await,
            }
        };
        let outcome = async {
            tokio::select! {
                answer = answered => answer
                    .map_err(|_| DataplaneError::Netns("the netns cleanup stopped".into()))?,
                () = gone => {
                    tracing::debug!("{ifname} unlisted; the kernel finishes its deletion meanwhile");
                    Ok(CleanupOutcome::Unlisted)
                }
            }
        };
        tokio::time::timeout_at(deadline, outcome)
            .await
            .map_err(|_| {
                DataplaneError::Timeout(format!("timed out deleting device in netns {netns_path}"))
            })?
    }
}

/// A socket subscribed to the calling thread's namespace's link
/// announcements, driven on the runtime whose context the thread entered.
fn watch_links() -> Result<Announcements, DataplaneError> {
    let (mut conn, _handle, announcements) =
        rtnetlink::new_connection().map_err(io_error("watch links"))?;
    conn.socket_mut()
        .socket_mut()
        .bind(&SocketAddr::new(0, rtnetlink::constants::RTMGRP_LINK))
        .map_err(io_error("watch links"))?;
    tokio::spawn(conn);
    Ok(announcements)
}

/// Resolves when `ifname`'s RTM_DELLINK arrives; never, if the watch ends
/// first (the kernel's answer then decides).
async fn unlisted(mut announcements: Announcements, ifname: &str) {
    while let Some((message, _)) = announcements.next().await {
        if let NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(link)) = message.payload
            && link
                .attributes
                .iter()
                .any(|a| matches!(a, LinkAttribute::IfName(n) if n == ifname))
        {
            return;
        }
    }
    std::future::pending().await
}

/// One RTM_DELLINK by name on `socket`, and the kernel's answer (the
/// kernel does the whole deletion within the send).
fn delete_by_name(socket: &Socket, ifname: &str) -> Result<CleanupOutcome, DataplaneError> {
    use rtnetlink::LinkUnspec;
    let t = std::time::Instant::now();
    let answer = request_acked(
        socket,
        RouteNetlinkMessage::DelLink(LinkUnspec::new_with_name(ifname).build()),
        0,
        &format!("delete link {ifname}"),
    );
    tracing::debug!("kernel delete of {ifname} took {:?}", t.elapsed());
    let outcome = match answer {
        Ok(()) => Ok(CleanupOutcome::Deleted),
        Err(e) if is_not_found(&e) => Ok(CleanupOutcome::LinkGone),
        Err(e) => Err(e),
    };
    if let Err(e) = &outcome {
        // Logged here too: the caller may have gone on at the announcement.
        tracing::warn!("deleting {ifname}: {e}");
    }
    outcome
}
