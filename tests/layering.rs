//! The layering of src/: data flows one way, and no module imports one
//! above it. Each top-level module has a rank; code in a module may name
//! (`crate::<module>`) only modules of a lower rank. A new top-level module
//! must be given its rank here (and in the README's layout section).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Lowest first: the leaves, the contract, the services, IPAM, the
/// orchestration of the verbs, the operator's subcommands, and the process
/// edge.
const RANKS: &[(&str, u32)] = &[
    ("connection_gate", 0),
    ("handoff", 0),
    // The binary's allocator on musl (a module of main.rs, not of the library).
    ("musl_heap", 0),
    ("etcd", 1),
    ("fault", 1),
    ("k8s", 1),
    ("logging", 1),
    ("cni", 2),
    ("dataplane", 3),
    ("datastore", 3),
    ("ipam", 4),
    ("plugin", 5),
    ("cli", 6),
    ("app", 7),
];

/// Inside the plugin layer, lowest first: the invocation context and the
/// leaves beside it; the steps the verbs share; the workload kinds; the
/// verbs; the release queue that wraps them; the dispatcher (and the verbs'
/// unit tests). A file of the plugin layer may name
/// (`crate::plugin::<module>`) only modules of a lower rank, or its own.
const PLUGIN_RANKS: &[(&str, u32)] = &[
    ("context", 0),
    ("journal", 0),
    ("readiness", 0),
    ("policy_wait", 0),
    ("endpoint", 1),
    ("rollback", 1),
    ("teardown", 1),
    ("pair_ahead", 2),
    ("workload", 2),
    ("add", 3),
    ("check", 3),
    ("connection", 3),
    ("del", 3),
    ("gc", 3),
    ("status", 3),
    ("release_queue", 4),
    ("mod", 5),
    ("tests", 6),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of src/ belongs to (`None` for the crate
/// roots lib.rs and main.rs).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_string();
    (name != "lib" && name != "main").then_some(name)
}

/// The modules named as `crate::<name>` in the code (not the comments) of `text`.
fn named_modules(text: &str) -> Vec<String> {
    named_after(text, "crate::")
}

/// The names following `prefix` in the code (not the comments) of `text`.
fn named_after(text: &str, prefix: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find(prefix) {
            rest = &rest[at + prefix.len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            found.push(name);
        }
    }
    found
}

#[test]
fn no_module_imports_one_above_it() {
    let ranks: BTreeMap<&str, u32> = RANKS.iter().copied().collect();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    let mut seen = 0;
    for file in &files {
        let Some(module) = module_of(&src, file) else {
            continue;
        };
        let rank = *ranks
            .get(module.as_str())
            .unwrap_or_else(|| panic!("module {module} has no rank in tests/layering.rs"));
        let text = std::fs::read_to_string(file).unwrap();
        for named in named_modules(&text) {
            seen += 1;
            if named == module {
                continue;
            }
            let Some(&named_rank) = ranks.get(named.as_str()) else {
                violations.push(format!(
                    "{}: crate::{named} is not a ranked module",
                    file.display()
                ));
                continue;
            };
            if named_rank >= rank {
                violations.push(format!(
                    "{}: {module} (rank {rank}) uses crate::{named} (rank {named_rank})",
                    file.display()
                ));
            }
        }
    }
    assert!(
        seen > 50,
        "only {seen} crate:: paths found: the scan is broken"
    );
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// The plugin module a file of src/plugin/ belongs to (`workload` for
/// everything under src/plugin/workload/).
fn plugin_module_of(plugin: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(plugin).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_str()
        .unwrap();
    first.strip_suffix(".rs").unwrap_or(first).to_string()
}

#[test]
fn the_plugin_layer_keeps_its_own_order() {
    let ranks: BTreeMap<&str, u32> = PLUGIN_RANKS.iter().copied().collect();
    let plugin = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/plugin");
    let mut files = Vec::new();
    rust_files(&plugin, &mut files);
    let mut violations = Vec::new();
    let mut seen = 0;
    for file in &files {
        let module = plugin_module_of(&plugin, file);
        let rank = *ranks
            .get(module.as_str())
            .unwrap_or_else(|| panic!("plugin module {module} has no rank in tests/layering.rs"));
        let text = std::fs::read_to_string(file).unwrap();
        // (`super::` inside src/plugin/workload/ names the same module;
        // inside a top-level file, its own test module's parent.)
        for name in named_after(&text, "crate::plugin::") {
            seen += 1;
            // A re-export of the dispatcher's (`crate::plugin::cmd_add`) is
            // the dispatcher's module.
            let target = if ranks.contains_key(name.as_str()) {
                name.clone()
            } else {
                "mod".to_string()
            };
            if target == module {
                continue;
            }
            let target_rank = ranks[target.as_str()];
            if target_rank >= rank {
                violations.push(format!(
                    "{}: plugin::{module} (rank {rank}) uses plugin::{name} (rank {target_rank})",
                    file.display()
                ));
            }
        }
    }
    assert!(
        seen > 20,
        "only {seen} crate::plugin:: paths found: the scan is broken"
    );
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn the_scan_sees_through_comments_only() {
    assert_eq!(
        named_modules(
            "use crate::cni::Error; // crate::app does this\n/// crate::plugin\nlet x = crate::k8s::K8sClient::new;"
        ),
        vec!["cni", "k8s"]
    );
}

/// The code (not the comments) of each file of src/ outside `except`
/// that contains `needle`.
fn files_naming(needle: &str, except: &str) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files
        .iter()
        .filter(|f| !f.starts_with(src.join(except)))
        .filter(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .any(|l| l.split("//").next().unwrap_or("").contains(needle))
        })
        .map(|f| f.display().to_string())
        .collect()
}

#[test]
fn only_the_ipam_layer_makes_an_allocator() {
    // The operator's commands go through crate::ipam::calico::operator.
    assert_eq!(files_naming("Allocator::new", "ipam"), Vec::<String>::new());
    assert_eq!(
        files_naming("calico::allocator", "ipam"),
        Vec::<String>::new()
    );
}

#[test]
fn only_the_datastore_layer_tells_its_backends_by_name() {
    // The verbs ask the datastore what a backend needs
    // (crate::datastore::open::presents_kubernetes_token, ...).
    assert_eq!(
        files_naming("datastore_type ==", "datastore"),
        Vec::<String>::new()
    );
}
