//! The source layout docs/architecture.md promises: the top-level modules of `src/` form layers,
//! each using (`crate::` paths) only those before it, so no module cycle exists at any depth;
//! and the admission of a request, with everything it decides with, knows nothing of Pingora.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// docs/architecture.md "Layout", in order.
const LAYERS: [&str; 14] = [
    "matching",
    "problem",
    "grpc",
    "log_limit",
    "ticker",
    "tokens",
    "metrics",
    "config",
    "limits",
    "upstream",
    "snapshot",
    "request",
    "services",
    "cli",
];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The module path of a file (`src/request/proxy.rs` -> `request::proxy`).
fn module_of(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src()).expect("under src/");
    let mut parts: Vec<String> = rel
        .with_extension("")
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The code of a file without its unit tests (the first `#[cfg(test)]` on) and comments.
fn code(file: &Path) -> String {
    let text = std::fs::read_to_string(file).expect("readable");
    let text = text.split("#[cfg(test)]").next().unwrap_or("");
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `crate::a::b::...` path in `code`, `use crate::{x, y::z}` groups expanded.
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                out.push(path_of(item.trim()));
            }
        } else {
            out.push(path_of(rest));
        }
    }
    out
}

fn path_of(text: &str) -> Vec<String> {
    let end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(text.len());
    text[..end]
        .split("::")
        .filter(|s| !s.is_empty() && s.chars().next().is_some_and(|c| c.is_ascii_lowercase()))
        .map(str::to_string)
        .collect()
}

/// Edges between modules cut at `depth` path segments (a module never depends on itself, nor
/// on its own parent or child).
fn graph(depth: usize) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(&src(), &mut files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let me = module_of(&f);
        if me.is_empty() {
            continue;
        }
        let a = me[..me.len().min(depth)].join("::");
        for p in crate_paths(&code(&f)) {
            let b = p[..p.len().min(depth)].join("::");
            let related = b.is_empty()
                || a == b
                || a.starts_with(&format!("{b}::"))
                || b.starts_with(&format!("{a}::"));
            if !related {
                edges.entry(a.clone()).or_default().insert(b);
            }
        }
    }
    edges
}

/// A cycle in the graph, if there is one (depth-first search).
fn cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = stack.iter().position(|s| s == n) {
            let mut c = stack[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n.to_string());
        for m in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, edges, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|n| visit(n, edges, &mut Vec::new(), &mut done))
}

#[test]
fn top_level_modules_use_only_the_layers_before_them() {
    let edges = graph(1);
    let rank = |m: &str| {
        LAYERS
            .iter()
            .position(|l| *l == m)
            .unwrap_or_else(|| panic!("module {m} is not in docs/architecture.md's layers"))
    };
    for (a, targets) in &edges {
        for b in targets {
            assert!(rank(b) < rank(a), "{a} uses {b}, a later layer: {edges:#?}");
        }
    }
    let mut files = Vec::new();
    sources(&src(), &mut files);
    for f in files {
        if let Some(top) = module_of(&f).first() {
            rank(top);
        }
    }
}

#[test]
fn no_module_cycle_at_any_depth() {
    for depth in 1..=4 {
        let edges = graph(depth);
        assert!(!edges.is_empty());
        if let Some(c) = cycle(&edges) {
            panic!("a cycle among modules at depth {depth}: {}", c.join(" -> "));
        }
    }
}

#[test]
fn the_admission_and_what_it_decides_with_know_nothing_of_pingora() {
    let s = src();
    let mut files: Vec<PathBuf> = [
        "request/admission.rs",
        "request/answer.rs",
        "request/incoming.rs",
        "request/quota.rs",
        "request/client_limits.rs",
        "request/client_addr.rs",
        "request/tenant.rs",
        "request/routing.rs",
        "problem.rs",
    ]
    .iter()
    .map(|f| s.join(f))
    .collect();
    sources(&s.join("limits"), &mut files);
    sources(&s.join("matching"), &mut files);
    for f in files {
        let code = code(&f);
        // pingora-limits' count-min sketch is a data structure, not the proxy
        assert!(
            !code.replace("pingora_limits", "").contains("pingora"),
            "{} uses Pingora",
            f.display()
        );
    }
}

#[test]
fn the_checks_can_fail() {
    let mut edges = BTreeMap::new();
    edges.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    edges.insert("b".to_string(), BTreeSet::from(["c".to_string()]));
    assert_eq!(cycle(&edges), None);
    edges.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(
        cycle(&edges),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    assert_eq!(
        crate_paths("use crate::{a::b, c};\nlet x = crate::d::e::f();"),
        vec![
            vec!["a".to_string(), "b".into()],
            vec!["c".into()],
            vec!["d".into(), "e".into(), "f".into()]
        ]
    );
}
