//! The layering of src/: data flows one way, and no module imports one
//! above it. Each top-level module has a rank; code in a module may name
//! (`crate::<module>`) only modules of a lower rank. A new top-level module
//! must be given its rank here (and in docs/layout.md, which names every
//! file of src/: checked here too). No two files import each other,
//! directly or round a loop (the file graph, below).

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
    ("status_cache", 0),
    ("status_watch", 0),
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

// ---------------------------------------------------------------------------
// No import cycle between files.
//
// Each file of src/ is a node. An edge goes from a file to the file that
// defines what one of its paths names: every `crate::…`, `super::…`,
// `self::…` path (in code and in `use` trees), a path that starts with a
// module declared in the file (`mod foo;` then `foo::bar`), and the
// binary's `calico_cni::…`. A path is resolved to its longest prefix that is
// a module (a file's own module — `mod.rs`, or `foo.rs` beside its `foo/`
// children — or an inline module such as `mod tests { … }`, which belongs
// to its file); when the next name is a re-export of that module
// (`pub use child::Name;`), the path goes on through the re-export to the
// file that defines it. A re-export is an alias, not a dependency: it makes
// no edge of its own. `mod foo;` itself is no edge either, and neither is
// a path into a module the file is nested in (`super::Error` in a child of
// the module that defines `Error`, or `crate::datastore::Kind` in
// `datastore/etcd/codec.rs`): a child is part of its parent, which declares
// it and is its facade; the graph shows how files are tangled across the
// tree, so a file and its parent's other files (its siblings, cousins, …)
// never name each other both ways, directly or round a longer loop.

/// A source file's text with comments, strings and character literals
/// blanked out (newlines kept), so that only code is left.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, c: u8| out.push(if c == b'\n' { b'\n' } else { b' ' });
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if (c == b'r' || (c == b'b' && b.get(i + 1) == Some(&b'r')))
            && !b[..i]
                .last()
                .is_some_and(|p| p.is_ascii_alphanumeric() || *p == b'_')
            && {
                let start = if c == b'b' { i + 2 } else { i + 1 };
                let hashes = b[start..].iter().take_while(|&&h| h == b'#').count();
                b.get(start + hashes) == Some(&b'"')
            }
        {
            // A raw string: r"…", r#"…"#, br"…".
            let start = if c == b'b' { i + 2 } else { i + 1 };
            let hashes = b[start..].iter().take_while(|&&h| h == b'#').count();
            let mut j = start + hashes + 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == b'"'
                    && b[j + 1..]
                        .iter()
                        .take(hashes)
                        .filter(|&&h| h == b'#')
                        .count()
                        == hashes
                {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            for &x in &b[i..j.min(b.len())] {
                blank(&mut out, x);
            }
            i = j;
        } else if c == b'"' {
            blank(&mut out, c);
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    blank(&mut out, b[i]);
                    i += 1;
                }
                if i < b.len() {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
            if i < b.len() {
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if c == b'\'' {
            // A character literal ('{', '\n', '\u{7f}'), or a lifetime.
            let end = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|&x| x == b'\'')
                    .map(|p| i + 2 + p)
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 2)
            } else {
                // A multi-byte character: '…' within 5 bytes.
                let rest = &b[i + 1..(i + 6).min(b.len())];
                match rest.iter().position(|&x| x == b'\'') {
                    Some(p) if p > 1 && !rest[0].is_ascii() => Some(i + 1 + p),
                    _ => None,
                }
            };
            match end {
                Some(end) => {
                    for &x in &b[i..=end] {
                        blank(&mut out, x);
                    }
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Path,
    Open,
    Close,
    Comma,
    Star,
    Semi,
    Other,
}

fn tokens(code: &str) -> Vec<Token> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(Token::Ident(code[start..i].to_string()));
            continue;
        }
        if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(Token::Other);
            continue;
        }
        match c {
            b':' if b.get(i + 1) == Some(&b':') => {
                out.push(Token::Path);
                i += 2;
                continue;
            }
            b'{' => out.push(Token::Open),
            b'}' => out.push(Token::Close),
            b',' => out.push(Token::Comma),
            b'*' => out.push(Token::Star),
            b';' => out.push(Token::Semi),
            b' ' | b'\n' | b'\t' | b'\r' => {}
            _ => out.push(Token::Other),
        }
        i += 1;
    }
    out
}

