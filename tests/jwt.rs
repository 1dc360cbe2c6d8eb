//! Tenants from signed tokens (docs/configuration.md, "Signed tokens (JWT)"): tokens minted by
//! PyJWT (tests/jwt/mint.py, in target/test-venv) with RSA, EC and Ed25519 keys name the
//! tenant and its plan through their claims; every bad token of the corpus is a 401 with
//! `WWW-Authenticate: Bearer error="invalid_token"` and its reason in the log (never the
//! token), and none reaches the upstream.

mod common;
use common::{one_route_config, repo, test_python, Edit, Gateway, TempDir, Upstream};
use serde_json::{json, Value};
use std::process::Command;
use std::time::Duration;

const ISS: &str = "https://idp.test/";
const AUD: &str = "api.test";

/// The keys of a test, made by PyJWT's side (cryptography).
struct Keys(TempDir);

impl Keys {
    fn new() -> Keys {
        let dir = TempDir::new();
        mint(&["keys", dir.0.to_str().unwrap()]);
        Keys(dir)
    }

    fn jwks(&self, name: &str) -> String {
        std::fs::read_to_string(self.0 .0.join(name)).unwrap()
    }

    /// Tokens for `specs` (see mint.py).
    fn tokens(&self, specs: &Value) -> Vec<String> {
        let out = mint(&["tokens", self.0 .0.to_str().unwrap(), &specs.to_string()]);
        serde_json::from_str(&out).unwrap()
    }

    fn token(&self, spec: Value) -> String {
        self.tokens(&json!([spec])).remove(0)
    }
}

