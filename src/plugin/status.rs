//! STATUS (spec 1.1.0): whether this network can serve an ADD now — the
//! datastore answers and is ready, the Kubernetes credentials are accepted
//! and not about to expire, and the IPAM can give this node an address.
//! Releases owed by earlier DELs are reported (logged) by the release
//! queue that wraps this verb, never a reason to fail.
//!
//! A runtime asks every few seconds; a ready answer is kept
//! ([`status_cache`](crate::plugin::status_cache)) and, within its window,
//! given again after checks that ask the datastore nothing: the token
//! still lasts, and every datastore endpoint still accepts a TCP
//! connection; every `status_probe_seconds`, one read of the datastore's
//! readiness too. Any of them failing, the answer's key changed, its
//! window past or an ADD or DEL since: the full check, now. On the
//! embedded datastore (no request to spare) every STATUS is the full check.
//! Where `calico install --watch` runs on the node, its datastore watch's
//! report ([`status_watch`](crate::plugin::status_watch)) stands for the
//! probe, and a not-ready report (the CNI's ServiceAccount deleted,
//! `datastoreReady` false) is STATUS's answer at once.

use std::time::{Duration, SystemTime};

use crate::cni::{Error, Result};
use crate::datastore::Backend;
use crate::datastore::open::{datastore_kind, etcd_config, presents_kubernetes_token};
use crate::plugin::context::Context;
use crate::plugin::status_cache::{Answer, Cache, Due, Key, due, unix_ms};
use crate::plugin::status_watch::{self, Report, Verdict};

/// How long the check between full checks waits for a datastore endpoint
/// to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(1500);

/// The call's variables that name one attachment (no part of STATUS's
/// answer, so no part of its key).
const PER_ATTACHMENT: [&str; 4] = ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS"];

/// STATUS: ready when the datastore answers and is ready, the Kubernetes
/// token (when one is used) is valid beyond the margin, and the IPAM's
/// STATUS passes; code 50 with the reason otherwise. Answered from the
/// cache when its answer stands and the checks between full checks pass.
pub async fn cmd_status(ctx: &Context) -> Result<()> {
    let conf = &ctx.req.conf;
    let windows = (conf.status_cache_window(), conf.status_probe_interval());
    let cache = Cache::of(conf);
    // The embedded store costs no request: nothing to spare, and its
    // readiness (set by hand) is read at once.
    let remote = datastore_kind(conf, &ctx.req.env.vars).is_ok_and(|k| k != Backend::Local);
    let key = if windows.0.is_zero() || !remote {
        None
    } else {
        key(ctx).await
    };
    // The node's datastore watcher's report, read once: what it knows for
    // certain is the answer.
    let report = match remote {
        true => watcher_report(ctx, &cache, SystemTime::now()).await,
        false => None,
    };
    if let Some(Report {
        verdict: Verdict::NotReady(why),
        ..
    }) = &report
    {
        cache.forget();
        tracing::debug!("STATUS not ready by the datastore watch's report");
        return Err(Error::not_available(format!(
            "the datastore watch on this node reports: {why}"
        )));
    }
    match &key {
        Some(key) => match from_cache(ctx, &cache, key, windows, report.as_ref()).await {
            Ok(()) => return Ok(()),
            Err(why) => tracing::debug!("STATUS checks afresh: {why}"),
        },
        None if !remote => tracing::debug!("STATUS checks afresh: the embedded datastore"),
        None if windows.0.is_zero() => {
            tracing::debug!("STATUS checks afresh: {}", Due::Off);
        }
        None => tracing::debug!("STATUS checks afresh: its key could not be read"),
    }
    let began = SystemTime::now();
    let verdict = full_check(ctx).await;
    match (&verdict, key) {
        (Ok(()), Some(key)) => keep(&cache, &Answer::new(key, began)),
        (Ok(()), None) => {}
        (Err(_), _) => cache.forget(),
    }
    tracing::debug!(
        ready = verdict.is_ok(),
        took_ms = began.elapsed().unwrap_or_default().as_millis() as u64,
        "STATUS full check"
    );
    verdict
}

