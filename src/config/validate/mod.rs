//! File model -> validated model. Every check reports `FILE:LINE:COLUMN: message` through the
//! locator, names the field and says what would be accepted. All errors of a file are
//! collected, so one run shows every mistake. One module per section of the file (`server`,
//! `upstreams`, `routes`, `tenant`, `limits`, `redis`); the defaults are in `config::defaults`.

use super::calendar::{Calendar, CalendarUnit};
use super::defaults::*;
use super::duration::{ConfDuration, PeriodFile};
use super::error::{ConfigError, ConfigErrors, Pos};
use super::file::*;
use super::locate::Locator;
use super::model::*;
use crate::config::certificates::{valid_host, CertKey, Certificates, PairError};
use crate::matching::{HostMatch, MethodSet, PathPattern, RequestMatch};

mod jwt;
mod limits;
mod redis;
mod routes;
mod server;
mod tenant;
mod upstreams;

use http::header::HeaderName;
use ipnet::IpNet;
use jwt::*;
use limits::*;
use redis::*;
use routes::*;
use server::*;
use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tenant::*;
use upstreams::*;

/// One file being validated: its path, its position index and the errors found so far.
struct Checker<'a> {
    file: PathBuf,
    loc: Locator,
    /// Prepended to paths in messages (an included limits file says `limits[0]...`).
    label: &'static str,
    errors: &'a mut Vec<ConfigError>,
    /// What is accepted but probably not meant (printed by `-t`, logged at load).
    warnings: &'a mut Vec<ConfigError>,
}

impl Checker<'_> {
    fn push(&mut self, pos: Pos, path: &str, message: String) {
        let label = self.label;
        self.errors.push(ConfigError::new(
            &self.file,
            pos,
            format!("{label}{path}: {message}"),
        ));
    }

    /// An error about the value at `path`.
    fn err(&mut self, path: &str, message: impl Into<String>) {
        self.push(self.loc.at(path), path, message.into());
    }

    /// Read the file `name` (relative to the config) given at `path`: its location and
    /// bytes, or an error at `path` saying why it cannot be read.
    fn read_file(&mut self, path: &str, name: &str) -> Option<(PathBuf, Vec<u8>)> {
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
    fn warn(&mut self, path: &str, message: impl Into<String>) {
        let label = self.label;
        let message = message.into();
        self.warnings.push(ConfigError::new(
            &self.file,
            self.loc.at(path),
            format!("warning: {label}{path}: {message}"),
        ));
    }

    /// An error about the key `path` itself (a name that is wrong, not its value).
    fn err_key(&mut self, path: &str, message: impl Into<String>) {
        self.push(self.loc.key(path), path, message.into());
    }
}

fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// An id (`routes[i].id`, `limits[i].id`): in its character set, and given once.
fn check_id(c: &mut Checker, base: &str, kind: &str, id: &str, seen: &mut HashSet<String>) {
    if !valid_id(id) {
        c.err(
            &format!("{base}.id"),
            format!("invalid {kind} id {id:?}: {ID_RULE}"),
        );
    } else if !seen.insert(id.to_string()) {
        c.err(&format!("{base}.id"), format!("duplicate {kind} id {id:?}"));
    }
}

const ID_RULE: &str = "expected letters, digits, '_' or '-' ([A-Za-z0-9_-]+)";

fn header_name(c: &mut Checker, path: &str, name: &str) -> Option<HeaderName> {
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
fn check_networks(c: &mut Checker, path: &str, list: &[String]) -> Vec<IpNet> {
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

fn positive(c: &mut Checker, path: &str, d: Option<ConfDuration>, default: Duration) -> Duration {
    match d {
        None => default,
        Some(ConfDuration(d)) if d.is_zero() => {
            c.err(path, "must be greater than 0, e.g. \"100ms\" or 1");
            default
        }
        Some(ConfDuration(d)) => d,
    }
}

fn resolve_relative(base_file: &Path, target: &str) -> PathBuf {
    let t = Path::new(target);
    if t.is_absolute() {
        t.to_path_buf()
    } else {
        base_file.parent().unwrap_or_else(|| Path::new(".")).join(t)
    }
}

/// Read and deserialize an included YAML file; errors name that file, and paths inside it are
/// written from `label` (the key that includes it).
fn read_include<T: serde::de::DeserializeOwned>(
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
            if err.message.starts_with('[') || err.message.starts_with(".[") {
                err.message = format!("{label}{}", err.message.trim_start_matches('.'));
            }
            including.errors.push(err);
            None
        }
    }
}

