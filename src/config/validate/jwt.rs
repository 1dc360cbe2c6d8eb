//! `tenant.from: - jwt: ...`: issuers, their keys (a JWKS file read here, or a `jwks_uri`
//! fetched by the gateway), the claims that name the tenant and plan, the algorithms.

use super::checker::*;
use crate::tokens::claims::ClaimPath;
use crate::tokens::keys::KeySet;
use crate::tokens::{shared_keys, IssuerKeys, IssuerSettings, JwtSource, Settings};
use jsonwebtoken::Algorithm;
use std::str::FromStr;
use std::sync::atomic::Ordering;

fn is_hmac(a: Algorithm) -> bool {
    matches!(a, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512)
}

pub(super) fn check_jwt(
    c: &mut Checker,
    base: &str,
    j: &JwtFile,
    plans: &Plans,
    includes: &mut Vec<PathBuf>,
    jwks: &mut Vec<JwksFetch>,
) -> Option<Arc<JwtSource>> {
    let errors_before = c.errors.len();
    let header = header_name(
        c,
        &format!("{base}.header"),
        j.header.as_deref().unwrap_or("authorization"),
    );
    let tenant_claim = claim_path(
        c,
        &format!("{base}.tenant_claim"),
        j.tenant_claim.as_deref().unwrap_or("sub"),
    );
    let plan_claim = match &j.plan_claim {
        Some(p) => claim_path(c, &format!("{base}.plan_claim"), p),
        None => None,
    };
    let algorithms = check_algorithms(c, base, j.algorithms.as_deref());
    let leeway = match j.leeway {
        None => DEFAULT_JWT_LEEWAY,
        Some(ConfDuration(d)) if d > MAX_JWT_LEEWAY => {
            c.err(
                &format!("{base}.leeway"),
                format!("leeway is at most {}s", MAX_JWT_LEEWAY.as_secs()),
            );
            d
        }
        Some(ConfDuration(d)) => d,
    };
    let forward = check_forward(c, base, &j.forward_claims);
    if j.issuers.is_empty() {
        c.err(&format!("{base}.issuers"), "name at least one issuer");
    }
    let mut issuers = Vec::new();
    for (i, f) in j.issuers.iter().enumerate() {
        if let Some(s) = check_issuer(c, &format!("{base}.issuers[{i}]"), f, includes, jwks) {
            issuers.push(s);
        }
    }
    check_hmac(c, base, &algorithms, &issuers);
    if c.errors.len() > errors_before {
        return None;
    }
    let plans = plans
        .names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.clone(), i))
        .collect();
    Some(Arc::new(JwtSource::new(
        Settings {
            header: header?,
            hide: j.hide.unwrap_or(true),
            tenant_claim: tenant_claim?,
            plan_claim,
            plans,
            forward,
            algorithms,
            leeway_s: leeway.as_secs(),
        },
        issuers,
    )))
}

fn check_issuer(
    c: &mut Checker,
    base: &str,
    f: &JwtIssuerFile,
    includes: &mut Vec<PathBuf>,
    jwks: &mut Vec<JwksFetch>,
) -> Option<IssuerSettings> {
    if f.issuer.is_empty() {
        c.err(&format!("{base}.issuer"), "the issuer must not be empty");
    }
    if f.audiences.iter().any(String::is_empty) {
        c.err(
            &format!("{base}.audiences"),
            "an audience must not be empty",
        );
    }
    if f.audiences.is_empty() {
        c.warn(
            &format!("{base}.issuer"),
            "no audiences: `aud` is not checked, so a token this issuer made for another API passes too; name this gateway's APIs in audiences",
        );
    }
    let secret = f
        .secret_file
        .as_ref()
        .and_then(|name| check_secret(c, base, name, includes));
    let (keys, fetch) = match &f.jwks_uri {
        None => (Arc::new(IssuerKeys::default()), None),
        Some(text) => {
            let at = format!("{base}.jwks_uri");
            match text.parse::<http::Uri>() {
                Ok(uri) if uri.scheme_str() == Some("https") && uri.host().is_some() => {
                    let keys = shared_keys(text);
                    (keys.clone(), Some((uri, keys)))
                }
                _ => {
                    c.err(
                        &at,
                        format!("{text:?} is not an https:// URL (the issuer's JWKS, fetched over HTTPS)"),
                    );
                    (Arc::new(IssuerKeys::default()), None)
                }
            }
        }
    };
    if f.jwks_uri.is_none() && f.jwks_file.is_none() && f.secret_file.is_none() {
        c.err(
            base,
            "give jwks_uri (the issuer's JWKS over HTTPS), jwks_file (a copy of it), or both (the file is the copy used until the first fetch)",
        );
    }
    if let Some(name) = &f.jwks_file {
        read_jwks_file(c, base, name, &keys, includes);
    }
    let ca =
        f.ca.as_ref()
            .and_then(|ca| check_ca(c, base, ca, f.jwks_uri.is_some()));
    if let Some((uri, keys)) = fetch {
        jwks.push(JwksFetch {
            uri,
            issuer: f.issuer.clone(),
            ca,
            keys,
        });
    }
    Some(IssuerSettings {
        issuer: f.issuer.clone(),
        audiences: f.audiences.clone(),
        keys,
        secret,
    })
}

