//! Tenancy an operator can trust (docs/configuration.md#who-is-the-tenant): which sources may claim a
//! tenant, per-route tenant modes, API keys kept from upstreams, plans and keys as files
//! (reloaded on SIGHUP), and the warnings of `-t`.

mod common;
use common::{
    one_route_config, period_with_room, request, run_tollgate, Edit, Gateway, TempDir, Upstream,
};

/// One upstream, four routes: `/v1/**` requires a tenant, `/public/**` takes `anonymous`,
/// `/login` looks for none, the rest follow `tenant.required`.
fn routes(up: &Upstream, server_extra: &str) -> String {
    one_route_config(up.addr, 1, server_extra).edit(
        "routes:\n",
        "routes:\n  - id: v1\n    path: /v1/**\n    upstream: app\n    tenant: required\n  - id: public\n    path: /public/**\n    upstream: app\n    tenant: optional\n  - id: login\n    path: /login\n    upstream: app\n    tenant: none\n",
    )
}

const KEYS: &str = "    - api_key: { header: x-api-key, keys: { \"k-acme\": acme } }\n";

/// Per tenant 2 an hour on everything; per address 3 an hour on /login.
const LIMITS: &str = "limits:\n  - id: per-tenant\n    pathPattern: /**\n    tiers: [{ period: 1h, threshold: 2 }]\n  - id: login\n    pathPattern: /login\n    per: ip\n    tiers: [{ period: 1h, threshold: 3 }]\n";

/// `LIMITS` with a period of about an hour whose window has room for a test's requests (and
/// the gateway's start-up): they all fall in one window.
fn limits_in_one_window() -> String {
    let p = period_with_room(3600, 20);
    LIMITS.edit("period: 1h", &format!("period: {p}"))
}

#[test]
fn a_claimed_header_cannot_spend_a_key_holders_quota() {
    let up = Upstream::start("u");
    let tenant = format!("tenant:\n  from:\n{KEYS}    - header: x-org-id\n  required: false\n");
    let limits = limits_in_one_window();
    let gw = Gateway::start(&format!("{}{tenant}{limits}", routes(&up, "")));
    // the header is a claim, and nobody is a trusted proxy: it names no tenant
    for _ in 0..5 {
        let r = gw.get("/v1/orders", &[("x-org-id", "acme")]);
        assert_eq!(r.status, 401, "{}", r.body);
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
    }
    // the key holder's quota is whole
    let key = [("x-api-key", "k-acme")];
    for remaining in ["1", "0"] {
        let r = gw.get("/v1/orders", &key);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-ratelimit-remaining"), Some(remaining));
        assert_eq!(r.upstream_headers("x-tenant-id"), vec!["acme".to_string()]);
    }
    assert_eq!(gw.get("/v1/orders", &key).status, 429);
    // a wrong key is refused, even where a tenant is optional: it never becomes `anonymous`
    let r = gw.get("/public/x", &[("x-api-key", "k-guess")]);
    assert_eq!(r.status, 401);
    assert!(r.body.contains("the API key is not valid"), "{}", r.body);
}

#[test]
fn a_trusted_proxy_or_trusted_true_makes_the_claim_count() {
    let up = Upstream::start("u");
    // the request comes from 127.0.0.1: a trusted proxy here
    let tenant = format!("tenant:\n  from:\n{KEYS}    - header: x-org-id\n  required: true\n");
    let cfg = format!(
        "{}{tenant}{LIMITS}",
        routes(&up, "  trusted_proxies: [\"127.0.0.1/32\"]")
    );
    let gw = Gateway::start(&cfg);
    let r = gw.get("/v1/orders", &[("x-org-id", "globex")]);
    assert_eq!(r.status, 200);
    assert_eq!(
        r.upstream_headers("x-tenant-id"),
        vec!["globex".to_string()]
    );
    drop(gw);
    // no trusted proxy, but the operator says the header is set by something it trusts
    let trusted = tenant.edit(
        "    - header: x-org-id\n",
        "    - header: x-org-id\n      trusted: true\n",
    );
    let gw = Gateway::start(&format!("{}{trusted}{LIMITS}", routes(&up, "")));
    let r = gw.get("/v1/orders", &[("x-org-id", "globex")]);
    assert_eq!(r.status, 200);
    assert_eq!(
        r.upstream_headers("x-tenant-id"),
        vec!["globex".to_string()]
    );
}

