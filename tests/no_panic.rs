//! Property tests: no input panics the parsers a client or a config file controls. Bounded
//! case counts, so that `make test` stays fast (`PROPTEST_CASES` raises them). The same
//! functions are `cargo fuzz` targets under `fuzz/` (`make fuzz`, with a nightly toolchain).

use proptest::prelude::*;
use std::net::IpAddr;
use std::path::Path;
use tollgate::config;
use tollgate::config::duration::parse_duration;
use tollgate::matching::{normalize_path, HostMatch, PathPattern, Segments};
use tollgate::request::client_addr::client_ip;

fn cases(default: u32) -> ProptestConfig {
    let n = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    ProptestConfig::with_cases(n)
}

/// Bytes that look like what they attack: path and YAML punctuation, escapes, controls.
fn hostile_text() -> impl Strategy<Value = String> {
    let atoms = prop_oneof![
        Just("/".to_string()),
        Just("//".to_string()),
        Just(".".to_string()),
        Just("..".to_string()),
        Just("%".to_string()),
        Just("%2f".to_string()),
        Just("%252e".to_string()),
        Just("%%30a".to_string()),
        Just("*".to_string()),
        Just("**".to_string()),
        Just("{tenant}".to_string()),
        Just("{".to_string()),
        Just("?".to_string()),
        Just("#".to_string()),
        Just(":".to_string()),
        Just("- ".to_string()),
        Just("\n".to_string()),
        Just("  ".to_string()),
        Just("\"".to_string()),
        Just("[".to_string()),
        Just("&a ".to_string()),
        Just("*a".to_string()),
        Just("!!binary ".to_string()),
        Just("\u{0}".to_string()),
        Just("é".to_string()),
        "[a-z0-9]{0,6}",
        any::<char>().prop_map(|c| c.to_string()),
    ];
    proptest::collection::vec(atoms, 0..24).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(cases(2000))]

    #[test]
    fn path_normalization_never_panics_and_is_idempotent(raw in hostile_text()) {
        let once = normalize_path(&raw).into_owned();
        let twice = normalize_path(&once).into_owned();
        prop_assert_eq!(once, twice);
    }

    #[test]
    fn globs_compile_or_refuse_and_never_panic(pattern in hostile_text(), path in hostile_text()) {
        if let Ok(p) = PathPattern::compile(&pattern) {
            let normalized = normalize_path(&path);
            let _ = p.matches(&normalized);
            let _ = p.match_capture(&normalized);
            let _ = p.matches_segments(&Segments::new(&normalized));
        }
        if let Ok(h) = HostMatch::parse(&pattern) {
            let _ = h.matches(&path);
        }
    }

    #[test]
    fn durations_parse_or_refuse(text in hostile_text(), n in any::<u64>(), unit in "(ms|s|m|h|d|)") {
        let _ = parse_duration(&text);
        let _ = parse_duration(&format!("{n}{unit}"));
    }

    #[test]
    fn x_forwarded_for_never_panics(values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..80), 0..6),
                                    peer in any::<[u8; 4]>()) {
        let trusted = ["10.0.0.0/8".parse().unwrap(), "127.0.0.1/32".parse().unwrap()];
        for p in [IpAddr::from(peer), "127.0.0.1".parse().unwrap()] {
            let ip = client_ip(p, values.iter().map(|v| v.as_slice()), &trusted);
            // the answer is the peer or an address a value held
            let texts: Vec<String> = values.iter().map(|v| String::from_utf8_lossy(v).into_owned()).collect();
            prop_assert!(ip == p || texts.iter().any(|t| t.contains(&ip.to_string())), "{ip} from {texts:?}");
        }
    }

    #[test]
    fn the_config_loader_answers_every_text_with_a_config_or_located_errors(text in hostile_text()) {
        check_config(&text);
    }
}

