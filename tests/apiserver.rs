//! The fake Kubernetes API server, exercised over real HTTP/1.1 with a
//! minimal client (one request per connection).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::apiserver::*;
use serde_json::{Value, json};

const SMP: &str = "application/strategic-merge-patch+json";
const MERGE: &str = "application/merge-patch+json";
const CALICO: &str = "crd.projectcalico.org";

struct Reply {
    status: u16,
    headers: String,
    body: Value,
}

struct Req<'a> {
    method: &'a str,
    path: &'a str,
    headers: Vec<(&'a str, &'a str)>,
    body: Option<String>,
    timeout: Duration,
}

fn req<'a>(method: &'a str, path: &'a str) -> Req<'a> {
    Req {
        method,
        path,
        headers: Vec::new(),
        body: None,
        timeout: Duration::from_secs(5),
    }
}

impl<'a> Req<'a> {
    fn header(mut self, name: &'a str, value: &'a str) -> Self {
        self.headers.push((name, value));
        self
    }
    fn json(mut self, body: &Value) -> Self {
        self.body = Some(body.to_string());
        self
    }
    fn raw(mut self, body: &str) -> Self {
        self.body = Some(body.to_owned());
        self
    }

    /// Sends the request and reads the whole answer.
    fn send(self, server: &FakeApiServer) -> std::io::Result<Reply> {
        let mut stream = self.connect(server)?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw)?;
        let raw = String::from_utf8(raw).expect("UTF-8 response");
        let (head, body) = raw.split_once("\r\n\r\n").expect("end of the headers");
        let (status_line, headers) = head.split_once("\r\n").unwrap_or((head, ""));
        let mut words = status_line.split(' ');
        assert_eq!(
            words.next(),
            Some("HTTP/1.1"),
            "status line {status_line:?}"
        );
        let status = words
            .next()
            .and_then(|s| s.parse().ok())
            .expect("status code");
        let body = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(body).expect("JSON body")
        };
        Ok(Reply {
            status,
            headers: headers.to_ascii_lowercase(),
            body,
        })
    }

    fn ok(self, server: &FakeApiServer) -> Reply {
        self.send(server).expect("HTTP exchange")
    }

    /// Connects and writes the request.
    fn connect(&self, server: &FakeApiServer) -> std::io::Result<TcpStream> {
        let url = server.url();
        let host = url.strip_prefix("http://").expect("http URL");
        let mut stream = TcpStream::connect(host)?;
        stream.set_read_timeout(Some(self.timeout))?;
        let body = self.body.as_deref().unwrap_or("");
        let mut head = format!(
            "{} {} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nAccept: application/json\r\nContent-Length: {}\r\n",
            self.method,
            self.path,
            body.len()
        );
        for (name, value) in &self.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes())?;
        stream.write_all(body.as_bytes())?;
        Ok(stream)
    }
}

/// Checks a Kubernetes Status answer.
fn assert_status(reply: &Reply, code: u16, reason: &str) {
    assert_eq!(reply.status, code, "{}", reply.body);
    assert!(
        reply.headers.contains("content-type: application/json"),
        "{}",
        reply.headers
    );
    let b = &reply.body;
    assert_eq!(
        (b["kind"].as_str(), b["apiVersion"].as_str()),
        (Some("Status"), Some("v1")),
        "{b}"
    );
    assert_eq!(b["status"], "Failure");
    assert_eq!(b["metadata"], json!({}));
    assert_eq!(b["reason"], reason, "{b}");
    assert_eq!(b["code"], code);
    assert!(b["message"].as_str().is_some_and(|m| !m.is_empty()), "{b}");
}

fn rv(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("decimal resourceVersion")
}

fn pod(ns: &str, name: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": ns, "annotations": {"a": "1", "b": "2"}},
        "spec": {"nodeName": "node1", "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Pending"}})
}

fn pool(name: &str) -> Value {
    json!({"apiVersion": "crd.projectcalico.org/v1", "kind": "IPPool", "metadata": {"name": name},
        "spec": {"cidr": "10.244.0.0/16", "blockSize": 26}})
}

