//! `calico ipam pool add|list|remove`: IPPools as Calico's client writes
//! and reads them (libcalico-go `clientv3/ippool.go`): the defaults written
//! explicitly on create and filled in on read, the same validation (a
//! strictly masked CIDR, the block size ranges, a pool at least one block
//! large unless disabled, no link-local range, no overlap with another
//! pool, no existing block of another size inside it).
//!
//! Removing differs from Calico on purpose: a pool with addresses still
//! allocated in it is refused (Calico deletes it and leaves them). The
//! pool is deleted on the revision read; its empty blocks and their
//! affinities go after it, each on the revision read.

use ipnet::IpNet;
use serde_json::{Value, json};

use crate::datastore::ipam_model::{
    BlockAffinity, DEFAULT_BLOCK_SIZE_V4, DEFAULT_BLOCK_SIZE_V6, IpPool, IpPoolSpec, IpamBlock,
};
use crate::datastore::model::API_VERSION;
use crate::datastore::{DatastoreError, ListFilter, Precondition, Resource, Store};

/// `calico ipam pool add`'s arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddArgs {
    pub name: String,
    pub cidr: String,
    pub block_size: Option<u32>,
    pub disabled: bool,
}

/// What a successful subcommand prints.
#[derive(Debug, Default)]
pub struct Report {
    pub stdout: String,
    /// Warnings (the subcommand still succeeded).
    pub stderr: String,
}

impl From<String> for Report {
    fn from(stdout: String) -> Report {
        Report::out(stdout)
    }
}

impl Report {
    fn out(stdout: String) -> Report {
        Report {
            stdout,
            stderr: String::new(),
        }
    }
}

/// Calico's IPPool defaults (its `Create` writes them, its `Get`/`List`
/// fill them in for pools stored without them).
pub const DEFAULT_NODE_SELECTOR: &str = "all()";
pub const DEFAULT_ALLOWED_USES: [&str; 2] = ["Workload", "Tunnel"];
pub const MODE_NEVER: &str = "Never";
pub const ASSIGNMENT_AUTOMATIC: &str = "Automatic";

/// The link-local ranges no pool may overlap.
const LINK_LOCAL: [&str; 2] = ["169.254.0.0/16", "fe80::/10"];

/// A Kubernetes DNS-1123 subdomain: at most 253 characters, dot-separated
/// labels of lower-case alphanumerics and `-`, each starting and ending
/// with an alphanumeric.
pub fn check_name(name: &str) -> Result<(), String> {
    let label_ok = |l: &str| {
        let b = l.as_bytes();
        !b.is_empty()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b[0] != b'-'
            && b[b.len() - 1] != b'-'
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(format!(
            "invalid IPPool name {name:?}: a name must be a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters)"
        ));
    }
    Ok(())
}

/// Go's `IPNet.IsNetOverlap`: either network contains the other's address.
fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// Parses a pool CIDR as Calico does: it must carry a prefix length and
/// have no host bits set; the textual form is normalised.
pub fn parse_cidr(text: &str) -> Result<IpNet, String> {
    let net: IpNet = text
        .trim()
        .parse()
        .map_err(|_| format!("invalid CIDR {text:?}: IPPool CIDR must be a valid subnet"))?;
    let masked = net.trunc();
    if masked.addr() != net.addr() {
        return Err(format!(
            "CIDR {text} is not strictly masked (host bits are set): did you mean {masked}?"
        ));
    }
    Ok(masked)
}

