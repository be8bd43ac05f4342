//! Test-only process faults: with the `fault-injection` feature, and
//! `CALICO_CNI_KILL_AFTER=<step>` in the environment, the process SIGKILLs
//! itself right after that step (what a node losing power, an OOM kill or
//! a runtime's `kill -9` does mid-call), so that tests can prove that what
//! a runtime does next leaks nothing. Without the feature, nothing.
//!
//! ADD steps: `ipam-handle` (calico-ipam's handle written, its block not
//! yet; on a datastore that writes both in one transaction, both), `ipam`
//! (addresses allocated), `veth` (the pair created), `addresses`
//! (container routes and addresses set), `host-routes`,
//! `endpoint` (the record written). DEL steps: `del-netns` (the pod's
//! interface gone), `del-ipam` (addresses released), `del-endpoint` (the
//! record removed). `calico-ipam -upgrade`: `upgrade-not-ready` (the
//! cluster's CNI held off, the binaries removed), `ipam-assign-block` (an
//! explicit address written to its block, its handle not yet),
//! `upgrade-assigned` (an address migrated, its file not yet removed),
//! `upgrade-ready` (the CNI let back in, the directory not yet removed).

#[cfg(feature = "fault-injection")]
pub fn kill_point(step: &str) {
    if std::env::var("CALICO_CNI_KILL_AFTER").is_ok_and(|s| s == step) {
        tracing::warn!(step, "injected SIGKILL");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}

#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn kill_point(_step: &str) {}
