//! Calico's etcd v3 layout (calico-behaviour.md §6.2, §10.4): where each
//! kind's objects live and how their values read, both ways between the
//! store API's v3 JSON objects and etcd keys and values.
//!
//! - v3 resources: `/calico/resources/v3/projectcalico.org/<plural>[/<ns>]/<name>`,
//!   the object's JSON without resourceVersion (the key's mod_revision is).
//! - IPAMBlock: `/calico/ipam/v2/assignment/ipv4/block/10.0.0.0-26`, the
//!   model's JSON (`affinity` null when none, `affinity_claim_time`).
//! - BlockAffinity: `/calico/ipam/v2/host/<node>/ipv4/block/10.0.0.0-26`,
//!   `{"state", "deleted": bool}`; the object's name on this backend is the
//!   key below `/calico/ipam/v2/`, its labels computed as Calico stamps
//!   them on the Kubernetes datastore.
//! - IPAMHandle: `/calico/ipam/v2/handle/<handle ID>`, `{"block", "deleted"}`.
//! - IPAMConfig: `/calico/ipam/v2/config`, `{"strict_affinity",
//!   "auto_allocate_blocks", "maxBlocksPerHost"}`.

use ipnet::IpNet;
use serde_json::{Map, Value, json};

use super::super::ipam_model::{
    affinity_labels, cidr_key_segment, cidr_name, cidr_of_block_name, etcd_affinity_name, ip_family,
};
use super::super::model::API_VERSION;
use super::super::{DatastoreError, EtcdLayout, Kind, ListFilter, meta_field};
use crate::etcd::KeyValue;

const V3_ROOT: &str = "/calico/resources/v3/projectcalico.org/";
const IPAM_ROOT: &str = "/calico/ipam/v2/";
const BLOCKS: &str = "/calico/ipam/v2/assignment/";
const HANDLES: &str = "/calico/ipam/v2/handle/";
const CONFIG: &str = "/calico/ipam/v2/config";

fn malformed(what: &str) -> DatastoreError {
    DatastoreError::Other(format!("malformed etcd object: {what}"))
}

fn block_key(cidr: &IpNet) -> String {
    format!(
        "{BLOCKS}ipv{}/block/{}",
        ip_family(cidr),
        cidr_key_segment(cidr)
    )
}

/// The key of an object.
pub fn key_of(kind: &Kind, namespace: &str, name: &str) -> Result<String, DatastoreError> {
    if name.is_empty() || name.contains("..") {
        return Err(DatastoreError::Other(format!(
            "invalid {} name {name:?}",
            kind.name
        )));
    }
    Ok(match kind.etcd {
        EtcdLayout::V3 => kind.v3_etcd_key(namespace, name),
        EtcdLayout::IpamBlock => block_key(
            &cidr_of_block_name(name)
                .ok_or_else(|| DatastoreError::Other(format!("invalid IPAMBlock name {name:?}")))?,
        ),
        EtcdLayout::BlockAffinity => format!("{IPAM_ROOT}{name}"),
        EtcdLayout::IpamHandle => format!("{HANDLES}{name}"),
        EtcdLayout::IpamConfig => CONFIG.to_string(),
    })
}

/// The key prefix a list of `kind` ranges over.
pub fn list_prefix(kind: &Kind, namespace: &str, filter: &ListFilter) -> String {
    match kind.etcd {
        EtcdLayout::V3 => {
            let mut prefix = format!("{V3_ROOT}{}/", kind.plural);
            if kind.namespaced && !namespace.is_empty() {
                prefix.push_str(namespace);
                prefix.push('/');
                if let ListFilter::NamePrefix(p) = filter {
                    prefix.push_str(p);
                }
            }
            prefix
        }
        EtcdLayout::IpamBlock => BLOCKS.to_string(),
        EtcdLayout::BlockAffinity => match filter {
            ListFilter::Node { node, labels } => {
                let version = labels
                    .get(super::super::ipam_model::LABEL_IP_VERSION)
                    .map(|v| format!("ipv{v}/"))
                    .unwrap_or_default();
                format!("{IPAM_ROOT}host/{node}/{version}")
            }
            _ => format!("{IPAM_ROOT}host/"),
        },
        EtcdLayout::IpamHandle => HANDLES.to_string(),
        EtcdLayout::IpamConfig => CONFIG.to_string(),
    }
}

