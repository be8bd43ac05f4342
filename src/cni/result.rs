//! The CNI result: one internal model (spec 1.1.0) and its conversion to and
//! from every supported version (libcni's conversion rules).

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::cni::error::{Error, Result};
use crate::cni::version::{Family, Version};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    #[serde(
        rename = "socketPath",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub socket_path: Option<String>,
    #[serde(rename = "pciID", default, skip_serializing_if = "Option::is_none")]
    pub pci_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// Address with its prefix length, e.g. `10.0.0.5/32`.
    pub address: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub dst: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(rename = "advmss", default, skip_serializing_if = "Option::is_none")]
    pub adv_mss: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u32>,
}

impl Route {
    pub fn to(dst: IpNet) -> Route {
        Route {
            dst,
            gw: None,
            mtu: None,
            adv_mss: None,
            priority: None,
            table: None,
            scope: None,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    pub fn is_empty(&self) -> bool {
        *self == Dns::default()
    }
}

/// The internal result model (spec 1.1.0).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniResult {
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Dns,
}

// ---- wire shapes per version family ----

#[derive(Serialize, Deserialize)]
struct Wire1 {
    #[serde(rename = "cniVersion")]
    cni_version: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    interfaces: Vec<Interface>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    ips: Vec<IpConfig>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    routes: Vec<Route>,
    #[serde(default, skip_serializing_if = "Dns::is_empty")]
    dns: Dns,
}

#[derive(Serialize, Deserialize)]
struct Interface04 {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mac: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sandbox: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct IpConfig04 {
    #[serde(default)]
    version: String,
    address: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gateway: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    interface: Option<usize>,
}

#[derive(Serialize, Deserialize)]
struct Wire04 {
    #[serde(rename = "cniVersion")]
    cni_version: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    interfaces: Vec<Interface04>,
    // 0.3.0's text called it `ip`; libcni reads `ips` only.
    #[serde(default)]
    ips: Vec<IpConfig04>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    routes: Vec<Route>,
    #[serde(default)]
    dns: Dns,
}

#[derive(Serialize, Deserialize)]
struct Route02 {
    dst: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gw: Option<IpAddr>,
}

#[derive(Serialize, Deserialize)]
struct Ip02 {
    ip: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gateway: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    routes: Vec<Route02>,
}

#[derive(Serialize, Deserialize)]
struct Wire02 {
    #[serde(rename = "cniVersion")]
    cni_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ip4: Option<Ip02>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ip6: Option<Ip02>,
    #[serde(default)]
    dns: Dns,
}

fn is_v4(net: &IpNet) -> bool {
    matches!(net, IpNet::V4(_))
}

impl CniResult {
    /// The result as JSON in `version`'s shape (libcni's `PrintResult`).
    pub fn to_version(&self, version: Version) -> Result<Value> {
        let cni_version = version.to_string();
        let value = match version.family() {
            Family::V1 => serde_json::to_value(Wire1 {
                cni_version,
                interfaces: self.interfaces.clone(),
                ips: self.ips.clone(),
                routes: self.routes.clone(),
                dns: self.dns.clone(),
            }),
            Family::V04 => serde_json::to_value(Wire04 {
                cni_version,
                interfaces: self
                    .interfaces
                    .iter()
                    .map(|i| Interface04 {
                        name: i.name.clone(),
                        mac: i.mac.clone(),
                        sandbox: i.sandbox.clone(),
                    })
                    .collect(),
                ips: self
                    .ips
                    .iter()
                    .map(|ip| IpConfig04 {
                        version: if is_v4(&ip.address) { "4" } else { "6" }.into(),
                        address: ip.address,
                        gateway: ip.gateway,
                        interface: ip.interface,
                    })
                    .collect(),
                routes: self.routes.clone(),
                dns: self.dns.clone(),
            }),
            Family::V02 => {
                let family = |v4: bool| {
                    self.ips
                        .iter()
                        .find(|ip| is_v4(&ip.address) == v4)
                        .map(|ip| Ip02 {
                            ip: ip.address,
                            gateway: ip.gateway,
                            routes: self
                                .routes
                                .iter()
                                .filter(|r| is_v4(&r.dst) == v4)
                                .map(|r| Route02 {
                                    dst: r.dst,
                                    gw: r.gw,
                                })
                                .collect(),
                        })
                };
                let (ip4, ip6) = (family(true), family(false));
                if ip4.is_none() && ip6.is_none() {
                    return Err(Error::internal("cannot convert: no valid IP addresses"));
                }
                serde_json::to_value(Wire02 {
                    cni_version,
                    ip4,
                    ip6,
                    dns: self.dns.clone(),
                })
            }
        };
        value.map_err(|e| Error::internal_caused("failed to encode result", e))
    }

    /// Parses a result of any supported version. A result without
    /// `cniVersion` is read as `default_version` (libcni's compatibility rule).
    pub fn parse(value: &Value, default_version: Version) -> Result<(CniResult, Version)> {
        let mut obj = match value {
            Value::Null => Map::new(),
            Value::Object(m) => m.clone(),
            other => {
                return Err(Error::decode(format!(
                    "result is not a JSON object: {other}"
                )));
            }
        };
        let version = match obj.get("cniVersion").and_then(Value::as_str) {
            Some(v) if !v.is_empty() => Version::from_config(Some(v))?,
            _ => default_version,
        };
        obj.insert("cniVersion".into(), Value::String(version.to_string()));
        let decode_err = |e: serde_json::Error| {
            Error::decode_json(format!("failed to decode {version} result"), e)
        };
        let obj = Value::Object(obj);
        let result = match version.family() {
            Family::V1 => {
                let w: Wire1 = serde_json::from_value(obj).map_err(decode_err)?;
                CniResult {
                    interfaces: w.interfaces,
                    ips: w.ips,
                    routes: w.routes,
                    dns: w.dns,
                }
            }
            Family::V04 => {
                let w: Wire04 = serde_json::from_value(obj).map_err(decode_err)?;
                CniResult {
                    interfaces: w
                        .interfaces
                        .into_iter()
                        .map(|i| Interface {
                            name: i.name,
                            mac: i.mac,
                            sandbox: i.sandbox,
                            ..Interface::default()
                        })
                        .collect(),
                    ips: w
                        .ips
                        .into_iter()
                        .map(|ip| IpConfig {
                            address: ip.address,
                            gateway: ip.gateway,
                            interface: ip.interface,
                        })
                        .collect(),
                    routes: w.routes,
                    dns: w.dns,
                }
            }
            Family::V02 => {
                let w: Wire02 = serde_json::from_value(obj).map_err(decode_err)?;
                let mut result = CniResult {
                    dns: w.dns,
                    ..CniResult::default()
                };
                for ip in [w.ip4, w.ip6].into_iter().flatten() {
                    result.ips.push(IpConfig {
                        address: ip.ip,
                        gateway: ip.gateway,
                        interface: None,
                    });
                    result.routes.extend(ip.routes.into_iter().map(|r| Route {
                        gw: r.gw,
                        ..Route::to(r.dst)
                    }));
                }
                result
            }
        };
        Ok((result, version))
    }
}

/// Renders JSON the way Go's `json.MarshalIndent(v, "", "    ")` does.
pub fn to_pretty_json(value: &impl Serialize) -> String {
    let mut out = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
    value.serialize(&mut ser).expect("JSON values serialize");
    String::from_utf8(out).expect("JSON is UTF-8")
}
