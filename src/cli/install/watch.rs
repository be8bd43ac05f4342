//! `calico install --watch` (and `SLEEP=true`): stays up after the install
//! and keeps what it wrote fresh. The CNI kubeconfig's token is renewed
//! (TokenRequest) once a quarter of its remaining life has passed, plus a
//! random part of as much again so that nodes spread out (calico-node's
//! rule; `CNI_TOKEN_REFRESH_INTERVAL` sets the interval instead); a failed
//! renewal is retried every 5 s. The network config is re-rendered (and
//! the etcd TLS files copied again) when the template file, calico-node's
//! MTU file or the TLS files change: they are looked at every second.
//! Every file is replaced atomically, so a plugin call in between reads
//! the old or the new one. In a pod it also follows the datastore for
//! STATUS (`datastore_watch`).

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::jitter::jitter;
use super::kubeconfig::Token;
use super::{DEADLINE, InstallError, Installed, Settings, TLS_FILES};
use crate::cli::progress::{Progress, duration_text};

/// How often the inputs of the network config are looked at.
const POLL: Duration = Duration::from_secs(1);

/// The shortest wait before a renewal (and the retry after a failure).
const MIN_RENEWAL: Duration = Duration::from_secs(5);

/// What the network config and the TLS copies are made from, as bytes:
/// a change is a difference.
fn inputs(settings: &Settings) -> Vec<Option<Vec<u8>>> {
    let mut paths = vec![settings.mtu_file.clone()];
    paths.extend(settings.template_file.clone());
    paths.extend(TLS_FILES.iter().map(|f| settings.tls_assets_dir.join(f)));
    paths.iter().map(|p| std::fs::read(p).ok()).collect()
}

/// When to renew `token`.
pub fn renewal_in(settings: &Settings, token: &Token) -> Duration {
    if let Some(every) = settings.refresh_interval {
        return every.max(Duration::from_millis(100));
    }
    let left = token
        .expires
        .and_then(|e| e.duration_since(SystemTime::now()).ok())
        .unwrap_or(Duration::from_secs(4 * 3600));
    if left < MIN_RENEWAL * 4 {
        return MIN_RENEWAL;
    }
    let quarter = left / 4;
    quarter + quarter.mul_f64(jitter())
}

/// What the watch is doing, for `progress`.
#[derive(Debug, Default)]
struct Watched {
    looks: u64,
    renders: u64,
    renewals: u64,
}

impl Watched {
    fn text(&self, renew_at: Option<Instant>) -> String {
        let mut text = format!(
            "watching the network config's inputs ({} looks, {} re-renders",
            self.looks, self.renders
        );
        if let Some(at) = renew_at {
            let left = at.saturating_duration_since(Instant::now());
            text += &format!(
                ", {} token renewals; the next in {}",
                self.renewals,
                duration_text(left)
            );
        }
        text + ")"
    }
}

/// Runs until the process is stopped (or a file cannot be written); says
/// what it is doing through `progress`.
pub async fn watch(
    settings: &Settings,
    installed: Installed,
    progress: &Progress,
) -> Result<(), InstallError> {
    if let Some(cluster) = &settings.in_cluster {
        let dir = super::datastore_watch::report_dir(settings);
        progress.note(&format!(
            "following the datastore for STATUS (its report in {})",
            dir.display()
        ));
        tokio::spawn(super::datastore_watch::run(
            cluster.clone(),
            dir,
            Some(settings.node_name()).filter(|n| !n.is_empty()),
        ));
    }
    let mut seen = inputs(settings);
    let mut renew_at = installed
        .token
        .as_ref()
        .map(|t| Instant::now() + renewal_in(settings, t));
    let mut watched = Watched::default();
    progress.phase(&watched.text(renew_at), None);
    loop {
        tokio::time::sleep(POLL).await;
        watched.looks += 1;
        progress.update(&watched.text(renew_at));
        let now = inputs(settings);
        if now != seen {
            let mut done = Installed::default();
            super::copy_tls_files(settings, &mut done)?;
            let rendered = match super::write_conflist(settings, &mut done) {
                Ok(()) => true,
                // A half-edited template: kept as it was until it parses.
                Err(InstallError::Config(e)) => {
                    progress.clear();
                    tracing::warn!("network config not re-rendered: {e}");
                    false
                }
                Err(e) => return Err(e),
            };
            seen = now;
            progress.clear();
            report(&done);
            if rendered {
                watched.renders += 1;
                progress.note("network config re-rendered");
            }
        }
        let (Some(at), Some(cluster)) = (renew_at, &settings.in_cluster) else {
            continue;
        };
        if Instant::now() < at {
            continue;
        }
        match cluster.mint(Instant::now() + DEADLINE).await {
            Ok(token) => {
                let mut done = Installed::default();
                super::write_kubeconfig(settings, &token, &mut done)?;
                progress.clear();
                report(&done);
                let next = renewal_in(settings, &token);
                renew_at = Some(Instant::now() + next);
                watched.renewals += 1;
                let renewed = format!("token renewed; the next renewal in {}", duration_text(next));
                progress.note(&renewed);
            }
            Err(e) => {
                progress.clear();
                tracing::warn!("token not renewed, retrying in 5 s: {e}");
                renew_at = Some(Instant::now() + MIN_RENEWAL);
            }
        }
    }
}

fn report(done: &Installed) {
    for line in &done.lines {
        println!("{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_comes_between_a_quarter_and_a_half_of_the_life_left() {
        let settings = Settings::parse(
            &["--binaries".into(), "none".into()],
            &Default::default(),
            false,
        )
        .unwrap()
        .unwrap();
        let token = Token {
            token: "t".into(),
            expires: Some(SystemTime::now() + Duration::from_secs(8000)),
        };
        for _ in 0..20 {
            let d = renewal_in(&settings, &token);
            assert!(
                d >= Duration::from_secs(1990) && d <= Duration::from_secs(4000),
                "{d:?}"
            );
        }
        let nearly = Token {
            token: "t".into(),
            expires: Some(SystemTime::now() + Duration::from_secs(10)),
        };
        assert_eq!(renewal_in(&settings, &nearly), MIN_RENEWAL);
        let mut every = settings.clone();
        every.refresh_interval = Some(Duration::from_secs(2));
        assert_eq!(renewal_in(&every, &token), Duration::from_secs(2));
    }
}