#[test]
fn each_route_requires_takes_anonymous_or_skips_the_tenant() {
    let up = Upstream::start("u");
    let tenant = format!("tenant:\n  from:\n{KEYS}  required: true\n");
    let limits = limits_in_one_window();
    let gw = Gateway::start(&format!("{}{tenant}{limits}", routes(&up, "")));
    // `required` (here also the global setting): 401 without a key
    assert_eq!(gw.get("/v1/x", &[]).status, 401);
    assert_eq!(gw.get("/other", &[]).status, 401);
    // `optional`: the shared tenant `anonymous`
    let r = gw.get("/public/x", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(
        r.upstream_headers("x-tenant-id"),
        vec!["anonymous".to_string()]
    );
    // `none`: open, counted by the per-address rule only; a client's x-tenant-id is removed;
    // no key is looked at (a wrong one is no 401 here), and a key still stays at the gateway
    for i in 0..3 {
        let wrong_key = [("x-tenant-id", "acme"), ("x-api-key", "k-guess")];
        let r = request_post(&gw, "/login", &wrong_key[..if i == 2 { 2 } else { 1 }]);
        assert_eq!(r.status, 200, "login {i}");
        assert!(r.upstream_headers("x-tenant-id").is_empty(), "{}", r.body);
        assert!(r.upstream_headers("x-api-key").is_empty(), "{}", r.body);
        // the per-tenant rule (2 an hour) does not see it: only the address rule's quota shows
        assert_eq!(r.header("x-ratelimit-limit"), Some("3"));
    }
    assert_eq!(request_post(&gw, "/login", &[]).status, 429);
    // and the key holder's quota was not touched by any of it
    let r = gw.get("/v1/x", &[("x-api-key", "k-acme")]);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("1"));
}

fn request_post(gw: &Gateway, path: &str, headers: &[(&str, &str)]) -> common::Response {
    common::request(gw.addr, "POST", path, headers).expect("request")
}

#[test]
fn api_keys_stay_at_the_gateway_unless_hide_is_false() {
    let up = Upstream::start("u");
    let tenant = format!("tenant:\n  from:\n{KEYS}  required: true\n");
    let gw = Gateway::start(&format!("{}{tenant}", routes(&up, "")));
    let r = gw.get("/v1/x", &[("x-api-key", "k-acme")]);
    assert_eq!(r.status, 200);
    assert!(r.upstream_headers("x-api-key").is_empty(), "{}", r.body);
    drop(gw);
    let shown = tenant.edit("\"k-acme\": acme }", "\"k-acme\": acme }, hide: false");
    let gw = Gateway::start(&format!("{}{shown}", routes(&up, "")));
    let r = gw.get("/v1/x", &[("x-api-key", "k-acme")]);
    assert_eq!(r.upstream_headers("x-api-key"), vec!["k-acme".to_string()]);
}

/// A gateway whose plans and keys are files next to its config.
fn with_files(up: &Upstream, plans: &str, keys: &str) -> Gateway {
    let cfg = format!(
        "{}tenant:\n  from:\n    - api_key: {{ header: x-api-key, keys_file: keys.yaml }}\n  required: true\nplans: plans.yaml\nlimits:\n  - id: api\n    pathPattern: /**\n    tiers: [{{ period: 1h, threshold: 5 }}]\n    plans:\n      premium: [{{ period: 1h, threshold: 50 }}]\n",
        routes(up, "")
    );
    Gateway::start_with_files(&cfg, &[("plans.yaml", plans), ("keys.yaml", keys)])
}

