//! A recording in-memory [`Netlink`], [`SysctlWriter`] and pod
//! [`Namespaces`]: the veth layout's whole sequence without root, for the
//! dataplane's tests and the plugin layer's (built for tests, or with the
//! `test-fakes` feature). Every operation is logged (`host: ...`, `pod:
//! ...`), and to a journal shared with other fakes when one is given; an
//! operation whose log line starts with `fail_on` fails.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};

use ipnet::IpNet;
use tokio::time::Instant;

use crate::dataplane::CleanupOutcome;
use crate::dataplane::netlink::{AddrState, Ipv4Conf, LinkState, Netlink, RouteSpec, VethSpec};
use crate::dataplane::sysctl::Sysctl;
use crate::dataplane::veth::{Namespaces, PodSide, SysctlWriter, VethDataplane};
use crate::dataplane::{DataplaneError, MacAddr};

/// A log several fakes write to, in the order things happen.
pub type Journal = Arc<Mutex<Vec<String>>>;

#[derive(Default)]
pub struct FakeState {
    pub links: Vec<LinkState>,
    pub addrs: Vec<AddrState>,
    pub routes: Vec<RouteSpec>,
    pub log: Vec<String>,
    /// Fail the operation whose log line starts with this text.
    pub fail_on: Option<String>,
    /// Answer a netkit pair with EOPNOTSUPP, as a kernel without netkit.
    pub no_netkit: bool,
    next_index: u32,
}

/// One side (host or pod) of the fake; `peer` receives the veth peer.
pub struct FakeNetlink {
    pub name: &'static str,
    pub state: Mutex<FakeState>,
    pub peer: Option<Arc<FakeNetlink>>,
    journal: Mutex<Option<Journal>>,
}

impl FakeNetlink {
    pub fn new(name: &'static str, peer: Option<Arc<FakeNetlink>>) -> Arc<FakeNetlink> {
        Arc::new(FakeNetlink {
            name,
            state: Mutex::new(FakeState {
                next_index: if name == "host" { 100 } else { 2 },
                ..FakeState::default()
            }),
            peer,
            journal: Mutex::new(None),
        })
    }

    /// Also logs every operation to `journal`.
    pub fn share_log(&self, journal: &Journal) {
        *self.journal.lock().unwrap() = Some(Arc::clone(journal));
    }

    /// A pair's two ends: `name` here, the peer on the peer side; EEXIST
    /// (as the kernel answers) when either name is taken.
    fn insert_pair(&self, spec: &VethSpec) -> Result<(), DataplaneError> {
        let taken = |side: &FakeNetlink, name: &str| {
            side.state
                .lock()
                .unwrap()
                .links
                .iter()
                .any(|l| l.name == name)
        };
        if taken(self, &spec.name)
            || self
                .peer
                .as_ref()
                .is_some_and(|p| taken(p, &spec.peer_name))
        {
            return Err(DataplaneError::Exists("file exists".into()));
        }
        self.insert_link(&spec.name, spec.mac, spec.mtu);
        if let Some(peer) = &self.peer {
            peer.insert_link(&spec.peer_name, spec.peer_mac, spec.mtu);
        }
        Ok(())
    }

    fn record(&self, op: String) -> Result<(), DataplaneError> {
        let line = format!("{}: {op}", self.name);
        if let Some(j) = self.journal.lock().unwrap().as_ref() {
            j.lock().unwrap().push(format!("dataplane {line}"));
        }
        let mut s = self.state.lock().unwrap();
        let fail = s
            .fail_on
            .as_ref()
            .is_some_and(|f| line.starts_with(f.as_str()));
        s.log.push(line.clone());
        if fail {
            return Err(DataplaneError::Netlink {
                op: line,
                errno: libc::EIO,
                msg: "injected".into(),
            });
        }
        Ok(())
    }