#[test]
fn version_and_404s_are_status_objects() {
    let server = FakeApiServer::start();
    assert!(server.url().starts_with("http://127.0.0.1:"));

    let version = req("GET", "/version").ok(&server);
    assert_eq!(version.status, 200);
    assert_eq!(
        (
            version.body["major"].as_str(),
            version.body["minor"].as_str()
        ),
        (Some("1"), Some("33"))
    );
    assert_eq!(version.body["gitVersion"], "v1.33.0");

    let missing = req("GET", "/api/v1/namespaces/default/pods/nope").ok(&server);
    assert_status(&missing, 404, "NotFound");
    assert_eq!(missing.body["message"], "pods \"nope\" not found");
    assert_eq!(
        missing.body["details"],
        json!({"name": "nope", "kind": "pods"})
    );

    assert_status(
        &req("GET", "/api/v1/nodes/node1").ok(&server),
        404,
        "NotFound",
    );
    assert_status(
        &req("GET", "/api/v1/namespaces/kube-system").ok(&server),
        404,
        "NotFound",
    );
    let missing_cr = req("GET", "/apis/crd.projectcalico.org/v1/ippools/p").ok(&server);
    assert_status(&missing_cr, 404, "NotFound");
    assert_eq!(
        missing_cr.body["message"],
        "ippools.crd.projectcalico.org \"p\" not found"
    );
    assert_eq!(
        missing_cr.body["details"],
        json!({"name": "p", "group": CALICO, "kind": "ippools"})
    );

    for path in [
        "/",
        "/healthz",
        "/api/v1/namespaces/default/services/x",
        "/api/v1//nodes",
        "/apis/g",
    ] {
        assert_status(&req("GET", path).ok(&server), 404, "NotFound");
    }
    assert_status(
        &req("DELETE", "/api/v1/nodes/node1").ok(&server),
        405,
        "MethodNotAllowed",
    );
}

#[test]
fn stored_objects_are_served() {
    let server = FakeApiServer::start();
    let ns = server.put_namespace(json!({"metadata": {"name": "default"}}));
    let node = server.put_node(json!({"metadata": {"name": "node1", "labels": {"zone": "a"}}}));
    let stored = server.put_pod(pod("default", "web"));

    let uid = stored["metadata"]["uid"].as_str().expect("uid");
    assert_eq!(uid.len(), 36, "{uid}");
    assert!(rv(&stored) > rv(&node) && rv(&node) > rv(&ns));
    let created = stored["metadata"]["creationTimestamp"]
        .as_str()
        .expect("creationTimestamp");
    assert!(
        created.len() == 20 && created.ends_with('Z') && created.as_bytes()[10] == b'T',
        "{created}"
    );
    assert_eq!(
        (stored["apiVersion"].as_str(), stored["kind"].as_str()),
        (Some("v1"), Some("Pod"))
    );

    let got = req("GET", "/api/v1/namespaces/default/pods/web").ok(&server);
    assert_eq!(got.status, 200);
    assert!(got.headers.contains("content-type: application/json"));
    assert_eq!(got.body, stored);
    assert_eq!(
        req("GET", "/api/v1/namespaces/default").ok(&server).body,
        ns
    );
    assert_eq!(req("GET", "/api/v1/nodes/node1").ok(&server).body, node);
    assert_eq!(server.pod("default", "web"), Some(stored.clone()));

    // Replacing keeps the uid unless one is given; a deleted pod is gone.
    let replaced = server.put_pod(pod("default", "web"));
    assert_eq!(replaced["metadata"]["uid"], stored["metadata"]["uid"]);
    assert!(rv(&replaced) > rv(&stored));
    server.delete_pod("default", "web");
    assert_eq!(server.pod("default", "web"), None);
    assert_status(
        &req("GET", "/api/v1/namespaces/default/pods/web").ok(&server),
        404,
        "NotFound",
    );
}

