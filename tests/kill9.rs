//! kill -9 at every step (the test-only `CALICO_CNI_KILL_AFTER` hook):
//! after an ADD or a DEL killed right after each of its steps, what a
//! runtime does next — DEL, repeated; or, for calico-ipam, GC with the
//! valid attachments once the sandbox is gone — leaves no address, handle,
//! endpoint record, host veth or host route behind. On the embedded store
//! with host-local and with calico-ipam, and on the test bed's API server
//! with calico-ipam.

mod common;

use common::ipam::{Backend, World};
use common::*;
use serde_json::{Value, json};

const ADD_STEPS: [&str; 6] = [
    "ipam-handle",
    "ipam",
    "veth",
    "addresses",
    "host-routes",
    "endpoint",
];
const DEL_STEPS: [&str; 3] = ["del-netns", "del-ipam", "del-endpoint"];

fn assert_killed(out: &Outcome, step: &str) {
    assert_eq!(out.code, -1, "not killed after {step}: {out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
}

fn host_routes_via(veth: &str) -> Vec<Value> {
    host_ip_json(&["route", "show"])
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["dev"] == json!(veth))
        .cloned()
        .collect()
}

fn assert_no_host_state(veth: &str, ns: &Netns, what: &str) {
    assert!(!host_link_exists(veth), "{what}: host veth {veth} left");
    assert!(host_routes_via(veth).is_empty(), "{what}: host routes left");
    assert!(ns.link("eth0").is_none(), "{what}: eth0 left in the netns");
}

#[test]
fn embedded_store_with_host_local() {
    if !root_or_skip("kill9_embedded_host_local") {
        return;
    }
    let s = Setup::new("1.0.0", false);
    let kill = |step: &'static str| [("CALICO_CNI_KILL_AFTER", step)];
    let assert_clean = |cid: &str, ns: &Netns, what: &str| {
        assert_no_host_state(&host_veth(cid), ns, what);
        assert!(
            s.reservations().is_empty(),
            "{what}: {:?}",
            s.reservations()
        );
        assert!(s.endpoints().is_empty(), "{what}: endpoint left");
    };
    // (`ipam-handle` is calico-ipam's own step.)
    for step in ADD_STEPS.into_iter().filter(|s| *s != "ipam-handle") {
        let (ns, cid) = (Netns::new(), container_id());
        let out = s.run_with("ADD", &cid, &ns.path(), "eth0", &s.conf, &kill(step));
        assert_killed(&out, step);
        s.run("DEL", &cid, &ns.path(), "eth0").assert_ok();
        s.run("DEL", &cid, &ns.path(), "eth0").assert_ok();
        assert_clean(&cid, &ns, &format!("ADD killed after {step}"));
    }
    for step in DEL_STEPS {
        let (ns, cid) = (Netns::new(), container_id());
        s.run("ADD", &cid, &ns.path(), "eth0").assert_ok();
        let out = s.run_with("DEL", &cid, &ns.path(), "eth0", &s.conf, &kill(step));
        assert_killed(&out, step);
        s.run("DEL", &cid, &ns.path(), "eth0").assert_ok();
        assert_clean(&cid, &ns, &format!("DEL killed after {step}"));
    }
}

/// The calico-ipam world's leftovers: allocations, handles, records.
fn assert_no_ipam_state(w: &World, cid: &str, what: &str) {
    assert!(w.allocations().is_empty(), "{what}: {:?}", w.allocations());
    assert!(
        w.handle(&format!("net1.{cid}")).is_none(),
        "{what}: handle left"
    );
    if w.backend != Backend::Kdd {
        assert!(w.endpoints("default").is_empty(), "{what}: endpoint left");
    }
}

