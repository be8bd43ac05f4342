//! etcd members found through DNS SRV records (`etcd_discovery_srv`), as
//! etcd's client finds them for Calico: `_etcd-client-ssl._tcp.<domain>`
//! gives `https://` members, `_etcd-client._tcp.<domain>` `http://` ones;
//! either may be missing, not both.
//!
//! The query is DNS over UDP (over TCP when the answer is truncated) to the
//! name servers of /etc/resolv.conf, as the C library and Go's resolver
//! ask them: one small query per name, done once per call on a cluster
//! configured so. Hand-written (RFC 1035 messages, name compression, SRV
//! records of RFC 2782) rather than a resolver crate's, which would bring
//! its caching, its configuration and its runtime glue for two queries.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use super::EtcdError;

/// How long one name server gets for one query.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);
const TYPE_SRV: u16 = 33;
const CLASS_IN: u16 = 1;
/// resolv.conf's path (a container may mount its own over it).
const RESOLV_CONF: &str = "/etc/resolv.conf";

/// One SRV record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Srv {
    pub priority: u16,
    pub weight: u16,
    pub port: u16,
    /// Without its trailing dot.
    pub target: String,
}

/// The client URLs of the etcd cluster of `domain`, https ones first,
/// each record's order by priority (then weight).
pub async fn discover(domain: &str, deadline: Instant) -> Result<Vec<String>, EtcdError> {
    let domain = domain.trim_end_matches('.');
    let servers = name_servers(&std::fs::read_to_string(RESOLV_CONF).unwrap_or_default());
    let mut urls = Vec::new();
    let mut errors = Vec::new();
    for (service, scheme) in [("_etcd-client-ssl", "https"), ("_etcd-client", "http")] {
        let name = format!("{service}._tcp.{domain}");
        match lookup(&name, &servers, deadline).await {
            Ok(records) => urls.extend(
                records
                    .into_iter()
                    .map(|r| format!("{scheme}://{}:{}", r.target, r.port)),
            ),
            Err(e) => errors.push(format!("lookup {name}: {e}")),
        }
    }
    if errors.len() == 2 {
        return Err(EtcdError::Unavailable(format!(
            "dns lookup errors: {}",
            errors.join(" and ")
        )));
    }
    tracing::info!(%domain, ?urls, "etcd members from DNS SRV records");
    Ok(urls)
}

/// The `nameserver` lines of a resolv.conf (port 53); the local one when
/// there is none, as the C library does.
pub fn name_servers(resolv_conf: &str) -> Vec<SocketAddr> {
    let servers: Vec<SocketAddr> = resolv_conf
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("nameserver")).then(|| words.next())?
        })
        .filter_map(|a| a.split('%').next()?.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect();
    if servers.is_empty() {
        vec![SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 53)]
    } else {
        servers
    }
}

/// The SRV records of `name`, from the first server that answers.
async fn lookup(name: &str, servers: &[SocketAddr], deadline: Instant) -> Result<Vec<Srv>, String> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let id = (std::process::id() as u16) ^ (nanos as u16);
    let query = query(id, name)?;
    let mut last = String::from("no name server");
    for server in servers {
        let limit = deadline
            .saturating_duration_since(Instant::now())
            .min(QUERY_TIMEOUT);
        if limit.is_zero() {
            break;
        }
        match tokio::time::timeout(limit, ask(*server, &query)).await {
            Ok(Ok(answer)) => return parse(&answer, id),
            Ok(Err(e)) => last = format!("{server}: {e}"),
            Err(_) => last = format!("{server}: no answer within {limit:?}"),
        }
    }
    Err(last)
}

/// One exchange with a server: UDP, then TCP when the answer is cut short.
async fn ask(server: SocketAddr, query: &[u8]) -> Result<Vec<u8>, String> {
    let bind: SocketAddr = if server.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = tokio::net::UdpSocket::bind(bind)
        .await
        .map_err(|e| e.to_string())?;
    socket.connect(server).await.map_err(|e| e.to_string())?;
    socket.send(query).await.map_err(|e| e.to_string())?;
    let mut answer = vec![0u8; 4096];
    loop {
        let n = socket.recv(&mut answer).await.map_err(|e| e.to_string())?;
        // Not ours (an earlier query's late answer): keep waiting.
        if n < 12 || answer[..2] != query[..2] {
            continue;
        }
        answer.truncate(n);
        break;
    }
    let truncated = answer[2] & 0x02 != 0;
    if !truncated {
        return Ok(answer);
    }
    let mut tcp = tokio::net::TcpStream::connect(server)
        .await
        .map_err(|e| e.to_string())?;
    let len = u16::try_from(query.len()).map_err(|_| "query too long")?;
    tcp.write_all(&len.to_be_bytes())
        .await
        .map_err(|e| e.to_string())?;
    tcp.write_all(query).await.map_err(|e| e.to_string())?;
    let n = tcp.read_u16().await.map_err(|e| e.to_string())?;
    let mut answer = vec![0u8; usize::from(n)];
    tcp.read_exact(&mut answer)
        .await
        .map_err(|e| e.to_string())?;
    Ok(answer)
}

/// A recursive query for the SRV records of `name`.
pub fn query(id: u16, name: &str) -> Result<Vec<u8>, String> {
    let mut q = Vec::with_capacity(18 + name.len());
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00]); // RD
    q.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]); // one question
    for label in name.trim_end_matches('.').split('.') {
        let len = u8::try_from(label.len())
            .ok()
            .filter(|&l| (1..64).contains(&l))
            .ok_or_else(|| format!("{name:?} is not a valid DNS name"))?;
        q.push(len);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&TYPE_SRV.to_be_bytes());
    q.extend_from_slice(&CLASS_IN.to_be_bytes());
    Ok(q)
}

