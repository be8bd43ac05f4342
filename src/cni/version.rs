//! CNI spec versions: the supported list, parsing, comparison and the
//! per-verb gates (CHECK needs 0.4.0, STATUS and GC need 1.1.0).

use std::cmp::Ordering;
use std::fmt;

/// Every spec version this plugin reads configs in and prints results in.
pub const SUPPORTED: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

/// The newest spec version, reported by VERSION.
pub const CURRENT: &str = "1.1.0";

/// A config's `cniVersion` outside [`SUPPORTED`] (the crate's error is
/// `Error::IncompatibleVersion`, code 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncompatibleVersion {
    /// The config's version, as written.
    pub config: String,
}

/// A parsed `major.minor.patch` spec version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl Version {
    pub const V0_1_0: Version = Version::new(0, 1, 0);
    pub const V0_2_0: Version = Version::new(0, 2, 0);
    pub const V0_3_0: Version = Version::new(0, 3, 0);
    pub const V0_3_1: Version = Version::new(0, 3, 1);
    pub const V0_4_0: Version = Version::new(0, 4, 0);
    pub const V1_0_0: Version = Version::new(1, 0, 0);
    pub const V1_1_0: Version = Version::new(1, 1, 0);

    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Version {
            major,
            minor,
            patch,
        }
    }

    /// Parses `X.Y.Z`; a missing minor or patch part counts as 0, as in
    /// libcni's version parser.
    pub fn parse(text: &str) -> Result<Version, String> {
        let mut parts = text.split('.');
        let mut next = |what: &str, required: bool| -> Result<u32, String> {
            match parts.next() {
                Some(p) => p
                    .parse::<u32>()
                    .map_err(|_| format!("failed to convert {what} version part {p:?}")),
                None if required => Err(format!("failed to convert {what} version part \"\"")),
                None => Ok(0),
            }
        };
        let major = next("major", true)?;
        let minor = next("minor", false)?;
        let patch = next("patch", false)?;
        if parts.next().is_some() {
            return Err(format!("invalid version {text:?}: too many parts"));
        }
        Ok(Version::new(major, minor, patch))
    }

    /// The config's `cniVersion` as this plugin accepts it: absent means
    /// 0.1.0; anything outside [`SUPPORTED`] is an incompatible version.
    pub fn from_config(cni_version: Option<&str>) -> Result<Version, IncompatibleVersion> {
        let text = match cni_version {
            None | Some("") => return Ok(Version::V0_1_0),
            Some(t) => t,
        };
        if !SUPPORTED.contains(&text) {
            return Err(IncompatibleVersion {
                config: text.to_string(),
            });
        }
        Ok(Version::parse(text).expect("supported versions parse"))
    }

    /// Result shape family: 0.1.0/0.2.0, 0.3.x/0.4.0 or 1.x.
    pub fn family(self) -> Family {
        if self < Version::V0_3_0 {
            Family::V02
        } else if self < Version::V1_0_0 {
            Family::V04
        } else {
            Family::V1
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The three result shapes the spec has had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// 0.1.0 and 0.2.0: `ip4` / `ip6`.
    V02,
    /// 0.3.0, 0.3.1 and 0.4.0: `ips[].version`.
    V04,
    /// 1.0.0 and 1.1.0.
    V1,
}

/// The highest version present in both lists, if any.
pub fn highest_common(ours: &[&str], theirs: &[String]) -> Option<Version> {
    theirs
        .iter()
        .filter(|v| ours.contains(&v.as_str()))
        .filter_map(|v| Version::parse(v).ok())
        .max_by(|a, b| a.cmp(b).then(Ordering::Equal))
}

/// The VERSION verb's answer.
pub fn version_reply() -> serde_json::Value {
    serde_json::json!({ "cniVersion": CURRENT, "supportedVersions": SUPPORTED })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_orders() {
        assert!(Version::parse("0.3.1").unwrap() > Version::parse("0.3.0").unwrap());
        assert_eq!(Version::parse("1").unwrap(), Version::V1_0_0);
        assert!(Version::parse("abc").unwrap_err().contains("major"));
        assert!(Version::parse("1.2.3.4").is_err());
    }

    #[test]
    fn config_version_rules() {
        assert_eq!(Version::from_config(None).unwrap(), Version::V0_1_0);
        assert_eq!(
            Version::from_config(Some("1.1.0")).unwrap(),
            Version::V1_1_0
        );
        let e = Version::from_config(Some("9.9.9")).unwrap_err();
        assert_eq!(e.config, "9.9.9");
    }

    #[test]
    fn common_version() {
        let theirs: Vec<String> = ["0.1.0", "0.4.0", "1.0.0"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(highest_common(&SUPPORTED, &theirs), Some(Version::V1_0_0));
        assert_eq!(highest_common(&SUPPORTED, &["2.0.0".to_string()]), None);
    }
}
