//! Quickstart: two pods wired by the real `calico` binary through the CNI
//! exec contract, with `conf/10-calico-local.conflist` (embedded datastore,
//! `calico-ipam`, which is the same binary). Run as root:
//!
//!     cargo build --release && cargo run --release --example quickstart
//!
//! It creates an IP pool with `calico ipam pool add`, two network
//! namespaces, ADDs a pod in each, prints their addresses, routes, stored
//! WorkloadEndpoints and IPAM blocks, sends a TCP probe pod to pod and host
//! to pod, DELs both and shows that nothing is left. State (the datastore,
//! the IPAM lock, the log, the namespaces' mount points) lives in a
//! temporary directory, so the host's /var/lib and /var/run are not
//! touched.
//!
//! It runs nothing but the plugin: the namespaces are made with unshare(2)
//! and a bind mount (as `ip netns add` does), addresses, routes and links
//! are read with rtnetlink, and reachability is a TCP echo between the
//! pods' own addresses, so a machine with only Rust and a kernel will do
//! (no iproute2, no ping). `QUICKSTART_POOL` picks another pool.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use calico_cni::dataplane::netns::NetNs;
use calico_cni::datastore::ipam_model::IpamBlock;
use calico_cni::datastore::local::LocalStore;
use calico_cni::datastore::model::WorkloadEndpoint;
use calico_cni::datastore::{ListFilter, Store};
use futures::TryStreamExt;
use rtnetlink::packet_route::address::AddressAttribute;
use rtnetlink::packet_route::link::LinkAttribute;
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteProtocol};
use serde_json::Value;

/// The pool the pods' addresses come from (QUICKSTART_POOL: another).
const POOL: &str = "10.250.0.0/24";

type Failure = Box<dyn std::error::Error + Send + Sync>;

