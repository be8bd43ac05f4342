//! Kubernetes mode: the API client, Calico's annotation rules, CmdAddK8s and
//! CmdDelK8s.

pub mod add;
pub mod client;
pub mod del;
pub mod objects;
pub mod rules;

pub use add::cmd_add_k8s;
pub use client::{K8sClient, K8sError};
pub use del::cmd_del_k8s;
