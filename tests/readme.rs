//! README "A curl session through the demo", run as written: the demo config (`make run`'s,
//! its ports moved to free ones) with upstreams answering as the demo's do, each command of the
//! session run by bash from the repository's root in order, and what it prints held to what the
//! README quotes. Of an HTTP answer, a quoted header must be among the answer's, in order (the
//! README leaves out some, such as `date`; `...` marks where more were left out), and the quoted
//! body must be the body; any other output (the metrics grep) must be exactly the quoted lines. Seconds to a window's end depend on
//! the time of day: `x-ratelimit-reset: N`, `t=N` and a retry after N seconds match any N; a
//! request id (new for every request) matches any other. The 429 the README quotes next is
//! made by a gateway with the rule it describes.

mod common;
use common::{repo, DemoGateway, Gateway, Upstream};
use std::process::Command;

/// The session's commands and what the README says each prints.
fn session() -> Vec<(String, Vec<String>)> {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let start = readme
        .find("## A curl session through the demo")
        .expect("the section");
    let block = &readme[start..];
    let block = &block[block.find("```console\n").expect("its console block") + 11..];
    let block = &block[..block.find("```").expect("its end")];
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for line in block.lines() {
        match line.strip_prefix("$ ") {
            Some(cmd) => out.push((cmd.to_string(), Vec::new())),
            None => out
                .last_mut()
                .expect("a command first")
                .1
                .push(line.to_string()),
        }
    }
    // the blank line that ends each command's output (before the next `$`) is layout
    for (_, lines) in &mut out {
        while lines.last().is_some_and(|l| l.is_empty()) {
            lines.pop();
        }
    }
    out
}

/// A request id (32 hex digits, new for every request) as `<id>`.
fn idless(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(i) = rest.find("\"x-request-id\",\"") {
        let at = i + "\"x-request-id\",\"".len();
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let n = rest
            .find(|c: char| !c.is_ascii_hexdigit())
            .unwrap_or(rest.len());
        out.push_str("<id>");
        rest = &rest[n..];
    }
    out.push_str(rest);
    out
}

/// `x-ratelimit-reset: 7`, `t=7` and a retry after 7 s as `x-ratelimit-reset: N`, `t=N`...; a
/// request id as `<id>`.
fn timeless(line: &str) -> String {
    let line = idless(line);
    let mut out = String::with_capacity(line.len());
    let mut rest = line.trim_end();
    loop {
        let at = [
            "x-ratelimit-reset: ",
            "t=",
            "retry-after: ",
            "\"retry_after\":",
        ]
        .iter()
        .filter_map(|p| rest.find(p).map(|i| (i, p.len())))
        .min();
        let Some((i, n)) = at else {
            out.push_str(rest);
            return out;
        };
        out.push_str(&rest[..i + n]);
        rest = &rest[i + n..];
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits > 0 {
            out.push('N');
        }
        rest = &rest[digits..];
    }
}

/// Does `printed` hold what the README quotes (`quoted`)?
fn holds(quoted: &[String], printed: &str) -> Result<(), String> {
    let printed: Vec<String> = printed.lines().map(timeless).collect();
    let quoted: Vec<String> = quoted.iter().map(|l| timeless(l)).collect();
    if !quoted.first().is_some_and(|l| l.starts_with("HTTP/")) {
        return if printed == quoted {
            Ok(())
        } else {
            Err("not the quoted lines".into())
        };
    }
    // headers: in order, some left out; the body: as quoted
    let split = |l: &[String]| -> (Vec<String>, Vec<String>) {
        let blank = l.iter().position(String::is_empty).unwrap_or(l.len());
        (
            l[..blank].to_vec(),
            l[blank..]
                .iter()
                .filter(|x| !x.is_empty())
                .cloned()
                .collect(),
        )
    };
    let (q_head, q_body) = split(&quoted);
    let (p_head, p_body) = split(&printed);
    let mut at = 0;
    for h in q_head.iter().filter(|h| *h != "...") {
        match p_head[at..].iter().position(|p| p.eq_ignore_ascii_case(h)) {
            Some(i) => at += i + 1,
            None => return Err(format!("no header line {h:?} (in order)")),
        }
    }
    let q_body: Vec<&String> = q_body.iter().filter(|l| *l != "...").collect();
    if !q_body.is_empty() && q_body != p_body.iter().collect::<Vec<_>>() {
        return Err(format!("the body is not {q_body:?}"));
    }
    Ok(())
}

