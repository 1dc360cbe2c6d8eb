//! Where each value of a YAML document stands, so that checks made after deserialization
//! (unknown upstream, duplicate id, bad glob...) can still say `FILE:LINE:COLUMN`.
//!
//! serde_yaml reports positions only for its own errors; this module reads the same text with
//! a marked event parser and records, for every value, its path (`routes[1].upstream`) and
//! position.

use super::error::Pos;
use std::collections::HashMap;
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// Positions of values by path: `server.listen[0]`, `limits[2].tiers[0].period`.
#[derive(Debug, Default)]
pub struct Locator {
    positions: HashMap<String, Pos>,
    /// Keys given twice in one mapping: (path of the key, first position, second position).
    /// YAML maps would keep the last silently (a second API key, a second pool).
    pub duplicates: Vec<(String, Pos, Pos)>,
    /// The text's lines, for hints about keys at the wrong indentation.
    lines: Vec<String>,
}

enum Frame {
    Seq { path: String, next: usize },
    Map { path: String, key: Option<String> },
}

struct Recorder {
    stack: Vec<Frame>,
    positions: HashMap<String, Pos>,
    duplicates: Vec<(String, Pos, Pos)>,
}

impl Recorder {
    /// The path of the value about to start, or None when the event is a mapping key.
    fn next_value_path(&mut self) -> Option<String> {
        match self.stack.last_mut() {
            None => Some(String::new()),
            Some(Frame::Seq { path, next }) => {
                let p = format!("{path}[{next}]");
                *next += 1;
                Some(p)
            }
            Some(Frame::Map { path, key }) => key.take().map(|k| {
                if path.is_empty() {
                    k
                } else {
                    format!("{path}.{k}")
                }
            }),
        }
    }
}

impl MarkedEventReceiver for Recorder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        // yaml-rust2 counts lines from 1 but columns from 0; serde_yaml counts both from 1.
        let pos = Pos {
            line: mark.line(),
            column: mark.col() + 1,
        };
        match ev {
            Event::Scalar(value, ..) => match self.next_value_path() {
                Some(path) => {
                    self.positions.entry(path).or_insert(pos);
                }
                None => {
                    if let Some(Frame::Map { path, key }) = self.stack.last_mut() {
                        // Remember the key's own position too, for "missing field" style errors.
                        let full = if path.is_empty() {
                            value.clone()
                        } else {
                            format!("{path}.{value}")
                        };
                        if let Some(first) = self.positions.insert(format!("{full}#key"), pos) {
                            self.duplicates.push((full, first, pos));
                        }
                        *key = Some(value);
                    }
                }
            },
            Event::Alias(_) => {
                let _ = self.next_value_path();
            }
            Event::SequenceStart(..) => {
                let path = self.next_value_path().unwrap_or_default();
                self.positions.entry(path.clone()).or_insert(pos);
                self.stack.push(Frame::Seq { path, next: 0 });
            }
            Event::MappingStart(..) => {
                let path = self.next_value_path().unwrap_or_default();
                self.positions.entry(path.clone()).or_insert(pos);
                self.stack.push(Frame::Map { path, key: None });
            }
            Event::SequenceEnd | Event::MappingEnd => {
                self.stack.pop();
            }
            _ => {}
        }
    }
}

impl Locator {
    /// Index a document. A syntax error leaves the index partial; serde_yaml reports it.
    pub fn new(text: &str) -> Self {
        let mut rec = Recorder {
            stack: Vec::new(),
            positions: HashMap::new(),
            duplicates: Vec::new(),
        };
        let mut parser = Parser::new_from_str(text);
        let _ = parser.load(&mut rec, false);
        Locator {
            positions: rec.positions,
            duplicates: rec.duplicates,
            lines: text.lines().map(str::to_string).collect(),
        }
    }

    /// Position of the value at `path`, or of its nearest enclosing value that is known.
    pub fn at(&self, path: &str) -> Pos {
        let mut p = path;
        loop {
            if let Some(pos) = self.positions.get(p) {
                return *pos;
            }
            match p.rfind(['.', '[']) {
                Some(i) => p = &p[..i],
                None => {
                    return self
                        .positions
                        .get("")
                        .copied()
                        .unwrap_or(Pos { line: 1, column: 1 })
                }
            }
        }
    }

