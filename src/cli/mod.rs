//! The operator subcommands of the `calico` executable (never of its
//! `calico-ipam` personality): `calico ipam pool add|list|remove`, on the
//! datastore a network config names ([`netconf`]), with Calico's IPPool
//! rules ([`pool`]); `calico ipam queue list|replay`, the node's release
//! queue and its dead letters ([`queue`]).
//!
//! Output goes to stdout; a failure is one line on stderr and exit 1 (and
//! nothing on stdout); bad usage prints the usage to stderr, exit 2.

pub mod install;
pub mod netconf;
pub mod pool;
pub mod queue;

use std::collections::HashMap;
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

pool: manages Calico IP pools in the datastore the network config names.
The config is CONFLIST, else the first .conf, .conflist or .json file, in
lexical order, of /etc/cni/net.d (CNI_CONF_DIR names another directory);
in a list, the plugin of type \"calico\" is used.

queue: the releases owed by DELs on this node that could not reach their
datastore (the config's release_queue_dir, else DIR). `list` shows them
(--dead: the dead letters, entries given up on); `replay` runs each owed
DEL once now, due or not (--dead: the dead letters, put back in the queue
first), each with its own recorded config; CONTAINER_IDs pick entries.

Options:
  --block-size N       block size: 20-32 for IPv4 (default 26), 116-128 for IPv6 (default 122)
  --disabled           create the pool disabled: no address is assigned from it
  -o, --output FORMAT  table (the default) or json (an IPPoolList)
  --config CONFLIST    the network config (.conflist, .conf or .json)
  --dir DIR            the release queue's directory (queue commands)
  --dead               the dead letters (queue commands)
  -h, --help           print this help
";

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
    fn failed(what: &str, message: &str) -> Outcome {
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

    /// The problem and the usage on stderr, exit 2.
    fn usage(problem: &str) -> Outcome {
        Outcome {
            stderr: format!("calico ipam: {problem}\n\n{USAGE}"),
            code: 2,
            ..Outcome::default()
        }
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
        let value = match inline {
            Some(v) => v,
            None => rest
                .next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))?,
        };
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
    let outcome = runtime.block_on(async {
        let work = async {
            let opened = open(&conf, vars, deadline, None, || async {
                Ok(K8sClient::new(&conf.k8s_config(), deadline).await?)
            })
            .await
            .map_err(|e| format!("opening the datastore: {e}"))?;
            let store = opened.store.as_ref();
            match &cli {
                Cli::Add { add, .. } => pool::add(store, add).await,
                Cli::List { json, .. } => pool::list(store, *json).await,
                Cli::Remove { name, .. } => pool::remove(store, name).await,
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
        assert!(out.stderr.contains("Usage:"), "{}", out.stderr);
    }

    #[test]
    fn a_failure_is_one_line() {
        let out = Outcome::failed("calico ipam pool add", "first\n  second\n");
        assert_eq!(out.stderr, "calico ipam pool add: first; second\n");
        assert_eq!(out.code, 1);
    }
}
