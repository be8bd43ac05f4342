//! The fuzz targets without the fuzzer: every seed of
//! fuzz/corpus/ and every input the fuzzer made panic, replayed through the
//! very functions the targets run (fuzz/src/lib.rs), so that CI exercises
//! the corpus and no fixed crash comes back. Each input must be answered
//! (accepted, or rejected with the plugin's error), never panic.

#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod harness;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

/// Runs one target on one input; a panic fails with the input named.
fn replay(target: &str, input: &[u8], what: &str) -> Result<(), String> {
    let (_, run) = harness::TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .unwrap_or_else(|| panic!("no fuzz target {target}"));
    catch_unwind(AssertUnwindSafe(|| run(input)))
        .unwrap_or_else(|_| panic!("fuzz target {target} panicked on {what}: {input:?}"))
}

fn seed(target: &str, name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target)
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_seed_of_every_target_is_answered() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    for (target, _) in harness::TARGETS {
        let dir = corpus.join(target);
        let mut seeds: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        seeds.sort();
        assert!(seeds.len() >= 5, "{}: a handful of seeds", dir.display());
        for path in seeds {
            let input = std::fs::read(&path).unwrap();
            let _ = replay(target, &input, &path.display().to_string());
        }
    }
}

/// The seeds do reach the entry points: the realistic ones are accepted,
/// the broken ones rejected with the plugin's message.
#[test]
fn seeds_get_the_plugins_answers() {
    let ok = [
        ("netconf", "10-calico-kubernetes.conflist"),
        ("netconf", "calico-k8s-add.json"),
        ("netconf", "calico-check-prevresult.json"),
        ("cni_env", "kubelet-add"),
        ("cni_env", "del-no-netns-environ"),
        ("cni_args", "kubelet"),
        ("cni_args", "ip-v6"),
        ("prev_result", "0.2.0-host-local.json"),
        ("prev_result", "0.3.1-calico.json"),
        ("prev_result", "1.1.0-full.json"),
        ("annotations", "pool-and-family"),
        ("annotations", "floating-ips"),
        ("selector", "has-and-eq"),
        ("selector", "not-nested"),
        ("kubeconfig", "token.yaml"),
        ("kubeconfig", "client-cert-data.yaml"),
    ];
    for (target, name) in ok {
        let answer = replay(target, &seed(target, name), name);
        assert!(answer.is_ok(), "{target}/{name}: {answer:?}");
    }
    let rejected = [
        ("cni_env", "bad-ids", "CNI_CONTAINERID"),
        ("cni_args", "two-equals", "invalid pair"),
        ("annotations", "both-addrs", "can't have both annotations"),
        ("annotations", "null-and-empty", "specified but empty"),
        (
            "annotations",
            "mapped-v4-twice",
            "more than one IPv4 address",
        ),
        ("selector", "unterminated", "unterminated string"),
        ("kubeconfig", "exec-rejected.yaml", "not run by the fuzzer"),
        ("kubeconfig", "no-context.yaml", "no context"),
        ("kubeconfig", "token-file.yaml", "failed to read tokenFile"),
    ];
    for (target, name, message) in rejected {
        let answer = replay(target, &seed(target, name), name);
        assert!(
            answer.as_ref().is_err_and(|e| e.contains(message)),
            "{target}/{name}: {answer:?}, expected an error with {message:?}"
        );
    }
}

/// Crash 1 (kubeconfig target): a kubeconfig that starts with a UTF-16
/// byte-order mark and has an odd length made kube's reader index past the
/// end of the file (`index out of bounds: the len is 1 but the index is 1`
/// in kube-client's `read_path`). `read_kubeconfig` rejects it first.
#[test]
fn odd_length_utf16_kubeconfig_is_an_error() {
    for input in [&b"\xff\xfeA"[..], b"\xfe\xff\x00", b"\xff\xfe"] {
        let answer = replay("kubeconfig", input, "an odd-length UTF-16 kubeconfig");
        let Err(e) = answer else {
            panic!("{input:?}: accepted");
        };
        if !input.len().is_multiple_of(2) {
            assert!(e.contains("invalid UTF-16"), "{input:?}: {e}");
        }
    }
    // An even-length UTF-16 kubeconfig still reads (kube decodes it).
    let text = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"https://127.0.0.1:6443\", insecure-skip-tls-verify: true}\nusers:\n- name: u\n  user: {token: t}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n";
    let mut utf16 = vec![0xff, 0xfe];
    utf16.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
    assert_eq!(
        replay("kubeconfig", &utf16, "a UTF-16 LE kubeconfig"),
        Ok(())
    );
}

/// Crash 2 (selector target, an input of nested parentheses past the
/// fuzzer's default 4 KiB length): the recursive-descent parser recursed
/// once per `(` and overflowed the stack (AddressSanitizer: stack-overflow
/// at ~5,000 levels; the plugin dies with SIGSEGV, no CNI error). Nesting
/// is now bounded, and a deeper selector is a parse error.
#[test]
fn deeply_nested_selector_is_an_error() {
    let nested =
        |depth: usize, inner: &str| format!("{}{inner}{}", "(".repeat(depth), ")".repeat(depth));
    for depth in [1, 256] {
        for inner in ["all()", "!has(a) && b == 'c'"] {
            let input = nested(depth, inner);
            assert_eq!(
                replay("selector", input.as_bytes(), "a nested selector"),
                Ok(())
            );
        }
    }
    for depth in [257, 5_000, 100_000] {
        let input = format!("{}\na=x", nested(depth, "has(a)"));
        let answer = replay("selector", input.as_bytes(), "a deeply nested selector");
        assert!(
            answer
                .as_ref()
                .is_err_and(|e| e.contains("nested more than 256 deep")),
            "depth {depth}: {:?}",
            answer.map_err(|e| e.chars().take(200).collect::<String>())
        );
    }
    // Negations and long chains are loops, not recursion.
    let many_nots = format!("{}all()", "!".repeat(100_000));
    assert_eq!(
        replay("selector", many_nots.as_bytes(), "100,000 negations"),
        Ok(())
    );
    let long_or = std::iter::repeat_n("has(a)", 20_000)
        .collect::<Vec<_>>()
        .join(" || ");
    assert_eq!(
        replay("selector", long_or.as_bytes(), "a long chain"),
        Ok(())
    );
}
