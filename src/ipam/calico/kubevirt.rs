//! KubeVirt VMs keep their addresses (Calico v3.32's VM address
//! persistence): a virt-launcher pod — one controlled by a
//! `kubevirt.io/v1` VirtualMachineInstance — is allocated under the VM's
//! handle, `<network>.vmi.<namespace>.<VMI name>` (VM and VMI share the
//! name), not its container's, so that the VM's next pod (a restart, or a
//! live migration's target) finds the same addresses. Who uses them is
//! recorded per address: the active owner (Calico's ActiveOwnerAttrs, the
//! `secondary` map) and, during a migration, the target's pod as the
//! alternate owner (`alternate`); KubeVirt's side of Calico (Felix) swaps
//! them when the migration completes.
//!
//! This module reads what Calico reads of the pod, its VMI and the VMI's
//! VM, and names the handle; the verbs decide with it.

use crate::k8s::client::{K8sClient, K8sError, segment};
use crate::k8s::objects::Pod;

/// Allocation attributes Calico adds for a VM's addresses.
pub const ATTR_VMI_NAME: &str = "vmi-name";
pub const ATTR_VMI_UID: &str = "vmi-uid";
pub const ATTR_VM_UID: &str = "vm-uid";
/// The migration's UID, on a migration target's attributes.
pub const ATTR_VMIM_UID: &str = "vmim-uid";
/// The label KubeVirt puts on a migration target's pod.
pub const MIGRATION_JOB_LABEL: &str = "kubevirt.io/migrationJobUID";
/// KubeVirt names every virt-launcher pod so (a cheap first test: no other
/// pod costs a request).
pub const LAUNCHER_PREFIX: &str = "virt-launcher-";
const API: &str = "kubevirt.io/v1";

/// What follows `<network>.` in a VM's handle ID.
pub const HANDLE_INFIX: &str = "vmi.";
/// Calico's limit on a handle ID's length.
const MAX_HANDLE_LEN: usize = 128;

/// What Calico knows of a virt-launcher pod's VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmiInfo {
    pub namespace: String,
    pub name: String,
    pub vmi_uid: String,
    /// The controlling VirtualMachine's UID, when the VMI has one.
    pub vm_uid: Option<String>,
    /// The migration's UID when the pod is a migration target.
    pub migration_uid: Option<String>,
    /// The VMI is being deleted.
    pub vmi_deleting: bool,
    /// The VM is being deleted (or is gone).
    pub vm_deleting: bool,
}

impl VmiInfo {
    pub fn is_migration_target(&self) -> bool {
        self.migration_uid.is_some()
    }

    /// Whether the VM's addresses may go once no pod uses them: its VM (or,
    /// for a VMI without one, the VMI) is being deleted.
    pub fn is_going_away(&self) -> bool {
        if self.vm_uid.is_some() {
            self.vm_deleting
        } else {
            self.vmi_deleting
        }
    }
}

/// The VM's handle ID: `<network>.vmi.<namespace>.<name>`, the part after
/// the prefix replaced by `_` and an unpadded URL-safe base64 SHA-256 of
/// it, cut to fit, when the whole would pass 128 characters (Calico's
/// length-limited IDs).
pub fn handle_id(network: &str, namespace: &str, name: &str) -> String {
    let network = if network.is_empty() {
        "k8s-pod-network"
    } else {
        network
    };
    let prefix = format!("{network}.vmi.");
    let suffix = format!("{namespace}.{name}");
    let total = prefix.len() + suffix.len();
    if total > MAX_HANDLE_LEN || (total == MAX_HANDLE_LEN && suffix.starts_with('_')) {
        use base64::Engine;
        use sha2::Digest;
        let hash = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(sha2::Sha256::digest(suffix.as_bytes()));
        let room = MAX_HANDLE_LEN
            .saturating_sub(1 + prefix.len())
            .min(hash.len());
        return format!("{prefix}_{}", &hash[..room]);
    }
    format!("{prefix}{suffix}")
}

/// Why a virt-launcher pod's VM could not be made out (Calico's messages).
#[derive(Debug, thiserror::Error)]
pub enum VmiError {
    #[error("pod {namespace}/{pod} has invalid VMI ownerReference: name={name:?} uid={uid:?}")]
    InvalidOwner {
        namespace: String,
        pod: String,
        name: String,
        uid: String,
    },
    #[error("failed to query VMI resource {namespace}/{name}: {reason}")]
    Query {
        namespace: String,
        name: String,
        reason: String,
    },
    #[error("VMI UID mismatch: pod ownerReference has {pod} but VMI resource has {vmi}")]
    UidMismatch { pod: String, vmi: String },
    #[error("{0}")]
    Api(#[from] K8sError),
}

/// The controller ownerReference of a kind in KubeVirt's API group.
fn controller<'a>(
    refs: Option<&'a [crate::k8s::objects::OwnerReference]>,
    kind: &str,
) -> Option<&'a crate::k8s::objects::OwnerReference> {
    refs?
        .iter()
        .find(|r| r.api_version == API && r.kind == kind && r.controller == Some(true))
}

