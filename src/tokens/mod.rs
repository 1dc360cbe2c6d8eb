//! Bearer tokens as a tenant source (`tenant.from: - jwt: ...`): a JWT (RFC 7519) signed by
//! one of the configured issuers, whose claims name the tenant, its plan and what the upstream
//! is told of the caller.
//!
//! A request's token, in order:
//! 1. taken from its header (`Authorization: Bearer <token>` by default); none there: the
//!    later sources try (`Outcome::Absent`);
//! 2. looked up in the cache of verified tokens (by a hash of the whole token, compared in
//!    full): a token reused until its `exp` costs a look-up, not a signature check;
//! 3. else verified with `jsonwebtoken`: its `alg` one of `algorithms` (never `none`; HMAC
//!    only with an issuer's `secret_file`), its `iss` a configured issuer, its key that
//!    issuer's (by `kid`), its signature, `exp` and `nbf` (with `leeway`), `aud` one of the
//!    issuer's `audiences`; claims as strict JSON (a key written twice is refused);
//! 4. the tenant from `tenant_claim`, the plan from `plan_claim` (a plan the config does not
//!    know leaves the tenant in its configured plan, or none), the forwarded claims.
//!
//! Anything wrong is `Outcome::Invalid` with a reason for the log, never the token.

pub mod cache;
pub mod claims;
pub mod keys;
pub mod verified;

use arc_swap::ArcSwap;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use cache::TokenCache;
use claims::{as_text, ClaimPath, Claims};
use http::{HeaderMap, HeaderName, HeaderValue};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, Validation};
use keys::KeySet;
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
pub use verified::Verified;

/// The longest token read (a larger one is refused unread).
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// A `jwt` tenant source, ready to verify with.
pub struct JwtSource {
    pub settings: Settings,
    pub issuers: Vec<Issuer>,
    cache: TokenCache,
}

impl std::fmt::Debug for JwtSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtSource")
            .field("header", &self.settings.header)
            .field(
                "issuers",
                &self.issuers.iter().map(|i| &i.issuer).collect::<Vec<_>>(),
            )
            .field("tenant_claim", &self.settings.tenant_claim)
            .finish_non_exhaustive()
    }
}

/// One issuer the gateway trusts.
pub struct Issuer {
    pub issuer: String,
    /// Its public keys (a JWKS), replaced whole when read again.
    pub keys: Arc<IssuerKeys>,
    /// The HMAC secret (`secret_file`), the only key HS256/384/512 tokens are checked with.
    pub secret: Option<DecodingKey>,
    /// One per algorithm it may sign with (`jsonwebtoken` checks every algorithm of a
    /// `Validation` against the key's family).
    validations: Vec<(Algorithm, Validation)>,
}

impl Issuer {
    fn validation(&self, alg: Algorithm) -> Option<&Validation> {
        self.validations
            .iter()
            .find(|(a, _)| *a == alg)
            .map(|(_, v)| v)
    }
}

/// An issuer's keys as last read, shared by the configs that name the same JWKS (a reload
/// keeps the keys fetched before it: `shared_keys`).
#[derive(Default)]
pub struct IssuerKeys {
    pub set: ArcSwap<KeySet>,
    /// Fetched from a `jwks_uri` (else read from a file with the config).
    pub remote: bool,
    /// A token named a key id the set lacks: the fetcher fetches again at once (at most once
    /// per `MIN_REFETCH`).
    pub wanted: AtomicBool,
    /// When the last fetch started and when the keys were last fetched (Unix ms; 0: never).
    pub attempted_ms: AtomicU64,
    pub fetched_ms: AtomicU64,
    /// Woken at the end of every fetch.
    pub fetched: tokio::sync::Notify,
    /// Fetches started and ended.
    started: AtomicU64,
    ended: AtomicU64,
    /// The last fetch's error (`None`: it worked, or none ended yet), for the status page.
    pub error: parking_lot::Mutex<Option<String>>,
}

impl std::fmt::Debug for IssuerKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuerKeys")
            .field("keys", &self.set.load().keys.len())
            .field("remote", &self.remote)
            .finish_non_exhaustive()
    }
}

