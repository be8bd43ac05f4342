//! The process edge: personality by argv[0], flags as Calico's binaries
//! read them ([`flags`]; the operator's `calico ipam ...` subcommands are
//! handed to [`crate::cli`]), the environment and stdin turned into a
//! [`Request`], one dispatch, and the one place where a result or an error
//! becomes stdout text and an exit code.

pub mod flags;

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use serde_json::Value;

use crate::cni::env::{CniEnv, Command, Invocation};
use crate::cni::error::{BadInvocation, Error, Result};
use crate::cni::result::to_pretty_json;
use crate::cni::version::{self, SUPPORTED};
use crate::cni::{Request, Version};
use crate::logging::{self, LogSettings};

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The Calico release whose `calico` and `calico-ipam` this executable
/// replaces, as Calico's `-v` prints it.
pub const CALICO_RELEASE: &str = "v3.32.1";

/// The commit built (build.rs: `git rev-parse --short HEAD`, else
/// "unknown").
pub const COMMIT: &str = env!("CALICO_CNI_COMMIT");

/// `-v`: first what Calico's binaries print (its release: tools parse that
/// line), then this build: its version and commit, and what it replaces.
pub fn version_text() -> String {
    format!(
        "{CALICO_RELEASE}\ncalico-cni {VERSION} (commit {COMMIT}), interchangeable with Calico {CALICO_RELEASE}'s calico and calico-ipam\n"
    )
}

/// Which plugin this executable is acting as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Personality {
    /// `calico`: the main plugin.
    Calico,
    /// `calico-ipam`: the IPAM plugin.
    CalicoIpam,
}

impl Personality {
    pub fn from_argv0(argv0: &str) -> Result<Personality> {
        let base = Path::new(argv0)
            .file_name()
            .and_then(|s| s.to_str())
            .unwrap_or(argv0);
        match base {
            "calico" | "calico.exe" => Ok(Personality::Calico),
            "calico-ipam" | "calico-ipam.exe" => Ok(Personality::CalicoIpam),
            other => Err(Error::invocation(BadInvocation::UnknownBinaryName(
                other.to_string(),
            ))),
        }
    }

    /// The personality of an executable installed under another name (a
    /// conflist whose `type` names a copy, `calico-v3` say) that a runtime
    /// runs (`CNI_COMMAND` set): a runtime runs an IPAM plugin as the
    /// network's `ipam.type` and the plugin as its `type`, so the name the
    /// config gives this executable says which one is asked for. Calico's
    /// combined binary knows only its own names; anything else is the
    /// plugin, as a runtime names a main plugin far more often.
    pub fn from_config(argv0: &str, config: &[u8]) -> Personality {
        let base = Path::new(argv0)
            .file_name()
            .and_then(|s| s.to_str())
            .unwrap_or(argv0);
        let conf: Value = serde_json::from_slice(config).unwrap_or(Value::Null);
        let named = |v: Option<&Value>| v.and_then(Value::as_str) == Some(base);
        if named(conf.pointer("/ipam/type")) && !named(conf.get("type")) {
            Personality::CalicoIpam
        } else {
            Personality::Calico
        }
    }

    fn about(self) -> String {
        let what = match self {
            Personality::Calico => "Calico CNI plugin",
            Personality::CalicoIpam => "Calico CNI IPAM",
        };
        format!(
            "{what} {VERSION}\nCNI protocol versions supported: {}\n",
            SUPPORTED.join(", ")
        )
    }
}

/// What the process prints and how it exits.
#[derive(Debug, Default)]
pub struct Exit {
    pub stdout: String,
    pub stderr: String,
    pub code: i32,
}

impl Exit {
    fn ok(stdout: String) -> Exit {
        Exit {
            stdout,
            ..Exit::default()
        }
    }

    /// The spec's error JSON on stdout, exit 1.
    pub fn error(err: &Error, cni_version: &str) -> Exit {
        tracing::error!(code = err.code(), "{err}");
        let mut stdout = to_pretty_json(&err.to_reply(cni_version));
        stdout.push('\n');
        Exit {
            stdout,
            stderr: String::new(),
            code: 1,
        }
    }
}

impl From<crate::cli::Outcome> for Exit {
    fn from(outcome: crate::cli::Outcome) -> Exit {
        Exit {
            stdout: outcome.stdout,
            stderr: outcome.stderr,
            code: outcome.code,
        }
    }
}

/// The help: Calico's usage, as its binary prints it; then, for `calico`,
/// the operator's subcommands.
fn help(personality: Personality) -> String {
    let mut text = flags::usage(personality);
    if personality == Personality::Calico {
        text.push('\n');
        text.push_str(crate::cli::OVERVIEW);
    }
    text
}

