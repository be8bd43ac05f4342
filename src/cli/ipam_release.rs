//! `calico ipam release --ip ADDR | --from-report FILE... [--force]`:
//! calicoctl's release. `--ip` frees one address whoever holds it.
//! `--from-report` frees what every given report (of `calico ipam check
//! -o` or calicoctl's) found leaked, and deletes the handles they all found
//! holding nothing, under calicoctl's guards: the reports are of this
//! cluster, one of them is as new as its ClusterInformation, and the
//! datastore is locked (or `--force`). Each address is freed only while its
//! allocation is still the one the report saw (handle and sequence
//! number), each handle deleted only on the revision the report saw.

use std::net::IpAddr;

use super::ipam_check::{LeakedHandle, Report, ReportAllocation};
use crate::datastore::ipam_model::{IpamHandle, handle_name_on};
use crate::datastore::model::ClusterInformation;
use crate::datastore::{DatastoreError, Precondition, Store};
use crate::ipam::calico::operator::{AddressRelease, release_address};

/// Versions of a report this release accepts without `--force`: its own,
/// and the calicoctl release whose format it writes.
pub const CALICO_VERSION: &str = "v3.32.1";

/// `--ip`: frees `ip`.
pub async fn address(store: &dyn Store, ip: IpAddr) -> Result<String, String> {
    match release_address(store, ip, None)
        .await
        .map_err(|e| e.to_string())?
    {
        AddressRelease::Released { .. } => Ok(format!("Successfully released IP address {ip}\n")),
        AddressRelease::NotAllocated | AddressRelease::Changed => {
            Err(format!("IP address {ip} is not assigned"))
        }
    }
}

/// Reads a report file.
pub fn read_report(path: &str) -> Result<Report, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("reading the report {path}: {e}"))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("the report {path} is not a report: {e}"))
}