/// The same keys (one holder per JWKS).
impl PartialEq for IssuerKeys {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}
impl Eq for IssuerKeys {}

/// The least time between two fetches of one JWKS, whatever clients send: a flood of unknown
/// key ids costs the identity provider one request per this.
pub const MIN_REFETCH_MS: u64 = 5_000;

impl IssuerKeys {
    /// A token names a key id the keys lack. Ask for a fetch; when one starts now (or runs),
    /// what to wait on for it.
    pub fn want(self: &Arc<Self>, now_ms: u64) -> Option<KeyWait> {
        if !self.remote {
            return None;
        }
        let ended = self.ended.load(Ordering::Acquire);
        let last = self.attempted_ms.load(Ordering::Relaxed);
        let running = last > 0 && ended < self.started.load(Ordering::Acquire);
        if !running && now_ms.saturating_sub(last) < MIN_REFETCH_MS {
            return None;
        }
        self.wanted.store(true, Ordering::Release);
        Some(KeyWait {
            keys: self.clone(),
            ended,
        })
    }

    /// A fetch starts (the fetcher's): returns whether one was wanted by a token.
    pub fn fetch_starts(&self, now_ms: u64) -> bool {
        self.attempted_ms.store(now_ms, Ordering::Relaxed);
        self.started.fetch_add(1, Ordering::AcqRel);
        self.wanted.swap(false, Ordering::AcqRel)
    }

    /// A fetch ended: `keys` when it brought them, else why not.
    pub fn fetch_ends(&self, now_ms: u64, result: Result<KeySet, String>) {
        match result {
            Ok(set) => {
                self.set.store(Arc::new(set));
                self.fetched_ms.store(now_ms, Ordering::Relaxed);
                *self.error.lock() = None;
            }
            Err(e) => *self.error.lock() = Some(e),
        }
        self.ended.fetch_add(1, Ordering::AcqRel);
        self.fetched.notify_waiters();
    }

    /// Fetches ended so far.
    pub fn fetches_ended(&self) -> u64 {
        self.ended.load(Ordering::Acquire)
    }
}

/// A request waiting for its token issuer's keys to be fetched again.
#[derive(Debug, PartialEq, Eq)]
pub struct KeyWait {
    pub keys: Arc<IssuerKeys>,
    /// Fetches ended when the request asked.
    ended: u64,
}

impl KeyWait {
    /// Until a fetch that started after the request asked has ended, at most `KEYS_WAIT`, and
    /// never past `deadline` (a gRPC call's).
    pub async fn until_fetched(&self, deadline: Option<tokio::time::Instant>) {
        let bound = deadline.map_or(KEYS_WAIT, |d| {
            KEYS_WAIT.min(d.saturating_duration_since(tokio::time::Instant::now()))
        });
        let wait = async {
            loop {
                let notified = self.keys.fetched.notified();
                if self.keys.ended.load(Ordering::Acquire) > self.ended {
                    return;
                }
                notified.await;
            }
        };
        let _ = tokio::time::timeout(bound, wait).await;
    }
}

/// How long a request waits for its token issuer's keys to be fetched again.
pub const KEYS_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The keys of a JWKS URI, the same for every config that names it while one holds them.
pub fn shared_keys(uri: &str) -> Arc<IssuerKeys> {
    static REGISTRY: parking_lot::Mutex<Option<HashMap<String, Weak<IssuerKeys>>>> =
        parking_lot::Mutex::new(None);
    let mut registry = REGISTRY.lock();
    let map = registry.get_or_insert_with(HashMap::new);
    map.retain(|_, w| w.strong_count() > 0);
    if let Some(k) = map.get(uri).and_then(Weak::upgrade) {
        return k;
    }
    let k = Arc::new(IssuerKeys {
        remote: true,
        ..IssuerKeys::default()
    });
    map.insert(uri.to_string(), Arc::downgrade(&k));
    k
}

