//! The `projectcalico.org/v3` resources the plugin reads and writes, in
//! Calico's JSON shape (calico-behaviour.md §6.2). Empty optional fields are omitted on output
//! and default on input, so objects written by Calico itself read back.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Resource, impl_resource};

pub const API_VERSION: &str = "projectcalico.org/v3";

/// Label forced onto every WorkloadEndpoint: its namespace.
pub const LABEL_NAMESPACE: &str = "projectcalico.org/namespace";
/// Label forced onto every WorkloadEndpoint: its `spec.orchestrator`.
pub const LABEL_ORCHESTRATOR: &str = "projectcalico.org/orchestrator";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ObjectMeta {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub generate_name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
    /// RFC 3339, UTC (`2026-11-30T01:02:03Z`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub creation_timestamp: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl ObjectMeta {
    /// Metadata carrying only a namespace (`""` when cluster-scoped) and name.
    pub fn named(namespace: &str, name: &str) -> ObjectMeta {
        ObjectMeta {
            name: name.to_string(),
            namespace: namespace.to_string(),
            ..ObjectMeta::default()
        }
    }
}

fn api_version() -> String {
    API_VERSION.to_string()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WorkloadEndpoint {
    pub kind: String,
    pub api_version: String,
    pub metadata: ObjectMeta,
    pub spec: WorkloadEndpointSpec,
}

impl Default for WorkloadEndpoint {
    fn default() -> Self {
        WorkloadEndpoint {
            kind: Self::KIND.name.to_string(),
            api_version: api_version(),
            metadata: ObjectMeta::default(),
            spec: WorkloadEndpointSpec::default(),
        }
    }
}

impl WorkloadEndpoint {
    pub fn new(namespace: &str, name: &str) -> WorkloadEndpoint {
        WorkloadEndpoint {
            metadata: ObjectMeta::named(namespace, name),
            ..WorkloadEndpoint::default()
        }
    }
}

// Calico forces the namespace and orchestrator labels.
impl_resource!(WorkloadEndpoint, "WorkloadEndpoint", "workloadendpoints", namespaced: true, V3,
before_write: |w| {
    w.metadata
        .labels
        .insert(LABEL_NAMESPACE.to_string(), w.metadata.namespace.clone());
    w.metadata
        .labels
        .insert(LABEL_ORCHESTRATOR.to_string(), w.spec.orchestrator.clone());
});

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WorkloadEndpointSpec {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub orchestrator: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub workload: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub node: String,
    #[serde(rename = "containerID", skip_serializing_if = "String::is_empty")]
    pub container_id: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub pod: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub endpoint: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub service_account_name: String,
    /// `a.b.c.d/32` / `x::y/128` entries.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ip_networks: Vec<String>,
    #[serde(rename = "ipNATs", skip_serializing_if = "Vec::is_empty")]
    pub ip_nats: Vec<IpNat>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub ipv4_gateway: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub ipv6_gateway: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub profiles: Vec<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub interface_name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub mac: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<EndpointPort>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allow_spoofed_source_prefixes: Vec<String>,
    /// Passed through untouched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos_controls: Option<serde_json::Value>,
}

/// A floating IP: traffic to `externalIP` is DNATed to `internalIP`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct IpNat {
    #[serde(rename = "internalIP")]
    pub internal_ip: String,
    #[serde(rename = "externalIP")]
    pub external_ip: String,
}

/// A named or host port; all five keys are always serialized.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct EndpointPort {
    pub name: String,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    pub port: u16,
    pub host_port: u16,
    #[serde(rename = "hostIP")]
    pub host_ip: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Profile {
    pub kind: String,
    pub api_version: String,
    pub metadata: ObjectMeta,
    pub spec: ProfileSpec,
}

impl Default for Profile {
    fn default() -> Self {
        Profile {
            kind: Self::KIND.name.to_string(),
            api_version: api_version(),
            metadata: ObjectMeta::default(),
            spec: ProfileSpec::default(),
        }
    }
}

impl Profile {
    /// The profile the plugin creates for network `name` when it does not
    /// exist (calico-behaviour.md §4.1 step 10): allow all egress; allow all ingress for
    /// Kubernetes, otherwise only from endpoints carrying label `<name>`;
    /// and apply label `<name>: ""` to member endpoints.
    pub fn for_network(name: &str, k8s: bool) -> Profile {
        let ingress = if k8s {
            Rule::allow()
        } else {
            Rule {
                source: Some(EntityRule {
                    selector: format!("has({name})"),
                }),
                ..Rule::allow()
            }
        };
        Profile {
            metadata: ObjectMeta::named("", name),
            spec: ProfileSpec {
                ingress: vec![ingress],
                egress: vec![Rule::allow()],
                labels_to_apply: BTreeMap::from([(name.to_string(), String::new())]),
            },
            ..Profile::default()
        }
    }
}

