//! The error of Calico's config and annotation rules: its text is the
//! exact message the `calico` plugin reports, and it becomes an invalid
//! config (code 7).

use std::str::FromStr;

use ipnet::IpNet;
use serde_json::Value;

/// A rule rejected the config or an annotation; the text is the message the
/// plugin reports.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RuleError(pub String);

impl RuleError {
    pub fn new(msg: impl Into<String>) -> RuleError {
        RuleError(msg.into())
    }
}

impl From<RuleError> for crate::cni::Error {
    fn from(e: RuleError) -> Self {
        crate::cni::Error::invalid_config_caused("", e)
    }
}

/// Compact JSON text of a value for an error message (`null` when absent).
pub fn show(v: Option<&Value>) -> String {
    v.map_or_else(|| "null".to_string(), Value::to_string)
}

/// The parse error of a malformed CIDR, worded like the reference plugin.
pub fn parse_cidr(s: &str) -> Result<IpNet, RuleError> {
    IpNet::from_str(s).map_err(|_| RuleError(format!("invalid CIDR address: {s}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_error_becomes_invalid_config() {
        let e: crate::cni::Error = RuleError::new("bad thing").into();
        assert!(matches!(
            &e,
            crate::cni::Error::InvalidConfig {
                source: Some(_),
                ..
            }
        ));
        assert_eq!(e.to_string(), "bad thing");
    }
}
