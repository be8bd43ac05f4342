//! The netlink operations the dataplane needs, behind a trait (so that the
//! orchestration can run against a recording fake), and their rtnetlink
//! implementation on one socket, which lives in the namespace it was made in.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::RawFd;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use ipnet::IpNet;
use rtnetlink::packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage,
    NetlinkPayload,
};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags, AddressHeaderFlags};
use rtnetlink::packet_route::link::{
    AfSpecInet, AfSpecUnspec, InetDevConf, InfoData, InfoKind, InfoNetkit, InfoVeth, LinkAttribute,
    LinkFlags, LinkInfo, LinkMessage, NetkitMode, NetkitPolicy, NetkitScrub,
};
use rtnetlink::packet_route::neighbour_table::{
    NeighbourTableAttribute, NeighbourTableMessage, NeighbourTableParameter,
};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteVia,
};
use rtnetlink::sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use rtnetlink::{Handle, LinkUnspec, LinkVeth, RouteMessageBuilder};

use crate::dataplane::{DataplaneError, MacAddr};

/// What the dataplane needs to know about a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkState {
    pub index: u32,
    pub name: String,
    pub mac: Option<MacAddr>,
    pub mtu: u32,
    pub up: bool,
}

/// An interface pair (veth or netkit): `name` in the namespace of the
/// socket (netkit's primary end), `peer_name` created directly in the
/// namespace of `peer_netns`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VethSpec {
    pub name: String,
    pub mac: Option<MacAddr>,
    pub peer_name: String,
    pub peer_mac: Option<MacAddr>,
    pub peer_netns: RawFd,
    /// 0 means the kernel default.
    pub mtu: u32,
    pub queues: u32,
}

/// An address as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddrState {
    pub index: u32,
    pub addr: IpNet,
    pub tentative: bool,
}

/// A route to add, or one read back from the main table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    pub dst: IpNet,
    pub gateway: Option<IpAddr>,
    pub oif: Option<u32>,
    /// Link scope (`scope link`) rather than universe.
    pub scope_link: bool,
}

/// IPv4 settings of one interface (the values behind
/// `/proc/sys/net/ipv4/conf/<if>/`), turned on with the link's up in the
/// same request (`IFLA_AF_SPEC`, `AF_INET`'s devconf). A request can only
/// turn settings on: the kernel's devconf request carries the non-zero
/// ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ipv4Conf {
    pub forwarding: bool,
    pub proxy_arp: bool,
    pub route_localnet: bool,
}

impl Ipv4Conf {
    fn devconf(self) -> Option<InetDevConf> {
        if self == Ipv4Conf::default() {
            return None;
        }
        let mut conf = InetDevConf::default();
        conf.forwarding = self.forwarding.into();
        conf.proxy_arp = self.proxy_arp.into();
        conf.route_localnet = self.route_localnet.into();
        Some(conf)
    }
}

#[async_trait::async_trait]
pub trait Netlink: Send + Sync {
    /// The link called `name`, if any.
    async fn link(&self, name: &str) -> Result<Option<LinkState>, DataplaneError>;
    /// Deletes the link called `name`; `false` when there was none.
    async fn delete_link(&self, name: &str) -> Result<bool, DataplaneError>;
    async fn create_veth(&self, spec: &VethSpec) -> Result<(), DataplaneError>;
    /// A netkit pair as Calico makes one ([`netkit_message`]); a kernel
    /// without netkit answers EOPNOTSUPP ([`DataplaneError::is_unsupported`]).
    async fn create_netkit(&self, spec: &VethSpec) -> Result<(), DataplaneError>;
    /// Brings the link up, turning on `ipv4`'s settings in the same request.
    async fn set_up(&self, index: u32, ipv4: Ipv4Conf) -> Result<(), DataplaneError>;
    /// The link's IPv4 ARP proxy delay (`/proc/sys/net/ipv4/neigh/<if>/proxy_delay`),
    /// through RTM_SETNEIGHTBL.
    async fn set_proxy_delay(&self, index: u32, delay_ms: u64) -> Result<(), DataplaneError>;
    /// Adds an address; IPv6 addresses skip duplicate address detection.
    async fn add_address(&self, index: u32, addr: IpNet) -> Result<(), DataplaneError>;
    async fn addresses(&self, index: u32, v6: bool) -> Result<Vec<AddrState>, DataplaneError>;
    /// Adds a route to the main table; EEXIST is [`DataplaneError::Exists`].
    async fn add_route(&self, route: &RouteSpec) -> Result<(), DataplaneError>;
    /// The main table's routes of one family.
    async fn routes(&self, v6: bool) -> Result<Vec<RouteSpec>, DataplaneError>;
}

