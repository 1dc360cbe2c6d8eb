//! The source layout docs/architecture.md promises: the top-level modules of `src/` form layers,
//! each using (`crate::` paths) only those before it, so no module cycle exists at any depth;
//! between files (every path: `crate::`, `super::`, `self::`, a child's name) no cycle either;
//! and the admission of a request, with everything it decides with, knows nothing of Pingora.
//! The limits core (`crates/limits`): no cycle between its files, and its dependencies (all of
//! them, as Cargo.lock resolves them) hold no Pingora, no tokio and no config file model.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// docs/architecture.md "Layout", in order.
const LAYERS: [&str; 15] = [
    "matching",
    "problem",
    "grpc",
    "log_format",
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

/// The limits core's sources.
fn limits_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/limits/src")
}

/// The module path of a file (`src/request/proxy.rs` -> `request::proxy`).
fn module_of(file: &Path) -> Vec<String> {
    module_in(&src(), file)
}

/// The module path of a file of the crate whose sources are under `root`.
fn module_in(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).expect("under the crate's sources");
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

/// No cycle between files either: every path counted, `super::`, `self::` and a child
/// module's name included (a `mod.rs` and a child that use each other's items are a cycle).
#[test]
fn no_cycle_between_files() {
    let found = cycles(&file_graph(&src()));
    assert!(found.is_empty(), "cycles between files: {found:?}");
}

#[test]
fn no_cycle_between_the_files_of_the_limits_core() {
    let graph = file_graph(&limits_src());
    assert!(
        graph.contains_key("store"),
        "the graph reads crates/limits/src"
    );
    let found = cycles(&graph);
    assert!(
        found.is_empty(),
        "cycles between files of crates/limits: {found:?}"
    );
}

/// crates/limits/ARCHITECTURE.md "Modules, bottom up", in order.
const LIMITS_LAYERS: [&str; 14] = [
    "clock",
    "calendar",
    "record",
    "algorithm",
    "ledger",
    "sliding_log",
    "partition",
    "in_flight",
    "store",
    "decision",
    "top",
    "fleet",
    "limiter",
    "",
];

#[test]
fn the_limits_core_modules_use_only_those_before_them() {
    let graph = file_graph(&limits_src());
    let rank = |m: &str| LIMITS_LAYERS.iter().position(|l| *l == m);
    let mut wrong = Vec::new();
    for (from, to) in &graph {
        let Some(me) = rank(from) else {
            wrong.push(format!("{from} is not in LIMITS_LAYERS"));
            continue;
        };
        for t in to {
            if rank(t).is_none_or(|r| r >= me) {
                wrong.push(format!("{from} uses {t}"));
            }
        }
    }
    assert!(graph.len() == LIMITS_LAYERS.len(), "{graph:?}");
    assert!(wrong.is_empty(), "{wrong:?}");
}