#[test]
fn the_readmes_curl_session_holds() {
    // the products pool's two servers in the demo's order (round robin goes by address)
    let mut ports = [common::free_port(), common::free_port()];
    ports.sort_unstable();
    let (u1, u2, u3) = (
        Upstream::start_on(&format!("127.0.0.1:{}", ports[0]), "demo-9001"),
        Upstream::start_on(&format!("127.0.0.1:{}", ports[1]), "demo-9002"),
        Upstream::start("demo-9003"),
    );
    let gw = DemoGateway::start(&[
        ("127.0.0.1:9001", u1.addr),
        ("127.0.0.1:9002", u2.addr),
        ("127.0.0.1:9003", u3.addr),
    ]);
    assert!(gw.ready, "the demo gateway did not start");
    let session = session();
    assert!(session.len() >= 8, "{session:?}");
    // the session in one of get-product's 10 s windows (aligned to the clock): its second
    // request says 998 left
    assert!(common::eventually(
        std::time::Duration::from_secs(5),
        || { common::now_ms() % 10_000 < 7_000 }
    ));
    for (cmd, quoted) in &session {
        let run = cmd
            .replace("127.0.0.1:8080", &gw.listen.to_string())
            .replace("localhost:8443", &format!("localhost:{}", gw.tls.port()))
            .replace("127.0.0.1:9090", &gw.admin.to_string());
        let out = Command::new("bash")
            .arg("-c")
            .arg(&run)
            .current_dir(repo())
            .output()
            .expect("bash");
        let printed = String::from_utf8_lossy(&out.stdout)
            // the upstreams' view of the moved addresses, as the README's
            .replace(&gw.listen.to_string(), "127.0.0.1:8080")
            .replace(&format!("localhost:{}", gw.tls.port()), "localhost:8443");
        if let Err(why) = holds(quoted, &printed) {
            panic!(
                "$ {cmd}\n{why}\nthe README quotes:\n{}\nprinted:\n{printed}",
                quoted.join("\n")
            );
        }
    }
}

#[test]
fn quoted_output_is_matched_strictly_where_it_should_be() {
    let q = |s: &str| s.lines().map(String::from).collect::<Vec<_>>();
    // a header left out is fine; a changed one is not, nor another body
    let quoted = q("HTTP/1.1 200 OK\nx-a: 1\n\n{\"b\":2}");
    assert!(holds(
        &quoted,
        "HTTP/1.1 200 OK\r\nx-z: 0\r\nx-a: 1\r\n\r\n{\"b\":2}"
    )
    .is_ok());
    assert!(holds(&quoted, "HTTP/1.1 200 OK\r\nx-a: 2\r\n\r\n{\"b\":2}").is_err());
    assert!(holds(&quoted, "HTTP/1.1 200 OK\r\nx-a: 1\r\n\r\n{\"b\":3}").is_err());
    // other output, every line: one more is a mistake (the metrics grep)
    assert!(holds(&q("a 1\nb 2"), "a 1\nb 2\n").is_ok());
    assert!(holds(&q("a 1\nb 2"), "a 1\nb 2\nc 3\n").is_err());
    assert_eq!(timeless("x-ratelimit-reset: 7"), "x-ratelimit-reset: N");
    assert_eq!(
        timeless(r#"[["x-request-id","9903d4200fe5d52a0e57d6110cc18ded"],["a","b"]]"#),
        r#"[["x-request-id","<id>"],["a","b"]]"#
    );
    assert_eq!(
        timeless("ratelimit: \"p\";r=9;t=10"),
        "ratelimit: \"p\";r=9;t=N"
    );
}

/// README: "With a rule of two tiers, `{ period: 10, threshold: 1000 }` and `{ period: 1h,
/// threshold: 2 }`, the third GET of a tenant within the hour" answers the 429 it quotes.
#[test]
fn the_readmes_429_holds() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let at = readme
        .find("the third GET of a tenant within the hour:")
        .expect("the sentence");
    let block = &readme[at..];
    let block = &block[block.find("```console\n").expect("its block") + 11..];
    let quoted: Vec<String> = block[..block.find("```").expect("its end")]
        .lines()
        .map(String::from)
        .collect();
    let up = Upstream::start("u");
    let gw = Gateway::start(
        &(common::one_route_config(up.addr, 1, "")
            + r#"tenant:
  from: [{ header: x-org-id, trusted: true }]
limits:
  - id: get-product
    methods: [GET]
    pathPattern: /v1/organizations/*/product/*
    tiers:
      - { period: 10, threshold: 1000 }
      - { period: 1h, threshold: 2 }
"#),
    );
    // the three in one hour (aligned to the clock)
    assert!(common::eventually(
        std::time::Duration::from_secs(15),
        || { common::now_ms() % 3_600_000 < 3_590_000 }
    ));
    let get = || {
        let r = common::request(
            gw.addr,
            "GET",
            "/v1/organizations/acme/product/1",
            &[("x-org-id", "acme")],
        )
        .expect("an answer");
        let mut text = format!(
            "HTTP/1.1 {} {}\n",
            r.status,
            if r.status == 429 {
                "Too Many Requests"
            } else {
                "OK"
            }
        );
        for (k, v) in &r.headers {
            text.push_str(&format!("{k}: {v}\n"));
        }
        text.push('\n');
        text.push_str(&r.body);
        text
    };
    get();
    get();
    let third = get();
    if let Err(why) = holds(&quoted, &third) {
        panic!(
            "{why}\nthe README quotes:\n{}\nprinted:\n{third}",
            quoted.join("\n")
        );
    }
}
