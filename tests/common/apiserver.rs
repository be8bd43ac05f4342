//! A fake Kubernetes API server for the integration tests: plain HTTP/1.1 and
//! JSON on 127.0.0.1, serving only what the plugin uses (the version, a
//! namespace, a node, a pod and its status, and custom resources) with the
//! API server's resourceVersion, uid, 404 and 409 semantics and its `Status`
//! error bodies, plus faults on demand. Other paths answer 404, other verbs
//! on these paths 405, and what the fake does not implement (selectors,
//! watches) 400 rather than a silently wrong answer.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::hash::{BuildHasher, RandomState};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use serde_json::{Map, Value, json};
use tokio::sync::oneshot;

/// A fault applied to every request until changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    None,
    /// Wait this long before answering.
    Latency(Duration),
    /// Answer 401 Unauthorized.
    Unauthorized,
    /// Answer 500 InternalError.
    ServerError,
    /// Read the request and never answer (until the server is dropped).
    Hang,
}

const MODIFIED: &str = "the object has been modified; \
    please apply your changes to the latest version and try again";
const PATCH_TYPES: [&str; 2] = [
    "application/strategic-merge-patch+json",
    "application/merge-patch+json",
];

/// The collection an object lives in; `group` is "" for the core API.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Coll {
    group: String,
    version: String,
    ns: Option<String>,
    plural: String,
}

type Key = (Coll, String);

impl Coll {
    fn new(group: &str, version: &str, ns: Option<&str>, plural: &str) -> Coll {
        let ns = ns.map(str::to_owned);
        let (group, version, plural) = (group.into(), version.into(), plural.into());
        Coll {
            group,
            version,
            ns,
            plural,
        }
    }
    fn core(ns: Option<&str>, plural: &str) -> Coll {
        Coll::new("", "v1", ns, plural)
    }
    fn api_version(&self) -> String {
        match self.group.as_str() {
            "" => self.version.clone(),
            g => format!("{g}/{}", self.version),
        }
    }
    /// The resource as error messages name it: `pods`, `ippools.crd.projectcalico.org`.
    fn resource(&self) -> String {
        match self.group.as_str() {
            "" => self.plural.clone(),
            g => format!("{}.{g}", self.plural),
        }
    }
}

#[derive(Default)]
struct State {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    requests: Vec<(String, String)>,
    fault: Option<Fault>,
    token: Option<String>,
}