/// The packages `package` depends on, directly or not, as `lock` (a Cargo.lock) resolves them.
fn dependencies_in_lock(lock: &str, package: &str) -> BTreeSet<String> {
    let mut deps: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for block in lock.split("[[package]]").skip(1) {
        let field = |key: &str| {
            block
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.trim().trim_matches('"').to_string())
        };
        let Some(name) = field("name = ") else {
            continue;
        };
        let list = block
            .split("dependencies = [")
            .nth(1)
            .and_then(|r| r.split(']').next())
            .unwrap_or("");
        let names = list
            .split(',')
            .map(|d| d.trim().trim_matches('"'))
            .filter(|d| !d.is_empty())
            // "name version" when two versions of a package are locked
            .filter_map(|d| d.split_whitespace().next())
            .map(str::to_string)
            .collect();
        deps.entry(name).or_default().extend::<Vec<String>>(names);
    }
    let mut seen = BTreeSet::new();
    let mut todo = vec![package.to_string()];
    while let Some(p) = todo.pop() {
        for d in deps.get(&p).into_iter().flatten() {
            if seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen
}

/// What the limits core may not depend on: Pingora (but its leaf `pingora-limits`, a count-min
/// sketch on `ahash`), an async runtime, the config file model and its readers.
fn forbidden_in_limits_core(package: &str) -> bool {
    (package.starts_with("pingora") && package != "pingora-limits")
        || package.starts_with("tokio")
        || matches!(package, "serde" | "serde_yaml" | "yaml-rust2" | "tollgate")
}

#[test]
fn the_limits_core_depends_on_no_pingora_runtime_or_config_model() {
    let lock = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.lock"))
        .expect("Cargo.lock");
    let deps = dependencies_in_lock(&lock, "tollgate-limits");
    assert!(deps.contains("jiff") && deps.contains("ahash"), "{deps:?}");
    let bad: Vec<_> = deps
        .iter()
        .filter(|d| forbidden_in_limits_core(d))
        .collect();
    assert!(bad.is_empty(), "crates/limits depends on {bad:?}");
    // and the gateway itself does depend on them (the check sees what it looks for)
    let gateway = dependencies_in_lock(&lock, "tollgate");
    assert!(gateway.contains("tollgate-limits"));
    assert!(gateway.iter().any(|d| d == "pingora-core") && gateway.contains("tokio"));
}

/// Every module path a file's code names, resolved to the module (file) it reaches: `crate::`,
/// `super::` (any number), `self::` and a child module's name, in `use` trees (groups nested,
/// `self` inside a group) and in expressions.
fn file_paths(me: &[String], code: &str, modules: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    let children: BTreeSet<&str> = modules
        .iter()
        .filter(|m| m.len() == me.len() + 1 && m[..me.len()] == *me)
        .map(|m| m[me.len()].as_str())
        .collect();
    let mut paths = Vec::new();
    for tree in use_trees(code) {
        paths.extend(expand(&tree));
    }
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0
            || !(bytes[i - 1].is_ascii_alphanumeric()
                || bytes[i - 1] == b'_'
                || bytes[i - 1] == b':');
        if starts_word && (bytes[i].is_ascii_alphabetic() || bytes[i] == b'_') {
            let end = code[i..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(code.len(), |e| i + e);
            let text = &code[i..end];
            if text.contains("::") {
                paths.push(
                    text.split("::")
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect(),
                );
            }
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    let mut out = BTreeSet::new();
    for p in paths {
        let Some(first) = p.first() else { continue };
        let (mut base, rest): (Vec<String>, &[String]) = match first.as_str() {
            "crate" => (Vec::new(), &p[1..]),
            "self" => (me.to_vec(), &p[1..]),
            "super" => {
                let mut base = me.to_vec();
                let supers = p.iter().take_while(|s| *s == "super").count();
                for _ in 0..supers {
                    base.pop();
                }
                (base, &p[supers..])
            }
            c if children.contains(c) => (me.to_vec(), &p[..]),
            _ => continue,
        };
        base.extend(rest.iter().filter(|s| *s != "*").cloned());
        if let Some(n) = (0..=base.len())
            .rev()
            .find(|&n| modules.contains(&base[..n].to_vec()))
        {
            let target = base[..n].to_vec();
            if target != me {
                out.insert(target);
            }
        }
    }
    out
}

/// The trees of the `use` declarations in `code` (what follows `use`, up to `;`).
fn use_trees(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("use ") {
        // a declaration: nothing before it on its line but its visibility
        let line_start = rest[..i].rfind('\n').map_or(0, |n| n + 1);
        let before = rest[line_start..i].trim();
        rest = &rest[i + 4..];
        if !matches!(before, "" | "pub" | "pub(crate)" | "pub(super)") {
            continue;
        }
        let end = rest.find(';').unwrap_or(rest.len());
        out.push(rest[..end].to_string());
        rest = &rest[end..];
    }
    out
}

/// A use tree's paths: `a::{b, c::{d, self}}` is `a::b`, `a::c::d` and `a::c`.
fn expand(tree: &str) -> Vec<Vec<String>> {
    let tree: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        // a leaf, renamed or not
        let leaf = tree.split(" as ").next().unwrap_or("");
        return vec![leaf
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()];
    };
    let prefix: Vec<String> = tree[..open]
        .split("::")
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    let close = tree.rfind('}').filter(|&c| c > open).unwrap_or(tree.len());
    let inner = &tree[open + 1..close];
    let (mut depth, mut start, mut items) = (0, 0, Vec::new());
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    let mut out = Vec::new();
    for item in items.into_iter().filter(|s| !s.trim().is_empty()) {
        for sub in expand(item) {
            let mut p = prefix.clone();
            if sub != ["self"] {
                p.extend(sub);
            }
            out.push(p);
        }
    }
    out
}

/// The graph between the files of the crate whose sources are under `root`: one module per
/// file, an edge for every module path it names.
fn file_graph(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(root, &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_in(root, f)).collect();
    let mut edges = BTreeMap::new();
    for f in &files {
        let me = module_in(root, f);
        let targets: BTreeSet<String> = file_paths(&me, &code(f), &modules)
            .into_iter()
            .map(|t| t.join("::"))
            .collect();
        edges.insert(me.join("::"), targets);
    }
    edges
}

/// The strongly connected parts of more than one module (Tarjan), each sorted.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        let edges = t.edges;
        for w in edges.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low[v];
                t.low.insert(v, lv.min(lw));
            } else if t.stack.contains(&w) {
                let iw = t.index[w];
                let lv = t.low[v];
                t.low.insert(v, lv.min(iw));
            }
        }
        if t.low[v] == t.index[v] {
            let mut part = Vec::new();
            while let Some(w) = t.stack.pop() {
                part.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if part.len() > 1 {
                part.sort();
                t.out.push(part);
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v.as_str());
        }
    }
    t.out
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

