//! The command line (contract section 1) and every config file shipped in `conf/`.

mod common;
use common::{free_port, request, run_tollgate, Edit, TempDir, Upstream};
use std::path::Path;
use std::time::Duration;

#[test]
fn version_and_help() {
    let (code, out, _) = run_tollgate(&["--version"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("tollgate "), "{out}");
    let (code, out, _) = run_tollgate(&["--help"]);
    assert_eq!(code, 0);
    for flag in ["-c", "-t", "-d", "-u", "SIGHUP", "SIGUSR2"] {
        assert!(out.contains(flag), "{flag} missing in help: {out}");
    }
}

/// Every shipped config passes `tollgate -t`. Files included by another config (a limits
/// file) are checked through the config that includes them.
#[test]
fn every_config_in_conf_is_valid() {
    demo_cert();
    let conf = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf");
    let mut checked = Vec::new();
    let mut included = Vec::new();
    let mut candidates: Vec<_> = std::fs::read_dir(&conf)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    candidates.sort();
    for p in &candidates {
        let text = std::fs::read_to_string(p).unwrap();
        if text.contains("\nserver:") || text.starts_with("server:") {
            let (code, out, err) = run_tollgate(&["-t", "-c", &p.display().to_string()]);
            assert_eq!(code, 0, "{}: {err}", p.display());
            assert!(out.contains("is valid"));
            for line in out
                .lines()
                .filter_map(|l| l.trim().strip_prefix("includes "))
            {
                included.push(std::fs::canonicalize(line).unwrap());
            }
            checked.push(p.clone());
        }
    }
    assert!(!checked.is_empty(), "no gateway config found in conf/");
    for p in &candidates {
        let canon = std::fs::canonicalize(p).unwrap();
        assert!(
            checked.contains(p) || included.contains(&canon),
            "{} is neither a gateway config nor included by one",
            p.display()
        );
    }
}

/// The demo config's certificate (made by `make run` and `make test`; here too, so that a bare
/// `cargo test` checks the shipped config as well).
fn demo_cert() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/demo-cert");
    let ok = std::process::Command::new(script)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "scripts/demo-cert failed");
}

#[test]
fn summary_lists_listeners_upstreams_routes_rules_and_redis_mode() {
    demo_cert();
    let conf = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/gateway.yaml");
    let (code, out, _) = run_tollgate(&["-t", "-c", &conf.display().to_string()]);
    assert_eq!(code, 0);
    for want in [
        "listeners: 127.0.0.1:8080 (h2c), 127.0.0.1:8443 (tls, h2)",
        "greeter          round_robin h2c [127.0.0.1:9004]",
        "products",
        "round_robin",
        "get-product",
        "1000/10s",
        "put-product",
        "100/10s",
        "redis: none",
    ] {
        assert!(out.contains(want), "{want:?} missing in summary:\n{out}");
    }
    assert!(out.lines().count() < 40, "fits on one screen");
}

/// `-t` tells each rule whole (issue 45): its cost, unit and what answers it counts, beside
/// its tiers (a calendar window in words, with its zone), algorithm, action with what it does
/// (the status it answers, how long it delays) and exemptions.
#[test]
fn summary_tells_a_rules_cost_unit_and_counted_answers() {
    let dir = TempDir::new();
    let config = "server:\n  listen: [\"127.0.0.1:8080\"]\nupstreams:\n  u:\n    servers: [\"127.0.0.1:9001\"]\nroutes:\n  - id: all\n    path: /**\n    upstream: u\nlimits:\n  - id: tokens\n    pathPattern: /v1/**\n    tiers: [{ period: 1m, threshold: 1000 }]\n    unit: tokens\n    cost: { response_header: x-usage-tokens, max: 500, default: 10 }\n  - id: failures\n    pathPattern: /**\n    tiers: [{ period: 1d, threshold: 5 }]\n    count_when: { status: [401, 403, 5xx] }\n    status: 503\n  - id: uploads\n    pathPattern: /upload/**\n    tiers: [{ period: 1h, threshold: 100 }]\n    cost: 5\n    action: delay\n    max_delay: 300ms\n  - id: trial\n    pathPattern: /trial/**\n    calendar: { tz: America/New_York }\n    tiers: [{ period: 1mo, threshold: 7 }]\n    action: shadow\n";
    let p = dir.write("gateway.yaml", config);
    let (code, out, err) = run_tollgate(&["-t", "-c", &p.display().to_string()]);
    assert_eq!(code, 0, "{err}");
    for want in [
        "fixed_window reject with 429 tiers 1000/1m cost from response header x-usage-tokens (max 500, default 10) unit tokens",
        "reject with 503 tiers 5/1 day in UTC counting answers 401, 403, 5xx",
        "delay up to 300ms, then reject with 429 tiers 100/1h cost 5",
        "shadow (counts and reports, refuses nothing) tiers 7/1 month in America/New_York",
    ] {
        assert!(out.contains(want), "{want:?} missing in summary:\n{out}");
    }
}