/// A running fake API server; dropping it stops it.
pub struct FakeApiServer {
    state: Arc<Mutex<State>>,
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeApiServer {
    /// Binds 127.0.0.1 on a free port and serves on its own thread.
    pub fn start() -> FakeApiServer {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        listener.set_nonblocking(true).expect("non-blocking");
        let addr = listener.local_addr().expect("listener address");
        let state = Arc::new(Mutex::new(State {
            rv: 1000,
            ..State::default()
        }));
        let (stop, stopped) = oneshot::channel();
        let shared = state.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            rt.expect("tokio runtime")
                .block_on(accept_loop(listener, shared, stopped));
            // Dropping the runtime drops the connection tasks, hung ones
            // included, which closes their sockets.
        });
        let (stop, thread) = (Some(stop), Some(thread));
        FakeApiServer {
            state,
            addr,
            stop,
            thread,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Stores a namespace; see [`FakeApiServer::put_custom`].
    pub fn put_namespace(&self, obj: Value) -> Value {
        self.lock()
            .put(Coll::core(None, "namespaces"), obj, "Namespace")
    }

    /// Stores a pod in the namespace its `metadata.namespace` names.
    pub fn put_pod(&self, obj: Value) -> Value {
        let ns = obj["metadata"]["namespace"]
            .as_str()
            .expect("put_pod: metadata.namespace");
        let coll = Coll::core(Some(ns), "pods");
        self.lock().put(coll, obj, "Pod")
    }

    pub fn put_node(&self, obj: Value) -> Value {
        self.lock().put(Coll::core(None, "nodes"), obj, "Node")
    }

    /// Stores (creates or replaces) an object, cluster-scoped unless it has
    /// `metadata.namespace`: sets `metadata.uid` when absent (keeping the
    /// replaced object's if any), `metadata.creationTimestamp` when absent, a
    /// new `metadata.resourceVersion`, and `apiVersion` (and for the core
    /// types `kind`) when absent. Returns the stored object.
    pub fn put_custom(&self, group: &str, version: &str, plural: &str, obj: Value) -> Value {
        let ns = obj["metadata"]["namespace"].as_str();
        let coll = Coll::new(group, version, ns, plural);
        self.lock().put(coll, obj, "")
    }

    pub fn pod(&self, namespace: &str, name: &str) -> Option<Value> {
        let key = (Coll::core(Some(namespace), "pods"), name.to_owned());
        self.lock().objects.get(&key).cloned()
    }

    pub fn custom(
        &self,
        group: &str,
        version: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let key = (
            Coll::new(group, version, namespace, plural),
            name.to_owned(),
        );
        self.lock().objects.get(&key).cloned()
    }

    pub fn delete_pod(&self, namespace: &str, name: &str) {
        let key = (Coll::core(Some(namespace), "pods"), name.to_owned());
        self.lock().objects.remove(&key);
    }

    /// Every request served so far, as (method, path-with-query).
    pub fn requests(&self) -> Vec<(String, String)> {
        self.lock().requests.clone()
    }

    pub fn request_count(&self) -> usize {
        self.lock().requests.len()
    }

    pub fn reset_requests(&self) {
        self.lock().requests.clear();
    }

    pub fn set_fault(&self, fault: Fault) {
        self.lock().fault = Some(fault).filter(|f| *f != Fault::None);
    }

    /// When set, requests without `Authorization: Bearer <token>` get 401.
    pub fn require_token(&self, token: Option<&str>) {
        self.lock().token = token.map(str::to_owned);
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

type Shared = Arc<Mutex<State>>;

async fn accept_loop(
    listener: std::net::TcpListener,
    state: Shared,
    mut stopped: oneshot::Receiver<()>,
) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let state = state.clone();
                let service = service_fn(move |req| serve(state.clone(), req));
                let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
                tokio::spawn(connection);
            }
        }
    }
}

async fn serve(state: Shared, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().as_str().to_owned();
    let uri = req.uri().clone();
    let path_query = uri.path_and_query().map_or(uri.path(), |pq| pq.as_str());
    let (fault, token) = {
        let mut st = lock(&state);
        st.requests.push((method.clone(), path_query.to_owned()));
        (st.fault.clone(), st.token.clone())
    };
    let header = |name| req.headers().get(name).and_then(|v| v.to_str().ok());
    let auth = header(AUTHORIZATION).unwrap_or("").to_owned();
    let content_type = header(CONTENT_TYPE).unwrap_or("").to_owned();
    let body = match req.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) => return Ok(respond(Err(bad_request(format!("reading the body: {e}"))))),
    };
    match fault {
        None | Some(Fault::None) => {}
        Some(Fault::Latency(delay)) => tokio::time::sleep(delay).await,
        Some(Fault::Unauthorized) => return Ok(respond(Err(unauthorized()))),
        Some(Fault::ServerError) => return Ok(respond(Err(internal("injected server error")))),
        Some(Fault::Hang) => std::future::pending::<()>().await,
    }
    if let Some(token) = token {
        let bearer = auth
            .split_once(' ')
            .filter(|(s, _)| s.eq_ignore_ascii_case("bearer"));
        if bearer.map(|(_, t)| t.trim()) != Some(token.as_str()) {
            return Ok(respond(Err(unauthorized())));
        }
    }
    let reply = lock(&state).handle(&method, &uri, &content_type, &body);
    Ok(respond(reply))
}

fn respond(reply: Reply) -> Response<Full<Bytes>> {
    let (code, body) = reply.unwrap_or_else(|e| (e.code, e.status()));
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() =
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let json = hyper::header::HeaderValue::from_static("application/json");
    response.headers_mut().insert(CONTENT_TYPE, json);
    response
}

type Reply = Result<(u16, Value), ApiError>;

/// A failure, answered as a Kubernetes `Status`.
struct ApiError {
    code: u16,
    reason: &'static str,
    message: String,
    details: Option<Value>,
}

