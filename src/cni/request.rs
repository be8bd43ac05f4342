//! One typed request: the validated environment plus the decoded network
//! config, built from the raw environment and stdin in the order libcni's
//! skeleton checks them.

use serde_json::Value;
use tokio::time::Instant;

use crate::cni::config::NetConf;
use crate::cni::env::{CniEnv, Command, valid_identifier};
use crate::cni::error::{Error, Result};
use crate::cni::version::Version;

#[derive(Debug, Clone)]
pub struct Request {
    pub env: CniEnv,
    /// The config document exactly as received (unknown keys included);
    /// delegated plugins get this.
    pub raw: Value,
    pub conf: NetConf,
    /// The config's spec version: results and errors are printed in it.
    pub version: Version,
    /// When this invocation must be finished.
    pub deadline: Instant,
}

/// Decodes stdin as a network config: JSON (code 6) with a valid `name` (code 7).
pub fn decode_config(stdin: &[u8]) -> Result<Value> {
    let raw: Value = serde_json::from_slice(stdin)
        .map_err(|e| Error::decode_json("error unmarshall network config", e))?;
    if !raw.is_object() {
        return Err(Error::decode(
            "error unmarshall network config: not a JSON object",
        ));
    }
    match raw.get("name").and_then(Value::as_str) {
        None | Some("") => Err(Error::invalid_config("missing network name")),
        Some(name) if !valid_identifier(name) => Err(Error::invalid_config(format!(
            "invalid characters in network name {name:?}: only letters a-z, numbers 0-9, and symbols _.- are supported"
        ))),
        Some(_) => Ok(raw),
    }
}

/// The version checks of the skeleton: the config's version must be
/// supported, CHECK needs ≥ 0.4.0, STATUS and GC need ≥ 1.1.0.
pub fn check_version(command: Command, raw: &Value) -> Result<Version> {
    let text = raw.get("cniVersion").and_then(Value::as_str);
    let gate = match command {
        Command::Check => Some(("CHECK", Version::V0_4_0)),
        Command::Status => Some(("STATUS", Version::V1_1_0)),
        Command::Gc => Some(("GC", Version::V1_1_0)),
        _ => None,
    };
    if let (Some(_), Some(text)) = (gate, text) {
        // The skeleton parses the version numerically before these verbs.
        Version::parse(text).map_err(Error::decode)?;
    }
    let version = Version::from_config(text)?;
    if let Some((verb, min)) = gate
        && version < min
    {
        return Err(Error::VerbNotAllowed { verb });
    }
    Ok(version)
}

impl Request {
    pub fn new(env: CniEnv, stdin: &[u8]) -> Result<Request> {
        let started = Instant::now();
        let raw = decode_config(stdin)?;
        let version = check_version(env.command, &raw)?;
        let conf = NetConf::from_value(&raw)?;
        let deadline = started + conf.deadline();
        Ok(Request {
            env,
            raw,
            conf,
            version,
            deadline,
        })
    }

    /// Time left before the deadline.
    pub fn remaining(&self) -> std::time::Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// GC's `cni.dev/valid-attachments` (or the 1.1.0 tag's
    /// `cni.dev/attachments`): `None` when neither key is given, so that a
    /// GC without the list removes nothing.
    pub fn valid_attachments(&self) -> Result<Option<Vec<Attachment>>> {
        let Some(list) = VALID_ATTACHMENT_KEYS.iter().find_map(|k| self.raw.get(*k)) else {
            return Ok(None);
        };
        serde_json::from_value(list.clone())
            .map(Some)
            .map_err(|e| Error::invalid_config_caused("invalid cni.dev/valid-attachments", e))
    }
}

/// The keys GC's list of valid attachments comes under (libcni sends both).
pub const VALID_ATTACHMENT_KEYS: [&str; 2] = ["cni.dev/valid-attachments", "cni.dev/attachments"];

/// One attachment GC must keep.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Deserialize)]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    #[serde(default)]
    pub ifname: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn config_decoding_errors() {
        assert_eq!(decode_config(b"{not json").unwrap_err().code(), 6);
        assert_eq!(decode_config(b"{}").unwrap_err().code(), 7);
        assert_eq!(decode_config(br#"{"name":"a b"}"#).unwrap_err().code(), 7);
        decode_config(br#"{"name":"net1"}"#).unwrap();
    }

    #[test]
    fn version_gates() {
        let v = |s: &str| json!({"cniVersion": s});
        assert_eq!(
            check_version(Command::Add, &json!({})).unwrap(),
            Version::V0_1_0
        );
        assert_eq!(
            check_version(Command::Add, &v("9.9.9")).unwrap_err().code(),
            1
        );
        assert_eq!(
            check_version(Command::Add, &v("abc")).unwrap_err().code(),
            1
        );
        assert_eq!(
            check_version(Command::Check, &v("abc")).unwrap_err().code(),
            6
        );
        assert_eq!(
            check_version(Command::Check, &v("0.3.1"))
                .unwrap_err()
                .code(),
            1
        );
        check_version(Command::Check, &v("0.4.0")).unwrap();
        assert_eq!(
            check_version(Command::Status, &v("1.0.0"))
                .unwrap_err()
                .to_string(),
            "config version does not allow STATUS"
        );
        check_version(Command::Gc, &v("1.1.0")).unwrap();
    }
}