/// Validate a parsed file model. `file` is the main config's path.
pub fn validate(file: &Path, loc: Locator, model: FileConfig) -> Result<Config, ConfigErrors> {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let mut includes = Vec::new();
    let mut c = Checker {
        file: file.to_path_buf(),
        loc,
        label: "",
        errors: &mut errors,
        warnings: &mut warnings,
    };

    let (server, tls) = check_server(&mut c, &model.server);
    let upstreams = check_upstreams(&mut c, &model.upstreams);
    let default_mode = match &model.tenant {
        Some(t) if t.required => TenantMode::Required,
        _ => TenantMode::Optional,
    };
    let routes = check_routes(&mut c, &model.routes, &upstreams, default_mode);
    let (mut plans, members) = check_plans(&mut c, &model.plans, &mut includes);
    let tenant = match &model.tenant {
        Some(t) => check_tenant(
            &mut c,
            t,
            &mut includes,
            &mut plans,
            members,
            !server.trusted_proxies.is_empty(),
        ),
        None => TenantSettings::default(),
    };
    let rules = match model.limits {
        None => Vec::new(),
        Some(LimitsFile::Inline(list)) => check_rules(&mut c, "limits", &list, &plans),
        Some(LimitsFile::Include(name)) => {
            let target = resolve_relative(file, &name);
            includes.push(target.clone());
            match read_include::<Vec<RuleFile>>(&mut c, "limits", "limits", &target) {
                Some((list, inc_loc)) => {
                    let mut inc = Checker {
                        file: target,
                        loc: inc_loc,
                        label: "limits",
                        errors: c.errors,
                        warnings: c.warnings,
                    };
                    check_rules(&mut inc, "", &list, &plans)
                }
                None => Vec::new(),
            }
        }
    };
    let redis = model.redis.as_ref().and_then(|r| check_redis(&mut c, r));
    let tracing = model.tracing.as_ref().map(|t| check_tracing(&mut c, t));
    let headers = model
        .headers
        .map(|h| HeaderSettings {
            x_ratelimit: h.x_ratelimit,
            ietf: h.ietf,
        })
        .unwrap_or_default();

    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }
    Ok(Config {
        file: file.to_path_buf(),
        includes,
        server,
        upstreams,
        routes,
        tenant,
        plans,
        rules,
        redis,
        headers,
        tracing,
        tls,
        warnings,
    })
}

/// `tracing`: an `http://` or `https://` collector, a share from 0 to 1, a tenant `plain` or
/// `hash`.
fn check_tracing(c: &mut Checker, t: &TracingFile) -> TracingSettings {
    let otlp = t.otlp.trim_end_matches('/').to_string();
    let scheme_ok = otlp.starts_with("http://") || otlp.starts_with("https://");
    if !scheme_ok || otlp.parse::<http::Uri>().is_err() {
        c.err(
            "tracing.otlp",
            format!(
                "{:?} is not an OTLP/HTTP endpoint: expected a URL such as http://127.0.0.1:4318",
                t.otlp
            ),
        );
    }
    let sample = t.sample.unwrap_or(0.01);
    if !(0.0..=1.0).contains(&sample) {
        c.err(
            "tracing.sample",
            format!("sample is the share of requests traced, 0 to 1, got {sample}"),
        );
    }
    let hash_tenant = match t.tenant.as_deref() {
        None | Some("plain") => false,
        Some("hash") => true,
        Some(other) => {
            c.err(
                "tracing.tenant",
                format!("invalid value {other:?}: expected plain or hash"),
            );
            false
        }
    };
    TracingSettings {
        otlp,
        sample: sample.clamp(0.0, 1.0),
        service_name: t
            .service_name
            .clone()
            .unwrap_or_else(|| "tollgate".to_string()),
        hash_tenant,
    }
}