/// The shipped configs, each mutated: a line dropped, a line duplicated, two lines swapped, an
/// indentation changed, a value replaced. The loader answers with a config or located errors.
fn mutations() -> impl Strategy<Value = String> {
    let conf = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf");
    let mut texts: Vec<String> = std::fs::read_dir(conf)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .collect();
    texts.sort();
    (
        proptest::sample::select(texts),
        proptest::collection::vec(
            (
                0..5u8,
                any::<prop::sample::Index>(),
                any::<prop::sample::Index>(),
                hostile_text(),
            ),
            1..4,
        ),
    )
        .prop_map(|(text, edits)| {
            let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
            for (kind, a, b, junk) in edits {
                if lines.is_empty() {
                    break;
                }
                let i = a.index(lines.len());
                let j = b.index(lines.len());
                match kind {
                    0 => {
                        lines.remove(i);
                    }
                    1 => {
                        let l = lines[i].clone();
                        lines.insert(j, l);
                    }
                    2 => lines.swap(i, j),
                    3 => {
                        let l = &lines[i];
                        lines[i] = match l.strip_prefix(' ') {
                            Some(rest) => rest.to_string(),
                            None => format!(" {l}"),
                        };
                    }
                    _ => {
                        let l = &lines[i];
                        lines[i] = match l.split_once(": ") {
                            Some((k, _)) => format!("{k}: {junk}"),
                            None => format!("{l}{junk}"),
                        };
                    }
                }
            }
            lines.join("\n")
        })
}

proptest! {
    #![proptest_config(cases(400))]

    #[test]
    fn mutated_shipped_configs_load_or_fail_with_positions(text in mutations()) {
        check_config(&text);
    }
}

fn check_config(text: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/fuzzed.yaml");
    match config::load_str(&path, text) {
        Ok(_) => {}
        Err(errors) => {
            assert!(!errors.0.is_empty());
            for e in &errors.0 {
                assert!(e.pos.line >= 1 && e.pos.column >= 1, "{e}");
                assert!(!e.message.is_empty(), "{e}");
                // the file is this one, or a file it includes (keys, plans, limits beside it)
                let shown = e.to_string();
                let dir = path.parent().unwrap_or(&path);
                assert!(
                    shown.starts_with(&format!("{}:", path.display()))
                        || (e.file.parent() == Some(dir)
                            && shown.starts_with(&format!("{}:", e.file.display()))),
                    "{shown}"
                );
            }
        }
    }
}

/// Token-shaped text: base64url segments of JSON-ish text and of noise, joined by dots, behind
/// a scheme or none.
fn token_text() -> impl Strategy<Value = String> {
    use base64::Engine;
    let b64 = |s: String| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    let json = prop_oneof![
        Just(r#"{"alg":"EdDSA","kid":"ed-1"}"#.to_string()),
        Just(r#"{"alg":"HS256"}"#.to_string()),
        Just(r#"{"alg":"none"}"#.to_string()),
        Just(
            r#"{"iss":"https://issuer.example/","aud":"api","exp":9999999999,"org":{"id":"a"}}"#
                .to_string()
        ),
        "\\PC{0,60}",
        "[{}\\[\\]\":,a-z0-9 ]{0,60}",
    ];
    let segment = prop_oneof![json.prop_map(b64), "[A-Za-z0-9_\\-=+/!.]{0,80}"];
    let scheme = prop_oneof![
        Just("Bearer ".to_string()),
        Just("bearer  ".to_string()),
        Just(String::new()),
        Just("Basic ".to_string()),
    ];
    (scheme, proptest::collection::vec(segment, 0..5))
        .prop_map(|(scheme, parts)| format!("{scheme}{}", parts.join(".")))
}

proptest! {
    #![proptest_config(cases(2000))]

    /// The bearer token parser: any Authorization value is absent, or refused with a reason
    /// (none of these carries a valid signature), never a panic.
    #[test]
    fn tokens_never_panic_and_never_pass_unsigned(text in token_text()) {
        let source = tollgate::tokens::example_source();
        if let Ok(v) = http::HeaderValue::from_str(&text) {
            let mut headers = http::HeaderMap::new();
            headers.insert(http::header::AUTHORIZATION, v);
            let outcome = source.check(&headers, 1_800_000_000_000);
            prop_assert!(!matches!(outcome, tollgate::tokens::Outcome::Valid(_)), "{text}");
        }
    }
}
