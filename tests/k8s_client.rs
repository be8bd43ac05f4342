//! The Kubernetes client against the in-repo test API server: kubeconfig
//! and overrides, token rotation through a tokenFile, the distinct error for
//! a rejected or expired JWT, and requests bounded by the deadline.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use calico_cni::cni::NetConf;
use calico_cni::k8s::{K8sClient, K8sError};
use common::apiserver::{FakeApiServer, Fault};
use common::block_on;
use serde_json::{Value, json};
use tokio::time::Instant;

fn kubeconfig(dir: &std::path::Path, server: &str, auth: Value) -> std::path::PathBuf {
    common::write_kubeconfig(dir, server, auth)
}

/// One pod GET through a fresh client that must fail; its error.
fn pod_error(kubeconfig: &std::path::Path, deadline: Instant) -> K8sError {
    block_on(async {
        K8sClient::from_conf(&conf(kubeconfig), deadline)
            .await
            .unwrap()
            .pod("test", "pod1")
            .await
            .unwrap_err()
    })
}

fn conf(kubeconfig: &std::path::Path) -> NetConf {
    NetConf::from_value(&json!({
        "name": "k8s-pod-network", "cniVersion": "1.0.0", "type": "calico",
        "kubernetes": {"kubeconfig": kubeconfig}
    }))
    .unwrap()
}

fn jwt(exp: SystemTime) -> String {
    let enc = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    let exp = exp.duration_since(UNIX_EPOCH).unwrap().as_secs();
    format!(
        "{}.{}.signature",
        enc(json!({"alg": "RS256"})),
        enc(json!({"exp": exp, "sub": "system:serviceaccount:kube-system:calico-cni-plugin"}))
    )
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

fn with_pod(server: &FakeApiServer) {
    server.put_namespace(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "test"}}),
    );
    server.put_pod(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "pod1", "namespace": "test"}, "spec": {"containers": [{"name": "c", "image": "i"}], "nodeName": "node1"}}));
}

#[test]
fn reads_pods_and_namespaces_with_the_kubeconfig_token() {
    let server = FakeApiServer::start();
    with_pod(&server);
    server.require_token(Some("good-token"));
    let dir = tempfile::tempdir().unwrap();
    let kc = kubeconfig(dir.path(), &server.url(), json!({"token": "good-token"}));
    block_on(async {
        let client = K8sClient::from_conf(&conf(&kc), soon()).await.unwrap();
        let pod = client.pod("test", "pod1").await.unwrap().expect("pod");
        assert_eq!(pod.metadata.name.as_deref(), Some("pod1"));
        assert!(client.pod("test", "absent").await.unwrap().is_none());
        assert!(client.namespace("test").await.unwrap().is_some());
    });
}

#[test]
fn api_root_and_token_overrides_win() {
    let server = FakeApiServer::start();
    with_pod(&server);
    server.require_token(Some("override-token"));
    let dir = tempfile::tempdir().unwrap();
    // The kubeconfig points nowhere and carries another token.
    let kc = kubeconfig(dir.path(), "http://127.0.0.1:9", json!({"token": "stale"}));
    let mut c = conf(&kc);
    c.kubernetes.k8s_api_root = format!("{}/api/v1/", server.url());
    c.policy.k8s_auth_token = "override-token".into();
    block_on(async {
        let client = K8sClient::from_conf(&c, soon()).await.unwrap();
        assert!(client.pod("test", "pod1").await.unwrap().is_some());
    });
}

#[test]
fn a_rotated_token_file_is_used_by_the_next_call() {
    let server = FakeApiServer::start();
    with_pod(&server);
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "first\n").unwrap();
    let kc = kubeconfig(dir.path(), &server.url(), json!({"tokenFile": token_file}));
    block_on(async {
        server.require_token(Some("first"));
        let client = K8sClient::from_conf(&conf(&kc), soon()).await.unwrap();
        assert!(client.pod("test", "pod1").await.unwrap().is_some());
        // The token is rotated between two invocations.
        std::fs::write(&token_file, "second\n").unwrap();
        server.require_token(Some("second"));
        let client = K8sClient::from_conf(&conf(&kc), soon()).await.unwrap();
        assert!(client.pod("test", "pod1").await.unwrap().is_some());
    });
}

