//! The operator subcommands of the `calico` executable (never of its
//! `calico-ipam` personality): `calico ipam pool add|list|remove`, on the
//! datastore a network config names ([`netconf`]), with Calico's IPPool
//! rules ([`pool`]); `calico ipam queue list|replay`, the node's release
//! queue and its dead letters ([`queue`]).
//!
//! Output goes to stdout (help included); a failure is one line on stderr
//! and exit 1 (and nothing on stdout); bad usage is the problem and where
//! the help is, two lines on stderr, exit 2.

pub mod install;
pub mod ipam_check;
pub mod ipam_inventory;
pub mod ipam_release;
pub mod ipam_show;
pub mod ipam_upgrade;
pub mod netconf;
pub mod pool;
pub mod progress;
pub mod queue;
pub mod status;

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

use crate::datastore::open::open;
use crate::k8s::K8sClient;

/// How long one subcommand may take, datastore waits included.
pub const DEADLINE: Duration = Duration::from_secs(30);

pub const USAGE: &str = "\
Usage:
  calico ipam pool add NAME CIDR [--block-size N] [--disabled] [--config CONFLIST]
  calico ipam pool list [-o table|json] [--config CONFLIST]
  calico ipam pool remove NAME [--config CONFLIST]
  calico ipam queue list [--dead] [-o table|json] [--config CONFLIST | --dir DIR]
  calico ipam queue replay [--dead] [CONTAINER_ID...] [--config CONFLIST | --dir DIR]
  calico ipam show [--show-blocks | --ip ADDR] [-o table|json] [--config CONFLIST]
  calico ipam check [--show-problem-ips] [--show-all-ips] [-o table|json] [--report FILE] [--config CONFLIST]
  calico ipam release (--ip ADDR | --from-report FILE...) [--force] [--config CONFLIST]

pool: manages Calico IP pools in the datastore the network config names.
The config is CONFLIST, else the first .conf, .conflist or .json file, in
lexical order, of /etc/cni/net.d (CNI_CONF_DIR names another directory);
in a list, the plugin of type \"calico\" is used.