    /// A hint for a parser error at `pos` that is about the document's shape, in the file's
    /// own terms: where a missing key was actually found, or which value swallowed it, or what
    /// was read last before a structure error.
    pub fn hint(&self, message: &str, pos: Pos) -> Option<String> {
        // a misspelt key or name: the nearest of those accepted
        if let Some(near) = did_you_mean(message) {
            return Some(near);
        }
        // a tab where YAML wanted spaces: the parser's message does not say so
        let line = self
            .lines
            .get(pos.line.saturating_sub(1))
            .map_or("", |l| l.as_str());
        if let Some(col) = line.find('\t').filter(|&c| c < pos.column.max(1)) {
            return Some(format!(
                "a tab at line {}, column {}: YAML indents with spaces only, never tabs",
                pos.line,
                col + 1
            ));
        }
        if let Some(field) = message
            .split("missing field `")
            .nth(1)
            .and_then(|r| r.split('`').next())
        {
            return self.misplaced_key(field, pos);
        }
        let structural = [
            "did not find expected",
            "mapping values are not allowed",
            "could not find expected",
            "block sequence entries are not allowed",
        ];
        if structural.iter().any(|m| message.contains(m)) {
            if let Some(glued) = self.glued_key(pos.line) {
                return Some(glued);
            }
            let last = self
                .positions
                .iter()
                .filter(|(p, at)| !p.is_empty() && !p.ends_with("#key") && at.line < pos.line)
                .max_by_key(|(p, at)| (at.line, at.column, p.len()))?;
            return Some(format!(
                "check the indentation of line {}{} against the lines above it (the last value read is {}, line {})",
                pos.line,
                self.indent_against_above(pos.line),
                last.0,
                last.1.line
            ));
        }
        None
    }

    /// ` (column 4, where line 50 starts at column 5)`: where `line`'s text starts, against
    /// the line above with text, when they differ; or nothing.
    fn indent_against_above(&self, line: usize) -> String {
        let start = |l: &str| l.len() - l.trim_start_matches(' ').len() + 1;
        let Some(this) = self.lines.get(line.wrapping_sub(1)) else {
            return String::new();
        };
        let above = (1..line).rev().find_map(|n| {
            let l = self.lines.get(n - 1)?;
            let t = l.trim();
            (!t.is_empty() && !t.starts_with('#')).then(|| (n, start(l)))
        });
        match above {
            Some((n, col)) if col != start(this) => format!(
                " (column {}, where line {n} starts at column {col})",
                start(this)
            ),
            _ => String::new(),
        }
    }

    /// A required key missing from the mapping that starts at `pos`: where it is written
    /// instead, at another indentation (a line where no mapping has it as a key).
    fn misplaced_key(&self, field: &str, pos: Pos) -> Option<String> {
        // the mapping the error is about: the one whose first key stands at `pos`
        let map = self
            .positions
            .iter()
            .filter(|(p, at)| **at == pos && p.ends_with("#key"))
            .filter_map(|(p, _)| p.strip_suffix("#key"))
            .map(|k| k.rsplit_once('.').map_or("", |(parent, _)| parent))
            .max_by_key(|p| p.len())
            .unwrap_or("");
        // a line where some mapping has the key (another route's `path:`) is not it
        let key_here = |line: usize| {
            self.positions.iter().any(|(p, at)| {
                at.line == line
                    && p.strip_suffix("#key").is_some_and(|k| {
                        k == format!("{map}.{field}")
                            || k == field
                            || k.rsplit_once('.').is_some_and(|(_, last)| last == field)
                    })
            })
        };
        // the key written somewhere else in the file, at another indentation
        let found = self.lines.iter().enumerate().find_map(|(i, l)| {
            let trimmed = l.trim_start().trim_start_matches("- ");
            let col = l.len() - trimmed.len() + 1;
            (trimmed.starts_with(&format!("{field}:")) && !key_here(i + 1)).then_some((i + 1, col))
        })?;
        let first_key = pos.column;
        Some(format!(
            "`{field}:` stands at line {}, column {}, where this mapping's keys start at column {first_key}: check its indentation",
            found.0, found.1
        ))
    }

