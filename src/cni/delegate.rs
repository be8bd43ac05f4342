//! Delegation to another CNI plugin (the IPAM plugin), with libcni's invoke
//! semantics: found in `CNI_PATH`, run with the caller's environment (only
//! `CNI_COMMAND` overridden, `CNI_ARGS` prefixed with `IgnoreUnknown=1`), the
//! complete config on stdin, the child's error passed up unchanged, bounded
//! by the invocation's deadline.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use crate::cni::env::Command;
use crate::cni::error::{Error, Kind, PluginError, Result};
use crate::cni::result::CniResult;
use crate::cni::version::{self, Version};

/// How often and how long to retry an exec that failed with ETXTBSY (the
/// binary is being replaced), as libcni does.
const TEXT_BUSY_RETRIES: u32 = 5;
const TEXT_BUSY_PAUSE: Duration = Duration::from_secs(1);

/// A plugin to delegate to, and everything needed to run it.
#[derive(Debug, Clone)]
pub struct Delegate {
    /// The plugin's type (its file name in `CNI_PATH`).
    pub plugin: String,
    /// Directories of `CNI_PATH`.
    pub path: Arc<[PathBuf]>,
    /// The caller's environment.
    pub env: Arc<HashMap<String, String>>,
    /// Extra `K=V` pairs appended to `CNI_ARGS` (e.g. `IP=10.0.0.7`).
    pub extra_args: Option<String>,
    /// When the whole invocation must be done.
    pub deadline: Instant,
}

/// Finds `plugin` in the `CNI_PATH` directories: the first regular file wins.
pub fn find_in_path(plugin: &str, path: &[PathBuf]) -> Result<PathBuf> {
    if plugin.is_empty() {
        return Err(Error::invalid_config("no plugin name provided"));
    }
    if plugin.contains(std::path::MAIN_SEPARATOR) {
        return Err(Error::invalid_config(format!(
            "invalid plugin name: {plugin:?} must not contain a path separator"
        )));
    }
    if path.is_empty() {
        return Err(Error::invalid_config("no paths provided"));
    }
    path.iter()
        .map(|dir| dir.join(plugin))
        .find(|p| std::fs::metadata(p).map(|m| m.is_file()).unwrap_or(false))
        .ok_or_else(|| {
            Error::invalid_config(format!(
                "failed to find plugin {plugin:?} in path [{}]",
                path.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            ))
        })
}

/// `CNI_ARGS` as a delegated plugin must see it.
fn delegated_args(current: Option<&str>, extra: Option<&str>) -> String {
    let current = current.unwrap_or("");
    let mut args = if current.starts_with("IgnoreUnknown=") {
        current.to_string()
    } else if current.is_empty() {
        "IgnoreUnknown=1".to_string()
    } else {
        format!("IgnoreUnknown=1;{current}")
    };
    if let Some(extra) = extra.filter(|e| !e.is_empty()) {
        args.push(';');
        args.push_str(extra);
    }
    args
}

impl Delegate {
    fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Starts the plugin for `command`. It blocks reading its config from
    /// stdin, so it acts on nothing until [`Running::finish`] writes the
    /// config; a `Running` dropped unfinished kills the process first.
    pub async fn spawn(&self, command: Command) -> Result<Running> {
        let binary = find_in_path(&self.plugin, &self.path)?;
        let mut env = (*self.env).clone();
        env.insert("CNI_COMMAND".into(), command.as_str().into());
        env.insert(
            "CNI_ARGS".into(),
            delegated_args(
                self.env.get("CNI_ARGS").map(String::as_str),
                self.extra_args.as_deref(),
            ),
        );
        let started = Instant::now();
        let mut attempt = 0;
        loop {
            let spawned = tokio::process::Command::new(&binary)
                .env_clear()
                .envs(&env)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn();
            match spawned {
                Ok(child) => {
                    return Ok(Running {
                        plugin: self.plugin.clone(),
                        deadline: self.deadline,
                        command,
                        binary,
                        child,
                        started,
                    });
                }
                Err(e)
                    if e.raw_os_error() == Some(libc::ETXTBSY)
                        && attempt < TEXT_BUSY_RETRIES
                        && self.remaining() > TEXT_BUSY_PAUSE =>
                {
                    attempt += 1;
                    tracing::warn!(plugin = %binary.display(), attempt, "text file busy; retrying exec");
                    tokio::time::sleep(TEXT_BUSY_PAUSE).await;
                }
                Err(e) => {
                    return Err(Error::ipam(format!(
                        "failed to exec {}: {e}",
                        binary.display()
                    )));
                }
            }
        }
    }

