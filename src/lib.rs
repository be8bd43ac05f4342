//! A drop-in replacement for Project Calico's `calico` and `calico-ipam`
//! CNI plugins.
//!
//! `calico-behaviour.md §N` in comments is a section of
//! `docs/calico-behaviour.md`, the description of Calico's behaviour (what
//! its binaries do, step by step, with test vectors) this code follows.

pub mod app;
pub mod cli;
pub mod cni;
pub mod connection_gate;
pub mod dataplane;
pub mod datastore;
pub mod etcd;
pub mod fault;
pub mod handoff;
pub mod ipam;
pub mod k8s;
pub mod logging;
pub mod plugin;
