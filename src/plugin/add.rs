//! cmdAdd: the common prelude (§4.1) and the plain-CNI path (§4.2).
//! Every step after IPAM ADD is undone if a later one fails.

use std::path::Path;

use ipnet::IpNet;
use serde_json::Value;

use crate::cni::env::Command;
use crate::cni::result::{CniResult, Interface, IpConfig};
use crate::cni::{Error, Result};
use crate::dataplane::MacAddr;
use crate::dataplane::linux::{Networking, PodNetwork, delete_host_veth};
use crate::dataplane::routes::{container_routes_for, host_prefix};
use crate::datastore::model::{Profile, WorkloadEndpoint};
use crate::datastore::names::{WepIdentifiers, sanitize_mesos_label};
use crate::datastore::{DatastoreError, ListFilter, Precondition, Store};
use crate::plugin::context::{Context, datastore_err};
use crate::plugin::inject_fault;

/// What an ADD has done so far, to be undone if a later step fails.
#[derive(Default)]
struct Undo {
    /// The IPAM plugin was given a config: release with this one.
    ipam_release: Option<Value>,
    host_veth: Option<String>,
    /// (namespace, name, uid) of a WorkloadEndpoint this ADD created.
    endpoint: Option<(String, String, String)>,
}

impl Undo {
    /// Undoes every step, each failure logged and the rest still done, on
    /// a budget of its own (the ADD's deadline may be what failed it).
    async fn run(self, ctx: &Context, store: &dyn Store) {
        let deadline = ctx.cleanup_deadline();
        let bounded = |what: &'static str| {
            move |_| tracing::error!("rollback: {what} did not finish within the cleanup budget")
        };
        if let Some((ns, name, uid)) = self.endpoint {
            let pre = Precondition {
                resource_version: None,
                uid: Some(uid),
            };
            match tokio::time::timeout_at(
                deadline,
                store.delete::<WorkloadEndpoint>(&ns, &name, &pre),
            )
            .await
            {
                Ok(Err(e)) => {
                    tracing::error!("rollback: failed to delete WorkloadEndpoint {ns}/{name}: {e}")
                }
                Err(e) => bounded("deleting the WorkloadEndpoint")(e),
                Ok(Ok(())) => {}
            }
        }
        if let Some(veth) = self.host_veth {
            match tokio::time::timeout_at(deadline, delete_host_veth(&veth)).await {
                Ok(Err(e)) => tracing::error!("rollback: failed to delete veth {veth}: {e}"),
                Err(e) => bounded("deleting the host veth")(e),
                Ok(Ok(_)) => {}
            }
        }
        if let Some(config) = self.ipam_release {
            let released = async {
                ctx.ipam_for_cleanup()
                    .await?
                    .run(Command::Del, &config)
                    .await
            };
            if let Err(e) = released.await {
                tracing::error!("rollback: failed to release the IPAM allocation: {e}");
            }
        }
    }
}

/// Everything an ADD of a new endpoint has decided before addresses are
/// allocated; the plain-CNI path and CmdAddK8s each build one.
pub struct Plan {
    /// The record to write; addresses, MAC and host interface are filled in.
    pub wep: WorkloadEndpoint,
    pub host_veth: String,
    pub mtu: u32,
    /// Container routes; empty means a default route per address family.
    pub routes: Vec<IpNet>,
    /// A requested container MAC (hwAddr annotation).
    pub container_mac: Option<MacAddr>,
    /// The config the IPAM plugin gets on DEL, should the ADD be rolled back.
    pub ipam_release_config: Value,
    /// Addresses given without IPAM (ipAddrsNoIpam): no IPAM call.
    pub fixed_ips: Option<Vec<IpNet>>,
    /// The container whose endpoint this ADD takes over (the record it
    /// read was that container's), if any.
    pub replaces: Option<String>,
    /// Applied to the record once the addresses are known.
    pub finalize: Finalize,
}

/// A last adjustment of the record given the pod's addresses.
pub type Finalize = Box<dyn FnOnce(&mut WorkloadEndpoint, &[IpNet]) -> Result<()> + Send>;

/// Creates a new endpoint from `plan`: addresses (from `ipam_add`, running
/// while the veth pair is made), DoNetworking, the record, the profile.
/// Every step is undone if a later one fails.
pub async fn add_endpoint(
    ctx: &Context,
    store: &dyn Store,
    plan: Plan,
    ipam_add: Option<impl std::future::Future<Output = Result<CniResult>>>,
) -> Result<CniResult> {
    let mut undo = Undo::default();
    match add_new(ctx, store, plan, ipam_add, &mut undo).await {
        Ok(result) => Ok(result),
        Err(e) => {
            undo.run(ctx, store).await;
            Err(e)
        }
    }
}

