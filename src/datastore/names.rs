//! Names derived from workload identity: WorkloadEndpoint names (calico-behaviour.md §5.2),
//! host-side interface names (calico-behaviour.md §5.3) and Mesos label sanitising (§5.4).
//!
//! Everything here is a pure function; callers pass in environment-derived
//! values (such as `FELIX_INTERFACEPREFIX`) explicitly.

use sha1::{Digest, Sha1};

/// A WorkloadEndpoint name could not be built or parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// One identifier is unusable; the message names it like Calico does.
    #[error("error with field {field} = '{value}' ({reason})")]
    InvalidField {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("cannot parse an empty WorkloadEndpoint name")]
    EmptyName,
    #[error("WorkloadEndpoint name '{name}' has {parts} parts, at most {max} expected")]
    TooManyParts {
        name: String,
        parts: usize,
        max: usize,
    },
}

const ASSIGN: &str = "field should be assigned";
const NO_LEADING_DASH: &str = "field must not begin with a '-'";
const NO_TRAILING_DASH: &str = "field must not end with a '-'";

/// Every WorkloadEndpoint name has four dash-joined segments.
const SEGMENTS: usize = 4;

/// The identity of a workload endpoint; which fields are used depends on
/// the orchestrator.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WepIdentifiers {
    pub node: String,
    pub orchestrator: String,
    pub endpoint: String,
    pub workload: String,
    pub pod: String,
    pub container_id: String,
}

impl WepIdentifiers {
    /// The full WorkloadEndpoint name; every segment must be assigned.
    pub fn name(&self) -> Result<String, NameError> {
        self.build(false)
    }

    /// The name up to the first unassigned segment, with a trailing `-`
    /// when it stops early (e.g. `node1-k8s-mypod-`). Used for lookups.
    pub fn name_prefix(&self) -> Result<String, NameError> {
        self.build(true)
    }

    /// Whether `name` is a WorkloadEndpoint name for these identifiers:
    /// same number of segments, and every assigned identifier equal to its
    /// segment (unassigned ones match anything).
    pub fn name_matches(&self, name: &str) -> bool {
        if name.len() < 2 * SEGMENTS - 1 {
            return false;
        }
        let parts = split_name(name);
        parts.len() == SEGMENTS
            && self
                .segments()
                .iter()
                .zip(&parts)
                .all(|((_, want), got)| want.is_empty() || want == got)
    }

    /// The name prefix that finds this workload's records on any
    /// interface (the endpoint left out).
    pub fn lookup_prefix(&self) -> Result<String, NameError> {
        let mut ids = self.clone();
        ids.endpoint.clear();
        ids.name_prefix()
    }

    /// [`WepIdentifiers::name_matches`] with the interface left out: a
    /// record of this workload on any interface.
    pub fn name_matches_any_interface(&self, name: &str) -> bool {
        let mut ids = self.clone();
        ids.endpoint.clear();
        ids.name_matches(name)
    }

    /// Recovers identifiers from a WorkloadEndpoint name (the inverse of
    /// [`WepIdentifiers::name`]). Missing trailing segments stay empty.
    pub fn parse(name: &str) -> Result<WepIdentifiers, NameError> {
        if name.is_empty() {
            return Err(NameError::EmptyName);
        }
        let parts = split_name(name);
        if parts.len() > SEGMENTS {
            return Err(NameError::TooManyParts {
                name: name.to_string(),
                parts: parts.len(),
                max: SEGMENTS,
            });
        }
        let mut parts = parts.into_iter();
        let mut ids = WepIdentifiers {
            node: parts.next().unwrap_or_default(),
            orchestrator: parts.next().unwrap_or_default(),
            ..WepIdentifiers::default()
        };
        let third = parts.next().unwrap_or_default();
        match ids.orchestrator.as_str() {
            "k8s" => ids.pod = third,
            "cni" => ids.container_id = third,
            _ => ids.workload = third,
        }
        ids.endpoint = parts.next().unwrap_or_default();
        Ok(ids)
    }

