//! What kind of workload a call is for, as a strategy chosen once per call
//! ([`of`]): a plain CNI container ([`plain`]) or a Kubernetes pod
//! ([`kubernetes`]). The verbs orchestrate; a workload kind says what is
//! particular to it — how ADD's endpoint is planned (where its labels,
//! addresses and routes come from, whether it exists already), which host
//! interface a DEL whose netns is gone may remove, which routes CHECK
//! expects. A kind never calls back into the verbs.

pub mod annotations;
pub mod kubernetes;
pub mod plain;

use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::Value;

use crate::cni::{CniResult, Result};
use crate::dataplane::MacAddr;
use crate::datastore::model::WorkloadEndpoint;
use crate::plugin::context::Context;

/// The kind-specific part of ADD.
#[async_trait::async_trait]
pub trait Workload: Send + Sync {
    /// What ADD creates for this workload, decided before any address is
    /// taken (the IPAM plugin has been started by then), or the result of
    /// an ADD that has nothing to create.
    async fn plan_add(&self, ctx: &Context, mtu: u32) -> Result<AddPlan>;

    /// DEL with the sandbox's netns gone: whether the host interface the
    /// context names is this sandbox's, given the record DEL read.
    fn owns_host_veth(&self, ctx: &Context, record: Option<&WorkloadEndpoint>) -> bool;

    /// The container routes this workload's ADD installs (CHECK expects
    /// them); empty means a default route per address family.
    fn container_routes(&self, ctx: &Context) -> Result<Vec<IpNet>>;
}

/// The workload kind of `ctx`: a Kubernetes pod when CNI_ARGS names one.
pub fn of(ctx: &Context) -> &'static dyn Workload {
    match ctx.ids.orchestrator.as_str() {
        "k8s" => &kubernetes::KubernetesPod,
        _ => &plain::PlainContainer,
    }
}

/// What an ADD does.
pub enum AddPlan {
    /// The workload's endpoint exists already and was joined (a repeat
    /// ADD of a plain container, or another network of it): the result.
    Done(CniResult),
    /// A new endpoint to create.
    Create(Box<Plan>),
}

/// Everything an ADD of a new endpoint has decided before addresses are
/// allocated.
pub struct Plan {
    /// The record to write; addresses, MAC and host interface are filled in.
    pub wep: WorkloadEndpoint,
    pub host_veth: String,
    pub mtu: u32,
    /// Container routes; empty means a default route per address family.
    pub routes: Vec<IpNet>,
    /// A requested container MAC (hwAddr annotation).
    pub container_mac: Option<MacAddr>,
    /// Where the addresses come from.
    pub addresses: Addresses,
    /// The config the IPAM gets on DEL, should the ADD be rolled back.
    pub release_config: Value,
    /// The container whose endpoint this ADD takes over (the record it
    /// read was that container's), if any.
    pub replaces: Option<String>,
    /// Applied to the record once the addresses are known.
    pub finalize: Finalize,
    /// Waited for once the record is written (Kubernetes pods with
    /// `policy_setup_timeout_seconds`): the endpoint's policy in place.
    pub policy_wait: Option<crate::plugin::policy_wait::PolicyWait>,
}

/// Where an endpoint's addresses come from.
pub enum Addresses {
    /// IPAM ADD with this config.
    Ipam(Value),
    /// One IPAM ADD per address, each with `IP=<ip>` (ipAddrs); the
    /// addresses of the record this ADD replaces are released first.
    Each {
        config: Value,
        ips: Vec<IpAddr>,
        release_first: Vec<IpAddr>,
    },
    /// Given without IPAM (ipAddrsNoIpam).
    Fixed(Vec<IpNet>),
}

/// A last adjustment of the record given the pod's addresses.
pub type Finalize = Box<dyn FnOnce(&mut WorkloadEndpoint, &[IpNet]) -> Result<()> + Send>;
