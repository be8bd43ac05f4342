//! The gRPC dataplane (calico-behaviour.md §7.4): with
//! `dataplane_options: {type: "grpc", socket: "unix:///path", ...}` the pod's
//! network is made by an external dataplane (VPP and the like), spoken to
//! over Calico's CNI backend protocol ([`proto`]) on that unix socket.
//! ADD's networking is one `Add` call once the addresses are known (the
//! backend names the host interface and the container's MAC); DEL's
//! CleanUpNamespace is one `Del` call; an ADD that fails after its `Add`
//! undoes it with a `Del`. Every call is bounded by 5 s (Calico's) and the
//! call's deadline; a backend answering `successful: false` is
//! `grpc dataplane error: <its message>`. Every string-valued entry of
//! `dataplane_options` (`type` and `socket` included) goes to the backend
//! as an option. The client is made only when a call uses this dataplane:
//! the veth path never touches it.

pub mod proto;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use http::uri::PathAndQuery;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::dataplane::{
    CleanupOutcome, Dataplane, DataplaneError, MacAddr, Networking, NetworkingOutcome, PreparedPod,
};

/// The longest one call to the backend may take (Calico's).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The routes a backend is given when the workload names none: both
/// families' defaults, as Calico sends them.
const DEFAULT_ROUTES: [&str; 2] = ["0.0.0.0/0", "::/0"];

/// The gRPC dataplane of one call.
pub struct GrpcDataplane {
    /// The socket's path, or why there is none.
    socket: Result<PathBuf, String>,
    options: BTreeMap<String, String>,
    /// What this call's `Add` made: (the host interface name asked for,
    /// interface, netns), for the undo of a failed ADD (which names the
    /// interface it asked for, whatever the backend called it).
    added: Mutex<Option<(String, String, String)>>,
}

impl GrpcDataplane {
    /// From `dataplane_options`; a missing or unusable socket is reported
    /// by the first call (ADD's config check refuses it first).
    pub fn new(options: &Map<String, Value>) -> GrpcDataplane {
        GrpcDataplane {
            socket: socket_path(options),
            options: options
                .iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect(),
            added: Mutex::new(None),
        }
    }

    /// One unary call: connected afresh (one call per plugin run at most
    /// two), bounded by [`CALL_TIMEOUT`] and `deadline`.
    async fn call<Req, Rep>(
        &self,
        path: &'static str,
        request: Req,
        deadline: Instant,
    ) -> Result<Rep, DataplaneError>
    where
        Req: prost::Message + Send + Sync + 'static,
        Rep: prost::Message + Default + Send + Sync + 'static,
    {
        let socket = self
            .socket
            .as_ref()
            .map_err(|e| DataplaneError::Config(e.clone()))?;
        let until = deadline.min(Instant::now() + CALL_TIMEOUT);
        let call = async {
            let mut grpc = connect(socket).await?;
            grpc.ready().await.map_err(|e| unreachable_at(socket, e))?;
            let reply = grpc
                .unary(
                    tonic::Request::new(request),
                    PathAndQuery::from_static(path),
                    tonic_prost::ProstCodec::<Req, Rep>::default(),
                )
                .await
                .map_err(|status| {
                    DataplaneError::Remote(format!(
                        "request to grpc dataplane at {} failed: {status}",
                        socket.display()
                    ))
                })?;
            Ok(reply.into_inner())
        };
        tokio::time::timeout_at(until, call).await.map_err(|_| {
            DataplaneError::Timeout(format!(
                "timed out waiting for the grpc dataplane at {}",
                socket.display()
            ))
        })?
    }

    /// `Del` for `ifname` in `netns`.
    async fn del(
        &self,
        ifname: &str,
        netns: &str,
        deadline: Instant,
    ) -> Result<(), DataplaneError> {
        let reply: proto::DelReply = self
            .call(
                proto::DEL_PATH,
                proto::DelRequest {
                    interface_name: ifname.to_string(),
                    netns: netns.to_string(),
                    dataplane_options: self.options.clone(),
                },
                deadline,
            )
            .await?;
        if !reply.successful {
            return Err(DataplaneError::Remote(format!(
                "grpc dataplane error: {}",
                reply.error_message
            )));
        }
        Ok(())
    }
}