#[test]
fn patching_a_pod_merges_metadata() {
    let server = FakeApiServer::start();
    let stored = server.put_pod(pod("ns1", "web"));
    let status_path = "/api/v1/namespaces/ns1/pods/web/status";

    let patch = json!({"metadata": {"annotations": {"c": "3", "a": null}},
        "spec": {"nodeName": "elsewhere"}, "status": {"podIP": "10.0.0.1"}});
    let patched = req("PATCH", status_path)
        .header("Content-Type", SMP)
        .json(&patch)
        .ok(&server);
    assert_eq!(patched.status, 200, "{}", patched.body);
    let p = &patched.body;
    assert_eq!(p["metadata"]["annotations"], json!({"b": "2", "c": "3"}));
    assert_eq!(p["metadata"]["uid"], stored["metadata"]["uid"]);
    assert_eq!(
        p["metadata"]["creationTimestamp"],
        stored["metadata"]["creationTimestamp"]
    );
    assert!(rv(p) > rv(&stored));
    assert_eq!(
        p["spec"], stored["spec"],
        "the status subresource keeps the spec"
    );
    assert_eq!(
        p["status"],
        json!({"phase": "Pending", "podIP": "10.0.0.1"})
    );
    assert_eq!(server.pod("ns1", "web").as_ref(), Some(p));

    // The main resource, as a JSON merge patch: metadata and spec, not status.
    let patch = json!({"metadata": {"labels": {"app": "web"}, "annotations": null}, "status": {"phase": "Running"}});
    let main = req("PATCH", "/api/v1/namespaces/ns1/pods/web")
        .header("Content-Type", MERGE)
        .json(&patch)
        .ok(&server);
    assert_eq!(main.status, 200, "{}", main.body);
    assert_eq!(main.body["metadata"]["labels"], json!({"app": "web"}));
    assert!(main.body["metadata"].get("annotations").is_none());
    assert_eq!(main.body["status"]["phase"], "Pending");
    assert!(rv(&main.body) > rv(p));

    let missing = req("PATCH", "/api/v1/namespaces/ns1/pods/gone/status")
        .header("Content-Type", SMP)
        .raw("{}");
    assert_status(&missing.ok(&server), 404, "NotFound");
    let json_patch = req("PATCH", status_path)
        .header("Content-Type", "application/json-patch+json")
        .raw("[]");
    assert_status(&json_patch.ok(&server), 415, "UnsupportedMediaType");
    for bad in ["not json", "[1]", "{\"metadata\": 3}"] {
        let reply = req("PATCH", status_path)
            .header("Content-Type", SMP)
            .raw(bad)
            .ok(&server);
        assert_status(&reply, 400, "BadRequest");
    }
}

