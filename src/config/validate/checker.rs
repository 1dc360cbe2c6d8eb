//! What every part of the validation shares: the [`Checker`] of one file (its errors and
//! warnings at their positions), the checks used by several sections, and the names they all
//! use (re-exported here, so that each section module says `use super::checker::*`).

pub(super) use crate::config::certificates::{valid_host, CertKey, Certificates, PairError};
pub(super) use crate::config::defaults::*;
pub(super) use crate::config::duration::{ConfDuration, PeriodFile};
pub(super) use crate::config::error::{ConfigError, ConfigErrors, Pos};
pub(super) use crate::config::file::*;
pub(super) use crate::config::locate::{suggest, Locator};
pub(super) use crate::config::model::*;
pub(super) use crate::matching::{HostMatch, MethodSet, PathPattern, RequestMatch};
pub(super) use http::header::HeaderName;
pub(super) use ipnet::IpNet;
pub(super) use std::collections::{BTreeMap, HashSet};
pub(super) use std::net::{IpAddr, SocketAddr};
pub(super) use std::path::{Path, PathBuf};
pub(super) use std::sync::Arc;
pub(super) use std::time::Duration;
pub(super) use tollgate_limits::calendar::{Calendar, CalendarUnit};

/// One file being validated: its path, its position index and the errors found so far.
pub(super) struct Checker<'a> {
    pub(super) file: PathBuf,
    pub(super) loc: Locator,
    /// Prepended to paths in messages (an included limits file says `limits[0]...`).
    pub(super) label: &'static str,
    pub(super) errors: &'a mut Vec<ConfigError>,
    /// What is accepted but probably not meant (printed by `-t`, logged at load).
    pub(super) warnings: &'a mut Vec<ConfigError>,
}

impl Checker<'_> {
    pub(super) fn push(&mut self, pos: Pos, path: &str, message: String) {
        let label = self.label;
        self.errors.push(ConfigError::new(
            &self.file,
            pos,
            format!("{label}{path}: {message}"),
        ));
    }

    /// An error about the value at `path`.
    pub(super) fn err(&mut self, path: &str, message: impl Into<String>) {
        self.push(self.loc.at(path), path, message.into());
    }

    /// Read the file `name` (relative to the config) given at `path`: its location and
    /// bytes, or an error at `path` saying why it cannot be read.
    pub(super) fn read_file(&mut self, path: &str, name: &str) -> Option<(PathBuf, Vec<u8>)> {
        let file = resolve_relative(&self.file, name);
        match std::fs::read(&file) {
            Ok(bytes) => Some((file, bytes)),
            Err(e) => {
                self.err(path, format!("cannot read {}: {e}", file.display()));
                None
            }
        }
    }

    /// A warning about the value at `path`.
    pub(super) fn warn(&mut self, path: &str, message: impl Into<String>) {
        let label = self.label;
        let message = message.into();
        self.warnings.push(ConfigError::new(
            &self.file,
            self.loc.at(path),
            format!("warning: {label}{path}: {message}"),
        ));
    }

    /// A warning about the key `path` itself (a section, not one of its values).
    pub(super) fn warn_key(&mut self, path: &str, message: impl Into<String>) {
        let label = self.label;
        let message = message.into();
        self.warnings.push(ConfigError::new(
            &self.file,
            self.loc.key(path),
            format!("warning: {label}{path}: {message}"),
        ));
    }

    /// An error about the key `path` itself (a name that is wrong, not its value).
    pub(super) fn err_key(&mut self, path: &str, message: impl Into<String>) {
        self.push(self.loc.key(path), path, message.into());
    }
}

pub(super) fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// An id (`routes[i].id`, `limits[i].id`): in its character set, and given once.
pub(super) fn check_id(
    c: &mut Checker,
    base: &str,
    kind: &str,
    id: &str,
    seen: &mut HashSet<String>,
) {
    if !valid_id(id) {
        c.err(
            &format!("{base}.id"),
            format!("invalid {kind} id {id:?}: {ID_RULE}"),
        );
    } else if !seen.insert(id.to_string()) {
        c.err(&format!("{base}.id"), format!("duplicate {kind} id {id:?}"));
    }
}

pub(super) const ID_RULE: &str = "expected letters, digits, '_' or '-' ([A-Za-z0-9_-]+)";

pub(super) fn header_name(c: &mut Checker, path: &str, name: &str) -> Option<HeaderName> {
    match HeaderName::from_bytes(name.trim().to_ascii_lowercase().as_bytes()) {
        Ok(h) if !name.trim().is_empty() => Some(h),
        _ => {
            c.err(
                path,
                format!("invalid header name {name:?}: expected a token such as \"x-org-id\""),
            );
            None
        }
    }
}

/// A list of client networks (`10.0.0.0/8`, `2001:db8::/32`, or one address) at `path`.
pub(super) fn check_networks(c: &mut Checker, path: &str, list: &[String]) -> Vec<IpNet> {
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let parsed = t
            .parse::<IpNet>()
            .or_else(|_| t.parse::<IpAddr>().map(IpNet::from));
        match parsed {
            Ok(n) => out.push(n.trunc()),
            Err(_) => c.err(
                &format!("{path}[{i}]"),
                format!(
                    "invalid network {t:?}: expected an address or CIDR such as \"10.0.0.0/8\""
                ),
            ),
        }
    }
    out
}

pub(super) fn positive(
    c: &mut Checker,
    path: &str,
    d: Option<ConfDuration>,
    default: Duration,
) -> Duration {
    match d {
        None => default,
        Some(ConfDuration(d)) if d.is_zero() => {
            c.err(path, "must be greater than 0, e.g. \"100ms\" or 1");
            default
        }
        Some(ConfDuration(d)) => d,
    }
}

pub(super) fn resolve_relative(base_file: &Path, target: &str) -> PathBuf {
    let t = Path::new(target);
    if t.is_absolute() {
        t.to_path_buf()
    } else {
        base_file.parent().unwrap_or_else(|| Path::new(".")).join(t)
    }
}

/// Read and deserialize an included YAML file; errors name that file, and paths inside it are
/// written from `label` (the key that includes it).
pub(super) fn read_include<T: serde::de::DeserializeOwned>(
    including: &mut Checker,
    key_path: &str,
    label: &str,
    file: &Path,
) -> Option<(T, Locator)> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            including.err(key_path, format!("cannot read {}: {e}", file.display()));
            return None;
        }
    };
    let loc = Locator::new(&text);
    let duplicates = loc.duplicate_errors(file, label);
    if !duplicates.is_empty() {
        including.errors.extend(duplicates);
        return None;
    }
    match serde_yaml::from_str::<T>(&text) {
        Ok(v) => Some((v, loc)),
        Err(e) => {
            let mut err = ConfigError::from_yaml(file, &e);
            if let Some(hint) = loc.hint(&err.message, err.pos) {
                err.message = format!("{}; {hint}", err.message);
            }
            if err.message.starts_with('[') || err.message.starts_with(".[") {
                err.message = format!("{label}{}", err.message.trim_start_matches('.'));
            }
            including.errors.push(err);
            None
        }
    }
}
