//! Address management: the IPAM plugin the `calico` plugin delegates to
//! (with host-local's special cases, [`host_local`]), and the `calico-ipam`
//! personality ([`personality`]).

pub mod host_local;
mod personality;

use tokio::time::Instant;

use crate::cni::Request;
use crate::cni::delegate::Delegate;

pub use personality::handle;

/// The IPAM plugin of this request, bounded by `deadline`.
pub fn delegate(req: &Request, deadline: Instant) -> Delegate<'_> {
    Delegate {
        plugin: &req.conf.ipam.kind,
        path: &req.env.path,
        env: &req.env.vars,
        extra_args: None,
        deadline,
    }
}

/// The config the IPAM plugin gets to release an allocation (DEL, and the
/// rollback of a failed ADD): the request's own, with host-local's
/// `usePodCidr` placeholders made valid.
pub fn release_config(req: &Request) -> serde_json::Value {
    let mut config = req.raw.clone();
    if req.conf.ipam.kind == "host-local" {
        host_local::release_pod_cidrs(&mut config);
    }
    config
}
