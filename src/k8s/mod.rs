//! Kubernetes: the API client and, later, CmdAddK8s / CmdDelK8s.

pub mod client;

pub use client::{K8sClient, K8sError};
