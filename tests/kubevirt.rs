//! KubeVirt VMs keep their addresses (Calico v3.32's VM address
//! persistence), on the test bed's API server with KubeVirt's CRDs
//! (VirtualMachine, VirtualMachineInstance: our minimal manifests,
//! testbed/crds-kubevirt.json) and virt-launcher pods controlled by their
//! VMI, through calico-ipam (this binary under that name) and, for the
//! host routes, the `calico` plugin: first boot, restart (a new VMI and
//! pod, the same address), live migration (the target's pod gets the same
//! address as alternate owner and no host route), migration completed and
//! aborted, the VM deleted, a VMI missing, a standalone VMI, GC, and the
//! persistence opt-out. The allocation attributes are read back from the
//! stored block.
//!
//! IPAMConfig is the cluster's (the opt-out): the tests of this binary take
//! turns.

mod common;

use std::net::IpAddr;
use std::sync::Mutex;

use calico_cni::datastore::ipam_model::IpamConfig;
use common::ipam::{Backend, World, address, address_at};
use common::testbed::Namespace;
use common::*;
use ipnet::IpNet;
use serde_json::{Value, json};

static TURN: Mutex<()> = Mutex::new(());

const KV: &str = "/apis/kubevirt.io/v1";

/// One test's VMs: a world (its node and pools) and a namespace.
struct Vms {
    w: World,
    ns: Namespace,
}

impl Vms {
    fn new(test: &str) -> Option<Vms> {
        let w = World::new(test, Backend::Kdd)?;
        w.pool(&w.v4(0).to_string(), json!({}));
        let ns = w.bed().namespace(json!({}), json!({}));
        Some(Vms { w, ns })
    }

    fn path(&self, plural: &str) -> String {
        format!("{KV}/namespaces/{}/{plural}", self.ns.name)
    }

    /// A VirtualMachine (with a finalizer, so that a delete leaves it
    /// being deleted until the test lets it go); its UID.
    fn vm(&self, name: &str) -> String {
        let vm = self.w.bed().create(
            &self.path("virtualmachines"),
            &json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                    "metadata": {"name": name, "finalizers": ["calico-cni.test/hold"]},
                    "spec": {"runStrategy": "Always"}}),
        );
        vm["metadata"]["uid"].as_str().unwrap().to_string()
    }

    /// A VMI, controlled by the VM `owner` (name, UID) if given; its UID.
    fn vmi(&self, name: &str, owner: Option<(&str, &str)>) -> String {
        let mut vmi = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "finalizers": ["calico-cni.test/hold"]}, "spec": {}});
        if let Some((vm, uid)) = owner {
            vmi["metadata"]["ownerReferences"] = json!([{"apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachine", "name": vm, "uid": uid, "controller": true}]);
        }
        let vmi = self
            .w
            .bed()
            .create(&self.path("virtualmachineinstances"), &vmi);
        vmi["metadata"]["uid"].as_str().unwrap().to_string()
    }

    /// Marks an object deleted (its finalizer keeps it, with a
    /// deletionTimestamp).
    fn delete(&self, plural: &str, name: &str) {
        self.w
            .bed()
            .delete(&format!("{}/{name}", self.path(plural)));
    }

    /// Lets a deleted object go.
    fn release(&self, plural: &str, name: &str) {
        let path = format!("{}/{name}", self.path(plural));
        if self.w.bed().get(&path).is_some() {
            self.w
                .bed()
                .merge_patch(&path, &json!({"metadata": {"finalizers": null}}));
        }
    }

    /// A virt-launcher pod of the VMI (name, UID) on the world's node; a
    /// migration target's when `migration` names the job.
    fn launcher(&self, pod: &str, vmi: (&str, &str), migration: Option<&str>) {
        let mut labels = json!({"kubevirt.io": "virt-launcher"});
        if let Some(job) = migration {
            labels["kubevirt.io/migrationJobUID"] = json!(job);
        }
        self.ns.create_pod(json!({"metadata": {"name": pod, "labels": labels,
                "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                    "name": vmi.0, "uid": vmi.1, "controller": true, "blockOwnerDeletion": true}]},
            "spec": {"nodeName": self.w.node, "containers": [{"name": "compute", "image": "i"}]}}));
    }

    fn args(&self, pod: &str, cid: &str) -> String {
        format!(
            "K8S_POD_NAMESPACE={};K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID={cid}",
            self.ns.name
        )
    }

    /// calico-ipam for `pod` (sandbox `cid`).
    fn ipam(&self, verb: &str, pod: &str, cid: &str) -> Outcome {
        self.w.ipam(verb, cid, &self.w.conf(), &self.args(pod, cid))
    }

    fn handle(&self, vm: &str) -> String {
        format!("net1.vmi.{}.{vm}", self.ns.name)
    }

    /// The attribute entry `ip` is allocated with, from the stored block.
    fn attribute(&self, ip: IpAddr) -> Option<Value> {
        attribute_in(&self.w, ip)
    }
}