    /// `admin:"127.0.0.1:9090"` at or just above `line`: a key glued to its value, which YAML
    /// reads as one text, and then finds the mapping broken.
    fn glued_key(&self, line: usize) -> Option<String> {
        (line.saturating_sub(2).max(1)..=line).rev().find_map(|n| {
            let text = self.lines.get(n - 1)?.trim();
            let text = text.trim_start_matches("- ");
            let (key, value) = text.split_once(':')?;
            let key_like = !key.is_empty()
                && key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            let glued = value.starts_with(|c: char| !c.is_whitespace() && c != ':' && c != '/');
            (key_like && glued).then(|| {
                format!(
                    "`{text}` at line {n} is one text to YAML: a key needs a space after the colon (`{key}: {value}`)"
                )
            })
        })
    }

    /// An error for every key given twice in one mapping, at the second, naming the first.
    pub fn duplicate_errors(
        &self,
        file: &std::path::Path,
        label: &str,
    ) -> Vec<super::error::ConfigError> {
        self.duplicates
            .iter()
            .map(|(path, first, again)| {
                let (map, key) = match path.rsplit_once('.') {
                    Some((map, key)) => (map, key),
                    None => ("the top level", path.as_str()),
                };
                let map = if label.is_empty() || map == "the top level" {
                    map.to_string()
                } else {
                    format!("{label}{map}")
                };
                super::error::ConfigError::new(
                    file,
                    *again,
                    format!(
                        "duplicate key {key:?} in {map}: given first at line {}, column {}; each key may appear once",
                        first.line, first.column
                    ),
                )
            })
            .collect()
    }

    /// Position of the key `path` (e.g. `routes[0].upstream`), falling back to its value.
    pub fn key(&self, path: &str) -> Pos {
        self.positions
            .get(&format!("{path}#key"))
            .copied()
            .unwrap_or_else(|| self.at(path))
    }
}

/// For serde's "unknown field `X`, expected one of `a`, `b`" (or an unknown value): the
/// accepted name nearest to X, when it is near (`response-header` -> `response_header`,
/// `thresold` -> `threshold`).
pub fn did_you_mean(message: &str) -> Option<String> {
    let rest = ["unknown field `", "unknown variant `", "unknown value `"]
        .iter()
        .find_map(|p| message.split(p).nth(1))?;
    let given = rest.split('`').next()?;
    let accepted = rest.split("expected ").nth(1)?;
    nearest(given, accepted.split('`').skip(1).step_by(2))
        .map(|name| format!("did you mean `{name}`?"))
}

/// Words written for another: a tier's `limit` is its `threshold`, its `window` its `period`.
const SYNONYMS: &[(&str, &str)] = &[
    ("limit", "threshold"),
    ("max", "threshold"),
    ("requests", "threshold"),
    ("count", "threshold"),
    ("rate", "threshold"),
    ("window", "period"),
    ("interval", "period"),
    ("duration", "period"),
];