#[test]
fn plans_and_keys_are_files_that_reload_with_the_config() {
    let up = Upstream::start("u");
    let gw = with_files(
        &up,
        "premium: [acme]\n",
        "\"k-acme\": acme\n\"k-globex\": { tenant: globex, plan: premium }\n\"k-initech\": initech\n",
    );
    let limit = |key: &str| {
        gw.get("/v1/x", &[("x-api-key", key)])
            .header("x-ratelimit-limit")
            .map(str::to_string)
    };
    // from plans.yaml, from the key's own plan, and in no plan: the rule's `tiers`
    assert_eq!(limit("k-acme").as_deref(), Some("50"));
    assert_eq!(limit("k-globex").as_deref(), Some("50"));
    assert_eq!(limit("k-initech").as_deref(), Some("5"));
    // edit both files; SIGHUP reads them again
    std::fs::write(gw.dir.0.join("plans.yaml"), "premium: [initech]\n").unwrap();
    std::fs::write(
        gw.dir.0.join("keys.yaml"),
        "\"k-acme\": acme\n\"k-globex\": globex\n\"k-initech\": initech\n\"k-new\": { tenant: hooli, plan: premium }\n",
    )
    .unwrap();
    let cfg = std::fs::read_to_string(&gw.config).unwrap();
    assert!(gw.reload(&cfg), "{}", gw.log());
    assert_eq!(limit("k-acme").as_deref(), Some("5"));
    assert_eq!(limit("k-globex").as_deref(), Some("5"));
    assert_eq!(limit("k-initech").as_deref(), Some("50"));
    assert_eq!(limit("k-new").as_deref(), Some("50"));
    // a broken keys file is a reload error naming that file, line and column; the running
    // config stays
    std::fs::write(
        gw.dir.0.join("keys.yaml"),
        "\"k-acme\": acme\n\"k-new\": { tenant: hooli, plan: premuim }\n",
    )
    .unwrap();
    assert!(!gw.reload(&cfg));
    let want = format!(
        "{}:2:33: keys_file.k-new.plan: unknown plan \"premuim\"",
        gw.dir.0.join("keys.yaml").display()
    );
    assert!(gw.log().contains(&want), "{want} not in\n{}", gw.log());
    assert_eq!(limit("k-new").as_deref(), Some("50"));
}

