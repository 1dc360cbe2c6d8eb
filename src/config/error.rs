//! Configuration errors: always `FILE:LINE:COLUMN: message`, naming the field and what would
//! be accepted.

use std::fmt;
use std::path::{Path, PathBuf};

/// A position in a config file (1-based line and column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pos {
    pub line: usize,
    pub column: usize,
}

/// One configuration error, located in a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    pub pos: Pos,
    pub message: String,
}

impl ConfigError {
    pub fn new(file: &Path, pos: Pos, message: impl Into<String>) -> Self {
        ConfigError {
            file: file.to_path_buf(),
            pos,
            message: message.into(),
        }
    }

    /// An error about the file as a whole (cannot be read), reported at 1:1.
    pub fn whole_file(file: &Path, message: impl Into<String>) -> Self {
        Self::new(file, Pos { line: 1, column: 1 }, message)
    }

    /// Convert a serde_yaml error (syntax, type, unknown field...) into a located error.
    pub fn from_yaml(file: &Path, err: &serde_yaml::Error) -> Self {
        let pos = err
            .location()
            .map(|l| Pos {
                line: l.line(),
                column: l.column(),
            })
            .unwrap_or(Pos { line: 1, column: 1 });
        // serde_yaml appends " at line L column C"; the position is already in front.
        let text = err.to_string();
        let message = match text.rfind(" at line ") {
            Some(i) => &text[..i],
            None => &text,
        };
        Self::new(file, pos, at_path(&in_file_terms(message)))
    }
}

/// How a list is written, for "expected a list".
const LIST: &str = "expected a list, such as [a, b] or lines starting with `- `";
/// How a mapping is written, for "expected a mapping".
const MAPPING: &str = "expected a mapping: indented `key: value` lines, or { key: value }";

/// The names of the file's enums, by serde's name for them and by the key that takes them:
/// what an "expected enum X" accepts.
const ENUMS: &[(&str, &str, &str)] = &[
    (
        "Algorithm",
        "algorithm",
        "`fixed_window`, `sliding_window`, `token_bucket`, `sliding_log`, `leaky_bucket`",
    ),
    (
        "Action",
        "action",
        "`reject`, `delay`, `shadow`, `shadowban`, `throttle`",
    ),
    (
        "OnFailure",
        "on_failure",
        "`local_share`, `local`, `allow`, `deny`",
    ),
    (
        "Balance",
        "balance",
        "`round_robin`, `random`, `consistent_hash`",
    ),
    ("LogFormat", "log_format", "`text`, `json`"),
    ("Sticky", "sticky", "`tenant`"),
    ("TenantMode", "tenant", "`required`, `optional`, `none`"),
];

/// What a list is written like, by the key that takes it (`limits[1].tiers`).
fn list_example(path: &str) -> Option<&'static str> {
    let (parent, last) = path.rsplit_once('.').unwrap_or(("", path));
    // a rule's `plans.NAME` (`limits[0].plans.gold`, `[0].plans.gold` in a limits file), not
    // the top-level `plans.NAME`
    let plan_tiers = parent.ends_with(".plans");
    Some(match last {
        _ if plan_tiers => "[{ period: 10, threshold: 100 }]",
        "tiers" => "[{ period: 10, threshold: 100 }]",
        "servers" => "[\"127.0.0.1:9001\"]",
        "methods" => "[GET, POST]",
        "from" => "[{ header: x-org-id }]",
        "tenants" => "[acme, globex]",
        "plans" => "[premium]",
        _ => return None,
    })
}

/// What only the key a message is about can tell (the message starts with its path): the
/// list it takes, the names an enum given a list takes, the key for several pools.
pub fn at_path(message: &str) -> String {
    let Some((path, rest)) = message.split_once(": ").filter(|(p, _)| !p.contains(' ')) else {
        return message.to_string();
    };
    let last = path.rsplit('.').next().unwrap_or(path);
    let mut out = match list_example(path) {
        Some(example) if rest.contains(LIST) => message.replace("[a, b]", example),
        _ => message.to_string(),
    };
    if out.contains("expected a YAML tag starting with '!'") {
        let instead = match ENUMS.iter().find(|(_, key, _)| *key == last) {
            Some((_, _, names)) => format!("expected one of {names}"),
            None => "expected a single name".to_string(),
        };
        out = out.replace("expected a YAML tag starting with '!'", &instead);
    }
    if last == "upstream" && rest.contains("invalid type: a list") {
        out.push_str("; several pools are written `upstreams: [{ pool, weight }]`");
    }
    out
}

/// serde's words in the file's: Rust's type names (`usize`, `struct RouteFile`), serde's
/// "sequence", "map" and "variant" never reach the user.
pub fn in_file_terms(message: &str) -> String {
    let mut out = message
        .replace("unknown variant", "unknown value")
        .replace("invalid type: sequence", "invalid type: a list")
        .replace("invalid type: map", "invalid type: a mapping")
        .replace("invalid type: unit value", "invalid type: an empty value")
        .replace("expected a sequence", LIST)
        .replace("expected a map", MAPPING)
        .replace("expected a boolean", "expected true or false")
        .replace("expected f64", "expected a number such as 0.5")
        .replace("expected f32", "expected a number such as 0.5");
    for int in ["usize", "u64", "u32", "u16", "u8"] {
        out = out.replace(
            &format!("expected {int}"),
            "expected a whole number (0 or more, without unit or quotes)",
        );
    }
    for int in ["i64", "i32"] {
        out = out.replace(
            &format!("expected {int}"),
            "expected a whole number (without unit or quotes)",
        );
    }
    for (kind, what) in [("struct ", MAPPING), ("enum ", "")] {
        let needle = format!("expected {kind}");
        while let Some(i) = out.find(&needle) {
            let name_at = i + needle.len();
            let end = out[name_at..]
                .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
                .map_or(out.len(), |e| name_at + e);
            let name = &out[name_at..end];
            let instead = match ENUMS.iter().find(|(n, _, _)| name.starts_with(n)) {
                Some((_, _, names)) if what.is_empty() => format!("expected one of {names}"),
                _ if what.is_empty() => "expected one of its names".to_string(),
                _ => what.to_string(),
            };
            out.replace_range(i..end, &instead);
        }
    }
    out
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file.display(),
            self.pos.line,
            self.pos.column,
            self.message
        )
    }
}

/// Every error found in one load (a file with several mistakes reports all it can).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        ConfigErrors(vec![e])
    }
}