#[test]
fn daemon_mode_detaches_and_serves() {
    let up = Upstream::start("u1");
    let dir = TempDir::new();
    let port = free_port();
    let pid_file = dir.0.join("tollgate.pid");
    let config = format!(
        "server:\n  listen: [\"127.0.0.1:{port}\"]\n  threads: 1\n  pid_file: {}\n  upgrade_sock: {}\nupstreams:\n  u:\n    servers: [\"{}\"]\nroutes:\n  - id: all\n    path: /**\n    upstream: u\n",
        pid_file.display(),
        dir.0.join("upgrade.sock").display(),
        up.addr
    );
    let config = config.edit(
        "  threads: 1\n",
        &format!(
            "  threads: 1\n  error_log: {}\n",
            dir.0.join("error.log").display()
        ),
    );
    let p = dir.write("gateway.yaml", &config);
    // as an init system would: stdio not piped to us, so the daemon holds nothing of ours
    let status = std::process::Command::new(common::tollgate_bin())
        .args(["-d", "-c", &p.display().to_string()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(
        status.success(),
        "the foreground parent exits 0 after forking"
    );
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let ok = common::eventually(Duration::from_secs(10), || {
        request(addr, "GET", "/x", &[]).is_ok_and(|r| r.status == 200)
    });
    let pid = std::fs::read_to_string(&pid_file).unwrap_or_default();
    if let Ok(pid) = pid.trim().parse::<i32>() {
        let _ = std::process::Command::new("kill")
            .args(["-INT", &pid.to_string()])
            .status();
    }
    assert!(ok, "daemon did not serve");
    assert!(!pid.trim().is_empty(), "no pid file");
}

/// docs/configuration.md's two error examples, made as the page says from the demo config:
/// each printed line is the one the page quotes.
#[test]
fn the_configuration_pages_error_examples_hold() {
    demo_cert();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join("docs/configuration.md")).expect("page");
    let quoted = |cmd: &str| -> String {
        let mut lines = page.lines().skip_while(|l| *l != cmd);
        lines.next().expect("the command is quoted");
        lines.next().expect("and what it prints").to_string()
    };
    let dir = TempDir::new();
    for f in ["gateway.yaml", "keys.yaml", "plans.yaml", "limits.yaml"] {
        let text = std::fs::read_to_string(root.join("conf").join(f)).expect("conf file");
        let text = text.replace("../target/", &format!("{}/", root.join("target").display()));
        dir.write(f, &text);
    }
    let main = std::fs::read_to_string(dir.0.join("gateway.yaml")).expect("gateway.yaml");
    // the second route's `upstream`
    let routes = main.find("\nroutes:").expect("routes");
    let second = main[routes..]
        .match_indices("\n  - id:")
        .nth(1)
        .map(|(i, _)| routes + i)
        .expect("a second route");
    let at = second + main[second..].find("upstream:").expect("its upstream");
    let typo = format!("{}uptream:{}", &main[..at], &main[at + "upstream:".len()..]);
    dir.write("typo.yaml", &typo);
    let check = |file: &str| {
        let (code, _, err) = run_tollgate(&["-t", "-c", &dir.0.join(file).display().to_string()]);
        assert_eq!(code, 1);
        let printed = err.replace(&format!("{}/", dir.0.display()), "");
        assert_eq!(
            printed.trim_end(),
            quoted(&format!("$ tollgate -t -c {file}")),
            "{file}"
        );
    };
    check("typo.yaml");
    let limits = std::fs::read_to_string(dir.0.join("limits.yaml")).expect("limits.yaml");
    let put = limits.find("- id: put-product").expect("put-product");
    let t = put + limits[put..].find("threshold: 100").expect("its threshold");
    let bad = format!(
        "{}threshold: -5{}",
        &limits[..t],
        &limits[t + "threshold: 100".len()..]
    );
    dir.write("limits.yaml", &bad);
    dir.write("bad.yaml", &main);
    check("bad.yaml");
}
