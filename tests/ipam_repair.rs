//! `calico ipam show|check|release`, the built binary, on the embedded
//! store, the test bed's etcd and its API server: leaks planted by hand (an
//! allocation no workload uses, a handle holding nothing) are found by
//! `check` as calicoctl finds them — its lines and its report's entries
//! for this test's addresses are calicoctl's own on the same data — and
//! removed by `release --from-report`, which leaves what is in use; a stale
//! report frees nothing twice; `release --ip` frees one address.

mod common;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use calico_cni::datastore::ipam_model::{IpamBlock, IpamHandle};
use calico_cni::datastore::model::WorkloadEndpoint;
use common::ipam::{Backend, World};
use common::*;
use ipnet::IpNet;
use serde_json::{Value, json};

/// `calico ipam ARGS... --config CONF`, in CONF's directory: (exit code,
/// stdout, stderr).
fn ours(conf: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(CALICO)
        .current_dir(conf.parent().unwrap())
        .arg("ipam")
        .args(args)
        .arg("--config")
        .arg(conf)
        .env_clear()
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The lines of calicoctl's problem sections (after the inventory, before
/// ours beyond it) that name this world's addresses.
fn world_problems(w: &World, text: &str) -> Vec<String> {
    let problems = text
        .split_once("Scanning for IPs that are allocated")
        .map_or("", |(_, p)| p);
    let problems = problems
        .split_once("Scanning for IPAM blocks whose affinity")
        .map_or(problems, |(p, _)| p);
    let mut lines: Vec<String> = problems
        .lines()
        .filter(|l| l.starts_with("  ") && w.owns_text(l))
        .map(String::from)
        .collect();
    lines.sort();
    lines
}

/// The report's entries of this world's addresses, and its leaked handles
/// whose ID contains `tag`.
fn world_report(w: &World, report: &Value, tag: &str) -> (Value, Vec<Value>) {
    let allocations: serde_json::Map<String, Value> = report["allocations"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(ip, _)| w.owns_text(ip))
        .map(|(ip, v)| (ip.clone(), v.clone()))
        .collect();
    // (calicoctl lists them in Go's map order: compared sorted.)
    let mut handles: Vec<Value> = report["leakedHandles"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|h| h["ID"].as_str().is_some_and(|id| id.contains(tag)))
        .map(|h| json!({"ID": h["ID"], "Revision": h["Revision"]}))
        .collect();
    handles.sort_by_key(|h| h["ID"].as_str().unwrap_or_default().to_string());
    (Value::Object(allocations), handles)
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn repair(test: &str, backend: Backend) {
    if !root_or_skip(test) {
        return;
    }
    let Some(w) = World::new(test, backend) else {
        return;
    };
    let calicoctl_bin: Option<PathBuf> = match backend {
        Backend::Embedded => None,
        _ => Some(
            common::testbed::peer(test, "calico-v3.32.1/calicoctl")
                .unwrap_or_else(|| panic!("{test}: calicoctl is not built")),
        ),
    };
    let pool = w.v4(0);
    w.pool(&pool.to_string(), json!({"blockSize": 28}));
    let mut conf = w.conf();
    // This world's pool only, whatever else the shared cluster holds.
    conf["ipam"]["ipv4_pools"] = json!([pool.to_string()]);
    if backend == Backend::Kdd {
        // The operator's credentials: check lists every pod and node.
        conf["kubernetes"]["kubeconfig"] = json!(w.bed().var("KUBECONFIG"));
    }
    let conf_path = w.dir.path().join("10-calico.conf");
    std::fs::write(&conf_path, conf.to_string()).unwrap();

    // Three allocations by calico-ipam: one a workload uses, one leaked,
    // one for release --ip.
    let cids: Vec<String> = (0..3).map(|_| container_id()).collect();
    let ips: Vec<IpAddr> = cids
        .iter()
        .map(|cid| {
            let out = w.ipam("ADD", cid, &conf, "");
            assert_eq!(out.code, 0, "{out:?}");
            common::ipam::address(&out.json(), 0).addr()
        })
        .collect();
    let (kept, leaked, single) = (ips[0], ips[1], ips[2]);
    let ns = (backend == Backend::Kdd).then(|| w.bed().namespace(json!({}), json!({})));
    for ip in [kept, single] {
        match &ns {
            Some(ns) => w.pod(
                ns,
                &format!("p{}", ip.to_string().replace('.', "-")),
                json!({"cni.projectcalico.org/podIPs": format!("{ip}/32")}),
            ),
            None => {
                let name = format!("{}-cni-c{}-eth0", w.node, ip.to_string().replace('.', ""));
                w.create::<WorkloadEndpoint>(json!({
                    "metadata": {"name": name, "namespace": "default"},
                    "spec": {"orchestrator": "cni", "node": w.node, "endpoint": "eth0",
                             "containerID": format!("c{}", ip.to_string().replace('.', "")),
                             "interfaceName": "cali0123456789a", "ipNetworks": [format!("{ip}/32")]}
                }));
            }
        }
    }
    // A handle holding nothing.
    let tag = unique();
    let orphan = format!("net1.orphan-{tag}");
    let block = IpNet::new(kept, 28).unwrap().trunc();
    w.create::<IpamHandle>(json!({
        "metadata": {"name": w.handle_name(&orphan)},
        "spec": {"handleID": orphan, "block": {block.to_string(): 1}, "deleted": false}
    }));

    // Beyond calicoctl: a handle soft-deleted but left stored and (where
    // the datastore keeps nodes) a block affine to a node that is gone.
    let deleted = format!("net1.deleted-{tag}");
    w.create::<IpamHandle>(json!({
        "metadata": {"name": w.handle_name(&deleted)},
        "spec": {"handleID": deleted, "block": {}, "deleted": true}
    }));
    let empty_block = |cidr: IpNet, affinity: String, deleted: bool| {
        w.create::<IpamBlock>(json!({
            "metadata": {"name": cidr.to_string().replace(['.', '/'], "-")},
            "spec": {"cidr": cidr.to_string(), "affinity": affinity,
                     "strictAffinity": false, "allocations": vec![Value::Null; 16],
                     "unallocated": (0..16).collect::<Vec<_>>(), "attributes": [],
                     "sequenceNumber": 0, "sequenceNumberForAllocation": {}, "deleted": deleted}
        }));
    };
    let stray = IpNet::new(w.v4(1).addr(), 28).unwrap().trunc();
    if backend != Backend::Embedded {
        empty_block(stray, format!("host:gone-{tag}"), false);
    }
    let soft_deleted = IpNet::new(w.v4(2).addr(), 28).unwrap().trunc();
    empty_block(soft_deleted, format!("host:{}", w.node), true);

    // show.
    let (code, shown, err) = ours(&conf_path, &["show", "--ip", &kept.to_string()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        shown.starts_with(&format!(
            "IP {kept} is in use\nHandle ID: net1.{}\nActive Owner Attributes:\n",
            cids[0]
        )),
        "{shown}"
    );
    assert!(shown.contains(&format!("  node: {}\n", w.node)), "{shown}");
    let (_, blocks, said) = ours(&conf_path, &["show", "--show-blocks"]);
    // What it did, phase by phase, on stderr (not a terminal here).
    let listed = match backend {
        Backend::Kdd => "reading the pods and nodes...",
        _ => "reading the workload endpoints...",
    };
    for phase in [
        "reading the IPAM blocks, handles and pools...",
        listed,
        "summing up the pools (",
        "done in ",
    ] {
        assert!(
            said.lines()
                .any(|l| l.starts_with("calico ipam show: ") && l.contains(phase)),
            "{phase}: {said}"
        );
    }
    assert!(!blocks.contains("calico ipam show:"), "{blocks}");
    let row = |text: &str, what: &str| {
        text.lines()
            .find(|l| l.contains(&format!(" {what} ")))
            .map(String::from)
            .unwrap_or_else(|| panic!("no row for {what}:\n{text}"))
    };
    assert!(
        row(&blocks, &block.to_string()).contains("| 3 (19%)"),
        "{blocks}"
    );
    let (_, json_shown, _) = ours(&conf_path, &["show", "--show-blocks", "-o", "json"]);
    let shown_json: Value = serde_json::from_str(&json_shown).unwrap();
    assert!(
        shown_json["pools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["cidr"] == json!(pool.to_string()) && p["inUse"] == json!(3.0)),
        "{shown_json:#}"
    );

    // check.
    let report_path = w.dir.path().join("report.json");
    let (code, checked, err) = ours(
        &conf_path,
        &[
            "check",
            "--show-problem-ips",
            "--report",
            report_path.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{err}");
    for phase in [
        "reading the IPAM blocks, handles and pools...",
        "checking blocks (",
        "checking allocations (",
        "building the report (",
        "done in ",
    ] {
        let line = format!("calico ipam check: {phase}");
        assert!(err.contains(&line), "{phase}: {err}");
        assert!(!checked.contains(&line), "{checked}");
    }
    assert!(
        checked.contains(&format!(
            "  {leaked} leaked; attrs Main:net1.{} Extra:node={}",
            cids[1], w.node
        )),
        "{checked}"
    );
    assert!(!checked.contains(&format!("  {kept} leaked")), "{checked}");
    assert!(
        checked.contains(&format!(
            "  IPAM block {soft_deleted} is marked deleted but still stored."
        )),
        "{checked}"
    );
    if backend == Backend::Embedded {
        assert!(
            checked.contains("keeps no nodes, skipping the affinity check"),
            "{checked}"
        );
    } else {
        assert!(
            checked.contains(&format!(
                "  IPAM block {stray} is affine to gone-{tag}, which is not a node."
            )),
            "{checked}"
        );
    }
    let report = read_json(&report_path);
    let (mine, my_handles) = world_report(&w, &report, &tag);
    assert_eq!(
        mine[leaked.to_string()][0]["inUse"],
        json!(false),
        "{mine:#}"
    );
    assert_eq!(mine[kept.to_string()][0]["inUse"], json!(true), "{mine:#}");
    // Both, as calicoctl: a soft-deleted handle holding nothing is leaked.
    assert_eq!(my_handles.len(), 2, "{report:#}");
    // -o json, --output json: the same report on stdout (as `pool list -o
    // json` prints JSON), and no file of that name.
    for flag in [&["-o", "json"][..], &["--output=json"]] {
        let (code, printed, err) = ours(&conf_path, &[&["check"][..], flag].concat());
        assert_eq!(code, 0, "{err}");
        let printed: Value = serde_json::from_str(&printed).unwrap();
        assert_eq!(
            world_report(&w, &printed, &tag),
            (mine.clone(), my_handles.clone())
        );
        assert!(!conf_path.parent().unwrap().join("json").exists());
    }

    if let Some(ctl) = &calicoctl_bin {
        // calicoctl on the same data: the same problems, the same entries.
        let their_path = w.dir.path().join("their-report.json");
        let theirs = w.calicoctl(
            ctl,
            &[
                "ipam",
                "check",
                "--show-problem-ips",
                "-o",
                their_path.to_str().unwrap(),
            ],
        );
        assert_eq!(
            world_problems(&w, &checked),
            world_problems(&w, &theirs),
            "ours:\n{checked}\ncalicoctl's:\n{theirs}"
        );
        let their_report = read_json(&their_path);
        let (their_allocs, their_handles) = world_report(&w, &their_report, &tag);
        assert_eq!(
            mine, their_allocs,
            "ours {mine:#} calicoctl's {their_allocs:#}"
        );
        assert_eq!(my_handles, their_handles);
        for key in [
            "clusterGUID",
            "clusterInformationRevision",
            "datastoreLocked",
        ] {
            assert_eq!(report[key], their_report[key], "{key}");
        }
        let their_blocks = w.calicoctl(ctl, &["ipam", "show", "--show-blocks"]);
        // (Column widths follow the whole cluster's rows: cells compared.)
        let cells = |line: String| -> Vec<String> {
            line.split('|').map(|c| c.trim().to_string()).collect()
        };
        for what in [pool.to_string(), block.to_string()] {
            assert_eq!(
                cells(row(&blocks, &what)),
                cells(row(&their_blocks, &what)),
                "{what}"
            );
        }
        let their_ip = w.calicoctl(ctl, &["ipam", "show", &format!("--ip={kept}")]);
        assert_eq!(shown, their_ip);
    }

    // release --from-report: refused while the datastore is not locked,
    // then forced.
    let from = ["release", "--from-report", report_path.to_str().unwrap()];
    let (code, _, err) = ours(&conf_path, &from);
    assert_eq!(code, 1);
    assert!(err.contains("data store is not locked"), "{err}");
    let forced = [&from[..], &["--force"]].concat();
    let (code, released, err) = ours(&conf_path, &forced);
    assert_eq!(code, 0, "{err}");
    assert!(
        released.contains("Released 1 IPs successfully"),
        "{released}"
    );
    assert!(
        released.contains("\n..\nReleased 2 handles; 0 skipped; 0 errors."),
        "{released}"
    );
    let left: Vec<IpAddr> = w.allocations().into_iter().map(|(ip, _)| ip).collect();
    assert!(!left.contains(&leaked) && left.contains(&kept), "{left:?}");
    assert!(w.handle(&orphan).is_none() && w.handle(&deleted).is_none());
    let (_, again, _) = ours(&conf_path, &["check", "--show-problem-ips"]);
    assert!(world_problems(&w, &again).is_empty(), "{again}");

    // The same report again frees nothing twice.
    let (code, stale, err) = ours(&conf_path, &forced);
    assert_eq!(code, 0, "{err}");
    assert!(
        stale.contains("1 addresses marked as leaked in the report had already been cleaned up."),
        "{stale}"
    );
    assert!(stale.contains("Released 0 handles; 2 skipped"), "{stale}");

    // release --ip.
    let (code, out, err) = ours(&conf_path, &["release", "--ip", &single.to_string()]);
    assert_eq!(
        (code, out.as_str()),
        (
            0,
            format!("Successfully released IP address {single}\n").as_str()
        ),
        "{err}"
    );
    let (code, _, err) = ours(&conf_path, &["release", "--ip", &single.to_string()]);
    assert_eq!(code, 1);
    assert!(
        err.contains(&format!("IP address {single} is not assigned")),
        "{err}"
    );
    let (code, _, err) = ours(&conf_path, &["release", "--ip", "10.0.0.300"]);
    assert_eq!(code, 2, "{err}");

    // What is left: the kept address, then nothing.
    let out = w.ipam("DEL", &cids[0], &conf, "");
    assert_eq!(out.code, 0, "{out:?}");
    assert!(w.allocations().is_empty(), "{:?}", w.allocations());
}

#[test]
fn embedded_store() {
    repair("ipam_repair_embedded", Backend::Embedded);
}

#[test]
fn etcd() {
    repair("ipam_repair_etcd", Backend::Etcd);
}

#[test]
fn kubernetes_datastore() {
    repair("ipam_repair_kdd", Backend::Kdd);
}