/// `algorithms`: the names, `none` refused; every asymmetric one when not given.
fn check_algorithms(c: &mut Checker, base: &str, names: Option<&[String]>) -> Vec<Algorithm> {
    match names {
        None => DEFAULT_JWT_ALGORITHMS.to_vec(),
        Some(names) => {
            let mut out = Vec::new();
            for (i, name) in names.iter().enumerate() {
                let at = format!("{base}.algorithms[{i}]");
                match Algorithm::from_str(name) {
                    _ if name.eq_ignore_ascii_case("none") => c.err(
                        &at,
                        "`none` is never accepted: a token must be signed",
                    ),
                    Ok(a) => out.push(a),
                    Err(_) => c.err(
                        &at,
                        format!("unknown algorithm {name:?}: expected RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA, or HS256, HS384, HS512 with a secret_file"),
                    ),
                }
            }
            if names.is_empty() {
                c.err(&format!("{base}.algorithms"), "name at least one algorithm");
            }
            out
        }
    }
}

/// HMAC only with a secret, and a secret only with HMAC.
fn check_hmac(c: &mut Checker, base: &str, algorithms: &[Algorithm], issuers: &[IssuerSettings]) {
    let any_secret = issuers.iter().any(|i| i.secret.is_some());
    if algorithms.iter().any(|a| is_hmac(*a)) && !any_secret {
        c.err(
            &format!("{base}.algorithms"),
            "HS256/HS384/HS512 need an issuer with a secret_file: an HMAC token is never checked with a public key",
        );
    }
    if any_secret && !algorithms.iter().any(|a| is_hmac(*a)) {
        c.err(
            &format!("{base}.algorithms"),
            "an issuer has a secret_file but algorithms names no HS256/HS384/HS512",
        );
    }
}

/// `secret_file`: an HMAC secret of at least 32 bytes (its text, trimmed).
fn check_secret(
    c: &mut Checker,
    base: &str,
    name: &str,
    includes: &mut Vec<PathBuf>,
) -> Option<Vec<u8>> {
    let at = format!("{base}.secret_file");
    let file = resolve_relative(&c.file, name);
    includes.push(file.clone());
    match std::fs::read(&file) {
        Ok(bytes) => {
            let secret = bytes.trim_ascii().to_vec();
            if secret.len() < 32 {
                c.err(
                    &at,
                    format!("{}: an HMAC secret of at least 32 bytes", file.display()),
                );
            }
            Some(secret)
        }
        Err(e) => {
            c.err(&at, format!("cannot read {}: {e}", file.display()));
            None
        }
    }
}

/// `jwks_file`: the keys, read now (with a `jwks_uri`, the copy used until the first fetch;
/// the keys fetched before a reload stay).
fn read_jwks_file(
    c: &mut Checker,
    base: &str,
    name: &str,
    keys: &IssuerKeys,
    includes: &mut Vec<PathBuf>,
) {
    let at = format!("{base}.jwks_file");
    let file = resolve_relative(&c.file, name);
    includes.push(file.clone());
    match std::fs::read(&file) {
        Err(e) => c.err(&at, format!("cannot read {}: {e}", file.display())),
        Ok(doc) => match KeySet::parse(&doc) {
            Err(e) => c.err(&at, format!("{}: {e}", file.display())),
            Ok((set, skipped)) => {
                for s in skipped {
                    c.warn(&at, format!("{}: {s}: left out", file.display()));
                }
                if set.keys.is_empty() {
                    c.err(&at, format!("{}: no key to verify with", file.display()));
                }
                // with a jwks_uri, the file is the copy used until the first fetch (the
                // keys fetched before a reload stay)
                if !keys.remote || keys.fetched_ms.load(Ordering::Relaxed) == 0 {
                    keys.set.store(Arc::new(set));
                }
            }
        },
    }
}

/// `ca`: the certificates a `jwks_uri`'s server is verified against.
fn check_ca(
    c: &mut Checker,
    base: &str,
    ca: &str,
    remote: bool,
) -> Option<Arc<Box<[crate::config::certificates::X509]>>> {
    let at = format!("{base}.ca");
    if !remote {
        c.err(&at, format!("ca {ca:?} applies to jwks_uri only"));
    }
    let (file, pem) = c.read_file(&at, ca)?;
    match crate::config::certificates::X509::stack_from_pem(&pem) {
        Ok(list) if !list.is_empty() => Some(Arc::new(list.into_boxed_slice())),
        _ => {
            c.err(&at, format!("{} holds no PEM certificate", file.display()));
            None
        }
    }
}

/// `forward_claims`: claim path -> the header it is told to the upstream in.
fn check_forward(
    c: &mut Checker,
    base: &str,
    claims: &BTreeMap<String, String>,
) -> Vec<(ClaimPath, HeaderName)> {
    let mut forward = Vec::new();
    for (path, name) in claims {
        let at = format!("{base}.forward_claims.{path}");
        if let (Some(p), Some(h)) = (claim_path(c, &at, path), header_name(c, &at, name)) {
            forward.push((p, h));
        }
    }
    forward
}

/// A claim path, or an error at `at` saying what one is.
fn claim_path(c: &mut Checker, at: &str, text: &str) -> Option<ClaimPath> {
    match ClaimPath::parse(text) {
        Ok(p) => Some(p),
        Err(e) => {
            c.err(at, e);
            None
        }
    }
}
