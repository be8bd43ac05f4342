//! The veth layout, Calico's: DoNetworking (ADD), CleanUpNamespace (DEL)
//! and the CHECK verification, written against the [`Netlink`] trait and
//! the pod namespaces' opener ([`Namespaces`]) so that the sequence is
//! testable without root ([`super::fake`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use tokio::time::Instant;

use crate::dataplane::namespace_cleanup;
use crate::dataplane::netlink::{Ipv4Conf, Netlink, RouteSpec, RtNetlink, VethSpec};
use crate::dataplane::netns::NetNs;
use crate::dataplane::sysctl::{self, Sysctl};
use crate::dataplane::{
    CleanupOutcome, Dataplane, DataplaneError, DeviceKind, MacAddr, Networking, NetworkingOutcome,
    PreparedPod,
};

/// The container's IPv4 gateway: a link-local address answered by proxy ARP.
pub const GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// The host veth's EUI-64 link-local address for MAC ee:ee:ee:ee:ee:ee.
pub const GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0xecee, 0xeeff, 0xfeee, 0xeeee);

const POLL: Duration = Duration::from_millis(5);
/// How long to wait for IPv6 addresses to settle (DAD is off, so this is
/// only the kernel's own work queue).
const ADDRESS_SETTLE: Duration = Duration::from_secs(2);

/// Where sysctls are written.
pub trait SysctlWriter: Send + Sync {
    /// In the host namespace.
    fn host(&self, sysctls: &[Sysctl]) -> Result<(), DataplaneError>;
    /// In the pod namespace.
    fn pod(&self, sysctls: &[Sysctl]) -> Result<(), DataplaneError>;
}

/// Host sysctls on the calling (host) thread; pod sysctls through the
/// files opened with the pod's socket, the rest on a one-shot thread
/// inside the pod netns.
struct ProcSysctls {
    netns: NetNs,
    opened: sysctl::Opened,
}

impl SysctlWriter for ProcSysctls {
    fn host(&self, sysctls: &[Sysctl]) -> Result<(), DataplaneError> {
        sysctl::apply(sysctls)
    }
    fn pod(&self, sysctls: &[Sysctl]) -> Result<(), DataplaneError> {
        let rest = sysctl::apply_opened(sysctls, &self.opened)?;
        if rest.is_empty() {
            return Ok(());
        }
        self.netns.run(|| sysctl::apply(&rest))?
    }
}

/// One pod's namespaces as the dataplane sees them: a netlink socket in
/// the host netns, one inside the pod netns, and where sysctls go.
pub struct PodNetwork {
    pub host: Arc<dyn Netlink>,
    pub pod: Arc<dyn Netlink>,
    pub sysctls: Arc<dyn SysctlWriter>,
    /// The pod netns fd, for creating the container end directly in it
    /// (kept open by `sysctls`).
    pub pod_fd: std::os::fd::RawFd,
}

/// The veth pair made for a pod, before it has addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prepared {
    pub host_index: u32,
    pub pod_index: u32,
    pub container_mac: MacAddr,
}

/// Host-side route for one pod address.
fn host_route(ip: IpNet, host_index: u32) -> RouteSpec {
    RouteSpec {
        dst: IpNet::new(ip.addr(), ip.max_prefix_len()).expect("max prefix is valid"),
        gateway: None,
        oif: Some(host_index),
        scope_link: true,
    }
}