fn error(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
    let message = message.into();
    ApiError {
        code,
        reason,
        message,
        details: None,
    }
}

impl ApiError {
    /// Names the object the error is about, as the API server does.
    fn about(mut self, coll: &Coll, name: &str) -> ApiError {
        let mut details = json!({"name": name, "group": coll.group, "kind": coll.plural});
        if coll.group.is_empty() {
            details.as_object_mut().map(|d| d.shift_remove("group"));
        }
        self.details = Some(details);
        self
    }
    fn status(&self) -> Value {
        let mut status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.message, "reason": self.reason});
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status["code"] = json!(self.code);
        status
    }
}

fn not_found(coll: &Coll, name: &str) -> ApiError {
    let message = format!("{} \"{name}\" not found", coll.resource());
    error(404, "NotFound", message).about(coll, name)
}

fn conflict(coll: &Coll, name: &str, why: &str) -> ApiError {
    let resource = coll.resource();
    let message = format!("Operation cannot be fulfilled on {resource} \"{name}\": {why}");
    error(409, "Conflict", message).about(coll, name)
}

/// A failed uid or resourceVersion precondition.
fn precondition(coll: &Coll, name: &str, field: &str, wanted: &str, actual: &str) -> ApiError {
    let why = format!(
        "Precondition failed: {field} in precondition: {wanted}, {field} in object meta: {actual}"
    );
    conflict(coll, name, &why)
}

fn invalid(coll: &Coll, name: &str, field_error: &str) -> ApiError {
    let message = format!("{} \"{name}\" is invalid: {field_error}", coll.resource());
    error(422, "Invalid", message).about(coll, name)
}

fn bad_request(message: impl Into<String>) -> ApiError {
    error(400, "BadRequest", message)
}

fn unauthorized() -> ApiError {
    error(401, "Unauthorized", "Unauthorized")
}

fn internal(cause: &str) -> ApiError {
    let mut e = error(
        500,
        "InternalError",
        format!("Internal error occurred: {cause}"),
    );
    e.details = Some(json!({"causes": [{"message": cause}]}));
    e
}

enum Target {
    Version,
    One(Key),
    Many(Coll),
    PodStatus(Key),
}

fn route(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.strip_prefix('/')?.split('/').collect();
    if segs.contains(&"") {
        return None;
    }
    let one = |c: Coll, name: &str| Some(Target::One((c, name.to_owned())));
    let pod = |ns: &str, name: &str| (Coll::core(Some(ns), "pods"), name.to_owned());
    match segs[..] {
        ["version"] => Some(Target::Version),
        ["api", "v1", "namespaces", name] => one(Coll::core(None, "namespaces"), name),
        ["api", "v1", "nodes", name] => one(Coll::core(None, "nodes"), name),
        ["api", "v1", "namespaces", ns, "pods", name] => Some(Target::One(pod(ns, name))),
        ["api", "v1", "namespaces", ns, "pods", n, "status"] => Some(Target::PodStatus(pod(ns, n))),
        ["apis", g, v, "namespaces", ns, res] => Some(Target::Many(Coll::new(g, v, Some(ns), res))),
        ["apis", g, v, "namespaces", ns, res, name] => one(Coll::new(g, v, Some(ns), res), name),
        ["apis", g, v, res] => Some(Target::Many(Coll::new(g, v, None, res))),
        ["apis", g, v, res, name] => one(Coll::new(g, v, None, res), name),
        _ => None,
    }
}