/// A request's token, as the `jwt` source finds it.
#[derive(Debug)]
pub enum Outcome {
    /// No token: the later sources try.
    Absent,
    Valid(Arc<Verified>),
    /// A token that is not valid: 401, whatever the later sources say. The reason is for the
    /// log and the metrics.
    Invalid(Refusal, &'static str),
    /// Its key id is not among its issuer's keys, which are being fetched again: check it once
    /// more when they are (bounded), else it is `Invalid`.
    AwaitKeys(KeyWait),
}

/// Why a token was refused (`tollgate_tokens_refused_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not a JWT: not three base64url parts, not UTF-8, not ASCII, empty, or over 8 KiB.
    Malformed,
    /// Its header or claims are not JSON (or repeat a key), or have a `crit` extension.
    Json,
    /// Its `alg` is not one of `algorithms` (`none` never is), or does not fit the key.
    Algorithm,
    /// No `iss`, or one that is not among `issuers`.
    Issuer,
    /// No key of its issuer has its `kid` (or fits its `alg`).
    Key,
    Signature,
    Expired,
    NotYetValid,
    Audience,
    /// A claim it must have is missing or of the wrong type (exp, iss, aud, the tenant claim).
    Claims,
}

impl Refusal {
    pub const ALL: [Refusal; 10] = [
        Refusal::Malformed,
        Refusal::Json,
        Refusal::Algorithm,
        Refusal::Issuer,
        Refusal::Key,
        Refusal::Signature,
        Refusal::Expired,
        Refusal::NotYetValid,
        Refusal::Audience,
        Refusal::Claims,
    ];