    /// The (field name, value) pairs making up the name, in order.
    fn segments(&self) -> [(&'static str, &str); SEGMENTS] {
        let third = match self.orchestrator.as_str() {
            "k8s" => ("pod", self.pod.as_str()),
            "cni" => ("containerID", self.container_id.as_str()),
            "libnetwork" => ("workload", "libnetwork"),
            _ => ("workload", self.workload.as_str()),
        };
        [
            ("node", self.node.as_str()),
            ("orchestrator", self.orchestrator.as_str()),
            third,
            ("endpoint", self.endpoint.as_str()),
        ]
    }

    fn build(&self, prefix_mode: bool) -> Result<String, NameError> {
        if self.node.is_empty() {
            return Err(invalid("node", "", ASSIGN));
        }
        let mut escaped = Vec::with_capacity(SEGMENTS);
        for (field, value) in self.segments() {
            if value.is_empty() {
                if prefix_mode {
                    return Ok(escaped.join("-") + "-");
                }
                return Err(invalid(field, value, ASSIGN));
            }
            if value.starts_with('-') {
                return Err(invalid(field, value, NO_LEADING_DASH));
            }
            if value.ends_with('-') {
                return Err(invalid(field, value, NO_TRAILING_DASH));
            }
            escaped.push(value.replace('-', "--"));
        }
        Ok(escaped.join("-"))
    }
}

fn invalid(field: &'static str, value: &str, reason: &'static str) -> NameError {
    NameError::InvalidField {
        field,
        value: value.to_string(),
        reason,
    }
}

/// Splits a name on single dashes, turning each `--` back into `-`. The first
/// character is never a separator (segments cannot begin with a dash).
fn split_name(name: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut chars = name.chars().peekable();
    if let Some(first) = chars.next() {
        current.push(first);
    }
    while let Some(c) = chars.next() {
        if c != '-' {
            current.push(c);
        } else if chars.next_if_eq(&'-').is_some() {
            current.push('-');
        } else {
            parts.push(std::mem::take(&mut current));
        }
    }
    parts.push(current);
    parts
}

/// Host-side interface name for a Kubernetes pod: the first entry of
/// `interface_prefix` (the `FELIX_INTERFACEPREFIX` value, `cali` when unset or
/// empty) followed by the first 11 hex digits of SHA-1(`<namespace>.<pod>`).
/// Felix computes the same name independently, so this must never change.
pub fn veth_name_for_workload(
    namespace: &str,
    pod: &str,
    interface_prefix: Option<&str>,
) -> String {
    let prefix = interface_prefix
        .and_then(|p| p.split(',').next())
        .filter(|p| !p.is_empty())
        .unwrap_or("cali");
    let digest = Sha1::digest(format!("{namespace}.{pod}").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    // SHA-1 is 20 bytes, so `hex` always has 40 digits.
    format!("{prefix}{}", &hex[..11])
}

/// Host-side interface name for a plain-CNI container: `cali` followed by
/// the first 11 characters of the container ID (all of it when shorter).
pub fn veth_name_for_container(container_id: &str) -> String {
    let head: String = container_id.chars().take(11).collect();
    format!("cali{head}")
}

/// Makes a Mesos label key or value acceptable as a Calico label: `/` becomes
/// `.`, runs of other characters outside `[-_.a-zA-Z0-9]` become one `-`,
/// runs of `.`/`-` containing a `.` become one `.`, and leading/trailing
/// `.`/`-` are removed.
pub fn sanitize_mesos_label(s: &str) -> String {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');

    let mut replaced = String::with_capacity(s.len());
    let mut in_disallowed_run = false;
    for c in s.chars().map(|c| if c == '/' { '.' } else { c }) {
        if allowed(c) {
            replaced.push(c);
            in_disallowed_run = false;
        } else if !in_disallowed_run {
            replaced.push('-');
            in_disallowed_run = true;
        }
    }

    let mut collapsed = String::with_capacity(replaced.len());
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        if run.contains('.') {
            out.push('.');
        } else {
            out.push_str(run);
        }
        run.clear();
    };
    for c in replaced.chars() {
        if matches!(c, '.' | '-') {
            run.push(c);
        } else {
            flush(&mut run, &mut collapsed);
            collapsed.push(c);
        }
    }
    flush(&mut run, &mut collapsed);

    collapsed.trim_matches(['.', '-']).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(node: &str, orchestrator: &str) -> WepIdentifiers {
        WepIdentifiers {
            node: node.into(),
            orchestrator: orchestrator.into(),
            ..Default::default()
        }
    }

    fn field_of(err: NameError) -> &'static str {
        match err {
            NameError::InvalidField { field, .. } => field,
            other => panic!("expected a field error, got {other:?}"),
        }
    }