/// The socket's path from `socket` (`unix:///path` or `unix:path`, as
/// gRPC names unix sockets).
fn socket_path(options: &Map<String, Value>) -> Result<PathBuf, String> {
    let Some(socket) = options.get("socket").and_then(Value::as_str) else {
        return Err("GRPC dataplane socket not configured".into());
    };
    let path = socket
        .strip_prefix("unix://")
        .or_else(|| socket.strip_prefix("unix:"))
        .ok_or_else(|| {
            format!("GRPC dataplane socket {socket:?} is not a unix socket (unix:///path)")
        })?;
    if path.is_empty() {
        return Err("GRPC dataplane socket not configured".into());
    }
    Ok(PathBuf::from(path))
}

fn unreachable_at(socket: &Path, e: impl std::fmt::Display) -> DataplaneError {
    DataplaneError::Remote(format!(
        "cannot connect to grpc dataplane: {}: {e}",
        socket.display()
    ))
}

/// An HTTP/2 connection over the unix socket, as a gRPC client.
async fn connect(socket: &Path) -> Result<tonic::client::Grpc<H2>, DataplaneError> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| unreachable_at(socket, e))?;
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(|e| unreachable_at(socket, e))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("grpc dataplane connection ended: {e}");
        }
    });
    // (Over a unix socket the authority is gRPC's own choice for one.)
    Ok(tonic::client::Grpc::with_origin(
        H2(sender),
        Uri::from_static("http://localhost"),
    ))
}

/// An HTTP/2 connection as the service tonic's client sends requests on.
#[derive(Clone)]
struct H2(SendRequest<tonic::body::Body>);

type ResponseFuture = Pin<
    Box<
        dyn std::future::Future<Output = hyper::Result<http::Response<hyper::body::Incoming>>>
            + Send,
    >,
>;

impl tower::Service<http::Request<tonic::body::Body>> for H2 {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.0.send_request(request))
    }
}

/// The `Add` request for `net` in `netns`.
fn add_request(
    net: &Networking,
    netns: &Path,
    options: &BTreeMap<String, String>,
) -> proto::AddRequest {
    let w = &net.workload;
    let routes: Vec<String> = if net.routes.is_empty() {
        DEFAULT_ROUTES.iter().map(|r| r.to_string()).collect()
    } else {
        net.routes.iter().map(|r| r.to_string()).collect()
    };
    proto::AddRequest {
        interface_name: net.ifname.clone(),
        netns: netns.display().to_string(),
        desired_host_interface_name: net.host_veth.clone(),
        settings: Some(proto::ContainerSettings {
            allow_ip_forwarding: net.allow_ip_forwarding,
            mtu: i32::try_from(net.mtu).unwrap_or(i32::MAX),
        }),
        container_ips: net
            .ipam_addresses
            .iter()
            .map(|(address, gateway)| proto::IpConfig {
                address: address.to_string(),
                gateway: gateway.map(|g| g.to_string()).unwrap_or_default(),
            })
            .collect(),
        container_routes: routes,
        workload: Some(proto::WorkloadIDs {
            name: w.name.clone(),
            namespace: w.namespace.clone(),
            labels: w.labels.clone(),
            annotations: w.annotations.clone(),
            endpoint: w.endpoint.clone(),
            node: w.node.clone(),
            orchestrator: w.orchestrator.clone(),
            pod: w.pod.clone(),
            ports: w
                .ports
                .iter()
                .map(|p| proto::Port {
                    name: p.name.clone(),
                    protocol: p.protocol.clone(),
                    port: u32::from(p.port),
                    host_port: u32::from(p.host_port),
                    host_ip: p.host_ip.clone(),
                })
                .collect(),
        }),
        dataplane_options: options.clone(),
    }
}