/// The attribute entry `ip` is allocated with in `w`'s stored blocks.
fn attribute_in(w: &World, ip: IpAddr) -> Option<Value> {
    {
        for b in w.blocks() {
            let cidr: IpNet = b["spec"]["cidr"].as_str().unwrap().parse().unwrap();
            if !cidr.contains(&ip) {
                continue;
            }
            let ordinal = (0..256).find(|&o| address_at(&cidr, o) == ip)?;
            let index = b["spec"]["allocations"][ordinal].as_u64()?;
            return Some(b["spec"]["attributes"][index as usize].clone());
        }
        None
    }
}

impl Drop for Vms {
    fn drop(&mut self) {
        let bed = self.w.bed();
        for plural in ["virtualmachineinstances", "virtualmachines"] {
            let list = bed.get(&self.path(plural)).unwrap_or_default();
            for item in list["items"].as_array().cloned().unwrap_or_default() {
                let name = item["metadata"]["name"].as_str().unwrap().to_string();
                self.release(plural, &name);
                self.delete(plural, &name);
            }
        }
    }
}

fn pod_owner(attrs: &Value) -> (Option<&str>, Option<&str>) {
    (attrs["pod"].as_str(), attrs["namespace"].as_str())
}

/// First boot, restart, migration (completed), VM deleted.
#[test]
fn a_vm_keeps_its_address_until_it_is_deleted() {
    let test = "a_vm_keeps_its_address_until_it_is_deleted";
    let Some(v) = Vms::new(test) else { return };
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let ns = v.ns.name.clone();
    let handle = v.handle("vm1");

    // First boot.
    let vm_uid = v.vm("vm1");
    let vmi_uid = v.vmi("vm1", Some(("vm1", &vm_uid)));
    v.launcher("virt-launcher-vm1-aaaaa", ("vm1", &vmi_uid), None);
    let (a, cid_a) = ("virt-launcher-vm1-aaaaa", container_id());
    let r = v.ipam("ADD", a, &cid_a).assert_ok().json();
    let ip = address(&r, 0).addr();
    assert_eq!(r["routes"].as_array().unwrap().len(), 1, "{r}");
    let attr = v.attribute(ip).unwrap();
    assert_eq!(attr["handle_id"], json!(handle), "{attr}");
    let active = &attr["secondary"];
    assert_eq!(pod_owner(active), (Some(a), Some(ns.as_str())));
    assert_eq!(active["vmi-name"], json!("vm1"));
    assert_eq!(active["vmi-uid"], json!(vmi_uid));
    assert_eq!(active["vm-uid"], json!(vm_uid));
    assert_eq!(active["node"], json!(v.w.node));
    assert!(attr.get("alternateOwnerAttrs").is_none(), "{attr}");
    // No handle of the container.
    assert!(v.w.handle(&format!("net1.{cid_a}")).is_none());

    // Restart: the pod goes (the VM stays), a new VMI and pod: the same address.
    v.ipam("DEL", a, &cid_a).assert_ok();
    let attr = v.attribute(ip).expect("kept across the pod's DEL");
    assert!(
        attr.get("secondary").is_none(),
        "the pod no longer owns it: {attr}"
    );
    v.release("virtualmachineinstances", "vm1");
    v.delete("virtualmachineinstances", "vm1");
    let vmi_uid2 = v.vmi("vm1", Some(("vm1", &vm_uid)));
    assert_ne!(vmi_uid2, vmi_uid);
    let (b, cid_b) = ("virt-launcher-vm1-bbbbb", container_id());
    v.launcher(b, ("vm1", &vmi_uid2), None);
    let r = v.ipam("ADD", b, &cid_b).assert_ok().json();
    assert_eq!(address(&r, 0).addr(), ip, "the VM's address again: {r}");
    assert_eq!(r["routes"].as_array().unwrap().len(), 1, "{r}");
    let attr = v.attribute(ip).unwrap();
    assert_eq!(pod_owner(&attr["secondary"]), (Some(b), Some(ns.as_str())));
    assert_eq!(attr["secondary"]["vmi-uid"], json!(vmi_uid2));

    // Live migration: the target's pod, the same address as alternate owner, no routes.
    let (c, cid_c) = ("virt-launcher-vm1-ccccc", container_id());
    v.launcher(c, ("vm1", &vmi_uid2), Some("mig-1"));
    let r = v.ipam("ADD", c, &cid_c).assert_ok().json();
    assert_eq!(address(&r, 0).addr(), ip, "{r}");
    assert!(
        r.get("routes")
            .is_none_or(|r| r.as_array().unwrap().is_empty()),
        "a target gets no routes: {r}"
    );
    let attr = v.attribute(ip).unwrap();
    assert_eq!(pod_owner(&attr["secondary"]), (Some(b), Some(ns.as_str())));
    assert_eq!(
        pod_owner(&attr["alternateOwnerAttrs"]),
        (Some(c), Some(ns.as_str()))
    );
    assert_eq!(attr["alternateOwnerAttrs"]["vmim-uid"], json!("mig-1"));

    // GC with neither pod among the valid attachments: the VM's handle is no container's.
    let gc = json!([{"containerID": "someone-else", "ifname": "eth0"}]);
    let mut conf = v.w.conf();
    conf["cniVersion"] = json!("1.1.0");
    conf["cni.dev/valid-attachments"] = gc;
    let env = env_of(&[
        ("CNI_COMMAND", "GC"),
        ("CNI_PATH", &v.w.bin.display().to_string()),
    ]);
    exec(
        &v.w.bin.join("calico-ipam").display().to_string(),
        &env,
        &conf.to_string(),
    )
    .assert_ok();
    assert!(v.attribute(ip).is_some(), "GC freed the VM's address");

    // The migration completes: Felix makes the target the active owner.
    swap_owners(&v, ip);
    // The source's pod goes: its slot (now the alternate) is cleared, the address stays.
    v.ipam("DEL", b, &cid_b).assert_ok();
    let attr = v.attribute(ip).unwrap();
    assert_eq!(pod_owner(&attr["secondary"]), (Some(c), Some(ns.as_str())));
    assert!(attr.get("alternateOwnerAttrs").is_none(), "{attr}");

    // The VM is deleted: the last pod's DEL releases the address.
    v.delete("virtualmachines", "vm1");
    v.ipam("DEL", c, &cid_c).assert_ok();
    assert!(v.attribute(ip).is_none(), "released with the VM");
    assert!(v.w.handle(&handle).is_none());
    v.release("virtualmachines", "vm1");
}

