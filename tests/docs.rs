//! The manual's links hold: every relative link in README.md and docs/*.md reaches a file of
//! the repository and every `#anchor` a heading of its target (GitHub's slugs); no link or path
//! leaves the repository (README none with `../`, docs/ only `../` to the root); and every
//! docs/*.md opens with a title, a paragraph of what it covers, and its Contents, which link
//! every `##` and `###` heading of the page. Pure std: no gateway, no network.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Component, Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every docs/*.md: (path relative to the root, text).
fn manual() -> Vec<(PathBuf, String)> {
    let mut docs: Vec<PathBuf> = fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|entry| entry.expect("docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .map(|path| Path::new("docs").join(path.file_name().expect("a file name")))
        .collect();
    docs.sort();
    assert!(!docs.is_empty(), "docs/ holds no .md file");
    let mut files = vec![PathBuf::from("README.md")];
    files.extend(docs);
    files
        .into_iter()
        .map(|file| {
            let text = fs::read_to_string(root().join(&file))
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            (file, text)
        })
        .collect()
}

/// The lines outside fenced code blocks, with their 1-based numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            lines.push((i + 1, line));
        }
    }
    lines
}

/// The line with its inline code spans (`code`, ``code``) taken out.
fn without_code(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let run = rest[start..].chars().take_while(|&c| c == '`').count();
        let ticks = &rest[start..start + run];
        let after = &rest[start + run..];
        match after.find(ticks) {
            Some(end) => rest = &after[end + run..],
            None => {
                // no closing run: the backticks are text
                out.push_str(ticks);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The targets of the links and images of a line: `[text](target)`, `![alt](target)`, and a
/// reference definition `[name]: target`.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code(line);
    let mut targets = Vec::new();
    let mut rest = line.as_str();
    while let Some(start) = rest.find("](") {
        let after = &rest[start + 2..];
        let end = after.find(')').unwrap_or(after.len());
        let inner = after[..end].trim();
        // an optional title follows the target after white space
        let target = inner.split_whitespace().next().unwrap_or("");
        let target = target.trim_start_matches('<').trim_end_matches('>');
        targets.push(target.to_string());
        rest = &after[end..];
    }
    let t = line.trim_start();
    if t.starts_with('[') {
        if let Some(close) = t.find("]:") {
            if let Some(target) = t[close + 2..].split_whitespace().next() {
                targets.push(target.to_string());
            }
        }
    }
    targets
}

fn is_external(target: &str) -> bool {
    ["http://", "https://", "mailto:"]
        .iter()
        .any(|scheme| target.starts_with(scheme))
}

/// GitHub's anchor for a heading: lower case, punctuation dropped except `-` and `_`, each
/// space a `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|&c| c.is_alphanumeric() || c == ' ' || c == '-' || c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The headings of a markdown text outside code blocks: (level, text, anchor). A repeated
/// anchor gets `-1`, `-2`, ... as on GitHub.
fn headings(text: &str) -> Vec<(usize, String, String)> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for (_, line) in prose(text) {
        let level = line.chars().take_while(|&c| c == '#').count();
        if level == 0 || level > 6 || !line[level..].starts_with(' ') {
            continue;
        }
        let title = line[level..]
            .trim()
            .trim_end_matches('#')
            .trim()
            .to_string();
        let base = slug(&title);
        let n = seen.entry(base.clone()).or_insert(0);
        let anchor = if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        };
        *n += 1;
        out.push((level, title, anchor));
    }
    out
}

fn anchors_of(file: &Path) -> HashSet<String> {
    let text =
        fs::read_to_string(root().join(file)).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    headings(&text).into_iter().map(|(_, _, a)| a).collect()
}

