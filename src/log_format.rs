//! `server.log_format`: the gateway's log lines as text (env_logger's) or as JSON, one object a
//! line, for Loki, Elastic or Cloud Logging. Every line has `ts` (RFC 3339, UTC, milliseconds),
//! `level`, `target` and `msg`; an access log line (target `tollgate::access`) has its fields
//! instead of `msg` ([`Line`]). Chosen at start (a reload cannot change it).

use std::fmt::Display;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// The access log's target.
pub const ACCESS: &str = "tollgate::access";

static JSON: AtomicBool = AtomicBool::new(false);

/// Are log lines JSON?
pub fn json() -> bool {
    JSON.load(Ordering::Relaxed)
}

/// The env_logger builder's format, JSON or text.
pub fn set_up(builder: &mut env_logger::Builder, json: bool) {
    JSON.store(json, Ordering::Relaxed);
    if json {
        builder.format(|buf, record| {
            let ts = buf.timestamp_millis();
            write!(
                buf,
                "{{\"ts\":\"{ts}\",\"level\":\"{}\",\"target\":{}",
                record.level(),
                quote(record.target())
            )?;
            if record.target() == ACCESS {
                // the access line's fields, made by `Line`
                writeln!(buf, ",{}}}", record.args())
            } else {
                writeln!(buf, ",\"msg\":{}}}", quote(&record.args().to_string()))
            }
        });
    } else {
        builder.format_timestamp_millis();
    }
}

/// `s` as a JSON string.
fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_string())
}

/// An access log line's fields: `key=value` (values a client sends quoted and escaped, so no
/// client can end a line or forge one) or, in JSON, `"key":value` (the object's inside).
pub struct Line {
    out: String,
    json: bool,
}

impl Line {
    pub fn new(json: bool) -> Self {
        Line {
            out: String::with_capacity(256),
            json,
        }
    }

    fn key(&mut self, key: &str) {
        if !self.out.is_empty() {
            self.out.push(if self.json { ',' } else { ' ' });
        }
        if self.json {
            self.out.push('"');
            self.out.push_str(key);
            self.out.push_str("\":");
        } else {
            self.out.push_str(key);
            self.out.push('=');
        }
    }

    /// A value of the gateway's (a route id, a decision): as it is in text.
    pub fn word(&mut self, key: &str, value: &str) {
        self.key(key);
        if self.json {
            self.out.push_str(&quote(value));
        } else {
            self.out.push_str(value);
        }
    }

    /// A value a client sends (a tenant, a path): quoted and escaped.
    pub fn quoted(&mut self, key: &str, value: &str) {
        self.key(key);
        if self.json {
            self.out.push_str(&quote(value));
        } else {
            use std::fmt::Write;
            let _ = write!(self.out, "\"{}\"", value.escape_debug());
        }
    }

    /// A number.
    pub fn number(&mut self, key: &str, value: impl Display) {
        use std::fmt::Write;
        self.key(key);
        let _ = write!(self.out, "{value}");
    }

    pub fn finish(self) -> String {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_text_or_the_inside_of_a_json_object() {
        let fill = |json| {
            let mut l = Line::new(json);
            l.word("route", "all");
            l.quoted("tenant", "ac\"me\n");
            l.number("status", 200);
            l.number("latency_ms", format_args!("{:.3}", 1.5));
            l.finish()
        };
        assert_eq!(
            fill(false),
            r#"route=all tenant="ac\"me\n" status=200 latency_ms=1.500"#
        );
        let v: serde_json::Value = serde_json::from_str(&format!("{{{}}}", fill(true))).unwrap();
        assert_eq!(v["route"], "all");
        assert_eq!(v["tenant"], "ac\"me\n");
        assert_eq!(v["status"], 200);
        assert_eq!(v["latency_ms"], 1.5);
    }
}
