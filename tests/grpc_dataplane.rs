//! `dataplane_options: {type: "grpc", socket: ...}`: the plugin speaks
//! Calico's CNI backend protocol to a backend of our own here, which does
//! what Calico's own test backend does (cni-plugin/pkg/dataplane/grpc/
//! test_server_linux.go): it records every request, answers `successful`
//! as told, names the host interface as asked, gives the container MAC
//! 00:11:22:33:44:55, and on success makes (Add) or removes (Del) the
//! container's interface in the netns it was given. The cases are
//! Calico's ("communicates with the dataplane", "misconfigured", "invalid
//! dataplane type"), and the exact messages checked: the addresses, names
//! and options a backend receives.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use calico_cni::dataplane::grpc::proto::{AddReply, AddRequest, DelReply, DelRequest};
use common::*;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};

/// What the backend received.
#[derive(Debug, Clone)]
enum Received {
    Add(Box<AddRequest>),
    Del(DelRequest),
}

/// The test backend: a gRPC server on a unix socket of this test's own,
/// on a runtime thread of its own.
struct Backend {
    socket: PathBuf,
    succeed: Arc<AtomicBool>,
    received: Arc<Mutex<Vec<Received>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// `ip` inside the netns at `netns`.
fn ip_in(netns: &str, args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net={netns}"))
        .arg("ip")
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

#[derive(Clone)]
struct Handler {
    succeed: Arc<AtomicBool>,
    received: Arc<Mutex<Vec<Received>>>,
}

impl tonic::server::UnaryService<AddRequest> for Handler {
    type Response = AddReply;
    type Future = std::future::Ready<Result<tonic::Response<AddReply>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<AddRequest>) -> Self::Future {
        let req = request.into_inner();
        self.received
            .lock()
            .unwrap()
            .push(Received::Add(Box::new(req.clone())));
        let mut reply = AddReply {
            successful: self.succeed.load(Ordering::SeqCst),
            error_message: String::new(),
            host_interface_name: req.desired_host_interface_name.clone(),
            container_mac: "00:11:22:33:44:55".into(),
        };
        if reply.successful
            && let Err(e) = ip_in(
                &req.netns,
                &[
                    "link",
                    "add",
                    &req.interface_name,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "peer0",
                ],
            )
        {
            reply.successful = false;
            reply.error_message = format!("error adding veth: {e}");
        }
        std::future::ready(Ok(tonic::Response::new(reply)))
    }
}

impl tonic::server::UnaryService<DelRequest> for Handler {
    type Response = DelReply;
    type Future = std::future::Ready<Result<tonic::Response<DelReply>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<DelRequest>) -> Self::Future {
        let req = request.into_inner();
        self.received
            .lock()
            .unwrap()
            .push(Received::Del(req.clone()));
        let mut reply = DelReply {
            successful: self.succeed.load(Ordering::SeqCst),
            error_message: String::new(),
        };
        if reply.successful
            && Path::new(&req.netns).exists()
            && let Err(e) = ip_in(&req.netns, &["link", "del", &req.interface_name])
            && !e.contains("Cannot find device")
        {
            reply.successful = false;
            reply.error_message = format!("error deleting veth: {e}");
        }
        std::future::ready(Ok(tonic::Response::new(reply)))
    }
}