    /// A link called `name` (a leftover, or one the test puts there).
    pub fn insert_link(&self, name: &str, mac: Option<MacAddr>, mtu: u32) {
        let mut s = self.state.lock().unwrap();
        s.next_index += 1;
        let index = s.next_index;
        s.links.push(LinkState {
            index,
            name: name.to_string(),
            mac: Some(mac.unwrap_or(MacAddr([0x0a, 0x58, 0, 0, 0, index as u8]))),
            mtu: if mtu == 0 { 1500 } else { mtu },
            up: false,
        });
    }

    pub fn log(&self) -> Vec<String> {
        self.state.lock().unwrap().log.clone()
    }
}

#[async_trait::async_trait]
impl Netlink for FakeNetlink {
    async fn link(&self, name: &str) -> Result<Option<LinkState>, DataplaneError> {
        Ok(self
            .state
            .lock()
            .unwrap()
            .links
            .iter()
            .find(|l| l.name == name)
            .cloned())
    }

    async fn delete_link(&self, name: &str) -> Result<bool, DataplaneError> {
        self.record(format!("delete {name}"))?;
        let mut s = self.state.lock().unwrap();
        let before = s.links.len();
        let idx: Vec<u32> = s
            .links
            .iter()
            .filter(|l| l.name == name)
            .map(|l| l.index)
            .collect();
        s.links.retain(|l| l.name != name);
        s.routes
            .retain(|r| !r.oif.is_some_and(|o| idx.contains(&o)));
        let deleted = s.links.len() != before;
        drop(s);
        if deleted && let Some(peer) = &self.peer {
            peer.state.lock().unwrap().links.clear();
        }
        Ok(deleted)
    }

    async fn create_veth(&self, spec: &VethSpec) -> Result<(), DataplaneError> {
        self.record(format!(
            "create veth {} peer {} mtu {}",
            spec.name, spec.peer_name, spec.mtu
        ))?;
        self.insert_pair(spec)
    }

    async fn create_netkit(&self, spec: &VethSpec) -> Result<(), DataplaneError> {
        self.record(format!(
            "create netkit {} peer {} mtu {}",
            spec.name, spec.peer_name, spec.mtu
        ))?;
        if self.state.lock().unwrap().no_netkit {
            return Err(DataplaneError::Netlink {
                op: format!("create netkit {}", spec.name),
                errno: libc::EOPNOTSUPP,
                msg: std::io::Error::from_raw_os_error(libc::EOPNOTSUPP).to_string(),
            });
        }
        self.insert_pair(spec)
    }

    async fn set_up(&self, index: u32, ipv4: Ipv4Conf) -> Result<(), DataplaneError> {
        if ipv4 == Ipv4Conf::default() {
            self.record(format!("up {index}"))?;
        } else {
            let Ipv4Conf {
                forwarding,
                proxy_arp,
                route_localnet,
            } = ipv4;
            self.record(format!(
                "up {index} forwarding={} proxy_arp={} route_localnet={}",
                u8::from(forwarding),
                u8::from(proxy_arp),
                u8::from(route_localnet)
            ))?;
        }
        let mut s = self.state.lock().unwrap();
        let mut ll = None;
        for l in s.links.iter_mut().filter(|l| l.index == index) {
            l.up = true;
            ll = Some(index);
        }
        if self.name == "host" && ll.is_some() {
            s.addrs.push(AddrState {
                index,
                addr: "fe80::ecee:eeff:feee:eeee/64".parse().unwrap(),
                tentative: false,
            });
        }
        Ok(())
    }

    async fn set_proxy_delay(&self, index: u32, delay_ms: u64) -> Result<(), DataplaneError> {
        self.record(format!("proxy_delay {delay_ms} dev {index}"))
    }

    async fn add_address(&self, index: u32, addr: IpNet) -> Result<(), DataplaneError> {
        self.record(format!("addr {addr} dev {index}"))?;
        self.state.lock().unwrap().addrs.push(AddrState {
            index,
            addr,
            tentative: false,
        });
        Ok(())
    }