#[test]
fn an_expired_jwt_gets_a_distinct_error_naming_the_kubeconfig() {
    let server = FakeApiServer::start();
    with_pod(&server);
    server.require_token(Some("some-other-token"));
    let dir = tempfile::tempdir().unwrap();
    let expired = jwt(SystemTime::now() - Duration::from_secs(3600));
    let kc = kubeconfig(dir.path(), &server.url(), json!({"token": expired}));
    let err = block_on(async {
        let client = K8sClient::from_conf(&conf(&kc), soon()).await.unwrap();
        client.pod("test", "pod1").await.unwrap_err()
    });
    let msg = err.to_string();
    assert!(matches!(err, K8sError::Unauthorized(_)), "{msg}");
    assert!(msg.contains(kc.to_str().unwrap()), "{msg}");
    assert!(msg.contains("expired at"), "{msg}");
    assert!(
        !msg.contains(&expired),
        "the token itself is never printed: {msg}"
    );

    // A valid but rejected token says so, without "expired".
    let valid = jwt(SystemTime::now() + Duration::from_secs(3600));
    let kc = kubeconfig(dir.path(), &server.url(), json!({"token": valid}));
    let err = pod_error(&kc, soon());
    assert!(matches!(err, K8sError::Unauthorized(_)));
    assert!(!err.to_string().contains("expired at"), "{err}");
}

#[test]
fn a_hanging_or_failing_server_is_bounded_by_the_deadline() {
    let server = FakeApiServer::start();
    with_pod(&server);
    let dir = tempfile::tempdir().unwrap();
    let kc = kubeconfig(dir.path(), &server.url(), json!({"token": "t"}));
    server.set_fault(Fault::Hang);
    let started = std::time::Instant::now();
    let err = pod_error(&kc, Instant::now() + Duration::from_millis(800));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    assert!(matches!(err, K8sError::Timeout(_)), "{err}");

    server.set_fault(Fault::ServerError);
    let err = pod_error(&kc, soon());
    assert!(matches!(err, K8sError::Api(_)), "{err}");

    // Nothing listening at all.
    let kc = kubeconfig(dir.path(), "http://127.0.0.1:9", json!({"token": "t"}));
    let err = pod_error(&kc, soon());
    assert!(
        matches!(err, K8sError::Api(_) | K8sError::Timeout(_)),
        "{err}"
    );
}

#[test]
fn status_patch_merges_annotations_and_reports_conflicts() {
    let server = FakeApiServer::start();
    with_pod(&server);
    let dir = tempfile::tempdir().unwrap();
    let kc = kubeconfig(dir.path(), &server.url(), json!({"token": "t"}));
    block_on(async {
        let client = K8sClient::from_conf(&conf(&kc), soon()).await.unwrap();
        let patch =
            json!({"metadata": {"annotations": {"cni.projectcalico.org/podIP": "10.0.0.5/32"}}});
        let pod = client
            .patch_pod_status("test", "pod1", &patch)
            .await
            .unwrap()
            .unwrap();
        let ann = pod.metadata.annotations.unwrap();
        assert_eq!(ann["cni.projectcalico.org/podIP"], "10.0.0.5/32");
        let stale = json!({"metadata": {"resourceVersion": "1", "annotations": {"cni.projectcalico.org/podIP": ""}}});
        let err = client
            .patch_pod_status("test", "pod1", &stale)
            .await
            .unwrap_err();
        assert!(
            matches!(err, calico_cni::k8s::client::PatchError::Conflict(_)),
            "{err}"
        );
        assert!(
            client
                .patch_pod_status("test", "absent", &patch)
                .await
                .unwrap()
                .is_none()
        );
    });
    assert_eq!(
        server.pod("test", "pod1").unwrap()["metadata"]["annotations"]["cni.projectcalico.org/podIP"],
        "10.0.0.5/32"
    );
}