#[test]
fn pod_patch_preconditions_conflict() {
    let server = FakeApiServer::start();
    let stored = server.put_pod(pod("ns1", "web"));
    let uid = stored["metadata"]["uid"].as_str().expect("uid").to_owned();
    let current = stored["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_owned();
    let path = "/api/v1/namespaces/ns1/pods/web/status";
    let patch = |meta: Value| {
        req("PATCH", path)
            .header("Content-Type", SMP)
            .json(&json!({"metadata": meta}))
    };

    let stale = patch(json!({"resourceVersion": "1", "annotations": {"x": "y"}})).ok(&server);
    assert_status(&stale, 409, "Conflict");
    assert_eq!(
        stale.body["message"],
        "Operation cannot be fulfilled on pods \"web\": the object has been modified; \
         please apply your changes to the latest version and try again"
    );
    assert_eq!(
        stale.body["details"],
        json!({"name": "web", "kind": "pods"})
    );

    let other_uid = patch(json!({"uid": "0000", "annotations": {"x": "y"}})).ok(&server);
    assert_status(&other_uid, 409, "Conflict");
    let message = other_uid.body["message"].as_str().expect("message");
    assert!(
        message.ends_with(&format!(
            "Precondition failed: UID in precondition: 0000, UID in object meta: {uid}"
        )),
        "{message}"
    );
    assert_eq!(
        server.pod("ns1", "web"),
        Some(stored.clone()),
        "a failed precondition changes nothing"
    );

    let ok = patch(json!({"resourceVersion": current, "uid": uid, "annotations": {"x": "y"}}))
        .ok(&server);
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(ok.body["metadata"]["uid"], uid);
    assert_eq!(ok.body["metadata"]["annotations"]["x"], "y");
    assert!(rv(&ok.body) > rv(&stored));

    // The old resourceVersion is now stale.
    let again = patch(json!({"resourceVersion": current})).ok(&server);
    assert_status(&again, 409, "Conflict");
}

#[test]
fn custom_resource_lifecycle() {
    let server = FakeApiServer::start();
    let pools = "/apis/crd.projectcalico.org/v1/ippools";
    let one = format!("{pools}/default-pool");

    let created = req("POST", pools)
        .header("Content-Type", "application/json")
        .json(&pool("default-pool"))
        .ok(&server);
    assert_eq!(created.status, 201, "{}", created.body);
    let created = created.body;
    assert_eq!(created["metadata"]["uid"].as_str().map(str::len), Some(36));
    assert!(created["metadata"]["creationTimestamp"].is_string());
    assert!(created["metadata"].get("namespace").is_none());
    assert_eq!(
        server.custom(CALICO, "v1", "ippools", None, "default-pool"),
        Some(created.clone())
    );

    let dup = req("POST", pools).json(&pool("default-pool")).ok(&server);
    assert_status(&dup, 409, "AlreadyExists");
    assert_eq!(
        dup.body["message"],
        "ippools.crd.projectcalico.org \"default-pool\" already exists"
    );
    let mut with_rv = pool("other");
    with_rv["metadata"]["resourceVersion"] = json!("5");
    assert_status(
        &req("POST", pools).json(&with_rv).ok(&server),
        500,
        "InternalError",
    );
    assert_status(
        &req("POST", pools)
            .json(&json!({"metadata": {"name": "x"}}))
            .ok(&server),
        400,
        "BadRequest",
    );
    assert_status(&req("POST", pools).raw("{").ok(&server), 400, "BadRequest");
    let unnamed = json!({"kind": "IPPool", "metadata": {}});
    assert_status(
        &req("POST", pools).json(&unnamed).ok(&server),
        422,
        "Invalid",
    );

    assert_eq!(req("GET", &one).ok(&server).body, created);
    server.put_custom(CALICO, "v1", "ippools", pool("second-pool"));
    let list = req("GET", pools).ok(&server);
    assert_eq!(list.status, 200);
    assert_eq!(
        (list.body["apiVersion"].as_str(), list.body["kind"].as_str()),
        (Some("crd.projectcalico.org/v1"), Some("IPPoolList"))
    );
    let names: Vec<&str> = list.body["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["default-pool", "second-pool"]);
    assert!(
        list.body["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|r| r.parse::<u64>().ok())
            .is_some_and(|r| r >= rv(&created))
    );

    // Updates need the current resourceVersion.
    let mut update = created.clone();
    update["spec"]["disabled"] = json!(true);
    update["metadata"]["resourceVersion"] = json!("1");
    let stale = req("PUT", &one).json(&update).ok(&server);
    assert_status(&stale, 409, "Conflict");
    assert!(
        stale.body["message"]
            .as_str()
            .is_some_and(|m| m.contains("the object has been modified"))
    );
    update["metadata"]
        .as_object_mut()
        .map(|m| m.remove("resourceVersion"));
    assert_status(&req("PUT", &one).json(&update).ok(&server), 422, "Invalid");
    update["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"].clone();
    let updated = req("PUT", &one).json(&update).ok(&server);
    assert_eq!(updated.status, 200, "{}", updated.body);
    assert_eq!(updated.body["spec"]["disabled"], true);
    assert_eq!(updated.body["metadata"]["uid"], created["metadata"]["uid"]);
    assert!(rv(&updated.body) > rv(&created));
    assert_status(
        &req("PUT", &format!("{pools}/absent"))
            .json(&pool("absent"))
            .ok(&server),
        404,
        "NotFound",
    );
    assert_status(
        &req("PUT", &format!("{pools}/elsewhere"))
            .json(&update)
            .ok(&server),
        400,
        "BadRequest",
    );

    // Deletion honours DeleteOptions preconditions.
    let options = |uid: &Value| json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}});
    let wrong = req("DELETE", &one)
        .json(&options(&json!("not-the-uid")))
        .ok(&server);
    assert_status(&wrong, 409, "Conflict");
    assert!(
        wrong.body["message"]
            .as_str()
            .is_some_and(|m| m.contains("Precondition failed: UID in precondition: not-the-uid"))
    );
    let stale_rv = json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"resourceVersion": "1"}});
    assert_status(
        &req("DELETE", &one).json(&stale_rv).ok(&server),
        409,
        "Conflict",
    );
    let deleted = req("DELETE", &one)
        .json(&options(&created["metadata"]["uid"]))
        .ok(&server);
    assert_eq!(deleted.status, 200, "{}", deleted.body);
    assert_eq!(deleted.body["metadata"]["name"], "default-pool");
    assert_status(&req("GET", &one).ok(&server), 404, "NotFound");
    assert_status(&req("DELETE", &one).ok(&server), 404, "NotFound");
    assert_eq!(
        server.custom(CALICO, "v1", "ippools", None, "default-pool"),
        None
    );
    assert_eq!(
        req("DELETE", &format!("{pools}/second-pool"))
            .ok(&server)
            .status,
        200
    );
    assert_eq!(req("GET", pools).ok(&server).body["items"], json!([]));
    assert_status(
        &req("PATCH", &format!("{pools}/x")).raw("{}").ok(&server),
        405,
        "MethodNotAllowed",
    );
}