fn mint(args: &[&str]) -> String {
    let out = Command::new(test_python())
        .arg(repo().join("tests/jwt/mint.py"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn now() -> u64 {
    common::now_ms() / 1000
}

/// Claims of a valid token for `org`, valid for an hour.
fn claims(org: &str) -> Value {
    json!({"iss": ISS, "aud": AUD, "sub": format!("user-of-{org}"), "org_id": org,
           "exp": now() + 3600, "iat": now()})
}

/// A gateway whose tenants come from tokens (then from an API key): 5 an hour per tenant,
/// 50 for `premium`.
fn gateway(up: &Upstream, keys: &Keys) -> Gateway {
    let cfg = format!(
        "{}tenant:\n  from:\n    - jwt:\n        issuers:\n          - issuer: {ISS}\n            audiences: [{AUD}]\n            jwks_file: jwks.json\n        tenant_claim: org_id\n        plan_claim: plan\n        forward_claims: {{ sub: x-user-id }}\n    - api_key: {{ header: x-api-key, keys: {{ k-initech: initech }} }}\n  required: true\nplans:\n  premium: []\nlimits:\n  - id: api\n    pathPattern: /**\n    tiers: [{{ period: 1h, threshold: 5 }}]\n    plans:\n      premium: [{{ period: 1h, threshold: 50 }}]\n",
        one_route_config(up.addr, 1, "")
    );
    Gateway::start_with_files(&cfg, &[("jwks.json", &keys.jwks("jwks.json"))])
}

fn b64url(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data)
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[test]
fn tokens_of_each_key_kind_name_the_tenant_and_plan() {
    let keys = Keys::new();
    let up = Upstream::start("u");
    let gw = gateway(&up, &keys);
    let mut premium = claims("globex");
    premium["plan"] = json!("premium");
    let mut unknown_plan = claims("hooli");
    unknown_plan["plan"] = json!("gold");
    let mut expired_within_leeway = claims("initech");
    expired_within_leeway["exp"] = json!(now() - 10);
    let tokens = keys.tokens(&json!([
        {"key": "rsa", "claims": claims("acme")},
        {"key": "ec", "claims": claims("acme")},
        {"key": "ec384", "claims": claims("acme")},
        {"key": "ed", "claims": claims("acme")},
        {"key": "ps", "claims": claims("acme")},
        {"key": "rsa", "claims": premium},
        {"key": "rsa", "claims": unknown_plan},
        // expired 10 s ago: within the default leeway of 30 s
        {"key": "ed", "claims": expired_within_leeway},
    ]));
    for (i, t) in tokens[..5].iter().enumerate() {
        let auth = bearer(t);
        let r = gw.get("/x", &[("authorization", &auth)]);
        assert_eq!(r.status, 200, "token {i}: {}\n{}", r.body, gw.log());
        assert_eq!(r.upstream_headers("x-tenant-id"), vec!["acme"], "token {i}");
        assert_eq!(r.upstream_headers("x-user-id"), vec!["user-of-acme"]);
        // the token stays at the gateway (`hide` by default)
        assert!(r.upstream_headers("authorization").is_empty(), "{}", r.body);
        assert_eq!(r.header("x-ratelimit-limit"), Some("5"));
    }
    // the plan claim places the tenant in its plan; a plan the config does not know, in none
    let auth = bearer(&tokens[5]);
    let r = gw.get("/x", &[("authorization", &auth)]);
    assert_eq!(r.upstream_headers("x-tenant-id"), vec!["globex"]);
    assert_eq!(r.header("x-ratelimit-limit"), Some("50"));
    let auth = bearer(&tokens[6]);
    let r = gw.get("/x", &[("authorization", &auth)]);
    assert_eq!(r.upstream_headers("x-tenant-id"), vec!["hooli"]);
    assert_eq!(r.header("x-ratelimit-limit"), Some("5"));
    let auth = bearer(&tokens[7]);
    let r = gw.get("/x", &[("authorization", &auth)]);
    assert_eq!(
        r.upstream_headers("x-tenant-id"),
        vec!["initech"],
        "{}",
        r.body
    );
    // no token: the later sources try; a client's own x-user-id never reaches the upstream
    let r = gw.get("/x", &[("x-api-key", "k-initech"), ("x-user-id", "root")]);
    assert_eq!(r.status, 200);
    assert_eq!(r.upstream_headers("x-tenant-id"), vec!["initech"]);
    assert!(r.upstream_headers("x-user-id").is_empty(), "{}", r.body);
    // another scheme is not a bearer token either
    let r = gw.get(
        "/x",
        &[("authorization", "Basic dTpw"), ("x-api-key", "k-initech")],
    );
    assert_eq!(r.status, 200);
    let r = gw.get("/x", &[]);
    assert_eq!(r.status, 401);
    assert_eq!(r.header("www-authenticate"), None);
    // the same token again is the cache's: acme has spent 5 of its 5 (tokens 0-4)
    let auth = bearer(&tokens[0]);
    assert_eq!(gw.get("/x", &[("authorization", &auth)]).status, 429);
}

#[test]
fn every_bad_token_is_a_401_that_never_reaches_the_upstream() {
    let keys = Keys::new();
    let up = Upstream::start("u");
    let gw = gateway(&up, &keys);
    let good = claims("acme");
    let with = |k: &str, v: Value| {
        let mut c = good.clone();
        c[k] = v;
        c
    };
    let without = |k: &str| {
        let mut c = good.clone();
        c.as_object_mut().unwrap().remove(k);
        c
    };
    let valid = keys.token(json!({"key": "rsa", "claims": good}));
    // each case with the reasons its refusal may be counted under
    let cases: Vec<(&str, &[&str], Value)> = vec![
        (
            "alg none",
            &["algorithm"],
            json!({"key": "none", "claims": good}),
        ),
        (
            "HS256 with the RSA public key",
            &["algorithm"],
            json!({"key": "rsa-public-as-hmac", "claims": good}),
        ),
        (
            "HS256 with a secret the gateway has none of",
            &["algorithm"],
            json!({"key": "hmac:0123456789abcdef0123456789abcdef", "claims": good}),
        ),
        (
            "kid with a path",
            &["key"],
            json!({"key": "rsa", "headers": {"kid": "../../../../etc/passwd"}, "claims": good}),
        ),
        (
            "kid with a URL",
            &["key"],
            json!({"key": "rsa", "headers": {"kid": "https://evil.test/jwks.json"}, "claims": good}),
        ),
        (
            "a key of the right kind, not the issuer's",
            &["signature"],
            json!({"key": "rsa2", "headers": {"kid": "rsa-1"}, "claims": good}),
        ),
        (
            "expired",
            &["expired"],
            json!({"key": "rsa", "claims": with("exp", json!(now() - 3600))}),
        ),
        (
            "not yet valid",
            &["not_yet_valid"],
            json!({"key": "ec", "claims": with("nbf", json!(now() + 3600))}),
        ),
        (
            "wrong issuer",
            &["issuer"],
            json!({"key": "rsa", "claims": with("iss", json!("https://evil.test/"))}),
        ),
        (
            "wrong audience",
            &["audience"],
            json!({"key": "rsa", "claims": with("aud", json!("other-api"))}),
        ),
        (
            "no audience",
            &["claims"],
            json!({"key": "rsa", "claims": without("aud")}),
        ),
        (
            "no exp",
            &["claims"],
            json!({"key": "rsa", "claims": without("exp")}),
        ),
        (
            "exp of the wrong type",
            &["claims", "json"],
            json!({"key": "rsa", "claims": with("exp", json!("tomorrow"))}),
        ),
        (
            "tenant claim of the wrong type",
            &["claims"],
            json!({"key": "rsa", "claims": with("org_id", json!({"id": "acme"}))}),
        ),
        (
            "no tenant claim",
            &["claims"],
            json!({"key": "ed", "claims": without("org_id")}),
        ),
        (
            "non-JSON claims",
            &["json"],
            json!({"key": "rsa", "raw": "not json"}),
        ),
        (
            "duplicate keys in the claims",
            &["json"],
            json!({"key": "rsa", "raw": format!(
            "{{\"iss\":\"{ISS}\",\"aud\":\"{AUD}\",\"exp\":{},\"org_id\":\"acme\",\"org_id\":\"globex\"}}", now() + 3600)}),
        ),
        (
            "duplicate alg in the header",
            &["json"],
            json!({"key": "rsa", "headers": {"x": 1}, "claims": good}),
        ),
    ];
    let specs: Vec<Value> = cases.iter().map(|(_, _, s)| s.clone()).collect();
    let mut tokens: Vec<(String, &[&str], String)> = cases
        .iter()
        .map(|(n, r, _)| (n.to_string(), *r))
        .zip(keys.tokens(&Value::Array(specs)))
        .map(|((n, r), t)| (n, r, t))
        .collect();
    // made by hand from the valid token
    let (head, rest) = valid.split_once('.').unwrap();
    let (body, sig) = rest.split_once('.').unwrap();
    let flipped = format!(
        "{head}.{body}.{}{}",
        if sig.starts_with('A') { "B" } else { "A" },
        &sig[1..]
    );
    // the header of the last case with its `alg` written twice (by hand: no library writes it)
    let last = tokens.last_mut().unwrap();
    let (_, rest) = last.2.split_once('.').unwrap();
    let twice = r#"{"alg":"RS256","kid":"rsa-1","alg":"none"}"#;
    last.2 = format!("{}.{rest}", b64url(twice.as_bytes()));
    tokens.push(("a bad signature".into(), &["signature"], flipped));
    let cut = valid[..valid.len() - 20].to_string();
    tokens.push(("truncated".into(), &["signature", "malformed"], cut));
    tokens.push(("two parts".into(), &["malformed"], format!("{head}.{body}")));
    tokens.push((
        "not base64".into(),
        &["malformed", "json"],
        format!("{head}.{body}!.{sig}"),
    ));
    let long = format!("{head}.{}.{sig}", "A".repeat(16 * 1024));
    tokens.push(("16 KiB".into(), &["malformed"], long));
    tokens.push(("empty".into(), &["malformed"], String::new()));
    let hits = up.hits();
    let refused = |reason: &str| {
        common::metric_sum(
            &gw.metrics(),
            &format!("tollgate_tokens_refused_total{{reason=\"{reason}\"}}"),
        )
    };
    for (name, reasons, t) in &tokens {
        let before: Vec<f64> = reasons.iter().map(|r| refused(r)).collect();
        let auth = bearer(t);
        // a valid API key beside it changes nothing: a bad token is refused, not skipped
        let r = gw.get(
            "/x",
            &[("authorization", &auth), ("x-api-key", "k-initech")],
        );
        assert_eq!(r.status, 401, "{name}: {}", r.body);
        assert_eq!(
            r.header("www-authenticate"),
            Some("Bearer error=\"invalid_token\""),
            "{name}"
        );
        assert_eq!(
            r.json()["detail"],
            "the bearer token is not valid",
            "{name}"
        );
        let after: Vec<f64> = reasons.iter().map(|r| refused(r)).collect();
        let counted: f64 = after.iter().zip(&before).map(|(a, b)| a - b).sum();
        assert_eq!(
            counted,
            1.0,
            "{name}: not counted under {reasons:?}\n{}",
            gw.log()
        );
    }
    assert_eq!(up.hits(), hits, "a bad token reached the upstream");
    // the valid one passes, so the refusals above were the tokens'
    let auth = bearer(&valid);
    assert_eq!(gw.get("/x", &[("authorization", &auth)]).status, 200);
    let log = gw.log();
    assert!(log.contains("401: a bearer token was refused: "), "{log}");
    for (_, _, t) in tokens.iter().filter(|(_, _, t)| t.len() > 20) {
        assert!(!log.contains(&t[t.len() - 20..]), "a token is in the log");
    }
}

/// A token larger than a request's header may be (`max_request_header_bytes`, 64 KiB) is 431
/// before any source is asked; one of 1 MiB, 400 from Pingora.
#[test]
fn a_token_larger_than_the_header_limit_is_431() {
    let keys = Keys::new();
    let up = Upstream::start("u");
    let gw = gateway(&up, &keys);
    let auth = bearer(&"A".repeat(100 * 1024));
    let r = gw.get("/x", &[("authorization", &auth)]);
    assert_eq!(r.status, 431, "{:?} {}", r.headers, r.body);
    assert_eq!(r.json()["status"], 431);
    // 1 MiB and more: Pingora's HTTP/1.1 reader refuses the header itself (400, no body)
    let auth = bearer(&"A".repeat(1 << 20));
    let r = gw.get("/x", &[("authorization", &auth)]);
    assert_eq!(r.status, 400, "{:?} {}", r.headers, r.body);
    assert_eq!(up.hits(), 0);
}

/// `-t` says what the source is and refuses what would let a token through unchecked.
#[test]
fn the_config_check_refuses_unsafe_jwt_settings() {
    let keys = Keys::new();
    let dir = TempDir::new();
    dir.write("jwks.json", &keys.jwks("jwks.json"));
    dir.write("secret", "short");
    let base = "server: { listen: [\"127.0.0.1:1\"] }\nupstreams: { app: { servers: [\"127.0.0.1:2\"] } }\nroutes: [{ id: all, path: /**, upstream: app }]\ntenant:\n  from:\n    - jwt:\n        issuers:\n          - issuer: https://idp.test/\n            audiences: [api.test]\n            jwks_file: jwks.json\n        tenant_claim: org_id\n";
    let check = |text: &str| {
        let conf = dir.write("gateway.yaml", text);
        common::run_tollgate(&["-t", "--offline", "-c", conf.to_str().unwrap()])
    };
    let (code, out, err) = check(base);
    assert_eq!(code, 0, "{err}");
    // without audiences, `aud` is not checked: -t warns
    let (code, _, err) = check(&base.edit("            audiences: [api.test]\n", ""));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains(
            "warning: tenant.from[0].jwt.issuers[0].issuer: no audiences: `aud` is not checked"
        ),
        "{err}"
    );
    // a symmetric key in a JWKS is never used: -t says it is left out
    let mut with_oct: Value = serde_json::from_str(&keys.jwks("jwks.json")).unwrap();
    with_oct["keys"]
        .as_array_mut()
        .unwrap()
        .push(json!({"kty": "oct", "kid": "s", "k": "c2VjcmV0"}));
    dir.write("oct.json", &with_oct.to_string());
    let (code, _, err) = check(&base.edit("jwks_file: jwks.json", "jwks_file: oct.json"));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("key 5: a symmetric (\"oct\") key: never used to verify: left out"),
        "{err}"
    );
    assert!(
        out.contains(
            "jwt(authorization, tenant from claim org_id, issuers https://idp.test/, hidden)"
        ),
        "{out}"
    );
    let file = dir.0.join("gateway.yaml").display().to_string();
    for (edit, want) in [
        (
            base.edit(
                "tenant_claim: org_id\n",
                "tenant_claim: org_id\n        algorithms: [RS256, none]\n",
            ),
            format!("{file}:12:29: tenant.from[0].jwt.algorithms[1]: `none` is never accepted"),
        ),
        (
            base.edit(
                "tenant_claim: org_id\n",
                "tenant_claim: org_id\n        algorithms: [HS256]\n",
            ),
            "HS256/HS384/HS512 need an issuer with a secret_file".to_string(),
        ),
        (
            base.edit("audiences: [api.test]", "audiences: [\"\"]"),
            "tenant.from[0].jwt.issuers[0].audiences: an audience must not be empty".to_string(),
        ),
        (
            base.edit("jwks_file: jwks.json", "jwks_file: missing.json"),
            "tenant.from[0].jwt.issuers[0].jwks_file: cannot read".to_string(),
        ),
        (
            base.edit("jwks_file: jwks.json", "jwks_uri: http://idp.test/jwks.json"),
            "tenant.from[0].jwt.issuers[0].jwks_uri: \"http://idp.test/jwks.json\" is not an https:// URL".to_string(),
        ),
        (
            base.edit(
                "jwks_file: jwks.json",
                "jwks_file: jwks.json\n            secret_file: secret",
            )
            .edit(
                "tenant_claim: org_id\n",
                "tenant_claim: org_id\n        algorithms: [HS256]\n",
            ),
            "an HMAC secret of at least 32 bytes".to_string(),
        ),
    ] {
        let (code, _, err) = check(&edit);
        assert_eq!(code, 1, "{want}: {err}");
        assert!(err.contains(&want), "{want:?} not in\n{err}");
    }
}

/// A JWKS served over HTTPS (tests/jwt/jwks_server.py, its certificate from a CA of the
/// test's), killed on drop.
struct Provider {
    child: std::process::Child,
    addr: std::net::SocketAddr,
}

impl Provider {
    fn start(dir: &std::path::Path, cache: &str) -> Provider {
        Provider::start_on(dir, cache, 0)
    }

    fn start_on(dir: &std::path::Path, cache: &str, port: u16) -> Provider {
        let mut cmd = Command::new(test_python());
        cmd.arg(repo().join("tests/jwt/jwks_server.py"))
            .arg(dir)
            .arg(cache)
            .arg(port.to_string());
        let (child, addr) = common::spawn_listening(cmd);
        Provider { child, addr }
    }

    /// The requests it answered.
    fn requests(dir: &std::path::Path) -> usize {
        std::fs::read_to_string(dir.join("requests.log")).map_or(0, |t| t.lines().count())
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Keys fetched from the issuer's JWKS over HTTPS (verified against the `ca` given): a key
/// the issuer adds is taken without a reload, at once for the first token that names it; a
/// flood of unknown key ids costs the provider at most one fetch per 5 s; when the provider
/// goes down, the keys held keep working, the failure is counted, logged once and shown.
#[test]
fn jwks_over_https_rotates_and_outlives_its_provider() {
    let keys = Keys::new();
    let idp = TempDir::new();
    common::make_cert(&idp.0, "ca", "localhost");
    common::make_signed_cert(&idp.0, "ca", "idp", "localhost");
    // with a symmetric key, which is never used and said so in the log
    let mut served: Value = serde_json::from_str(&keys.jwks("jwks.json")).unwrap();
    served["keys"]
        .as_array_mut()
        .unwrap()
        .push(json!({"kty": "oct", "kid": "s", "k": "c2VjcmV0"}));
    idp.write("jwks.json", &served.to_string());
    let provider = Provider::start(&idp.0, "public, max-age=3600");
    let up = Upstream::start("u");
    let ca = idp.0.join("ca.pem");
    let cfg = format!(
        "{}tenant:\n  from:\n    - jwt:\n        issuers:\n          - issuer: {ISS}\n            audiences: [{AUD}]\n            jwks_uri: https://localhost:{}/.well-known/jwks.json\n            ca: {}\n        tenant_claim: org_id\n  required: true\n",
        one_route_config(up.addr, 1, ""),
        provider.addr.port(),
        ca.display()
    );
    // ready once the keys are fetched (or after 5 s: on a slow machine the count may lag)
    let gw = Gateway::start(&cfg);
    assert!(
        common::eventually(Duration::from_secs(5), || Provider::requests(&idp.0) == 1),
        "{}",
        gw.log()
    );
    let tokens = keys.tokens(&json!([
        {"key": "rsa", "claims": claims("acme")},
        {"key": "rsa2", "claims": claims("globex")},
        {"key": "rsa", "headers": {"kid": "nobody"}, "claims": claims("acme")},
    ]));
    let get = |t: &str| gw.get("/x", &[("authorization", &bearer(t))]).status;
    assert_eq!(get(&tokens[0]), 200, "{}", gw.log());
    assert!(
        gw.log()
            .contains("left out: key 5: a symmetric (\"oct\") key: never used to verify"),
        "{}",
        gw.log()
    );
    // the issuer adds rsa-2; the first token that names it waits for the fetch (once the
    // last fetch is 5 s old) and passes
    idp.write("jwks.json", &keys.jwks("jwks-rotated.json"));
    assert!(
        common::eventually(Duration::from_secs(15), || get(&tokens[1]) == 200),
        "{}",
        gw.log()
    );
    let fetched = Provider::requests(&idp.0);
    assert_eq!(fetched, 2);
    // a flood of unknown key ids: at most one fetch more (they come within 5 s)
    for _ in 0..30 {
        assert_eq!(get(&tokens[2]), 401);
    }
    assert!(Provider::requests(&idp.0) <= fetched + 1);
    // the provider goes down: the keys held keep working
    let port = provider.addr.port();
    drop(provider);
    let errors = || {
        common::metric_sum(
            &gw.metrics(),
            &format!("tollgate_jwks_fetches_total{{issuer=\"{ISS}\",result=\"error\"}}"),
        )
    };
    // a failed fetch (asked for by an unknown key id, once the last is 5 s old), then a
    // second one 10 s later without any asking
    assert!(
        common::eventually(Duration::from_secs(10), || get(&tokens[2]) == 401
            && errors() >= 1.0),
        "{}",
        gw.log()
    );
    assert!(
        common::eventually(Duration::from_secs(15), || errors() >= 2.0),
        "{}",
        gw.log()
    );
    assert_eq!(get(&tokens[0]), 200);
    assert_eq!(get(&tokens[1]), 200);
    // a reload keeps the keys fetched (rsa-2 is in no file)
    assert!(gw.reload(&cfg), "{}", gw.log());
    assert_eq!(get(&tokens[1]), 200);
    // logged once, not once per failure
    let log = gw.log();
    assert_eq!(log.matches("cannot fetch the keys").count(), 1, "{log}");
    // the status page says so
    let status = common::request(gw.admin, "GET", "/api/status", &[])
        .unwrap()
        .json();
    let jwks = &status["jwks"][0];
    assert_eq!(jwks["keys"], 2, "{status}");
    assert!(
        jwks["error"]
            .as_str()
            .unwrap_or("")
            .contains("cannot connect"),
        "{status}"
    );
    // it comes back: the next try (10 s after the last) fetches, and the log says so once
    let _provider = Provider::start_on(&idp.0, "public, max-age=3600", port);
    assert!(
        common::eventually(Duration::from_secs(15), || gw
            .log()
            .contains("fetched again: 2 keys")),
        "{}",
        gw.log()
    );
    let status = common::request(gw.admin, "GET", "/api/status", &[])
        .unwrap()
        .json();
    assert_eq!(status["jwks"][0]["error"], Value::Null, "{status}");
}

/// HS256 with the issuer's own secret_file; a token in a header of its own (no `Bearer`),
/// forwarded to the upstream with `hide: false`; claims of every JSON kind as headers.
#[test]
fn an_hmac_issuer_a_header_of_its_own_and_forwarded_claims() {
    let keys = Keys::new();
    let up = Upstream::start("u");
    let secret = "0123456789abcdef0123456789abcdef-hmac";
    let cfg = format!(
        "{}tenant:\n  from:\n    - jwt:\n        issuers:\n          - issuer: {ISS}\n            audiences: [{AUD}]\n            secret_file: secret.txt\n        algorithms: [HS256]\n        tenant_claim: org.id\n        header: x-token\n        hide: false\n        forward_claims: {{ sub: x-user-id, org.seats: x-seats, admin: x-admin, roles: x-roles }}\n  required: true\n",
        one_route_config(up.addr, 1, "")
    );
    let gw = Gateway::start_with_files(&cfg, &[("secret.txt", &format!("{secret}\n"))]);
    let mut c = claims("unused");
    c["org"] = json!({"id": "acme", "seats": 12});
    c["admin"] = json!(true);
    c["roles"] = json!(["a", "b"]);
    let tokens = keys.tokens(&json!([
        {"key": format!("hmac:{secret}"), "claims": c},
        {"key": "hmac:another-secret-of-32-bytes-or-more!!", "claims": c},
        {"key": "rsa", "claims": c},
    ]));
    let r = gw.get("/x", &[("x-token", &tokens[0])]);
    assert_eq!(r.status, 200, "{}\n{}", r.body, gw.log());
    assert_eq!(r.upstream_headers("x-tenant-id"), vec!["acme"]);
    assert_eq!(r.upstream_headers("x-seats"), vec!["12"]);
    assert_eq!(r.upstream_headers("x-admin"), vec!["true"]);
    assert_eq!(r.upstream_headers("x-roles"), vec![r#"["a","b"]"#]);
    assert_eq!(r.upstream_headers("x-token"), vec![tokens[0].clone()]);
    // another secret, and an RSA token where only HS256 is allowed
    for t in &tokens[1..] {
        let r = gw.get("/x", &[("x-token", t)]);
        assert_eq!(r.status, 401, "{}", r.body);
    }
    // in the Authorization header, it is not this source's: no tenant
    let auth = bearer(&tokens[0]);
    assert_eq!(gw.get("/x", &[("authorization", &auth)]).status, 401);
}

/// `jwks_uri` with `jwks_file`: when the provider does not answer, the gateway is ready within
/// 5 s anyway, with the file's keys.
#[test]
fn a_jwks_file_is_the_copy_until_the_provider_answers() {
    let keys = Keys::new();
    let up = Upstream::start("u");
    let nobody = common::free_port();
    let cfg = format!(
        "{}tenant:\n  from:\n    - jwt:\n        issuers:\n          - issuer: {ISS}\n            audiences: [{AUD}]\n            jwks_uri: https://127.0.0.1:{nobody}/jwks.json\n            jwks_file: jwks.json\n        tenant_claim: org_id\n  required: true\n",
        one_route_config(up.addr, 1, "")
    );
    let gw = Gateway::start_with_files(&cfg, &[("jwks.json", &keys.jwks("jwks.json"))]);
    let auth = bearer(&keys.token(json!({"key": "ec", "claims": claims("acme")})));
    let r = gw.get("/x", &[("authorization", &auth)]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(gw.log().contains("cannot fetch the keys"), "{}", gw.log());
}

/// README "A curl session through the demo": the token requests, their tokens minted by
/// `scripts/demo-token` as written, against the demo config: the first is initech's (its
/// subject told to the upstream, the token kept), the second (a byte more) is refused.
#[test]
fn the_readmes_token_requests_hold() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines: Vec<&str> = readme
        .lines()
        .filter(|l| l.starts_with("$ curl -i -H \"authorization: Bearer $(scripts/demo-token "))
        .collect();
    assert_eq!(lines.len(), 2, "the README's token requests");
    let (up, up2) = (Upstream::start("demo-9001"), Upstream::start("demo-9002"));
    let gw = common::DemoGateway::start(&[
        ("127.0.0.1:9001", up.addr),
        ("127.0.0.1:9002", up2.addr),
        ("127.0.0.1:9003", up.addr),
    ]);
    assert!(gw.ready, "the demo gateway did not start");
    let mut answers = Vec::new();
    for line in lines {
        // $(scripts/demo-token TENANT)SUFFIX, then the URL's path
        let inner = line.split("$(").nth(1).unwrap();
        let (cmd, rest) = inner.split_once(')').unwrap();
        let suffix = rest.split('"').next().unwrap();
        let args: Vec<&str> = cmd.split_whitespace().collect();
        let out = Command::new(repo().join(args[0]))
            .args(&args[1..])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let token = format!("{}{suffix}", String::from_utf8(out.stdout).unwrap().trim());
        let path = line.rsplit("127.0.0.1:8080").next().unwrap();
        let auth = bearer(&token);
        answers.push(common::request(gw.listen, "GET", path, &[("authorization", &auth)]).unwrap());
    }
    assert_eq!(answers[0].status, 200, "{}", answers[0].body);
    assert_eq!(answers[0].upstream_headers("x-tenant-id"), vec!["initech"]);
    assert_eq!(answers[0].upstream_headers("x-user-id"), vec!["demo-user"]);
    assert!(answers[0].upstream_headers("authorization").is_empty());
    assert_eq!(answers[0].header("x-ratelimit-limit"), Some("1000"));
    assert_eq!(answers[1].status, 401, "{}", answers[1].body);
    assert_eq!(
        answers[1].header("www-authenticate"),
        Some("Bearer error=\"invalid_token\"")
    );
}

/// An issuer without `audiences`: `aud` is not checked (-t warns), whatever it says or if it
/// is missing.
#[test]
fn without_audiences_aud_is_not_checked() {
    let keys = Keys::new();
    let up = Upstream::start("u");
    let cfg = format!(
        "{}tenant:\n  from:\n    - jwt:\n        issuers:\n          - issuer: {ISS}\n            jwks_file: jwks.json\n        tenant_claim: org_id\n  required: true\n",
        one_route_config(up.addr, 1, "")
    );
    let gw = Gateway::start_with_files(&cfg, &[("jwks.json", &keys.jwks("jwks.json"))]);
    let mut other = claims("acme");
    other["aud"] = json!("another-api");
    let mut none = claims("globex");
    none.as_object_mut().unwrap().remove("aud");
    let tokens =
        keys.tokens(&json!([{"key": "rsa", "claims": other}, {"key": "ec", "claims": none}]));
    for t in &tokens {
        let r = gw.get("/x", &[("authorization", &bearer(t))]);
        assert_eq!(r.status, 200, "{}", r.body);
    }
}
