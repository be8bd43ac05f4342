//! The Kubernetes client against the test bed's real kube-apiserver, with
//! the CNI's own ServiceAccount token and RBAC: kubeconfig and overrides,
//! token rotation through a tokenFile, the distinct errors for a rejected,
//! revoked or expired token, and, through the fault proxy, requests bounded
//! by the deadline.

mod common;

use std::time::{Duration, SystemTime};

use calico_cni::cni::NetConf;
use calico_cni::k8s::{K8sClient, K8sError};
use common::block_on;
use common::faultproxy::{Fault, FaultProxy, Rule};
use common::testbed::{Namespace, Testbed, testbed};
use serde_json::{Value, json};
use tokio::time::Instant;

/// The test bed and a namespace with a pod `pod1` in it.
fn bed_with_pod(test: &str) -> Option<(&'static Testbed, Namespace)> {
    let bed = testbed(test)?;
    let ns = bed.namespace(json!({}), json!({}));
    ns.create_pod(json!({"metadata": {"name": "pod1"},
        "spec": {"nodeName": "node1", "containers": [{"name": "c", "image": "i"}]}}));
    Some((bed, ns))
}

fn conf(kubeconfig: &std::path::Path) -> NetConf {
    NetConf::from_value(&json!({
        "name": "k8s-pod-network", "cniVersion": "1.0.0", "type": "calico",
        "kubernetes": {"kubeconfig": kubeconfig}
    }))
    .unwrap()
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

/// One pod GET through a fresh client; its outcome.
fn get_pod(kubeconfig: &std::path::Path, ns: &str, deadline: Instant) -> Result<bool, K8sError> {
    block_on(async {
        let client = K8sClient::new(&conf(kubeconfig).k8s_config(), deadline).await?;
        Ok(client.pod(ns, "pod1").await?.is_some())
    })
}

fn token_kubeconfig(bed: &Testbed, dir: &std::path::Path, user: Value) -> std::path::PathBuf {
    bed.kubeconfig(dir, "kubeconfig", bed.api(), user)
}

#[test]
fn reads_pods_and_namespaces_with_the_cni_token() {
    let Some((bed, ns)) = bed_with_pod("reads_pods_and_namespaces_with_the_cni_token") else {
        return;
    };
    block_on(async {
        let client = K8sClient::new(&conf(&bed.cni_kubeconfig()).k8s_config(), soon())
            .await
            .unwrap();
        let pod = client.pod(&ns.name, "pod1").await.unwrap().expect("pod");
        assert_eq!(pod.metadata.name.as_deref(), Some("pod1"));
        assert!(client.pod(&ns.name, "absent").await.unwrap().is_none());
        assert!(client.namespace(&ns.name).await.unwrap().is_some());
    });
}

#[test]
fn a_request_the_role_does_not_allow_is_refused() {
    let Some((bed, ns)) = bed_with_pod("a_request_the_role_does_not_allow_is_refused") else {
        return;
    };
    // The CNI's role may not read FelixConfigurations: the API server says no.
    let err = block_on(async {
        let client = K8sClient::new(&conf(&bed.cni_kubeconfig()).k8s_config(), soon())
            .await
            .unwrap();
        client
            .calico_resource("FelixConfiguration", "felixconfigurations", "default")
            .await
            .unwrap_err()
    });
    let msg = err.to_string();
    assert!(msg.contains("forbidden"), "{msg}");
    assert!(msg.contains("403"), "{msg}");
    drop(ns);
}

#[test]
fn api_root_and_token_overrides_win() {
    let Some((bed, ns)) = bed_with_pod("api_root_and_token_overrides_win") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // The kubeconfig points nowhere and carries a stale token.
    let kc = bed.kubeconfig(
        dir.path(),
        "kubeconfig",
        "https://127.0.0.1:9",
        json!({"token": "stale"}),
    );
    let mut c = conf(&kc);
    c.kubernetes.k8s_api_root = format!("{}/api/v1/", bed.api());
    c.policy.k8s_auth_token = bed.cni_token();
    block_on(async {
        let client = K8sClient::new(&c.k8s_config(), soon()).await.unwrap();
        assert!(client.pod(&ns.name, "pod1").await.unwrap().is_some());
    });
}

#[test]
fn a_rotated_token_file_is_used_by_the_next_call() {
    let Some((bed, ns)) = bed_with_pod("a_rotated_token_file_is_used_by_the_next_call") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    let kc = token_kubeconfig(bed, dir.path(), json!({"tokenFile": token_file}));
    std::fs::write(&token_file, "not-a-token\n").unwrap();
    let err = get_pod(&kc, &ns.name, soon()).unwrap_err();
    assert!(matches!(err, K8sError::Unauthorized(_)), "{err}");
    assert!(err.to_string().contains("tokenFile"), "{err}");
    // Rotated between two invocations: each reads the file afresh.
    for _ in 0..2 {
        let token = bed.token("kube-system", "calico-cni-plugin", 600);
        std::fs::write(&token_file, format!("{token}\n")).unwrap();
        assert!(get_pod(&kc, &ns.name, soon()).unwrap());
    }
}

#[test]
fn a_deleted_service_account_is_rejected_naming_the_kubeconfig() {
    let Some((bed, ns)) = bed_with_pod("a_deleted_service_account_is_rejected") else {
        return;
    };
    let sa = bed.service_account("kube-system", bed.cni_rules());
    let dir = tempfile::tempdir().unwrap();
    let kc = token_kubeconfig(bed, dir.path(), json!({"token": sa.token}));
    assert!(get_pod(&kc, &ns.name, soon()).unwrap());
    sa.delete();
    // The API server stops accepting the token once the account is gone.
    let end = std::time::Instant::now() + Duration::from_secs(20);
    let err = loop {
        match get_pod(&kc, &ns.name, soon()) {
            Err(e) => break e,
            Ok(_) if std::time::Instant::now() < end => {
                std::thread::sleep(Duration::from_millis(200))
            }
            Ok(_) => panic!("the token of a deleted ServiceAccount is still accepted"),
        }
    };
    let msg = err.to_string();
    assert!(matches!(err, K8sError::Unauthorized(_)), "{msg}");
    assert!(msg.contains(kc.to_str().unwrap()), "{msg}");
    assert!(msg.contains("401"), "{msg}");
    assert!(
        !msg.contains(&sa.token),
        "the token is never printed: {msg}"
    );
}

#[test]
fn an_expired_jwt_gets_a_distinct_error_with_its_expiry() {
    let Some((bed, ns)) = bed_with_pod("an_expired_jwt_gets_a_distinct_error") else {
        return;
    };
    let sa = bed
        .get("/api/v1/namespaces/kube-system/serviceaccounts/calico-cni-plugin")
        .expect("calico-cni-plugin");
    let uid = sa["metadata"]["uid"].as_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Signed with the test bed's service-account key, expired an hour ago.
    let expired = bed.signed_jwt(
        "kube-system",
        "calico-cni-plugin",
        uid,
        SystemTime::now() - Duration::from_secs(3600),
    );
    let kc = token_kubeconfig(bed, dir.path(), json!({"token": expired}));
    let err = get_pod(&kc, &ns.name, soon()).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, K8sError::Unauthorized(_)), "{msg}");
    assert!(msg.contains(kc.to_str().unwrap()), "{msg}");
    assert!(msg.contains("the token expired at"), "{msg}");
    assert!(!msg.contains(&expired), "the token is never printed: {msg}");

    // The same key and claims, still valid: accepted, so the signature and
    // claims were right and only the expiry was refused.
    let valid = bed.signed_jwt(
        "kube-system",
        "calico-cni-plugin",
        uid,
        SystemTime::now() + Duration::from_secs(600),
    );
    let kc = token_kubeconfig(bed, dir.path(), json!({"token": valid}));
    assert!(get_pod(&kc, &ns.name, soon()).unwrap());
}