/// The one of `accepted` that `given` was probably meant as: a few letters off (by case,
/// `-` for `_`, a letter missing, swapped or wrong), a synonym, a part of it
/// (`read_timeout` for `read`), or most of it (`trust` for `trusted`). None when none is
/// near, or when two are equally near.
pub fn nearest<'a>(given: &str, accepted: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let accepted: Vec<&str> = accepted.into_iter().collect();
    if accepted.contains(&given) {
        return None;
    }
    let norm = given.trim().to_ascii_lowercase().replace('-', "_");
    let best = accepted
        .iter()
        .map(|name| {
            (
                strsim::damerau_levenshtein(&norm, &name.to_ascii_lowercase()),
                *name,
            )
        })
        .min()?;
    if best.0 <= (norm.len() / 3).max(1) && given != best.1 {
        return Some(best.1);
    }
    if let Some((_, to)) = SYNONYMS
        .iter()
        .find(|(from, to)| *from == norm && accepted.contains(to))
    {
        return accepted.iter().copied().find(|a| a == to);
    }
    // a part, the start, or most of the start of one accepted name only
    let lower: Vec<String> = accepted.iter().map(|a| a.to_ascii_lowercase()).collect();
    let common = |a: &str| {
        a.bytes()
            .zip(norm.bytes())
            .take_while(|(x, y)| x == y)
            .count()
    };
    let near = |a: &String| {
        norm.split('_').any(|part| part == a.as_str())
            || (norm.len() >= 3
                && a.len() >= 3
                && (a.starts_with(&norm) || norm.starts_with(a.as_str())))
            || common(a) >= 4.max(norm.len() * 2 / 3)
    };
    let mut found = lower.iter().zip(&accepted).filter(|(a, _)| near(a));
    match (found.next(), found.next()) {
        (Some((_, name)), None) => Some(*name),
        _ => None,
    }
}

/// `; did you mean `X`?` for a name that is none of `accepted`, or nothing.
pub fn suggest<'a>(given: &str, accepted: impl IntoIterator<Item = &'a str>) -> String {
    nearest(given, accepted).map_or_else(String::new, |n| format!("; did you mean `{n}`?"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_nested_paths() {
        let text = "server:\n  listen: [\"a\", \"b\"]\nroutes:\n  - id: x\n    upstream: up\n";
        let loc = Locator::new(text);
        assert_eq!(
            loc.at("server.listen[1]"),
            Pos {
                line: 2,
                column: 17
            }
        );
        assert_eq!(
            loc.at("routes[0].upstream"),
            Pos {
                line: 5,
                column: 15
            }
        );
        assert_eq!(loc.key("routes[0].upstream"), Pos { line: 5, column: 5 });
        // unknown paths fall back to the nearest parent
        assert_eq!(loc.at("routes[0].nothing"), loc.at("routes[0]"));
    }

    #[test]
    fn the_nearest_name_is_a_few_letters_off_a_synonym_or_a_part() {
        let tier = ["period", "threshold"];
        assert_eq!(nearest("thresold", tier), Some("threshold"));
        assert_eq!(nearest("limit", tier), Some("threshold"));
        assert_eq!(nearest("window", tier), Some("period"));
        assert_eq!(nearest("burst", tier), None);
        assert_eq!(nearest("JSON", ["text", "json"]), Some("json"));
        assert_eq!(nearest("json", ["text", "json"]), None);
        assert_eq!(
            nearest("round-robin", ["round_robin", "random"]),
            Some("round_robin")
        );
        assert_eq!(
            nearest("read_timeout", ["connect", "read", "total"]),
            Some("read")
        );
        assert_eq!(
            nearest("trust", ["header", "path", "trusted"]),
            Some("trusted")
        );
        assert_eq!(
            nearest("path", ["id", "pathPattern", "host"]),
            Some("pathPattern")
        );
        let server = [
            "max_body_bytes",
            "max_connections",
            "max_request_header_bytes",
        ];
        assert_eq!(nearest("max_body_size", server), Some("max_body_bytes"));
        // two as near: none
        assert_eq!(nearest("max", ["max_a", "max_b"]), None);
        assert_eq!(
            suggest("basci", ["basic", "premium"]),
            "; did you mean `basic`?"
        );
        assert_eq!(suggest("gold", ["basic", "premium"]), "");
    }

    #[test]
    fn a_key_glued_to_its_value_is_named() {
        let loc = Locator::new("server:\n  admin:\"127.0.0.1:9\"\n  listen: x\n");
        let hint = loc.glued_key(3).unwrap_or_default();
        assert!(hint.contains("at line 2"), "{hint}");
        assert!(hint.contains("`admin: \"127.0.0.1:9\"`"), "{hint}");
        assert_eq!(Locator::new("a:\n  url: http://x\n").glued_key(2), None);
    }
}