fn calico_binary() -> PathBuf {
    if let Ok(p) = std::env::var("CALICO_BIN") {
        return PathBuf::from(p);
    }
    // target/<profile>/examples/quickstart -> target/<profile>/calico
    let exe = std::env::current_exe().expect("current exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("calico")
}

/// Runs the `calico` binary (its operator subcommands).
fn calico(binary: &Path, args: &[&str]) -> Result<String, Failure> {
    let out = Command::new(binary).args(args).output()?;
    if !out.status.success() {
        return Err(format!("calico {args:?}: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A network namespace of our own, pinned at a file (as `ip netns add`
/// pins one under /run/netns): a thread unshares its network namespace and
/// bind-mounts it there. Unmounted and removed when dropped.
struct PodNetns {
    path: PathBuf,
}

impl PodNetns {
    fn create(path: PathBuf) -> Result<PodNetns, Failure> {
        std::fs::File::create(&path)?;
        let pinned = PodNetns { path };
        let target = std::ffi::CString::new(pinned.path.as_os_str().as_encoded_bytes())?;
        std::thread::scope(|s| {
            s.spawn(|| -> Result<(), Failure> {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)?;
                let source = c"/proc/thread-self/ns/net";
                // SAFETY: both paths are NUL-terminated strings that live
                // across the call; no filesystem type or data is passed.
                let rc = unsafe {
                    libc::mount(
                        source.as_ptr(),
                        target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND,
                        std::ptr::null(),
                    )
                };
                if rc != 0 {
                    return Err(format!(
                        "bind-mounting the new netns: {}",
                        std::io::Error::last_os_error()
                    )
                    .into());
                }
                Ok(())
            })
            .join()
            .map_err(|_| -> Failure { "the netns thread panicked".into() })?
        })?;
        Ok(pinned)
    }

    fn open(&self) -> Result<NetNs, Failure> {
        Ok(NetNs::open(&self.path)?.ok_or("the netns is gone")?)
    }
}

impl Drop for PodNetns {
    fn drop(&mut self) {
        if let Ok(target) = std::ffi::CString::new(self.path.as_os_str().as_encoded_bytes()) {
            // SAFETY: a NUL-terminated path living across the call.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Runs `work` with an rtnetlink handle of the calling thread's namespace.
fn with_netlink<T>(
    work: impl AsyncFnOnce(&rtnetlink::Handle) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let (conn, handle, _) = rtnetlink::new_connection()?;
        tokio::spawn(conn);
        work(&handle).await
    })
}

/// Links by index, and whether each is up.
async fn links(h: &rtnetlink::Handle) -> Result<HashMap<u32, (String, bool)>, Failure> {
    let mut out = HashMap::new();
    let mut dump = h.link().get().execute();
    while let Some(msg) = dump.try_next().await? {
        let name = msg.attributes.iter().find_map(|a| match a {
            LinkAttribute::IfName(n) => Some(n.clone()),
            _ => None,
        });
        let up = msg
            .header
            .flags
            .contains(rtnetlink::packet_route::link::LinkFlags::Up);
        out.insert(msg.header.index, (name.unwrap_or_default(), up));
    }
    Ok(out)
}

/// `ip -br addr` of the calling thread's namespace, from rtnetlink.
async fn addresses(h: &rtnetlink::Handle) -> Result<String, Failure> {
    let names = links(h).await?;
    let mut by_link: Vec<(u32, Vec<String>)> = Vec::new();
    let mut dump = h.address().get().execute();
    while let Some(msg) = dump.try_next().await? {
        let addr = msg.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(ip) => Some(*ip),
            _ => None,
        });
        if let Some(ip) = addr {
            let entry = format!("{ip}/{}", msg.header.prefix_len);
            match by_link.iter_mut().find(|(i, _)| *i == msg.header.index) {
                Some((_, list)) => list.push(entry),
                None => by_link.push((msg.header.index, vec![entry])),
            }
        }
    }
    let mut out = String::new();
    let mut indexes: Vec<&u32> = names.keys().collect();
    indexes.sort();
    for i in indexes {
        let (name, up) = &names[i];
        let addrs = by_link
            .iter()
            .find(|(x, _)| x == i)
            .map(|(_, l)| l.join(" "))
            .unwrap_or_default();
        let state = if *up { "UP" } else { "DOWN" };
        out.push_str(&format!("{name:<16} {state:<6} {addrs}\n"));
    }
    Ok(out)
}

/// The routes of the calling thread's namespace (`only`: of that
/// protocol), one per line as `ip route` shows them.
async fn routes(
    h: &rtnetlink::Handle,
    only: Option<RouteProtocol>,
) -> Result<Vec<String>, Failure> {
    use rtnetlink::RouteMessageBuilder;
    let names = links(h).await?;
    let mut out = Vec::new();
    for request in [
        RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
        RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
    ] {
        let mut dump = h.route().get(request).execute();
        while let Some(msg) = dump.try_next().await? {
            if only.is_some_and(|p| p != msg.header.protocol) || msg.header.table != 254 {
                continue;
            }
            let (mut dst, mut via, mut dev) = (None, None, None);
            for a in &msg.attributes {
                match a {
                    RouteAttribute::Destination(RouteAddress::Inet(ip)) => {
                        dst = Some(IpAddr::from(*ip))
                    }
                    RouteAttribute::Destination(RouteAddress::Inet6(ip)) => {
                        dst = Some(IpAddr::from(*ip))
                    }
                    RouteAttribute::Gateway(RouteAddress::Inet(ip)) => {
                        via = Some(IpAddr::from(*ip))
                    }
                    RouteAttribute::Gateway(RouteAddress::Inet6(ip)) => {
                        via = Some(IpAddr::from(*ip))
                    }
                    RouteAttribute::Oif(i) => dev = names.get(i).map(|(n, _)| n.clone()),
                    _ => {}
                }
            }
            let dst = match dst {
                None => "default".to_string(),
                Some(ip) => format!("{ip}/{}", msg.header.destination_prefix_length),
            };
            let mut line = dst;
            if let Some(v) = via {
                line.push_str(&format!(" via {v}"));
            }
            if let Some(d) = dev {
                line.push_str(&format!(" dev {d}"));
            }
            out.push(line);
        }
    }
    Ok(out)
}

/// Listens on `ip` (port chosen by the kernel) inside `ns` and echoes one
/// line back to each of the next `n` connections; returns the address.
fn echo_server(ns: &NetNs, ip: IpAddr, n: usize) -> Result<SocketAddr, Failure> {
    let listener: TcpListener = ns.run(|| TcpListener::bind((ip, 0)))??;
    let addr = listener.local_addr()?;
    std::thread::spawn(move || {
        for conn in listener.incoming().take(n).flatten() {
            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
            let mut line = String::new();
            let mut reader = BufReader::new(&conn);
            if reader.read_line(&mut line).is_ok() {
                let _ = (&conn).write_all(format!("echo from {ip}: {line}").as_bytes());
            }
        }
    });
    Ok(addr)
}

/// Connects to `to` from inside `from` (the host's namespace when `None`),
/// sends a line and returns the echo.
fn probe(from: Option<&NetNs>, to: SocketAddr, hello: &str) -> Result<String, Failure> {
    let connect = || TcpStream::connect_timeout(&to, Duration::from_secs(3));
    let stream = match from {
        Some(ns) => ns.run(connect)??,
        None => connect()?,
    };
    stream.set_read_timeout(Some(Duration::from_secs(3)))?;
    (&stream).write_all(format!("{hello}\n").as_bytes())?;
    let mut answer = String::new();
    BufReader::new(&stream).read_line(&mut answer)?;
    if answer.is_empty() {
        return Err(format!("no answer from {to}").into());
    }
    Ok(answer)
}

/// Where a runtime finds the plugins: a directory of the state dir with
/// `calico-ipam`, a link to the `calico` binary (as installed next to it).
struct Cni<'a> {
    binary: &'a Path,
    path: String,
}

/// One CNI invocation, as a runtime makes it.
fn cni(
    cni: &Cni,
    command: &str,
    container: &str,
    netns: &str,
    conf: &Value,
) -> Result<String, Failure> {
    let binary = cni.binary;
    let env: HashMap<&str, &str> = HashMap::from([
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", container),
        ("CNI_NETNS", netns),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", &cni.path),
    ]);
    let mut child = Command::new(binary)
        .env_clear()
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(conf.to_string().as_bytes())?;
    let out = child.wait_with_output()?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!("{command} {container} failed: {stdout}").into());
    }
    Ok(stdout)
}