/// As Felix does when a migration completes: the alternate owner becomes
/// the active one (written here, as the admin, compare-and-swap).
fn swap_owners(v: &Vms, ip: IpAddr) {
    for mut b in v.w.blocks() {
        let cidr: IpNet = b["spec"]["cidr"].as_str().unwrap().parse().unwrap();
        if !cidr.contains(&ip) {
            continue;
        }
        let ordinal = (0..256).find(|&o| address_at(&cidr, o) == ip).unwrap();
        let index = b["spec"]["allocations"][ordinal].as_u64().unwrap() as usize;
        let attr = &mut b["spec"]["attributes"][index];
        let active = attr["secondary"].take();
        attr["secondary"] = attr["alternateOwnerAttrs"].take();
        attr["alternateOwnerAttrs"] = active;
        v.w.update::<calico_cni::datastore::ipam_model::IpamBlock>(b);
        return;
    }
    panic!("{ip} is in no block");
}

/// A migration aborted (the target's pod goes first), a VMI missing, a
/// standalone VMI deleted.
#[test]
fn aborted_migrations_missing_and_standalone_vmis() {
    let test = "aborted_migrations_missing_and_standalone_vmis";
    let Some(v) = Vms::new(test) else { return };
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let ns = v.ns.name.clone();

    // A standalone VMI (no VM) with a migration that is aborted.
    let vmi_uid = v.vmi("vm2", None);
    let (a, cid_a) = ("virt-launcher-vm2-aaaaa", container_id());
    v.launcher(a, ("vm2", &vmi_uid), None);
    let ip = address(&v.ipam("ADD", a, &cid_a).assert_ok().json(), 0).addr();
    let (t, cid_t) = ("virt-launcher-vm2-ttttt", container_id());
    v.launcher(t, ("vm2", &vmi_uid), Some("mig-2"));
    v.ipam("ADD", t, &cid_t).assert_ok();
    v.ipam("DEL", t, &cid_t).assert_ok();
    let attr = v.attribute(ip).expect("kept: the source still runs");
    assert_eq!(pod_owner(&attr["secondary"]), (Some(a), Some(ns.as_str())));
    assert!(attr.get("alternateOwnerAttrs").is_none(), "{attr}");
    // A DEL again (a runtime retrying): nothing changes.
    v.ipam("DEL", t, &cid_t).assert_ok();
    assert!(v.attribute(ip).is_some());

    // The standalone VMI is deleted: its pod's DEL releases the address.
    v.delete("virtualmachineinstances", "vm2");
    v.ipam("DEL", a, &cid_a).assert_ok();
    assert!(v.attribute(ip).is_none(), "released with the VMI");
    v.release("virtualmachineinstances", "vm2");

    // A target whose VM has no address: refused, nothing taken.
    let vmi3 = v.vmi("vm3", None);
    let (t3, cid_t3) = ("virt-launcher-vm3-ttttt", container_id());
    v.launcher(t3, ("vm3", &vmi3), Some("mig-3"));
    let out = v.ipam("ADD", t3, &cid_t3);
    assert_eq!(out.code, 1, "{out:?}");
    let msg = out.json()["msg"].as_str().unwrap().to_string();
    assert!(
        msg.contains(&format!(
            "migration target pod but no IP allocated to VMI handle {}",
            v.handle("vm3")
        )),
        "{msg}"
    );

    // A pod whose VMI does not exist: Calico's error, nothing taken.
    let (m, cid_m) = ("virt-launcher-gone-mmmmm", container_id());
    v.launcher(m, ("gone", "3d5c2b1a-0000-4000-8000-000000000000"), None);
    let out = v.ipam("ADD", m, &cid_m);
    assert_eq!(out.code, 1, "{out:?}");
    let msg = out.json()["msg"].as_str().unwrap().to_string();
    assert!(
        msg.contains(&format!(
            "failed to get VMI info: failed to query VMI resource {ns}/gone"
        )),
        "{msg}"
    );
    // A VMI that is another than the pod's (its UID).
    let other = v.vmi("vm4", None);
    let (p4, cid_4) = ("virt-launcher-vm4-ppppp", container_id());
    v.launcher(p4, ("vm4", "00000000-0000-4000-8000-000000000004"), None);
    let out = v.ipam("ADD", p4, &cid_4);
    assert!(
        out.json()["msg"].as_str().unwrap().contains(&format!(
            "VMI UID mismatch: pod ownerReference has 00000000-0000-4000-8000-000000000004 but VMI resource has {other}"
        )),
        "{out:?}"
    );
    assert!(v.w.allocations().is_empty(), "{:?}", v.w.allocations());
}