/// The kept answer of `key`, when it stands and the checks between full
/// checks pass (and the probe, when one is due); why not, when not.
async fn from_cache(
    ctx: &Context,
    cache: &Cache,
    key: &str,
    windows: (Duration, Duration),
    report: Option<&Report>,
) -> std::result::Result<(), String> {
    let answer = cache.load();
    let now = SystemTime::now();
    let verdict = due(answer.as_ref(), key, now, windows, cache.changed_at());
    let (answer, probe) = match (answer, verdict) {
        (Some(answer), Due::Fresh(_)) => (answer, None),
        (Some(answer), Due::Probe(since)) => (answer, Some(since)),
        (_, why) => return Err(why.to_string()),
    };
    let age_ms = now
        .duration_since(answer.checked_at())
        .unwrap_or_default()
        .as_millis() as u64;
    between_full_checks(ctx)
        .await
        .map_err(|why| format!("{why} (the kept answer is {age_ms} ms old)"))?;
    // The node's datastore watcher, when it runs and reports on this
    // network's API server, stands for the probe (and tells at once of
    // what only the server sees).
    match report {
        Some(Report {
            verdict: Verdict::Unknown(why) | Verdict::NotReady(why),
            ..
        }) => return Err(format!("the datastore watch reports: {why}")),
        Some(report) if probe.is_some() => {
            keep(cache, &answer.probed(now));
            tracing::debug!(
                age_ms,
                watch_report_age_ms = unix_ms(now).saturating_sub(report.at_ms),
                "STATUS answered from the cache, confirmed by the datastore watch"
            );
            return Ok(());
        }
        _ => {}
    }
    let Some(since) = probe else {
        tracing::debug!(age_ms, "STATUS answered from the cache");
        return Ok(());
    };
    // One read: the datastore answers, takes the credentials, is ready.
    ctx.ensure_ready()
        .await
        .map_err(|e| format!("the probe: {e}"))?;
    keep(cache, &answer.probed(now));
    tracing::debug!(
        age_ms,
        since_probe_ms = since.as_millis() as u64,
        "STATUS answered from the cache, confirmed by a probe"
    );
    Ok(())
}

/// The datastore watcher's report beside the cache, when one stands for
/// this call's API server (the Kubernetes datastore only).
async fn watcher_report(ctx: &Context, cache: &Cache, now: SystemTime) -> Option<Report> {
    let (conf, vars) = (&ctx.req.conf, &ctx.req.env.vars);
    if datastore_kind(conf, vars).ok()? != Backend::Kubernetes {
        return None;
    }
    let server = ctx.k8s().await.ok()?.server().to_string();
    status_watch::load(cache.dir())?.standing(&server, now)
}

/// Keeps `answer` (a failure is logged: the next call checks afresh).
fn keep(cache: &Cache, answer: &Answer) {
    if let Err(e) = cache.store(answer) {
        tracing::warn!(
            "could not keep STATUS's answer in {}: {e}",
            cache.answer_path().display()
        );
    }
}

/// What the answer depends on: the network, its config, the call's
/// variables, and the credentials it presents (the kubeconfig's bytes and
/// a digest of the token; etcd's certificate files). `None` when they
/// cannot be read (the full check says why).
async fn key(ctx: &Context) -> Option<String> {
    let req = &ctx.req;
    let (conf, vars) = (&req.conf, &req.env.vars);
    let mut key = Key::new();
    key.part("network", conf.name.as_bytes())
        .part("config", req.raw.to_string().as_bytes());
    let mut names: Vec<&String> = vars
        .keys()
        .filter(|n| !PER_ATTACHMENT.contains(&n.as_str()))
        .collect();
    names.sort();
    for name in names {
        key.part(name, vars[name].as_bytes());
    }
    if datastore_kind(conf, vars).ok()? == Backend::Etcd {
        let etcd = etcd_config(conf, vars).ok()?;
        for file in [&etcd.ca_cert_file, &etcd.cert_file, &etcd.key_file]
            .into_iter()
            .flatten()
        {
            key.part("etcd file", &std::fs::read(file).ok()?);
        }
    }
    if presents_kubernetes_token(conf, vars).ok()? {
        if !conf.kubernetes.kubeconfig.is_empty() {
            key.part(
                "kubeconfig",
                &std::fs::read(&conf.kubernetes.kubeconfig).ok()?,
            );
        }
        let client = ctx.k8s().await.ok()?;
        key.part("credentials", &client.credentials_digest());
    }
    Some(key.finish())
}