fn main() {
    if let Err(e) = run() {
        eprintln!("quickstart failed: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Failure> {
    if !nix::unistd::geteuid().is_root() {
        return Err("run as root: it creates network namespaces and veths".into());
    }
    let binary = calico_binary();
    if !binary.exists() {
        return Err(format!(
            "{} not found: run `cargo build --release` first",
            binary.display()
        )
        .into());
    }
    let state = tempfile::tempdir()?;
    let list: Value = serde_json::from_str(&std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/conf/10-calico-local.conflist"
    ))?)?;
    let mut plugin = list["plugins"][0].clone();
    let at = |name: &str| Value::from(state.path().join(name).to_string_lossy().into_owned());
    plugin["nodename"] = "quickstart-node".into();
    plugin["log_file_path"] = at("cni.log");
    plugin["local_datastore_path"] = at("store.db");
    plugin["ipam_lock_file"] = at("run/ipam.lock");
    // The list as installed in a conf dir, for `calico ipam pool add`.
    let mut installed = list.clone();
    installed["plugins"] = serde_json::json!([plugin.clone()]);
    let conflist = state.path().join("10-calico-local.conflist");
    std::fs::write(&conflist, serde_json::to_string_pretty(&installed)?)?;
    // What libcni does with a conflist: inject name and cniVersion.
    let mut conf = plugin;
    conf["name"] = list["name"].clone();
    conf["cniVersion"] = list["cniVersion"].clone();
    println!("== config (from conf/10-calico-local.conflist, state in a temp dir)\n{conf:#}\n");

    let conflist = conflist.to_string_lossy().into_owned();
    let pool_cidr = std::env::var("QUICKSTART_POOL").unwrap_or_else(|_| POOL.to_string());
    let pool = [
        "ipam",
        "pool",
        "add",
        "quickstart-ipv4-ippool",
        &pool_cidr,
        "--config",
        &conflist,
    ];
    println!("== calico {}", pool.join(" "));
    print!("{}", calico(&binary, &pool)?);
    let list_pools = ["ipam", "pool", "list", "--config", &conflist];
    print!("{}", calico(&binary, &list_pools)?);
    println!();

    let bin = state.path().join("bin");
    std::fs::create_dir_all(&bin)?;
    std::os::unix::fs::symlink(&binary, bin.join("calico-ipam"))?;
    let plugins = Cni {
        binary: &binary,
        path: bin.to_string_lossy().into_owned(),
    };

    let tag = std::process::id();
    let netns_dir = state.path().join("netns");
    std::fs::create_dir_all(&netns_dir)?;
    let mut pods = Vec::new();
    for p in ["a", "b"] {
        let netns = PodNetns::create(netns_dir.join(format!("qs{tag}-{p}")))?;
        pods.push((netns, format!("{p}{tag:010}qs")));
    }
    // The namespaces go when `pods` is dropped, whatever happened.
    wire_and_check(&plugins, &conf, &pods, state.path())?;
    drop(pods);

    // With every address released, the pool can go.
    let remove = [
        "ipam",
        "pool",
        "remove",
        "quickstart-ipv4-ippool",
        "--config",
        &conflist,
    ];
    println!("== calico {}", remove.join(" "));
    print!("{}", calico(&binary, &remove)?);
    Ok(())
}

