//! The few fields of Kubernetes objects this plugin reads, with the API's
//! JSON names. Deserialising whole `k8s-openapi` Pods would link code for
//! every field of every nested type (megabytes, for an executable run once
//! per pod); unknown fields are simply skipped here.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ObjectMeta {
    pub name: Option<String>,
    pub namespace: Option<String>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub generate_name: Option<String>,
    pub labels: Option<BTreeMap<String, String>>,
    pub annotations: Option<BTreeMap<String, String>>,
    pub deletion_timestamp: Option<String>,
    pub owner_references: Option<Vec<OwnerReference>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct OwnerReference {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
    pub controller: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Pod {
    pub metadata: ObjectMeta,
    pub spec: Option<PodSpec>,
    pub status: Option<PodStatus>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodSpec {
    pub node_name: Option<String>,
    pub host_network: Option<bool>,
    pub service_account_name: Option<String>,
    pub containers: Vec<Container>,
    pub init_containers: Option<Vec<Container>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Container {
    pub name: String,
    pub ports: Option<Vec<ContainerPort>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ContainerPort {
    pub name: Option<String>,
    pub container_port: i32,
    pub host_port: Option<i32>,
    #[serde(rename = "hostIP")]
    pub host_ip: Option<String>,
    pub protocol: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodStatus {
    pub phase: Option<String>,
    #[serde(rename = "podIP")]
    pub pod_ip: Option<String>,
    #[serde(rename = "podIPs")]
    pub pod_ips: Option<Vec<PodIp>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct PodIp {
    pub ip: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Namespace {
    pub metadata: ObjectMeta,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Node {
    pub metadata: ObjectMeta,
    pub spec: Option<NodeSpec>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NodeSpec {
    #[serde(rename = "podCIDR")]
    pub pod_cidr: Option<String>,
    #[serde(rename = "podCIDRs")]
    pub pod_cidrs: Option<Vec<String>>,
}