    #[test]
    fn k8s_name_full_and_prefix() {
        let id = WepIdentifiers {
            pod: "pod-name".into(),
            endpoint: "eth0".into(),
            ..ids("node-1", "k8s")
        };
        assert_eq!(id.name().unwrap(), "node--1-k8s-pod--name-eth0");
        assert_eq!(id.name_prefix().unwrap(), "node--1-k8s-pod--name-eth0");
    }

    #[test]
    fn cni_name() {
        let id = WepIdentifiers {
            container_id: "abcdefa0123456".into(),
            endpoint: "eth0".into(),
            ..ids("node-1", "cni")
        };
        assert_eq!(id.name().unwrap(), "node--1-cni-abcdefa0123456-eth0");
        assert_eq!(id.name_prefix().unwrap(), "node--1-cni-abcdefa0123456-eth0");
    }

    #[test]
    fn libnetwork_name() {
        let id = WepIdentifiers {
            endpoint: "abcdefgh".into(),
            ..ids("node-1", "libnetwork")
        };
        assert_eq!(id.name().unwrap(), "node--1-libnetwork-libnetwork-abcdefgh");
        assert_eq!(
            id.name_prefix().unwrap(),
            "node--1-libnetwork-libnetwork-abcdefgh"
        );
    }

    #[test]
    fn other_orchestrator_name() {
        let id = WepIdentifiers {
            workload: "foo-foo".into(),
            endpoint: "abcdefgh".into(),
            ..ids("node-1", "foo")
        };
        assert_eq!(id.name().unwrap(), "node--1-foo-foo--foo-abcdefgh");
        assert_eq!(id.name_prefix().unwrap(), "node--1-foo-foo--foo-abcdefgh");
    }

    #[test]
    fn prefix_mode_stops_at_first_empty_segment() {
        assert_eq!(ids("node-1", "k8s").name_prefix().unwrap(), "node--1-k8s-");
        assert_eq!(ids("node-1", "").name_prefix().unwrap(), "node--1-");
        assert_eq!(ids("node-1", "foo").name_prefix().unwrap(), "node--1-foo-");
        let mypod = WepIdentifiers {
            pod: "mypod".into(),
            ..ids("node1", "k8s")
        };
        assert_eq!(mypod.name_prefix().unwrap(), "node1-k8s-mypod-");
    }

    #[test]
    fn dash_errors_name_the_field() {
        let leading = WepIdentifiers {
            container_id: "-abcdefa0123456".into(),
            endpoint: "eth0".into(),
            ..ids("node-1", "cni")
        };
        let err = leading.name().unwrap_err();
        assert_eq!(
            err.to_string(),
            "error with field containerID = '-abcdefa0123456' (field must not begin with a '-')"
        );
        assert_eq!(field_of(leading.name_prefix().unwrap_err()), "containerID");

        let trailing = WepIdentifiers {
            workload: "foo-foo-".into(),
            endpoint: "abcdefgh".into(),
            ..ids("node-1", "foo")
        };
        let err = trailing.name().unwrap_err();
        assert_eq!(
            err.to_string(),
            "error with field workload = 'foo-foo-' (field must not end with a '-')"
        );
        assert_eq!(field_of(trailing.name_prefix().unwrap_err()), "workload");
    }

    #[test]
    fn missing_fields_are_errors() {
        let no_node = WepIdentifiers {
            pod: "pod".into(),
            endpoint: "eth0".into(),
            ..ids("", "k8s")
        };
        assert_eq!(field_of(no_node.name().unwrap_err()), "node");
        assert_eq!(field_of(no_node.name_prefix().unwrap_err()), "node");

        let no_pod = WepIdentifiers {
            endpoint: "eth0".into(),
            ..ids("node-1", "k8s")
        };
        assert_eq!(
            no_pod.name().unwrap_err().to_string(),
            "error with field pod = '' (field should be assigned)"
        );

        let no_orchestrator = WepIdentifiers {
            workload: "w".into(),
            endpoint: "eth0".into(),
            ..ids("node-1", "")
        };
        assert_eq!(
            field_of(no_orchestrator.name().unwrap_err()),
            "orchestrator"
        );
    }