/// The config's version as an error reply should be labelled.
fn reply_version(stdin: &[u8]) -> String {
    serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| {
            v.get("cniVersion")
                .and_then(Value::as_str)
                .map(String::from)
        })
        .filter(|v| SUPPORTED.contains(&v.as_str()))
        .unwrap_or_else(|| version::CURRENT.to_string())
}

/// Runs one invocation. `args` is argv, `vars` the environment, `stdin`
/// the config stream (read only when a verb needs it).
pub fn run(args: &[String], vars: HashMap<String, String>, stdin: &mut dyn Read) -> Exit {
    let argv0 = args.first().map(String::as_str).unwrap_or("calico");
    // Calico's CNI image runs its installer as /opt/cni/bin/install: this
    // executable under that name is `calico install`.
    if Path::new(argv0).file_name().is_some_and(|n| n == "install") {
        return crate::cli::install::run(args.get(1..).unwrap_or_default(), &vars, true).into();
    }
    // Under another name, with a runtime's CNI_COMMAND: the config read
    // below says which plugin is meant (`Personality::from_config`).
    let renamed = Personality::from_argv0(argv0).is_err() && vars.contains_key("CNI_COMMAND");
    let mut personality = match Personality::from_argv0(argv0) {
        Ok(p) => p,
        Err(_) if renamed => Personality::Calico,
        Err(e) => {
            let mut exit = Exit::error(&e, version::CURRENT);
            exit.stderr = format!("{e}\n");
            return exit;
        }
    };
    let flags = match flags::parse(personality, args.get(1..).unwrap_or_default()) {
        Ok(f) => f,
        // Help asked for: on stdout, exit 0. A command line the flags
        // refuse: Go's message and where the help is, exit 2.
        Err(flags::Refused::Help) => return Exit::ok(help(personality)),
        Err(flags::Refused::Usage(problem)) => {
            let command = match personality {
                Personality::Calico => "calico",
                Personality::CalicoIpam => "calico-ipam",
            };
            return crate::cli::Outcome::usage_error(&format!("{command} -h"), &problem).into();
        }
    };
    if flags.version {
        return Exit::ok(version_text());
    }
    // The operator's subcommands (the calico-ipam personality has none):
    // `calico ipam ...` outside a CNI call. Under a runtime (CNI_COMMAND
    // set) every argument after the flags is ignored, as Calico's binary
    // ignores it.
    let operator = !vars.contains_key("CNI_COMMAND") && args.get(1) == flags.rest.first();
    if personality == Personality::Calico && operator {
        match flags.rest.first().map(String::as_str) {
            Some("ipam") => return crate::cli::run(&flags.rest[1..], &vars).into(),
            Some("install") => {
                return crate::cli::install::run(&flags.rest[1..], &vars, false).into();
            }
            Some("status") => return crate::cli::status_command(&flags.rest[1..], &vars).into(),
            Some("help") => return Exit::ok(help(personality)),
            _ => {}
        }
    }
    if flags.test_connection {
        return test_connection(stdin, &vars);
    }
    if flags.upgrade {
        return crate::cli::ipam_upgrade::run(&vars).into();
    }

    let env = match CniEnv::from_vars(vars) {
        Ok(Invocation::About) => {
            return Exit {
                stderr: personality.about(),
                ..Exit::default()
            };
        }
        Ok(Invocation::Command(env)) => *env,
        Err(e) => return Exit::error(&e, version::CURRENT),
    };
    if env.command == Command::Version {
        let mut out = version::version_reply().to_string();
        out.push('\n');
        return Exit::ok(out);
    }

    let mut input = Vec::new();
    if let Err(e) = stdin.read_to_end(&mut input) {
        return Exit::error(&Error::io("error reading from stdin", e), version::CURRENT);
    }
    let label = reply_version(&input);
    if renamed {
        personality = Personality::from_config(argv0, &input);
    }
    let request = match Request::new(env, &input) {
        Ok(r) => r,
        Err(e) => return Exit::error(&e, &label),
    };
    logging::init(&LogSettings {
        level: request.conf.log_level.clone(),
        file: request.conf.log_file_path.clone(),
        max_size_mb: request.conf.log_file_max_size,
        max_age_days: request.conf.log_file_max_age,
        max_count: request.conf.log_file_max_count,
    });
    tracing::debug!(
        command = request.env.command.as_str(),
        container = %request.env.container_id,
        netns = %request.env.netns,
        ifname = %request.env.ifname,
        config = %crate::cni::config::redacted(&request.raw),
        "invoked"
    );

    let version = request.version;
    // Every ADD and DEL, whichever its outcome, may change what STATUS
    // answers (an address taken or freed): its next call checks afresh.
    let changes_status = matches!(request.env.command, Command::Add | Command::Del)
        .then(|| crate::plugin::status_cache::Cache::of(&request.conf));
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            return Exit::error(&Error::internal_caused("cannot start runtime", e), &label);
        }
    };
    let outcome = runtime.block_on(dispatch(personality, request));
    if let Some(cache) = changes_status {
        cache.invalidate();
    }
    shut_down(runtime);
    match outcome.and_then(|result| print_result(result, version)) {
        Ok(stdout) => Exit::ok(stdout),
        Err(e) => Exit::error(&e, &label),
    }
}