queue: the releases owed by DELs on this node that could not reach their
datastore (the config's release_queue_dir, else DIR). `list` shows them
(--dead: the dead letters, entries given up on); `replay` runs each owed
DEL once now, due or not (--dead: the dead letters, put back in the queue
first), each with its own recorded config; CONTAINER_IDs pick entries.

show: how full each IP pool (--show-blocks: and each block) is, or who
holds one address (--ip), as calicoctl ipam show prints it.

check: calicoctl's IPAM check — addresses allocated but used by no
workload or node (leaked), addresses in use without an allocation, handles
holding nothing, allocations naming a missing handle — and also blocks
affine to a node that does not exist, soft-deleted objects left stored and
this node's dead letters. -o json prints calicoctl's JSON report instead
of the text; --report FILE writes it to FILE (calicoctl's `ipam check -o
FILE`); exit 0 however many problems are found.

release: --ip frees one address, whoever holds it. --from-report frees the
addresses and deletes the handles every report found leaked, each only if
unchanged since; the reports must be of this cluster and one as new as its
ClusterInformation, and the datastore locked (datastoreReady false) unless
--force.

Options:
  --block-size N       block size: 20-32 for IPv4 (default 26), 116-128 for IPv6 (default 122)
  --disabled           create the pool disabled: no address is assigned from it
  -o, --output FORMAT  table (the default) or json (pool list: an IPPoolList; check: the report)
  --config CONFLIST    the network config (.conflist, .conf or .json)
  --dir DIR            the release queue's directory (queue commands)
  --dead               the dead letters (queue commands)
  --show-blocks        each block's usage too (show)
  --ip ADDR            one address (show, release)
  --show-problem-ips   each problem address (check)
  --show-all-ips       each allocation and handle too (check)
  --report FILE        write the JSON report to FILE (check)
  --from-report FILE   a report of check (release; repeatable)
  --force              release although the datastore is not locked
  -h, --help           print this help
";

/// The operator's subcommands, after Calico's flags in `calico --help`.
pub const OVERVIEW: &str = "\
Subcommands (outside a CNI call: without CNI_COMMAND in the environment):
  calico install [--watch] [...]       put this plugin on a node as Calico's install-cni does:
                                       binaries, the network config, the CNI kubeconfig, and
                                       (--watch) its token renewed (calico install --help)
  calico ipam pool|queue|show|check|release ...
                                       IP pools, the release queue, IPAM usage, consistency
                                       check and repair (calico ipam --help)
  calico status [--config CONFLIST]    a network's STATUS in words, with the release queue
  calico help                          this help

As a CNI plugin it answers ADD, DEL, CHECK, STATUS, GC and VERSION (CNI_COMMAND, the
network config on stdin); as calico-ipam (a link of that name) it is Calico's IPAM plugin.
";

const STATUS_USAGE: &str = "\
Usage:
  calico status [--config CONFLIST]

Runs the STATUS verb of the network config's calico plugin, as a runtime
does, and says what it found: ready, or not ready and why (the datastore,
its credentials and their expiry, the IPAM's capacity for this node); and
how many releases earlier DELs still owe. Exit 0 when ready, 1 when not.
A runtime asks STATUS only of a config of cniVersion 1.1.0 or later: for
an older one the checks are made all the same and reported as such, never
as ready (exit 3 when they pass, 1 when they fail). The config is
CONFLIST, else the first config file of /etc/cni/net.d (CNI_CONF_DIR names
another directory).
";

/// `calico status ARGS...`.
pub fn status_command(args: &[String], vars: &HashMap<String, String>) -> Outcome {
    let mut config = None;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "-h" | "--help" | "help" => return Outcome::ok(STATUS_USAGE.to_string()),
            "--config" => match rest.next() {
                Some(v) => config = Some(PathBuf::from(v)),
                None => return status_usage("--config needs a value"),
            },
            other => match other.strip_prefix("--config=") {
                Some(v) => config = Some(PathBuf::from(v)),
                None => return status_usage(&format!("unknown argument {other:?}")),
            },
        }
    }
    status::run(config.as_deref(), vars)
}

fn status_usage(problem: &str) -> Outcome {
    Outcome::usage_error("calico status --help", &format!("calico status: {problem}"))
}

/// What the subcommand prints and how the process exits.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub stdout: String,
    pub stderr: String,
    pub code: i32,
}

impl Outcome {
    fn ok(stdout: String) -> Outcome {
        Outcome {
            stdout,
            ..Outcome::default()
        }
    }

    /// One line on stderr, exit 1.
    pub(crate) fn failed(what: &str, message: &str) -> Outcome {
        let line: Vec<&str> = message
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        Outcome {
            stderr: format!("{what}: {}\n", line.join("; ")),
            code: 1,
            ..Outcome::default()
        }
    }

    /// A usage error: the problem and where the help is (`help`: the
    /// command that prints it), on stderr, exit 2.
    pub(crate) fn usage_error(help: &str, problem: &str) -> Outcome {
        Outcome {
            stderr: format!("{problem}\nRun '{help}' for usage.\n"),
            code: 2,
            ..Outcome::default()
        }
    }

    /// A usage error of `calico ipam`.
    fn usage(problem: &str) -> Outcome {
        Outcome::usage_error("calico ipam --help", &format!("calico ipam: {problem}"))
    }
}

/// A parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cli {
    Help,
    Add {
        add: pool::AddArgs,
        config: Option<PathBuf>,
    },
    List {
        json: bool,
        config: Option<PathBuf>,
    },
    Remove {
        name: String,
        config: Option<PathBuf>,
    },
    QueueList {
        json: bool,
        dead: bool,
        place: queue::Place,
    },
    QueueReplay {
        dead: bool,
        containers: Vec<String>,
        place: queue::Place,
    },
    Show {
        blocks: bool,
        ip: Option<IpAddr>,
        json: bool,
        config: Option<PathBuf>,
    },
    Check {
        show: ipam_check::Show,
        json: bool,
        report: Option<PathBuf>,
        config: Option<PathBuf>,
    },
    Release {
        ip: Option<IpAddr>,
        reports: Vec<String>,
        force: bool,
        config: Option<PathBuf>,
    },
}

/// A flag's value: given inline (`--flag=value`), else the next argument.
fn flag_value<'a>(
    flag: &str,
    inline: Option<String>,
    rest: &mut impl Iterator<Item = &'a String>,
) -> Result<String, String> {
    match inline {
        Some(v) => Ok(v),
        None => rest
            .next()
            .cloned()
            .ok_or_else(|| format!("{flag} needs a value")),
    }
}

/// Parses `show|check|release …` (calicoctl's flags, `--flag=value` or
/// `--flag value`).
fn parse_tool(noun: &str, args: &[String]) -> Result<Cli, String> {
    let (mut blocks, mut problems, mut all, mut force) = (false, false, false, false);
    let (mut ip, mut output, mut config, mut reports) = (None, None, None, Vec::new());
    let mut report = None;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with('-') => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let switch = match (noun, flag) {
            ("show", "--show-blocks") => Some(&mut blocks),
            ("check", "--show-problem-ips") => Some(&mut problems),
            ("check", "--show-all-ips") => Some(&mut all),
            ("release", "--force") => Some(&mut force),
            _ => None,
        };
        if let Some(switch) = switch {
            if inline.is_some() {
                return Err(format!("{flag} takes no value"));
            }
            *switch = true;
            continue;
        }
        let known = matches!(
            (noun, flag),
            ("show" | "release", "--ip")
                | ("show" | "check", "-o" | "--output")
                | ("release", "--from-report")
                | ("check", "--report")
                | (_, "--config")
        );
        if !known {
            return Err(format!("unknown flag {flag:?} for {noun}"));
        }
        let value = flag_value(flag, inline, &mut rest)?;
        match flag {
            "--ip" => {
                ip = Some(
                    value
                        .parse::<IpAddr>()
                        .map_err(|_| format!("invalid IP address specified: {value}"))?,
                );
            }
            "-o" | "--output" => output = Some(value),
            "--from-report" => reports.push(value),
            "--report" => report = Some(PathBuf::from(value)),
            _ => config = Some(PathBuf::from(value)),
        }
    }
    let json = match output.as_deref() {
        None | Some("table") => false,
        Some("json") => true,
        Some(other) if noun == "check" => {
            return Err(format!(
                "unknown output format {other:?} (table, json; --report FILE writes the report to a file)"
            ));
        }
        Some(other) => return Err(format!("unknown output format {other:?} (table, json)")),
    };
    match noun {
        "show" => {
            if blocks && ip.is_some() {
                return Err("give --show-blocks or --ip, not both".into());
            }
            Ok(Cli::Show {
                blocks,
                ip,
                json,
                config,
            })
        }
        "check" => Ok(Cli::Check {
            show: ipam_check::Show {
                problem_ips: problems,
                all_ips: all,
            },
            json,
            report,
            config,
        }),
        _ => match (ip.is_some(), reports.is_empty()) {
            (true, false) => Err("give --ip or --from-report, not both".into()),
            (false, true) => Err("release needs --ip ADDR or --from-report FILE".into()),
            _ => Ok(Cli::Release {
                ip,
                reports,
                force,
                config,
            }),
        },
    }
}

/// The options a verb takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Opt {
    BlockSize,
    Disabled,
    Output,
    Config,
    Dir,
    Dead,
}

fn option_of(flag: &str) -> Option<Opt> {
    match flag {
        "--block-size" => Some(Opt::BlockSize),
        "--disabled" => Some(Opt::Disabled),
        "-o" | "--output" => Some(Opt::Output),
        "--config" => Some(Opt::Config),
        "--dir" => Some(Opt::Dir),
        "--dead" => Some(Opt::Dead),
        _ => None,
    }
}

/// Parses what follows `calico ipam`; `Err` is a usage problem.
pub fn parse(args: &[String]) -> Result<Cli, String> {
    let help_word = |i: usize| args.get(i).is_some_and(|a| a == "help");
    if help_word(0) || help_word(1) || args.iter().any(|a| a == "-h" || a == "--help") {
        return Ok(Cli::Help);
    }
    if let Some(noun @ ("show" | "check" | "release")) = args.first().map(String::as_str) {
        return parse_tool(noun, &args[1..]);
    }
    let (Some(noun), Some(verb)) = (args.first(), args.get(1)) else {
        return Err(match args.first().map(String::as_str) {
            Some("pool") => "missing a pool command (add, list, remove)".into(),
            Some("queue") => "missing a queue command (list, replay)".into(),
            Some(noun) => format!("unknown command {noun:?}"),
            None => "missing a command".into(),
        });
    };
    let allowed: &[Opt] = match (noun.as_str(), verb.as_str()) {
        ("pool", "add") => &[Opt::BlockSize, Opt::Disabled, Opt::Config],
        ("pool", "list" | "ls") => &[Opt::Output, Opt::Config],
        ("pool", "remove" | "rm" | "delete") => &[Opt::Config],
        ("pool", other) => return Err(format!("unknown pool command {other:?}")),
        ("queue", "list" | "ls") => &[Opt::Output, Opt::Config, Opt::Dir, Opt::Dead],
        ("queue", "replay") => &[Opt::Config, Opt::Dir, Opt::Dead],
        ("queue", other) => return Err(format!("unknown queue command {other:?}")),
        (other, _) => return Err(format!("unknown command {other:?}")),
    };

    let mut positional = Vec::new();
    let (mut block_size, mut disabled, mut output, mut config) = (None, false, None, None);
    let (mut dir, mut dead) = (None, false);
    let mut rest = args[2..].iter();
    while let Some(arg) = rest.next() {
        if !arg.starts_with('-') || arg == "-" {
            positional.push(arg.clone());
            continue;
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") || f == "-o" => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let opt = option_of(flag)
            .filter(|o| allowed.contains(o))
            .ok_or_else(|| format!("unknown flag {flag:?} for {noun} {verb}"))?;
        if matches!(opt, Opt::Disabled | Opt::Dead) {
            if inline.is_some() {
                return Err(format!("{flag} takes no value"));
            }
            if opt == Opt::Dead {
                dead = true;
            } else {
                disabled = true;
            }
            continue;
        }
        let value = flag_value(flag, inline, &mut rest)?;
        match opt {
            Opt::BlockSize => {
                let n = value
                    .parse::<u32>()
                    .map_err(|_| format!("--block-size {value:?} is not a number"))?;
                block_size = Some(n);
            }
            Opt::Output => output = Some(value),
            Opt::Config => config = Some(PathBuf::from(value)),
            Opt::Dir => dir = Some(PathBuf::from(value)),
            Opt::Disabled | Opt::Dead => unreachable!("handled above"),
        }
    }

    let want = |n: usize, what: &str| {
        if positional.len() == n {
            Ok(())
        } else if positional.len() < n {
            Err(format!("{noun} {verb} needs {what}"))
        } else {
            Err(format!(
                "{noun} {verb} takes {what}, not {:?}",
                &positional[n..]
            ))
        }
    };
    let json_output = |output: Option<&str>| match output {
        None | Some("table" | "wide") => Ok(false),
        Some("json") => Ok(true),
        Some(other) => Err(format!("unknown output format {other:?} (table, json)")),
    };
    if noun == "queue" {
        let place = match (config, dir) {
            (Some(_), Some(_)) => return Err("give --config or --dir, not both".into()),
            (_, Some(dir)) => queue::Place::Dir(dir),
            (config, None) => queue::Place::Config(config),
        };
        return if verb == "replay" {
            Ok(Cli::QueueReplay {
                dead,
                containers: positional,
                place,
            })
        } else {
            want(0, "no arguments")?;
            Ok(Cli::QueueList {
                json: json_output(output.as_deref())?,
                dead,
                place,
            })
        };
    }
    match verb.as_str() {
        "add" => {
            want(2, "NAME and CIDR")?;
            Ok(Cli::Add {
                add: pool::AddArgs {
                    name: positional[0].clone(),
                    cidr: positional[1].clone(),
                    block_size,
                    disabled,
                },
                config,
            })
        }
        "list" | "ls" => {
            want(0, "no arguments")?;
            Ok(Cli::List {
                json: json_output(output.as_deref())?,
                config,
            })
        }
        _ => {
            want(1, "NAME")?;
            Ok(Cli::Remove {
                name: positional[0].clone(),
                config,
            })
        }
    }
}

/// Runs `calico ipam ARGS...`; `vars` is the environment (CNI_CONF_DIR).
pub fn run(args: &[String], vars: &HashMap<String, String>) -> Outcome {
    let cli = match parse(args) {
        Ok(cli) => cli,
        Err(problem) => return Outcome::usage(&problem),
    };
    let (what, config) = match &cli {
        Cli::Help => return Outcome::ok(USAGE.to_string()),
        Cli::Add { config, .. } => ("calico ipam pool add", config),
        Cli::List { config, .. } => ("calico ipam pool list", config),
        Cli::Remove { config, .. } => ("calico ipam pool remove", config),
        Cli::Show { config, .. } => ("calico ipam show", config),
        Cli::Check { config, .. } => ("calico ipam check", config),
        Cli::Release { config, .. } => ("calico ipam release", config),
        Cli::QueueList { json, dead, place } => {
            return queue::list(place, vars, *json, *dead).map_or_else(
                |e| Outcome::failed("calico ipam queue list", &e),
                Outcome::ok,
            );
        }
        Cli::QueueReplay {
            dead,
            containers,
            place,
        } => {
            return match queue::replay(place, vars, *dead, containers) {
                Ok((stdout, true)) => Outcome::ok(stdout),
                Ok((stdout, false)) => Outcome {
                    stdout,
                    stderr: "calico ipam queue replay: some releases failed again\n".into(),
                    code: 1,
                },
                Err(e) => Outcome::failed("calico ipam queue replay", &e),
            };
        }
    };
    let conf = match netconf::load(config.as_deref(), vars) {
        Ok(conf) => conf,
        Err(e) => return Outcome::failed(what, &e),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return Outcome::failed(what, &format!("cannot start the runtime: {e}")),
    };
    let deadline = Instant::now() + DEADLINE;
    // On stderr, what show and check are doing (the others say nothing).
    let progress = progress::Progress::stderr(what);
    let outcome = runtime.block_on(async {
        let work = async {
            let k8s = std::sync::OnceLock::new();
            let opened = open(&conf, vars, deadline, None, || async {
                let client = K8sClient::new(&conf.k8s_config(), deadline).await?;
                let _ = k8s.set(client.clone());
                Ok(client)
            })
            .await
            .map_err(|e| format!("opening the datastore: {e}"))?;
            let store = opened.store.as_ref();
            let inventory = || ipam_inventory::Inventory::read(&opened, k8s.get(), &progress);
            match &cli {
                Cli::Add { add, .. } => pool::add(store, add).await,
                Cli::List { json, .. } => pool::list(store, *json).await,
                Cli::Remove { name, .. } => pool::remove(store, name).await,
                Cli::Show {
                    blocks, ip, json, ..
                } => {
                    let inv = inventory().await?;
                    Ok(pool::Report::from(match ip {
                        Some(ip) => ipam_show::address(&inv, *ip, *json),
                        None => ipam_show::usage(&inv, *blocks, *json, &progress),
                    }))
                }
                Cli::Check {
                    show, json, report, ..
                } => {
                    let inv = inventory().await?;
                    let dead: Vec<_> =
                        crate::plugin::journal::Journal::new(conf.release_queue_dir())
                            .dead()
                            .into_iter()
                            .map(|(_, owed)| owed)
                            .collect();
                    let version = env!("CARGO_PKG_VERSION");
                    let checked = ipam_check::check(&inv, &dead, *show, version, &progress);
                    let mut text =
                        serde_json::to_string_pretty(&checked.report).map_err(|e| e.to_string())?;
                    text.push('\n');
                    if let Some(p) = report {
                        install::files::write(p, text.as_bytes(), 0o644)
                            .map_err(|e| format!("writing the report: {e}"))?;
                    }
                    Ok(pool::Report::from(if *json { text } else { checked.text }))
                }
                Cli::Release {
                    ip, reports, force, ..
                } => match ip {
                    Some(ip) => ipam_release::address(store, *ip)
                        .await
                        .map(pool::Report::from),
                    None => {
                        let read = reports
                            .iter()
                            .map(|p| ipam_release::read_report(p).map(|r| (p.clone(), r)))
                            .collect::<Result<Vec<_>, _>>()?;
                        let (stdout, stderr) = ipam_release::from_reports(
                            store,
                            &read,
                            *force,
                            env!("CARGO_PKG_VERSION"),
                        )
                        .await?;
                        Ok(pool::Report { stdout, stderr })
                    }
                },
                _ => unreachable!("answered above"),
            }
        };
        match tokio::time::timeout_at(deadline, work).await {
            Ok(result) => result,
            Err(_) => Err(format!(
                "the datastore did not answer within {} s",
                DEADLINE.as_secs()
            )),
        }
    });
    // The status line erased (or "done" said) before the output.
    if outcome.is_ok() {
        progress.finish();
    }
    drop(progress);
    match outcome {
        Ok(report) => Outcome {
            stdout: report.stdout,
            stderr: report.stderr,
            code: 0,
        },
        Err(e) => Outcome::failed(what, &e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_the_verbs() {
        assert_eq!(
            parse(&args(
                "pool add p1 10.0.0.0/16 --block-size=24 --disabled --config /c"
            )),
            Ok(Cli::Add {
                add: pool::AddArgs {
                    name: "p1".into(),
                    cidr: "10.0.0.0/16".into(),
                    block_size: Some(24),
                    disabled: true,
                },
                config: Some("/c".into()),
            })
        );
        assert_eq!(
            parse(&args("pool add --block-size 28 p1 10.0.0.0/16")).map(|c| match c {
                Cli::Add { add, config } => (add.block_size, add.name, config),
                other => panic!("{other:?}"),
            }),
            Ok((Some(28), "p1".to_string(), None))
        );
        assert_eq!(
            parse(&args("pool list -o json")),
            Ok(Cli::List {
                json: true,
                config: None
            })
        );
        assert_eq!(
            parse(&args("pool list --output=table --config=x.conflist")),
            Ok(Cli::List {
                json: false,
                config: Some("x.conflist".into())
            })
        );
        assert_eq!(
            parse(&args("pool remove p1")),
            Ok(Cli::Remove {
                name: "p1".into(),
                config: None
            })
        );
        assert_eq!(parse(&args("pool add --help")), Ok(Cli::Help));
        // check: -o is the format, as everywhere; --report the file.
        for line in [
            "check -o json",
            "check --output=json",
            "check --output json",
        ] {
            assert!(
                matches!(
                    parse(&args(line)),
                    Ok(Cli::Check {
                        json: true,
                        report: None,
                        ..
                    })
                ),
                "{line}"
            );
        }
        assert!(matches!(
            parse(&args("check --report r.json -o table")),
            Ok(Cli::Check { json: false, report: Some(r), .. }) if r == std::path::Path::new("r.json")
        ));
        let err = parse(&args("check -o r.json")).unwrap_err();
        assert!(err.contains("--report FILE"), "{err}");
    }

    #[test]
    fn rejects_bad_usage() {
        for (line, problem) in [
            ("", "missing a command"),
            ("pool", "missing a pool command"),
            ("block list", "unknown command \"block\""),
            ("pool frob", "unknown pool command"),
            ("pool add p1", "needs NAME and CIDR"),
            ("pool add p1 10.0.0.0/16 extra", "not [\"extra\"]"),
            ("pool add p1 10.0.0.0/16 --block-size", "needs a value"),
            ("pool add p1 10.0.0.0/16 --block-size x", "is not a number"),
            ("pool add p1 10.0.0.0/16 --disabled=yes", "takes no value"),
            (
                "pool list --disabled",
                "unknown flag \"--disabled\" for pool list",
            ),
            ("pool list -o yaml", "unknown output format"),
            ("pool remove", "needs NAME"),
            ("pool remove p1 --force", "unknown flag"),
        ] {
            let err = parse(&args(line)).unwrap_err();
            assert!(err.contains(problem), "{line:?}: {err}");
        }
        let out = run(&args("pool"), &HashMap::new());
        assert_eq!(out.code, 2);
        assert!(out.stdout.is_empty());
        assert_eq!(
            out.stderr,
            "calico ipam: missing a pool command (add, list, remove)\n\
             Run 'calico ipam --help' for usage.\n"
        );
    }

    #[test]
    fn a_failure_is_one_line() {
        let out = Outcome::failed("calico ipam pool add", "first\n  second\n");
        assert_eq!(out.stderr, "calico ipam pool add: first; second\n");
        assert_eq!(out.code, 1);
    }
}
