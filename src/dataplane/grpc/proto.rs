//! Calico's CNI backend protocol (cni-plugin/pkg/dataplane/grpc/proto/
//! cnibackend.proto, package `cni`, service `CniDataplane` with the unary
//! methods `Add` and `Del`): its messages, field for field and tag for tag,
//! as prost types. Written from the proto's field list (no protoc at build
//! time); maps are ordered so that a request encodes the same every time.

use std::collections::BTreeMap;

/// The service's methods, as gRPC paths.
pub const ADD_PATH: &str = "/cni.CniDataplane/Add";
pub const DEL_PATH: &str = "/cni.CniDataplane/Del";

#[derive(Clone, PartialEq, prost::Message)]
pub struct AddRequest {
    #[prost(string, tag = "1")]
    pub interface_name: String,
    #[prost(string, tag = "2")]
    pub netns: String,
    #[prost(string, tag = "3")]
    pub desired_host_interface_name: String,
    #[prost(message, optional, tag = "4")]
    pub settings: Option<ContainerSettings>,
    #[prost(message, repeated, tag = "5")]
    pub container_ips: Vec<IpConfig>,
    #[prost(string, repeated, tag = "6")]
    pub container_routes: Vec<String>,
    #[prost(message, optional, tag = "7")]
    pub workload: Option<WorkloadIDs>,
    #[prost(btree_map = "string, string", tag = "8")]
    pub dataplane_options: BTreeMap<String, String>,
}

#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct ContainerSettings {
    #[prost(bool, tag = "1")]
    pub allow_ip_forwarding: bool,
    #[prost(int32, tag = "2")]
    pub mtu: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct IpConfig {
    #[prost(string, tag = "1")]
    pub address: String,
    #[prost(string, tag = "2")]
    pub gateway: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkloadIDs {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    #[prost(btree_map = "string, string", tag = "3")]
    pub labels: BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "4")]
    pub annotations: BTreeMap<String, String>,
    #[prost(string, tag = "5")]
    pub endpoint: String,
    #[prost(string, tag = "6")]
    pub node: String,
    #[prost(string, tag = "7")]
    pub orchestrator: String,
    #[prost(string, tag = "8")]
    pub pod: String,
    #[prost(message, repeated, tag = "9")]
    pub ports: Vec<Port>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Port {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub protocol: String,
    #[prost(uint32, tag = "3")]
    pub port: u32,
    #[prost(uint32, tag = "4")]
    pub host_port: u32,
    #[prost(string, tag = "5")]
    pub host_ip: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AddReply {
    #[prost(bool, tag = "1")]
    pub successful: bool,
    #[prost(string, tag = "2")]
    pub error_message: String,
    #[prost(string, tag = "3")]
    pub host_interface_name: String,
    #[prost(string, tag = "4")]
    pub container_mac: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DelRequest {
    #[prost(string, tag = "1")]
    pub interface_name: String,
    #[prost(string, tag = "2")]
    pub netns: String,
    #[prost(btree_map = "string, string", tag = "3")]
    pub dataplane_options: BTreeMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DelReply {
    #[prost(bool, tag = "1")]
    pub successful: bool,
    #[prost(string, tag = "2")]
    pub error_message: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// The wire bytes of a small request, by hand from protobuf's encoding
    /// (field number << 3 | wire type; length-delimited strings and
    /// messages; map entries as messages of key = 1, value = 2).
    #[test]
    fn messages_encode_as_the_proto_says() {
        let req = DelRequest {
            interface_name: "eth0".into(),
            netns: "/n".into(),
            dataplane_options: BTreeMap::from([("a".into(), "b".into())]),
        };
        assert_eq!(
            req.encode_to_vec(),
            [
                &[0x0a, 4][..],
                b"eth0",
                &[0x12, 2],
                b"/n",
                &[0x1a, 6, 0x0a, 1, b'a', 0x12, 1, b'b'],
            ]
            .concat()
        );
        let settings = ContainerSettings {
            allow_ip_forwarding: true,
            mtu: 1450,
        };
        assert_eq!(settings.encode_to_vec(), [0x08, 1, 0x10, 0xaa, 0x0b]);
        let reply = AddReply::decode(&[0x08, 1, 0x1a, 2, b'c', b'x', 0x22, 1, b'm'][..]).unwrap();
        assert!(reply.successful);
        assert_eq!(reply.host_interface_name, "cx");
        assert_eq!(reply.container_mac, "m");
    }
}