/// The most lines a function may have (from its `fn` line to its closing brace).
const MAX_FN_LINES: usize = 80;

/// Functions that are declarative tables (one entry per line), exempt: (file, function).
const TABLES: [(&str, &str); 1] = [
    // every metric's name, help and labels
    ("src/metrics.rs", "new"),
];

/// Functions held shorter still: (file, function, most lines). `request_filter` reads as the
/// list of the request's steps, each a function of its own.
const SHORTER: [(&str, &str, usize); 1] = [("src/request/proxy.rs", "request_filter", 40)];

/// The name of the function a line declares with a body, if it declares one.
fn fn_name(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let rest = rest.strip_prefix("fn ")?;
    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some(&rest[..end])
}

/// Where the body that starts at or after `from` ends: the index of its closing brace, braces
/// counted outside string and char literals and comments. `None`: a declaration (`;` first).
fn body_end(text: &[u8], from: usize) -> Option<usize> {
    let (mut i, mut depth) = (from, 0usize);
    while i < text.len() {
        match text[i] {
            b'/' if text.get(i + 1) == Some(&b'/') => {
                while i < text.len() && text[i] != b'\n' {
                    i += 1;
                }
            }
            b'r' if text.get(i + 1) == Some(&b'#') || text.get(i + 1) == Some(&b'"') => {
                // a raw string: r"..." or r#"..."#
                let hashes = text[i + 1..].iter().take_while(|&&c| c == b'#').count();
                if text.get(i + 1 + hashes) == Some(&b'"') {
                    let close: Vec<u8> = std::iter::once(b'"')
                        .chain(std::iter::repeat_n(b'#', hashes))
                        .collect();
                    i += 2 + hashes;
                    while i < text.len() && !text[i..].starts_with(&close) {
                        i += 1;
                    }
                    i += close.len() - 1;
                }
            }
            b'"' => {
                i += 1;
                while i < text.len() && text[i] != b'"' {
                    i += if text[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'\'' => {
                // a char literal ('x', '\n', '{'), not a lifetime ('a)
                if text.get(i + 1) == Some(&b'\\') {
                    i += 2;
                    while i < text.len() && text[i] != b'\'' {
                        i += 1;
                    }
                } else if text.get(i + 2) == Some(&b'\'') {
                    i += 2;
                }
            }
            b';' if depth == 0 => return None,
            b'{' => depth += 1,
            b'}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Every function of `text` with a body (unit tests left out) and its length in lines.
fn function_lengths(text: &str) -> Vec<(String, usize)> {
    let text = text.split("#[cfg(test)]").next().unwrap_or("");
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        if let Some(name) = fn_name(line) {
            if let Some(end) = body_end(bytes, at) {
                let lines = text[at..=end].lines().count();
                out.push((name.to_string(), lines));
            }
        }
        at += line.len();
    }
    out
}

#[test]
fn no_function_is_longer_than_80_lines_but_declarative_tables() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&src(), &mut files);
    sources(&limits_src(), &mut files);
    let mut long = Vec::new();
    for f in files {
        let rel = f.strip_prefix(root).expect("in the workspace");
        let rel = rel.to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&f).expect("readable");
        for (name, lines) in function_lengths(&text) {
            let most = SHORTER
                .iter()
                .find(|(f, n, _)| *f == rel && *n == name)
                .map_or(MAX_FN_LINES, |s| s.2);
            if lines > most && !TABLES.contains(&(rel.as_str(), name.as_str())) {
                long.push(format!(
                    "{rel}: fn {name} has {lines} lines (at most {most})"
                ));
            }
        }
    }
    assert!(
        long.is_empty(),
        "over {MAX_FN_LINES} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_checks_can_fail() {
    // a planted function of 90 lines, braces in its strings and chars not counted
    let long = format!(
        "pub(crate) async fn planted(x: &'static str) {{\n    let a = \"{{\";\n    let b = '{{';\n    let c = r#\"}}\"#;\n{}}}\nfn short() {{}}\nfn declared();\n",
        "    x;\n".repeat(86)
    );
    assert_eq!(
        function_lengths(&long),
        vec![("planted".to_string(), 91), ("short".to_string(), 1)]
    );
    // a planted dependency of the limits core on the runtime, two steps away
    let lock = "[[package]]\nname = \"tollgate-limits\"\ndependencies = [\n \"a\",\n]\n\n\
                [[package]]\nname = \"a\"\ndependencies = [\n \"tokio 1.0.0\",\n]\n\n\
                [[package]]\nname = \"tokio\"\n";
    let deps = dependencies_in_lock(lock, "tollgate-limits");
    assert_eq!(deps, BTreeSet::from(["a".to_string(), "tokio".into()]));
    assert!(deps.iter().any(|d| forbidden_in_limits_core(d)));
    assert!(!forbidden_in_limits_core("pingora-limits"));
    let mut edges = BTreeMap::new();
    edges.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    edges.insert("b".to_string(), BTreeSet::from(["c".to_string()]));
    assert_eq!(cycle(&edges), None);
    edges.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(
        cycle(&edges),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    // a planted cycle between a module and its child, through `super::` and a child path
    let modules: BTreeSet<Vec<String>> = [vec!["m".to_string()], vec!["m".into(), "c".into()]]
        .into_iter()
        .collect();
    let parent = file_paths(&["m".into()], "use c::Thing;", &modules);
    let child = file_paths(
        &["m".into(), "c".into()],
        "use super::{Other, x::{y, self}};",
        &modules,
    );
    let mut edges = BTreeMap::new();
    edges.insert(
        "m".to_string(),
        parent.iter().map(|p| p.join("::")).collect(),
    );
    edges.insert(
        "m::c".to_string(),
        child.iter().map(|p| p.join("::")).collect(),
    );
    assert_eq!(cycles(&edges), vec![vec!["m".to_string(), "m::c".into()]]);
    assert_eq!(
        expand("super::{a::{b, self}, c as d}"),
        vec![
            vec!["super".to_string(), "a".into(), "b".into()],
            vec!["super".into(), "a".into()],
            vec!["super".into(), "c".into()]
        ]
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
