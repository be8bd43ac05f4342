//! A TCP relay between one simulated node and its datastore that can be
//! cut as a partition cuts a link: while it is holed nothing passes either
//! way and no connection is refused or closed (packets dropped, as a
//! black-holed route drops them), so the node's calls hang until their own
//! deadlines. Threads, one pair per connection; all end when the relay is
//! closed.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// One relay: its address, and its switches.
#[derive(Clone)]
pub struct Relay {
    pub addr: SocketAddr,
    target: SocketAddr,
    holed: Arc<AtomicBool>,
    closed: Arc<AtomicBool>,
}

impl Relay {
    /// A relay on a free loopback port to `target`.
    pub fn start(target: SocketAddr) -> std::io::Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let relay = Relay {
            addr: listener.local_addr()?,
            target,
            holed: Arc::default(),
            closed: Arc::default(),
        };
        let r = relay.clone();
        std::thread::spawn(move || {
            while !r.closed.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((down, _)) => {
                        let r = r.clone();
                        std::thread::spawn(move || r.serve(down));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Ok(relay)
    }

    /// Cuts the link (true) or mends it.
    pub fn hole(&self, holed: bool) {
        self.holed.store(holed, Ordering::Relaxed);
    }

    /// Ends every connection and the listener.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
    }

    fn waiting(&self) -> bool {
        self.holed.load(Ordering::Relaxed) && !self.closed.load(Ordering::Relaxed)
    }

    /// One accepted connection: connected upstream once the link passes,
    /// then pumped both ways.
    fn serve(self, down: TcpStream) {
        while self.waiting() {
            std::thread::sleep(Duration::from_millis(20));
        }
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        let Ok(up) = TcpStream::connect(self.target) else {
            return;
        };
        // (Small TLS records pass at once, as on a direct connection.)
        let _ = (down.set_nodelay(true), up.set_nodelay(true));
        let (Ok(down2), Ok(up2)) = (down.try_clone(), up.try_clone()) else {
            return;
        };
        let r = self.clone();
        std::thread::spawn(move || r.pump(down2, up2));
        self.pump(up, down);
    }

    /// Copies `from` to `to` while the link passes; holds the bytes (reads
    /// nothing) while it is holed.
    fn pump(&self, mut from: TcpStream, mut to: TcpStream) {
        let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
        let mut buf = vec![0u8; 64 * 1024];
        while !self.closed.load(Ordering::Relaxed) {
            if self.holed.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => break,
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Both);
        let _ = from.shutdown(std::net::Shutdown::Both);
    }
}

/// `url` (`scheme://host:port[/…]`) with its authority replaced by a new
/// relay's (to the address it named).
pub fn relayed_url(url: &str) -> std::io::Result<String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| std::io::Error::other(format!("no scheme in {url}")))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let target: SocketAddr = authority
        .parse()
        .map_err(|e| std::io::Error::other(format!("{authority}: {e}")))?;
    let relay = Relay::start(target)?;
    RELAYS.lock().unwrap().push(relay.clone());
    Ok(format!("{scheme}://{}{path}", relay.addr))
}

/// Every relay [`relayed_url`] started.
pub static RELAYS: std::sync::Mutex<Vec<Relay>> = std::sync::Mutex::new(Vec::new());