/// As [`lookup`], for a pod being torn down: a VMI already gone is no
/// error (Calico's DEL fails on it, for ever); its VM, of the same name,
/// says whether the addresses stay (a VM restarting) or may go (a VM being
/// deleted, or gone, or none).
pub async fn lookup_for_delete(client: &K8sClient, pod: &Pod) -> Result<Option<VmiInfo>, VmiError> {
    match lookup(client, pod).await {
        Err(VmiError::Query {
            namespace, name, ..
        }) => {
            let path = format!(
                "/apis/{API}/namespaces/{}/virtualmachines/{}",
                segment(&namespace)?,
                segment(&name)?
            );
            let what = format!("failed to query VM resource {namespace}/{name}");
            let vm = client.get_json(&what, &path).await?;
            let uid = vm
                .as_ref()
                .and_then(|v| v.pointer("/metadata/uid"))
                .and_then(|u| u.as_str())
                .map(str::to_string);
            let deleting = vm.as_ref().is_none_or(|v| {
                v.pointer("/metadata/deletionTimestamp")
                    .is_some_and(|t| !t.is_null())
            });
            Ok(Some(VmiInfo {
                namespace,
                name,
                vmi_uid: String::new(),
                vm_uid: uid,
                migration_uid: None,
                vmi_deleting: true,
                vm_deleting: deleting,
            }))
        }
        other => other,
    }
}

/// The VM behind `pod`: `None` for a pod that is not a virt-launcher pod
/// (by its name, then its controller). Reads the VMI (it must exist and be
/// the one the pod names) and the VMI's VM.
pub async fn lookup(client: &K8sClient, pod: &Pod) -> Result<Option<VmiInfo>, VmiError> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    if !pod_name.starts_with(LAUNCHER_PREFIX) {
        return Ok(None);
    }
    let Some(owner) = controller(
        pod.metadata.owner_references.as_deref(),
        "VirtualMachineInstance",
    ) else {
        return Ok(None);
    };
    if owner.name.is_empty() || owner.uid.is_empty() {
        return Err(VmiError::InvalidOwner {
            namespace,
            pod: pod_name,
            name: owner.name.clone(),
            uid: owner.uid.clone(),
        });
    }
    let path = |plural: &str, name: &str| -> Result<String, K8sError> {
        Ok(format!(
            "/apis/{API}/namespaces/{}/{plural}/{}",
            segment(&namespace)?,
            segment(name)?
        ))
    };
    let what = format!("failed to query VMI resource {namespace}/{}", owner.name);
    let vmi = match client
        .get_json(&what, &path("virtualmachineinstances", &owner.name)?)
        .await
    {
        Ok(Some(vmi)) => vmi,
        Ok(None) => {
            return Err(VmiError::Query {
                reason: format!(
                    "virtualmachineinstances.kubevirt.io {:?} not found",
                    owner.name
                ),
                namespace,
                name: owner.name.clone(),
            });
        }
        Err(K8sError::NotServed(_)) => {
            return Err(VmiError::Query {
                reason: "the API server serves no kubevirt.io/v1 VirtualMachineInstances".into(),
                namespace,
                name: owner.name.clone(),
            });
        }
        Err(e) => return Err(e.into()),
    };
    let meta: crate::k8s::objects::ObjectMeta =
        serde_json::from_value(vmi.get("metadata").cloned().unwrap_or_default())
            .map_err(|e| K8sError::Api(format!("{what}: {e}")))?;
    let vmi_uid = meta.uid.clone().unwrap_or_default();
    if vmi_uid != owner.uid {
        return Err(VmiError::UidMismatch {
            pod: owner.uid.clone(),
            vmi: vmi_uid,
        });
    }
    let vm = controller(meta.owner_references.as_deref(), "VirtualMachine").cloned();
    let vm_deleting = match &vm {
        None => false,
        Some(vm) => {
            let what = format!("failed to query VM resource {namespace}/{}", vm.name);
            match client
                .get_json(&what, &path("virtualmachines", &vm.name)?)
                .await?
            {
                // Gone: as good as being deleted.
                None => true,
                Some(object) => object
                    .pointer("/metadata/deletionTimestamp")
                    .is_some_and(|t| !t.is_null()),
            }
        }
    };
    let migration_uid = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MIGRATION_JOB_LABEL))
        .filter(|v| !v.is_empty())
        .cloned();
    Ok(Some(VmiInfo {
        namespace,
        name: owner.name.clone(),
        vmi_uid,
        vm_uid: vm.map(|v| v.uid),
        migration_uid,
        vmi_deleting: meta.deletion_timestamp.is_some(),
        vm_deleting,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_ids_as_calico_makes_them() {
        assert_eq!(
            handle_id("", "default", "vm1"),
            "k8s-pod-network.vmi.default.vm1"
        );
        assert_eq!(
            handle_id("multus-net1", "default", "vm1"),
            "multus-net1.vmi.default.vm1"
        );
        // Too long: `_` and the hash (all 43 characters of it: Calico cuts
        // it to what is left of 128, and its slice would panic past them).
        let long = "v".repeat(200);
        let id = handle_id("net", "ns", &long);
        // (SHA-256 of "ns." and 200 v's, by Python's hashlib.)
        assert_eq!(id, "net.vmi._aZoeDBSelg5XUpHl_gilT4av1Z6qrvsOEdvNcoW_XpY");
        let network = "n".repeat(100);
        let id = handle_id(&network, "ns", &long);
        assert_eq!(id.len(), 128, "{id}");
        // Exactly 128 characters: kept, unless the suffix starts with `_`.
        let fits = "x".repeat(128 - "net.vmi.ns.".len());
        assert_eq!(handle_id("net", "ns", &fits).len(), 128);
        assert!(handle_id("net", "ns", &fits).ends_with(&fits));
    }
}
