//! The policy-setup wait (calico-behaviour.md §4.7): with
//! `policy_setup_timeout_seconds` > 0, a Kubernetes ADD waits, once the
//! endpoint is written, until Felix has written the endpoint's status file
//! in `endpoint_status_dir` — its policy is in place — or the setting's
//! time (bounded by the call's deadline) has passed; either way the ADD
//! then succeeds, with a warning on timeout, as Calico's does. Only the
//! file's existence counts (Calico never reads it). The directory is
//! watched with inotify (a creation or a rename into it wakes the wait at
//! once); when it cannot be watched (it does not exist yet, or inotify is
//! refused) it is polled every 500 ms, as Calico does.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use tokio::time::Instant;

use crate::cni::config::NetConf;
use crate::cni::{Error, Result};

/// Where Felix writes endpoint status files when the config names none.
pub const DEFAULT_STATUS_DIR: &str = "/var/run/calico/endpoint-status";

/// How often a directory that cannot be watched is looked at.
const POLL: Duration = Duration::from_millis(500);

/// Go's `url.PathEscape`: everything but letters, digits, `-_.~` and the
/// reserved characters a path segment may hold (`$&+:=@`) is escaped.
const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~')
    .remove(b'$')
    .remove(b'&')
    .remove(b'+')
    .remove(b':')
    .remove(b'=')
    .remove(b'@');

/// The wait an ADD owes once its endpoint is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyWait {
    pub dir: PathBuf,
    pub timeout: Duration,
}

impl PolicyWait {
    /// The wait `conf` asks for: none when the setting is 0; a negative
    /// setting is refused (Calico's message), before anything is done.
    pub fn from_conf(conf: &NetConf) -> Result<Option<PolicyWait>> {
        let seconds = conf.policy_setup_timeout_seconds;
        if seconds < 0 {
            return Err(Error::invalid_config(format!(
                "invalid pod startup delay of {seconds}"
            )));
        }
        if seconds == 0 {
            return Ok(None);
        }
        let dir = if conf.endpoint_status_dir.is_empty() {
            DEFAULT_STATUS_DIR
        } else {
            conf.endpoint_status_dir.as_str()
        };
        Ok(Some(PolicyWait {
            dir: PathBuf::from(dir),
            timeout: Duration::from_secs(seconds.unsigned_abs()),
        }))
    }

    /// Waits for the status file of the endpoint (`orchestrator`,
    /// `workload` = `<namespace>/<pod>`, `endpoint` = its interface) until
    /// the setting's time or `deadline`, whichever is first; `true` when
    /// it appeared.
    pub async fn wait(
        &self,
        orchestrator: &str,
        workload: &str,
        endpoint: &str,
        deadline: Instant,
    ) -> bool {
        let path = self
            .dir
            .join(status_file_name(orchestrator, workload, endpoint));
        let until = std::time::Instant::now()
            + self
                .timeout
                .min(deadline.saturating_duration_since(Instant::now()));
        tracing::debug!(file = %path.display(), "waiting for the endpoint's status file");
        let watched = path.clone();
        let found = crate::handoff::spawn_blocking(move || wait_for_file(&watched, until))
            .await
            .unwrap_or(false);
        if found {
            tracing::debug!(file = %path.display(), "endpoint status file present: policy in place");
        } else {
            tracing::warn!(
                "Error waiting for endpoint to become ready. Unblocking pod creation...: \
                 timed out waiting for endpoint status file '{}': file not found",
                path.display()
            );
        }
        found
    }
}

/// The status file Felix writes for an endpoint: its three identifiers,
/// each path-escaped as Go's `url.PathEscape` does, joined by spaces
/// (`k8s default%2Fpod1 eth0`).
pub fn status_file_name(orchestrator: &str, workload: &str, endpoint: &str) -> String {
    [orchestrator, workload, endpoint]
        .map(|part| utf8_percent_encode(part, PATH_SEGMENT).to_string())
        .join(" ")
}

