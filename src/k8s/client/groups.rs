//! The API groups Calico's CRDs live in, and which one a config or an API
//! server selects.

/// The API group of Calico's CRDs in the Kubernetes datastore.
pub const CALICO_CRD_GROUP: &str = "crd.projectcalico.org";
pub const CALICO_CRD_VERSION: &str = "v1";
/// The group of Calico's native v3 CRDs (Calico v3.32's mode without its
/// aggregated API server).
pub const CALICO_V3_GROUP: &str = "projectcalico.org";

/// Which CRDs hold Calico's objects on an API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CalicoApiGroup {
    /// `crd.projectcalico.org/v1` (every Calico release).
    CrdV1,
    /// `projectcalico.org/v3` as CRDs.
    V3,
}

impl CalicoApiGroup {
    /// A `calico_api_group` / `CALICO_API_GROUP` value as Calico reads it:
    /// `projectcalico.org/v3` (any case) is v3, any other value v1; `None`
    /// when unset (discovery decides).
    pub fn from_setting(value: &str) -> Option<CalicoApiGroup> {
        match value.trim() {
            "" => None,
            v if v.eq_ignore_ascii_case("projectcalico.org/v3") => Some(CalicoApiGroup::V3),
            _ => Some(CalicoApiGroup::CrdV1),
        }
    }

    /// Calico's discovery rule: v3 only when the API server serves
    /// `projectcalico.org` and not `crd.projectcalico.org` (a cluster with
    /// Calico's aggregated API server serves both, its data in the v1 CRDs).
    pub fn discovered(served: &[String]) -> CalicoApiGroup {
        let serves = |g: &str| served.iter().any(|s| s == g);
        if serves(CALICO_V3_GROUP) && !serves(CALICO_CRD_GROUP) {
            CalicoApiGroup::V3
        } else {
            CalicoApiGroup::CrdV1
        }
    }

    /// `group/version`.
    pub fn api_version(self) -> &'static str {
        match self {
            CalicoApiGroup::CrdV1 => "crd.projectcalico.org/v1",
            CalicoApiGroup::V3 => "projectcalico.org/v3",
        }
    }
}
