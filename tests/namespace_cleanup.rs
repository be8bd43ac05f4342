//! CleanUpNamespace on the kernel: DEL goes on (to release the address)
//! once the pod's pair is gone from sight, not once the kernel has finished
//! tearing it down (10-25 ms later here); by then the pair and its host
//! route must be gone, as a new pod given the same address needs them.

mod common;

use std::time::Duration;

use calico_cni::dataplane::CleanupOutcome;
use calico_cni::dataplane::namespace_cleanup::clean_up_namespace;
use common::*;

/// A pod's pair as DEL finds it: `eth0` in the pod's namespace, the host
/// end up with a /32 route to the pod's address.
fn pod_pair(ns: &Netns, host: &str, ip: &str) {
    run_ok(
        "ip",
        &[
            "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
        ],
    );
    run_ok("ip", &["link", "set", host, "up"]);
    run_ok("ip", &["route", "add", &format!("{ip}/32"), "dev", host]);
}

fn host_route_to(ip: &str) -> bool {
    host_ip_json(&["-4", "route", "show", &format!("{ip}/32")])
        .as_array()
        .is_some_and(|routes| !routes.is_empty())
}

#[test]
fn the_cleanup_returns_once_the_pair_and_its_route_are_gone() {
    if !root_or_skip("the_cleanup_returns_once_the_pair_and_its_route_are_gone") {
        return;
    }
    let mut unlisted = 0;
    for i in 0..4 {
        let ns = Netns::new();
        let host = format!("cnc{}", &unique()[..10]);
        let ip = format!("10.254.{}.{}", 100 + i, 7);
        pod_pair(&ns, &host, &ip);
        assert!(host_route_to(&ip), "the pair's host route was made");
        let outcome = block_on(async {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            clean_up_namespace(&ns.path(), "eth0", deadline).await
        })
        .expect("the cleanup");
        // What a new pod given this address meets at once: no pair, no
        // route through the old host end.
        assert!(ns.link("eth0").is_none(), "eth0 is gone ({outcome:?})");
        assert!(
            !host_link_exists(&host),
            "the host end is gone ({outcome:?})"
        );
        assert!(!host_route_to(&ip), "the host route is gone ({outcome:?})");
        match outcome {
            CleanupOutcome::Unlisted => unlisted += 1,
            CleanupOutcome::Deleted => {}
            other => panic!("a pair was there to delete: {other:?}"),
        }
    }
    // The kernel's teardown outlasts its announcement by far here (the
    // announcement comes within a millisecond or two): the cleanup is
    // expected to have gone on at the announcement, not at the answer.
    assert!(
        unlisted >= 1,
        "no cleanup went on before the kernel's answer"
    );

    // Nothing to delete: a namespace without the interface, and none.
    let empty = Netns::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    assert_eq!(
        block_on(clean_up_namespace(&empty.path(), "eth0", deadline)).unwrap(),
        CleanupOutcome::LinkGone
    );
    assert_eq!(
        block_on(clean_up_namespace(
            "/not/a/real/netns-path",
            "eth0",
            deadline
        ))
        .unwrap(),
        CleanupOutcome::NetnsGone
    );
}
