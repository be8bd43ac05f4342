//! Calico's objects as custom resources, in either of the API groups
//! Calico v3.32 keeps them in: `crd.projectcalico.org/v1` (every release)
//! or its native `projectcalico.org/v3` CRDs. The resource API's objects are
//! v3 resources; here they become CRD objects and back: the apiVersion, the
//! v3 group's name for the IPAM configuration (`IPAMConfiguration`,
//! `ipamconfigurations`), and BlockAffinity's `deleted`, a string in the v1
//! CRD and a boolean in v3.

use serde_json::{Value, json};

use crate::datastore::ipam_model::{BlockAffinity, IpamConfig};
use crate::datastore::model::API_VERSION;
use crate::datastore::{Kind, Resource};
use crate::k8s::client::CalicoApiGroup;

/// The kind and plural a kind has as a CRD of `group`.
pub fn names(kind: &Kind, group: CalicoApiGroup) -> (&'static str, &'static str) {
    if group == CalicoApiGroup::V3 && kind.name == IpamConfig::KIND.name {
        ("IPAMConfiguration", "ipamconfigurations")
    } else {
        (kind.name, kind.plural)
    }
}

/// The API path of the kind's collection (`namespace` checked by the
/// caller; `""` when cluster-scoped).
pub fn collection(kind: &Kind, group: CalicoApiGroup, namespace: &str) -> String {
    let (_, plural) = names(kind, group);
    let api = group.api_version();
    if kind.namespaced {
        format!("/apis/{api}/namespaces/{namespace}/{plural}")
    } else {
        format!("/apis/{api}/{plural}")
    }
}

/// The API path of one object (`name` checked by the caller).
pub fn path(kind: &Kind, group: CalicoApiGroup, namespace: &str, name: &str) -> String {
    format!("{}/{name}", collection(kind, group, namespace))
}

/// A CRD object as the v3 resource it stands for.
pub fn from_crd(kind: &Kind, mut object: Value) -> Value {
    object["apiVersion"] = json!(API_VERSION);
    object["kind"] = json!(kind.name);
    if kind.name == BlockAffinity::KIND.name
        && let Some(deleted) = object.pointer_mut("/spec/deleted")
        && let Some(b) = deleted.as_bool()
    {
        *deleted = json!(b.to_string());
    }
    object
}

/// A v3 resource as its CRD object in `group`.
pub fn to_crd(kind: &Kind, group: CalicoApiGroup, mut object: Value) -> Value {
    let (crd_kind, _) = names(kind, group);
    object["apiVersion"] = json!(group.api_version());
    object["kind"] = json!(crd_kind);
    if group == CalicoApiGroup::V3
        && kind.name == BlockAffinity::KIND.name
        && let Some(deleted) = object.pointer_mut("/spec/deleted")
    {
        *deleted = json!(deleted.as_str() == Some("true") || deleted.as_bool() == Some(true));
    }
    object
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datastore::ipam_model::IpamBlock;

    #[test]
    fn paths_and_shapes_per_group() {
        use CalicoApiGroup::{CrdV1, V3};
        let config = IpamConfig::KIND;
        assert_eq!(
            path(config, CrdV1, "", "default"),
            "/apis/crd.projectcalico.org/v1/ipamconfigs/default"
        );
        assert_eq!(
            path(config, V3, "", "default"),
            "/apis/projectcalico.org/v3/ipamconfigurations/default"
        );
        assert_eq!(
            collection(IpamBlock::KIND, V3, ""),
            "/apis/projectcalico.org/v3/ipamblocks"
        );
        let v3 = json!({"kind": "IPAMConfig", "apiVersion": "projectcalico.org/v3",
                        "metadata": {"name": "default"}, "spec": {"strictAffinity": true}});
        let crd = to_crd(config, V3, v3.clone());
        assert_eq!(crd["kind"], "IPAMConfiguration");
        assert_eq!(crd["apiVersion"], "projectcalico.org/v3");
        assert_eq!(from_crd(config, crd), v3);
        assert_eq!(to_crd(config, CrdV1, v3.clone())["kind"], "IPAMConfig");

        // BlockAffinity's deleted: a string in v1, a boolean in v3.
        let affinity = json!({"kind": "BlockAffinity", "apiVersion": "projectcalico.org/v3",
                              "metadata": {"name": "a"}, "spec": {"deleted": "false", "state": "confirmed"}});
        let v1 = to_crd(BlockAffinity::KIND, CrdV1, affinity.clone());
        assert_eq!(v1["spec"]["deleted"], "false");
        assert_eq!(v1["apiVersion"], "crd.projectcalico.org/v1");
        let native = to_crd(BlockAffinity::KIND, V3, affinity.clone());
        assert_eq!(native["spec"]["deleted"], false);
        assert_eq!(from_crd(BlockAffinity::KIND, native), affinity);
        assert_eq!(from_crd(BlockAffinity::KIND, v1), affinity);
    }

    #[test]
    fn calicos_group_choice() {
        let groups = |g: &[&str]| g.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        use CalicoApiGroup::{CrdV1, V3};
        assert_eq!(
            CalicoApiGroup::discovered(&groups(&["apps", "projectcalico.org"])),
            V3
        );
        // Calico's aggregated API server beside its v1 CRDs: v1.
        assert_eq!(
            CalicoApiGroup::discovered(&groups(&["projectcalico.org", "crd.projectcalico.org"])),
            CrdV1
        );
        assert_eq!(CalicoApiGroup::discovered(&groups(&["apps"])), CrdV1);
        assert_eq!(CalicoApiGroup::from_setting(""), None);
        assert_eq!(
            CalicoApiGroup::from_setting("ProjectCalico.org/v3"),
            Some(V3)
        );
        assert_eq!(
            CalicoApiGroup::from_setting("crd.projectcalico.org/v1"),
            Some(CrdV1)
        );
    }
}