/// The RTM_NEWLINK request for a netkit pair laid out as Calico lays it
/// out: L2 mode (Ethernet addresses, ARP), the forward policy on both
/// ends, no scrubbing on either (what Calico's netlink library sends), the
/// MTU given explicitly to both ends (a netkit peer does not inherit it);
/// `spec.name` is the primary end, made in the socket's namespace (the
/// host's: where Felix attaches its programs), the peer made directly in
/// `spec.peer_netns`. The primary's MAC and queue counts are top-level
/// attributes; the peer takes its name, MTU, namespace and MAC.
pub fn netkit_message(spec: &VethSpec) -> LinkMessage {
    let mut peer = LinkMessage::default();
    peer.attributes
        .push(LinkAttribute::IfName(spec.peer_name.clone()));
    if spec.mtu > 0 {
        peer.attributes.push(LinkAttribute::Mtu(spec.mtu));
    }
    peer.attributes
        .push(LinkAttribute::NetNsFd(spec.peer_netns));
    if let Some(mac) = spec.peer_mac {
        peer.attributes.push(LinkAttribute::Address(mac.0.to_vec()));
    }
    let mut msg = LinkMessage::default();
    msg.attributes
        .push(LinkAttribute::IfName(spec.name.clone()));
    if spec.mtu > 0 {
        msg.attributes.push(LinkAttribute::Mtu(spec.mtu));
    }
    if let Some(mac) = spec.mac {
        msg.attributes.push(LinkAttribute::Address(mac.0.to_vec()));
    }
    let queues = spec.queues.max(1);
    msg.attributes.push(LinkAttribute::NumTxQueues(queues));
    msg.attributes.push(LinkAttribute::NumRxQueues(queues));
    msg.attributes.push(LinkAttribute::LinkInfo(vec![
        LinkInfo::Kind(InfoKind::Netkit),
        LinkInfo::Data(InfoData::Netkit(vec![
            InfoNetkit::Mode(NetkitMode::L2),
            InfoNetkit::Policy(NetkitPolicy::Forward),
            InfoNetkit::PeerPolicy(NetkitPolicy::Forward),
            InfoNetkit::Scrub(NetkitScrub::None),
            InfoNetkit::PeerScrub(NetkitScrub::None),
            InfoNetkit::Peer(peer),
        ])),
    ]));
    msg
}

/// [`Netlink`] over an rtnetlink socket.
#[derive(Clone)]
pub struct RtNetlink {
    handle: Handle,
    /// A synchronous socket of the same namespace for the one request
    /// the kernel works long inside (an interface pair's creation:
    /// 0.3-0.5 ms of its CPU within the send), sent from the blocking
    /// pool so that the runtime's thread goes on meanwhile (the IPAM's
    /// datastore answers wait for it otherwise). Held for the whole
    /// request, even one whose caller gave up, so that a deletion of the
    /// same link ([`Netlink::delete_link`]) comes after it. `None`: every
    /// request goes through `handle`.
    blocking: Option<Arc<tokio::sync::Mutex<Socket>>>,
}