/// The container routes Calico installs: 169.254.1.1 scope link and each
/// IPv4 route via it; each IPv6 route via the host's link-local address.
fn container_routes(routes: &[IpNet], index: u32, gw6: Ipv6Addr) -> Vec<RouteSpec> {
    let mut out = Vec::new();
    let v4: Vec<_> = routes
        .iter()
        .filter(|r| matches!(r, IpNet::V4(_)))
        .collect();
    if !v4.is_empty() {
        out.push(RouteSpec {
            dst: IpNet::new(GATEWAY_V4.into(), 32).expect("valid"),
            gateway: None,
            oif: Some(index),
            scope_link: true,
        });
    }
    for dst in routes {
        let gateway: IpAddr = match dst {
            IpNet::V4(_) => GATEWAY_V4.into(),
            IpNet::V6(_) => gw6.into(),
        };
        out.push(RouteSpec {
            dst: dst.trunc(),
            gateway: Some(gateway),
            oif: Some(index),
            scope_link: false,
        });
    }
    out
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// Polls `probe` until it yields a value or `limit` (capped by the deadline) passes.
async fn wait_for<T, F, Fut>(
    limit: Duration,
    deadline: Instant,
    what: &str,
    mut probe: F,
) -> Result<T, DataplaneError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, DataplaneError>>,
{
    let until = Instant::now() + limit.min(remaining(deadline));
    loop {
        if let Some(v) = probe().await? {
            return Ok(v);
        }
        if Instant::now() >= until {
            return Err(DataplaneError::Timeout(format!(
                "timed out waiting for {what}"
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Adds a host route; EEXIST is fine only for the same route on the same
/// interface (Felix may have added it), otherwise the error names the other
/// interface.
async fn add_host_route(
    host: &dyn Netlink,
    route: &RouteSpec,
    host_veth: &str,
) -> Result<(), DataplaneError> {
    match host.add_route(route).await {
        Err(DataplaneError::Exists(_)) => {
            let existing = host.routes(route.dst.addr().is_ipv6()).await?;
            let same_dst: Vec<_> = existing.iter().filter(|r| r.dst == route.dst).collect();
            if same_dst
                .iter()
                .any(|r| r.oif == route.oif && r.scope_link == route.scope_link)
            {
                return Ok(());
            }
            let other = same_dst.first().and_then(|r| r.oif).unwrap_or(0);
            Err(DataplaneError::Conflict(format!(
                "route {} already exists for an interface other than '{host_veth}' (ifindex {other})",
                route.dst
            )))
        }
        other => other,
    }
}

/// A pod's side as the dataplane works on it: a netlink socket inside its
/// namespace, where its sysctls go, and the namespace's fd.
pub struct PodSide {
    pub netlink: Arc<dyn Netlink>,
    pub sysctls: Arc<dyn SysctlWriter>,
    pub fd: std::os::fd::RawFd,
}

/// How pod namespaces are reached: opened (a socket inside), and their
/// interface deleted.
pub trait Namespaces: Send + Sync {
    /// The pod side of the namespace at `netns`; `Ok(None)` when the path
    /// does not exist.
    fn open(
        &self,
        netns: &Path,
    ) -> futures::future::BoxFuture<'static, Result<Option<PodSide>, DataplaneError>>;

    /// Deletes `ifname` inside the namespace at `netns` (empty: none given)
    /// by `deadline`.
    fn delete_link(
        &self,
        netns: &str,
        ifname: &str,
        deadline: Instant,
    ) -> futures::future::BoxFuture<'static, Result<CleanupOutcome, DataplaneError>>;
}

/// The kernel's namespaces: a socket made inside on a one-shot thread, and
/// [`namespace_cleanup::clean_up_namespace`].
pub struct KernelNamespaces;

impl Namespaces for KernelNamespaces {
    fn open(
        &self,
        netns: &Path,
    ) -> futures::future::BoxFuture<'static, Result<Option<PodSide>, DataplaneError>> {
        let opened = NetNs::open(netns);
        Box::pin(async move {
            let Some(netns) = opened? else {
                return Ok(None);
            };
            let ((conn, handle), opened) = pod_socket(&netns).await?;
            tokio::spawn(conn);
            let fd = netns.raw_fd();
            Ok(Some(PodSide {
                netlink: Arc::new(RtNetlink::from_handle(handle)),
                sysctls: Arc::new(ProcSysctls { netns, opened }),
                fd,
            }))
        })
    }

    fn delete_link(
        &self,
        netns: &str,
        ifname: &str,
        deadline: Instant,
    ) -> futures::future::BoxFuture<'static, Result<CleanupOutcome, DataplaneError>> {
        Box::pin(namespace_cleanup::clean_up_namespace(
            netns, ifname, deadline,
        ))
    }
}

/// The veth layout behind [`Dataplane`]: one host netlink socket, made on
/// first use and then shared by every host-side operation of the call.
pub struct VethDataplane {
    host: tokio::sync::OnceCell<Arc<dyn Netlink>>,
    namespaces: Arc<dyn Namespaces>,
}

impl VethDataplane {
    pub fn new(namespaces: Arc<dyn Namespaces>) -> VethDataplane {
        VethDataplane {
            host: tokio::sync::OnceCell::new(),
            namespaces,
        }
    }

    /// With a host side of its own (tests: a recording fake).
    pub fn with_host(host: Arc<dyn Netlink>, namespaces: Arc<dyn Namespaces>) -> VethDataplane {
        VethDataplane {
            host: tokio::sync::OnceCell::new_with(Some(host)),
            namespaces,
        }
    }

    fn host(&self) -> Result<Arc<dyn Netlink>, DataplaneError> {
        if let Some(h) = self.host.get() {
            return Ok(Arc::clone(h));
        }
        let host: Arc<dyn Netlink> = Arc::new(RtNetlink::connect()?);
        Ok(Arc::clone(self.host.get().unwrap_or_else(|| {
            let _ = self.host.set(host);
            self.host.get().expect("just set")
        })))
    }

    /// The pod at `netns`, with this call's host socket.
    async fn pod(&self, netns: &Path) -> Result<PodNetwork, DataplaneError> {
        let side = self.namespaces.open(netns).await?.ok_or_else(|| {
            DataplaneError::Netns(format!(
                "failed to Statfs {:?}: no such file or directory",
                netns.display().to_string()
            ))
        })?;
        Ok(PodNetwork {
            host: self.host()?,
            pod: side.netlink,
            sysctls: side.sysctls,
            pod_fd: side.fd,
        })
    }
}

#[async_trait::async_trait]
impl Dataplane for VethDataplane {
    async fn prepare(&self, netns: &Path, net: &Networking) -> Result<PreparedPod, DataplaneError> {
        let pod = self.pod(netns).await?;
        let links = pod.prepare(net).await?;
        Ok(PreparedPod::Local { pod, links })
    }

    async fn prepare_ahead(&self, netns: &Path, net: &Networking) -> Option<PreparedPod> {
        let made = async {
            let pod = self.pod(netns).await?;
            let links = pod.prepare_if_free(net).await?;
            Ok::<_, DataplaneError>(links.map(|links| PreparedPod::Local { pod, links }))
        };
        match made.await {
            Ok(made) => made,
            Err(e) => {
                tracing::debug!("no interface pair made ahead: {e}");
                None
            }
        }
    }

    async fn finish(
        &self,
        pod: &PreparedPod,
        net: &Networking,
    ) -> Result<NetworkingOutcome, DataplaneError> {
        match pod {
            PreparedPod::Local { pod, links } => pod.finish(links, net).await,
            PreparedPod::Remote { .. } => Err(DataplaneError::Netns(
                "a remote dataplane's pod given to the local one".into(),
            )),
        }
    }

    async fn check(
        &self,
        netns: &Path,
        expected: &Networking,
        expected_mac: Option<MacAddr>,
    ) -> Result<(), DataplaneError> {
        let pod = self.namespaces.open(netns).await?.ok_or_else(|| {
            DataplaneError::Check(format!("netns {} does not exist", netns.display()))
        })?;
        let pod = PodNetwork {
            host: self.host()?,
            pod: pod.netlink,
            sysctls: pod.sysctls,
            pod_fd: pod.fd,
        };
        pod.check(expected, expected_mac).await
    }

    async fn clean_up(
        &self,
        netns: &str,
        ifname: &str,
        deadline: Instant,
    ) -> Result<CleanupOutcome, DataplaneError> {
        self.namespaces.delete_link(netns, ifname, deadline).await
    }

    async fn delete_host_link(&self, name: &str) -> Result<bool, DataplaneError> {
        self.host()?.delete_link(name).await
    }
}

impl PodNetwork {
    /// Opens the pod netns and two netlink sockets of its own (one in the
    /// host netns). `Ok(None)` when the netns path does not exist.
    pub async fn open(netns_path: &Path) -> Result<Option<PodNetwork>, DataplaneError> {
        let Some(side) = KernelNamespaces.open(netns_path).await? else {
            return Ok(None);
        };
        Ok(Some(PodNetwork {
            host: Arc::new(RtNetlink::connect()?),
            pod: side.netlink,
            sysctls: side.sysctls,
            pod_fd: side.fd,
        }))
    }

    /// DoNetworking in one go: [`Self::prepare`] then [`Self::finish`].
    pub async fn add(&self, req: &Networking) -> Result<NetworkingOutcome, DataplaneError> {
        let prepared = self.prepare(req).await?;
        self.finish(&prepared, req).await
    }

    /// The part of DoNetworking that needs no addresses (so it can run while
    /// the IPAM plugin works): removes a leftover host veth of the same
    /// name, refuses an existing container interface, creates the pair with
    /// each end directly in its namespace, and reads both ends back.
    pub async fn prepare(&self, req: &Networking) -> Result<Prepared, DataplaneError> {
        // A leftover host veth of the same name (stale, or a repeated ADD)
        // goes first; its container peer goes with it.
        if self.host.delete_link(&req.host_veth).await? {
            tracing::info!(veth = %req.host_veth, "deleted a leftover host veth");
        }
        if self.pod.link(&req.ifname).await?.is_some() {
            return Err(DataplaneError::Exists(format!(
                "container veth name provided ({}) already exists",
                req.ifname
            )));
        }
        self.create_pair(req.device, &self.pair_spec(req))
            .await
            .map_err(|e| match e {
                DataplaneError::Exists(_) => DataplaneError::Exists(format!(
                    "container veth name provided ({}) or host veth {} already exists",
                    req.ifname, req.host_veth
                )),
                other => other,
            })?;
        self.read_back(req).await
    }

    /// [`Self::prepare`] where neither name is taken, removing nothing:
    /// `None` when the host veth or the container interface exists.
    pub async fn prepare_if_free(
        &self,
        req: &Networking,
    ) -> Result<Option<Prepared>, DataplaneError> {
        match self.create_pair(req.device, &self.pair_spec(req)).await {
            Ok(()) => self.read_back(req).await.map(Some),
            Err(DataplaneError::Exists(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn pair_spec(&self, req: &Networking) -> VethSpec {
        VethSpec {
            name: req.host_veth.clone(),
            mac: Some(MacAddr::CALICO_HOST),
            peer_name: req.ifname.clone(),
            peer_mac: req.container_mac,
            peer_netns: self.pod_fd,
            mtu: req.mtu,
            queues: req.queues,
        }
    }

    /// Both ends of the pair just made, read back (the pair is removed
    /// if they cannot be).
    async fn read_back(&self, req: &Networking) -> Result<Prepared, DataplaneError> {
        let read_back = async {
            let (host_link, pod_link) =
                tokio::try_join!(self.host.link(&req.host_veth), self.pod.link(&req.ifname))?;
            let missing =
                |n: &str| DataplaneError::Netns(format!("link {n} vanished after creation"));
            let host_link = host_link.ok_or_else(|| missing(&req.host_veth))?;
            let pod_link = pod_link.ok_or_else(|| missing(&req.ifname))?;
            if host_link.mac != Some(MacAddr::CALICO_HOST) {
                tracing::warn!(veth = %req.host_veth, mac = ?host_link.mac, "host veth did not take MAC ee:ee:ee:ee:ee:ee");
            }
            let container_mac = pod_link.mac.ok_or_else(|| {
                DataplaneError::Netns(format!("{} has no MAC address", req.ifname))
            })?;
            Ok(Prepared {
                host_index: host_link.index,
                pod_index: pod_link.index,
                container_mac,
            })
        };
        self.undo_on_error(req, read_back.await).await
    }

    /// The pair, each end in its namespace: netkit when asked and the
    /// kernel has it (a kernel without netkit answers EOPNOTSUPP, and the
    /// pod gets a veth pair instead, as Calico does; any other error is
    /// the ADD's), else veth.
    async fn create_pair(&self, device: DeviceKind, spec: &VethSpec) -> Result<(), DataplaneError> {
        if device == DeviceKind::Netkit {
            match self.host.create_netkit(spec).await {
                Err(e) if e.is_unsupported() => {
                    tracing::info!(
                        "netkit not supported on this kernel; falling back to veth: {e}"
                    );
                }
                other => {
                    if other.is_ok() {
                        tracing::info!(host = %spec.name, "created pod interface: netkit");
                    }
                    return other;
                }
            }
        }
        self.host.create_veth(spec).await
    }

    /// The rest of DoNetworking, once the addresses are known: sysctls
    /// (before the links go up, so DAD is already off), links up (the host
    /// veth's IPv4 settings with its up, its ARP proxy delay beside it),
    /// container routes and addresses, host routes. On failure the pair is
    /// removed.
    pub async fn finish(
        &self,
        p: &Prepared,
        req: &Networking,
    ) -> Result<NetworkingOutcome, DataplaneError> {
        let result = self.configure(p, req).await;
        self.undo_on_error(req, result).await
    }

    async fn undo_on_error<T>(
        &self,
        req: &Networking,
        result: Result<T, DataplaneError>,
    ) -> Result<T, DataplaneError> {
        if result.is_err()
            && let Err(undo) = self.host.delete_link(&req.host_veth).await
        {
            tracing::error!(veth = %req.host_veth, "failed to remove the veth after a failed ADD: {undo}");
        }
        result
    }

    async fn configure(
        &self,
        p: &Prepared,
        req: &Networking,
    ) -> Result<NetworkingOutcome, DataplaneError> {
        let has_v4 = req.ips.iter().any(|ip| ip.addr().is_ipv4());
        let has_v6 = req.ips.iter().any(|ip| ip.addr().is_ipv6());
        // Sysctl writes are blocking file I/O (the pod's on a thread inside
        // its netns, or through a file opened there ahead): one job of the
        // blocking pool does both sides (an IPv4 pod's are two writes),
        // never the runtime's thread, within the deadline.
        let host_sysctls = sysctl::host_side(&req.host_veth, has_v6);
        let pod_sysctls =
            sysctl::container_side(&req.ifname, has_v4, has_v6, req.allow_ip_forwarding);
        let writer = Arc::clone(&self.sysctls);
        let written = tokio::time::timeout_at(
            req.deadline,
            crate::handoff::spawn_blocking(move || {
                (writer.host(&host_sysctls), writer.pod(&pod_sysctls))
            }),
        )
        .await
        .map_err(|_| DataplaneError::Timeout("timed out writing sysctls".into()))?;
        let (host, pod) = written
            .map_err(|e| DataplaneError::Sysctl(format!("the sysctl writer failed: {e}")))?;
        host.map_err(|e| {
            DataplaneError::Sysctl(format!(
                "error configuring sysctls for interface: {}, error: {e}",
                req.host_veth
            ))
        })?;
        pod.map_err(|e| {
            DataplaneError::Sysctl(format!(
                "error configuring sysctls for the container netns, error: {e}"
            ))
        })?;
        // The proxy delay's failure is only logged, as its sysctl's was.
        let proxy_delay = async {
            if has_v4
                && let Err(e) = self
                    .host
                    .set_proxy_delay(p.host_index, sysctl::HOST_PROXY_DELAY_MS)
                    .await
            {
                tracing::warn!(veth = %req.host_veth, "failed to set the ARP proxy delay: {e}");
            }
            Ok(())
        };
        tokio::try_join!(
            self.host.set_up(p.host_index, sysctl::host_ipv4(has_v4)),
            self.pod.set_up(p.pod_index, Ipv4Conf::default()),
            proxy_delay
        )?;

        // The IPv6 gateway is the host veth's link-local address.
        let gw6 = if has_v6 {
            wait_for(
                ADDRESS_SETTLE,
                req.deadline,
                "the host veth's IPv6 link-local address",
                || async {
                    let addrs = self.host.addresses(p.host_index, true).await?;
                    let usable: Vec<_> = addrs
                        .iter()
                        .filter(|a| !a.tentative)
                        .filter_map(|a| match a.addr.addr() {
                            IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80 => Some(v6),
                            _ => None,
                        })
                        .collect();
                    Ok(usable
                        .iter()
                        .find(|a| **a == GATEWAY_V6)
                        .or(usable.first())
                        .copied())
                },
            )
            .await?
        } else {
            GATEWAY_V6
        };
        for route in container_routes(&req.routes, p.pod_index, gw6) {
            self.pod.add_route(&route).await.map_err(|e| {
                DataplaneError::Netns(format!("failed to add route inside the container: {e}"))
            })?;
        }
        for ip in &req.ips {
            self.pod.add_address(p.pod_index, *ip).await?;
        }
        crate::fault::kill_point("addresses");
        if !req.skip_host_routes {
            for ip in &req.ips {
                add_host_route(
                    self.host.as_ref(),
                    &host_route(*ip, p.host_index),
                    &req.host_veth,
                )
                .await
                .map_err(|e| {
                    DataplaneError::Netns(format!(
                        "error adding host side routes for interface: {}, error: {e}",
                        req.host_veth
                    ))
                })?;
            }
        }
        crate::fault::kill_point("host-routes");
        if has_v6 {
            wait_for(
                ADDRESS_SETTLE,
                req.deadline,
                "container IPv6 addresses to leave the tentative state",
                || async {
                    let addrs = self.pod.addresses(p.pod_index, true).await?;
                    Ok(addrs.iter().all(|a| !a.tentative).then_some(()))
                },
            )
            .await?;
        }
        Ok(NetworkingOutcome {
            container_mac: p.container_mac,
            host_interface: None,
        })
    }

    /// CHECK: the interfaces, addresses and routes ADD made are all there.
    pub async fn check(
        &self,
        req: &Networking,
        expected_mac: Option<MacAddr>,
    ) -> Result<(), DataplaneError> {
        let fail = |m: String| Err(DataplaneError::Check(m));
        let Some(pod_link) = self.pod.link(&req.ifname).await? else {
            return fail(format!("container interface {} does not exist", req.ifname));
        };
        if let Some(mac) = expected_mac
            && pod_link.mac != Some(mac)
        {
            return fail(format!(
                "container interface {} has MAC {}, expected {mac}",
                req.ifname,
                pod_link.mac.map(|m| m.to_string()).unwrap_or_default()
            ));
        }
        let Some(host_link) = self.host.link(&req.host_veth).await? else {
            return fail(format!("host veth {} does not exist", req.host_veth));
        };
        if !host_link.up {
            return fail(format!("host veth {} is down", req.host_veth));
        }
        if host_link.mac != Some(MacAddr::CALICO_HOST) {
            return fail(format!(
                "host veth {} does not have MAC {}",
                req.host_veth,
                MacAddr::CALICO_HOST
            ));
        }
        let mut have = self.pod.addresses(pod_link.index, false).await?;
        have.extend(self.pod.addresses(pod_link.index, true).await?);
        for ip in &req.ips {
            if !have.iter().any(|a| a.addr == *ip) {
                return fail(format!(
                    "container interface {} lacks address {ip}",
                    req.ifname
                ));
            }
        }
        for v6 in [false, true] {
            let expected: Vec<_> = container_routes(&req.routes, pod_link.index, GATEWAY_V6)
                .into_iter()
                .filter(|r| r.dst.addr().is_ipv6() == v6)
                .collect();
            if expected.is_empty() {
                continue;
            }
            let routes = self.pod.routes(v6).await?;
            for r in expected {
                // The IPv6 gateway may be any host link-local address.
                let found = routes.iter().any(|have| {
                    have.dst == r.dst && have.oif == r.oif && (v6 || have.gateway == r.gateway)
                });
                if !found {
                    return fail(format!(
                        "container route {} via {:?} dev {} is missing",
                        r.dst, r.gateway, req.ifname
                    ));
                }
            }
        }
        if !req.skip_host_routes {
            for v6 in [false, true] {
                let wanted: Vec<_> = req
                    .ips
                    .iter()
                    .filter(|ip| ip.addr().is_ipv6() == v6)
                    .collect();
                if wanted.is_empty() {
                    continue;
                }
                let routes = self.host.routes(v6).await?;
                for ip in wanted {
                    let r = host_route(*ip, host_link.index);
                    if !routes.iter().any(|h| h.dst == r.dst && h.oif == r.oif) {
                        return fail(format!(
                            "host route {} dev {} is missing",
                            r.dst, req.host_veth
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

/// A netlink socket inside `netns`, made on a one-shot thread while the
/// runtime's thread goes on. The thread enters the runtime's context only
/// to register the socket with its I/O driver; the connection is then
/// driven on the runtime's own thread. The same thread opens the pod's
/// usual sysctl files ([`sysctl::OPENED_WITH_POD_SOCKET`]).
async fn pod_socket(
    netns: &NetNs,
) -> Result<
    (
        (
            rtnetlink::proto::Connection<rtnetlink::packet_route::RouteNetlinkMessage>,
            rtnetlink::Handle,
        ),
        sysctl::Opened,
    ),
    DataplaneError,
> {
    let runtime = tokio::runtime::Handle::current();
    netns
        .run_detached(move || {
            let _context = runtime.enter();
            let socket = RtNetlink::socket()?;
            Ok((socket, sysctl::Opened::open(sysctl::OPENED_WITH_POD_SOCKET)))
        })
        .await?
}