// Profiles are cluster-scoped.
impl_resource!(Profile, "Profile", "profiles", namespaced: false, V3,
    before_write: |p| p.metadata.namespace.clear());

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ProfileSpec {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<Rule>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<Rule>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels_to_apply: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Rule {
    pub action: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<EntityRule>,
}

impl Rule {
    pub fn allow() -> Rule {
        Rule {
            action: "Allow".to_string(),
            source: None,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EntityRule {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub selector: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ClusterInformation {
    pub kind: String,
    pub api_version: String,
    pub metadata: ObjectMeta,
    pub spec: ClusterInformationSpec,
}

impl Default for ClusterInformation {
    fn default() -> Self {
        ClusterInformation {
            kind: Self::KIND.name.to_string(),
            api_version: api_version(),
            metadata: ObjectMeta::default(),
            spec: ClusterInformationSpec::default(),
        }
    }
}

impl ClusterInformation {
    /// The one ClusterInformation object is always named `default`.
    pub const NAME: &'static str = "default";
}

impl_resource!(ClusterInformation, "ClusterInformation", "clusterinformations", namespaced: false, V3);

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClusterInformationSpec {
    #[serde(rename = "clusterGUID", skip_serializing_if = "String::is_empty")]
    pub cluster_guid: String,
    #[serde(rename = "clusterType", skip_serializing_if = "String::is_empty")]
    pub cluster_type: String,
    #[serde(rename = "calicoVersion", skip_serializing_if = "String::is_empty")]
    pub calico_version: String,
    #[serde(rename = "datastoreReady", skip_serializing_if = "Option::is_none")]
    pub datastore_ready: Option<bool>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The WEP `calico_cni_test.go` expects for a plain-CNI container.
    fn cni_wep() -> WorkloadEndpoint {
        let mut wep = WorkloadEndpoint::new("default", "myhost-cni-abc123-eth0");
        wep.metadata.labels = BTreeMap::from([
            (LABEL_NAMESPACE.to_string(), "default".to_string()),
            (LABEL_ORCHESTRATOR.to_string(), "cni".to_string()),
        ]);
        wep.spec = WorkloadEndpointSpec {
            orchestrator: "cni".into(),
            node: "myhost".into(),
            container_id: "abc123".into(),
            endpoint: "eth0".into(),
            ip_networks: vec!["10.0.0.2/32".into()],
            profiles: vec!["net1".into()],
            interface_name: "caliabc123".into(),
            mac: "aa:bb:cc:dd:ee:ff".into(),
            ..Default::default()
        };
        wep
    }

    #[test]
    fn cni_wep_has_calico_json_shape() {
        let value = serde_json::to_value(cni_wep()).unwrap();
        assert_eq!(
            value,
            json!({
                "kind": "WorkloadEndpoint",
                "apiVersion": "projectcalico.org/v3",
                "metadata": {
                    "name": "myhost-cni-abc123-eth0",
                    "namespace": "default",
                    "labels": {
                        "projectcalico.org/namespace": "default",
                        "projectcalico.org/orchestrator": "cni"
                    }
                },
                "spec": {
                    "orchestrator": "cni",
                    "node": "myhost",
                    "containerID": "abc123",
                    "endpoint": "eth0",
                    "ipNetworks": ["10.0.0.2/32"],
                    "profiles": ["net1"],
                    "interfaceName": "caliabc123",
                    "mac": "aa:bb:cc:dd:ee:ff"
                }
            })
        );
    }

    #[test]
    fn every_spec_key_name() {
        let mut wep = cni_wep();
        wep.metadata.generate_name = "pod-".into();
        wep.metadata.uid = "u".into();
        wep.metadata.resource_version = "7".into();
        wep.metadata.creation_timestamp = "2026-11-30T01:02:03Z".into();
        wep.metadata.annotations.insert("a".into(), "b".into());
        wep.spec.workload = "w".into();
        wep.spec.pod = "p".into();
        wep.spec.service_account_name = "sa".into();
        wep.spec.ip_nats = vec![IpNat {
            internal_ip: "10.0.0.2".into(),
            external_ip: "1.1.1.1".into(),
        }];
        wep.spec.ipv4_gateway = "g4".into();
        wep.spec.ipv6_gateway = "g6".into();
        wep.spec.ports = vec![EndpointPort::default()];
        wep.spec.allow_spoofed_source_prefixes = vec!["1.1.1.0/24".into()];
        wep.spec.qos_controls = Some(json!({"ingressBandwidth": 1}));

        let value = serde_json::to_value(&wep).unwrap();
        let keys = |v: &serde_json::Value| -> Vec<String> {
            v.as_object().unwrap().keys().cloned().collect()
        };
        assert_eq!(
            keys(&value["metadata"]),
            [
                "name",
                "generateName",
                "namespace",
                "uid",
                "resourceVersion",
                "creationTimestamp",
                "labels",
                "annotations"
            ]
        );
        assert_eq!(
            keys(&value["spec"]),
            [
                "orchestrator",
                "workload",
                "node",
                "containerID",
                "pod",
                "endpoint",
                "serviceAccountName",
                "ipNetworks",
                "ipNATs",
                "ipv4Gateway",
                "ipv6Gateway",
                "profiles",
                "interfaceName",
                "mac",
                "ports",
                "allowSpoofedSourcePrefixes",
                "qosControls"
            ]
        );
        assert_eq!(
            value["spec"]["ipNATs"],
            json!([{"internalIP": "10.0.0.2", "externalIP": "1.1.1.1"}])
        );

        let back: WorkloadEndpoint = serde_json::from_value(value).unwrap();
        assert_eq!(back, wep);
    }

    #[test]
    fn ports_always_have_five_keys() {
        let mut wep = cni_wep();
        wep.spec.ports = vec![
            EndpointPort::default(),
            EndpointPort {
                name: "anamedport".into(),
                protocol: "TCP".into(),
                port: 555,
                ..Default::default()
            },
        ];
        let value = serde_json::to_value(&wep).unwrap();
        assert_eq!(
            value["spec"]["ports"],
            json!([
                {"name": "", "protocol": "", "port": 0, "hostPort": 0, "hostIP": ""},
                {"name": "anamedport", "protocol": "TCP", "port": 555, "hostPort": 0, "hostIP": ""}
            ])
        );
    }

    #[test]
    fn round_trips_and_reads_sparse_json() {
        let wep = cni_wep();
        let text = serde_json::to_string(&wep).unwrap();
        assert_eq!(
            serde_json::from_str::<WorkloadEndpoint>(&text).unwrap(),
            wep
        );

        let sparse: WorkloadEndpoint =
            serde_json::from_str(r#"{"metadata":{"name":"n"},"spec":{"unknown":1}}"#).unwrap();
        assert_eq!(sparse.api_version, API_VERSION);
        assert_eq!(sparse.kind, "WorkloadEndpoint");
        assert_eq!(sparse.metadata.name, "n");
    }

    #[test]
    fn network_profiles() {
        let plain = serde_json::to_value(Profile::for_network("net1", false)).unwrap();
        assert_eq!(
            plain,
            json!({
                "kind": "Profile",
                "apiVersion": "projectcalico.org/v3",
                "metadata": {"name": "net1"},
                "spec": {
                    "ingress": [{"action": "Allow", "source": {"selector": "has(net1)"}}],
                    "egress": [{"action": "Allow"}],
                    "labelsToApply": {"net1": ""}
                }
            })
        );
        let k8s = serde_json::to_value(Profile::for_network("k8s-pod-network", true)).unwrap();
        assert_eq!(k8s["spec"]["ingress"], json!([{"action": "Allow"}]));
        assert_eq!(k8s["spec"]["labelsToApply"], json!({"k8s-pod-network": ""}));
    }

    #[test]
    fn cluster_information_shape() {
        let info = ClusterInformation {
            metadata: ObjectMeta::named("", ClusterInformation::NAME),
            spec: ClusterInformationSpec {
                cluster_guid: "abc".into(),
                cluster_type: "calico-cni-local".into(),
                datastore_ready: Some(true),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&info).unwrap(),
            json!({
                "kind": "ClusterInformation",
                "apiVersion": "projectcalico.org/v3",
                "metadata": {"name": "default"},
                "spec": {"clusterGUID": "abc", "clusterType": "calico-cni-local", "datastoreReady": true}
            })
        );
        let absent: ClusterInformation = serde_json::from_str(r#"{"spec":{}}"#).unwrap();
        assert_eq!(absent.spec.datastore_ready, None);
    }
}
