//! `calico install` (and the executable invoked as `install`, the command
//! of Calico's install-cni container): Calico's install-cni contract, so
//! that swapping Calico's CNI image for ours is the whole migration. From
//! the same environment it copies the binaries into the host's CNI
//! directories, copies the etcd TLS files beside the network config,
//! writes the CNI kubeconfig with a token minted for the CNI's
//! ServiceAccount (when it runs in a pod), and renders the network config
//! from the template; every file is replaced atomically ([`files`]).
//! With `--watch` (or `SLEEP=true`) it stays up and keeps them fresh
//! ([`watch`]).
//!
//! The host is seen under `--host-root` (`/host`, as calico-node's
//! DaemonSet mounts it): `<root>/opt/cni/bin`, `<root>/secondary-bin-dir`,
//! `<root>/etc/cni/net.d`. `CNI_NET_DIR` is where the node's runtime sees
//! that last directory (the paths written into the config).

pub mod datastore_watch;
pub mod files;
mod jitter;
pub mod kubeconfig;
pub mod settings;
pub mod storage_beat;
pub mod template;
pub mod watch;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use self::files::{FileError, Written};
use self::kubeconfig::{KubeconfigError, Token};
pub use self::settings::{Binaries, Settings};

/// How long one install may take (the token request included).
pub const DEADLINE: Duration = Duration::from_secs(60);

/// How often `--watch` logs that it is watching (and its counts).
pub const WATCH_HEARTBEAT: Duration = Duration::from_secs(600);

/// The TLS files of an etcd datastore, by their names in `TLS_ASSETS_DIR`.
pub const TLS_FILES: [&str; 3] = ["etcd-ca", "etcd-cert", "etcd-key"];

/// Why an install failed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Kubeconfig(#[from] KubeconfigError),
    #[error("cannot read the network config template {path}: {source}")]
    Template {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Config(String),
    #[error("no CNI binary directory is writable (tried {0})")]
    NoBinaryDirectory(String),
}

/// What one install did, a line per file, and the token it wrote.
#[derive(Debug, Default)]
pub struct Installed {
    pub lines: Vec<String>,
    pub token: Option<Token>,
    /// The network config as written.
    pub conflist: String,
}

impl Installed {
    fn note(&mut self, what: Written, path: &Path) {
        let verb = match what {
            Written::Replaced => "wrote",
            Written::Unchanged => "unchanged",
        };
        self.lines.push(format!("{verb} {}", path.display()));
    }
}

/// One install: TLS files, binaries, the kubeconfig, the network config.
pub async fn install(settings: &Settings, deadline: Instant) -> Result<Installed, InstallError> {
    let mut done = Installed::default();
    let net_d = settings.net_d();
    std::fs::create_dir_all(&net_d).map_err(|source| FileError {
        path: net_d.clone(),
        source,
    })?;
    copy_tls_files(settings, &mut done)?;
    if settings.binaries != Binaries::Skip {
        copy_binaries(settings, &mut done)?;
    }
    if let Some(cluster) = &settings.in_cluster {
        let token = cluster.mint(deadline).await?;
        write_kubeconfig(settings, &token, &mut done)?;
        done.token = Some(token);
    }
    write_conflist(settings, &mut done)?;
    Ok(done)
}

/// The etcd TLS files, copied into `<net.d>/calico-tls` with their modes;
/// the directory is removed when `TLS_ASSETS_DIR` holds none of them.
pub fn copy_tls_files(settings: &Settings, done: &mut Installed) -> Result<(), InstallError> {
    let target = settings.net_d().join("calico-tls");
    let present: Vec<&str> = TLS_FILES
        .into_iter()
        .filter(|name| settings.tls_assets_dir.join(name).is_file())
        .collect();
    if present.is_empty() {
        if target.exists() {
            std::fs::remove_dir_all(&target).map_err(|source| FileError {
                path: target.clone(),
                source,
            })?;
            done.lines.push(format!("removed {}", target.display()));
        }
        return Ok(());
    }
    std::fs::create_dir_all(&target).map_err(|source| FileError {
        path: target.clone(),
        source,
    })?;
    for name in TLS_FILES {
        let to = target.join(name);
        if present.contains(&name) {
            let written = files::copy(&settings.tls_assets_dir.join(name), &to)?;
            done.note(written, &to);
        } else if to.exists() {
            let _ = std::fs::remove_file(&to);
            done.lines.push(format!("removed {}", to.display()));
        }
    }
    Ok(())
}

/// What goes into a CNI binary directory: (name, what it is).
enum Entry {
    File(PathBuf),
    Link(PathBuf),
}

fn entries(settings: &Settings) -> Result<Vec<(String, Entry)>, InstallError> {
    let mut out = Vec::new();
    match &settings.binaries {
        Binaries::Skip => {}
        Binaries::Executable(exe) => {
            out.push(("calico".to_string(), Entry::File(exe.clone())));
            out.push(("calico-ipam".to_string(), Entry::Link("calico".into())));
        }
        Binaries::Directory(dir) => {
            let listing = std::fs::read_dir(dir).map_err(|source| FileError {
                path: dir.clone(),
                source,
            })?;
            let mut names: Vec<String> = listing
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            for name in names {
                if name == "install" || name.starts_with('.') {
                    continue;
                }
                let path = dir.join(&name);
                let entry = match std::fs::read_link(&path) {
                    // A link to a sibling stays a link to it.
                    Ok(target) if target.components().count() == 1 => Entry::Link(target),
                    _ if path.is_file() => Entry::File(path),
                    _ => continue,
                };
                out.push((name, entry));
            }
        }
    }
    out.retain(|(name, _)| !settings.skip_binaries.contains(name));
    Ok(out)
}

