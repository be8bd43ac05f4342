//! The plugin's one error type and its mapping to CNI error codes.
//!
//! Every failure inside the library becomes an [`Error`]: the contract's
//! own (environment, config, versions), a delegated plugin's error passed
//! through, or a service's failure ([`Error::Failed`]) of a [`Kind`] —
//! the datastore, the dataplane, the IPAM, the Kubernetes API, refused
//! credentials, a deadline — keeping the module's typed error as its
//! source (each module converts its own error and says which kind it is:
//! a timeout is [`Kind::TimedOut`] wherever it happens). Several failures
//! of one call (DEL's parts, GC's items) are kept together
//! ([`Error::Several`]). The edge (`crate::app`) turns it into the spec's
//! `{cniVersion, code, msg, details}` JSON with [`Error::to_reply`]; the
//! code table is [`Error::code`], and nothing else chooses error codes.

use serde::{Deserialize, Serialize};

use crate::cni::version::{IncompatibleVersion, SUPPORTED};

/// Spec error codes (CNI spec calico-behaviour.md §Error) and this plugin's own codes (≥ 100).
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNSUPPORTED_FIELD: u32 = 2;
    pub const UNKNOWN_CONTAINER: u32 = 3;
    pub const INVALID_ENV: u32 = 4;
    pub const IO: u32 = 5;
    pub const DECODE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    pub const NOT_AVAILABLE: u32 = 50;
    pub const NOT_AVAILABLE_LIMITED: u32 = 51;
    /// The datastore could not be reached, or refused the request.
    pub const DATASTORE: u32 = 100;
    /// A netlink, sysctl or namespace operation failed.
    pub const DATAPLANE: u32 = 101;
    /// Address management failed (no address, a delegated plugin misbehaved).
    pub const IPAM: u32 = 102;
    /// The Kubernetes API refused or failed a request.
    pub const KUBERNETES: u32 = 103;
    /// The Kubernetes API server (or the datastore) rejected the credentials.
    pub const UNAUTHORIZED: u32 = 103;
    /// The executable was started under a name it does not answer to, or with bad flags.
    pub const INVOCATION: u32 = 110;
    /// A bug: a panic or an impossible state.
    pub const INTERNAL: u32 = 999;
}

/// An error JSON exactly as a plugin prints it (and as a delegated plugin
/// printed it to us).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginError {
    #[serde(
        rename = "cniVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub cni_version: Option<String>,
    pub code: u32,
    pub msg: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl std::fmt::Display for PluginError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.details.is_empty() {
            write!(f, "{}", self.msg)
        } else {
            write!(f, "{}; {}", self.msg, self.details)
        }
    }
}

/// Which service failed, which decides the code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Datastore,
    Dataplane,
    Ipam,
    Kubernetes,
    /// The API server or the datastore refused the credentials.
    Unauthorized,
    /// A deadline passed, or a service did not answer in time.
    TimedOut,
}

/// `what: source`, `what` alone, or `source` alone when `what` is empty.
fn failure_text(what: &str, source: Option<&dyn std::fmt::Display>) -> String {
    match source {
        None => what.to_string(),
        Some(source) if what.is_empty() => source.to_string(),
        Some(source) => format!("{what}: {source}"),
    }
}

/// What the plugin does not support (code 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    /// A feature the runtime asked for that this kind of workload lacks.
    #[error("requested feature is not supported for this runtime: {0}")]
    FeatureForRuntime(&'static str),
    /// A readiness gate whose URL is not http:// or https://.
    #[error(
        "invalid URL set for ReadinessGates:{0} Error:only http:// and https:// readiness gates are supported"
    )]
    ReadinessGateUrl(String),
}

