//! The CNI contract: environment, network config, versions, results,
//! errors and delegation to other plugins.

pub mod config;
pub mod delegate;
pub mod env;
pub mod error;
pub mod request;
pub mod result;
pub mod rule_error;
pub mod version;

pub use config::NetConf;
pub use env::{CniArgs, CniEnv, Command};
pub use error::{Error, Result};
pub use request::Request;
pub use result::CniResult;
pub use version::Version;
