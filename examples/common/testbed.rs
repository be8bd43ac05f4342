//! What the examples that run against the test bed share: its variables
//! (`eval "$(bash scripts/testbed.sh env)"`), a deadline for a whole run,
//! the calico-etcd cluster's client config and its etcdctl. (A directory
//! without `main.rs`: not an example of its own; included with `#[path]`.)

use std::time::Duration;

use calico_cni::etcd::EtcdConfig;

pub type Failure = Box<dyn std::error::Error + Send + Sync>;

/// The test bed's variable `name`.
pub fn var(name: &str) -> Result<String, Failure> {
    std::env::var(name)
        .map_err(|_| format!("{name} is not set: eval \"$(bash scripts/testbed.sh env)\"").into())
}

/// Far enough for the whole run.
pub fn deadline() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(6 * 3600)
}

/// The calico-etcd cluster, with the CNI's client certificate.
pub fn etcd_config() -> Result<EtcdConfig, Failure> {
    Ok(EtcdConfig {
        endpoints: var("TESTBED_CALICO_ETCD_ENDPOINTS")?
            .split(',')
            .map(str::to_string)
            .collect(),
        ca_cert_file: Some(var("TESTBED_CALICO_ETCD_CA")?.into()),
        cert_file: Some(var("TESTBED_CALICO_ETCD_CERT")?.into()),
        key_file: Some(var("TESTBED_CALICO_ETCD_KEY")?.into()),
        credentials: None,
        discovery_srv: None,
    })
}