#[async_trait::async_trait]
impl Dataplane for GrpcDataplane {
    /// Nothing yet: the backend does everything in `Add`, which needs the
    /// addresses. Only a missing socket is refused here (whether the
    /// backend answers is the `Add`'s to find out).
    async fn prepare(
        &self,
        netns: &Path,
        _net: &Networking,
    ) -> Result<PreparedPod, DataplaneError> {
        if let Err(e) = &self.socket {
            return Err(DataplaneError::Config(e.clone()));
        }
        Ok(PreparedPod::Remote {
            netns: netns.to_path_buf(),
        })
    }

    async fn finish(
        &self,
        pod: &PreparedPod,
        net: &Networking,
    ) -> Result<NetworkingOutcome, DataplaneError> {
        let PreparedPod::Remote { netns } = pod else {
            return Err(DataplaneError::Netns(
                "a local pod given to the grpc dataplane".into(),
            ));
        };
        let reply: proto::AddReply = self
            .call(
                proto::ADD_PATH,
                add_request(net, netns, &self.options),
                net.deadline,
            )
            .await?;
        if !reply.successful {
            return Err(DataplaneError::Remote(format!(
                "grpc dataplane error: {}",
                reply.error_message
            )));
        }
        let host = if reply.host_interface_name.is_empty() {
            net.host_veth.clone()
        } else {
            reply.host_interface_name.clone()
        };
        *self.added.lock().expect("not poisoned") = Some((
            net.host_veth.clone(),
            net.ifname.clone(),
            netns.display().to_string(),
        ));
        let container_mac: MacAddr = reply.container_mac.parse().map_err(|e| {
            DataplaneError::Remote(format!(
                "grpc dataplane returned an unusable container MAC: {e}"
            ))
        })?;
        Ok(NetworkingOutcome {
            container_mac,
            host_interface: Some(host),
        })
    }

    fn is_remote(&self) -> bool {
        true
    }

    /// Nothing to look at here: the backend owns the pod's interfaces
    /// (Calico's CHECK asks nothing of it either).
    async fn check(
        &self,
        _netns: &Path,
        _expected: &Networking,
        _expected_mac: Option<MacAddr>,
    ) -> Result<(), DataplaneError> {
        Ok(())
    }

    async fn clean_up(
        &self,
        netns: &str,
        ifname: &str,
        deadline: Instant,
    ) -> Result<CleanupOutcome, DataplaneError> {
        self.del(ifname, netns, deadline).await?;
        Ok(CleanupOutcome::Deleted)
    }

    /// The undo of this call's `Add` (a `Del`); any other host interface
    /// is the backend's, not ours to remove.
    async fn delete_host_link(&self, name: &str) -> Result<bool, DataplaneError> {
        let added = self.added.lock().expect("not poisoned").clone();
        match added {
            Some((asked, ifname, netns)) if asked == name => {
                self.del(&ifname, &netns, Instant::now() + CALL_TIMEOUT)
                    .await?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn options(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn the_socket_is_a_unix_path() {
        assert_eq!(
            socket_path(&options(json!({"socket": "unix:///run/vpp/cni.sock"}))),
            Ok(PathBuf::from("/run/vpp/cni.sock"))
        );
        assert_eq!(
            socket_path(&options(json!({"socket": "unix:/run/x.sock"}))),
            Ok(PathBuf::from("/run/x.sock"))
        );
        for missing in [
            json!({}),
            json!({"socket": 5}),
            json!({"socket": "unix://"}),
        ] {
            assert_eq!(
                socket_path(&options(missing)),
                Err("GRPC dataplane socket not configured".to_string())
            );
        }
        assert!(
            socket_path(&options(json!({"socket": "127.0.0.1:5000"})))
                .unwrap_err()
                .contains("not a unix socket")
        );
    }

    #[test]
    fn string_options_go_to_the_backend() {
        let dp = GrpcDataplane::new(&options(json!({
            "type": "grpc", "socket": "unix:///s", "extra": "option", "n": 5, "b": true
        })));
        assert_eq!(
            dp.options,
            BTreeMap::from([
                ("extra".to_string(), "option".to_string()),
                ("socket".to_string(), "unix:///s".to_string()),
                ("type".to_string(), "grpc".to_string()),
            ])
        );
    }
}