    /// Runs the plugin once: `Ok(stdout)` on exit 0, the child's error otherwise.
    async fn exec(&self, command: Command, stdin: &[u8]) -> Result<Vec<u8>> {
        self.spawn(command).await?.finish(stdin).await
    }

    /// Runs `command` at the config's version, on `first` if the process was
    /// already started; if the plugin refuses that version (code 1), asks it
    /// for VERSION and retries once at the highest version both support.
    /// Returns the stdout and the version used.
    async fn exec_negotiated(
        &self,
        command: Command,
        config: &Value,
        first: Option<Running>,
    ) -> Result<(Vec<u8>, Version)> {
        let version = Version::from_config(config.get("cniVersion").and_then(Value::as_str))?;
        let stdin = serde_json::to_vec(config).expect("JSON values serialize");
        let first = match first {
            Some(running) => running,
            None => self.spawn(command).await?,
        };
        match first.finish(&stdin).await {
            Err(Error::Delegated(e)) if e.code == crate::cni::error::code::INCOMPATIBLE_VERSION => {
                let theirs = self.supported_versions().await?;
                let Some(fallback) =
                    version::highest_common(&version::SUPPORTED, &theirs).filter(|v| *v < version)
                else {
                    return Err(Error::Delegated(e));
                };
                tracing::info!(plugin = %self.plugin, %version, %fallback, "retrying at a version the plugin supports");
                let mut config = config.clone();
                config["cniVersion"] = Value::String(fallback.to_string());
                if let Some(prev) = config.get("prevResult").cloned() {
                    let (prev, _) = CniResult::parse(&prev, version)?;
                    config["prevResult"] = prev.to_version(fallback)?;
                }
                let stdin = serde_json::to_vec(&config).expect("JSON values serialize");
                Ok((self.exec(command, &stdin).await?, fallback))
            }
            other => other.map(|out| (out, version)),
        }
    }

    /// The plugin's VERSION answer (libcni's `GetVersionInfo` rules).
    pub async fn supported_versions(&self) -> Result<Vec<String>> {
        let stdin = format!("{{\"cniVersion\":\"{}\"}}", version::CURRENT);
        let out = match self.exec(Command::Version, stdin.as_bytes()).await {
            Ok(out) => out,
            Err(Error::Delegated(e)) if e.msg.contains("unknown CNI_COMMAND: VERSION") => {
                return Ok(vec!["0.1.0".into()]);
            }
            Err(e) => return Err(e),
        };
        let v: Value = serde_json::from_slice(&out).map_err(|e| {
            Error::caused(
                Kind::Ipam,
                format!("{}: bad VERSION answer", self.plugin),
                e,
            )
        })?;
        if let Some(list) = v.get("supportedVersions").and_then(Value::as_array) {
            return Ok(list
                .iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect());
        }
        match v.get("cniVersion").and_then(Value::as_str) {
            Some("0.2.0") => Ok(vec!["0.1.0".into(), "0.2.0".into()]),
            Some(other) if !other.is_empty() => Ok(vec![other.to_string()]),
            _ => Err(Error::ipam(format!(
                "{}: VERSION answer has no cniVersion",
                self.plugin
            ))),
        }
    }

    /// ADD: the plugin's result, whatever version it printed, as the
    /// internal model.
    pub async fn add(&self, config: &Value) -> Result<CniResult> {
        self.add_on(config, None).await
    }

    /// ADD on a process started earlier with [`Self::spawn`] (so that its
    /// start-up overlapped other work), or on a new one.
    pub async fn add_on(&self, config: &Value, running: Option<Running>) -> Result<CniResult> {
        let (stdout, version) = self.exec_negotiated(Command::Add, config, running).await?;
        let text = String::from_utf8_lossy(&stdout);
        let value: Value = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).map_err(|e| {
                Error::ipam(format!(
                    "{} ADD printed an unreadable result: {e}",
                    self.plugin
                ))
            })?
        };
        Ok(CniResult::parse(&value, version)?.0)
    }

    /// DEL, CHECK or STATUS: only success matters.
    pub async fn run(&self, command: Command, config: &Value) -> Result<()> {
        self.run_on(command, config, None).await
    }

    /// DEL, CHECK or STATUS on a process started earlier with
    /// [`Self::spawn`] for `command`, or on a new one.
    pub async fn run_on(
        &self,
        command: Command,
        config: &Value,
        running: Option<Running>,
    ) -> Result<()> {
        self.exec_negotiated(command, config, running)
            .await
            .map(|_| ())
    }

    /// STATUS (or GC): only asked of plugins that speak spec 1.1.0; an older
    /// plugin cannot answer it and is taken as ready (libcni does the same).
    pub async fn run_v11_verb(&self, command: Command, config: &Value) -> Result<()> {
        let theirs = self.supported_versions().await?;
        if !theirs
            .iter()
            .any(|v| Version::parse(v).is_ok_and(|v| v >= Version::V1_1_0))
        {
            tracing::debug!(
                plugin = %self.plugin,
                verb = command.as_str(),
                "plugin predates spec 1.1.0; skipped"
            );
            return Ok(());
        }
        self.run(command, config).await
    }
}

