//! The etcd helpers of the tests, against real etcd: the test bed's Calico
//! cluster (three started members, reads and writes with the plugin's
//! client certificate) and a private cluster losing and regaining members.

mod common;

use std::time::{Duration, Instant};

use common::etcd::{PrivateCluster, calico_etcd};
use common::unique;
use serde_json::json;

#[test]
fn shared_cluster_has_three_started_members_and_round_trips() {
    let Some(etcd) = calico_etcd("shared_cluster_has_three_started_members_and_round_trips") else {
        return;
    };
    assert_eq!(etcd.endpoints.len(), 3, "{}", etcd.endpoints_csv());
    let members = etcd.members();
    assert_eq!(members.len(), 3, "{members:?}");
    let mut names: Vec<&str> = members
        .iter()
        .map(|m| m["name"].as_str().unwrap_or(""))
        .collect();
    names.sort();
    assert_eq!(names, ["calico-etcd-0", "calico-etcd-1", "calico-etcd-2"]);
    let mut client_urls: Vec<String> = members
        .iter()
        .map(|m| {
            let urls = m["clientURLs"].as_array().expect("clientURLs (started)");
            assert_eq!(urls.len(), 1, "{m}");
            urls[0].as_str().unwrap().to_string()
        })
        .collect();
    client_urls.sort();
    let mut endpoints = etcd.endpoints.clone();
    endpoints.sort();
    assert_eq!(client_urls, endpoints);

    let prefix = format!("/calico-cni-test/{}/", unique());
    let key = format!("{prefix}a");
    assert!(etcd.get(&key).is_none());
    let value = json!({"kind": "Test", "spec": {"n": 1, "s": "-starts with a dash"}});
    etcd.put(&key, &value.to_string());
    let (got, rev) = etcd.get(&key).expect("the key just put");
    assert_eq!(got, value);
    assert!(rev > 0);
    etcd.put(&key, "\"second\"");
    let (raw, rev2) = etcd.get_raw(&key).unwrap();
    assert_eq!(raw, b"\"second\"");
    assert!(rev2 > rev, "{rev2} > {rev}");
    etcd.put(&format!("{prefix}b"), "[]");
    // Not under the prefix: a key that only starts like it.
    let sibling = format!("{}x", prefix.trim_end_matches('/'));
    etcd.put(&sibling, "{}");
    assert_eq!(
        etcd.keys(&prefix),
        [format!("{prefix}a"), format!("{prefix}b")]
    );
    assert_eq!(
        etcd.list(&prefix),
        [
            (format!("{prefix}a"), json!("second")),
            (format!("{prefix}b"), json!([]))
        ]
    );
    // Every endpoint alone serves the same data.
    for e in &etcd.endpoints {
        let one = etcd.with_endpoints(std::slice::from_ref(e));
        assert_eq!(one.get(&key).unwrap().0, json!("second"), "through {e}");
    }
    assert_eq!(etcd.delete_prefix(&prefix), 2);
    assert_eq!(etcd.delete_prefix(&prefix), 0);
    assert!(etcd.keys(&prefix).is_empty());
    assert_eq!(etcd.delete_prefix(&sibling), 1);
}

#[test]
fn private_cluster_keeps_serving_with_a_quorum_only() {
    let test = "private_cluster_keeps_serving_with_a_quorum_only";
    let t0 = Instant::now();
    let Some(mut c) = PrivateCluster::start(test, 3) else {
        return;
    };
    eprintln!("{test}: 3 members healthy in {:?}", t0.elapsed());
    let prefix = format!("/calico-cni-test/{}/", unique());
    let k = |n: &str| format!("{prefix}{n}");
    let all = c.access();
    assert_eq!(all.members().len(), 3);
    all.put(&k("0"), "0");

    // One member down (the leader, to make it harder): the two others are
    // a quorum once they elected a new leader.
    let leader = c.wait_leader(Duration::from_secs(10));
    c.stop_member(leader);
    assert!(!c.is_running(leader));
    let t = Instant::now();
    let new_leader = c.wait_leader(Duration::from_secs(10));
    eprintln!(
        "{test}: member {new_leader} leads {:?} after member {leader} died",
        t.elapsed()
    );
    let rest = all.with_endpoints(&c.running_endpoints());
    rest.try_put(&k("1"), "1", Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("a put with 2 of 3 members: {e}\n{}", c.log_tails(20)));
    // The client given every endpoint (the dead one too) gets through as well.
    all.try_put(&k("1b"), "1b", Duration::from_secs(5))
        .unwrap_or_else(|e| {
            panic!(
                "a put through all endpoints with 2 of 3 members: {e}\n{}",
                c.log_tails(20)
            )
        });

    // Two down: no quorum, a put fails within its command timeout.
    let second = (0..c.len()).find(|&i| c.is_running(i)).unwrap();
    c.stop_member(second);
    let last = all.with_endpoints(&c.running_endpoints());
    let t = Instant::now();
    let err = last
        .try_put(&k("2"), "2", Duration::from_secs(2))
        .expect_err("a put with 1 of 3 members");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "the failing put took {:?}: {err}",
        t.elapsed()
    );

    // Both back on their data: writes again, and the restarted members
    // caught up with what they missed.
    c.start_member(leader);
    c.start_member(second);
    c.wait_all_healthy(Duration::from_secs(30));
    c.wait_leader(Duration::from_secs(10));
    all.try_put(&k("3"), "3", Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("a put after the restarts: {e}\n{}", c.log_tails(20)));
    let expected: Vec<String> = ["0", "1", "1b", "3"].iter().map(|n| k(n)).collect();
    for i in 0..c.len() {
        let keys = c.member_access(i).keys(&prefix);
        // The put that failed may still have been applied once a quorum
        // came back (etcd does not promise it was not).
        let keys: Vec<String> = keys.into_iter().filter(|x| *x != k("2")).collect();
        assert_eq!(keys, expected, "member {i}");
    }
}
