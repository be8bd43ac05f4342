//! GC of host-local's reservations. Debian's and upstream's host-local
//! answer GC without collecting anything (containernetworking/plugins#1047
//! is open), so a node that lost its DELs (a reboot, a killed runtime)
//! keeps the addresses reserved until they run out. When the delegated
//! IPAM is host-local, the plugin's GC collects them itself, as host-local
//! would: under host-local's own lock (`flock` of `<dir>/lock`), one file
//! per address in `<dataDir>/<network name>`, named by the address and
//! holding `<container ID>\r\n<ifname>` (or, written by releases before
//! ifnames, the container ID alone). A reservation is released when its
//! attachment is not among the valid ones; anything that is not plainly a
//! reservation (the lock, `last_reserved_ip.*`, a name that is not an
//! address, an empty or unreadable file) is left alone.

use std::collections::HashSet;
use std::fs::File;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};

use crate::cni::request::Attachment;

/// host-local's data directory when its config names none.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";
/// host-local's line break between the container ID and the ifname.
const LINE_BREAK: &str = "\r\n";
/// How often the lock is tried while another process holds it.
const LOCK_POLL: Duration = Duration::from_millis(10);

#[derive(Debug, thiserror::Error)]
pub enum HostLocalGcError {
    #[error("host-local's lock {path} was not free before the deadline")]
    LockTimeout { path: PathBuf },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What a collection did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Collected {
    /// The addresses released.
    pub released: Vec<IpAddr>,
    /// The reservations kept (their attachment is valid).
    pub kept: usize,
}

/// The network's directory of host-local reservations: `dataDir` from the
/// ipam config (default [`DEFAULT_DATA_DIR`]) joined with the network name.
pub fn network_dir(ipam: &serde_json::Value, network: &str) -> PathBuf {
    let data_dir = ipam
        .get("dataDir")
        .and_then(serde_json::Value::as_str)
        .filter(|d| !d.is_empty())
        .unwrap_or(DEFAULT_DATA_DIR);
    Path::new(data_dir).join(network)
}

/// The attachment a reservation file's content names: (container ID,
/// ifname), the ifname `None` in the old one-line format; `None` when the
/// content names no container (a reservation being written, say).
fn owner(content: &str) -> Option<(&str, Option<&str>)> {
    let content = content.trim();
    let (id, ifname) = match content.split_once(LINE_BREAK) {
        Some((id, ifname)) => (id.trim(), Some(ifname.trim())),
        None => (content, None),
    };
    (!id.is_empty()).then_some((id, ifname))
}

/// host-local's exclusive lock on `dir`, waited for until `deadline`.
fn lock(dir: &Path, deadline: Instant) -> Result<Flock<File>, HostLocalGcError> {
    let path = dir.join("lock");
    let io = |what, source| HostLocalGcError::Io {
        what,
        path: path.clone(),
        source,
    };
    // As host-local opens it (creating it if this is the first use).
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(|e| io("opening", e))?;
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(held) => return Ok(held),
            Err((back, nix::errno::Errno::EWOULDBLOCK)) if Instant::now() < deadline => {
                file = back;
                std::thread::sleep(LOCK_POLL);
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                return Err(HostLocalGcError::LockTimeout { path });
            }
            Err((_, errno)) => return Err(io("locking", errno.into())),
        }
    }
}