/// The pool `calico ipam pool add` creates, validated against the pools
/// and blocks that exist.
pub fn new_pool(args: &AddArgs, pools: &[IpPool], blocks: &[IpamBlock]) -> Result<IpPool, String> {
    check_name(&args.name)?;
    let net = parse_cidr(&args.cidr)?;
    let (v6, range, default) = match net {
        IpNet::V4(_) => (false, 20..=32, DEFAULT_BLOCK_SIZE_V4),
        IpNet::V6(_) => (true, 116..=128, DEFAULT_BLOCK_SIZE_V6),
    };
    let family = if v6 { "IPv6" } else { "IPv4" };
    let block_size = args.block_size.unwrap_or(u32::from(default));
    if !range.contains(&block_size) {
        return Err(format!(
            "{family} block size must be between {} and {}, not {block_size}",
            range.start(),
            range.end()
        ));
    }
    let block_size = block_size as u8;
    // Calico's IPAM needs an enabled pool to hold at least one block.
    if !args.disabled && net.prefix_len() > block_size {
        return Err(format!(
            "IP pool {net} is too small for its block size /{block_size}: the pool's prefix must be at most the block size (or the pool disabled)"
        ));
    }
    for ll in LINK_LOCAL {
        let ll: IpNet = ll.parse().expect("a valid constant");
        if overlaps(&net, &ll) {
            return Err(format!(
                "IPPool CIDR {net} overlaps with the {family} link-local range {ll}"
            ));
        }
    }
    for other in pools.iter().filter(|p| p.metadata.name != args.name) {
        if let Some(theirs) = other.spec.network()
            && overlaps(&net, &theirs)
        {
            return Err(format!(
                "IPPool({}) CIDR {net} overlaps with IPPool({}) CIDR {}",
                args.name, other.metadata.name, other.spec.cidr
            ));
        }
    }
    for block in blocks {
        if let Ok(cidr) = block.spec.cidr.parse::<IpNet>()
            && cidr.prefix_len() != block_size
            && overlaps(&cidr, &net)
        {
            return Err(format!(
                "block size /{block_size} conflicts with the existing IPAMBlock {cidr} of another size in {net}"
            ));
        }
    }
    Ok(IpPool::new(
        &args.name,
        IpPoolSpec {
            cidr: net.to_string(),
            vxlan_mode: MODE_NEVER.into(),
            ipip_mode: MODE_NEVER.into(),
            nat_outgoing: false,
            disabled: args.disabled,
            block_size,
            node_selector: DEFAULT_NODE_SELECTOR.into(),
            allowed_uses: DEFAULT_ALLOWED_USES.map(String::from).to_vec(),
            assignment_mode: ASSIGNMENT_AUTOMATIC.into(),
            ..IpPoolSpec::default()
        },
    ))
}

/// Fills in what Calico's client fills in on reading a pool.
pub fn with_read_defaults(spec: &mut IpPoolSpec) {
    spec.block_size = spec.effective_block_size();
    spec.allowed_uses = spec.uses();
    if spec.node_selector.is_empty() {
        spec.node_selector = DEFAULT_NODE_SELECTOR.into();
    }
    if spec.ipip_mode.is_empty() {
        spec.ipip_mode = MODE_NEVER.into();
    }
    if spec.vxlan_mode.is_empty() {
        spec.vxlan_mode = MODE_NEVER.into();
    }
    if spec.assignment_mode.is_empty() {
        spec.assignment_mode = ASSIGNMENT_AUTOMATIC.into();
    }
}