/// Checks that need nothing but the config (the dataplane choice).
pub fn validate_dataplane(ctx: &Context) -> Result<()> {
    let req = &ctx.req;
    match req.conf.device_type.as_str() {
        "" | "veth" => {}
        "netkit" => {
            return Err(Error::UnsupportedField(
                "device_type \"netkit\" is not supported by this build; use \"veth\"".into(),
            ));
        }
        other => {
            return Err(Error::InvalidConfig(format!(
                "unknown device_type {other:?} in CNI config (supported: \"veth\", \"netkit\")"
            )));
        }
    }
    match req
        .conf
        .dataplane_options
        .get("type")
        .and_then(Value::as_str)
    {
        None => Ok(()),
        Some("grpc") => Err(Error::UnsupportedField(
            "dataplane_options type \"grpc\" is not supported by this build".into(),
        )),
        Some(other) => Err(Error::InvalidConfig(format!(
            "invalid dataplane type: {other}"
        ))),
    }
}

/// Labels from Mesos' `args` (plain CNI only).
fn mesos_labels(ctx: &Context, wep: &mut WorkloadEndpoint) {
    let labels = ctx
        .req
        .conf
        .args
        .get("org.apache.mesos")
        .and_then(|m| m.pointer("/network_info/labels/labels"))
        .and_then(Value::as_array);
    for label in labels.into_iter().flatten() {
        let (Some(k), Some(v)) = (
            label.get("key").and_then(Value::as_str),
            label.get("value").and_then(Value::as_str),
        ) else {
            continue;
        };
        if k == "projectcalico.org/namespace" {
            wep.metadata.namespace = sanitize_mesos_label(v);
        } else {
            wep.metadata
                .labels
                .insert(sanitize_mesos_label(k), sanitize_mesos_label(v));
        }
    }
}