    async fn addresses(&self, index: u32, v6: bool) -> Result<Vec<AddrState>, DataplaneError> {
        let s = self.state.lock().unwrap();
        Ok(s.addrs
            .iter()
            .filter(|a| a.index == index && a.addr.addr().is_ipv6() == v6)
            .cloned()
            .collect())
    }

    async fn add_route(&self, route: &RouteSpec) -> Result<(), DataplaneError> {
        self.record(format!(
            "route {}{} dev {}{}",
            route.dst,
            route
                .gateway
                .map(|g| format!(" via {g}"))
                .unwrap_or_default(),
            route.oif.unwrap_or(0),
            if route.scope_link { " scope link" } else { "" }
        ))?;
        let mut s = self.state.lock().unwrap();
        if s.routes.iter().any(|r| r.dst == route.dst) {
            return Err(DataplaneError::Exists("file exists".into()));
        }
        s.routes.push(route.clone());
        Ok(())
    }

    async fn routes(&self, v6: bool) -> Result<Vec<RouteSpec>, DataplaneError> {
        let s = self.state.lock().unwrap();
        Ok(s.routes
            .iter()
            .filter(|r| r.dst.addr().is_ipv6() == v6)
            .cloned()
            .collect())
    }
}

#[derive(Default)]
pub struct FakeSysctls {
    pub written: Mutex<Vec<String>>,
}

impl SysctlWriter for FakeSysctls {
    fn host(&self, sysctls: &[Sysctl]) -> Result<(), DataplaneError> {
        let mut w = self.written.lock().unwrap();
        w.extend(
            sysctls
                .iter()
                .map(|s| format!("host {}={}", s.key, s.value)),
        );
        Ok(())
    }
    fn pod(&self, sysctls: &[Sysctl]) -> Result<(), DataplaneError> {
        let mut w = self.written.lock().unwrap();
        w.extend(sysctls.iter().map(|s| format!("pod {}={}", s.key, s.value)));
        Ok(())
    }
}

/// Pod namespaces of the fake: the paths registered exist, and each is the
/// one pod side `pod` (whose veth peer the host side creates).
pub struct FakeNamespaces {
    pub host: Arc<FakeNetlink>,
    pub pod: Arc<FakeNetlink>,
    pub sysctls: Arc<FakeSysctls>,
    pub paths: Mutex<HashSet<String>>,
}

impl Namespaces for FakeNamespaces {
    fn open(
        &self,
        netns: &Path,
    ) -> futures::future::BoxFuture<'static, Result<Option<PodSide>, DataplaneError>> {
        let exists = self
            .paths
            .lock()
            .unwrap()
            .contains(&netns.display().to_string());
        let side = exists.then(|| PodSide {
            netlink: self.pod.clone(),
            sysctls: self.sysctls.clone(),
            fd: -1,
        });
        Box::pin(std::future::ready(Ok(side)))
    }

    fn delete_link(
        &self,
        netns: &str,
        ifname: &str,
        _deadline: Instant,
    ) -> futures::future::BoxFuture<'static, Result<CleanupOutcome, DataplaneError>> {
        let exists = self.paths.lock().unwrap().contains(netns);
        let (pod, host, ifname) = (self.pod.clone(), self.host.clone(), ifname.to_string());
        Box::pin(async move {
            if !exists {
                return Ok(CleanupOutcome::NetnsGone);
            }
            if !pod.delete_link(&ifname).await? {
                return Ok(CleanupOutcome::LinkGone);
            }
            // The host end (and its routes) go with the pair.
            let mut s = host.state.lock().unwrap();
            s.links.clear();
            s.routes.clear();
            Ok(CleanupOutcome::Deleted)
        })
    }
}

/// A whole fake dataplane: the veth layout over a fake host side and one
/// fake pod, whose namespace exists at each of `netns_paths`.
pub struct FakeDataplane {
    pub dataplane: Arc<VethDataplane>,
    pub namespaces: Arc<FakeNamespaces>,
}