/// The pools as a table: NAME CIDR BLOCKSIZE DISABLED SELECTOR.
pub fn table(pools: &[IpPool]) -> String {
    let mut rows = vec![["NAME", "CIDR", "BLOCKSIZE", "DISABLED", "SELECTOR"].map(String::from)];
    for p in pools {
        rows.push([
            p.metadata.name.clone(),
            p.spec.cidr.clone(),
            p.spec.block_size.to_string(),
            p.spec.disabled.to_string(),
            p.spec.node_selector.clone(),
        ]);
    }
    let mut widths = [0usize; 5];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            line.push_str(cell);
            if i + 1 < row.len() {
                let pad = widths[i] - cell.chars().count() + 3;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn ds(what: &str) -> impl Fn(DatastoreError) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// Creates the pool.
pub async fn add(store: &dyn Store, args: &AddArgs) -> Result<Report, String> {
    let (pools, blocks) = futures::future::try_join(
        store.list::<IpPool>("", &ListFilter::All),
        store.list::<IpamBlock>("", &ListFilter::All),
    )
    .await
    .map_err(ds("reading the existing pools and blocks"))?;
    let mut pool = new_pool(args, &pools, &blocks)?;
    match store.create(&mut pool).await {
        Ok(created) => Ok(Report::out(format!(
            "created IPPool {} ({}, block size /{}{})\n",
            created.metadata.name,
            created.spec.cidr,
            created.spec.block_size,
            if created.spec.disabled {
                ", disabled"
            } else {
                ""
            }
        ))),
        Err(DatastoreError::AlreadyExists(_)) => {
            Err(format!("IPPool({}) already exists", args.name))
        }
        Err(e) => Err(ds(&format!("creating IPPool({})", args.name))(e)),
    }
}

/// The pools, with Calico's read defaults, as a table or as an IPPoolList.
pub async fn list(store: &dyn Store, json: bool) -> Result<Report, String> {
    let raw = store
        .list_objects(IpPool::KIND, "", &ListFilter::All)
        .await
        .map_err(ds("listing IPPools"))?;
    let mut pools = Vec::with_capacity(raw.len());
    let mut items = Vec::with_capacity(raw.len());
    for object in raw {
        let mut pool: IpPool = serde_json::from_value(object.clone()).map_err(|e| {
            format!(
                "stored IPPool {:?} is malformed: {e}",
                object.pointer("/metadata/name")
            )
        })?;
        with_read_defaults(&mut pool.spec);
        if json {
            let mut item = serde_json::to_value(&pool).map_err(|e| e.to_string())?;
            // What the typed view does not know (status, …) is kept.
            if let (Some(item), Some(stored)) = (item.as_object_mut(), object.as_object()) {
                for (k, v) in stored {
                    item.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
            items.push(item);
        }
        pools.push(pool);
    }
    if !json {
        return Ok(Report::out(table(&pools)));
    }
    let list = json!({
        "kind": "IPPoolList",
        "apiVersion": API_VERSION,
        "metadata": {},
        "items": Value::Array(items),
    });
    let mut text = serde_json::to_string_pretty(&list).map_err(|e| e.to_string())?;
    text.push('\n');
    Ok(Report::out(text))
}

/// Addresses allocated in a block.
fn allocated(block: &IpamBlock) -> usize {
    block
        .spec
        .allocations
        .iter()
        .filter(|a| a.is_some())
        .count()
}

/// Removes the pool, refusing while addresses are allocated in it.
pub async fn remove(store: &dyn Store, name: &str) -> Result<Report, String> {
    let pool = store
        .get::<IpPool>("", name)
        .await
        .map_err(ds(&format!("reading IPPool({name})")))?
        .ok_or_else(|| format!("IPPool({name}) does not exist"))?;
    let net = pool.spec.network();
    let in_pool =
        |cidr: &str| net.is_some_and(|n| cidr.parse::<IpNet>().is_ok_and(|c| n.contains(&c)));
    let blocks: Vec<IpamBlock> = store
        .list::<IpamBlock>("", &ListFilter::All)
        .await
        .map_err(ds("listing IPAM blocks"))?
        .into_iter()
        .filter(|b| in_pool(&b.spec.cidr))
        .collect();
    let used: Vec<(&IpamBlock, usize)> = blocks
        .iter()
        .map(|b| (b, allocated(b)))
        .filter(|(_, n)| *n > 0)
        .collect();
    if !used.is_empty() {
        let total: usize = used.iter().map(|(_, n)| n).sum();
        let cidrs: Vec<&str> = used.iter().map(|(b, _)| b.spec.cidr.as_str()).collect();
        return Err(format!(
            "IPPool({name}) ({}) still has {total} address{} in use (in block{} {}): release {} (delete the workloads) first",
            pool.spec.cidr,
            if total == 1 { "" } else { "es" },
            if cidrs.len() == 1 { "" } else { "s" },
            cidrs.join(", "),
            if total == 1 { "it" } else { "them" },
        ));
    }
    match store
        .delete::<IpPool>("", name, &Precondition::exactly(pool.metadata()))
        .await
    {
        Ok(()) => {}
        Err(DatastoreError::NotFound(_)) => return Err(format!("IPPool({name}) does not exist")),
        Err(DatastoreError::Conflict(_)) => {
            return Err(format!(
                "IPPool({name}) changed while it was being removed; try again"
            ));
        }
        Err(e) => return Err(ds(&format!("deleting IPPool({name})"))(e)),
    }

    // The pool's empty blocks and the affinities to them: nothing will
    // allocate from them again, and a pool made later over the same range
    // (with another block size) must not find them.
    let mut report = Report::out(format!("removed IPPool {name} ({})\n", pool.spec.cidr));
    let mut kept: Vec<IpNet> = Vec::new();
    for mut block in blocks {
        let cidr = block.spec.cidr.clone();
        block.spec.sequence_number += 1;
        if let Err(e) = store
            .soft_delete(&mut block, |b| b.spec.deleted = true)
            .await
            && !matches!(e, DatastoreError::NotFound(_))
        {
            report.stderr.push_str(&format!(
                "warning: IPAMBlock {cidr} was left in place: {e}\n"
            ));
            kept.extend(cidr.parse::<IpNet>().ok());
        }
    }
    let affinities = match store.list::<BlockAffinity>("", &ListFilter::All).await {
        Ok(list) => list,
        Err(e) => {
            report
                .stderr
                .push_str(&format!("warning: listing BlockAffinities: {e}\n"));
            Vec::new()
        }
    };
    for mut affinity in affinities {
        let Ok(cidr) = affinity.spec.cidr.parse::<IpNet>() else {
            continue;
        };
        if !in_pool(&affinity.spec.cidr) || kept.contains(&cidr) {
            continue;
        }
        let what = affinity.metadata.name.clone();
        if let Err(e) = store
            .soft_delete(&mut affinity, |a| a.spec.deleted = "true".into())
            .await
            && !matches!(e, DatastoreError::NotFound(_))
        {
            report.stderr.push_str(&format!(
                "warning: BlockAffinity {what} was left in place: {e}\n"
            ));
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datastore::ipam_model::IpamBlockSpec;

    fn args(name: &str, cidr: &str, block_size: Option<u32>) -> AddArgs {
        AddArgs {
            name: name.into(),
            cidr: cidr.into(),
            block_size,
            disabled: false,
        }
    }

    fn err(a: &AddArgs, pools: &[IpPool], blocks: &[IpamBlock]) -> String {
        new_pool(a, pools, blocks).unwrap_err()
    }

    #[test]
    fn writes_calicos_defaults() {
        let v4 = new_pool(
            &args("default-ipv4-ippool", "192.168.0.0/16", None),
            &[],
            &[],
        )
        .unwrap();
        let value = serde_json::to_value(&v4).unwrap();
        assert_eq!(
            value,
            json!({"kind": "IPPool", "apiVersion": "projectcalico.org/v3",
                   "metadata": {"name": "default-ipv4-ippool"},
                   "spec": {"cidr": "192.168.0.0/16", "vxlanMode": "Never", "ipipMode": "Never",
                            "blockSize": 26, "nodeSelector": "all()",
                            "allowedUses": ["Workload", "Tunnel"], "assignmentMode": "Automatic"}})
        );
        let v6 = new_pool(&args("v6", "fd00:0:0::/48", None), &[], &[]).unwrap();
        assert_eq!(v6.spec.cidr, "fd00::/48");
        assert_eq!(v6.spec.block_size, 122);
        let small = new_pool(&args("s", "10.1.0.0/28", Some(28)), &[], &[]).unwrap();
        assert_eq!(small.spec.block_size, 28);
    }

    #[test]
    fn validates_like_calico() {
        assert!(err(&args("Bad_Name", "10.0.0.0/16", None), &[], &[]).contains("DNS-1123"));
        assert!(err(&args("-a", "10.0.0.0/16", None), &[], &[]).contains("DNS-1123"));
        assert!(err(&args("a..b", "10.0.0.0/16", None), &[], &[]).contains("DNS-1123"));
        check_name("my.ippool-1").unwrap();
        check_name(&"a".repeat(253)).unwrap();
        assert!(check_name(&"a".repeat(254)).is_err());
        assert!(err(&args("p", "10.0.0.0", None), &[], &[]).contains("valid subnet"));
        assert!(err(&args("p", "10.0.0.300/16", None), &[], &[]).contains("valid subnet"));
        let e = err(&args("p", "10.0.0.1/16", None), &[], &[]);
        assert!(
            e.contains("not strictly masked") && e.contains("10.0.0.0/16"),
            "{e}"
        );
        assert!(err(&args("p", "10.0.0.0/16", Some(19)), &[], &[]).contains("between 20 and 32"));
        assert!(err(&args("p", "10.0.0.0/16", Some(33)), &[], &[]).contains("between 20 and 32"));
        assert!(err(&args("p", "fd00::/64", Some(26)), &[], &[]).contains("between 116 and 128"));
        assert!(err(&args("p", "10.0.0.0/27", None), &[], &[]).contains("too small"));
        let disabled = AddArgs {
            disabled: true,
            ..args("p", "10.0.0.0/27", None)
        };
        assert!(new_pool(&disabled, &[], &[]).unwrap().spec.disabled);
        assert!(err(&args("p", "169.254.0.0/20", None), &[], &[]).contains("link-local"));
        assert!(err(&args("p", "fe80::/64", None), &[], &[]).contains("link-local"));

        let existing = new_pool(&args("one", "10.0.0.0/16", None), &[], &[]).unwrap();
        let e = err(
            &args("two", "10.0.128.0/20", None),
            std::slice::from_ref(&existing),
            &[],
        );
        assert_eq!(
            e,
            "IPPool(two) CIDR 10.0.128.0/20 overlaps with IPPool(one) CIDR 10.0.0.0/16"
        );
        assert!(
            err(
                &args("two", "10.0.0.0/8", None),
                std::slice::from_ref(&existing),
                &[]
            )
            .contains("IPPool(one)")
        );
        // A pool of the other family or beside it is fine; the same name is
        // left for the create to refuse.
        new_pool(
            &args("two", "10.1.0.0/16", None),
            std::slice::from_ref(&existing),
            &[],
        )
        .unwrap();
        new_pool(
            &args("two", "fd00::/64", None),
            std::slice::from_ref(&existing),
            &[],
        )
        .unwrap();
        new_pool(
            &args("one", "10.0.0.0/16", None),
            std::slice::from_ref(&existing),
            &[],
        )
        .unwrap();

        let block = IpamBlock::new(
            "10-2-0-0-26",
            IpamBlockSpec {
                cidr: "10.2.0.0/26".into(),
                ..IpamBlockSpec::default()
            },
        );
        let e = err(
            &args("p", "10.2.0.0/16", Some(24)),
            &[],
            std::slice::from_ref(&block),
        );
        assert!(
            e.contains("conflicts with the existing IPAMBlock 10.2.0.0/26"),
            "{e}"
        );
        new_pool(
            &args("p", "10.2.0.0/16", None),
            &[],
            std::slice::from_ref(&block),
        )
        .unwrap();
    }

    #[test]
    fn reads_with_calicos_defaults() {
        let mut spec = IpPoolSpec {
            cidr: "fd00::/64".into(),
            ..IpPoolSpec::default()
        };
        with_read_defaults(&mut spec);
        assert_eq!(spec.block_size, 122);
        assert_eq!(spec.allowed_uses, ["Workload", "Tunnel"]);
        assert_eq!(spec.node_selector, "all()");
        assert_eq!(
            (spec.ipip_mode.as_str(), spec.vxlan_mode.as_str()),
            ("Never", "Never")
        );
        assert_eq!(spec.assignment_mode, "Automatic");
    }

    #[test]
    fn prints_a_table() {
        let a = new_pool(
            &args("default-ipv4-ippool", "192.168.0.0/16", None),
            &[],
            &[],
        )
        .unwrap();
        let mut b = new_pool(&args("v6", "fd00::/48", Some(120)), &[], &[]).unwrap();
        b.spec.disabled = true;
        assert_eq!(
            table(&[a, b]),
            "NAME                  CIDR             BLOCKSIZE   DISABLED   SELECTOR\n\
             default-ipv4-ippool   192.168.0.0/16   26          false      all()\n\
             v6                    fd00::/48        120         true       all()\n"
        );
    }
}