impl Backend {
    fn start(succeed: bool) -> Backend {
        let dir = std::env::temp_dir();
        let socket = dir.join(format!("cni_grpc_dataplane_test{}.sock", unique()));
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        listener.set_nonblocking(true).unwrap();
        let succeed = Arc::new(AtomicBool::new(succeed));
        let received = Arc::new(Mutex::new(Vec::new()));
        let handler = Handler {
            succeed: succeed.clone(),
            received: received.clone(),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            block_on(async move {
                let listener = tokio::net::UnixListener::from_std(listener).unwrap();
                let serve = async {
                    loop {
                        let (stream, _) = listener.accept().await.unwrap();
                        let handler = handler.clone();
                        let service = hyper::service::service_fn(
                            move |req: http::Request<hyper::body::Incoming>| {
                                let handler = handler.clone();
                                async move {
                                    let response = match req.uri().path() {
                                        "/cni.CniDataplane/Add" => {
                                            tonic::server::Grpc::new(tonic_prost::ProstCodec::<
                                                AddReply,
                                                AddRequest,
                                            >::default(
                                            ))
                                            .unary(handler, req)
                                            .await
                                        }
                                        "/cni.CniDataplane/Del" => {
                                            tonic::server::Grpc::new(tonic_prost::ProstCodec::<
                                                DelReply,
                                                DelRequest,
                                            >::default(
                                            ))
                                            .unary(handler, req)
                                            .await
                                        }
                                        _ => tonic::Status::unimplemented("no such method")
                                            .into_http(),
                                    };
                                    Ok::<_, std::convert::Infallible>(response)
                                }
                            },
                        );
                        tokio::spawn(async move {
                            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        });
                    }
                };
                tokio::select! {
                    _ = serve => {}
                    _ = stopped => {}
                }
            })
        });
        Backend {
            socket,
            succeed,
            received,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn set_result(&self, succeed: bool) {
        self.succeed.store(succeed, Ordering::SeqCst);
    }

    /// What it received since the last call.
    fn take(&self) -> Vec<Received> {
        std::mem::take(&mut *self.received.lock().unwrap())
    }

    fn target(&self) -> String {
        format!("unix://{}", self.socket.display())
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn one_add(received: Vec<Received>) -> AddRequest {
    match received.as_slice() {
        [Received::Add(a)] => (**a).clone(),
        other => panic!("expected one Add, got {other:?}"),
    }
}

fn one_del(received: Vec<Received>) -> DelRequest {
    match received.as_slice() {
        [Received::Del(d)] => d.clone(),
        other => panic!("expected one Del, got {other:?}"),
    }
}

fn grpc_setup(backend: &Backend) -> Setup {
    let mut s = Setup::new("1.0.0", false);
    s.conf["dataplane_options"] =
        json!({"type": "grpc", "socket": backend.target(), "extra": "option"});
    s
}

#[test]
fn the_backend_gets_calicos_messages_and_its_failures_reach_the_caller() {
    if !root_or_skip("grpc_dataplane_communicates") {
        return;
    }
    let backend = Backend::start(true);
    let s = grpc_setup(&backend);
    let ns = Netns::new();
    let cid = container_id();

    // ADD: one Add with the pod's addresses, names and the options.
    let result = s.run("ADD", &cid, &ns.path(), "eth0").assert_ok().json();
    let add = one_add(backend.take());
    let address = result["ips"][0]["address"].as_str().unwrap().to_string();
    assert_eq!(add.interface_name, "eth0");
    assert_eq!(add.netns, ns.path());
    assert_eq!(add.desired_host_interface_name, host_veth(&cid));
    // (host-local's gateway: the range's first address.)
    let gateway = s.subnet.replace(".0/24", ".1");
    assert_eq!(add.container_ips.len(), 1);
    assert_eq!(
        add.container_ips[0].address,
        // As the IPAM returned it (host-local: the range's prefix).
        format!("{}/24", address.split('/').next().unwrap())
    );
    assert_eq!(add.container_ips[0].gateway, gateway);
    assert_eq!(add.container_routes, ["0.0.0.0/0", "::/0"]);
    let settings = add.settings.unwrap();
    assert!(!settings.allow_ip_forwarding);
    let w = add.workload.unwrap();
    assert_eq!(
        (
            w.orchestrator.as_str(),
            w.endpoint.as_str(),
            w.node.as_str(),
            w.pod.as_str()
        ),
        ("cni", "eth0", "test-node", "")
    );
    assert_eq!(w.name, format!("test--node-cni-{cid}-eth0"));
    assert_eq!(w.namespace, "default");
    assert_eq!(
        add.dataplane_options,
        [
            ("extra".to_string(), "option".to_string()),
            ("socket".to_string(), backend.target()),
            ("type".to_string(), "grpc".to_string()),
        ]
        .into_iter()
        .collect()
    );
    // The backend's answer is the pod's: its interface, its MAC.
    assert_eq!(result["interfaces"][0]["name"], host_veth(&cid));
    assert_eq!(result["interfaces"][1]["mac"], "00:11:22:33:44:55");
    let endpoint = &s.endpoints()[0];
    assert_eq!(endpoint["spec"]["interfaceName"], host_veth(&cid));
    assert_eq!(endpoint["spec"]["mac"], "00:11:22:33:44:55");
    assert!(ns.link("eth0").is_some(), "the backend's interface");
    assert!(!host_link_exists(&host_veth(&cid)), "no local veth");

    // A backend failing Del: DEL exits non-zero.
    backend.set_result(false);
    let out = s.run("DEL", &cid, &ns.path(), "eth0");
    assert_ne!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("grpc dataplane error"), "{out:?}");
    one_del(backend.take());

    // Then succeeding: DEL exits 0, the interface and the address gone.
    backend.set_result(true);
    s.run("DEL", &cid, &ns.path(), "eth0").assert_ok();
    let del = one_del(backend.take());
    assert_eq!(del.netns, ns.path());
    assert_eq!(del.interface_name, "eth0");
    assert_eq!(
        del.dataplane_options.get("extra").map(String::as_str),
        Some("option")
    );
    assert!(ns.link("eth0").is_none());
    assert!(s.reservations().is_empty());
    assert!(s.endpoints().is_empty());

    // An ADD failing after the backend's Add (here: right after the
    // endpoint is written) undoes it with a Del, and takes nothing.
    let (ns2, cid2) = (Netns::new(), container_id());
    let out = s.run_with(
        "ADD",
        &cid2,
        &ns2.path(),
        "eth0",
        &s.conf,
        &[("CALICO_CNI_FAIL_AFTER", "endpoint")],
    );
    assert_ne!(out.code, 0, "{out:?}");
    match backend.take().as_slice() {
        [Received::Add(a), Received::Del(d)] => {
            assert_eq!(
                (a.netns.as_str(), d.netns.as_str()),
                (ns2.path().as_str(), ns2.path().as_str())
            );
            assert_eq!(d.interface_name, "eth0");
        }
        other => panic!("expected Add then Del, got {other:?}"),
    }
    assert!(ns2.link("eth0").is_none());
    assert!(s.reservations().is_empty());
    assert!(s.endpoints().is_empty());

    // A backend failing Add: ADD fails with its message, and takes nothing.
    backend.set_result(false);
    let out = s.run("ADD", &container_id(), &ns.path(), "eth0");
    assert_ne!(out.code, 0);
    assert_eq!(
        out.json()["msg"]
            .as_str()
            .map(|m| m.contains("grpc dataplane error: ")),
        Some(true),
        "{out:?}"
    );
    one_add(backend.take());
    assert!(s.reservations().is_empty());
    assert!(s.endpoints().is_empty());
}

#[test]
fn a_missing_backend_or_a_bad_dataplane_config_fails_add_and_leaves_nothing() {
    if !root_or_skip("grpc_dataplane_misconfigured") {
        return;
    }
    let ns = Netns::new();
    let mut s = Setup::new("1.0.0", false);
    let cases: [(Value, u64, &str); 3] = [
        (
            json!({"type": "grpc", "socket": "unix:///tmp/xxxx-non-existent-dont-create-this-please.sock"}),
            101,
            "cannot connect to grpc dataplane: /tmp/xxxx-non-existent-dont-create-this-please.sock",
        ),
        (
            json!({"type": "grpc"}),
            7,
            "GRPC dataplane socket not configured",
        ),
        (
            json!({"type": "invalid-dataplane-type"}),
            7,
            "invalid dataplane type: invalid-dataplane-type",
        ),
    ];
    for (options, code, msg) in cases {
        s.conf["dataplane_options"] = options.clone();
        let out = s.run("ADD", &container_id(), &ns.path(), "eth0");
        assert_eq!(out.error_code(), code, "{options}: {out:?}");
        assert!(
            out.json()["msg"].as_str().unwrap_or_default().contains(msg)
                || out.json()["details"]
                    .as_str()
                    .unwrap_or_default()
                    .contains(msg),
            "{options}: {out:?}"
        );
        assert!(s.reservations().is_empty(), "{options}");
        assert!(s.endpoints().is_empty(), "{options}");
        assert!(ns.link("eth0").is_none(), "{options}");
    }
}
