//! cmdAdd: the common prelude (§4.1) and the plain-CNI path (§4.2).
//! Every step after IPAM ADD is undone if a later one fails.

use std::path::Path;

use ipnet::IpNet;
use serde_json::Value;

use crate::cni::env::Command;
use crate::cni::result::{CniResult, Interface, IpConfig};
use crate::cni::{Error, Request, Result};
use crate::dataplane::MacAddr;
use crate::dataplane::linux::{Networking, PodNetwork, delete_host_veth};
use crate::datastore::model::{Profile, WorkloadEndpoint};
use crate::datastore::names::{WepIdentifiers, sanitize_mesos_label};
use crate::datastore::{Datastore, Precondition};
use crate::plugin::{
    datastore_err, default_routes, ensure_ready, host_prefix, host_veth_name, identifiers,
    inject_fault, ipam, nodename, open_datastore, wep_namespace,
};

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
    async fn run(self, req: &Request, store: &dyn Datastore) {
        if let Some((ns, name, uid)) = self.endpoint {
            let pre = Precondition {
                resource_version: None,
                uid: Some(uid),
            };
            if let Err(e) = store.delete_workload_endpoint(&ns, &name, pre).await {
                tracing::error!("rollback: failed to delete WorkloadEndpoint {ns}/{name}: {e}");
            }
        }
        if let Some(veth) = self.host_veth
            && let Err(e) = delete_host_veth(&veth).await
        {
            tracing::error!("rollback: failed to delete veth {veth}: {e}");
        }
        if let Some(config) = self.ipam_release
            && let Err(e) = ipam(req).run(Command::Del, &config).await
        {
            tracing::error!("rollback: failed to release the IPAM allocation: {e}");
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
    /// Applied to the record once the addresses are known.
    pub finalize: Finalize,
}

/// A last adjustment of the record given the pod's addresses.
pub type Finalize = Box<dyn FnOnce(&mut WorkloadEndpoint, &[IpNet]) -> Result<()> + Send>;

/// Creates a new endpoint from `plan`: addresses (from `ipam_add`, running
/// while the veth pair is made), DoNetworking, the record, the profile.
/// Every step is undone if a later one fails.
pub async fn add_endpoint(
    req: &Request,
    store: &dyn Datastore,
    plan: Plan,
    ipam_add: Option<impl std::future::Future<Output = Result<CniResult>>>,
) -> Result<CniResult> {
    let mut undo = Undo::default();
    match add_new(req, store, plan, ipam_add, &mut undo).await {
        Ok(result) => Ok(result),
        Err(e) => {
            undo.run(req, store).await;
            Err(e)
        }
    }
}

/// Checks that need nothing but the config (the dataplane choice).
pub fn validate_dataplane(req: &Request) -> Result<()> {
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
fn mesos_labels(req: &Request, wep: &mut WorkloadEndpoint) {
    let labels = req
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
    req: &Request,
    host_veth: &str,
    mac: &str,
    ips: &[IpNet],
    from_ipam: Option<&CniResult>,
) -> CniResult {
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
pub async fn cmd_add(req: &Request) -> Result<CniResult> {
    inject_fault(req, "start")?;
    // Prelude: everything that can be refused before any state changes.
    req.conf.check_nodename_file()?;
    let mtu = req.conf.resolve_mtu()?;
    validate_dataplane(req)?;
    if !req.conf.readiness_gates.is_empty() {
        crate::plugin::readiness::wait_for_gates(&req.conf.readiness_gates, req.deadline).await?;
    }
    if req.env.args.k8s_pod().is_some() {
        return crate::k8s::cmd_add_k8s(req, mtu).await;
    }
    if req.conf.feature_control.ip_addrs_no_ipam {
        return Err(Error::UnsupportedField(
            "requested feature is not supported for this runtime: ip_addrs_no_ipam".into(),
        ));
    }
    let node = nodename(req);
    let ids = identifiers(req, &node);
    let namespace = wep_namespace(req);
    // The IPAM plugin is started now and waits for its config on stdin: its
    // start-up overlaps the datastore lookups below. It is killed unused if
    // this ADD takes another path (nothing happens before it reads stdin).
    let ipam = ipam(req);
    let ipam_process = ipam.spawn(Command::Add).await?;
    let store = open_datastore(req).await?;
    ensure_ready(store.as_ref()).await?;
    tracing::debug!("datastore ready");

    // Is there an endpoint for this workload already?
    let existing = find_existing(store.as_ref(), &ids, &namespace).await?;
    if let Some(wep) = existing {
        return add_to_existing(req, store.as_ref(), wep).await;
    }
    let name = ids.name().map_err(|e| {
        Error::InvalidConfig(format!("error constructing WorkloadEndpoint name: {e}"))
    })?;
    let mut wep = WorkloadEndpoint::new(&namespace, &name);
    mesos_labels(req, &mut wep);
    wep.spec.endpoint = req.env.ifname.clone();
    wep.spec.node = node;
    wep.spec.orchestrator = "cni".into();
    wep.spec.container_id = req.env.container_id.clone();
    wep.spec.profiles = vec![req.conf.name.clone()];
    let plan = Plan {
        wep,
        host_veth: host_veth_name(req),
        mtu,
        routes: Vec::new(),
        container_mac: None,
        ipam_release_config: req.raw.clone(),
        fixed_ips: None,
        finalize: Box::new(|_, _| Ok(())),
    };
    let ipam_add = ipam.add_on(&req.raw, Some(ipam_process));
    add_endpoint(req, store.as_ref(), plan, Some(ipam_add)).await
}

/// The endpoint already recorded for this workload, if any: a prefix
/// lookup filtered by NameMatches (interface ignored).
pub async fn find_existing(
    store: &dyn Datastore,
    ids: &WepIdentifiers,
    namespace: &str,
) -> Result<Option<WorkloadEndpoint>> {
    let prefix = lookup_prefix(ids)?;
    let mut ids = ids.clone();
    ids.endpoint.clear();
    Ok(store
        .list_workload_endpoints(namespace, &prefix)
        .await
        .map_err(datastore_err("error listing WorkloadEndpoints"))?
        .into_iter()
        .find(|w| ids.name_matches(&w.metadata.name)))
}

/// The name prefix that finds this workload's endpoints on any interface.
fn lookup_prefix(ids: &WepIdentifiers) -> Result<String> {
    let mut ids = ids.clone();
    ids.endpoint.clear();
    ids.name_prefix()
        .map_err(|e| Error::InvalidConfig(format!("error constructing WorkloadEndpoint name: {e}")))
}

/// The same container joins again (repeat ADD, or another network): the
/// profile is added, the result rebuilt from the endpoint; no IPAM, no
/// networking.
async fn add_to_existing(
    req: &Request,
    store: &dyn Datastore,
    mut wep: WorkloadEndpoint,
) -> Result<CniResult> {
    tracing::info!(endpoint = %wep.metadata.name, "endpoint already exists; reusing it");
    let profile = req.conf.name.clone();
    if !wep.spec.profiles.contains(&profile) {
        wep.spec.profiles.push(profile);
    }
    let wep = store
        .update_workload_endpoint(&wep)
        .await
        .map_err(datastore_err("error updating WorkloadEndpoint"))?;
    ensure_profile(req, store).await?;
    let ips: Vec<IpNet> = wep
        .spec
        .ip_networks
        .iter()
        .map(|s| {
            s.parse::<IpNet>()
                .map_err(|e| Error::Datastore(format!("bad ipNetworks entry {s:?}: {e}")))
        })
        .collect::<Result<_>>()?;
    let mut result = endpoint_result(req, &wep.spec.interface_name, &wep.spec.mac, &ips, None);
    result.interfaces[1].name = wep.spec.endpoint.clone();
    Ok(result)
}

/// Profile creation when `policy.type` is empty: created once, never updated.
async fn ensure_profile(req: &Request, store: &dyn Datastore) -> Result<()> {
    if !req.conf.policy.kind.is_empty() {
        return Ok(());
    }
    let name = &req.conf.name;
    match store.get_profile(name).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => match store
            .create_profile(&Profile::for_network(name, false))
            .await
        {
            Ok(_) | Err(crate::datastore::DatastoreError::AlreadyExists(_)) => Ok(()),
            Err(e) => Err(Error::Datastore(format!(
                "error creating profile {name}: {e}"
            ))),
        },
        Err(e) => Err(Error::Datastore(format!(
            "error getting profile {name}: {e}"
        ))),
    }
}

async fn add_new(
    req: &Request,
    store: &dyn Datastore,
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
        finalize,
    } = plan;
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
        deadline: req.deadline,
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
            (Some(ipam_add), None) => ipam_add.await,
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
    inject_fault(req, "ipam")?;
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
    // Only routes of the families the pod has addresses in.
    networking.routes = if routes.is_empty() {
        default_routes(&ips)
    } else {
        let families = |r: &IpNet| {
            ips.iter()
                .any(|ip| ip.addr().is_ipv6() == r.addr().is_ipv6())
        };
        routes.into_iter().filter(families).collect()
    };
    networking.ips = ips.clone();
    let outcome = tokio::time::timeout(req.remaining(), pod.finish(&prepared, &networking))
        .await
        .map_err(|_| Error::TryAgainLater("timed out setting up the pod network".into()))??;
    tracing::debug!("networking done");
    inject_fault(req, "networking")?;
    let mac = outcome.container_mac.to_string();

    // 3. The endpoint record.
    wep.spec.ip_networks = ips.iter().map(|ip| ip.to_string()).collect();
    wep.spec.mac = mac.clone();
    wep.spec.interface_name = host_veth.clone();
    finalize(&mut wep, &ips)?;
    let stored = match wep.metadata.resource_version.is_empty() {
        true => store.create_workload_endpoint(&wep).await,
        false => store.update_workload_endpoint(&wep).await,
    }
    .map_err(datastore_err("error writing WorkloadEndpoint"))?;
    undo.endpoint = Some((
        wep.metadata.namespace.clone(),
        wep.metadata.name.clone(),
        stored.metadata.uid.clone(),
    ));
    tracing::debug!("endpoint stored");
    inject_fault(req, "endpoint")?;

    // 4. The network's profile.
    ensure_profile(req, store).await?;
    inject_fault(req, "profile")?;

    // Check that the result prints in the config's version before committing.
    let result = endpoint_result(req, &host_veth, &mac, &ips, Some(&ipam_result));
    result.to_version(req.version)?;
    Ok(result)
}
