//! A drop-in replacement for Project Calico's `calico` and `calico-ipam`
//! CNI plugins.

pub mod app;
pub mod cli;
pub mod cni;
pub mod dataplane;
pub mod datastore;
pub mod etcd;
pub mod fault;
pub mod ipam;
pub mod k8s;
pub mod logging;
pub mod plugin;