#[test]
fn check_warns_of_claimable_sources_and_plan_members_no_key_maps_to() {
    let up = Upstream::start("u");
    let dir = TempDir::new();
    let base = format!(
        "{}tenant:\n  from:\n{KEYS}    - header: x-org-id\n    - path: /t/{{tenant}}/**\n      trusted: true\n  required: true\nplans:\n  premium: [acme, globexx]\n",
        routes(&up, "")
    );
    let conf = dir.write(
        "gateway.yaml",
        &base
            .replace("{LISTEN}", "127.0.0.1:1")
            .replace("{ADMIN}", "127.0.0.1:2"),
    );
    let (code, out, err) = run_tollgate(&["-t", "-c", conf.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let all = format!("{out}{err}");
    let file = conf.display().to_string();
    for want in [
        format!("{file}:27:15: warning: tenant.from[1].header: header x-org-id is not trusted and server.trusted_proxies is empty: no request will use it"),
        format!("{file}:28:13: warning: tenant.from[2].path: path /t/{{tenant}}/** is trusted: any client can claim any tenant with it"),
        format!("{file}:32:19: warning: plans.premium[1]: tenant \"globexx\" is not the tenant of any API key (a typo?)"),
    ] {
        assert!(all.contains(&want), "{want:?} not in\n{all}");
    }
    assert!(!all.contains("\"acme\" is not the tenant"), "{all}");
    // strict: the typo is an error
    let strict = base.edit("  required: true\n", "  required: true\n  strict: true\n");
    let conf = dir.write(
        "strict.yaml",
        &strict
            .replace("{LISTEN}", "127.0.0.1:1")
            .replace("{ADMIN}", "127.0.0.1:2"),
    );
    let (code, _, err) = run_tollgate(&["-t", "-c", conf.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        err.contains("plans.premium[1]: tenant \"globexx\" is not the tenant of any API key"),
        "{err}"
    );
}

/// `/api/tenants/<id>` knows a tenant that an API key or a plan names before it sends
/// anything, and answers 404 for an id nothing names or has counted.
#[test]
fn the_tenant_lookup_knows_tenants_by_key_and_plan_before_any_request() {
    let up = Upstream::start("u");
    let gw = with_files(&up, "premium: [planned]\n", "\"k-keyed\": keyed\n");
    let status = |id: &str| {
        request(gw.admin, "GET", &format!("/api/tenants/{id}"), &[])
            .expect("admin answers")
            .status
    };
    assert_eq!(status("keyed"), 200, "an API key names it");
    assert_eq!(status("planned"), 200, "a plan names it");
    assert_eq!(status("nobody"), 404);
}

/// Keys stored as digests (`tollgate hash-key`): the gateway knows a key by its SHA-256, the
/// digest itself is no key, `-t` warns of keys stored as they are, and a malformed digest is
/// an error at its line.
#[test]
fn api_keys_may_be_stored_as_their_digests() {
    let up = Upstream::start("u");
    // the digest as the subcommand prints it, from standard input and from the argument
    let mut child = std::process::Command::new(common::tollgate_bin())
        .arg("hash-key")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"k-globex-secret\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let digest = String::from_utf8(out.stdout).unwrap().trim().to_string();
    // sha256("k-globex-secret"), as any SHA-256 tool gives it
    assert_eq!(
        digest,
        "sha256:5aa52e5c7b17590cc1471ba62e9b4b5734932481d8f63ac8205fca502487657d"
    );
    let (code, by_arg, _) = run_tollgate(&["hash-key", "k-globex-secret"]);
    assert_eq!((code, by_arg.trim()), (0, digest.as_str()));
    let (code, _, err) = run_tollgate(&["hash-key", " "]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("the key is empty"), "{err}");
    let gw = with_files(
        &up,
        "premium: [globex]\n",
        &format!("\"k-acme\": acme\n\"{digest}\": globex\n"),
    );
    let get = |key: &str| gw.get("/v1/x", &[("x-api-key", key)]);
    let r = get("k-globex-secret");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.upstream_headers("x-tenant-id"),
        vec!["globex".to_string()]
    );
    assert_eq!(r.header("x-ratelimit-limit"), Some("50"));
    assert_eq!(
        get("k-acme").upstream_headers("x-tenant-id"),
        vec!["acme".to_string()]
    );
    // whoever reads the file holds the digest, not the key
    assert_eq!(get(&digest).status, 401);
    // -t: the plain key is a warning, the summary says how the keys are stored
    let conf = gw.config.to_str().unwrap();
    let (code, out, err) = run_tollgate(&["-t", "--offline", "-c", conf]);
    assert_eq!(code, 0, "{err}");
    let keys = gw.dir.0.join("keys.yaml").display().to_string();
    assert!(
        err.contains(&format!(
            "{keys}:1:11: warning: keys_file.k-acme: this API key is stored as it is"
        )),
        "{err}"
    );
    assert!(out.contains("2 keys, 1 as digests"), "{out}");
    // a digest of the wrong length, at its line and column
    std::fs::write(
        gw.dir.0.join("keys.yaml"),
        "\"k-acme\": acme\n\"sha256:abc\": globex\n",
    )
    .unwrap();
    let (code, _, err) = run_tollgate(&["-t", "--offline", "-c", conf]);
    assert_eq!(code, 1);
    assert!(
        err.contains(&format!(
            "{keys}:2:1: keys_file.sha256:abc: sha256: must be followed by the 64 hex digits"
        )),
        "{err}"
    );
}