/// The kernel's `errno` answering `op`: EEXIST is [`DataplaneError::Exists`].
fn errno_error(op: &str, errno: i32) -> DataplaneError {
    if errno == libc::EEXIST {
        DataplaneError::Exists(format!("{op}: file exists"))
    } else {
        DataplaneError::Netlink {
            op: op.to_string(),
            errno,
            msg: std::io::Error::from_raw_os_error(errno).to_string(),
        }
    }
}

fn nl_err(op: &str, e: rtnetlink::Error) -> DataplaneError {
    match e {
        rtnetlink::Error::NetlinkError(msg) => errno_error(op, -msg.raw_code()),
        other => DataplaneError::Netlink {
            op: op.to_string(),
            errno: 0,
            msg: other.to_string(),
        },
    }
}

/// The kernel's answer that a link or address is not there.
pub fn is_not_found(e: &DataplaneError) -> bool {
    matches!(e, DataplaneError::Netlink { errno, .. } if *errno == libc::ENODEV || *errno == libc::ENOENT)
}

fn link_state(msg: &LinkMessage) -> LinkState {
    let mut state = LinkState {
        index: msg.header.index,
        name: String::new(),
        mac: None,
        mtu: 0,
        up: msg.header.flags.contains(LinkFlags::Up),
    };
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(n) => state.name = n.clone(),
            LinkAttribute::Address(a) => state.mac = MacAddr::from_slice(a),
            LinkAttribute::Mtu(m) => state.mtu = *m,
            _ => {}
        }
    }
    state
}

fn route_addr(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

fn route_spec(msg: &RouteMessage) -> Option<RouteSpec> {
    let v6 = u8::from(msg.header.address_family) == libc::AF_INET6 as u8;
    let mut dst: IpAddr = if v6 {
        Ipv6Addr::UNSPECIFIED.into()
    } else {
        Ipv4Addr::UNSPECIFIED.into()
    };
    let mut spec = RouteSpec {
        dst: IpNet::new(dst, 0).ok()?,
        gateway: None,
        oif: None,
        scope_link: msg.header.scope == RouteScope::Link,
    };
    let mut table = u32::from(msg.header.table);
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Destination(a) => dst = route_addr(a)?,
            RouteAttribute::Gateway(a) => spec.gateway = route_addr(a),
            RouteAttribute::Via(RouteVia::Inet(a)) => spec.gateway = Some(IpAddr::V4(*a)),
            RouteAttribute::Via(RouteVia::Inet6(a)) => spec.gateway = Some(IpAddr::V6(*a)),
            RouteAttribute::Oif(i) => spec.oif = Some(*i),
            RouteAttribute::Table(t) => table = *t,
            _ => {}
        }
    }
    if table != u32::from(RouteHeader::RT_TABLE_MAIN) {
        return None;
    }
    spec.dst = IpNet::new(dst, msg.header.destination_prefix_length).ok()?;
    Some(spec)
}

impl RtNetlink {
    /// A socket in the calling thread's network namespace. The connection
    /// task is spawned on the current runtime.
    pub fn connect() -> Result<RtNetlink, DataplaneError> {
        let (conn, handle) = Self::socket()?;
        let blocking = sync_socket("open netlink socket")?;
        tokio::spawn(conn);
        Ok(RtNetlink {
            handle,
            blocking: Some(Arc::new(tokio::sync::Mutex::new(blocking))),
        })
    }

    /// A socket made in the calling thread's namespace, to be driven later
    /// (used from a thread inside a pod netns: the socket stays bound to it).
    #[allow(clippy::type_complexity)]
    pub fn socket() -> Result<
        (
            rtnetlink::proto::Connection<rtnetlink::packet_route::RouteNetlinkMessage>,
            Handle,
        ),
        DataplaneError,
    > {
        let (conn, handle, _) =
            rtnetlink::new_connection().map_err(io_error("open netlink socket"))?;
        Ok((conn, handle))
    }

    pub fn from_handle(handle: Handle) -> RtNetlink {
        RtNetlink {
            handle,
            blocking: None,
        }
    }