/// The printed result for an endpoint: host veth, container interface,
/// every address at index 1.
fn endpoint_result(
    ctx: &Context,
    host_veth: &str,
    mac: &str,
    ips: &[IpNet],
    from_ipam: Option<&CniResult>,
) -> CniResult {
    let req = &ctx.req;
    let mtu = u32::try_from(req.conf.mtu).ok().filter(|m| *m > 0);
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

/// cmdAdd.
pub async fn cmd_add(ctx: &Context) -> Result<CniResult> {
    let req = &ctx.req;
    inject_fault(ctx, "start")?;
    // Prelude: everything that can be refused before any state changes.
    req.conf.check_nodename_file()?;
    let mtu = req.conf.resolve_mtu()?;
    validate_dataplane(ctx)?;
    if !req.conf.readiness_gates.is_empty() {
        crate::plugin::readiness::wait_for_gates(&req.conf.readiness_gates, ctx.deadline()).await?;
    }
    if req.env.args.k8s_pod().is_some() {
        return crate::plugin::cmd_add_k8s(ctx, mtu).await;
    }
    if req.conf.feature_control.ip_addrs_no_ipam {
        return Err(Error::UnsupportedField(
            "requested feature is not supported for this runtime: ip_addrs_no_ipam".into(),
        ));
    }
    // The IPAM plugin is started now and waits for its config on stdin: its
    // start-up overlaps the datastore lookups below. It is killed unused if
    // this ADD takes another path (nothing happens before it reads stdin).
    let ipam = ctx.ipam().await?;
    let ipam_process = ipam.start(Command::Add).await?;
    let store = ctx.store().await?.as_ref();
    ctx.ensure_ready().await?;
    tracing::debug!("datastore ready");

    // Is there an endpoint for this workload already?
    let existing = find_existing(store, &ctx.ids, &ctx.namespace).await?;
    if let Some(wep) = existing {
        return add_to_existing(ctx, store, wep).await;
    }
    let name = ctx.endpoint_name()?;
    let mut wep = WorkloadEndpoint::new(&ctx.namespace, &name);
    mesos_labels(ctx, &mut wep);
    wep.spec.endpoint = req.env.ifname.clone();
    wep.spec.node = ctx.node.clone();
    wep.spec.orchestrator = "cni".into();
    wep.spec.container_id = req.env.container_id.clone();
    wep.spec.profiles = vec![req.conf.name.clone()];
    let plan = Plan {
        wep,
        host_veth: ctx.host_veth.clone(),
        mtu,
        routes: Vec::new(),
        container_mac: None,
        ipam_release_config: req.raw.clone(),
        fixed_ips: None,
        replaces: None,
        finalize: Box::new(|_, _| Ok(())),
    };
    let ipam_add = ipam.add_on(&req.raw, Some(ipam_process));
    add_endpoint(ctx, store, plan, Some(ipam_add)).await
}

/// The endpoint already recorded for this workload, if any: a prefix
/// lookup filtered by NameMatches (interface ignored).
pub async fn find_existing(
    store: &dyn Store,
    ids: &WepIdentifiers,
    namespace: &str,
) -> Result<Option<WorkloadEndpoint>> {
    let prefix = lookup_prefix(ids)?;
    let mut ids = ids.clone();
    ids.endpoint.clear();
    Ok(store
        .list::<WorkloadEndpoint>(namespace, &ListFilter::NamePrefix(prefix))
        .await
        .map_err(datastore_err("error listing WorkloadEndpoints"))?
        .into_iter()
        .find(|w| ids.name_matches(&w.metadata.name)))
}

/// The name prefix that finds this workload's endpoints on any interface.
pub fn lookup_prefix(ids: &WepIdentifiers) -> Result<String> {
    let mut ids = ids.clone();
    ids.endpoint.clear();
    ids.name_prefix()
        .map_err(|e| Error::InvalidConfig(format!("error constructing WorkloadEndpoint name: {e}")))
}

/// The same container joins again (repeat ADD, or another network): the
/// profile is added, the result rebuilt from the endpoint; no IPAM, no
/// networking.
async fn add_to_existing(
    ctx: &Context,
    store: &dyn Store,
    mut wep: WorkloadEndpoint,
) -> Result<CniResult> {
    tracing::info!(endpoint = %wep.metadata.name, "endpoint already exists; reusing it");
    let profile = ctx.req.conf.name.clone();
    if !wep.spec.profiles.contains(&profile) {
        wep.spec.profiles.push(profile);
    }
    let wep = store
        .update(&mut wep)
        .await
        .map_err(datastore_err("error updating WorkloadEndpoint"))?;
    ensure_profile(ctx, store).await?;
    let ips: Vec<IpNet> = wep
        .spec
        .ip_networks
        .iter()
        .map(|s| {
            s.parse::<IpNet>()
                .map_err(|e| Error::Datastore(format!("bad ipNetworks entry {s:?}: {e}")))
        })
        .collect::<Result<_>>()?;
    let mut result = endpoint_result(ctx, &wep.spec.interface_name, &wep.spec.mac, &ips, None);
    result.interfaces[1].name = wep.spec.endpoint.clone();
    Ok(result)
}

/// Profile creation when `policy.type` is empty: created once, never updated.
async fn ensure_profile(ctx: &Context, store: &dyn Store) -> Result<()> {
    let name = &ctx.req.conf.name;
    if !ctx.req.conf.policy.kind.is_empty() {
        return Ok(());
    }
    match store.get::<Profile>("", name).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => match store.create(&mut Profile::for_network(name, false)).await {
            Ok(_) | Err(DatastoreError::AlreadyExists(_)) => Ok(()),
            Err(e) => Err(e.context(&format!("error creating profile {name}"))),
        },
        Err(e) => Err(e.context(&format!("error getting profile {name}"))),
    }
}

/// Attempts at updating an endpoint that keeps changing underneath.
const WRITE_ATTEMPTS: usize = 3;

