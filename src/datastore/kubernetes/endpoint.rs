//! Pod -> WorkloadEndpoint (calico-behaviour.md §4.3 step 5, §4.6) and the KDD patch body
//! (calico-behaviour.md §6.1): in the Kubernetes datastore a WorkloadEndpoint is a view of its
//! Pod, and recording one is a patch of the pod's annotations.

use serde_json::{Map, Value, json};

use crate::datastore::model::{
    EndpointPort, LABEL_NAMESPACE, LABEL_ORCHESTRATOR, WorkloadEndpoint,
};
use crate::datastore::names::{WepIdentifiers, veth_name_for_workload};
use crate::k8s::objects::{Container, Pod};

pub const ANNOTATION_POD_IP: &str = "cni.projectcalico.org/podIP";
pub const ANNOTATION_POD_IPS: &str = "cni.projectcalico.org/podIPs";
pub const ANNOTATION_CONTAINER_ID: &str = "cni.projectcalico.org/containerID";

/// WorkloadEndpoint label carrying the pod's service account.
pub const LABEL_SERVICE_ACCOUNT: &str = "projectcalico.org/serviceaccount";
/// The orchestrator of every Kubernetes WorkloadEndpoint.
pub const ORCHESTRATOR_K8S: &str = "k8s";

/// Service-account names this long or longer get no label (label values
/// are limited to 63 characters).
const MAX_SERVICE_ACCOUNT_LABEL_LEN: usize = 63;

/// calico-behaviour.md §4.6: a container port that is named or bound to a host port, with a
/// TCP (also for an empty protocol), UDP or SCTP protocol.
fn endpoint_ports(containers: &[Container]) -> impl Iterator<Item = EndpointPort> + '_ {
    containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = u16::try_from(p.container_port).ok().filter(|&n| n != 0)?;
            let host_port = u16::try_from(p.host_port.unwrap_or(0)).ok()?;
            let name = p.name.clone().unwrap_or_default();
            if host_port == 0 && name.is_empty() {
                return None;
            }
            let protocol = match p.protocol.as_deref().unwrap_or("") {
                "" | "TCP" => "TCP",
                "UDP" => "UDP",
                "SCTP" => "SCTP",
                _ => return None,
            };
            Some(EndpointPort {
                name,
                protocol: protocol.to_string(),
                port,
                host_port,
                host_ip: p.host_ip.clone().unwrap_or_default(),
            })
        })
}

/// The WorkloadEndpoint of a Kubernetes pod on `node` with interface
/// `endpoint` (calico-behaviour.md §4.3 step 5 and 8): name, namespace, labels (pod labels plus
/// namespace, orchestrator and service-account labels), generateName, the
/// pod's annotations, and spec orchestrator/node/pod/endpoint,
/// serviceAccountName, profiles (`kns.<ns>`, `ksa.<ns>.<sa>`), ports and the
/// host-side interface name (`interface_prefix` = `FELIX_INTERFACEPREFIX`).
/// The caller fills in ipNetworks, mac and containerID. The name is left
/// empty if the identifiers cannot form one (the caller has already built
/// and validated the same name).
pub fn endpoint_for_pod(
    pod: &Pod,
    node: &str,
    endpoint: &str,
    interface_prefix: Option<&str>,
) -> WorkloadEndpoint {
    let meta = &pod.metadata;
    let namespace = meta.namespace.clone().unwrap_or_default();
    let pod_name = meta.name.clone().unwrap_or_default();
    let spec = pod.spec.as_ref();
    let service_account = spec
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_default();

    let name = WepIdentifiers {
        node: node.to_string(),
        orchestrator: ORCHESTRATOR_K8S.to_string(),
        endpoint: endpoint.to_string(),
        pod: pod_name.clone(),
        ..WepIdentifiers::default()
    }
    .name()
    .unwrap_or_default();
    let mut wep = WorkloadEndpoint::new(&namespace, &name);

    let mut labels = meta.labels.clone().unwrap_or_default();
    labels.insert(LABEL_NAMESPACE.to_string(), namespace.clone());
    labels.insert(LABEL_ORCHESTRATOR.to_string(), ORCHESTRATOR_K8S.to_string());
    if !service_account.is_empty() && service_account.len() < MAX_SERVICE_ACCOUNT_LABEL_LEN {
        labels.insert(LABEL_SERVICE_ACCOUNT.to_string(), service_account.clone());
    }
    wep.metadata.labels = labels;
    wep.metadata.generate_name = meta.generate_name.clone().unwrap_or_default();
    wep.metadata.annotations = meta.annotations.clone().unwrap_or_default();

    let mut profiles = vec![format!("kns.{namespace}")];
    if !service_account.is_empty() {
        profiles.push(format!("ksa.{namespace}.{service_account}"));
    }
    let ports = spec.map_or_else(Vec::new, |s| {
        endpoint_ports(&s.containers)
            .chain(endpoint_ports(s.init_containers.as_deref().unwrap_or(&[])))
            .collect()
    });

    let s = &mut wep.spec;
    s.orchestrator = ORCHESTRATOR_K8S.to_string();
    s.node = node.to_string();
    s.pod = pod_name.clone();
    s.endpoint = endpoint.to_string();
    s.service_account_name = service_account;
    s.profiles = profiles;
    s.ports = ports;
    s.interface_name = veth_name_for_workload(&namespace, &pod_name, interface_prefix);
    wep
}

