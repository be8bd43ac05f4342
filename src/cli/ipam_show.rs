//! `calico ipam show [--show-blocks] [--ip ADDR] [-o json]`: how full each
//! pool (and block) is, or who holds one address — calicoctl's table and
//! wording, or JSON.

use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::json;

use super::ipam_inventory::Inventory;
use super::progress::Progress;

/// Go's `%.5g` of a count (what calicoctl prints for a pool's size).
pub fn go_g5(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    let sci = format!("{x:.4e}"); // d.dddde<exp>, rounded to 5 digits
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if !(-4..5).contains(&exp) {
        let m = mantissa.trim_end_matches('0').trim_end_matches('.');
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{m}e{sign}{:02}", exp.abs());
    }
    let decimals = usize::try_from(4 - exp).unwrap_or(0);
    let fixed = format!("{x:.decimals$}");
    if fixed.contains('.') {
        fixed
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    } else {
        fixed
    }
}

/// `n (p%)` as calicoctl prints a part of a whole.
fn part(n: f64, total: f64) -> String {
    let pct = if total > 0.0 { n / total * 100.0 } else { 0.0 };
    format!("{} ({pct:.0}%)", go_g5(n))
}

fn is_number(cell: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match cell.split_once('.') {
        Some((a, b)) => digits(a) && digits(b),
        None => digits(cell),
    }
}

/// A boxed table as calicoctl draws it: `+---+` borders, the header
/// centred, numbers right-aligned and the rest left-aligned.
pub fn boxed(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let border: String = widths
        .iter()
        .map(|w| format!("+{}", "-".repeat(w + 2)))
        .collect::<String>()
        + "+\n";
    let line = |cells: Vec<String>| cells.concat() + "|\n";
    let mut out = border.clone();
    out += &line(
        header
            .iter()
            .zip(&widths)
            .map(|(h, w)| {
                let pad = w - h.chars().count();
                let left = pad / 2;
                format!("| {}{h}{} ", " ".repeat(left), " ".repeat(pad - left))
            })
            .collect(),
    );
    out += &border;
    for row in rows {
        out += &line(
            row.iter()
                .zip(&widths)
                .map(|(c, w)| {
                    if is_number(c) {
                        format!("| {c:>w$} ")
                    } else {
                        format!("| {c:<w$} ")
                    }
                })
                .collect(),
        );
    }
    out + &border
}

/// How many addresses a CIDR spans.
fn size(cidr: &IpNet) -> f64 {
    2f64.powi(i32::from(cidr.max_prefix_len() - cidr.prefix_len()))
}

/// The pools (and, with `blocks`, their blocks): total, in use, free; each
/// pool a tick of `progress`.
pub fn usage(inv: &Inventory, blocks: bool, as_json: bool, progress: &Progress) -> String {
    let live: Vec<_> = {
        let mut v: Vec<_> = inv.live_blocks().collect();
        v.sort_by_key(|(_, c)| *c);
        v
    };
    let used = |b: &crate::datastore::ipam_model::IpamBlock| {
        b.spec.allocations.iter().filter(|a| a.is_some()).count() as f64
    };
    let mut rows = Vec::new();
    let mut pools_json = Vec::new();
    progress.phase("summing up the pools", Some(inv.pools.len() as u64));
    for (i, pool) in inv.pools.iter().enumerate() {
        progress.tick(i as u64 + 1);
        let Some(cidr) = pool.spec.network() else {
            continue;
        };
        let inside: Vec<_> = live.iter().filter(|(_, c)| cidr.contains(c)).collect();
        let total = size(&cidr);
        // (Counted, then converted: an empty f64 sum is -0.0, printed "-0%".)
        let in_use = inside
            .iter()
            .map(|(b, _)| b.spec.allocations.iter().filter(|a| a.is_some()).count())
            .sum::<usize>() as f64;
        rows.push(vec![
            "IP Pool".to_string(),
            cidr.to_string(),
            go_g5(total),
            part(in_use, total),
            part(total - in_use, total),
        ]);
        let mut blocks_json = Vec::new();
        for (b, c) in &inside {
            let (t, u) = (size(c), used(b));
            if blocks {
                rows.push(vec![
                    "Block".to_string(),
                    c.to_string(),
                    go_g5(t),
                    part(u, t),
                    part(t - u, t),
                ]);
            }
            blocks_json.push(json!({
                "cidr": c.to_string(), "affinity": b.spec.affinity,
                "total": t, "inUse": u, "free": t - u,
            }));
        }
        let mut entry = json!({
            "name": pool.metadata.name, "cidr": cidr.to_string(), "disabled": pool.spec.disabled,
            "total": total, "inUse": in_use, "free": total - in_use,
        });
        if blocks {
            entry["blocks"] = json!(blocks_json);
        }
        pools_json.push(entry);
    }
    if as_json {
        return pretty(&json!({ "pools": pools_json }));
    }
    boxed(
        &["GROUPING", "CIDR", "IPS TOTAL", "IPS IN USE", "IPS FREE"],
        &rows,
    )
}