/// How the executable was started that it does not answer to (code 110).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadInvocation {
    /// argv[0] names neither personality.
    #[error("Unknown binary name: {0} (expected calico or calico-ipam)")]
    UnknownBinaryName(String),
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("incompatible CNI versions")]
    IncompatibleVersion { config: String },

    #[error("config version does not allow {verb}")]
    VerbNotAllowed { verb: &'static str },

    #[error("required env variables [{}] missing", .0.join(","))]
    MissingEnv(Vec<&'static str>),

    #[error("{var}: {reason}")]
    InvalidEnv {
        var: &'static str,
        reason: String,
        value: String,
    },

    /// Reading or writing failed: `context: source`.
    #[error("{}", failure_text(context, Some(source as &dyn std::fmt::Display)))]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    /// Input that does not decode: `context`, then the JSON error when there
    /// is one.
    #[error("{}", failure_text(context, source.as_ref().map(|e| e as &dyn std::fmt::Display)))]
    Decode {
        context: String,
        #[source]
        source: Option<serde_json::Error>,
    },

    /// A configuration the plugin cannot run with (code 7): `context`, then
    /// the module's own error when there is one.
    #[error("{}", failure_text(context, source.as_deref().map(|e| e as &dyn std::fmt::Display)))]
    InvalidConfig {
        context: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },

    /// The named field or value is not supported (code 2).
    #[error("{}", failure_text(context, Some(unsupported as &dyn std::fmt::Display)))]
    UnsupportedField {
        context: String,
        #[source]
        unsupported: Unsupported,
    },

    /// STATUS: this plugin cannot serve ADD now; `source` is the failure
    /// that says why, when there is one.
    #[error("{}", failure_text(context, source.as_deref().map(|e| e as &dyn std::fmt::Display)))]
    NotAvailable {
        context: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },

    /// A delegated plugin's own error, passed up unchanged.
    #[error("{0}")]
    Delegated(PluginError),

    /// A service failed while doing `what`; `source` is the module's own
    /// error when there is one.
    #[error("{}", failure_text(what, source.as_deref().map(|e| e as &dyn std::fmt::Display)))]
    Failed {
        kind: Kind,
        what: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },

    /// The executable was started in a way it does not answer to.
    #[error("{}", failure_text(context, Some(invocation as &dyn std::fmt::Display)))]
    Invocation {
        context: String,
        #[source]
        invocation: BadInvocation,
    },

    /// A bug or an impossible state (a panic, a runtime that would not
    /// start): `context`, then the error when there is one.
    #[error("{}", failure_text(context, source.as_deref().map(|e| e as &dyn std::fmt::Display)))]
    Internal {
        context: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },

    /// Several steps failed (GC, DEL's parts): every error, reported
    /// together; the code is the most severe one's.
    #[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Several(Vec<Error>),
}

impl Error {
    pub fn code(&self) -> u32 {
        use code::*;
        match self {
            Error::IncompatibleVersion { .. } | Error::VerbNotAllowed { .. } => {
                INCOMPATIBLE_VERSION
            }
            Error::MissingEnv(_) | Error::InvalidEnv { .. } => INVALID_ENV,
            Error::Io { .. } => IO,
            Error::Decode { .. } => DECODE,
            Error::InvalidConfig { .. } => INVALID_CONFIG,
            Error::UnsupportedField { .. } => UNSUPPORTED_FIELD,
            Error::NotAvailable { .. } => NOT_AVAILABLE,
            Error::Delegated(e) => e.code,
            Error::Failed { kind, .. } => match kind {
                Kind::Datastore => DATASTORE,
                Kind::Dataplane => DATAPLANE,
                Kind::Ipam => IPAM,
                Kind::Kubernetes => KUBERNETES,
                Kind::Unauthorized => UNAUTHORIZED,
                Kind::TimedOut => TRY_AGAIN_LATER,
            },
            Error::Invocation { .. } => INVOCATION,
            Error::Internal { .. } => INTERNAL,
            Error::Several(errors) => errors
                .iter()
                .map(Error::code)
                .reduce(|worst, c| {
                    if severity(c) > severity(worst) {
                        c
                    } else {
                        worst
                    }
                })
                .unwrap_or(INTERNAL),
        }
    }

    /// Reading or writing failed while doing `context`.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// Input that does not decode, told by `context` alone.
    pub fn decode(context: impl Into<String>) -> Error {
        Error::Decode {
            context: context.into(),
            source: None,
        }
    }

    /// JSON that does not decode as `context`.
    pub fn decode_json(context: impl Into<String>, source: serde_json::Error) -> Error {
        Error::Decode {
            context: context.into(),
            source: Some(source),
        }
    }

    /// A configuration the plugin cannot run with, told by `context` alone.
    pub fn invalid_config(context: impl Into<String>) -> Error {
        Error::InvalidConfig {
            context: context.into(),
            source: None,
        }
    }

    /// A configuration the plugin cannot run with: `context`, caused by `source`.
    pub fn invalid_config_caused(
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Error {
        Error::InvalidConfig {
            context: context.into(),
            source: Some(Box::new(source)),
        }
    }

    /// A field or value the plugin does not support.
    pub fn unsupported(unsupported: Unsupported) -> Error {
        Error::UnsupportedField {
            context: String::new(),
            unsupported,
        }
    }

    /// STATUS: not ready, told by `context` alone.
    pub fn not_available(context: impl Into<String>) -> Error {
        Error::NotAvailable {
            context: context.into(),
            source: None,
        }
    }

    /// STATUS: not ready because of `source` (its message, unchanged, when
    /// `context` is empty).
    pub fn not_available_caused(
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Error {
        Error::NotAvailable {
            context: context.into(),
            source: Some(Box::new(source)),
        }
    }

    /// The executable was started in a way it does not answer to.
    pub fn invocation(invocation: BadInvocation) -> Error {
        Error::Invocation {
            context: String::new(),
            invocation,
        }
    }

    /// A bug or an impossible state, told by `context` alone.
    pub fn internal(context: impl Into<String>) -> Error {
        Error::Internal {
            context: context.into(),
            source: None,
        }
    }

    /// A bug or an impossible state while doing `context`, caused by `source`.
    pub fn internal_caused(
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Error {
        Error::Internal {
            context: context.into(),
            source: Some(Box::new(source)),
        }
    }

    /// A failure of `kind` described by `what` alone.
    pub fn failed(kind: Kind, what: impl Into<String>) -> Error {
        Error::Failed {
            kind,
            what: what.into(),
            source: None,
        }
    }

    /// A failure of `kind` while doing `what`, caused by `source`.
    pub fn caused(
        kind: Kind,
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Error {
        Error::Failed {
            kind,
            what: what.into(),
            source: Some(Box::new(source)),
        }
    }

    pub fn datastore(what: impl Into<String>) -> Error {
        Error::failed(Kind::Datastore, what)
    }

    pub fn dataplane(what: impl Into<String>) -> Error {
        Error::failed(Kind::Dataplane, what)
    }

    pub fn ipam(what: impl Into<String>) -> Error {
        Error::failed(Kind::Ipam, what)
    }

    pub fn kubernetes(what: impl Into<String>) -> Error {
        Error::failed(Kind::Kubernetes, what)
    }

    /// A deadline passed: "try again later" (11).
    pub fn timed_out(what: impl Into<String>) -> Error {
        Error::failed(Kind::TimedOut, what)
    }

    /// The service's kind, for a service failure.
    pub fn kind(&self) -> Option<Kind> {
        match self {
            Error::Failed { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    /// Every error of `outcomes`: none, the one, or [`Error::Several`].
    pub fn all(outcomes: impl IntoIterator<Item = Result<()>>) -> Result<()> {
        let mut errors: Vec<Error> = outcomes.into_iter().filter_map(Result::err).collect();
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(Error::Several(errors)),
        }
    }

    /// The `details` field: extra context that is not part of the message.
    pub fn details(&self) -> Option<String> {
        match self {
            Error::IncompatibleVersion { config } => Some(format!(
                "config is {config:?}, plugin supports [{}]",
                SUPPORTED.join(" ")
            )),
            Error::InvalidEnv { value, .. } if !value.is_empty() => Some(value.clone()),
            Error::Delegated(e) if !e.details.is_empty() => Some(e.details.clone()),
            _ => None,
        }
    }

    fn msg(&self) -> String {
        match self {
            Error::Delegated(e) => e.msg.clone(),
            other => other.to_string(),
        }
    }

    /// The error JSON printed on stdout, labelled with the config's version.
    pub fn to_reply(&self, cni_version: &str) -> PluginError {
        PluginError {
            cni_version: Some(cni_version.to_string()),
            code: self.code(),
            msg: self.msg(),
            details: self.details().unwrap_or_default(),
        }
    }

    /// Prefixes the message with context, keeping the variant (and so the code).
    pub fn context(self, what: impl std::fmt::Display) -> Error {
        let what_text = what.to_string();
        // The context reads first: "what: context: source".
        let wrap = |m: String| {
            if m.is_empty() {
                what_text.clone()
            } else {
                format!("{what_text}: {m}")
            }
        };
        match self {
            Error::Io { context, source } => Error::Io {
                context: wrap(context),
                source,
            },
            Error::Decode { context, source } => Error::Decode {
                context: wrap(context),
                source,
            },
            Error::InvalidConfig { context, source } => Error::InvalidConfig {
                context: wrap(context),
                source,
            },
            Error::UnsupportedField {
                context,
                unsupported,
            } => Error::UnsupportedField {
                context: wrap(context),
                unsupported,
            },
            Error::NotAvailable { context, source } => Error::NotAvailable {
                context: wrap(context),
                source,
            },
            Error::Failed { kind, what, source } => Error::Failed {
                kind,
                what: wrap(what),
                source,
            },
            Error::Invocation {
                context,
                invocation,
            } => Error::Invocation {
                context: wrap(context),
                invocation,
            },
            Error::Internal { context, source } => Error::Internal {
                context: wrap(context),
                source,
            },
            Error::Several(mut errors) => {
                // "what: first; second": the context reads once.
                if let Some(first) = errors.first_mut() {
                    *first =
                        std::mem::replace(first, Error::internal(String::new())).context(what_text);
                }
                Error::Several(errors)
            }
            // Version, env and delegated errors keep their exact text.
            other => other,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How severe a failure of `code` is, among several of one call: "try
/// again later" least, then "not available", then a service's failure
/// (datastore, dataplane, IPAM, Kubernetes, a delegated plugin's), then a
/// request the plugin refuses, then a bug; the first of equals wins.
fn severity(code: u32) -> u8 {
    match code {
        code::TRY_AGAIN_LATER => 1,
        code::NOT_AVAILABLE | code::NOT_AVAILABLE_LIMITED => 2,
        code::INTERNAL => 5,
        1..=10 | code::INVOCATION => 4,
        _ => 3,
    }
}

impl From<IncompatibleVersion> for Error {
    fn from(e: IncompatibleVersion) -> Self {
        Error::IncompatibleVersion { config: e.config }
    }
}

impl From<crate::k8s::K8sError> for Error {
    fn from(e: crate::k8s::K8sError) -> Self {
        use crate::k8s::K8sError;
        let kind = match &e {
            K8sError::Config(_) => return Error::invalid_config_caused("", e),
            K8sError::Timeout(_) => Kind::TimedOut,
            K8sError::Unauthorized(_) => Kind::Unauthorized,
            _ => Kind::Kubernetes,
        };
        Error::caused(kind, "", e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unsupported_config_version_is_code_1_with_the_supported_list() {
        let e: Error = crate::cni::version::Version::from_config(Some("9.9.9"))
            .unwrap_err()
            .into();
        assert_eq!(e.code(), 1);
        assert!(e.details().unwrap().contains("9.9.9"));
    }

    #[test]
    fn missing_env_message_names_variables() {
        let e = Error::MissingEnv(vec!["CNI_NETNS", "CNI_IFNAME"]);
        assert_eq!(e.code(), 4);
        assert_eq!(
            e.to_string(),
            "required env variables [CNI_NETNS,CNI_IFNAME] missing"
        );
    }

    #[test]
    fn delegated_error_passes_through_unchanged() {
        let child = PluginError {
            cni_version: Some("1.0.0".into()),
            code: 7,
            msg: "Invalid Configuration".into(),
            details: "Network 192.168.0.0/31 too small".into(),
        };
        let reply = Error::Delegated(child.clone()).to_reply("1.0.0");
        assert_eq!(reply, child);
    }

    #[test]
    fn reply_json_shape() {
        let reply = Error::invalid_config("missing network name").to_reply("0.4.0");
        let v = serde_json::to_value(&reply).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"cniVersion":"0.4.0","code":7,"msg":"missing network name"})
        );
    }

    #[test]
    fn several_errors_answer_with_the_most_severe() {
        let e = Error::all([
            Ok(()),
            Err(Error::timed_out("timed out")),
            Err(Error::datastore("refused")),
        ])
        .unwrap_err();
        assert_eq!(e.code(), code::DATASTORE);
        assert_eq!(e.to_string(), "timed out; refused");
        assert!(Error::all([Ok(()), Ok(())]).is_ok());
        let one = Error::all([Err(Error::timed_out("x"))]).unwrap_err();
        assert_eq!(one.kind(), Some(Kind::TimedOut));
        assert_eq!(
            Error::all([Err(Error::ipam("a")), Err(Error::dataplane("b"))])
                .unwrap_err()
                .code(),
            code::IPAM,
            "the first of equals"
        );
        let e = Error::all([Err(Error::ipam("a")), Err(Error::timed_out("b"))])
            .unwrap_err()
            .context("GC");
        assert_eq!(e.to_string(), "GC: a; b");
    }

    #[test]
    fn context_keeps_code() {
        let e = Error::dataplane("EEXIST").context("adding route");
        assert_eq!(e.code(), code::DATAPLANE);
        assert_eq!(e.to_string(), "adding route: EEXIST");
    }

    #[test]
    fn a_failure_keeps_its_source_and_a_timeout_is_11() {
        use std::error::Error as _;
        let io = std::io::Error::other("connection refused");
        let e = Error::caused(Kind::Datastore, "error getting X", io).context("DEL");
        assert_eq!(e.to_string(), "DEL: error getting X: connection refused");
        assert_eq!(e.code(), code::DATASTORE);
        assert_eq!(e.source().unwrap().to_string(), "connection refused");
        let k8s: Error = crate::k8s::K8sError::Timeout("no answer".into()).into();
        assert_eq!(k8s.code(), code::TRY_AGAIN_LATER);
        assert_eq!(k8s.to_string(), "no answer");
        assert!(k8s.source().is_some());
        let refused: Error = crate::k8s::K8sError::Unauthorized("401".into()).into();
        assert_eq!(refused.code(), code::UNAUTHORIZED);
        assert_eq!(
            Error::timed_out("late").context("GC").to_string(),
            "GC: late"
        );
    }
}