impl State {
    fn next_rv(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    fn get(&self, key: &Key) -> Result<&Value, ApiError> {
        self.objects
            .get(key)
            .ok_or_else(|| not_found(&key.0, &key.1))
    }

    fn put(&mut self, coll: Coll, mut obj: Value, kind: &str) -> Value {
        assert!(obj.is_object(), "put: not a JSON object: {obj}");
        let name = obj["metadata"]["name"]
            .as_str()
            .expect("put: metadata.name");
        let key = (coll, name.to_owned());
        let old_uid = self.objects.get(&key).and_then(|old| meta_str(old, "uid"));
        let uid = meta_str(&obj, "uid")
            .or(old_uid)
            .map_or_else(new_uid, str::to_owned);
        let created = meta_str(&obj, "creationTimestamp").map_or_else(now_rfc3339, str::to_owned);
        if obj.get("apiVersion").is_none() {
            obj["apiVersion"] = json!(key.0.api_version());
        }
        if obj.get("kind").is_none() && !kind.is_empty() {
            obj["kind"] = json!(kind);
        }
        let rv = self.next_rv();
        stamp(&mut obj, uid, created, rv);
        self.objects.insert(key, obj.clone());
        obj
    }

    fn handle(&mut self, method: &str, uri: &Uri, content_type: &str, body: &[u8]) -> Reply {
        let target = route(uri.path()).ok_or_else(|| {
            let e = error(
                404,
                "NotFound",
                "the server could not find the requested resource",
            );
            ApiError {
                details: Some(json!({})),
                ..e
            }
        })?;
        let is_pod = |c: &Coll| c.group.is_empty() && c.plural == "pods";
        match (method, target) {
            ("GET", Target::Version) => Ok((200, version())),
            ("GET", Target::One(key)) => Ok((200, self.get(&key)?.clone())),
            ("PATCH", Target::One(key)) if is_pod(&key.0) => {
                self.patch_pod(key, content_type, body, false)
            }
            ("PATCH", Target::PodStatus(key)) => self.patch_pod(key, content_type, body, true),
            ("GET", Target::Many(coll)) => self.list(&coll, uri.query().unwrap_or("")),
            ("POST", Target::Many(coll)) => self.create(coll, body),
            ("PUT", Target::One(key)) if !key.0.group.is_empty() => self.update(key, body),
            ("DELETE", Target::One(key)) if !key.0.group.is_empty() => self.delete(key, body),
            _ => {
                let message = "the server does not allow this method on the requested resource";
                let e = error(405, "MethodNotAllowed", message);
                Err(ApiError {
                    details: Some(json!({})),
                    ..e
                })
            }
        }
    }

    /// A JSON merge patch of a pod or of its status. A resourceVersion or uid
    /// in the patch is a precondition. Both apply metadata changes; the main
    /// resource keeps the status and the status subresource keeps the spec.
    fn patch_pod(&mut self, key: Key, content_type: &str, body: &[u8], status: bool) -> Reply {
        let media_type = content_type.split(';').next().unwrap_or("").trim();
        if !PATCH_TYPES.contains(&media_type) {
            let message = format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                PATCH_TYPES.join(", ")
            );
            return Err(error(415, "UnsupportedMediaType", message));
        }
        let patch = parse_object(body)?;
        let old = self.get(&key)?;
        let (coll, name) = (&key.0, key.1.as_str());
        let old_rv = meta_str(old, "resourceVersion").unwrap_or("");
        let old_uid = meta_str(old, "uid").unwrap_or("");
        if meta_str(&patch, "resourceVersion").is_some_and(|rv| rv != old_rv) {
            return Err(conflict(coll, name, MODIFIED));
        }
        if let Some(uid) = meta_str(&patch, "uid").filter(|uid| *uid != old_uid) {
            return Err(precondition(coll, name, "UID", uid, old_uid));
        }
        if let Some(other) = meta_str(&patch, "name").filter(|n| *n != name) {
            return Err(name_mismatch(other, name));
        }
        let mut new = old.clone();
        merge(&mut new, &patch);
        // What a patch cannot change.
        for field in ["apiVersion", "kind", if status { "spec" } else { "status" }] {
            copy_field(old, &mut new, field);
        }
        meta_mut(&mut new);
        for field in ["name", "namespace", "uid", "creationTimestamp"] {
            copy_field(&old["metadata"], &mut new["metadata"], field);
        }
        meta_mut(&mut new).insert("resourceVersion".into(), json!(self.next_rv()));
        self.objects.insert(key, new.clone());
        Ok((200, new))
    }