/// IPAMConfig `kubeVirtVMAddressPersistence: Disabled`: a virt-launcher pod
/// is an ordinary pod (its container's handle), a migration target is
/// refused.
#[test]
fn the_persistence_opt_out() {
    let test = "the_persistence_opt_out";
    let Some(v) = Vms::new(test) else { return };
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let before =
        v.w.get::<IpamConfig>("default")
            .expect("the test bed's IPAMConfig");
    let mut off = before.clone();
    off["spec"]["kubeVirtVMAddressPersistence"] = json!("Disabled");
    v.w.update::<IpamConfig>(off);
    let restore = || {
        let mut now = v.w.get::<IpamConfig>("default").unwrap();
        now["spec"] = before["spec"].clone();
        v.w.update::<IpamConfig>(now);
    };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let vm_uid = v.vm("vm5");
        let vmi_uid = v.vmi("vm5", Some(("vm5", &vm_uid)));
        let (a, cid_a) = ("virt-launcher-vm5-aaaaa", container_id());
        v.launcher(a, ("vm5", &vmi_uid), None);
        let ip = address(&v.ipam("ADD", a, &cid_a).assert_ok().json(), 0).addr();
        let attr = v.attribute(ip).unwrap();
        assert_eq!(attr["handle_id"], json!(format!("net1.{cid_a}")), "{attr}");
        assert!(attr["secondary"].get("vmi-name").is_none(), "{attr}");
        let (t, cid_t) = ("virt-launcher-vm5-ttttt", container_id());
        v.launcher(t, ("vm5", &vmi_uid), Some("mig-5"));
        let out = v.ipam("ADD", t, &cid_t);
        assert_eq!(out.code, 1, "{out:?}");
        assert!(
            out.json()["msg"].as_str().unwrap().contains(
                "live migration target pod is not allowed when KubeVirtVMAddressPersistence is disabled"
            ),
            "{out:?}"
        );
        // An ordinary pod's DEL: released, though the VM stays.
        v.ipam("DEL", a, &cid_a).assert_ok();
        assert!(v.attribute(ip).is_none());
    }));
    restore();
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// Through the `calico` plugin: a migration target's pod is networked
/// with the VM's address and no host route; the source's pod has its
/// route.
#[test]
fn a_migration_target_gets_no_host_route() {
    let test = "a_migration_target_gets_no_host_route";
    if !root_or_skip(test) {
        return;
    }
    let Some(v) = Vms::new(test) else { return };
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let vm_uid = v.vm("vm6");
    let vmi_uid = v.vmi("vm6", Some(("vm6", &vm_uid)));
    let mut conf = v.w.conf();
    conf["policy"] = json!({"type": "k8s"});
    let plugin = |verb: &str, pod: &str, cid: &str, netns: &Netns| {
        v.w.plugin(verb, cid, &netns.path(), &conf, &v.args(pod, cid), None)
    };
    let (s, cid_s, ns_s) = ("virt-launcher-vm6-sssss", container_id(), Netns::new());
    v.launcher(s, ("vm6", &vmi_uid), None);
    let r = plugin("ADD", s, &cid_s, &ns_s).assert_ok().json();
    let ip = address(&r, 0).addr();
    let routes_to = |ip: IpAddr| -> Vec<String> {
        let out = std::process::Command::new("ip")
            .args(["-j", "route", "show", &format!("{ip}/32")])
            .output()
            .unwrap();
        let routes: Value = serde_json::from_slice(&out.stdout).unwrap_or(json!([]));
        routes
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["dev"].as_str().map(str::to_string))
            .collect()
    };
    let source_routes = routes_to(ip);
    assert_eq!(
        source_routes.len(),
        1,
        "the source's host route: {source_routes:?}"
    );
    let (t, cid_t, ns_t) = ("virt-launcher-vm6-ttttt", container_id(), Netns::new());
    v.launcher(t, ("vm6", &vmi_uid), Some("mig-6"));
    let r = plugin("ADD", t, &cid_t, &ns_t).assert_ok().json();
    assert_eq!(address(&r, 0).addr(), ip, "{r}");
    assert_eq!(routes_to(ip), source_routes, "no host route for the target");
    let log = v.w.log();
    assert!(
        log.contains("Skipping host-side route setup (skipHostSideRoutes=true)"),
        "{log}"
    );
    plugin("DEL", t, &cid_t, &ns_t).assert_ok();
    v.delete("virtualmachines", "vm6");
    plugin("DEL", s, &cid_s, &ns_s).assert_ok();
    assert!(v.attribute(ip).is_none());
    assert!(routes_to(ip).is_empty());
}