/// A delegated plugin process that has been started and waits for its config.
pub struct Running {
    plugin: String,
    deadline: Instant,
    command: Command,
    binary: PathBuf,
    child: tokio::process::Child,
    started: Instant,
}

impl Running {
    /// Writes the config, waits (within the deadline) and reads the outcome.
    pub async fn finish(self, stdin: &[u8]) -> Result<Vec<u8>> {
        let Running {
            plugin,
            deadline,
            command,
            binary,
            child,
            started,
        } = self;
        let remaining = deadline.saturating_duration_since(Instant::now());
        let output = tokio::time::timeout(remaining, run_to_end(child, stdin))
            .await
            .map_err(|_| {
                Error::timed_out(format!(
                    "{} {} did not finish within the deadline",
                    plugin,
                    command.as_str()
                ))
            })?
            .map_err(|e| {
                Error::caused(Kind::Ipam, format!("failed to run {}", binary.display()), e)
            })?;
        tracing::debug!(
            plugin = %plugin,
            command = command.as_str(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            status = ?output.status,
            "delegated plugin finished"
        );
        if !output.stderr.is_empty() {
            // The plugin was given the whole config: what it prints may
            // hold its secrets (a plugin that echoes its config, say).
            let config = serde_json::from_slice::<Value>(stdin).unwrap_or_default();
            let text =
                crate::cni::config::redact_text(&String::from_utf8_lossy(&output.stderr), &config);
            tracing::debug!(
                plugin = %plugin,
                "delegated plugin stderr: {}",
                text.trim_end()
            );
            eprint!("{text}");
        }
        if output.status.success() {
            return Ok(output.stdout);
        }
        Err(plugin_failure(&output.stdout, &output.stderr))
    }
}

async fn run_to_end(
    mut child: tokio::process::Child,
    stdin: &[u8],
) -> std::io::Result<std::process::Output> {
    if let Some(mut pipe) = child.stdin.take() {
        // A plugin may exit without reading its stdin; that is not our error.
        match pipe.write_all(stdin).await {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            other => other?,
        }
    }
    child.wait_with_output().await
}

/// The error of a plugin that exited non-zero, as libcni reads it.
fn plugin_failure(stdout: &[u8], stderr: &[u8]) -> Error {
    if let Ok(e) = serde_json::from_slice::<PluginError>(stdout) {
        return Error::Delegated(e);
    }
    let stderr = String::from_utf8_lossy(stderr);
    let msg = if !stdout.iter().all(u8::is_ascii_whitespace) {
        format!(
            "netplugin failed: {:?}",
            String::from_utf8_lossy(stdout).trim()
        )
    } else if !stderr.trim().is_empty() {
        format!("netplugin failed: {:?}", stderr.trim())
    } else {
        "netplugin failed with no error message".to_string()
    };
    Error::ipam(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_prefix() {
        assert_eq!(delegated_args(None, None), "IgnoreUnknown=1");
        assert_eq!(delegated_args(Some("A=b"), None), "IgnoreUnknown=1;A=b");
        assert_eq!(
            delegated_args(Some("IgnoreUnknown=1;A=b"), Some("IP=1.2.3.4")),
            "IgnoreUnknown=1;A=b;IP=1.2.3.4"
        );
    }

    #[test]
    fn plugin_lookup_rules() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("p"), "").unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        let path = vec![PathBuf::from("/nonexistent"), dir.path().to_path_buf()];
        assert_eq!(find_in_path("p", &path).unwrap(), dir.path().join("p"));
        assert!(
            find_in_path("d", &path).is_err(),
            "directories are not plugins"
        );
        assert!(
            find_in_path("../p", &path)
                .unwrap_err()
                .to_string()
                .contains("path separator")
        );
        assert!(find_in_path("", &path).is_err());
    }

    #[test]
    fn failure_parsing() {
        let e = plugin_failure(br#"{"code":7,"msg":"bad","details":"d"}"#, b"");
        assert!(matches!(e, Error::Delegated(ref p) if p.code == 7 && p.details == "d"));
        assert_eq!(
            plugin_failure(b"", b"").to_string(),
            "netplugin failed with no error message"
        );
        assert!(plugin_failure(b"", b"boom").to_string().contains("boom"));
    }
}