#[test]
fn a_hanging_or_failing_server_is_bounded_by_the_deadline() {
    let Some((bed, ns)) = bed_with_pod("a_hanging_or_failing_server_is_bounded") else {
        return;
    };
    let proxy = FaultProxy::start(
        bed.api(),
        &bed.ca(),
        bed.var("TESTBED_PROXY_CERT").as_ref(),
        bed.var("TESTBED_PROXY_KEY").as_ref(),
    );
    let dir = tempfile::tempdir().unwrap();
    let kc = bed.kubeconfig(
        dir.path(),
        "kubeconfig",
        &proxy.url(),
        json!({"token": bed.cni_token()}),
    );
    assert!(get_pod(&kc, &ns.name, soon()).unwrap(), "through the proxy");

    for fault in [Fault::Hang, Fault::Delay(Duration::from_secs(3))] {
        proxy.push(Rule::always(fault));
        let started = std::time::Instant::now();
        let err = get_pod(&kc, &ns.name, Instant::now() + Duration::from_millis(800)).unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "took {:?}",
            started.elapsed()
        );
        assert!(matches!(err, K8sError::Timeout(_)), "{err}");
        proxy.clear();
    }
    for status in [500, 503, 429] {
        proxy.push(Rule::always(Fault::Status(status)));
        let err = get_pod(&kc, &ns.name, soon()).unwrap_err();
        assert!(matches!(err, K8sError::Api(_)), "{status}: {err}");
        assert!(err.to_string().contains(&status.to_string()), "{err}");
        proxy.clear();
    }
    proxy.push(Rule::always(Fault::Reset));
    let err = get_pod(&kc, &ns.name, soon()).unwrap_err();
    assert!(matches!(err, K8sError::Api(_)), "{err}");
    proxy.clear();

    // Nothing listening at all.
    let kc = bed.kubeconfig(
        dir.path(),
        "kubeconfig",
        "https://127.0.0.1:9",
        json!({"token": "t"}),
    );
    let err = get_pod(&kc, &ns.name, soon()).unwrap_err();
    assert!(
        matches!(err, K8sError::Api(_) | K8sError::Timeout(_)),
        "{err}"
    );
}