/// An allocation's attribute entry as it compares between two binaries'
/// runs: the timestamps dropped (each owner's), the rest as stored.
fn comparable_attribute(attr: &Value) -> Value {
    let mut attr = attr.clone();
    for slot in ["secondary", "alternateOwnerAttrs"] {
        if let Some(owner) = attr.get_mut(slot).and_then(Value::as_object_mut) {
            owner.remove("timestamp");
        }
    }
    attr
}

/// Calico v3.32.1's calico-ipam and ours through Calico's own KubeVirt
/// specs (its suite's "live migration" and "should release handle when
/// both owners are deleted with VM deleting", source first and target
/// first): the same VM, VMI and pods for each binary in turn; the source
/// ADDed, the migration target ADDed (the same addresses, no routes, the
/// target the alternate owner with pod, namespace, VMI name and UID, VMIM
/// UID and VM UID), the VM deleted, then the two pods' DELs in either
/// order: after each step the stored attribute entry is the one Calico's
/// binary stores, and the handle goes with the last owner; on the API
/// server and on etcd.
#[test]
fn a_migration_is_stored_and_released_as_calicos_binary_does() {
    let test = "a_migration_is_stored_and_released_as_calicos_binary_does";
    let Some(v) = Vms::new(test) else { return };
    let Some(calico) = common::testbed::peer(test, "calico-v3.32.1/calico-ipam") else {
        return;
    };
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    // The same on the etcd datastore: the VMs and pods on the API server,
    // the addresses in etcd.
    let Some(e) = World::new(test, Backend::Etcd) else {
        return;
    };
    e.pool(&e.v4(0).to_string(), json!({}));
    for w in [&v.w, &e] {
        migration_as_calicos(&v, w, &calico);
    }
}