    /// Creates a link (RTM_NEWLINK, create-exclusive) from the blocking
    /// pool when there is a synchronous socket, else through the handle.
    async fn create_link(&self, message: LinkMessage, op: String) -> Result<(), DataplaneError> {
        let Some(socket) = &self.blocking else {
            return self
                .handle
                .link()
                .add(message)
                .execute()
                .await
                .map_err(|e| nl_err(&op, e));
        };
        let socket = Arc::clone(socket).lock_owned().await;
        let failed = op.clone();
        crate::handoff::spawn_blocking(move || {
            request_acked(
                &socket,
                RouteNetlinkMessage::NewLink(message),
                NLM_F_CREATE | NLM_F_EXCL,
                &op,
            )
        })
        .await
        .map_err(|_| DataplaneError::Netlink {
            op: failed,
            errno: 0,
            msg: "the request's thread failed".into(),
        })?
    }

    /// Waits until no request on the synchronous socket is in flight.
    async fn settled(&self) {
        if let Some(socket) = &self.blocking {
            drop(socket.lock().await);
        }
    }
}

/// A synchronous netlink socket in the calling thread's namespace; it
/// stays in that namespace whichever thread then uses it.
pub fn sync_socket(op: &str) -> Result<Socket, DataplaneError> {
    let io = io_error(op);
    let mut socket = Socket::new(NETLINK_ROUTE).map_err(&io)?;
    socket.bind_auto().map_err(&io)?;
    socket.connect(&SocketAddr::new(0, 0)).map_err(&io)?;
    Ok(socket)
}

/// Sends `message` (with `flags` besides request and acknowledgement) on
/// the synchronous `socket` and reads the kernel's answer: `Ok`, or its
/// errno as [`nl_err`] maps one. The kernel does the work within the send.
pub fn request_acked(
    socket: &Socket,
    message: RouteNetlinkMessage,
    flags: u16,
    op: &str,
) -> Result<(), DataplaneError> {
    let io = io_error(op);
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    header.sequence_number = 1;
    let mut request = NetlinkMessage::new(header, NetlinkPayload::from(message));
    request.finalize();
    let mut bytes = vec![0u8; request.buffer_len()];
    request.serialize(&mut bytes);
    socket.send(&bytes, 0).map_err(&io)?;
    let mut answer = vec![0u8; 8192];
    let n = socket.recv(&mut &mut answer[..], 0).map_err(&io)?;
    let unexpected = |msg: String| DataplaneError::Netlink {
        op: op.to_string(),
        errno: 0,
        msg,
    };
    let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&answer[..n])
        .map_err(|e| unexpected(format!("unreadable answer: {e}")))?;
    match reply.payload {
        NetlinkPayload::Error(e) => match e.code.map(|c| -c.get()) {
            None => Ok(()),
            Some(errno) => Err(errno_error(op, errno)),
        },
        other => Err(unexpected(format!("unexpected answer: {other:?}"))),
    }
}

#[async_trait::async_trait]
impl Netlink for RtNetlink {
    async fn link(&self, name: &str) -> Result<Option<LinkState>, DataplaneError> {
        let mut stream = self
            .handle
            .link()
            .get()
            .match_name(name.to_string())
            .execute();
        match stream.try_next().await {
            Ok(Some(msg)) => Ok(Some(link_state(&msg))),
            Ok(None) => Ok(None),
            Err(e) => {
                let e = nl_err(&format!("get link {name}"), e);
                if is_not_found(&e) { Ok(None) } else { Err(e) }
            }
        }
    }

    async fn delete_link(&self, name: &str) -> Result<bool, DataplaneError> {
        // A creation still in flight (its caller gone: a deadline) first.
        self.settled().await;
        let msg = LinkUnspec::new_with_name(name).build();
        match self.handle.link().del_with_message(msg).execute().await {
            Ok(()) => Ok(true),
            Err(e) => {
                let e = nl_err(&format!("delete link {name}"), e);
                if is_not_found(&e) { Ok(false) } else { Err(e) }
            }
        }
    }

