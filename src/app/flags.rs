//! The command line as Calico's binaries read it: Go's `flag` package on a
//! flag set of its own per personality (`calico`: `-v`, `-t`;
//! `calico-ipam`: `-v`, `-upgrade`). As Go does it: one or two dashes,
//! `-flag`, `-flag=value` (booleans take `1 t T TRUE true True 0 f F FALSE
//! false False`), parsing stops at the first argument that is not a flag
//! (`-` is not one) and after `--`, and everything after is left alone: a
//! runtime or a tool that passes the network config as an argument gets a
//! plugin that ignores it, as Calico's does. `-h`/`-help` print the usage
//! (on stdout, exit 0); anything else that looks like a flag and is not one
//! is a usage error (exit 2), with Go's messages.

use super::Personality;

/// What the flags asked for.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Flags {
    /// `-v`: print the version.
    pub version: bool,
    /// `-t` (`calico`): test the datastore connection.
    pub test_connection: bool,
    /// `-upgrade` (`calico-ipam`): migrate from host-local.
    pub upgrade: bool,
    /// The arguments after the flags (ignored by the plugin; the
    /// operator's subcommands read them).
    pub rest: Vec<String>,
}

/// A command line the flags refuse, or a request for help.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// `-h`, `-help`: the usage, exit 0.
    Help,
    /// Go's message; where the help is follows it, exit 2.
    Usage(String),
}

/// Go's `flag` usage text for a personality's flag set.
pub fn usage(p: Personality) -> String {
    match p {
        Personality::Calico => {
            "Usage of Calico:\n  -t\tTest datastore connection\n  -v\tDisplay version\n".into()
        }
        Personality::CalicoIpam => {
            "Usage of calico-ipam:\n  -upgrade\n    \tUpgrade from host-local\n  -v\tDisplay version\n"
                .into()
        }
    }
}

fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Parses argv after argv[0] for personality `p`.
pub fn parse(p: Personality, args: &[String]) -> Result<Flags, Refused> {
    let mut flags = Flags::default();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        if arg.len() < 2 || !arg.starts_with('-') {
            break;
        }
        i += 1;
        let mut name = &arg[1..];
        if let Some(rest) = name.strip_prefix('-') {
            if rest.is_empty() {
                // "--" ends the flags.
                break;
            }
            name = rest;
        }
        if name.is_empty() || name.starts_with('-') || name.starts_with('=') {
            return Err(Refused::Usage(format!("bad flag syntax: {arg}")));
        }
        let (name, value) = match name.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (name, None),
        };
        let slot = match (p, name) {
            (_, "v") => &mut flags.version,
            (Personality::Calico, "t") => &mut flags.test_connection,
            (Personality::CalicoIpam, "upgrade") => &mut flags.upgrade,
            (_, "h" | "help") => return Err(Refused::Help),
            _ => {
                return Err(Refused::Usage(format!(
                    "flag provided but not defined: -{name}"
                )));
            }
        };
        *slot = match value {
            None => true,
            Some(v) => parse_bool(v).ok_or_else(|| {
                Refused::Usage(format!(
                    "invalid boolean value {v:?} for -{name}: parse error"
                ))
            })?,
        };
    }
    flags.rest = args[i..].to_vec();
    Ok(flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calico(line: &str) -> Result<Flags, Refused> {
        let args: Vec<String> = line.split_whitespace().map(String::from).collect();
        parse(Personality::Calico, &args)
    }

    fn ipam(line: &str) -> Result<Flags, Refused> {
        let args: Vec<String> = line.split_whitespace().map(String::from).collect();
        parse(Personality::CalicoIpam, &args)
    }

    fn rest(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags_as_go_reads_them() {
        assert_eq!(calico(""), Ok(Flags::default()));
        for line in ["-v", "--v", "-v=true", "--v=1", "-v=T"] {
            assert!(calico(line).unwrap().version, "{line}");
        }
        assert!(!calico("-v=false").unwrap().version);
        assert!(!calico("-v=0").unwrap().version);
        let f = calico("-t -v").unwrap();
        assert!(f.test_connection && f.version);
        assert!(ipam("-upgrade").unwrap().upgrade);
        assert!(!ipam("-upgrade=False").unwrap().upgrade);
    }

    #[test]
    fn the_first_non_flag_ends_the_flags_and_the_rest_is_kept() {
        let f = calico("/etc/cni/net.d/10-calico.conflist -v").unwrap();
        assert!(!f.version);
        assert_eq!(f.rest, rest(&["/etc/cni/net.d/10-calico.conflist", "-v"]));
        let f = calico("-v foo -bogus").unwrap();
        assert!(f.version);
        assert_eq!(f.rest, rest(&["foo", "-bogus"]));
        assert_eq!(calico("- -v").unwrap().rest, rest(&["-", "-v"]));
        let f = calico("-- -v").unwrap();
        assert!(!f.version);
        assert_eq!(f.rest, rest(&["-v"]));
        assert_eq!(calico("ipam pool list").unwrap().rest.len(), 3);
    }

    #[test]
    fn refusals_carry_gos_messages() {
        assert_eq!(calico("-h"), Err(Refused::Help));
        assert_eq!(calico("--help"), Err(Refused::Help));
        assert_eq!(ipam("-help=x"), Err(Refused::Help));
        assert_eq!(
            calico("-bogus"),
            Err(Refused::Usage(
                "flag provided but not defined: -bogus".into()
            ))
        );
        // Each personality has its own flags.
        assert_eq!(
            calico("-upgrade"),
            Err(Refused::Usage(
                "flag provided but not defined: -upgrade".into()
            ))
        );
        assert_eq!(
            ipam("-t"),
            Err(Refused::Usage("flag provided but not defined: -t".into()))
        );
        assert_eq!(
            ipam("-upgrade=maybe"),
            Err(Refused::Usage(
                "invalid boolean value \"maybe\" for -upgrade: parse error".into()
            ))
        );
        assert_eq!(
            calico("---v"),
            Err(Refused::Usage("bad flag syntax: ---v".into()))
        );
        assert_eq!(
            calico("-=v"),
            Err(Refused::Usage("bad flag syntax: -=v".into()))
        );
    }
}