impl FakeDataplane {
    pub fn new(netns_paths: &[&str], journal: Option<&Journal>) -> FakeDataplane {
        let pod = FakeNetlink::new("pod", None);
        let host = FakeNetlink::new("host", Some(pod.clone()));
        if let Some(j) = journal {
            pod.share_log(j);
            host.share_log(j);
        }
        let namespaces = Arc::new(FakeNamespaces {
            host: host.clone(),
            pod,
            sysctls: Arc::new(FakeSysctls::default()),
            paths: Mutex::new(netns_paths.iter().map(|p| p.to_string()).collect()),
        });
        let dataplane = Arc::new(VethDataplane::with_host(host, namespaces.clone()));
        FakeDataplane {
            dataplane,
            namespaces,
        }
    }

    pub fn host(&self) -> &Arc<FakeNetlink> {
        &self.namespaces.host
    }

    pub fn pod(&self) -> &Arc<FakeNetlink> {
        &self.namespaces.pod
    }

    /// The netns at `path` is gone (its pod side stays as it was).
    pub fn remove_netns(&self, path: &str) {
        self.namespaces.paths.lock().unwrap().remove(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::{Networking, veth::PodNetwork};
    use tokio::time::Instant;

    fn request(ips: &[&str], routes: &[&str]) -> Networking {
        Networking {
            ifname: "eth0".into(),
            host_veth: "cali12345678901".into(),
            ips: ips.iter().map(|s| s.parse().unwrap()).collect(),
            routes: routes.iter().map(|s| s.parse().unwrap()).collect(),
            mtu: 1450,
            queues: 1,
            device: crate::dataplane::DeviceKind::Veth,
            container_mac: None,
            allow_ip_forwarding: false,
            skip_host_routes: false,
            deadline: Instant::now() + std::time::Duration::from_secs(5),
            ipam_addresses: Vec::new(),
            workload: Default::default(),
        }
    }

    fn sides() -> (Arc<FakeNetlink>, Arc<FakeNetlink>) {
        let pod = FakeNetlink::new("pod", None);
        let host = FakeNetlink::new("host", Some(pod.clone()));
        (host, pod)
    }

    fn pod_network(
        host: &Arc<FakeNetlink>,
        pod: &Arc<FakeNetlink>,
        sysctls: &Arc<FakeSysctls>,
    ) -> PodNetwork {
        PodNetwork {
            host: host.clone(),
            pod: pod.clone(),
            sysctls: sysctls.clone(),
            pod_fd: -1,
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn dual_stack_sequence() {
        let (host, pod) = sides();
        let sysctls = Arc::new(FakeSysctls::default());
        let pn = pod_network(&host, &pod, &sysctls);
        let out = pn
            .add(&request(
                &["10.0.0.5/32", "fd00::5/128"],
                &["0.0.0.0/0", "::/0"],
            ))
            .await
            .unwrap();
        assert_eq!(out.container_mac.0[0], 0x0a);
        let pod_log = pod.log();
        assert_eq!(
            pod_log,
            vec![
                "pod: up 3",
                "pod: route 169.254.1.1/32 dev 3 scope link",
                "pod: route 0.0.0.0/0 via 169.254.1.1 dev 3",
                "pod: route ::/0 via fe80::ecee:eeff:feee:eeee dev 3",
                "pod: addr 10.0.0.5/32 dev 3",
                "pod: addr fd00::5/128 dev 3",
            ]
        );
        let host_log = host.log();
        assert_eq!(host_log[0], "host: delete cali12345678901");
        assert!(host_log.contains(&"host: route 10.0.0.5/32 dev 101 scope link".to_string()));
        assert!(host_log.contains(&"host: route fd00::5/128 dev 101 scope link".to_string()));
        // The host veth's IPv4 settings go with its up, through netlink.
        for want in [
            "host: up 101 forwarding=1 proxy_arp=1 route_localnet=1",
            "host: proxy_delay 0 dev 101",
        ] {
            assert!(
                host_log.iter().any(|l| l == want),
                "missing {want}: {host_log:?}"
            );
        }
        let w = sysctls.written.lock().unwrap().clone();
        assert!(
            !w.iter().any(|s| s.starts_with("host net/ipv4/")),
            "IPv4 host settings written in /proc/sys: {w:?}"
        );
        for want in [
            "host net/ipv6/conf/cali12345678901/accept_dad=0",
            "pod net/ipv6/conf/eth0/accept_dad=0",
            "pod net/ipv4/ip_forward=0",
        ] {
            assert!(w.iter().any(|s| s == want), "missing {want}: {w:?}");
        }
        // CHECK passes on what ADD built, and fails once a route is gone.
        let req = request(&["10.0.0.5/32", "fd00::5/128"], &["0.0.0.0/0", "::/0"]);
        pn.check(&req, Some(out.container_mac)).await.unwrap();
        host.state.lock().unwrap().routes.clear();
        let e = pn.check(&req, Some(out.container_mac)).await.unwrap_err();
        assert!(e.to_string().contains("host route 10.0.0.5/32"), "{e}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn failure_removes_the_pair() {
        let (host, pod) = sides();
        pod.state.lock().unwrap().fail_on = Some("pod: addr".into());
        let sysctls = Arc::new(FakeSysctls::default());
        let pn = pod_network(&host, &pod, &sysctls);
        assert!(
            pn.add(&request(&["10.0.0.5/32"], &["0.0.0.0/0"]))
                .await
                .is_err()
        );
        assert!(host.state.lock().unwrap().links.is_empty());
        assert!(pod.state.lock().unwrap().links.is_empty());
        assert_eq!(host.log().last().unwrap(), "host: delete cali12345678901");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn host_route_owned_by_another_interface() {
        let (host, pod) = sides();
        host.state.lock().unwrap().routes.push(RouteSpec {
            dst: "10.0.0.5/32".parse().unwrap(),
            gateway: None,
            oif: Some(7),
            scope_link: true,
        });
        let sysctls = Arc::new(FakeSysctls::default());
        let pn = pod_network(&host, &pod, &sysctls);
        let e = pn
            .add(&request(&["10.0.0.5/32"], &["0.0.0.0/0"]))
            .await
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("already exists for an interface other than 'cali12345678901'"),
            "{e}"
        );
    }

    /// device_type netkit: a netkit pair where the kernel has netkit; a
    /// veth pair where it answers EOPNOTSUPP; any other error is the ADD's.
    #[tokio::test(flavor = "current_thread")]
    async fn netkit_or_the_veth_fallback() {
        let netkit = Networking {
            device: crate::dataplane::DeviceKind::Netkit,
            ..request(&["10.0.0.5/32"], &["0.0.0.0/0"])
        };
        let sysctls = Arc::new(FakeSysctls::default());

        let (host, pod) = sides();
        pod_network(&host, &pod, &sysctls)
            .add(&netkit)
            .await
            .unwrap();
        let log = host.log();
        assert_eq!(
            log[1],
            "host: create netkit cali12345678901 peer eth0 mtu 1450"
        );
        assert!(!log.iter().any(|l| l.contains("create veth")), "{log:?}");

        let (host, pod) = sides();
        host.state.lock().unwrap().no_netkit = true;
        pod_network(&host, &pod, &sysctls)
            .add(&netkit)
            .await
            .unwrap();
        let log = host.log();
        assert_eq!(
            &log[1..3],
            [
                "host: create netkit cali12345678901 peer eth0 mtu 1450",
                "host: create veth cali12345678901 peer eth0 mtu 1450"
            ]
        );
        assert_eq!(pod.state.lock().unwrap().links.len(), 1);

        let (host, pod) = sides();
        host.state.lock().unwrap().fail_on = Some("host: create netkit".into());
        let e = pod_network(&host, &pod, &sysctls)
            .add(&netkit)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("injected"), "{e}");
        assert!(!host.log().iter().any(|l| l.contains("create veth")));
        assert!(host.state.lock().unwrap().links.is_empty());
    }
}