#[test]
fn namespaced_custom_resources() {
    let server = FakeApiServer::start();
    let set = |ns: &str, name: &str| json!({"kind": "NetworkSet", "metadata": {"name": name, "namespace": ns}});
    server.put_custom(CALICO, "v1", "networksets", set("a", "one"));
    let base = "/apis/crd.projectcalico.org/v1";
    let in_b = format!("{base}/namespaces/b/networksets");
    let created = req("POST", &in_b)
        .json(&json!({"kind": "NetworkSet", "metadata": {"name": "two"}}))
        .ok(&server);
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(created.body["metadata"]["namespace"], "b");
    assert_eq!(created.body["apiVersion"], "crd.projectcalico.org/v1");
    assert!(
        server
            .custom(CALICO, "v1", "networksets", Some("b"), "two")
            .is_some()
    );
    assert!(
        server
            .custom(CALICO, "v1", "networksets", None, "two")
            .is_none()
    );
    assert_status(
        &req("GET", &format!("{base}/namespaces/a/networksets/two")).ok(&server),
        404,
        "NotFound",
    );

    let names = |path: &str| -> Vec<String> {
        let reply = req("GET", path).ok(&server);
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(reply.body["kind"], "NetworkSetList");
        let items = reply.body["items"].as_array().cloned().unwrap_or_default();
        items
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap_or("").to_owned())
            .collect()
    };
    assert_eq!(names(&format!("{base}/namespaces/a/networksets")), ["one"]);
    assert_eq!(
        names(&format!("{base}/namespaces/c/networksets")),
        Vec::<String>::new()
    );
    assert_eq!(
        names(&format!("{base}/networksets?limit=500")),
        ["one", "two"],
        "all namespaces"
    );

    // What the fake does not implement is refused, not silently ignored.
    for query in [
        "labelSelector=host%3Dn1",
        "fieldSelector=metadata.name%3Done",
        "watch=true",
    ] {
        assert_status(
            &req("GET", &format!("{base}/networksets?{query}")).ok(&server),
            400,
            "BadRequest",
        );
    }
    let mismatched = req("POST", &in_b).json(&set("a", "three")).ok(&server);
    assert_status(&mismatched, 400, "BadRequest");
    let wrong_group =
        json!({"apiVersion": "example.com/v1", "kind": "NetworkSet", "metadata": {"name": "x"}});
    assert_status(
        &req("POST", &in_b).json(&wrong_group).ok(&server),
        400,
        "BadRequest",
    );

    let empty = req("GET", "/apis/example.com/v1/widgets").ok(&server);
    assert_eq!(
        (empty.status, empty.body["kind"].as_str()),
        (200, Some("List"))
    );
}