    /// The metric's label.
    pub fn code(self) -> &'static str {
        match self {
            Refusal::Malformed => "malformed",
            Refusal::Json => "json",
            Refusal::Algorithm => "algorithm",
            Refusal::Issuer => "issuer",
            Refusal::Key => "key",
            Refusal::Signature => "signature",
            Refusal::Expired => "expired",
            Refusal::NotYetValid => "not_yet_valid",
            Refusal::Audience => "audience",
            Refusal::Claims => "claims",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// A refusal with its words for the log.
type Refused = (Refusal, &'static str);

impl From<Refused> for Outcome {
    fn from((r, why): Refused) -> Outcome {
        Outcome::Invalid(r, why)
    }
}

/// The settings of a `jwt` source.
pub struct Settings {
    /// The header that carries the token (`authorization`: `Bearer <token>`).
    pub header: HeaderName,
    /// The token stays at the gateway (default), as `api_key.hide`.
    pub hide: bool,
    pub tenant_claim: ClaimPath,
    pub plan_claim: Option<ClaimPath>,
    /// plan name -> index into the config's plans
    pub plans: HashMap<String, usize>,
    /// Claims passed to the upstream, each as a header (a client's own copy never is).
    pub forward: Vec<(ClaimPath, HeaderName)>,
    pub algorithms: Vec<Algorithm>,
    pub leeway_s: u64,
}

/// One issuer as the config gives it.
pub struct IssuerSettings {
    pub issuer: String,
    pub audiences: Vec<String>,
    pub keys: Arc<IssuerKeys>,
    pub secret: Option<Vec<u8>>,
}

impl JwtSource {
    pub fn new(s: Settings, issuers: Vec<IssuerSettings>) -> JwtSource {
        let issuers = issuers
            .into_iter()
            .map(|i| {
                let validations = s
                    .algorithms
                    .iter()
                    .copied()
                    .filter(|a| i.secret.is_some() || family(*a) != AlgorithmFamily::Hmac)
                    .map(|a| {
                        let mut v = Validation::new(a);
                        v.leeway = s.leeway_s;
                        v.validate_nbf = true;
                        v.set_issuer(&[&i.issuer]);
                        if i.audiences.is_empty() {
                            // (-t warns: any token of the issuer passes, whatever its `aud`)
                            v.validate_aud = false;
                            v.set_required_spec_claims(&["exp", "iss"]);
                        } else {
                            v.set_audience(&i.audiences);
                            v.set_required_spec_claims(&["exp", "iss", "aud"]);
                        }
                        (a, v)
                    })
                    .collect();
                Issuer {
                    secret: i.secret.as_deref().map(DecodingKey::from_secret),
                    issuer: i.issuer,
                    keys: i.keys,
                    validations,
                }
            })
            .collect();
        JwtSource {
            settings: s,
            issuers,
            cache: TokenCache::default(),
        }
    }

    /// The request's token, checked. `now_s`: Unix seconds (the cache's clock; `exp` and
    /// `nbf` are checked by `jsonwebtoken` on the system clock).
    pub fn check(&self, headers: &HeaderMap, now_ms: u64) -> Outcome {
        let now_s = now_ms / 1000;
        let Some(token) = self.token_in(headers) else {
            return Outcome::Absent;
        };
        let token = match token {
            Ok(t) => t,
            Err(why) => return Outcome::Invalid(why.0, why.1),
        };
        if let Some(v) = self.cache.get(token, now_s) {
            return Outcome::Valid(v);
        }
        match self.verify(token, now_ms) {
            Ok(v) => {
                let v = Arc::new(v);
                if v.until_s > now_s {
                    self.cache.insert(token, v.clone(), now_s);
                }
                Outcome::Valid(v)
            }
            Err(outcome) => outcome,
        }
    }

    /// The token of the request: `None` when it carries none, an error when what it carries
    /// cannot be one.
    fn token_in<'h>(&self, headers: &'h HeaderMap) -> Option<Result<&'h str, Refused>> {
        let value = headers.get(&self.settings.header)?;
        let Ok(text) = value.to_str() else {
            return Some(Err((Refusal::Malformed, "the token is not ASCII text")));
        };
        let text = text.trim();
        if text.eq_ignore_ascii_case("bearer") {
            return Some(Err((Refusal::Malformed, "the bearer token is empty")));
        }
        let token = match text.split_once(' ') {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => rest.trim_start(),
            // another scheme (`Basic ...`): not a bearer token, the later sources try
            Some(_) if self.settings.header == http::header::AUTHORIZATION => return None,
            Some(_) => return Some(Err((Refusal::Malformed, "the token has spaces in it"))),
            None if self.settings.header == http::header::AUTHORIZATION => return None,
            None => text,
        };
        if token.is_empty() {
            return Some(Err((Refusal::Malformed, "the bearer token is empty")));
        }
        if token.len() > MAX_TOKEN_BYTES {
            return Some(Err((Refusal::Malformed, "the token is longer than 8 KiB")));
        }
        Some(Ok(token))
    }

    /// Verify a token not in the cache.
    fn verify(&self, token: &str, now_ms: u64) -> Result<Verified, Outcome> {
        let header = self.header_of(token)?;
        // the issuer it names chooses the keys; its signature is checked below
        let unverified: Claims =
            jsonwebtoken::dangerous::insecure_decode_claims(token).map_err(reason)?;
        let iss = unverified
            .0
            .get("iss")
            .and_then(serde_json::Value::as_str)
            .ok_or((Refusal::Issuer, "it names no issuer (`iss`)"))?;
        let issuer = self
            .issuers
            .iter()
            .find(|i| i.issuer == iss)
            .ok_or((Refusal::Issuer, "its issuer is not one of `issuers`"))?;
        let validation = issuer.validation(header.alg).ok_or((
            Refusal::Algorithm,
            "an HMAC token from an issuer without a secret_file",
        ))?;
        let claims = if family(header.alg) == AlgorithmFamily::Hmac {
            let secret = issuer
                .secret
                .as_ref()
                .ok_or((Refusal::Algorithm, "no secret for HMAC"))?;
            jsonwebtoken::decode::<Claims>(token, secret, validation)
                .map_err(reason)?
                .claims
        } else {
            verify_with_keys(token, &header, issuer, validation, now_ms)?
        };
        Ok(self.read_claims(&claims)?)
    }

    /// The token's JOSE header, read strictly first: a key written twice, and an `alg` that is
    /// not allowed (`none` among them), are refused before anything else is read; `crit`
    /// extensions too (RFC 7515 4.1.11: the gateway understands none).
    fn header_of(&self, token: &str) -> Result<jsonwebtoken::Header, Outcome> {
        let head = token.split('.').next().unwrap_or("");
        let head = URL_SAFE_NO_PAD
            .decode(head)
            .map_err(|_| (Refusal::Malformed, "its header is not base64url"))?;
        let head: Claims = serde_json::from_slice(&head).map_err(|_| {
            (
                Refusal::Json,
                "its header is not a JSON object (or repeats a key)",
            )
        })?;
        let alg = head.0.get("alg").and_then(serde_json::Value::as_str);
        if !alg
            .and_then(|a| Algorithm::from_str(a).ok())
            .is_some_and(|a| self.settings.algorithms.contains(&a))
        {
            return Err((
                Refusal::Algorithm,
                "its algorithm is not one of `algorithms`",
            )
                .into());
        }
        let header = jsonwebtoken::decode_header(token).map_err(reason)?;
        if header.crit.is_some() {
            return Err((Refusal::Json, "its header has `crit` extensions").into());
        }
        Ok(header)
    }

    /// What the verified claims say.
    fn read_claims(&self, claims: &Claims) -> Result<Verified, Refused> {
        let tenant = self
            .settings
            .tenant_claim
            .find(claims)
            .and_then(as_text)
            .ok_or((
                Refusal::Claims,
                "the tenant claim is missing, empty or not a string or number",
            ))?;
        let s = &self.settings;
        let plan = s
            .plan_claim
            .as_ref()
            .and_then(|p| p.find(claims))
            .and_then(as_text)
            .and_then(|name| self.settings.plans.get(&name).copied());
        let forward = s
            .forward
            .iter()
            .filter_map(|(path, header)| {
                let v = path.find(claims)?;
                let text = as_text(v).unwrap_or_else(|| v.to_string());
                Some((header.clone(), HeaderValue::try_from(text).ok()?))
            })
            .collect();
        let exp = claims
            .0
            .get("exp")
            .and_then(serde_json::Value::as_u64)
            .ok_or((Refusal::Claims, "its `exp` is not a number of seconds"))?;
        Ok(Verified {
            tenant: tenant.into_bytes().into_boxed_slice(),
            plan,
            forward,
            until_s: exp.saturating_add(self.settings.leeway_s),
        })
    }
}

/// The claims of a token checked with its issuer's public keys (by `kid`); a key id the keys
/// lack asks for them to be fetched again (`Outcome::AwaitKeys`), a key the issuer may have
/// just added.
fn verify_with_keys(
    token: &str,
    header: &jsonwebtoken::Header,
    issuer: &Issuer,
    validation: &Validation,
    now_ms: u64,
) -> Result<Claims, Outcome> {
    let set = issuer.keys.set.load();
    let kid = header.kid.as_deref();
    let mut last = (
        Refusal::Key,
        "no key of its issuer has its key id (`kid`) and algorithm",
    );
    for key in set.candidates(kid, header.alg).take(4) {
        match jsonwebtoken::decode::<Claims>(token, &key.key, validation) {
            Ok(d) => return Ok(d.claims),
            Err(e) => last = reason(e),
        }
    }
    match kid {
        Some(k) if !set.has_kid(k) => match issuer.keys.want(now_ms) {
            Some(wait) => Err(Outcome::AwaitKeys(wait)),
            None => Err(last.into()),
        },
        _ => Err(last.into()),
    }
}

fn family(a: Algorithm) -> AlgorithmFamily {
    match a {
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => AlgorithmFamily::Hmac,
        Algorithm::ES256 | Algorithm::ES384 => AlgorithmFamily::Ec,
        Algorithm::EdDSA => AlgorithmFamily::Ed,
        _ => AlgorithmFamily::Rsa,
    }
}

/// Why `jsonwebtoken` refused a token, in words for the log.
fn reason(e: jsonwebtoken::errors::Error) -> Refused {
    match e.kind() {
        ErrorKind::InvalidToken => (
            Refusal::Malformed,
            "it is not a JWT (three base64url parts)",
        ),
        ErrorKind::Base64(_) => (Refusal::Malformed, "a part is not base64url"),
        ErrorKind::Utf8(_) => (Refusal::Malformed, "a part is not UTF-8"),
        ErrorKind::Json(_) => (
            Refusal::Json,
            "its header or claims are not valid JSON (or repeat a key)",
        ),
        ErrorKind::InvalidSignature => (Refusal::Signature, "its signature does not match"),
        ErrorKind::ExpiredSignature => (Refusal::Expired, "it has expired (`exp`)"),
        ErrorKind::ImmatureSignature => (Refusal::NotYetValid, "it is not valid yet (`nbf`)"),
        ErrorKind::InvalidIssuer => (
            Refusal::Issuer,
            "its issuer (`iss`) is not the one expected",
        ),
        ErrorKind::InvalidAudience => (
            Refusal::Audience,
            "its audience (`aud`) is not one of `audiences`",
        ),
        ErrorKind::MissingRequiredClaim(_) => (
            Refusal::Claims,
            "a claim it must have is missing (exp, iss, aud)",
        ),
        ErrorKind::InvalidClaimFormat(_) => {
            (Refusal::Claims, "a registered claim has the wrong type")
        }
        ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => {
            (Refusal::Algorithm, "its algorithm does not fit the key")
        }
        _ => (Refusal::Key, "it cannot be verified with its issuer's keys"),
    }
}

/// A source with one Ed25519 key (kid `ed-1`) and an HMAC secret, both of issuer
/// `https://issuer.example/` for audience `api`, for the fuzz target (`fuzz/`) and the property
/// tests (`tests/no_panic.rs`) of the token parser.
#[doc(hidden)]
pub fn example_source() -> JwtSource {
    let jwks = br#"{"keys":[{"kty":"OKP","crv":"Ed25519","kid":"ed-1","alg":"EdDSA","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}"#;
    let keys = Arc::new(IssuerKeys::default());
    if let Ok((set, _)) = KeySet::parse(jwks) {
        keys.set.store(Arc::new(set));
    }
    let path = |p: &str| ClaimPath::parse(p).unwrap_or_else(|_| ClaimPath(Box::from("sub")));
    JwtSource::new(
        Settings {
            header: http::header::AUTHORIZATION,
            hide: true,
            tenant_claim: path("org.id"),
            plan_claim: Some(path("plan")),
            plans: HashMap::new(),
            forward: vec![(path("sub"), HeaderName::from_static("x-user-id"))],
            algorithms: vec![Algorithm::EdDSA, Algorithm::HS256],
            leeway_s: 30,
        },
        vec![IssuerSettings {
            issuer: "https://issuer.example/".to_string(),
            audiences: vec!["api".to_string()],
            keys,
            secret: Some(b"0123456789abcdef0123456789abcdef".to_vec()),
        }],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::time::Instant;

    fn remote() -> Arc<IssuerKeys> {
        Arc::new(IssuerKeys {
            remote: true,
            ..IssuerKeys::default()
        })
    }

    /// A request waiting for its issuer's keys: at most `KEYS_WAIT`, never past its deadline,
    /// and no longer than the fetch (on tokio's paused clock).
    #[tokio::test(start_paused = true)]
    async fn a_wait_for_keys_is_bounded_by_the_fetch_the_bound_and_the_deadline() {
        let keys = remote();
        let now_ms = 1_800_000_000_000;
        let wait = keys.want(now_ms).expect("a first fetch may start");
        let t0 = Instant::now();
        wait.until_fetched(None).await;
        assert_eq!(t0.elapsed(), KEYS_WAIT);
        let t0 = Instant::now();
        wait.until_fetched(Some(t0 + Duration::from_millis(300)))
            .await;
        assert_eq!(t0.elapsed(), Duration::from_millis(300));
        // the fetch ends after 100 ms: the wait with it
        let fetcher = keys.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            fetcher.fetch_starts(now_ms);
            fetcher.fetch_ends(now_ms, Err("down".into()));
        });
        let t0 = Instant::now();
        wait.until_fetched(None).await;
        assert_eq!(t0.elapsed(), Duration::from_millis(100));
        // and a fetch that began less than MIN_REFETCH_MS ago is not asked for again
        assert!(keys.want(now_ms + MIN_REFETCH_MS - 1).is_none());
        assert!(keys.want(now_ms + MIN_REFETCH_MS).is_some());
        // a file's keys are never fetched
        assert!(Arc::new(IssuerKeys::default()).want(now_ms).is_none());
    }
}