/// Where a relative link of `from` (relative to the root) leads, relative to the root; or why
/// it may not: from README no `../` at all, from docs/ only one `../` at the start, and never
/// above the root.
fn resolve(from: &Path, path: &str) -> Result<PathBuf, String> {
    if path.starts_with('/') {
        return Err("an absolute path".to_string());
    }
    let parents = Path::new(path)
        .components()
        .filter(|c| matches!(c, Component::ParentDir))
        .count();
    let in_docs = from.parent().is_some_and(|dir| dir == Path::new("docs"));
    if parents > 0 && !in_docs {
        return Err("`../` from the repository's root leaves the repository".to_string());
    }
    if parents > 1 || (parents == 1 && !path.starts_with("../")) {
        return Err("from docs/, only one `../` at the start (to the repository's root)".into());
    }
    let mut at: Vec<String> = from
        .parent()
        .map(|dir| {
            dir.components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    for c in Path::new(path).components() {
        match c {
            Component::ParentDir => {
                if at.pop().is_none() {
                    return Err("leaves the repository".to_string());
                }
            }
            Component::CurDir => {}
            Component::Normal(name) => at.push(name.to_string_lossy().into_owned()),
            _ => return Err("not a relative path".to_string()),
        }
    }
    Ok(at.iter().collect())
}

#[test]
fn slugs_are_githubs() {
    assert_eq!(
        slug("The edge: TLS, HTTP/2, WebSocket, client limits"),
        "the-edge-tls-http2-websocket-client-limits"
    );
    assert_eq!(slug("`token_bucket`"), "token_bucket");
    assert_eq!(slug("Who is the tenant?"), "who-is-the-tenant");
    assert_eq!(slug("The round's script"), "the-rounds-script");
    assert_eq!(slug("HTTP/1.1 framing"), "http11-framing");
    let anchors: Vec<String> =
        headings("# A\n## Metrics\n```\n## not a heading\n```\n## Metrics\n")
            .into_iter()
            .map(|(_, _, a)| a)
            .collect();
    assert_eq!(anchors, ["a", "metrics", "metrics-1"]);
    assert_eq!(
        link_targets("see [`server`](#server) and ![x](a.png), not `[y](z.md)`"),
        ["#server", "a.png"]
    );
}

#[test]
fn every_relative_link_reaches_a_file_and_its_anchor_a_heading() {
    let mut problems = Vec::new();
    for (file, text) in manual() {
        for (n, line) in prose(&text) {
            for target in link_targets(line) {
                if target.is_empty() || is_external(&target) {
                    continue;
                }
                let at = format!("{}:{n}: {target}", file.display());
                let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
                let dest = if path.is_empty() {
                    file.clone()
                } else {
                    match resolve(&file, path) {
                        Ok(dest) => dest,
                        Err(why) => {
                            problems.push(format!("{at}: {why}"));
                            continue;
                        }
                    }
                };
                if !root().join(&dest).exists() {
                    problems.push(format!("{at}: no such file {}", dest.display()));
                    continue;
                }
                let is_md = dest.extension().is_some_and(|ext| ext == "md");
                if !anchor.is_empty() && is_md && !anchors_of(&dest).contains(anchor) {
                    problems.push(format!("{at}: no heading #{anchor} in {}", dest.display()));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn no_link_or_path_leaves_the_repository() {
    let mut problems = Vec::new();
    for (file, text) in manual() {
        let in_docs = file.parent().is_some_and(|dir| dir == Path::new("docs"));
        for (n, line) in prose(&text) {
            // every path that starts with `../`, in a link, in code or in the text
            let mut from = 0;
            while let Some(i) = line[from..].find("../") {
                let start = from + i;
                from = start + 3;
                let before = line[..start].chars().next_back();
                let starts_a_path = before.is_none_or(|c| {
                    c.is_whitespace() || matches!(c, '`' | '(' | '[' | '<' | '"' | '\'' | '=')
                });
                if !starts_a_path {
                    continue; // `a/../b`: inside a path, not at its start
                }
                let mut ups = 0;
                while line[start + 3 * ups..].starts_with("../") {
                    ups += 1;
                }
                from = start + 3 * ups;
                let allowed = usize::from(in_docs);
                if ups > allowed {
                    let path: String = line[start..]
                        .chars()
                        .take_while(|&c| !c.is_whitespace() && !matches!(c, '`' | ')' | '>' | '"'))
                        .collect();
                    problems.push(format!(
                        "{}:{n}: {path} leaves the repository",
                        file.display()
                    ));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "references outside the repository:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_docs_page_has_a_title_a_summary_and_its_contents() {
    let mut problems = Vec::new();
    for (file, text) in manual() {
        if file == Path::new("README.md") {
            continue;
        }
        let name = file.display();
        let mut lines = text.lines().skip_while(|l| l.trim().is_empty());
        if !lines.next().is_some_and(|l| l.starts_with("# ")) {
            problems.push(format!("{name}: does not start with a `# ` title"));
        }
        let summary: Vec<&str> = lines
            .take_while(|l| !l.starts_with('#'))
            .filter(|l| !l.trim().is_empty())
            .collect();
        if summary.is_empty() {
            problems.push(format!(
                "{name}: no paragraph between the title and Contents"
            ));
        }
        let all = headings(&text);
        let Some(at) = all
            .iter()
            .position(|(level, title, _)| *level == 2 && title == "Contents")
        else {
            problems.push(format!("{name}: no `## Contents` section"));
            continue;
        };
        if all[..at].iter().any(|(level, _, _)| *level >= 2) {
            problems.push(format!("{name}: a section comes before Contents"));
        }
        // the Contents section: from its heading to the next `## `
        let contents: String = text
            .split("\n## Contents\n")
            .nth(1)
            .unwrap_or("")
            .split("\n## ")
            .next()
            .unwrap_or("")
            .to_string();
        let listed: HashSet<String> = contents
            .lines()
            .flat_map(link_targets)
            .filter_map(|t| t.strip_prefix('#').map(str::to_string))
            .collect();
        for (level, title, anchor) in &all[at + 1..] {
            if (*level == 2 || *level == 3) && !listed.contains(anchor) {
                problems.push(format!(
                    "{name}: Contents does not list `{title}` (#{anchor})"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// operations.md's metrics are the gateway's (issue 45): every metric the gateway registers
/// (each `"tollgate_..."` name in src/metrics.rs) is named in operations.md, and every
/// `tollgate_...` name operations.md gives is one of them (a histogram's `_bucket`, `_sum`
/// and `_count` series included).
#[test]
fn operations_md_names_every_metric_and_no_other() {
    let names = |text: &str, quoted: bool| -> HashSet<String> {
        let mut out = HashSet::new();
        let mut rest = text;
        while let Some(i) = rest.find("tollgate_") {
            let before = rest[..i].chars().last();
            let name: String = rest[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[i + name.len()..];
            let boundary = before.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
            // (a metric's name goes on with a word: not `tollgate_0.1.0_amd64.deb`)
            let word = name[9..].starts_with(|c: char| c.is_ascii_lowercase());
            if boundary && word && (!quoted || before == Some('"')) {
                out.insert(name);
            }
        }
        out
    };
    let source = fs::read_to_string(root().join("src/metrics.rs")).expect("src/metrics.rs");
    let registered = names(&source, true);
    assert!(registered.len() > 30, "{registered:?}");
    let page = fs::read_to_string(root().join("docs/operations.md")).expect("operations.md");
    let documented = names(&page, false);
    let missing: Vec<_> = registered
        .iter()
        .filter(|n| !documented.contains(*n))
        .collect();
    assert!(missing.is_empty(), "not in operations.md: {missing:?}");
    let unknown: Vec<_> = documented
        .iter()
        .filter(|n| {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .unwrap_or(n);
            !registered.contains(*n) && !registered.contains(base)
        })
        .collect();
    assert!(
        unknown.is_empty(),
        "operations.md names metrics the gateway has not: {unknown:?}"
    );
}