/// One path of a file: its segments as written, the inline module it is
/// written in (relative to the file's module), whether it is a leaf of a
/// `pub use` (a re-export: an alias), and the name it is bound to then.
#[derive(Debug)]
struct WrittenPath {
    segments: Vec<String>,
    inline: Vec<String>,
    reexport_as: Option<String>,
}

/// What a file declares and names.
#[derive(Debug, Default)]
struct Scanned {
    /// Child modules declared as `mod foo;` at the file's level.
    children: Vec<String>,
    /// Inline modules (`mod tests { … }`), as paths inside the file.
    inline_modules: Vec<Vec<String>>,
    paths: Vec<WrittenPath>,
}

/// Reads a use tree (or a plain path) starting at `tokens[i]`, with the
/// segments before it in `prefix`; pushes every leaf and returns the index
/// after it.
fn read_tree(
    tokens: &[Token],
    mut i: usize,
    prefix: Vec<String>,
    leaves: &mut Vec<(Vec<String>, Option<String>)>,
) -> usize {
    let mut segments = prefix;
    loop {
        match tokens.get(i) {
            Some(Token::Ident(name)) => {
                segments.push(name.clone());
                i += 1;
            }
            Some(Token::Open) => {
                i += 1;
                loop {
                    match tokens.get(i) {
                        Some(Token::Close) => return i + 1,
                        Some(Token::Comma) => i += 1,
                        None => return i,
                        _ => {
                            let before = i;
                            i = read_tree(tokens, i, segments.clone(), leaves);
                            if i == before {
                                i += 1;
                            }
                        }
                    }
                }
            }
            Some(Token::Star) => {
                leaves.push((segments, None));
                return i + 1;
            }
            _ => {
                leaves.push((segments, None));
                return i;
            }
        }
        match tokens.get(i) {
            Some(Token::Path) => i += 1,
            Some(Token::Ident(word)) if word == "as" => {
                let alias = match tokens.get(i + 1) {
                    Some(Token::Ident(a)) => Some(a.clone()),
                    _ => None,
                };
                leaves.push((segments, alias));
                return i + 2;
            }
            _ => {
                leaves.push((segments, None));
                return i;
            }
        }
    }
}