fn pretty(v: &serde_json::Value) -> String {
    let mut text = serde_json::to_string_pretty(v).unwrap_or_default();
    text.push('\n');
    text
}

/// Who holds `ip`: calicoctl's `IP … is in use` with the handle and the
/// owner's attributes, or `… is not assigned`.
pub fn address(inv: &Inventory, ip: IpAddr, as_json: bool) -> String {
    let found = inv.allocations().into_iter().find(|a| a.ip == ip);
    if as_json {
        return pretty(&match &found {
            Some(a) => json!({
                "ip": ip.to_string(), "allocated": true, "handle": a.handle,
                "attributes": a.attrs, "borrowed": a.borrowed(),
                "users": inv.owners.get(&ip).cloned().unwrap_or_default(),
            }),
            None => json!({"ip": ip.to_string(), "allocated": false}),
        });
    }
    let Some(a) = found else {
        return format!("{ip} is not assigned\n");
    };
    let mut out = format!(
        "IP {ip} is in use\nHandle ID: {}\n",
        a.handle.as_deref().unwrap_or("<none>")
    );
    if a.attrs.is_empty() {
        out += "No Active Owner attributes defined\n";
    } else {
        out += "Active Owner Attributes:\n";
        for (k, v) in &a.attrs {
            out += &format!("  {k}: {v}\n");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_print_as_go_does() {
        for (x, want) in [
            (0.0, "0"),
            (16.0, "16"),
            (256.0, "256"),
            (65536.0, "65536"),
            (99999.0, "99999"),
            (100000.0, "1e+05"),
            (1048576.0, "1.0486e+06"),
            (2f64.powi(64), "1.8447e+19"),
        ] {
            assert_eq!(go_g5(x), want, "{x}");
        }
        assert_eq!(part(3.0, 256.0), "3 (1%)");
        assert_eq!(part(253.0, 256.0), "253 (99%)");
        assert_eq!(part(1.0, 16.0), "1 (6%)");
        assert_eq!(part(256.0, 256.0), "256 (100%)");
        assert_eq!(part(0.0, 256.0), "0 (0%)");
    }

    #[test]
    fn an_empty_pool_is_zero_percent_used() {
        let pool: crate::datastore::ipam_model::IpPool = serde_json::from_value(json!({
            "metadata": {"name": "p"}, "spec": {"cidr": "10.1.0.0/24"}
        }))
        .unwrap();
        let inv = Inventory {
            pools: vec![pool],
            ..Inventory::default()
        };
        let table = usage(&inv, true, false, &Progress::silent());
        assert!(
            table.contains("| IP Pool  | 10.1.0.0/24 |       256 | 0 (0%)     | 256 (100%) |"),
            "{table}"
        );
    }

    #[test]
    fn draws_calicoctls_table() {
        let rows = vec![
            vec![
                "IP Pool".into(),
                "10.66.0.0/24".into(),
                "256".into(),
                "3 (1%)".into(),
                "253 (99%)".into(),
            ],
            vec![
                "Block".into(),
                "10.66.0.224/28".into(),
                "16".into(),
                "3 (19%)".into(),
                "13 (81%)".into(),
            ],
        ];
        let want = "\
+----------+----------------+-----------+------------+-----------+
| GROUPING |      CIDR      | IPS TOTAL | IPS IN USE | IPS FREE  |
+----------+----------------+-----------+------------+-----------+
| IP Pool  | 10.66.0.0/24   |       256 | 3 (1%)     | 253 (99%) |
| Block    | 10.66.0.224/28 |        16 | 3 (19%)    | 13 (81%)  |
+----------+----------------+-----------+------------+-----------+
";
        assert_eq!(
            boxed(
                &["GROUPING", "CIDR", "IPS TOTAL", "IPS IN USE", "IPS FREE"],
                &rows
            ),
            want
        );
    }
}
