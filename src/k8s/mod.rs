//! The Kubernetes API client and the object types it reads: a leaf that
//! depends on nothing else in this crate (its own [`K8sConfig`]).

pub mod client;
pub mod config;
pub mod objects;

pub use client::{K8sClient, K8sError};
pub use config::K8sConfig;
