//! Calico's datastore as the plugin sees it: the v3 resources it touches
//! ([`model`]), the names derived from workload identity ([`names`]), the
//! [`Datastore`] operations, and the embedded default backend ([`local`]).

pub mod kubernetes;
pub mod local;
pub mod model;
pub mod names;

use std::io::Read;
use std::time::{SystemTime, UNIX_EPOCH};

use model::{Profile, WorkloadEndpoint};

#[derive(Debug, thiserror::Error)]
pub enum DatastoreError {
    #[error("resource does not exist: {0}")]
    NotFound(String),
    #[error("resource already exists: {0}")]
    AlreadyExists(String),
    #[error("update conflict: {0}")]
    Conflict(String),
    #[error("datastore unavailable: {0}")]
    Unavailable(String),
    #[error("{0}")]
    Other(String),
}

impl From<DatastoreError> for crate::cni::Error {
    fn from(e: DatastoreError) -> Self {
        crate::cni::Error::Datastore(e.to_string())
    }
}

/// Conditions a delete must meet; each is checked only when `Some`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Precondition {
    pub resource_version: Option<String>,
    pub uid: Option<String>,
}

#[async_trait::async_trait]
pub trait Datastore: Send + Sync {
    /// ClusterInformation `default` has spec.datastoreReady == true (absent object or field => Ok(false)).
    async fn cluster_ready(&self) -> Result<bool, DatastoreError>;

    async fn get_workload_endpoint(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<WorkloadEndpoint>, DatastoreError>;

    /// WEPs in `namespace` whose name starts with `name_prefix`, sorted by name.
    async fn list_workload_endpoints(
        &self,
        namespace: &str,
        name_prefix: &str,
    ) -> Result<Vec<WorkloadEndpoint>, DatastoreError>;

    /// Fails with AlreadyExists; returns the stored object with uid (random v4-style UUID),
    /// creationTimestamp (RFC3339 UTC, e.g. 2026-11-30T01:02:03Z), resourceVersion set; forces
    /// labels projectcalico.org/namespace=<ns> and projectcalico.org/orchestrator=<spec.orchestrator>.
    async fn create_workload_endpoint(
        &self,
        wep: &WorkloadEndpoint,
    ) -> Result<WorkloadEndpoint, DatastoreError>;

    /// Compare-and-swap on metadata.resourceVersion (required): mismatch => Conflict, absent =>
    /// NotFound. uid/creationTimestamp preserved; same label forcing.
    async fn update_workload_endpoint(
        &self,
        wep: &WorkloadEndpoint,
    ) -> Result<WorkloadEndpoint, DatastoreError>;

    /// Absent => NotFound; precondition mismatch (resourceVersion or uid, each only when Some) => Conflict.
    async fn delete_workload_endpoint(
        &self,
        namespace: &str,
        name: &str,
        precondition: Precondition,
    ) -> Result<(), DatastoreError>;

    async fn get_profile(&self, name: &str) -> Result<Option<Profile>, DatastoreError>;

    /// AlreadyExists if present.
    async fn create_profile(&self, profile: &Profile) -> Result<Profile, DatastoreError>;
}

/// `time` as RFC 3339 in UTC with whole seconds, e.g. `2026-11-30T01:02:03Z`.
pub(crate) fn rfc3339_utc(time: SystemTime) -> String {
    // Times before 1970 do not occur for "now"; clamp rather than fail.
    let secs = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, of_day) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    )
}

/// Proleptic Gregorian (year, month, day) of a count of days since
/// 1970-01-01, computed over 400-year eras of 146097 days.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468; // days since 0000-03-01
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153; // 0 = March
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// 16 bytes from the kernel's CSPRNG.
fn random_bytes() -> Result<[u8; 16], DatastoreError> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| DatastoreError::Other(format!("reading /dev/urandom: {e}")))?;
    Ok(bytes)
}

/// A random (version 4) UUID in its hyphenated form.
pub(crate) fn random_uuid() -> Result<String, DatastoreError> {
    let mut b = random_bytes()?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex = hex(&b);
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    ))
}

/// A random 32-hex-digit identifier (Calico's clusterGUID format).
pub(crate) fn random_guid() -> Result<String, DatastoreError> {
    Ok(hex(&random_bytes()?))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn formats_rfc3339() {
        let at = |secs| rfc3339_utc(UNIX_EPOCH + Duration::from_secs(secs));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_709_251_199), "2024-02-29T23:59:59Z");
        assert_eq!(at(1_796_000_523), "2026-11-30T01:02:03Z");
        assert_eq!(at(4_107_542_400), "2100-03-01T00:00:00Z");
    }

    #[test]
    fn uuids_are_v4_and_distinct() {
        let a = random_uuid().unwrap();
        let b = random_uuid().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        let groups: Vec<&str> = a.split('-').collect();
        assert_eq!(
            groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(groups[2].starts_with('4'));
        assert!(matches!(groups[3].as_bytes()[0], b'8' | b'9' | b'a' | b'b'));
        assert_eq!(random_guid().unwrap().len(), 32);
    }

    #[test]
    fn converts_to_cni_error() {
        let e: crate::cni::Error = DatastoreError::NotFound("Profile(net1)".into()).into();
        assert_eq!(e.code(), crate::cni::error::code::DATASTORE);
        assert_eq!(e.to_string(), "resource does not exist: Profile(net1)");
    }
}