fn with_calico_ipam(test: &str, backend: Backend) {
    if !root_or_skip(test) {
        return;
    }
    let Some(w) = World::new(test, backend) else {
        return;
    };
    w.pool(&w.v4(0).to_string(), json!({}));
    // On the API server: a pod per attempt; elsewhere plain CNI.
    let ns = (backend == Backend::Kdd).then(|| w.bed().namespace(json!({}), json!({})));
    let mut conf = w.conf();
    if backend == Backend::Kdd {
        conf["policy"] = json!({"type": "k8s"});
    }
    let run = |verb: &str, cid: &str, netns: &str, pod: &str, kill: Option<&str>| {
        let args = match &ns {
            Some(ns) => format!(
                "K8S_POD_NAMESPACE={};K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID={cid}",
                ns.name
            ),
            None => String::new(),
        };
        match kill {
            Some(step) => w.plugin_with_env(
                verb,
                cid,
                netns,
                &conf,
                &args,
                &[("CALICO_CNI_KILL_AFTER", step)],
            ),
            None => w.plugin(verb, cid, netns, &conf, &args, None),
        }
    };
    let veth_of = |cid: &str, pod: &str| match &ns {
        Some(ns) => calico_cni::datastore::names::veth_name_for_workload(&ns.name, pod, None),
        None => host_veth(cid),
    };
    for (i, step) in ADD_STEPS.iter().enumerate() {
        let pod = format!("add-{i}");
        if let Some(ns) = &ns {
            w.pod(ns, &pod, json!({}));
        }
        let (netns, cid) = (Netns::new(), container_id());
        assert_killed(&run("ADD", &cid, &netns.path(), &pod, Some(step)), step);
        run("DEL", &cid, &netns.path(), &pod, None).assert_ok();
        run("DEL", &cid, &netns.path(), &pod, None).assert_ok();
        let what = format!("ADD killed after {step}");
        assert_no_host_state(&veth_of(&cid, &pod), &netns, &what);
        assert_no_ipam_state(&w, &cid, &what);
    }
    for (i, step) in DEL_STEPS.iter().enumerate() {
        let pod = format!("del-{i}");
        if let Some(ns) = &ns {
            w.pod(ns, &pod, json!({}));
        }
        let (netns, cid) = (Netns::new(), container_id());
        run("ADD", &cid, &netns.path(), &pod, None).assert_ok();
        assert_killed(&run("DEL", &cid, &netns.path(), &pod, Some(step)), step);
        run("DEL", &cid, &netns.path(), &pod, None).assert_ok();
        let what = format!("DEL killed after {step}");
        assert_no_host_state(&veth_of(&cid, &pod), &netns, &what);
        assert_no_ipam_state(&w, &cid, &what);
    }
    // GC instead of DEL: the runtime removes the sandbox (its netns goes,
    // and the veth pair with it), then collects with no valid attachment.
    if backend != Backend::Kdd {
        for step in ADD_STEPS {
            let (netns, cid) = (Netns::new(), container_id());
            assert_killed(&run("ADD", &cid, &netns.path(), "", Some(step)), step);
            let veth = veth_of(&cid, "");
            drop(netns);
            let mut gc = conf.clone();
            gc["cniVersion"] = json!("1.1.0");
            gc["cni.dev/valid-attachments"] = json!([]);
            w.plugin("GC", "", "", &gc, "", None).assert_ok();
            let what = format!("ADD killed after {step}, then GC");
            // A netns is destroyed asynchronously by the kernel (and its
            // veth pair with it): wait for that, bounded.
            let gone = (0..100).any(|_| {
                let gone = !host_link_exists(&veth);
                if !gone {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                gone
            });
            assert!(gone, "{what}: host veth left");
            assert_no_ipam_state(&w, &cid, &what);
        }
    }
}

#[test]
fn embedded_store_with_calico_ipam() {
    with_calico_ipam("kill9_embedded_calico_ipam", Backend::Embedded);
}

#[test]
fn kubernetes_datastore_with_calico_ipam() {
    with_calico_ipam("kill9_kdd_calico_ipam", Backend::Kdd);
}