/// The binaries, into every writable CNI binary directory of the host;
/// the first (`<root>/opt/cni/bin`) is created when missing, as on a node
/// whose runtime has no CNI plugin yet (the secondary one only counts when
/// it is mounted).
pub fn copy_binaries(settings: &Settings, done: &mut Installed) -> Result<(), InstallError> {
    let wanted = entries(settings)?;
    let dirs = settings.binary_dirs();
    if !dirs[0].exists() && std::fs::create_dir_all(&dirs[0]).is_ok() {
        done.lines.push(format!("created {}", dirs[0].display()));
    }
    let mut any = false;
    for dir in &dirs {
        if !files::writable_directory(dir) {
            done.lines.push(format!(
                "skipped {} (not a writable directory)",
                dir.display()
            ));
            continue;
        }
        any = true;
        for (name, entry) in &wanted {
            let to = dir.join(name);
            if !settings.update_binaries && std::fs::symlink_metadata(&to).is_ok() {
                done.lines
                    .push(format!("kept {} (UPDATE_CNI_BINARIES=false)", to.display()));
                continue;
            }
            let written = match entry {
                Entry::File(from) => files::copy(from, &to)?,
                Entry::Link(target) => files::link(&to, target)?,
            };
            done.note(written, &to);
        }
    }
    if !any {
        let tried: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        return Err(InstallError::NoBinaryDirectory(tried.join(", ")));
    }
    Ok(())
}

/// The CNI kubeconfig with `token`, mode 0600.
pub fn write_kubeconfig(
    settings: &Settings,
    token: &Token,
    done: &mut Installed,
) -> Result<(), InstallError> {
    let Some(cluster) = &settings.in_cluster else {
        return Ok(());
    };
    let path = settings.net_d().join("calico-kubeconfig");
    let written = files::write(&path, cluster.render(&token.token)?.as_bytes(), 0o600)?;
    done.note(written, &path);
    Ok(())
}

/// The network config rendered from the template, mode 0600 (as Calico's
/// install-cni writes it: it may hold credentials); the old
/// config name (`CNI_OLD_CONF_NAME`) removed when it differs.
pub fn write_conflist(settings: &Settings, done: &mut Installed) -> Result<(), InstallError> {
    let template = settings.template_text()?;
    let (text, _) =
        template::render(&template, &settings.values()).map_err(InstallError::Config)?;
    let path = settings.net_d().join(&settings.conf_name);
    let written = files::write(&path, text.as_bytes(), 0o600)?;
    done.note(written, &path);
    if settings.old_conf_name != settings.conf_name {
        let old = settings.net_d().join(&settings.old_conf_name);
        if std::fs::remove_file(&old).is_ok() {
            done.lines.push(format!("removed {}", old.display()));
        }
    }
    done.conflist = text;
    Ok(())
}

/// `calico install ARGS...` (or the executable run as `install`, whose
/// `SLEEP` defaults to true as Calico's does): prints what it did.
pub fn run(args: &[String], vars: &HashMap<String, String>, as_install: bool) -> super::Outcome {
    let settings = match Settings::parse(args, vars, as_install) {
        Ok(Some(s)) => s,
        Ok(None) => return super::Outcome::ok(settings::USAGE.to_string()),
        Err(problem) => {
            let command = if as_install {
                "install"
            } else {
                "calico install"
            };
            return super::Outcome::usage_error(
                &format!("{command} --help"),
                &format!("{command}: {problem}"),
            );
        }
    };
    crate::logging::init(&crate::logging::LogSettings {
        level: vars.get("LOG_LEVEL").cloned().unwrap_or_default(),
        ..Default::default()
    });
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return super::Outcome::failed("calico install", &format!("no runtime: {e}"));
        }
    };
    // With --watch, what it is doing: logged, or a status line on a terminal.
    let progress = if settings.watch {
        super::progress::Progress::logged("calico install").every(WATCH_HEARTBEAT)
    } else {
        super::progress::Progress::silent()
    };
    runtime.block_on(async {
        progress.phase("installing", None);
        let installed = match install(&settings, Instant::now() + DEADLINE).await {
            Ok(done) => done,
            Err(e) => return super::Outcome::failed("calico install", &e.to_string()),
        };
        let mut stdout = installed.lines.join("\n");
        stdout.push('\n');
        if !settings.watch {
            return super::Outcome::ok(stdout);
        }
        progress.clear();
        print!("{stdout}");
        match watch::watch(&settings, installed, &progress).await {
            Ok(()) => super::Outcome::default(),
            Err(e) => super::Outcome::failed("calico install --watch", &e.to_string()),
        }
    })
}