fn scan(text: &str) -> Scanned {
    let tokens = tokens(&code_only(text));
    let mut scanned = Scanned::default();
    // The inline modules open at this point, with the brace depth each opened at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            Token::Open => {
                depth += 1;
                i += 1;
            }
            Token::Close => {
                depth -= 1;
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                i += 1;
            }
            Token::Ident(word) if word == "mod" => {
                if let Some(Token::Ident(name)) = tokens.get(i + 1) {
                    match tokens.get(i + 2) {
                        Some(Token::Semi) if inline.is_empty() => {
                            scanned.children.push(name.clone())
                        }
                        Some(Token::Open) => {
                            inline.push((name.clone(), depth));
                            scanned
                                .inline_modules
                                .push(inline.iter().map(|(n, _)| n.clone()).collect());
                            depth += 1;
                            i += 3;
                            continue;
                        }
                        _ => {}
                    }
                }
                i += 2;
            }
            Token::Ident(word) if word == "use" => {
                // `pub use` (any visibility) re-exports.
                let is_pub = |at: usize| tokens.get(at) == Some(&Token::Ident("pub".into()));
                // `pub use`, `pub(crate) use`.
                let public = (i >= 1 && is_pub(i - 1))
                    || (i >= 4 && is_pub(i - 4) && tokens[i - 1] == Token::Other);
                let mut leaves = Vec::new();
                let mut j = i + 1;
                if tokens.get(j) == Some(&Token::Path) {
                    j += 1; // `use ::std::…`
                }
                i = read_tree(&tokens, j, Vec::new(), &mut leaves);
                let here: Vec<String> = inline.iter().map(|(n, _)| n.clone()).collect();
                for (mut segments, alias) in leaves {
                    if segments.last().is_some_and(|s| s == "self") {
                        segments.pop();
                    }
                    let reexport_as = public
                        .then(|| alias.clone().or_else(|| segments.last().cloned()))
                        .flatten();
                    scanned.paths.push(WrittenPath {
                        segments,
                        inline: here.clone(),
                        reexport_as,
                    });
                }
            }
            Token::Ident(first) if i == 0 || tokens[i - 1] != Token::Path => {
                let first = first.clone();
                if tokens.get(i + 1) == Some(&Token::Path) && first != "Self" {
                    let mut leaves = Vec::new();
                    i = read_tree(&tokens, i, Vec::new(), &mut leaves);
                    let here: Vec<String> = inline.iter().map(|(n, _)| n.clone()).collect();
                    for (segments, _) in leaves {
                        scanned.paths.push(WrittenPath {
                            segments,
                            inline: here.clone(),
                            reexport_as: None,
                        });
                    }
                } else {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    scanned
}

/// The module path of a file of the library (`datastore/etcd/codec.rs` →
/// `datastore::etcd::codec`; `cni/mod.rs` → `cni`; `lib.rs` → the root);
/// `None` for the binary's files (main.rs and its modules).
fn module_path_of(rel: &Path) -> Option<Vec<String>> {
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_str().unwrap().to_string())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.strip_suffix(".rs").unwrap().to_string();
    if parts.is_empty() && (stem == "main" || stem == "musl_heap") {
        return None;
    }
    if stem != "mod" && !(parts.is_empty() && stem == "lib") {
        parts.push(stem);
    }
    Some(parts)
}

struct Graph {
    /// Library files by module path (a file's own module, and its inline modules).
    modules: BTreeMap<Vec<String>, String>,
    /// Re-exports: (module, name) → the path it aliases (absolute).
    reexports: BTreeMap<(Vec<String>, String), Vec<String>>,
    /// Every file's edges, to the files it names.
    edges: BTreeMap<String, std::collections::BTreeSet<String>>,
}

impl Graph {
    /// The file that defines what the absolute `path` names.
    fn resolve(&self, path: &[String], hops: u32) -> Option<String> {
        let len = (0..=path.len())
            .rev()
            .find(|&n| self.modules.contains_key(&path[..n]))?;
        let module = &path[..len];
        if hops < 8
            && let Some(name) = path.get(len)
            && let Some(target) = self.reexports.get(&(module.to_vec(), name.clone()))
        {
            let mut through = target.clone();
            through.extend_from_slice(&path[len + 1..]);
            if let Some(file) = self.resolve(&through, hops + 1) {
                return Some(file);
            }
        }
        Some(self.modules[module].clone())
    }
}

/// Whether `ancestor` is a module `module` is nested in (below it, not it).
fn is_ancestor(ancestor: &[String], module: Option<&[String]>) -> bool {
    module.is_some_and(|m| m.len() > ancestor.len() && m.starts_with(ancestor))
}

/// `written` made absolute, in `module` (the file's module and the inline
/// modules it is written in); `None` for a path outside the crate.
fn absolute(
    written: &[String],
    module: &[String],
    children: &BTreeMap<Vec<String>, String>,
    binary: bool,
) -> Option<Vec<String>> {
    let first = written.first()?;
    if binary {
        return (first == "calico_cni").then(|| written[1..].to_vec());
    }
    match first.as_str() {
        "crate" => Some(written[1..].to_vec()),
        "self" => Some(module.iter().chain(&written[1..]).cloned().collect()),
        "super" => {
            let ups = written.iter().take_while(|s| *s == "super").count();
            let base = module.len().checked_sub(ups)?;
            Some(
                module[..base]
                    .iter()
                    .chain(&written[ups..])
                    .cloned()
                    .collect(),
            )
        }
        name => {
            // A module declared here (`mod foo;` / `mod foo { … }`).
            let mut candidate = module.to_vec();
            candidate.push(name.to_string());
            children
                .contains_key(&candidate)
                .then(|| module.iter().chain(written).cloned().collect())
        }
    }
}