    async fn create_veth(&self, spec: &VethSpec) -> Result<(), DataplaneError> {
        let mut peer = LinkUnspec::new_with_name(&spec.peer_name).setns_by_fd(spec.peer_netns);
        let mut main = LinkVeth::new(&spec.name, &spec.peer_name);
        if spec.mtu > 0 {
            peer = peer.mtu(spec.mtu);
            main = main.mtu(spec.mtu);
        }
        if let Some(mac) = spec.peer_mac {
            peer = peer.address(mac.0.to_vec());
        }
        if let Some(mac) = spec.mac {
            main = main.address(mac.0.to_vec());
        }
        let queues = spec.queues.max(1);
        let peer = peer
            .append_extra_attribute(LinkAttribute::NumTxQueues(queues))
            .append_extra_attribute(LinkAttribute::NumRxQueues(queues))
            .build();
        let main = main
            .append_extra_attribute(LinkAttribute::NumTxQueues(queues))
            .append_extra_attribute(LinkAttribute::NumRxQueues(queues))
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
            .build();
        self.create_link(
            main,
            format!("create veth {} (peer {})", spec.name, spec.peer_name),
        )
        .await
    }

    async fn create_netkit(&self, spec: &VethSpec) -> Result<(), DataplaneError> {
        self.create_link(
            netkit_message(spec),
            format!("create netkit {} (peer {})", spec.name, spec.peer_name),
        )
        .await
    }

    async fn set_up(&self, index: u32, ipv4: Ipv4Conf) -> Result<(), DataplaneError> {
        let mut msg = LinkUnspec::new_with_index(index).up().build();
        if let Some(conf) = ipv4.devconf() {
            msg.attributes
                .push(LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet(vec![
                    AfSpecInet::DevConfRequest(conf),
                ])]));
        }
        self.handle
            .link()
            .set(msg)
            .execute()
            .await
            .map_err(|e| nl_err(&format!("set link {index} up"), e))
    }

    async fn set_proxy_delay(&self, index: u32, delay_ms: u64) -> Result<(), DataplaneError> {
        let op = format!("set the ARP proxy delay of link {index}");
        let mut table = NeighbourTableMessage::default();
        table.header.family = AddressFamily::Inet;
        table.attributes = vec![
            NeighbourTableAttribute::Name("arp_cache".into()),
            NeighbourTableAttribute::Parms(vec![
                NeighbourTableParameter::Ifindex(index),
                NeighbourTableParameter::ProxyDelay(delay_ms),
            ]),
        ];
        let mut request = NetlinkMessage::from(RouteNetlinkMessage::SetNeighbourTable(table));
        request.header.flags = NLM_F_REQUEST | NLM_F_ACK;
        let mut answers = self
            .handle
            .clone()
            .request(request)
            .map_err(|e| nl_err(&op, e))?;
        while let Some(answer) = answers.next().await {
            if let NetlinkPayload::Error(e) = answer.payload
                && let Some(code) = e.code
            {
                return Err(errno_error(&op, -code.get()));
            }
        }
        Ok(())
    }

    async fn add_address(&self, index: u32, addr: IpNet) -> Result<(), DataplaneError> {
        let mut req = self
            .handle
            .address()
            .add(index, addr.addr(), addr.prefix_len());
        if addr.addr().is_ipv6() {
            let msg = req.message_mut();
            msg.header.flags |= AddressHeaderFlags::Nodad;
            msg.attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        req.execute()
            .await
            .map_err(|e| nl_err(&format!("add address {addr} to link {index}"), e))
    }

    async fn addresses(&self, index: u32, v6: bool) -> Result<Vec<AddrState>, DataplaneError> {
        let msgs: Vec<_> = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute()
            .try_collect()
            .await
            .map_err(|e| nl_err(&format!("list addresses of link {index}"), e))?;
        Ok(msgs
            .iter()
            .filter(|m| m.header.index == index)
            .filter_map(|m| {
                let mut tentative = m.header.flags.contains(AddressHeaderFlags::Tentative);
                let mut addr = None;
                for attr in &m.attributes {
                    match attr {
                        AddressAttribute::Address(a) => addr = Some(*a),
                        AddressAttribute::Flags(f) => {
                            tentative |= f.contains(AddressFlags::Tentative)
                        }
                        _ => {}
                    }
                }
                let addr = addr.filter(|a| a.is_ipv6() == v6)?;
                Some(AddrState {
                    index,
                    addr: IpNet::new(addr, m.header.prefix_len).ok()?,
                    tentative,
                })
            })
            .collect())
    }

    async fn add_route(&self, route: &RouteSpec) -> Result<(), DataplaneError> {
        let mut msg = match (route.dst, route.gateway) {
            (IpNet::V4(dst), gw) => {
                let mut b = RouteMessageBuilder::<Ipv4Addr>::new()
                    .destination_prefix(dst.network(), dst.prefix_len());
                if let Some(IpAddr::V4(gw)) = gw {
                    b = b.gateway(gw);
                }
                b.build()
            }
            (IpNet::V6(dst), gw) => {
                let mut b = RouteMessageBuilder::<Ipv6Addr>::new()
                    .destination_prefix(dst.network(), dst.prefix_len());
                if let Some(IpAddr::V6(gw)) = gw {
                    b = b.gateway(gw);
                }
                b.build()
            }
        };
        msg.header.protocol = RouteProtocol::Boot;
        if route.scope_link {
            msg.header.scope = RouteScope::Link;
        }
        if let Some(oif) = route.oif {
            msg.attributes.push(RouteAttribute::Oif(oif));
        }
        self.handle
            .route()
            .add(msg)
            .execute()
            .await
            .map_err(|e| nl_err(&format!("add route {}", route.dst), e))
    }

    async fn routes(&self, v6: bool) -> Result<Vec<RouteSpec>, DataplaneError> {
        let query = if v6 {
            RouteMessageBuilder::<Ipv6Addr>::new().build()
        } else {
            RouteMessageBuilder::<Ipv4Addr>::new().build()
        };
        let msgs: Vec<_> = self
            .handle
            .route()
            .get(query)
            .execute()
            .try_collect()
            .await
            .map_err(|e| nl_err("list routes", e))?;
        Ok(msgs.iter().filter_map(route_spec).collect())
    }
}