/// `--from-report`: what every report found leaked, released.
pub async fn from_reports(
    store: &dyn Store,
    reports: &[(String, Report)],
    force: bool,
    version: &str,
) -> Result<(String, String), String> {
    let (mut out, mut warnings) = (String::new(), String::new());
    let cluster = store
        .get::<ClusterInformation>("", ClusterInformation::NAME)
        .await
        .map_err(|e| format!("reading ClusterInformation: {e}"))?;
    let guid = cluster
        .as_ref()
        .map(|c| c.spec.cluster_guid.as_str())
        .unwrap_or_default();
    let revision = cluster
        .as_ref()
        .map(|c| c.metadata.resource_version.as_str())
        .unwrap_or_default();
    for (path, r) in reports {
        if r.cluster_guid != guid {
            return Err(format!(
                "cluster does not match the provided report ({path}): mismatched cluster GUID"
            ));
        }
        if r.version != version && r.version != CALICO_VERSION {
            if !force {
                return Err(format!(
                    "the report {path} was made by version {:?}, this is {version}: re-run the check, or use --force",
                    r.version
                ));
            }
            warnings += &format!(
                "WARNING: the report {path} was made by version {:?}. Ignoring due to --force option\n",
                r.version
            );
        }
    }
    if !reports
        .iter()
        .any(|(_, r)| r.cluster_information_revision == revision)
    {
        return Err("the reports are all stale (ClusterInformation changed since): lock the data store, make a new report, and release from it".into());
    }
    let locked = cluster.as_ref().and_then(|c| c.spec.datastore_ready) == Some(false);
    if !locked {
        if !force {
            return Err(
                "data store is not locked. Either lock the data store, or re-run with --force"
                    .into(),
            );
        }
        warnings += "WARNING: Data store is not locked. Ignoring due to --force option\n";
    }

    // What every report agrees on.
    let leaked_ips: Vec<ReportAllocation> = {
        let (first, rest) = reports.split_first().ok_or("no report given")?;
        let mut agreed = Vec::new();
        for (ip, allocs) in &first.1.allocations {
            for a in allocs.iter().filter(|a| !a.in_use) {
                let in_all = rest.iter().all(|(_, r)| {
                    r.allocations
                        .get(ip)
                        .is_some_and(|v| v.iter().any(|b| !b.in_use && b.handle == a.handle))
                });
                if in_all {
                    // The last report's view of it.
                    let last = reports
                        .last()
                        .and_then(|(_, r)| r.allocations.get(ip))
                        .and_then(|v| v.iter().find(|b| !b.in_use && b.handle == a.handle))
                        .unwrap_or(a);
                    agreed.push(last.clone());
                }
            }
        }
        agreed
    };
    let leaked_handles: Vec<LeakedHandle> = {
        let (first, rest) = reports.split_first().ok_or("no report given")?;
        first
            .1
            .leaked_handles
            .iter()
            .filter(|h| rest.iter().all(|(_, r)| r.leaked_handles.contains(h)))
            .cloned()
            .collect()
    };

    if leaked_ips.is_empty() {
        out += "Report didn't contain any leaked IPs to clean up.\n";
    } else {
        out += &format!("Releasing {} old IPs...\n", leaked_ips.len());
        let (mut released, mut gone, mut changed) = (0, 0, 0);
        let mut errors = Vec::new();
        for a in &leaked_ips {
            let Ok(ip) = a.ip.parse::<IpAddr>() else {
                errors.push(format!("{}: not an address", a.ip));
                continue;
            };
            let expected = (a.handle.as_str(), a.sequence_number.unwrap_or_default());
            match release_address(store, ip, Some(expected)).await {
                Ok(AddressRelease::Released { .. }) => released += 1,
                Ok(AddressRelease::NotAllocated) => gone += 1,
                Ok(AddressRelease::Changed) => changed += 1,
                Err(e) => errors.push(format!("{ip}: {e}")),
            }
        }
        if released > 0 {
            out += &format!("Released {released} IPs successfully\n");
        }
        if gone > 0 {
            out += &format!(
                "{gone} addresses marked as leaked in the report had already been cleaned up.\n"
            );
        }
        if changed > 0 {
            out += &format!(
                "{changed} addresses were allocated again since the report and were left alone.\n"
            );
        }
        if !errors.is_empty() {
            return Err(format!(
                "An error occurred while releasing some IPs: {}. Problems are often caused by an out-of-date IPAM report. Try regenerating the IPAM report and retry.",
                errors.join("; ")
            ));
        }
    }
    if leaked_handles.is_empty() {
        out += "Report didn't contain any handles to clean up.\n";
    } else {
        out += &format!("Deleting {} handles...\n", leaked_handles.len());
        out += "Key: '.' = Deleted OK; 'x' = skip, handle missing/changed.\n";
        let (mut deleted, mut skipped, mut errors) = (0, 0, Vec::new());
        let mut key = String::new();
        for h in &leaked_handles {
            let name = handle_name_on(store.backend(), &h.id);
            let precondition = Precondition {
                resource_version: Some(h.revision.clone()).filter(|r| !r.is_empty()),
                uid: h.uid.clone().filter(|u| !u.is_empty()),
            };
            match store.delete::<IpamHandle>("", &name, &precondition).await {
                Ok(()) => {
                    deleted += 1;
                    key.push('.');
                }
                Err(DatastoreError::NotFound(_) | DatastoreError::Conflict(_)) => {
                    skipped += 1;
                    key.push('x');
                }
                Err(e) => {
                    errors.push(format!("{}: {e}", h.id));
                    key.push('x');
                }
            }
        }
        out += &format!("{key}\n");
        out += &format!(
            "Released {deleted} handles; {skipped} skipped; {} errors.\n",
            errors.len()
        );
        for e in &errors {
            warnings += &format!("{e}\n");
        }
    }
    out += "You may now unlock the data store.\n";
    Ok((out, warnings))
}
