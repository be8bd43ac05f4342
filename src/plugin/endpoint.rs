//! The endpoint record as the verbs keep it, whatever the workload kind
//! and wherever the datastore keeps it ([`crate::datastore::endpoints`]):
//! the result printed for an endpoint, the network's profile, the record's
//! write (taking over another sandbox's record only when it was read as
//! that sandbox's) and its removal by DEL (never a newer sandbox's).

use ipnet::IpNet;

use crate::cni::result::{CniResult, Interface, IpConfig};
use crate::cni::{Error, Result};
use crate::datastore::model::{Profile, WorkloadEndpoint};
use crate::datastore::{DatastoreError, Precondition};
use crate::plugin::context::{Context, datastore_err};

/// Attempts at writing or deleting a record that keeps changing underneath.
const ATTEMPTS: usize = 6;

/// The printed result for an endpoint: host veth, container interface
/// (with the MTU the ADD resolved, config or `/var/lib/calico/mtu`, left
/// out when 0 as Calico does), every address at index 1; routes and DNS as
/// the IPAM gave them.
pub fn endpoint_result(
    ctx: &Context,
    (host_veth, mac, mtu): (&str, &str, u32),
    ips: &[IpNet],
    from_ipam: Option<&CniResult>,
) -> CniResult {
    let req = &ctx.req;
    let mtu = Some(mtu).filter(|m| *m > 0);
    CniResult {
        interfaces: vec![
            Interface {
                name: host_veth.to_string(),
                ..Interface::default()
            },
            Interface {
                name: req.env.ifname.clone(),
                mac: Some(mac.to_string()),
                mtu,
                sandbox: Some(req.env.netns.clone()),
                ..Interface::default()
            },
        ],
        ips: ips
            .iter()
            .map(|ip| IpConfig {
                address: *ip,
                gateway: None,
                interface: Some(1),
            })
            .collect(),
        routes: from_ipam.map(|r| r.routes.clone()).unwrap_or_default(),
        dns: from_ipam.map(|r| r.dns.clone()).unwrap_or_default(),
    }
}

/// The network's profile when `policy.type` is empty: created once, never
/// updated (so read as the datastore's cache holds it).
pub async fn ensure_profile(ctx: &Context) -> Result<()> {
    let name = &ctx.req.conf.name;
    if !ctx.req.conf.policy.kind.is_empty() {
        return Ok(());
    }
    if ctx.network_profile_exists().await? {
        return Ok(());
    }
    let store = ctx.store().await?;
    match store.create(&mut Profile::for_network(name, false)).await {
        Ok(_) | Err(DatastoreError::AlreadyExists(_)) => Ok(()),
        Err(e) => Err(e.context(&format!("error creating profile {name}"))),
    }
}

/// Writes the endpoint record: a create, or (taking over the endpoint of
/// container `replaces`, or this container's own) an update on the
/// revision read. An update refused because the record changed since is
/// retried on a fresh read, unless the record now belongs to yet another
/// container: it is never overwritten blindly.
pub async fn write_record(
    ctx: &Context,
    wep: &mut WorkloadEndpoint,
    replaces: Option<&str>,
) -> Result<WorkloadEndpoint> {
    let records = ctx.endpoints().await?;
    let written = async {
        if wep.metadata.resource_version.is_empty() {
            return records.create(wep).await;
        }
        for attempt in 1..=ATTEMPTS {
            match records.update(wep).await {
                Err(DatastoreError::Conflict(e)) if attempt < ATTEMPTS => {
                    tracing::info!(
                        attempt,
                        "endpoint changed while writing it ({e}); reading it again"
                    );
                    let (namespace, name) = (&wep.metadata.namespace, &wep.metadata.name);
                    let current = records.get(namespace, name).await?.ok_or_else(|| {
                        DatastoreError::NotFound(format!("WorkloadEndpoint({namespace}/{name})"))
                    })?;
                    let owner = current.spec.container_id.as_str();
                    if !(owner.is_empty()
                        || owner == wep.spec.container_id
                        || Some(owner) == replaces)
                    {
                        return Err(DatastoreError::Conflict(format!(
                            "WorkloadEndpoint {name} now belongs to container {owner}"
                        )));
                    }
                    wep.metadata.resource_version = current.metadata.resource_version;
                }
                other => return other,
            }
        }
        unreachable!("the last attempt returns")
    };
    written
        .await
        .map_err(datastore_err("error writing WorkloadEndpoint"))
}

/// What the record part of a DEL learns for its local part: the record
/// found for this sandbox (if any), sent as soon as it has been read.
pub type RecordFound = tokio::sync::oneshot::Sender<Option<WorkloadEndpoint>>;

/// DEL's record part: the record looked up and, unless it belongs to
/// another container, removed under revision and uid preconditions,
/// retrying while it keeps changing. The first read goes to the local part
/// through `found_tx`.
pub async fn remove_record(ctx: &Context, found_tx: RecordFound) -> Result<()> {
    let mut found_tx = Some(found_tx);
    let opened = async {
        let name = ctx.endpoint_name()?;
        let records = ctx.endpoints().await?;
        ctx.ensure_ready().await?;
        Ok::<_, Error>((name, records))
    };
    let (name, records) = opened.await?;
    let namespace = &ctx.namespace;
    for attempt in 1..=ATTEMPTS {
        let wep = match records.get(namespace, &name).await {
            Ok(Some(w)) => w,
            Ok(None) => {
                tracing::info!(endpoint = %name, "endpoint does not exist; nothing to remove");
                return Ok(());
            }
            Err(e) => return Err(e.context(&format!("error getting WorkloadEndpoint {name}"))),
        };
        if let Some(tx) = found_tx.take() {
            let _ = tx.send(Some(wep.clone()));
        }
        if !wep.spec.container_id.is_empty() && wep.spec.container_id != ctx.req.env.container_id {
            tracing::info!(owner = %wep.spec.container_id, "endpoint belongs to another sandbox; left alone");
            return Ok(());
        }
        let pre = Precondition {
            resource_version: Some(wep.metadata.resource_version.clone()).filter(|v| !v.is_empty()),
            uid: Some(wep.metadata.uid.clone()).filter(|v| !v.is_empty()),
        };
        match records.delete(namespace, &name, &pre).await {
            Ok(()) | Err(DatastoreError::NotFound(_)) => return Ok(()),
            Err(DatastoreError::Conflict(e)) if attempt < ATTEMPTS => {
                tracing::info!(
                    attempt,
                    "endpoint changed while deleting it ({e}); retrying"
                );
            }
            Err(DatastoreError::Conflict(e)) => {
                return Err(Error::datastore(format!(
                    "error deleting endpoint: endpoint was modified before it could be deleted: {e}"
                )));
            }
            Err(e) => return Err(datastore_err("error deleting endpoint")(e)),
        }
    }
    unreachable!("the last attempt returns")
}