/// The name of the object stored at `key`, from the key alone.
pub fn name_of_key(kind: &Kind, key: &str) -> Option<String> {
    let last = key.rsplit('/').next()?;
    match kind.etcd {
        EtcdLayout::V3 | EtcdLayout::IpamHandle => Some(last.to_string()),
        EtcdLayout::IpamBlock => last
            .replacen('-', "/", 1)
            .parse::<IpNet>()
            .ok()
            .map(|c| cidr_name(&c)),
        EtcdLayout::BlockAffinity => key.strip_prefix(IPAM_ROOT).map(str::to_string),
        EtcdLayout::IpamConfig => (key == CONFIG).then(|| "default".to_string()),
    }
}

fn spec_of(object: &Value) -> Map<String, Value> {
    object
        .get("spec")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

fn parse_cidr(spec: &Map<String, Value>, what: &str) -> Result<IpNet, DatastoreError> {
    spec.get("cidr")
        .and_then(Value::as_str)
        .and_then(|c| c.parse::<IpNet>().ok())
        .ok_or_else(|| malformed(&format!("{what} without a valid cidr")))
}

/// Renames `from` to `to` in `map` when present.
fn rename(map: &mut Map<String, Value>, from: &str, to: &str) {
    if let Some(v) = map.remove(from) {
        map.insert(to.to_string(), v);
    }
}

fn is_true(v: Option<&Value>) -> bool {
    match v {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => s == "true",
        _ => false,
    }
}

/// The key and value of `object` (a v3 JSON object of `kind`).
pub fn encode(kind: &Kind, object: &Value) -> Result<(String, Vec<u8>), DatastoreError> {
    let namespace = meta_field(object, "namespace");
    let name = meta_field(object, "name");
    let mut spec = spec_of(object);
    let (key, value) = match kind.etcd {
        EtcdLayout::V3 => {
            let mut stored = object.clone();
            if let Some(meta) = stored.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.remove("resourceVersion");
            }
            (key_of(kind, namespace, name)?, stored)
        }
        EtcdLayout::IpamBlock => {
            let cidr = parse_cidr(&spec, "IPAMBlock")?;
            spec.remove("strictAffinity");
            rename(&mut spec, "affinityClaimTime", "affinity_claim_time");
            spec.entry("affinity").or_insert(Value::Null);
            (block_key(&cidr), Value::Object(spec))
        }
        EtcdLayout::BlockAffinity => {
            let cidr = parse_cidr(&spec, "BlockAffinity")?;
            let node = spec.get("node").and_then(Value::as_str).unwrap_or_default();
            if node.is_empty() {
                return Err(malformed("BlockAffinity without a node"));
            }
            let value = json!({
                "state": spec.get("state").cloned().unwrap_or(json!("")),
                "deleted": is_true(spec.get("deleted")),
            });
            (
                format!("{IPAM_ROOT}{}", etcd_affinity_name(node, &cidr)),
                value,
            )
        }
        EtcdLayout::IpamHandle => {
            spec.remove("handleID");
            (key_of(kind, "", name)?, Value::Object(spec))
        }
        EtcdLayout::IpamConfig => {
            let mut model = Map::new();
            for (from, to) in [
                ("strictAffinity", "strict_affinity"),
                ("autoAllocateBlocks", "auto_allocate_blocks"),
                ("maxBlocksPerHost", "maxBlocksPerHost"),
            ] {
                match spec.remove(from) {
                    // omitempty, as Calico writes it.
                    Some(Value::Bool(false)) | None => {}
                    Some(Value::Number(n)) if n.as_i64() == Some(0) => {}
                    Some(v) => {
                        model.insert(to.to_string(), v);
                    }
                }
            }
            model.extend(spec);
            (CONFIG.to_string(), Value::Object(model))
        }
    };
    let bytes = serde_json::to_vec(&value).expect("JSON values serialize");
    Ok((key, bytes))
}