/// An I/O error of the netlink socket, as the [`DataplaneError`] of `op`.
pub fn io_error(op: &str) -> impl Fn(std::io::Error) -> DataplaneError + use<> {
    let op = op.to_string();
    move |e| DataplaneError::Netlink {
        op: op.clone(),
        errno: e.raw_os_error().unwrap_or(0),
        msg: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtnetlink::packet_core::Emitable;

    // The kernel's numbers (include/uapi/linux/if_link.h).
    const IFLA_ADDRESS: u16 = 1;
    const IFLA_IFNAME: u16 = 3;
    const IFLA_MTU: u16 = 4;
    const IFLA_LINKINFO: u16 = 18;
    const IFLA_NET_NS_FD: u16 = 28;
    const IFLA_NUM_TX_QUEUES: u16 = 31;
    const IFLA_NUM_RX_QUEUES: u16 = 32;
    const IFLA_INFO_KIND: u16 = 1;
    const IFLA_INFO_DATA: u16 = 2;
    const IFLA_NETKIT_PEER_INFO: u16 = 1;
    const IFLA_NETKIT_POLICY: u16 = 3;
    const IFLA_NETKIT_PEER_POLICY: u16 = 4;
    const IFLA_NETKIT_MODE: u16 = 5;
    const IFLA_NETKIT_SCRUB: u16 = 6;
    const IFLA_NETKIT_PEER_SCRUB: u16 = 7;
    const NETKIT_L2: u32 = 0;
    const NETKIT_PASS: u32 = 0;
    const NETKIT_SCRUB_NONE: u32 = 0;

    /// One attribute: length, type, value, padded to 4 bytes.
    fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
        let len = 4 + value.len();
        let mut out = Vec::new();
        out.extend_from_slice(&(len as u16).to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(value);
        out.resize(len.next_multiple_of(4), 0);
        out
    }

    fn u32_nla(kind: u16, v: u32) -> Vec<u8> {
        nla(kind, &v.to_ne_bytes())
    }

    /// IFLA_LINKINFO's payload: kind netkit; L2, forward both ways, no
    /// scrubbing, then the peer (`peer`: its ifinfomsg and attributes).
    fn link_info(peer: &[u8]) -> Vec<u8> {
        let data = [
            u32_nla(IFLA_NETKIT_MODE, NETKIT_L2),
            u32_nla(IFLA_NETKIT_POLICY, NETKIT_PASS),
            u32_nla(IFLA_NETKIT_PEER_POLICY, NETKIT_PASS),
            u32_nla(IFLA_NETKIT_SCRUB, NETKIT_SCRUB_NONE),
            u32_nla(IFLA_NETKIT_PEER_SCRUB, NETKIT_SCRUB_NONE),
            nla(IFLA_NETKIT_PEER_INFO, peer),
        ]
        .concat();
        [nla(IFLA_INFO_KIND, b"netkit\0"), nla(IFLA_INFO_DATA, &data)].concat()
    }

    /// struct ifinfomsg, all zero: AF_UNSPEC, no index, no flags.
    const IFINFOMSG: [u8; 16] = [0; 16];

    #[test]
    fn the_netkit_request_is_the_kernels_layout_byte_for_byte() {
        let spec = VethSpec {
            name: "cali12345678901".into(),
            mac: Some(MacAddr::CALICO_HOST),
            peer_name: "eth0".into(),
            peer_mac: Some(MacAddr([0xca, 0xfe, 0, 0, 0, 1])),
            peer_netns: 7,
            mtu: 1450,
            queues: 1,
        };
        let msg = netkit_message(&spec);
        let mut got = vec![0u8; msg.buffer_len()];
        msg.emit(&mut got);

        let peer: Vec<u8> = [
            IFINFOMSG.to_vec(),
            nla(IFLA_IFNAME, b"eth0\0"),
            u32_nla(IFLA_MTU, 1450),
            u32_nla(IFLA_NET_NS_FD, 7),
            nla(IFLA_ADDRESS, &[0xca, 0xfe, 0, 0, 0, 1]),
        ]
        .concat();
        let info = link_info(&peer);
        let expected: Vec<u8> = [
            IFINFOMSG.to_vec(),
            nla(IFLA_IFNAME, b"cali12345678901\0"),
            u32_nla(IFLA_MTU, 1450),
            nla(IFLA_ADDRESS, &[0xee; 6]),
            u32_nla(IFLA_NUM_TX_QUEUES, 1),
            u32_nla(IFLA_NUM_RX_QUEUES, 1),
            nla(IFLA_LINKINFO, &info),
        ]
        .concat();
        assert_eq!(got, expected);

        // No MTU (the kernel's default) and no requested MACs: no such
        // attributes, on either end.
        let bare = VethSpec {
            mtu: 0,
            mac: None,
            peer_mac: None,
            ..spec
        };
        let msg = netkit_message(&bare);
        let mut got = vec![0u8; msg.buffer_len()];
        msg.emit(&mut got);
        let peer = [
            IFINFOMSG.to_vec(),
            nla(IFLA_IFNAME, b"eth0\0"),
            u32_nla(IFLA_NET_NS_FD, 7),
        ]
        .concat();
        let info = link_info(&peer);
        let expected = [
            IFINFOMSG.to_vec(),
            nla(IFLA_IFNAME, b"cali12345678901\0"),
            u32_nla(IFLA_NUM_TX_QUEUES, 1),
            u32_nla(IFLA_NUM_RX_QUEUES, 1),
            nla(IFLA_LINKINFO, &info),
        ]
        .concat();
        assert_eq!(got, expected);
    }
}