/// Writes the endpoint record: a create, or (taking over the endpoint of
/// container `replaces`, or this container's own) an update on the
/// revision read. An update refused because the record changed since is
/// retried on a fresh read, unless the record now belongs to yet another
/// container: it is never overwritten blindly.
async fn write_endpoint(
    store: &dyn Store,
    wep: &mut WorkloadEndpoint,
    replaces: Option<&str>,
) -> Result<WorkloadEndpoint, DatastoreError> {
    if wep.metadata.resource_version.is_empty() {
        return store.create(wep).await;
    }
    for attempt in 1..=WRITE_ATTEMPTS {
        match store.update(wep).await {
            Err(DatastoreError::Conflict(e)) if attempt < WRITE_ATTEMPTS => {
                tracing::info!(
                    attempt,
                    "endpoint changed while writing it ({e}); reading it again"
                );
                let (namespace, name) = (&wep.metadata.namespace, &wep.metadata.name);
                let current = store
                    .get::<WorkloadEndpoint>(namespace, name)
                    .await?
                    .ok_or_else(|| {
                        DatastoreError::NotFound(format!("WorkloadEndpoint({namespace}/{name})"))
                    })?;
                let owner = current.spec.container_id.as_str();
                if !(owner.is_empty() || owner == wep.spec.container_id || Some(owner) == replaces)
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
}

async fn add_new(
    ctx: &Context,
    store: &dyn Store,
    plan: Plan,
    ipam_add: Option<impl std::future::Future<Output = Result<CniResult>>>,
    undo: &mut Undo,
) -> Result<CniResult> {
    let Plan {
        mut wep,
        host_veth,
        mtu,
        routes,
        container_mac,
        ipam_release_config,
        fixed_ips,
        replaces,
        finalize,
    } = plan;
    let req = &ctx.req;
    let mut networking = Networking {
        ifname: req.env.ifname.clone(),
        host_veth: host_veth.clone(),
        ips: Vec::new(),
        routes: Vec::new(),
        mtu,
        queues: req.conf.num_queues(),
        container_mac,
        allow_ip_forwarding: req.conf.container_settings.allow_ip_forwarding,
        skip_host_routes: false,
        deadline: ctx.deadline(),
    };
    // 1. Addresses from the IPAM plugin, while the veth pair is made: the
    //    pair needs no address, and the plugin runs in its own process.
    //    (Recorded for undo before the attempt: a deadline can cut the work
    //    short after the pair exists; deleting one never made is harmless.)
    undo.host_veth = Some(host_veth.clone());
    // Likewise the allocation: once the plugin has its config, a failure
    // (even its own, or a deadline that kills it mid-way) is followed by a
    // DEL, which is harmless when it holds nothing.
    if fixed_ips.is_none() {
        undo.ipam_release = Some(ipam_release_config);
    }
    let allocate = async {
        match (ipam_add, fixed_ips) {
            (_, Some(ips)) => Ok(CniResult {
                ips: ips
                    .into_iter()
                    .map(|address| crate::cni::result::IpConfig {
                        address,
                        gateway: None,
                        interface: None,
                    })
                    .collect(),
                ..CniResult::default()
            }),
            (Some(ipam_add), None) => {
                let result = ipam_add.await;
                crate::fault::kill_point("ipam");
                result
            }
            (None, None) => Err(Error::Internal("no address source for the endpoint".into())),
        }
    };
    let open_and_prepare = async {
        let pod = PodNetwork::open(Path::new(&req.env.netns))?.ok_or_else(|| {
            Error::Dataplane(format!(
                "failed to Statfs {:?}: no such file or directory",
                req.env.netns
            ))
        })?;
        let prepared = pod.prepare(&networking).await?;
        crate::fault::kill_point("veth");
        Ok::<_, Error>((pod, prepared))
    };
    let (ipam_result, prepared) = tokio::time::timeout(req.remaining(), async {
        tokio::join!(allocate, open_and_prepare)
    })
    .await
    .map_err(|_| {
        Error::TryAgainLater("timed out allocating addresses and creating the veth pair".into())
    })?;
    let ipam_result = ipam_result?;
    let (pod, prepared) = prepared?;
    tracing::debug!("IPAM and veth pair done");
    inject_fault(ctx, "ipam")?;
    if ipam_result.ips.is_empty() {
        return Err(Error::Ipam(
            "IPAM plugin returned no IP addresses in result".into(),
        ));
    }
    let ips: Vec<IpNet> = ipam_result
        .ips
        .iter()
        .map(|ip| host_prefix(&ip.address))
        .collect();

    // 2. The rest of DoNetworking.
    networking.routes = container_routes_for(routes, &ips);
    networking.ips = ips.clone();
    let outcome = tokio::time::timeout(req.remaining(), pod.finish(&prepared, &networking))
        .await
        .map_err(|_| Error::TryAgainLater("timed out setting up the pod network".into()))??;
    tracing::debug!("networking done");
    inject_fault(ctx, "networking")?;
    let mac = outcome.container_mac.to_string();

    // 3. The endpoint record.
    wep.spec.ip_networks = ips.iter().map(|ip| ip.to_string()).collect();
    wep.spec.mac = mac.clone();
    wep.spec.interface_name = host_veth.clone();
    finalize(&mut wep, &ips)?;
    let stored = write_endpoint(store, &mut wep, replaces.as_deref())
        .await
        .map_err(datastore_err("error writing WorkloadEndpoint"))?;
    undo.endpoint = Some((
        wep.metadata.namespace.clone(),
        wep.metadata.name.clone(),
        stored.metadata.uid.clone(),
    ));
    tracing::debug!("endpoint stored");
    crate::fault::kill_point("endpoint");
    inject_fault(ctx, "endpoint")?;

    // 4. The network's profile.
    ensure_profile(ctx, store).await?;
    inject_fault(ctx, "profile")?;

    // Check that the result prints in the config's version before committing.
    let result = endpoint_result(ctx, &host_veth, &mac, &ips, Some(&ipam_result));
    result.to_version(req.version)?;
    Ok(result)
}