#[test]
fn bearer_token_is_required_when_set() {
    let server = FakeApiServer::start();
    server.put_node(json!({"metadata": {"name": "node1"}}));
    let path = "/api/v1/nodes/node1";
    server.require_token(Some("s3cret"));

    let anonymous = req("GET", path).ok(&server);
    assert_status(&anonymous, 401, "Unauthorized");
    assert_eq!(anonymous.body["message"], "Unauthorized");
    assert_status(
        &req("GET", path)
            .header("Authorization", "Bearer wrong")
            .ok(&server),
        401,
        "Unauthorized",
    );
    assert_status(
        &req("GET", path)
            .header("Authorization", "Basic s3cret")
            .ok(&server),
        401,
        "Unauthorized",
    );
    assert_eq!(
        req("GET", path)
            .header("Authorization", "Bearer s3cret")
            .ok(&server)
            .status,
        200
    );

    server.require_token(None);
    assert_eq!(req("GET", path).ok(&server).status, 200);
}

#[test]
fn server_error_and_unauthorized_faults() {
    let server = FakeApiServer::start();
    server.put_namespace(json!({"metadata": {"name": "default"}}));
    let path = "/api/v1/namespaces/default";

    server.set_fault(Fault::ServerError);
    let failed = req("GET", path).ok(&server);
    assert_status(&failed, 500, "InternalError");
    assert_status(&req("GET", "/version").ok(&server), 500, "InternalError");
    server.set_fault(Fault::Unauthorized);
    assert_status(&req("GET", path).ok(&server), 401, "Unauthorized");
    server.set_fault(Fault::None);
    assert_eq!(req("GET", path).ok(&server).status, 200);
}

#[test]
fn latency_delays_every_answer() {
    let server = FakeApiServer::start();
    let latency = Duration::from_millis(200);
    server.set_fault(Fault::Latency(latency));
    for _ in 0..2 {
        let start = Instant::now();
        assert_eq!(req("GET", "/version").ok(&server).status, 200);
        assert!(start.elapsed() >= latency, "{:?}", start.elapsed());
    }
    server.set_fault(Fault::None);
    let start = Instant::now();
    req("GET", "/version").ok(&server);
    assert!(start.elapsed() < latency, "{:?}", start.elapsed());
}

#[test]
fn hang_never_answers_and_drop_still_stops_promptly() {
    let server = FakeApiServer::start();
    server.set_fault(Fault::Hang);
    let mut hung = req("GET", "/version");
    hung.timeout = Duration::from_millis(300);
    let start = Instant::now();
    let err = hung.send(&server).err().expect("no answer while hanging");
    assert!(
        matches!(
            err.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
        "{err}"
    );
    assert!(start.elapsed() >= Duration::from_millis(300));

    // A hung connection is closed when the server goes away.
    let mut stream = req("GET", "/version").connect(&server).expect("connect");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(server.request_count(), 2, "the hung requests were read");
    let url = server.url();
    let start = Instant::now();
    drop(server);
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "drop took {:?}",
        start.elapsed()
    );
    let mut rest = Vec::new();
    assert_eq!(
        stream.read_to_end(&mut rest).expect("EOF after shutdown"),
        0
    );
    assert!(
        TcpStream::connect(url.trim_start_matches("http://")).is_err(),
        "the listener is closed"
    );
}

#[test]
fn requests_are_recorded_and_counted() {
    let server = FakeApiServer::start();
    req("GET", "/version").ok(&server);
    assert_eq!(server.request_count(), 1);
    server.reset_requests();
    assert_eq!(server.request_count(), 0);

    req("GET", "/api/v1/nodes/n1").ok(&server);
    req(
        "GET",
        "/apis/crd.projectcalico.org/v1/ippools?labelSelector=a%3Db&limit=5",
    )
    .ok(&server);
    server.set_fault(Fault::ServerError);
    req("POST", "/apis/crd.projectcalico.org/v1/ippools")
        .json(&pool("p"))
        .ok(&server);
    server.set_fault(Fault::None);
    server.require_token(Some("t"));
    req("DELETE", "/nowhere").ok(&server);

    assert_eq!(server.request_count(), 4);
    let expected = [
        ("GET", "/api/v1/nodes/n1"),
        (
            "GET",
            "/apis/crd.projectcalico.org/v1/ippools?labelSelector=a%3Db&limit=5",
        ),
        ("POST", "/apis/crd.projectcalico.org/v1/ippools"),
        ("DELETE", "/nowhere"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(server.requests(), expected);
}