    fn list(&self, coll: &Coll, query: &str) -> Reply {
        for (param, value) in query.split('&').filter_map(|kv| kv.split_once('=')) {
            let used = !matches!(value, "" | "false" | "0");
            if used && matches!(param, "labelSelector" | "fieldSelector" | "watch") {
                return Err(bad_request(format!(
                    "the fake API server does not support {param}"
                )));
            }
        }
        let same_type = |c: &Coll| {
            (&c.group, &c.version, &c.plural) == (&coll.group, &coll.version, &coll.plural)
        };
        let of_type = || self.objects.iter().filter(|((c, _), _)| same_type(c));
        let kind = of_type().find_map(|(_, o)| o["kind"].as_str());
        let items: Vec<&Value> = of_type()
            .filter(|((c, _), _)| coll.ns.is_none() || c.ns == coll.ns)
            .map(|(_, o)| o)
            .collect();
        let list = json!({"apiVersion": coll.api_version(),
            "kind": format!("{}List", kind.unwrap_or("")),
            "metadata": {"resourceVersion": self.rv.to_string()}, "items": items});
        Ok((200, list))
    }

    fn create(&mut self, coll: Coll, body: &[u8]) -> Reply {
        let mut obj = parse_object(body)?;
        check_type_and_namespace(&coll, &mut obj)?;
        let Some(name) = meta_str(&obj, "name").map(str::to_owned) else {
            return Err(invalid(
                &coll,
                "",
                "metadata.name: Required value: name is required",
            ));
        };
        if meta_str(&obj, "resourceVersion").is_some() {
            let why = "resourceVersion should not be set on objects to be created";
            return Err(internal(why));
        }
        let key = (coll, name);
        if self.objects.contains_key(&key) {
            let message = format!("{} \"{}\" already exists", key.0.resource(), key.1);
            return Err(error(409, "AlreadyExists", message).about(&key.0, &key.1));
        }
        let rv = self.next_rv();
        stamp(&mut obj, new_uid(), now_rfc3339(), rv);
        self.objects.insert(key, obj.clone());
        Ok((201, obj))
    }

    fn update(&mut self, key: Key, body: &[u8]) -> Reply {
        let mut obj = parse_object(body)?;
        let (coll, name) = (&key.0, key.1.as_str());
        check_type_and_namespace(coll, &mut obj)?;
        let in_body = meta_str(&obj, "name").unwrap_or("");
        if in_body != name {
            return Err(name_mismatch(in_body, name));
        }
        let old = self.get(&key)?;
        let old_uid = meta_str(old, "uid").unwrap_or("").to_owned();
        match meta_str(&obj, "resourceVersion") {
            None => {
                let why = "metadata.resourceVersion: Invalid value: 0x0: \
                    must be specified for an update";
                return Err(invalid(coll, name, why));
            }
            Some(rv) if Some(rv) != meta_str(old, "resourceVersion") => {
                return Err(conflict(coll, name, MODIFIED));
            }
            Some(_) => {}
        }
        if let Some(uid) = meta_str(&obj, "uid").filter(|uid| *uid != old_uid) {
            return Err(precondition(coll, name, "UID", uid, &old_uid));
        }
        let created = meta_str(old, "creationTimestamp").unwrap_or("").to_owned();
        let rv = self.next_rv();
        stamp(&mut obj, old_uid, created, rv);
        self.objects.insert(key, obj.clone());
        Ok((200, obj))
    }

    fn delete(&mut self, key: Key, body: &[u8]) -> Reply {
        let empty = body.iter().all(u8::is_ascii_whitespace);
        let options = if empty {
            json!({})
        } else {
            parse_object(body)?
        };
        let old = self.get(&key)?;
        let preconditions = &options["preconditions"];
        for (field, label) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
            let actual = meta_str(old, field).unwrap_or("");
            if let Some(wanted) = preconditions[field].as_str().filter(|w| *w != actual) {
                return Err(precondition(&key.0, &key.1, label, wanted, actual));
            }
        }
        let mut gone = self.objects.remove(&key).unwrap_or_default();
        meta_mut(&mut gone).insert("resourceVersion".into(), json!(self.next_rv()));
        Ok((200, gone))
    }
}