fn file_graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut scanned = Vec::new();
    let mut graph = Graph {
        modules: BTreeMap::new(),
        reexports: BTreeMap::new(),
        edges: BTreeMap::new(),
    };
    for file in &files {
        let rel = file.strip_prefix(src).unwrap();
        let name = rel.to_str().unwrap().to_string();
        let text = std::fs::read_to_string(file).unwrap();
        let s = scan(&text);
        let module = module_path_of(rel);
        if let Some(module) = &module {
            graph.modules.insert(module.clone(), name.clone());
            for inline in &s.inline_modules {
                let mut path = module.clone();
                path.extend(inline.iter().cloned());
                graph.modules.insert(path, name.clone());
            }
        }
        graph.edges.insert(name.clone(), Default::default());
        scanned.push((name, module, s));
    }
    // Re-exports first, then every other path.
    for (_, module, s) in &scanned {
        let Some(module) = module else { continue };
        for p in &s.paths {
            let Some(alias) = &p.reexport_as else {
                continue;
            };
            let here: Vec<String> = module.iter().chain(&p.inline).cloned().collect();
            if let Some(target) = absolute(&p.segments, &here, &graph.modules, false) {
                graph.reexports.insert((here, alias.clone()), target);
            }
        }
    }
    let file_modules: BTreeMap<String, Vec<String>> = scanned
        .iter()
        .filter_map(|(name, module, _)| Some((name.clone(), module.clone()?)))
        .collect();
    for (name, module, s) in &scanned {
        let binary = module.is_none();
        let base = module.clone().unwrap_or_default();
        for p in &s.paths {
            if p.reexport_as.is_some() {
                continue;
            }
            let here: Vec<String> = base.iter().chain(&p.inline).cloned().collect();
            let Some(target) = absolute(&p.segments, &here, &graph.modules, binary) else {
                continue;
            };
            if let Some(file) = graph.resolve(&target, 0)
                && file != *name
                && !is_ancestor(&file_modules[&file], module.as_deref())
            {
                graph.edges.get_mut(name).unwrap().insert(file);
            }
        }
    }
    graph
}

/// Every cycle's files, one per strongly connected component of more than
/// one file (Tarjan), each told as a walk `a → b → … → a`.
fn cycles(edges: &BTreeMap<String, std::collections::BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, std::collections::BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: std::collections::BTreeSet<&'a str>,
        components: Vec<Vec<&'a str>>,
    }
    fn connect<'a>(s: &mut State<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.edges.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                connect(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on_stack.remove(w);
                component.push(w);
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                s.components.push(component);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: Default::default(),
        components: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            connect(&mut s, v);
        }
    }
    // Each component told as one cycle through its first file: the
    // shortest way back to it (breadth first, inside the component).
    s.components
        .iter()
        .map(|component| {
            let inside: std::collections::BTreeSet<&str> = component.iter().copied().collect();
            let start = *inside.iter().next().unwrap();
            let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
            let mut queue = std::collections::VecDeque::from([start]);
            let mut last = start;
            'search: while let Some(v) = queue.pop_front() {
                for w in &edges[v] {
                    let w = w.as_str();
                    if w == start {
                        last = v;
                        break 'search;
                    }
                    if inside.contains(w) && !came_from.contains_key(w) {
                        came_from.insert(w, v);
                        queue.push_back(w);
                    }
                }
            }
            let mut walk = vec![start.to_string()];
            let mut v = last;
            while v != start {
                walk.push(v.to_string());
                v = came_from[v];
            }
            walk.push(start.to_string());
            let end = walk.len() - 1;
            walk[1..end].reverse();
            let mut others: Vec<&str> = inside
                .iter()
                .copied()
                .filter(|f| !walk.iter().any(|w| w == f))
                .collect();
            others.sort();
            walk.extend(others.iter().map(|o| format!("(also {o})")));
            walk
        })
        .collect()
}