/// Blocks until `path` exists or `until` passes: woken by inotify on its
/// directory, or polling when the directory cannot be watched (yet).
fn wait_for_file(path: &Path, until: std::time::Instant) -> bool {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return false;
    };
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).ok();
    let mut watching = false;
    loop {
        // Watch first, then look: a file made in between is not missed.
        if !watching && let Some(i) = &inotify {
            watching = i
                .add_watch(dir, AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)
                .is_ok();
        }
        if path.exists() {
            return true;
        }
        let now = std::time::Instant::now();
        if now >= until {
            return false;
        }
        let left = until - now;
        match inotify.as_ref().filter(|_| watching) {
            Some(inotify) => {
                let mut fds = [PollFd::new(inotify.as_fd(), PollFlags::POLLIN)];
                let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
                if poll(&mut fds, PollTimeout::from(ms)).unwrap_or(0) > 0
                    && let Ok(events) = inotify.read_events()
                    && events.iter().any(|e| e.name.as_deref() == Some(name))
                {
                    return true;
                }
            }
            None => std::thread::sleep(POLL.min(left)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_are_escaped_as_go_escapes_path_segments() {
        assert_eq!(
            status_file_name("k8s", "default/testpod1", "eth0"),
            "k8s default%2Ftestpod1 eth0"
        );
        // Kept: letters, digits, -_.~ and $&+:=@; escaped: the rest.
        assert_eq!(
            status_file_name("k8s", "ns-1/p_o.d~$&+:=@", "eth 0;,?%é"),
            "k8s ns-1%2Fp_o.d~$&+:=@ eth%200%3B%2C%3F%25%C3%A9"
        );
    }

    #[test]
    fn the_setting_decides_the_wait() {
        let mut conf = NetConf::default();
        assert_eq!(PolicyWait::from_conf(&conf).unwrap(), None);
        conf.policy_setup_timeout_seconds = 7;
        assert_eq!(
            PolicyWait::from_conf(&conf).unwrap(),
            Some(PolicyWait {
                dir: PathBuf::from(DEFAULT_STATUS_DIR),
                timeout: Duration::from_secs(7)
            })
        );
        conf.endpoint_status_dir = "/tmp/status".into();
        assert_eq!(
            PolicyWait::from_conf(&conf).unwrap().unwrap().dir,
            PathBuf::from("/tmp/status")
        );
        conf.policy_setup_timeout_seconds = -3;
        assert_eq!(
            PolicyWait::from_conf(&conf).unwrap_err().to_string(),
            "invalid pod startup delay of -3"
        );
    }

    #[test]
    fn the_wait_ends_when_the_file_appears_and_not_for_another() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k8s ns%2Fpod eth0");
        let other = dir.path().join("k8s ns%2Fpod eth1");
        let (p, o) = (path.clone(), other.clone());
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            std::fs::write(o, b"{}").unwrap();
            std::thread::sleep(Duration::from_millis(200));
            std::fs::write(p, b"{}").unwrap();
        });
        assert!(wait_for_file(
            &path,
            std::time::Instant::now() + Duration::from_secs(30)
        ));
        assert!(path.exists());
        writer.join().unwrap();
        // Never written: false once the time is up.
        assert!(!wait_for_file(
            &dir.path().join("k8s ns%2Fpod eth2"),
            std::time::Instant::now() + Duration::from_millis(200)
        ));
        // A directory that does not exist yet is polled until it does.
        let later = dir.path().join("later");
        let file = later.join("k8s ns%2Fpod eth0");
        let (l, f) = (later.clone(), file.clone());
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            std::fs::create_dir(l).unwrap();
            std::fs::write(f, b"{}").unwrap();
        });
        assert!(wait_for_file(
            &file,
            std::time::Instant::now() + Duration::from_secs(30)
        ));
        writer.join().unwrap();
    }
}
