//! The pod's interface pair made ahead: while an ADD reads the datastore
//! (and its IPAM allocates), before it knows whether it will need a pair
//! and which one. Made only where both names are free
//! ([`crate::dataplane::Dataplane::prepare_ahead`]), so nothing that
//! exists is ever removed for it; used when it is the pair the plan asks
//! for, else removed (a plan that needs none, a failed one) or replaced
//! (another MAC) as the usual `prepare` replaces a leftover.

use std::path::Path;

use crate::cni::Result;
use crate::dataplane::{DeviceKind, MacAddr, Networking, PreparedPod, WorkloadInfo};
use crate::plugin::context::Context;
use crate::plugin::rollback::Undo;

/// The pod's interface pair being made ahead.
pub struct PairAhead<'a> {
    /// What it is made for.
    networking: Networking,
    making: futures::future::MaybeDone<futures::future::BoxFuture<'a, Ahead>>,
}

/// A pair made ahead; `Err`: the deadline cut the making short, perhaps
/// after the kernel made it.
type Ahead = std::result::Result<Option<PreparedPod>, tokio::time::error::Elapsed>;

impl<'a> PairAhead<'a> {
    pub fn start(ctx: &'a Context, mtu: u32, device: DeviceKind) -> PairAhead<'a> {
        let networking = pair_networking(ctx, ctx.host_veth.clone(), mtu, device, None);
        let for_pair = networking.clone();
        let making = Box::pin(async move {
            let netns = Path::new(&ctx.req.env.netns);
            let made = ctx.dataplane().prepare_ahead(netns, &for_pair);
            tokio::time::timeout_at(ctx.deadline(), made).await
        });
        PairAhead {
            networking,
            making: futures::future::maybe_done(making),
        }
    }

    /// Runs `work`, the making going on meanwhile.
    pub async fn alongside<T>(&mut self, work: impl std::future::Future<Output = T>) -> T {
        tokio::pin!(work);
        loop {
            tokio::select! {
                biased;
                out = &mut work => return out,
                () = &mut self.making, if matches!(self.making, futures::future::MaybeDone::Future(_)) => {}
            }
        }
    }

    /// The pair made ahead, once its making ends.
    async fn made(mut self) -> (Networking, Ahead) {
        (&mut self.making).await;
        let made = std::pin::Pin::new(&mut self.making)
            .take_output()
            .unwrap_or(Ok(None));
        (self.networking, made)
    }

    /// The ADD needs no pair after all: one made ahead goes.
    pub async fn discard(self, ctx: &Context) {
        let (networking, made) = self.made().await;
        if !matches!(made, Ok(None)) {
            let undo = Undo {
                host_veth: Some(networking.host_veth),
                ..Undo::default()
            };
            undo.run(ctx).await;
        }
    }

    /// The pair for `wanted`: the one made ahead when it is that one, else
    /// the dataplane's usual `prepare` (which replaces one of the same
    /// name; one of another name is deleted first).
    pub async fn take_or_prepare(self, ctx: &Context, wanted: &Networking) -> Result<PreparedPod> {
        let (made_for, made) = self.made().await;
        match made {
            Ok(Some(pod)) if same_pair(&made_for, wanted) => return Ok(pod),
            Ok(None) => {}
            _ => {
                tracing::debug!(veth = %made_for.host_veth, "the pair made ahead is not the plan's");
                if made_for.host_veth != wanted.host_veth {
                    ctx.dataplane()
                        .delete_host_link(&made_for.host_veth)
                        .await?;
                }
            }
        }
        let netns = Path::new(&ctx.req.env.netns);
        Ok(ctx.dataplane().prepare(netns, wanted).await?)
    }
}

/// What the dataplane is asked to make for a pod: its pair named
/// `host_veth` and the config's interface name (no addresses yet).
pub fn pair_networking(
    ctx: &Context,
    host_veth: String,
    mtu: u32,
    device: DeviceKind,
    container_mac: Option<MacAddr>,
) -> Networking {
    let req = &ctx.req;
    Networking {
        ifname: req.env.ifname.clone(),
        host_veth,
        ips: Vec::new(),
        routes: Vec::new(),
        mtu,
        queues: req.conf.num_queues(),
        device,
        container_mac,
        allow_ip_forwarding: req.conf.container_settings.allow_ip_forwarding,
        skip_host_routes: false,
        deadline: ctx.deadline(),
        ipam_addresses: Vec::new(),
        workload: WorkloadInfo::default(),
    }
}

/// Whether a pair made for `made` is the one `wanted` asks for.
fn same_pair(made: &Networking, wanted: &Networking) -> bool {
    made.host_veth == wanted.host_veth
        && made.ifname == wanted.ifname
        && made.mtu == wanted.mtu
        && made.queues == wanted.queues
        && made.device == wanted.device
        && made.container_mac == wanted.container_mac
}