fn object(kind: &Kind, metadata: Value, spec: Map<String, Value>) -> Value {
    json!({
        "kind": kind.name,
        "apiVersion": API_VERSION,
        "metadata": metadata,
        "spec": Value::Object(spec),
    })
}

/// The v3 JSON object of a stored key and value; `None` when the key is
/// not one of `kind`'s (another prefix's, or a malformed CIDR).
pub fn decode(kind: &Kind, kv: &KeyValue) -> Result<Option<Value>, DatastoreError> {
    let revision = kv.mod_revision.to_string();
    let parsed: Value = if kv.value.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&kv.value).map_err(|e| malformed(&format!("{}: {e}", kv.key)))?
    };
    let mut model = match parsed {
        Value::Object(m) => m,
        _ => return Err(malformed(&format!("{}: not a JSON object", kv.key))),
    };
    Ok(Some(match kind.etcd {
        EtcdLayout::V3 => {
            let mut o = Value::Object(model);
            match o.get_mut("metadata").and_then(Value::as_object_mut) {
                Some(meta) => {
                    meta.insert("resourceVersion".into(), json!(revision));
                }
                None => return Err(malformed(&format!("{}: no metadata", kv.key))),
            }
            o
        }
        EtcdLayout::IpamBlock => {
            let Some(segment) = kv.key.rsplit('/').next() else {
                return Ok(None);
            };
            let Ok(cidr) = segment.replacen('-', "/", 1).parse::<IpNet>() else {
                return Ok(None);
            };
            if model.get("affinity").is_some_and(Value::is_null) {
                model.remove("affinity");
            }
            rename(&mut model, "affinity_claim_time", "affinityClaimTime");
            model.insert("strictAffinity".into(), json!(false));
            model.insert("cidr".into(), json!(cidr.to_string()));
            let meta = json!({"name": cidr_name(&cidr), "resourceVersion": revision});
            object(kind, meta, model)
        }
        EtcdLayout::BlockAffinity => {
            // <type>/<node>/ipv<v>/block/<cidr>
            let Some(name) = kv.key.strip_prefix(IPAM_ROOT) else {
                return Ok(None);
            };
            let parts: Vec<&str> = name.split('/').collect();
            let [affinity_type, node, _, "block", segment] = parts[..] else {
                return Ok(None);
            };
            let Ok(cidr) = segment.replacen('-', "/", 1).parse::<IpNet>() else {
                return Ok(None);
            };
            let mut labels = affinity_labels(node, &cidr);
            labels.insert(
                super::super::ipam_model::LABEL_AFFINITY_TYPE.into(),
                affinity_type.into(),
            );
            // Data written before affinities had states was confirmed.
            let state = match model.get("state").and_then(Value::as_str) {
                None | Some("") => "confirmed".to_string(),
                Some(s) => s.to_string(),
            };
            let deleted = is_true(model.get("deleted"));
            let spec = json!({
                "state": state, "node": node, "type": affinity_type,
                "cidr": cidr.to_string(), "deleted": deleted.to_string(),
            });
            let meta = json!({"name": name, "labels": labels, "resourceVersion": revision});
            object(kind, meta, spec.as_object().cloned().unwrap_or_default())
        }
        EtcdLayout::IpamHandle => {
            let Some(id) = kv.key.strip_prefix(HANDLES) else {
                return Ok(None);
            };
            model.insert("handleID".into(), json!(id));
            let meta = json!({"name": id, "resourceVersion": revision});
            object(kind, meta, model)
        }
        EtcdLayout::IpamConfig => {
            if kv.key != CONFIG {
                return Ok(None);
            }
            let mut spec = Map::new();
            spec.insert(
                "strictAffinity".into(),
                json!(is_true(model.remove("strict_affinity").as_ref())),
            );
            spec.insert(
                "autoAllocateBlocks".into(),
                json!(is_true(model.remove("auto_allocate_blocks").as_ref())),
            );
            if let Some(n) = model.remove("maxBlocksPerHost") {
                spec.insert("maxBlocksPerHost".into(), n);
            }
            spec.extend(model);
            let meta = json!({"name": "default", "resourceVersion": revision});
            object(kind, meta, spec)
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datastore::Resource;
    use crate::datastore::ipam_model::{BlockAffinity, IpamBlock, IpamConfig, IpamHandle};
    use crate::datastore::model::WorkloadEndpoint;

    fn kv(key: &str, value: &[u8]) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: value.to_vec(),
            create_revision: 7,
            mod_revision: 9,
        }
    }

    #[test]
    fn block_names_map_back_to_cidrs() {
        for cidr in [
            "10.0.0.0/26",
            "192.168.100.64/29",
            "fd80:24e2:f998:72d6::/122",
            "::/0",
        ] {
            let net: IpNet = cidr.parse().unwrap();
            assert_eq!(cidr_of_block_name(&cidr_name(&net)), Some(net), "{cidr}");
        }
        let kind = IpamBlock::KIND;
        assert_eq!(
            key_of(kind, "", "10-0-0-0-26").unwrap(),
            "/calico/ipam/v2/assignment/ipv4/block/10.0.0.0-26"
        );
        assert_eq!(
            key_of(kind, "", "fd80-24e2-f998-72d6---122").unwrap(),
            "/calico/ipam/v2/assignment/ipv6/block/fd80:24e2:f998:72d6::-122"
        );
    }

    #[test]
    fn a_block_round_trips_in_the_model_format() {
        let object = json!({
            "kind": "IPAMBlock", "apiVersion": "projectcalico.org/v3",
            "metadata": {"name": "10-0-0-0-30", "resourceVersion": "3"},
            "spec": {"cidr": "10.0.0.0/30", "affinity": "host:node-a",
                     "affinityClaimTime": "2026-12-01T00:00:00Z", "strictAffinity": false,
                     "allocations": [0, null, null, null], "unallocated": [1, 2, 3],
                     "attributes": [{"handle_id": "net.c1", "secondary": {"node": "node-a"}}],
                     "sequenceNumber": 4, "sequenceNumberForAllocation": {"0": 3},
                     "deleted": false, "releasedAt": "x"}
        });
        let (key, value) = encode(IpamBlock::KIND, &object).unwrap();
        assert_eq!(key, "/calico/ipam/v2/assignment/ipv4/block/10.0.0.0-30");
        let model: Value = serde_json::from_slice(&value).unwrap();
        assert_eq!(model["affinity_claim_time"], "2026-12-01T00:00:00Z");
        assert_eq!(model["attributes"][0]["handle_id"], "net.c1");
        assert!(model.get("strictAffinity").is_none());
        assert!(model.get("affinityClaimTime").is_none());
        let back = decode(IpamBlock::KIND, &kv(&key, &value)).unwrap().unwrap();
        let mut expected = object.clone();
        expected["metadata"]["resourceVersion"] = json!("9");
        assert_eq!(back, expected);

        // No affinity: stored as null, read back as absent.
        let mut free = object.clone();
        free["spec"].as_object_mut().unwrap().remove("affinity");
        let (_, value) = encode(IpamBlock::KIND, &free).unwrap();
        let model: Value = serde_json::from_slice(&value).unwrap();
        assert!(model["affinity"].is_null() && model.get("affinity").is_some());
        let back = decode(IpamBlock::KIND, &kv(&key, &value)).unwrap().unwrap();
        assert!(back["spec"].get("affinity").is_none());
    }

    #[test]
    fn an_affinity_is_keyed_by_node_and_cidr() {
        let cidr: IpNet = "10.0.0.0/26".parse().unwrap();
        let object = json!({
            "kind": "BlockAffinity", "apiVersion": "projectcalico.org/v3",
            "metadata": {"name": etcd_affinity_name("node-a", &cidr)},
            "spec": {"state": "pending", "node": "node-a", "type": "host",
                     "cidr": "10.0.0.0/26", "deleted": "false"}
        });
        let (key, value) = encode(BlockAffinity::KIND, &object).unwrap();
        assert_eq!(key, "/calico/ipam/v2/host/node-a/ipv4/block/10.0.0.0-26");
        assert_eq!(
            serde_json::from_slice::<Value>(&value).unwrap(),
            json!({"state": "pending", "deleted": false})
        );
        let back = decode(BlockAffinity::KIND, &kv(&key, &value))
            .unwrap()
            .unwrap();
        assert_eq!(back["spec"], object["spec"]);
        assert_eq!(back["metadata"]["name"], object["metadata"]["name"]);
        assert_eq!(
            back["metadata"]["labels"]["projectcalico.org/hostname-hash"],
            crate::datastore::ipam_model::hostname_hash("node-a")
        );
        assert_eq!(
            key_of(
                BlockAffinity::KIND,
                "",
                &etcd_affinity_name("node-a", &cidr)
            )
            .unwrap(),
            key
        );
        // Old data: an empty value is a confirmed affinity.
        let old = decode(BlockAffinity::KIND, &kv(&key, b""))
            .unwrap()
            .unwrap();
        assert_eq!(old["spec"]["state"], "confirmed");
        let filter = ListFilter::Node {
            node: "node-a".into(),
            labels: affinity_labels("node-a", &cidr),
        };
        assert_eq!(
            list_prefix(BlockAffinity::KIND, "", &filter),
            "/calico/ipam/v2/host/node-a/ipv4/"
        );
    }

    #[test]
    fn handles_and_config_use_the_model_format() {
        let handle = json!({
            "kind": "IPAMHandle", "apiVersion": "projectcalico.org/v3",
            "metadata": {"name": "Net.ABC"},
            "spec": {"handleID": "Net.ABC", "block": {"10.0.0.0/26": 1}, "deleted": false}
        });
        let (key, value) = encode(IpamHandle::KIND, &handle).unwrap();
        assert_eq!(key, "/calico/ipam/v2/handle/Net.ABC");
        assert_eq!(
            serde_json::from_slice::<Value>(&value).unwrap(),
            json!({"block": {"10.0.0.0/26": 1}, "deleted": false})
        );
        let back = decode(IpamHandle::KIND, &kv(&key, &value))
            .unwrap()
            .unwrap();
        assert_eq!(back["spec"], handle["spec"]);

        let config = json!({
            "kind": "IPAMConfig", "apiVersion": "projectcalico.org/v3",
            "metadata": {"name": "default"},
            "spec": {"strictAffinity": true, "autoAllocateBlocks": false, "maxBlocksPerHost": 0}
        });
        let (key, value) = encode(IpamConfig::KIND, &config).unwrap();
        assert_eq!(key, "/calico/ipam/v2/config");
        assert_eq!(
            serde_json::from_slice::<Value>(&value).unwrap(),
            json!({"strict_affinity": true})
        );
        let back = decode(IpamConfig::KIND, &kv(&key, &value))
            .unwrap()
            .unwrap();
        assert_eq!(back["spec"]["strictAffinity"], true);
        assert_eq!(back["spec"]["autoAllocateBlocks"], false);
    }

    #[test]
    fn v3_objects_keep_their_json_without_the_revision() {
        let wep = json!({
            "kind": "WorkloadEndpoint", "apiVersion": "projectcalico.org/v3",
            "metadata": {"name": "node-k8s-pod-eth0", "namespace": "test",
                         "resourceVersion": "5", "uid": "u"},
            "spec": {"node": "node"}
        });
        let (key, value) = encode(WorkloadEndpoint::KIND, &wep).unwrap();
        assert_eq!(
            key,
            "/calico/resources/v3/projectcalico.org/workloadendpoints/test/node-k8s-pod-eth0"
        );
        let stored: Value = serde_json::from_slice(&value).unwrap();
        assert!(stored["metadata"].get("resourceVersion").is_none());
        let back = decode(WorkloadEndpoint::KIND, &kv(&key, &value))
            .unwrap()
            .unwrap();
        assert_eq!(back["metadata"]["resourceVersion"], "9");
        assert_eq!(
            list_prefix(
                WorkloadEndpoint::KIND,
                "test",
                &ListFilter::NamePrefix("node-k8s-pod-".into())
            ),
            "/calico/resources/v3/projectcalico.org/workloadendpoints/test/node-k8s-pod-"
        );
    }
}
