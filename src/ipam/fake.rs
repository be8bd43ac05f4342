//! A recording [`Ipam`] for the plugin layer's tests (built for tests, or
//! with the `test-fakes` feature): every call is logged to a journal
//! (`ipam ADD`, `ipam DEL`, ...) shared with the other fakes; ADD answers
//! `address`; a verb named in `fail` fails.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use ipnet::IpNet;
use serde_json::Value;
use tokio::time::Instant;

use super::{Ipam, Owner, Pending};
use crate::cni::env::Command;
use crate::cni::request::Attachment;
use crate::cni::result::IpConfig;
use crate::cni::{CniResult, Error, Result};

pub struct FakeIpam {
    pub journal: Arc<Mutex<Vec<String>>>,
    pub address: IpNet,
    /// Verbs that fail (`ADD`, `DEL`, `CHECK`, `STATUS`, `GC`).
    pub fail: Mutex<HashSet<&'static str>>,
    /// What [`Ipam::owners`] answers.
    pub owners: Mutex<Option<Vec<Owner>>>,
}

impl FakeIpam {
    pub fn new(journal: &Arc<Mutex<Vec<String>>>, address: &str) -> Arc<FakeIpam> {
        Arc::new(FakeIpam {
            journal: Arc::clone(journal),
            address: address.parse().expect("an address"),
            fail: Mutex::new(HashSet::new()),
            owners: Mutex::new(None),
        })
    }

    pub fn fail(&self, verb: &'static str) {
        self.fail.lock().unwrap().insert(verb);
    }

    fn record(&self, verb: &'static str, what: String) -> Result<()> {
        self.journal
            .lock()
            .unwrap()
            .push(format!("ipam {verb}{what}"));
        if self.fail.lock().unwrap().contains(verb) {
            return Err(Error::ipam(format!("injected {verb} failure")));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Ipam for FakeIpam {
    fn kind(&self) -> &str {
        "fake-ipam"
    }

    async fn start(&self, command: Command) -> Result<Pending> {
        self.record("START", format!(" {}", command.as_str()))?;
        Ok(Pending::none())
    }

    async fn add(&self, _config: &Value, _pending: Pending) -> Result<CniResult> {
        self.record("ADD", String::new())?;
        Ok(CniResult {
            ips: vec![IpConfig {
                address: self.address,
                gateway: None,
                interface: None,
            }],
            ..CniResult::default()
        })
    }

    async fn add_ip(&self, _config: &Value, ip: IpAddr) -> Result<CniResult> {
        self.record("ADD", format!(" IP={ip}"))?;
        Ok(CniResult {
            ips: vec![IpConfig {
                address: IpNet::from(ip),
                gateway: None,
                interface: None,
            }],
            ..CniResult::default()
        })
    }

    async fn del(&self, _config: &Value, _pending: Pending) -> Result<()> {
        self.record("DEL", String::new())
    }

    async fn check(&self, _config: &Value) -> Result<()> {
        self.record("CHECK", String::new())
    }

    async fn status(&self, _config: &Value) -> Result<()> {
        self.record("STATUS", String::new())
    }

    async fn gc(&self, _config: &Value, valid: Option<&[Attachment]>) -> Result<()> {
        let valid: Vec<&str> = valid
            .unwrap_or_default()
            .iter()
            .map(|a| a.container_id.as_str())
            .collect();
        self.record("GC", format!(" valid={valid:?}"))
    }

    async fn release_ips(&self, ips: &[IpAddr]) -> Result<()> {
        self.record("RELEASE", format!(" {ips:?}"))
    }

    async fn owners(&self) -> Result<Option<Vec<Owner>>> {
        Ok(self.owners.lock().unwrap().clone())
    }

    fn until(&self, _deadline: Instant) -> Arc<dyn Ipam> {
        Arc::new(FakeIpam {
            journal: Arc::clone(&self.journal),
            address: self.address,
            fail: Mutex::new(self.fail.lock().unwrap().clone()),
            owners: Mutex::new(self.owners.lock().unwrap().clone()),
        })
    }
}