/// calico-behaviour.md §6.1: the strategic-merge patch body for the pod's `status` subresource
/// recording its addresses (`podIP` = the first, `podIPs` = all joined by
/// `,`) and, when non-empty, the container ID. No addresses -> no
/// annotations at all.
pub fn pod_ip_annotations(ip_networks: &[String], container_id: &str) -> Value {
    let mut annotations = Map::new();
    if let Some(first) = ip_networks.first() {
        annotations.insert(ANNOTATION_POD_IP.to_string(), json!(first));
        annotations.insert(ANNOTATION_POD_IPS.to_string(), json!(ip_networks.join(",")));
        if !container_id.is_empty() {
            annotations.insert(ANNOTATION_CONTAINER_ID.to_string(), json!(container_id));
        }
    }
    json!({ "metadata": { "annotations": annotations } })
}

/// The pod's addresses as Calico reads them: none for finished pods or
/// pods being deleted with an emptied podIP; else the status IPs, else the
/// podIPs / podIP annotations.
pub fn pod_ip_networks(pod: &Pod) -> Vec<String> {
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    let phase = status.phase.as_deref().unwrap_or("");
    if matches!(phase, "Failed" | "Succeeded" | "Completed") {
        return Vec::new();
    }
    if pod.metadata.deletion_timestamp.is_some()
        && annotations
            .get(ANNOTATION_POD_IP)
            .is_some_and(|v| v.is_empty())
    {
        return Vec::new();
    }
    let with_prefix = |ip: &str| {
        if ip.contains('/') {
            ip.to_string()
        } else if ip.contains(':') {
            format!("{ip}/128")
        } else {
            format!("{ip}/32")
        }
    };
    let from_status: Vec<String> = status
        .pod_ips
        .unwrap_or_default()
        .iter()
        .map(|p| with_prefix(&p.ip))
        .filter(|s| !s.is_empty())
        .collect();
    if !from_status.is_empty() {
        return from_status;
    }
    for key in [ANNOTATION_POD_IPS, ANNOTATION_POD_IP] {
        if let Some(v) = annotations.get(key).filter(|v| !v.is_empty()) {
            return v.split(',').map(|s| with_prefix(s.trim())).collect();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::datastore::model::WorkloadEndpointSpec;

    fn pod(value: Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    // -- Pod -> WorkloadEndpoint (calico-behaviour.md §4.6, §11 items 14, 15, 33) ----------------

    #[test]
    fn pod_without_service_account() {
        let p = pod(json!({
            "metadata": {
                "name": "podA",
                "namespace": "default",
                "resourceVersion": "1234",
                "labels": {"labelA": "valueA", "labelB": "valueB"},
                "annotations": {"arbitrary": "annotation"}
            },
            "spec": {"nodeName": "nodeA", "containers": [{"name": "c"}]},
            "status": {"podIP": "192.168.0.1"}
        }));
        let mut wep = endpoint_for_pod(&p, "nodeA", "eth0", None);
        assert_eq!(wep.metadata.name, "nodeA-k8s-podA-eth0");
        assert_eq!(wep.metadata.namespace, "default");
        assert_eq!(
            wep.metadata.labels,
            ann(&[
                ("labelA", "valueA"),
                ("labelB", "valueB"),
                ("projectcalico.org/namespace", "default"),
                ("projectcalico.org/orchestrator", "k8s"),
            ])
        );
        assert_eq!(
            wep.metadata.annotations,
            ann(&[("arbitrary", "annotation")])
        );
        assert_eq!(wep.spec.profiles, ["kns.default"]);
        assert_eq!(wep.spec.interface_name, "cali7f94ce7c295");
        assert!(wep.spec.ports.is_empty());
        assert!(wep.spec.service_account_name.is_empty());

        // The caller completes it.
        wep.spec.ip_networks = vec!["192.168.0.1/32".into()];
        assert_eq!(
            wep.spec,
            WorkloadEndpointSpec {
                orchestrator: "k8s".into(),
                node: "nodeA".into(),
                pod: "podA".into(),
                endpoint: "eth0".into(),
                ip_networks: vec!["192.168.0.1/32".into()],
                profiles: vec!["kns.default".into()],
                interface_name: "cali7f94ce7c295".into(),
                ..Default::default()
            }
        );
    }

    #[test]
    fn pod_with_service_account_and_named_port() {
        let p = pod(json!({
            "metadata": {
                "name": "testpod",
                "generateName": "testpod-",
                "namespace": "test"
            },
            "spec": {
                "serviceAccountName": "default",
                "containers": [{
                    "name": "c",
                    "ports": [{"name": "anamedport", "containerPort": 555}]
                }]
            }
        }));
        let wep = endpoint_for_pod(&p, "node-1", "eth0", Some("eni,veth"));
        assert_eq!(wep.metadata.name, "node--1-k8s-testpod-eth0");
        assert_eq!(wep.metadata.generate_name, "testpod-");
        assert_eq!(
            wep.metadata.labels,
            ann(&[
                ("projectcalico.org/namespace", "test"),
                ("projectcalico.org/orchestrator", "k8s"),
                ("projectcalico.org/serviceaccount", "default"),
            ])
        );
        assert_eq!(wep.spec.profiles, ["kns.test", "ksa.test.default"]);
        assert_eq!(wep.spec.service_account_name, "default");
        assert_eq!(
            wep.spec.ports,
            [EndpointPort {
                name: "anamedport".into(),
                protocol: "TCP".into(),
                port: 555,
                ..Default::default()
            }]
        );
        assert!(wep.spec.interface_name.starts_with("eni"));
        assert_eq!(wep.spec.interface_name.len(), 14);

        let p2 = pod(json!({
            "metadata": {"name": "p", "namespace": "test"},
            "spec": {"serviceAccountName": "testserviceaccount", "containers": []}
        }));
        let wep = endpoint_for_pod(&p2, "n", "eth0", None);
        assert_eq!(
            wep.spec.profiles,
            ["kns.test", "ksa.test.testserviceaccount"]
        );
    }

    #[test]
    fn long_service_account_gets_no_label() {
        let sa62 = "a".repeat(62);
        let sa63 = "a".repeat(63);
        let with_sa = |sa: &str| {
            pod(json!({
                "metadata": {"name": "p", "namespace": "ns"},
                "spec": {"serviceAccountName": sa, "containers": []}
            }))
        };
        let wep = endpoint_for_pod(&with_sa(&sa62), "n", "eth0", None);
        assert_eq!(wep.metadata.labels[LABEL_SERVICE_ACCOUNT], sa62);
        let wep = endpoint_for_pod(&with_sa(&sa63), "n", "eth0", None);
        assert!(!wep.metadata.labels.contains_key(LABEL_SERVICE_ACCOUNT));
        assert_eq!(wep.spec.profiles[1], format!("ksa.ns.{sa63}"));
    }

    #[test]
    fn forced_labels_override_pod_labels() {
        let p = pod(json!({
            "metadata": {
                "name": "p",
                "namespace": "ns",
                "labels": {"projectcalico.org/namespace": "other", "projectcalico.org/orchestrator": "x"}
            },
            "spec": {"containers": []}
        }));
        let wep = endpoint_for_pod(&p, "n", "eth0", None);
        assert_eq!(wep.metadata.labels[LABEL_NAMESPACE], "ns");
        assert_eq!(wep.metadata.labels[LABEL_ORCHESTRATOR], "k8s");
    }

    #[test]
    fn ports_conversion() {
        let p = pod(json!({
            "metadata": {"name": "podA", "namespace": "default"},
            "spec": {
                "containers": [
                    {"name": "c1", "ports": [
                        {"containerPort": 500, "hostPort": 5000},
                        {"name": "udp-port", "containerPort": 600, "protocol": "UDP"},
                        {"name": "sctp-port", "containerPort": 700, "protocol": "SCTP", "hostIP": "10.1.1.1", "hostPort": 7000},
                        {"name": "unkn", "containerPort": 800, "protocol": "unknown"},
                        {"name": "lower", "containerPort": 801, "protocol": "udp"},
                        {"containerPort": 900},
                        {"name": "zero", "containerPort": 0}
                    ]},
                    {"name": "c2", "ports": [{"name": "tcp-port", "containerPort": 1000, "protocol": "TCP"}]}
                ],
                "initContainers": [
                    {"name": "i1", "ports": [{"name": "init-port", "containerPort": 1100}]}
                ]
            }
        }));
        let port =
            |name: &str, protocol: &str, port: u16, host_port: u16, host_ip: &str| EndpointPort {
                name: name.into(),
                protocol: protocol.into(),
                port,
                host_port,
                host_ip: host_ip.into(),
            };
        assert_eq!(
            endpoint_for_pod(&p, "nodeA", "eth0", None).spec.ports,
            [
                port("", "TCP", 500, 5000, ""),
                port("udp-port", "UDP", 600, 0, ""),
                port("sctp-port", "SCTP", 700, 7000, "10.1.1.1"),
                port("tcp-port", "TCP", 1000, 0, ""),
                port("init-port", "TCP", 1100, 0, ""),
            ]
        );
    }

    #[test]
    fn pod_without_spec() {
        let p = pod(json!({"metadata": {"name": "p", "namespace": "ns"}}));
        let wep = endpoint_for_pod(&p, "n", "eth0", None);
        assert_eq!(wep.metadata.name, "n-k8s-p-eth0");
        assert_eq!(wep.spec.profiles, ["kns.ns"]);
        assert!(wep.spec.ports.is_empty());
        assert!(wep.metadata.annotations.is_empty());
    }

    // -- KDD patch body (calico-behaviour.md §6.1, §11 item 39) ---------------------------------

    #[test]
    fn pod_ip_patch() {
        assert_eq!(
            pod_ip_annotations(&["20.0.0.111/32".into()], "abc123"),
            json!({"metadata": {"annotations": {
                "cni.projectcalico.org/podIP": "20.0.0.111/32",
                "cni.projectcalico.org/podIPs": "20.0.0.111/32",
                "cni.projectcalico.org/containerID": "abc123"
            }}})
        );
        assert_eq!(
            pod_ip_annotations(&["20.0.0.7/32".into(), "fd80:20::7/128".into()], ""),
            json!({"metadata": {"annotations": {
                "cni.projectcalico.org/podIP": "20.0.0.7/32",
                "cni.projectcalico.org/podIPs": "20.0.0.7/32,fd80:20::7/128"
            }}})
        );
        assert_eq!(
            pod_ip_annotations(&[], "abc123"),
            json!({"metadata": {"annotations": {}}})
        );
    }
}