/// The checks between full checks, none of which asks the datastore
/// anything: the token lasts beyond the margin, and every endpoint of the
/// datastore (the API server, each etcd member; none for the embedded
/// store) accepts a TCP connection within [`CONNECT_TIMEOUT`]. Why not,
/// when not.
async fn between_full_checks(ctx: &Context) -> std::result::Result<(), String> {
    token_lasts(ctx).await.map_err(|e| e.to_string())?;
    let (conf, vars) = (&ctx.req.conf, &ctx.req.env.vars);
    let urls: Vec<String> = match datastore_kind(conf, vars).map_err(|e| e.to_string())? {
        Backend::Local => Vec::new(),
        Backend::Kubernetes => vec![
            ctx.k8s()
                .await
                .map_err(|e| e.to_string())?
                .server()
                .to_string(),
        ],
        Backend::Etcd => {
            etcd_config(conf, vars)
                .map_err(|e| e.to_string())?
                .resolved(ctx.deadline())
                .await
                .map_err(|e| e.to_string())?
                .endpoints
        }
    };
    let wait = CONNECT_TIMEOUT.min(ctx.remaining());
    let probes = urls.iter().map(|url| async move {
        let (host, port) = host_port(url).ok_or_else(|| format!("{url}: no host in it"))?;
        match tokio::time::timeout(wait, tokio::net::TcpStream::connect((host.as_str(), port)))
            .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("{url} refuses connections: {e}")),
            Err(_) => Err(format!("{url} accepted no connection within {wait:?}")),
        }
    });
    futures::future::join_all(probes)
        .await
        .into_iter()
        .collect::<std::result::Result<Vec<()>, String>>()
        .map(|_| ())
}

/// The host and port of an endpoint's URL (the scheme's port when it names
/// none).
fn host_port(url: &str) -> Option<(String, u16)> {
    let uri: http::Uri = url.parse().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    let port = uri
        .port_u16()
        .unwrap_or(if uri.scheme_str() == Some("http") {
            80
        } else {
            443
        });
    Some((host.to_string(), port))
}

/// Today's whole STATUS: the datastore, the token, the IPAM.
async fn full_check(ctx: &Context) -> Result<()> {
    let req = &ctx.req;
    let not_available = |e: Error| Error::not_available_caused("", e);
    ctx.ensure_ready().await.map_err(not_available)?;
    token_lasts(ctx).await?;
    ctx.ipam()
        .await
        .map_err(not_available)?
        .status(&req.raw)
        .await
        .map_err(|e| {
            Error::not_available_caused(
                format!("IPAM plugin {} is not ready", req.conf.ipam.kind),
                e,
            )
        })
}

/// The token the Kubernetes client presents (when the config names one)
/// expires later than the margin from now.
async fn token_lasts(ctx: &Context) -> Result<()> {
    let conf = &ctx.req.conf;
    let uses_kubernetes =
        crate::datastore::open::presents_kubernetes_token(conf, &ctx.req.env.vars)
            .map_err(|e| Error::not_available_caused("", e))?;
    if !uses_kubernetes {
        return Ok(());
    }
    let client = ctx
        .k8s()
        .await
        .map_err(|e| Error::not_available_caused("", e))?;
    let Some((expires, from)) = client.token_expiry() else {
        return Ok(());
    };
    let margin = conf.token_expiry_margin();
    let now = SystemTime::now();
    if expires > now + margin {
        return Ok(());
    }
    let when = crate::k8s::client::rfc3339(expires);
    Err(Error::not_available(match expires.duration_since(now) {
        Ok(left) => format!(
            "{from} expires at {when}, in {} s (within the {} s margin): it is not being renewed (calico install --watch or calico-node renews it)",
            left.as_secs(),
            margin.as_secs()
        ),
        Err(_) => format!(
            "{from} expired at {when}: it is not being renewed (calico install --watch or calico-node renews it)"
        ),
    }))
}

#[cfg(test)]
mod tests {
    use super::host_port;

    #[test]
    fn an_endpoint_is_its_host_and_port() {
        let hp = host_port;
        assert_eq!(
            hp("https://127.0.0.1:6443"),
            Some(("127.0.0.1".into(), 6443))
        );
        assert_eq!(hp("https://10.96.0.1"), Some(("10.96.0.1".into(), 443)));
        assert_eq!(hp("http://etcd-0:2379"), Some(("etcd-0".into(), 2379)));
        assert_eq!(hp("http://etcd-0"), Some(("etcd-0".into(), 80)));
        assert_eq!(
            hp("https://[fd00::1]:2379/"),
            Some(("fd00::1".into(), 2379))
        );
        assert_eq!(hp("not a url"), None);
    }
}
