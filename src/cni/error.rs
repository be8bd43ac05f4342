//! The plugin's one error type and its mapping to CNI error codes.
//!
//! Every failure inside the library is a variant of [`Error`]; the edge
//! (`crate::app`) turns it into the spec's `{cniVersion, code, msg, details}`
//! JSON with [`Error::to_reply`]. Nothing else chooses error codes.

use serde::{Deserialize, Serialize};

use crate::cni::version::SUPPORTED;

/// Spec error codes (CNI spec §Error) and this plugin's own codes (≥ 100).
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

    #[error("{0}")]
    Io(String),

    #[error("{0}")]
    Decode(String),

    #[error("{0}")]
    InvalidConfig(String),

    /// The named field or value is not supported (code 2).
    #[error("{0}")]
    UnsupportedField(String),

    #[error("{0}")]
    TryAgainLater(String),

    /// STATUS: this plugin cannot serve ADD now.
    #[error("{0}")]
    NotAvailable(String),

    /// A delegated plugin's own error, passed up unchanged.
    #[error("{0}")]
    Delegated(PluginError),

    #[error("{0}")]
    Ipam(String),

    #[error("{0}")]
    Datastore(String),

    #[error("{0}")]
    Dataplane(String),

    #[error("{0}")]
    Kubernetes(String),

    /// The credentials were rejected (a 401).
    #[error("{0}")]
    Unauthorized(String),

    #[error("{0}")]
    Invocation(String),

    #[error("{0}")]
    Internal(String),

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
            Error::Io(_) => IO,
            Error::Decode(_) => DECODE,
            Error::InvalidConfig(_) => INVALID_CONFIG,
            Error::UnsupportedField(_) => UNSUPPORTED_FIELD,
            Error::TryAgainLater(_) => TRY_AGAIN_LATER,
            Error::NotAvailable(_) => NOT_AVAILABLE,
            Error::Delegated(e) => e.code,
            Error::Ipam(_) => IPAM,
            Error::Datastore(_) => DATASTORE,
            Error::Dataplane(_) => DATAPLANE,
            Error::Kubernetes(_) => KUBERNETES,
            Error::Unauthorized(_) => UNAUTHORIZED,
            Error::Invocation(_) => INVOCATION,
            Error::Internal(_) => INTERNAL,
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
        let wrap = |m: String| format!("{what}: {m}");
        match self {
            Error::Io(m) => Error::Io(wrap(m)),
            Error::Decode(m) => Error::Decode(wrap(m)),
            Error::InvalidConfig(m) => Error::InvalidConfig(wrap(m)),
            Error::UnsupportedField(m) => Error::UnsupportedField(wrap(m)),
            Error::TryAgainLater(m) => Error::TryAgainLater(wrap(m)),
            Error::NotAvailable(m) => Error::NotAvailable(wrap(m)),
            Error::Ipam(m) => Error::Ipam(wrap(m)),
            Error::Datastore(m) => Error::Datastore(wrap(m)),
            Error::Dataplane(m) => Error::Dataplane(wrap(m)),
            Error::Kubernetes(m) => Error::Kubernetes(wrap(m)),
            Error::Unauthorized(m) => Error::Unauthorized(wrap(m)),
            Error::Invocation(m) => Error::Invocation(wrap(m)),
            Error::Internal(m) => Error::Internal(wrap(m)),
            Error::Several(mut errors) => {
                // "what: first; second": the context reads once.
                if let Some(first) = errors.first_mut() {
                    *first = std::mem::replace(first, Error::Internal(String::new()))
                        .context(what.to_string());
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

impl From<crate::k8s::K8sError> for Error {
    fn from(e: crate::k8s::K8sError) -> Self {
        use crate::k8s::K8sError;
        match e {
            K8sError::Config(m) => Error::InvalidConfig(m),
            K8sError::Timeout(m) => Error::TryAgainLater(m),
            K8sError::Unauthorized(m) => Error::Unauthorized(m),
            other => Error::Kubernetes(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let reply = Error::InvalidConfig("missing network name".into()).to_reply("0.4.0");
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
            Err(Error::TryAgainLater("timed out".into())),
            Err(Error::Datastore("refused".into())),
        ])
        .unwrap_err();
        assert_eq!(e.code(), code::DATASTORE);
        assert_eq!(e.to_string(), "timed out; refused");
        assert!(Error::all([Ok(()), Ok(())]).is_ok());
        let one = Error::all([Err(Error::TryAgainLater("x".into()))]).unwrap_err();
        assert!(matches!(one, Error::TryAgainLater(_)));
        assert_eq!(
            Error::all([
                Err(Error::Ipam("a".into())),
                Err(Error::Dataplane("b".into()))
            ])
            .unwrap_err()
            .code(),
            code::IPAM,
            "the first of equals"
        );
        let e = Error::all([
            Err(Error::Ipam("a".into())),
            Err(Error::TryAgainLater("b".into())),
        ])
        .unwrap_err()
        .context("GC");
        assert_eq!(e.to_string(), "GC: a; b");
    }

    #[test]
    fn context_keeps_code() {
        let e = Error::Dataplane("EEXIST".into()).context("adding route");
        assert_eq!(e.code(), code::DATAPLANE);
        assert_eq!(e.to_string(), "adding route: EEXIST");
    }
}