    #[test]
    fn name_matches() {
        let k8s = WepIdentifiers {
            pod: "pod-name".into(),
            endpoint: "eth0".into(),
            ..ids("node-1", "k8s")
        };
        assert!(k8s.name_matches("node--1-k8s-pod--name-eth0"));
        assert!(!k8s.name_matches("node--1-k8s-pod--name-eth"));

        let cni_any = WepIdentifiers {
            endpoint: "eth0".into(),
            ..ids("node-1", "cni")
        };
        assert!(cni_any.name_matches("node--1-cni-orchestratorid-eth0"));

        let cni = WepIdentifiers {
            container_id: "abcde".into(),
            endpoint: "eth0".into(),
            ..ids("node-1", "cni")
        };
        assert!(!cni.name_matches("node--1-cni-abcdef-eth0"));

        let short = WepIdentifiers {
            pod: "pod".into(),
            endpoint: "eth0".into(),
            ..ids("node-1", "k8s")
        };
        assert!(!short.name_matches("node--1-k8s-pod-eth0-extra"));
    }

    #[test]
    fn prefix_listing_is_filtered_by_name_matches() {
        let lookup = WepIdentifiers {
            pod: "mypod".into(),
            ..ids("node1", "k8s")
        };
        assert!(lookup.name_matches("node1-k8s-mypod-eth0"));
        assert!(!lookup.name_matches("node1-k8s-mypod--1-eth0"));
    }

    #[test]
    fn parse_names() {
        assert_eq!(
            WepIdentifiers::parse("node-k8s-pod--name-").unwrap(),
            WepIdentifiers {
                pod: "pod-name".into(),
                ..ids("node", "k8s")
            }
        );
        assert_eq!(
            WepIdentifiers::parse("node-foo--orch-workload-eth0").unwrap(),
            WepIdentifiers {
                workload: "workload".into(),
                endpoint: "eth0".into(),
                ..ids("node", "foo-orch")
            }
        );
        assert_eq!(
            WepIdentifiers::parse("node--1-cni-abcdef-eth0").unwrap(),
            WepIdentifiers {
                container_id: "abcdef".into(),
                endpoint: "eth0".into(),
                ..ids("node-1", "cni")
            }
        );
        assert!(matches!(
            WepIdentifiers::parse("calico-kube-controllers-7946b84856-2fwwq"),
            Err(NameError::TooManyParts { parts: 5, .. })
        ));
        assert_eq!(WepIdentifiers::parse(""), Err(NameError::EmptyName));
    }

    #[test]
    fn parse_inverts_name() {
        let id = WepIdentifiers {
            pod: "a-b--c".into(),
            endpoint: "eth0".into(),
            ..ids("node-1.example", "k8s")
        };
        assert_eq!(WepIdentifiers::parse(&id.name().unwrap()).unwrap(), id);
    }

    #[test]
    fn workload_veth_names() {
        assert_eq!(
            veth_name_for_workload("default", "podA", None),
            "cali7f94ce7c295"
        );
        assert_eq!(
            veth_name_for_workload("default", "podB", None),
            "cali92cf1f5e9f6"
        );
        assert_eq!(
            veth_name_for_workload("default", "podA", Some("")),
            "cali7f94ce7c295"
        );
        assert_eq!(
            veth_name_for_workload("namespace", "podname", Some("eni,veth,foo")),
            "eni82111e10a96"
        );
    }

    #[test]
    fn container_veth_names() {
        assert_eq!(
            veth_name_for_container("abcdefa0123456789"),
            "caliabcdefa0123"
        );
        assert_eq!(veth_name_for_container("abc"), "caliabc");
    }

    #[test]
    fn mesos_labels() {
        let cases = [
            ("k", "k"),
            ("-my-val", "my-val"),
            ("$my..val", "my.val"),
            ("m$y.val", "m-y.val"),
            ("//my/val/", "my.val"),
            (
                "some_val-with.lots*of^weird#characters",
                "some_val-with.lots-of-weird-characters",
            ),
            ("/a/b/c", "a.b.c"),
            ("a$%-b", "a--b"),
        ];
        for (input, want) in cases {
            assert_eq!(sanitize_mesos_label(input), want, "input {input:?}");
        }
    }
}