/// Releases the reservations in `dir` whose attachment is not in `valid`
/// (blocking file I/O: run it off the async runtime's thread). A network
/// host-local never reserved for (no directory) has nothing to collect.
pub fn collect(
    dir: &Path,
    valid: &[Attachment],
    deadline: Instant,
) -> Result<Collected, HostLocalGcError> {
    if !dir.is_dir() {
        return Ok(Collected::default());
    }
    let keep: HashSet<(&str, &str)> = valid
        .iter()
        .map(|a| (a.container_id.trim(), a.ifname.as_str()))
        .collect();
    let keep_ids: HashSet<&str> = valid.iter().map(|a| a.container_id.trim()).collect();
    let _held = lock(dir, deadline)?;
    let entries = std::fs::read_dir(dir).map_err(|source| HostLocalGcError::Io {
        what: "reading",
        path: dir.to_path_buf(),
        source,
    })?;
    let mut collected = Collected::default();
    for entry in entries.flatten() {
        let Some(ip) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<IpAddr>().ok())
        else {
            continue;
        };
        let path = entry.path();
        if !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let Ok(content) = std::fs::read_to_string(&path) else {
            continue;
        };
        let Some((id, ifname)) = owner(&content) else {
            continue;
        };
        let valid = match ifname {
            Some(ifname) => keep.contains(&(id, ifname)),
            None => keep_ids.contains(id),
        };
        if valid {
            collected.kept += 1;
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {
                tracing::info!(%ip, container = id, "GC released a stale host-local reservation");
                collected.released.push(ip);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(HostLocalGcError::Io {
                    what: "removing",
                    path,
                    source,
                });
            }
        }
    }
    collected.released.sort();
    Ok(collected)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attachment(id: &str, ifname: &str) -> Attachment {
        Attachment {
            container_id: id.into(),
            ifname: ifname.into(),
        }
    }

    #[test]
    fn reads_both_formats_of_a_reservation() {
        assert_eq!(owner("abc\r\neth0"), Some(("abc", Some("eth0"))));
        assert_eq!(owner("abc"), Some(("abc", None)));
        assert_eq!(owner(" abc \n"), Some(("abc", None)));
        assert_eq!(owner(""), None);
        assert_eq!(owner(" \r\n "), None);
    }

    #[test]
    fn releases_only_reservations_of_attachments_no_longer_valid() {
        let data = tempfile::tempdir().unwrap();
        let dir = network_dir(
            &serde_json::json!({"type": "host-local", "dataDir": data.path()}),
            "net1",
        );
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, content: &str| std::fs::write(dir.join(name), content).unwrap();
        write("lock", "");
        write("last_reserved_ip.0", "10.0.0.5");
        write("10.0.0.2", "live\r\neth0");
        write("10.0.0.3", "live\r\neth1"); // same container, another ifname
        write("10.0.0.4", "gone\r\neth0");
        write("10.0.0.5", "old-live"); // the old format
        write("10.0.0.6", "old-gone");
        write("10.0.0.7", ""); // being written
        write("fd00::2", "gone6\r\neth0");
        write("notes.txt", "gone\r\neth0");
        let valid = [attachment("live", "eth0"), attachment("old-live", "eth0")];
        let deadline = Instant::now() + Duration::from_secs(5);
        let got = collect(&dir, &valid, deadline).unwrap();
        let ips = |s: &[&str]| {
            s.iter()
                .map(|i| i.parse().unwrap())
                .collect::<Vec<IpAddr>>()
        };
        assert_eq!(
            got.released,
            ips(&["10.0.0.3", "10.0.0.4", "10.0.0.6", "fd00::2"])
        );
        assert_eq!(got.kept, 2);
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "10.0.0.2",
                "10.0.0.5",
                "10.0.0.7",
                "last_reserved_ip.0",
                "lock",
                "notes.txt"
            ]
        );
        // Idempotent; a network with no directory has nothing to collect.
        assert!(collect(&dir, &valid, deadline).unwrap().released.is_empty());
        assert_eq!(
            collect(&data.path().join("other"), &valid, deadline).unwrap(),
            Collected::default()
        );
    }

    #[test]
    fn waits_for_host_locals_lock_until_the_deadline() {
        let data = tempfile::tempdir().unwrap();
        std::fs::write(data.path().join("lock"), "").unwrap();
        std::fs::write(data.path().join("10.0.0.9"), "gone\r\neth0").unwrap();
        let held = Flock::lock(
            File::open(data.path().join("lock")).unwrap(),
            FlockArg::LockExclusive,
        )
        .unwrap();
        let started = Instant::now();
        let e = collect(
            data.path(),
            &[],
            Instant::now() + Duration::from_millis(100),
        )
        .unwrap_err();
        assert!(matches!(e, HostLocalGcError::LockTimeout { .. }), "{e}");
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert!(data.path().join("10.0.0.9").exists());
        drop(held);
        let got = collect(data.path(), &[], Instant::now() + Duration::from_secs(1)).unwrap();
        assert_eq!(got.released, ["10.0.0.9".parse::<IpAddr>().unwrap()]);
    }
}