fn version() -> Value {
    json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0", "gitCommit": "fake",
        "gitTreeState": "clean", "buildDate": "2025-04-23T00:00:00Z", "goVersion": "go1.24.2",
        "compiler": "gc", "platform": "linux/amd64"})
}

fn name_mismatch(in_body: &str, in_url: &str) -> ApiError {
    bad_request(format!(
        "the name of the object ({in_body}) does not match the name on the URL ({in_url})"
    ))
}

/// The body as a JSON object whose `metadata`, if present, is an object.
fn parse_object(body: &[u8]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| bad_request(format!("invalid JSON in the body: {e}")))?;
    if !value.is_object() || !(value["metadata"].is_object() || value["metadata"].is_null()) {
        return Err(bad_request(
            "the body must be a JSON object with an object for metadata",
        ));
    }
    Ok(value)
}

/// Requires `kind`; checks or fills `apiVersion` and, for a namespaced
/// collection, `metadata.namespace` (dropped for a cluster-scoped one).
fn check_type_and_namespace(coll: &Coll, obj: &mut Value) -> Result<(), ApiError> {
    if obj["kind"].as_str().is_none_or(str::is_empty) {
        return Err(bad_request(format!("Object 'Kind' is missing in '{obj}'")));
    }
    let expected = coll.api_version();
    match obj["apiVersion"].as_str().unwrap_or("") {
        "" => obj["apiVersion"] = json!(expected),
        v if v != expected => {
            return Err(bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({expected})"
            )));
        }
        _ => {}
    }
    match (&coll.ns, meta_str(obj, "namespace")) {
        (Some(ns), Some(given)) if given != ns => Err(bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        (Some(ns), _) => {
            meta_mut(obj).insert("namespace".into(), json!(ns));
            Ok(())
        }
        (None, _) => {
            meta_mut(obj).shift_remove("namespace");
            Ok(())
        }
    }
}

/// RFC 7386: objects merge key by key, `null` deletes, anything else replaces.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Value::Object(target) = target {
        for (key, value) in patch {
            if value.is_null() {
                target.shift_remove(key);
            } else {
                merge(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

/// Makes `to[field]` what `from[field]` is (absent included).
fn copy_field(from: &Value, to: &mut Value, field: &str) {
    let Some(to) = to.as_object_mut() else { return };
    match from.get(field) {
        Some(value) => to.insert(field.into(), value.clone()),
        None => to.shift_remove(field),
    };
}

/// Sets the fields the server owns.
fn stamp(obj: &mut Value, uid: String, created: String, rv: String) {
    let meta = meta_mut(obj);
    meta.insert("uid".into(), json!(uid));
    meta.insert("creationTimestamp".into(), json!(created));
    meta.insert("resourceVersion".into(), json!(rv));
}

/// `metadata` of an object (which must be an object), made a map if it is not one.
fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    obj["metadata"]
        .as_object_mut()
        .expect("metadata is an object")
}

/// A non-empty string in `metadata`.
fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj["metadata"][field].as_str().filter(|s| !s.is_empty())
}

/// A random (version 4) UUID.
fn new_uid() -> String {
    let random = || RandomState::new().hash_one(SystemTime::now());
    let (a, b) = (random(), random());
    let (a1, a2, a3) = (a >> 32, (a >> 16) & 0xffff, a & 0xfff);
    let (variant, b2) = (0x8000 | (b >> 48) & 0x3fff, b & 0xffff_ffff_ffff);
    format!("{a1:08x}-{a2:04x}-4{a3:03x}-{variant:04x}-{b2:012x}")
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (mut days, time) = (secs / 86_400, secs % 86_400);
    let year_len = |y: u64| {
        if (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400) {
            366
        } else {
            365
        }
    };
    let mut year = 1970;
    while days >= year_len(year) {
        days -= year_len(year);
        year += 1;
    }
    let february = year_len(year) - 337;
    let mut month = 1;
    for len in [31, february, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31] {
        if days < len {
            break;
        }
        days -= len;
        month += 1;
    }
    let (h, m, s) = (time / 3600, time % 3600 / 60, time % 60);
    format!("{year:04}-{month:02}-{:02}T{h:02}:{m:02}:{s:02}Z", days + 1)
}