fn wire_and_check(
    plugins: &Cni,
    conf: &Value,
    pods: &[(PodNetns, String)],
    state: &Path,
) -> Result<(), Failure> {
    let mut ips: Vec<IpAddr> = Vec::new();
    let mut opened = Vec::new();
    for (netns, cid) in pods {
        let path = netns.path.to_string_lossy().into_owned();
        let result: Value = serde_json::from_str(&cni(plugins, "ADD", cid, &path, conf)?)?;
        let ip = result["ips"][0]["address"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        println!("== ADD {cid} in netns {path}: {ip}");
        println!("{result:#}");
        let ns = netns.open()?;
        let (addrs, table) =
            ns.run(|| with_netlink(async |h| Ok((addresses(h).await?, routes(h, None).await?))))??;
        println!("-- addresses in the pod:\n{addrs}");
        println!("-- routes in the pod:\n{}\n", table.join("\n"));
        ips.push(ip.split('/').next().unwrap_or_default().parse()?);
        opened.push(ns);
    }
    let host_routes = with_netlink(async |h| routes(h, Some(RouteProtocol::Boot)).await)?;
    let to_pods: Vec<&String> = host_routes
        .iter()
        .filter(|r| ips.iter().any(|ip| r.starts_with(&format!("{ip}/"))))
        .collect();
    println!(
        "-- host routes to the pods:\n{}\n",
        to_pods
            .iter()
            .map(|r| r.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );

    let store = LocalStore::open(&state.join("store.db"), std::time::Duration::from_secs(5))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let weps = runtime
        .block_on((&store as &dyn Store).list::<WorkloadEndpoint>("default", &ListFilter::All))?;
    println!("== stored WorkloadEndpoints ({}):", weps.len());
    for w in &weps {
        println!("{}", serde_json::to_string_pretty(w)?);
    }
    let blocks =
        runtime.block_on((&store as &dyn Store).list::<IpamBlock>("", &ListFilter::All))?;
    for b in &blocks {
        println!(
            "== IPAMBlock {} (affinity {}): {} addresses allocated",
            b.spec.cidr,
            b.spec.affinity.as_deref().unwrap_or("none"),
            allocated(b)
        );
    }

    // Reachability: a TCP echo on each pod's own address.
    let at_b = echo_server(&opened[1], ips[1], 1)?;
    let at_a = echo_server(&opened[0], ips[0], 1)?;
    println!("== TCP pod a -> pod b ({at_b})");
    print!("{}", probe(Some(&opened[0]), at_b, "hello from pod a")?);
    println!("== TCP host -> pod a ({at_a})");
    print!("{}", probe(None, at_a, "hello from the host")?);
    drop(opened);

    for (netns, cid) in pods {
        let path = netns.path.to_string_lossy().into_owned();
        cni(plugins, "DEL", cid, &path, conf)?;
        println!("== DEL {cid}: ok");
    }

    // Nothing may be left: veths, routes, reservations, endpoints.
    let (host_links, host_routes) =
        with_netlink(async |h| Ok((links(h).await?, routes(h, Some(RouteProtocol::Boot)).await?)))?;
    let veths: Vec<String> = pods
        .iter()
        .map(|(_, cid)| format!("cali{}", &cid[..11]))
        .filter(|v| host_links.values().any(|(n, _)| n == v))
        .collect();
    let leftover_routes: Vec<&String> = host_routes
        .iter()
        .filter(|r| ips.iter().any(|ip| r.starts_with(&format!("{ip}/"))))
        .collect();
    let reservations: usize = runtime
        .block_on((&store as &dyn Store).list::<IpamBlock>("", &ListFilter::All))?
        .iter()
        .map(allocated)
        .sum();
    let weps = runtime
        .block_on((&store as &dyn Store).list::<WorkloadEndpoint>("default", &ListFilter::All))?;
    println!(
        "== left behind: host veths {veths:?}, host routes {leftover_routes:?}, allocated addresses {reservations}, WorkloadEndpoints {}",
        weps.len()
    );
    if !veths.is_empty() || !leftover_routes.is_empty() || reservations != 0 || !weps.is_empty() {
        return Err("something was left behind".into());
    }
    println!("== namespaces are deleted next; nothing else remains");
    Ok(())
}

/// Addresses allocated in a block.
fn allocated(block: &IpamBlock) -> usize {
    block
        .spec
        .allocations
        .iter()
        .filter(|a| a.is_some())
        .count()
}