#[test]
fn no_import_cycle_between_files() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = file_graph(&src);
    let edges: usize = graph.edges.values().map(|e| e.len()).sum();
    assert!(
        edges > 300,
        "only {edges} edges between the files of src/: the scan is broken"
    );
    let found = cycles(&graph.edges);
    assert!(
        found.is_empty(),
        "import cycles between files of src/:\n{}",
        found
            .iter()
            .map(|c| c.join(" → "))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn the_file_graph_resolves_paths_and_finds_cycles() {
    let s = scan(
        "use super::{a::B, c as d};\n// crate::x::y\nmod tests { use super::*; fn f() { let _ = crate::cni::error::Error::Io; let c = '{'; } }\npub use self::e::F;\nlet s = \"crate::z\";",
    );
    let written: Vec<String> = s.paths.iter().map(|p| p.segments.join("::")).collect();
    assert_eq!(
        written,
        [
            "super::a::B",
            "super::c",
            "super",
            "crate::cni::error::Error::Io",
            "self::e::F"
        ]
    );
    assert_eq!(s.inline_modules, vec![vec!["tests".to_string()]]);
    assert_eq!(s.paths[4].reexport_as.as_deref(), Some("F"));
    assert_eq!(s.paths[3].inline, vec!["tests".to_string()]);

    let mut edges: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    for (from, to) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "d2")] {
        edges.entry(from.into()).or_default().insert(to.into());
        edges.entry(to.into()).or_default();
    }
    assert_eq!(cycles(&edges), vec![vec!["a", "b", "c", "a"]]);
}

// ---------------------------------------------------------------------------
// docs/layout.md names every file of src/, and only files that exist.

/// The files docs/layout.md's "## Files of src/" section names: the path
/// (relative to src/) each of its bullets starts with.
fn files_in_layout(layout: &str) -> Vec<String> {
    let section = layout
        .split("\n## ")
        .find(|s| s.starts_with("Files of src/"))
        .expect("docs/layout.md has no \"## Files of src/\" section");
    section
        .lines()
        .filter_map(|line| line.strip_prefix("- `"))
        .filter_map(|rest| rest.split('`').next())
        .map(str::to_string)
        .collect()
}

#[test]
fn docs_layout_names_every_file_of_src_and_no_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let layout = std::fs::read_to_string(root.join("docs/layout.md")).unwrap();
    let named = files_in_layout(&layout);
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let files: std::collections::BTreeSet<String> = files
        .iter()
        .map(|f| f.strip_prefix(&src).unwrap().to_str().unwrap().to_string())
        .collect();
    let mut problems = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for path in &named {
        if !seen.insert(path.as_str()) {
            problems.push(format!("docs/layout.md names {path} twice"));
        }
        if !files.contains(path) {
            problems.push(format!(
                "docs/layout.md names {path}, which is not a file of src/"
            ));
        }
    }
    for file in &files {
        if !seen.contains(file.as_str()) {
            problems.push(format!(
                "src/{file} is not named in docs/layout.md (a line `- `{file}`: what it is`)"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_layout_section_is_read_by_its_bullets() {
    let layout = "# Layout\n\n- `elsewhere.rs`: no\n\n## Files of src/\n\nOne line per file.\n\n### cni\n\n- `cni/error.rs`: errors, `not/this.rs`\n- `lib.rs`: the modules\n\n## Beside src/\n\n- `tests/x.rs`: no\n";
    assert_eq!(files_in_layout(layout), vec!["cni/error.rs", "lib.rs"]);
}

/// Each file of src/ outside `except` whose code (comments and strings
/// blanked by [`code_only`]) contains `needle`.
fn files_naming(needle: &str, except: &str) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files
        .iter()
        .filter(|f| !f.starts_with(src.join(except)))
        .filter(|f| code_only(&std::fs::read_to_string(f).unwrap()).contains(needle))
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