/// Threads of the runtime's blocking pool (tokio's default is 512). A call
/// makes a thread for each blocking task that finds none idle, and its
/// short tasks come in bursts: with no bound, six or seven threads were
/// made and torn down per ADD. Two keep one free for the datastore while
/// the other waits on the kernel (a DEL's interface deletion): 0.45 ms
/// less CPU per plain ADD (5.05 -> 4.57 ms, `perf stat` over 80).
const BLOCKING_THREADS: usize = 2;

/// The call's runtime: one thread, and a small blocking pool; the thread
/// waits awake a moment for work it handed off before it sleeps
/// ([`crate::handoff`]).
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(BLOCKING_THREADS)
        .on_thread_park(crate::handoff::before_park)
        .build()
}

/// Ends the call's runtime before its answer is printed. Dropping it would
/// wake each idle thread of the blocking pool, join it and unmap its
/// stack (with the TLB shootdowns that takes while other threads run),
/// all before the answer: about 6% of a plain ADD. When no blocking work
/// is running (everything the call handed off was answered) the idle
/// threads are left to the process's exit. Work a call stopped waiting for
/// at a deadline is still let finish, within the cleanup budget.
fn shut_down(runtime: tokio::runtime::Runtime) {
    if crate::handoff::blocking_work_running() {
        runtime.shutdown_timeout(crate::plugin::context::CLEANUP_GRACE);
    } else {
        runtime.shutdown_background();
    }
}

fn print_result(result: Option<crate::cni::CniResult>, version: Version) -> Result<String> {
    Ok(match result {
        Some(r) => {
            let mut s = to_pretty_json(&r.to_version(version)?);
            s.push('\n');
            s
        }
        None => String::new(),
    })
}

/// `calico -t`: the network config on stdin (a conflist: its calico
/// plugin), its datastore probed; exit 0 and no output when it answers,
/// else Calico's "data store connection failed" error (code 100); with
/// nothing on stdin, "no network config on stdin" (code 7, invalid
/// network config).
fn test_connection(stdin: &mut dyn Read, vars: &HashMap<String, String>) -> Exit {
    let failed = |e: &Error| {
        let reply = crate::cni::error::PluginError {
            cni_version: Some(version::CURRENT.to_string()),
            code: crate::cni::error::code::DATASTORE,
            msg: "data store connection failed".into(),
            details: e.to_string(),
        };
        Exit::error(&Error::Delegated(reply), version::CURRENT)
    };
    let mut input = Vec::new();
    if let Err(e) = stdin.read_to_end(&mut input) {
        return failed(&Error::io("error reading from stdin", e));
    }
    if input.trim_ascii().is_empty() {
        // Nothing to test: not a datastore failure (Calico's says "data
        // store connection failed", of an empty config).
        let reply = crate::cni::error::PluginError {
            cni_version: Some(version::CURRENT.to_string()),
            code: crate::cni::error::code::INVALID_CONFIG,
            msg: "no network config on stdin".into(),
            details: "calico -t tests the datastore of the network config it reads from stdin: \
                      calico -t < /etc/cni/net.d/10-calico.conflist"
                .into(),
        };
        return Exit::error(&Error::Delegated(reply), version::CURRENT);
    }
    let conf = crate::cni::request::decode_config(&input).and_then(|raw| {
        let plugin = match raw.get("plugins").and_then(Value::as_array) {
            Some(plugins) => plugins
                .iter()
                .find(|p| p.get("type").and_then(Value::as_str) == Some("calico"))
                .cloned()
                .ok_or_else(|| Error::invalid_config("the conflist has no calico plugin"))?,
            None => raw,
        };
        crate::cni::NetConf::from_value(&plugin)
    });
    let conf = match conf {
        Ok(c) => c,
        Err(e) => return failed(&e),
    };
    logging::init(&LogSettings {
        level: conf.log_level.clone(),
        file: conf.log_file_path.clone(),
        max_size_mb: conf.log_file_max_size,
        max_age_days: conf.log_file_max_age,
        max_count: conf.log_file_max_count,
    });
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(e) => return failed(&Error::internal_caused("cannot start runtime", e)),
    };
    match runtime.block_on(crate::plugin::connection::test_connection(&conf, vars)) {
        Ok(()) => Exit::default(),
        Err(e) => failed(&e),
    }
}

async fn dispatch(personality: Personality, req: Request) -> Result<Option<crate::cni::CniResult>> {
    match personality {
        Personality::Calico => crate::plugin::handle(req).await,
        Personality::CalicoIpam => crate::ipam::handle(req).await,
    }
}