#[test]
fn status_patch_merges_annotations_and_reports_conflicts() {
    let Some((bed, ns)) = bed_with_pod("status_patch_merges_annotations") else {
        return;
    };
    ns.create_pod(
        json!({"metadata": {"name": "pod2", "annotations": {"keep": "me"}},
        "spec": {"nodeName": "node1", "containers": [{"name": "c", "image": "i"}]}}),
    );
    block_on(async {
        let client = K8sClient::new(&conf(&bed.cni_kubeconfig()).k8s_config(), soon())
            .await
            .unwrap();
        let patch =
            json!({"metadata": {"annotations": {"cni.projectcalico.org/podIP": "10.0.0.5/32"}}});
        let pod = client
            .patch_pod_status(&ns.name, "pod2", &patch)
            .await
            .unwrap()
            .unwrap();
        let ann = pod.metadata.annotations.unwrap();
        assert_eq!(ann["cni.projectcalico.org/podIP"], "10.0.0.5/32");
        assert_eq!(ann["keep"], "me");
        let stale = json!({"metadata": {"resourceVersion": "1", "annotations": {"cni.projectcalico.org/podIP": ""}}});
        let err = client
            .patch_pod_status(&ns.name, "pod2", &stale)
            .await
            .unwrap_err();
        assert!(matches!(err, K8sError::Conflict(_)), "{err}");
        assert!(
            client
                .patch_pod_status(&ns.name, "absent", &patch)
                .await
                .unwrap()
                .is_none()
        );
    });
    let pod = ns.pod("pod2").unwrap();
    assert_eq!(
        pod["metadata"]["annotations"]["cni.projectcalico.org/podIP"],
        "10.0.0.5/32"
    );
}

/// Kubeconfig credentials from an exec credential plugin (client-go's
/// ExecCredential protocol: EKS's `aws eks get-token`, GKE's
/// gke-gcloud-auth-plugin) and from the oidc auth provider's id-token, as
/// kube supports them: a script of the test's prints the CNI's token as an
/// ExecCredential (and records that it ran, and what it was told); the
/// pod is read with it. A plugin that fails, and an auth provider kube has
/// not (azure's, removed from client-go too), fail with what went wrong.
#[test]
fn exec_and_auth_provider_credentials() {
    let Some((bed, ns)) = bed_with_pod("exec_and_auth_provider_credentials") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let plugin = dir.path().join("credential-plugin");
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\nprintf '%s' \"$KUBERNETES_EXEC_INFO\" > {ran}\n\
             printf '%s' '{{\"apiVersion\": \"client.authentication.k8s.io/v1\", \"kind\": \"ExecCredential\", \"status\": {{\"token\": \"{token}\"}}}}'\n",
            ran = ran.display(),
            token = bed.cni_token()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let exec = token_kubeconfig(
        bed,
        dir.path(),
        json!({"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                        "command": plugin, "args": ["get-token"], "interactiveMode": "Never"}}),
    );
    assert!(
        get_pod(&exec, &ns.name, soon()).unwrap(),
        "read with the plugin's token"
    );
    let info: Value = serde_json::from_slice(&std::fs::read(&ran).unwrap()).unwrap();
    assert_eq!(info["kind"], "ExecCredential", "{info}");

    let oidc = bed.kubeconfig(
        dir.path(),
        "oidc",
        bed.api(),
        json!({"auth-provider": {"name": "oidc",
            "config": {"id-token": bed.cni_token(), "idp-issuer-url": "https://issuer.invalid"}}}),
    );
    assert!(
        get_pod(&oidc, &ns.name, soon()).unwrap(),
        "read with the id-token"
    );

    std::fs::write(
        &plugin,
        "#!/bin/sh\necho 'no credentials today' >&2\nexit 3\n",
    )
    .unwrap();
    let failed = get_pod(&exec, &ns.name, soon()).unwrap_err().to_string();
    assert!(failed.contains("getting credentials"), "{failed}");
    let azure = bed.kubeconfig(
        dir.path(),
        "azure",
        bed.api(),
        json!({"auth-provider": {"name": "azure", "config": {}}}),
    );
    let refused = get_pod(&azure, &ns.name, soon()).unwrap_err().to_string();
    assert!(
        refused.contains("azure auth plugin is not supported"),
        "{refused}"
    );
}
