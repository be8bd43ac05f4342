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
    ("etcd", 0),
    ("fault", 0),
    ("k8s", 0),
    ("logging", 0),
    ("cni", 1),
    ("dataplane", 2),
    ("datastore", 2),
    ("ipam", 3),
    ("plugin", 4),
    ("cli", 5),
    ("app", 6),
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
    let mut found = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
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

#[test]
fn the_scan_sees_through_comments_only() {
    assert_eq!(
        named_modules(
            "use crate::cni::Error; // crate::app does this\n/// crate::plugin\nlet x = crate::k8s::K8sClient::new;"
        ),
        vec!["cni", "k8s"]
    );
}