fn u16_at(m: &[u8], at: usize) -> Result<u16, String> {
    m.get(at..at + 2)
        .map(|b| u16::from_be_bytes([b[0], b[1]]))
        .ok_or_else(|| "a truncated answer".to_string())
}

/// The name at `at` (following compression pointers) and where the name
/// ends in the message.
fn name_at(m: &[u8], mut at: usize) -> Result<(String, usize), String> {
    let mut labels: Vec<String> = Vec::new();
    let mut end = None;
    for _ in 0..128 {
        let len = *m.get(at).ok_or("a truncated name")?;
        match len {
            0 => {
                return Ok((labels.join("."), end.unwrap_or(at + 1)));
            }
            l if l & 0xc0 == 0xc0 => {
                let pointer = usize::from(u16_at(m, at)? & 0x3fff);
                end.get_or_insert(at + 2);
                at = pointer;
            }
            l => {
                let label = m
                    .get(at + 1..at + 1 + usize::from(l))
                    .ok_or("a truncated label")?;
                labels.push(String::from_utf8_lossy(label).into_owned());
                at += 1 + usize::from(l);
            }
        }
    }
    Err("a name with too many labels or a pointer loop".into())
}

/// The SRV records of an answer to query `id`, by priority then weight
/// (heavier first).
pub fn parse(m: &[u8], id: u16) -> Result<Vec<Srv>, String> {
    if m.len() < 12 || u16_at(m, 0)? != id {
        return Err("an answer to another query".into());
    }
    let rcode = m[3] & 0x0f;
    match rcode {
        0 => {}
        3 => return Err("no such host".into()),
        2 => return Err("server failure".into()),
        5 => return Err("refused".into()),
        c => return Err(format!("DNS error code {c}")),
    }
    let (questions, answers) = (u16_at(m, 4)?, u16_at(m, 6)?);
    let mut at = 12;
    for _ in 0..questions {
        at = name_at(m, at)?.1 + 4;
    }
    let mut records = Vec::new();
    for _ in 0..answers {
        at = name_at(m, at)?.1;
        let (kind, len) = (u16_at(m, at)?, usize::from(u16_at(m, at + 8)?));
        let data = at + 10;
        if kind == TYPE_SRV {
            records.push(Srv {
                priority: u16_at(m, data)?,
                weight: u16_at(m, data + 2)?,
                port: u16_at(m, data + 4)?,
                target: name_at(m, data + 6)?.0,
            });
        }
        at = data + len;
    }
    if records.is_empty() {
        return Err("no SRV records".into());
    }
    records.sort_by_key(|r| (r.priority, std::cmp::Reverse(r.weight)));
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer as a server writes one: the question, then the records
    /// with their names compressed to a pointer at the question's.
    fn answer(id: u16, name: &str, records: &[(u16, u16, u16, &str)]) -> Vec<u8> {
        let mut m = query(id, name).unwrap();
        m[2] = 0x81;
        m[3] = 0x80;
        m[6..8].copy_from_slice(&(records.len() as u16).to_be_bytes());
        for (priority, weight, port, target) in records {
            m.extend_from_slice(&[0xc0, 12]);
            m.extend_from_slice(&TYPE_SRV.to_be_bytes());
            m.extend_from_slice(&CLASS_IN.to_be_bytes());
            m.extend_from_slice(&60u32.to_be_bytes());
            let mut rdata = Vec::new();
            for v in [priority, weight, port] {
                rdata.extend_from_slice(&v.to_be_bytes());
            }
            rdata.extend_from_slice(&query(0, target).unwrap()[12..][..target.len() + 2]);
            m.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
            m.extend_from_slice(&rdata);
        }
        m
    }

    #[test]
    fn queries_and_answers() {
        let q = query(0x1234, "_etcd-client-ssl._tcp.example.com").unwrap();
        assert_eq!(&q[..4], &[0x12, 0x34, 0x01, 0x00]);
        assert_eq!(&q[12..29], b"\x10_etcd-client-ssl");
        assert_eq!(&q[q.len() - 4..], &[0, 33, 0, 1]);
        let a = answer(
            7,
            "_etcd-client._tcp.example.com",
            &[
                (10, 5, 2379, "b.example.com"),
                (0, 1, 2380, "a.example.com"),
            ],
        );
        let records = parse(&a, 7).unwrap();
        assert_eq!(records[0].target, "a.example.com");
        assert_eq!(records[0].port, 2380);
        assert_eq!(records[1].target, "b.example.com");
        assert!(parse(&a, 8).is_err());
        let mut nx = query(9, "x.example").unwrap();
        nx[3] = 0x83;
        assert_eq!(parse(&nx, 9).unwrap_err(), "no such host");
        assert!(
            parse(&a[..a.len() - 3], 7).is_err(),
            "a cut answer is an error"
        );
        assert!(query(1, &"x".repeat(64)).is_err());
        assert_eq!(
            name_servers("# x\nnameserver 10.0.0.2\nsearch a\nnameserver fe80::1%eth0\n"),
            [
                "10.0.0.2:53".parse().unwrap(),
                "[fe80::1]:53".parse().unwrap()
            ]
        );
        assert_eq!(name_servers(""), ["127.0.0.1:53".parse().unwrap()]);
    }
}