/// [`a_migration_is_stored_and_released_as_calicos_binary_does`] with the
/// addresses in `w` (`v`'s own world, or one on etcd).
fn migration_as_calicos(v: &Vms, w: &World, calico: &std::path::Path) {
    let ns = v.ns.name.clone();
    let ours = v.w.bin.join("calico-ipam");
    let mut conf = w.conf();
    conf["nodename_file_optional"] = json!(true);
    conf["kubernetes"] = json!({"kubeconfig": v.w.bed().cni_kubeconfig()});
    conf["policy"] = json!({"type": "k8s"});
    let run = |binary: &std::path::Path, verb: &str, pod: &str, cid: &str| -> Outcome {
        let mut env = env_of(&[
            ("CNI_COMMAND", verb),
            ("CNI_CONTAINERID", cid),
            ("CNI_NETNS", "/var/run/netns/not-needed"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", &v.w.bin.display().to_string()),
        ]);
        env.insert(
            "CNI_ARGS".into(),
            format!("IgnoreUnknown=1;{}", v.args(pod, cid)),
        );
        exec(&binary.display().to_string(), &env, &conf.to_string())
    };
    for source_first in [true, false] {
        let mut seen: Vec<Vec<Value>> = Vec::new();
        for (who, binary) in [("Calico's", calico), ("ours", ours.as_path())] {
            let vm = format!(
                "vm-{}-{}-{}",
                if w.backend == Backend::Etcd { "e" } else { "k" },
                u8::from(source_first),
                seen.len()
            );
            let vm_uid = v.vm(&vm);
            let vmi_uid = v.vmi(&vm, Some((&vm, &vm_uid)));
            let (src, cid_s) = (format!("virt-launcher-{vm}-source"), container_id());
            let (tgt, cid_t) = (format!("virt-launcher-{vm}-target"), container_id());
            v.launcher(&src, (&vm, &vmi_uid), None);
            v.launcher(&tgt, (&vm, &vmi_uid), Some("mig-uid-1"));
            let what = format!("{who} on {:?} (source first: {source_first})", w.backend);
            let mut steps = Vec::new();

            let r = run(binary, "ADD", &src, &cid_s);
            assert_eq!(r.code, 0, "{what}: source ADD {r:?}");
            let ip = address(&r.json(), 0).addr();
            let t = run(binary, "ADD", &tgt, &cid_t);
            assert_eq!(t.code, 0, "{what}: target ADD {t:?}");
            let t = t.json();
            assert_eq!(address(&t, 0).addr(), ip, "{what}: {t}");
            assert!(
                t.get("routes")
                    .is_none_or(|r| r.as_array().unwrap().is_empty()),
                "{what}: a target gets no routes: {t}"
            );
            steps.push(comparable_attribute(&attribute_in(w, ip).unwrap()));
            v.delete("virtualmachines", &vm);
            let order = if source_first {
                [(&src, &cid_s), (&tgt, &cid_t)]
            } else {
                [(&tgt, &cid_t), (&src, &cid_s)]
            };
            let (first, second) = (order[0], order[1]);
            let out = run(binary, "DEL", first.0, first.1);
            assert_eq!(out.code, 0, "{what}: first DEL {out:?}");
            steps
                .push(comparable_attribute(&attribute_in(w, ip).unwrap_or_else(
                    || panic!("{what}: released with an owner left"),
                )));
            let out = run(binary, "DEL", second.0, second.1);
            assert_eq!(out.code, 0, "{what}: second DEL {out:?}");
            assert!(
                attribute_in(w, ip).is_none(),
                "{what}: not released with the VM"
            );
            assert!(
                w.handle(&v.handle(&vm)).is_none(),
                "{what}: the handle stayed"
            );
            v.release("virtualmachines", &vm);
            // The names that differ between the two runs, made alike.
            let text = serde_json::to_string(&steps)
                .unwrap()
                .replace(&vm_uid, "<vm-uid>")
                .replace(&vmi_uid, "<vmi-uid>")
                .replace(&vm, "<vm>");
            seen.push(serde_json::from_str(&text).unwrap());
        }
        assert_eq!(
            seen[1],
            seen[0],
            "{:?}, source first: {source_first}: ours {:#} Calico's {:#}",
            w.backend,
            json!(seen[1]),
            json!(seen[0])
        );
        let target = &seen[0][0]["alternateOwnerAttrs"];
        assert_eq!(pod_owner(target).1, Some(ns.as_str()), "{:#}", seen[0][0]);
    }
}
