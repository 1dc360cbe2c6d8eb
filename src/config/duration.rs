//! Durations as written in the config file: an integer (seconds) or a string with a unit
//! (`ms`, `s`, `m`, `h`), e.g. `10`, `"500ms"`, `"1m"`.

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use std::fmt;
use std::time::Duration;
use tollgate_limits::calendar::CalendarUnit;

/// A duration read from the config file. Zero is representable; callers that need a positive
/// value check it (and report the position) themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConfDuration(pub Duration);

const ACCEPTED: &str =
    "an integer number of seconds or a string such as \"500ms\", \"10s\", \"1m\", \"1h\"";

/// What a unit that is none was probably meant as (`1day`, `30secs`, `2 hours`): a "did you
/// mean" for the error, or nothing.
fn meant(value: u64, unit: &str) -> String {
    let lower = unit.trim().to_ascii_lowercase();
    let unit = match lower.trim_end_matches('s') {
        "m" if lower == "ms" => "ms",
        "" | "sec" | "second" => "s",
        "msec" | "milli" | "millisecond" => "ms",
        "min" | "minute" => "m",
        "hr" | "hour" | "h" => "h",
        "d" | "day" => "d",
        "w" | "wk" | "week" => "w",
        "mo" | "mon" | "month" => "mo",
        _ => return String::new(),
    };
    match unit {
        "d" | "w" => {
            let hours = value.saturating_mul(if unit == "d" { 24 } else { 168 });
            let calendar = if value == 1 {
                format!(
                    ", or for a tier's period \"1{unit}\" (a calendar {})",
                    if unit == "d" { "day" } else { "week" }
                )
            } else {
                String::new()
            };
            format!(": did you mean \"{hours}h\"{calendar}?")
        }
        "mo" => ": a month has no fixed length (a tier's period may be \"1mo\", a calendar month)"
            .to_string(),
        _ => format!(": did you mean \"{value}{unit}\"?"),
    }
}

/// `1.5s`: fractions are not accepted; the same length in a smaller unit is.
fn fraction(text: &str, whole: u64, rest: &str) -> String {
    let digits: String = rest[1..].chars().take_while(char::is_ascii_digit).collect();
    let unit = rest[1 + digits.len()..].trim();
    let millis_per_unit = match unit {
        "" | "s" => 1000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        _ => 0.0,
    };
    let value = format!("{whole}.{digits}").parse::<f64>().unwrap_or(0.0);
    let ms = (value * millis_per_unit).round();
    if ms > 0.0 {
        format!("invalid duration {text:?}: fractions are not accepted, write \"{ms}ms\" instead")
    } else {
        format!("invalid duration {text:?}: fractions are not accepted; expected {ACCEPTED}")
    }
}

/// `1m30s`, `1h30m`: a sum of lengths, written as one (`90s`, `90m`).
fn compound(first: u64, rest: &str) -> Option<String> {
    let at = rest.find(|c: char| c.is_ascii_digit())?;
    let (unit, more) = rest.split_at(at);
    let total = parse_duration(&format!("{first}{unit}"))
        .ok()?
        .checked_add(parse_duration(more).ok()?)?;
    Some(format!(": did you mean \"{}\"?", format_duration(total)))
}

/// Parse `500ms`, `10s`, `1m`, `1h` or a bare integer (seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    if number.is_empty() {
        let why = match text.strip_prefix('-') {
            Some(rest) if rest.starts_with(|c: char| c.is_ascii_digit()) => {
                format!("must not be negative; expected {ACCEPTED}")
            }
            _ => format!("expected {ACCEPTED}"),
        };
        return Err(format!("invalid duration {text:?}: {why}"));
    }
    let value: u64 = number
        .parse()
        .map_err(|_| format!("invalid duration {text:?}: number too large"))?;
    let millis_per_unit: u64 = match unit.trim() {
        "" | "s" => 1000,
        "ms" => 1,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" | "w" | "mo" => {
            return Err(format!(
                "invalid duration {text:?}: a tier's period may be one calendar day, week or month (1d, 1w, 1mo); a fixed length is written in hours, such as \"48h\""
            ))
        }
        other if other.starts_with(['.', ',']) => return Err(fraction(text, value, other)),
        other => {
            return Err(format!(
                "invalid duration unit {other:?} in {text:?}: expected one of ms, s, m, h{}",
                compound(value, other).unwrap_or_else(|| meant(value, other))
            ))
        }
    };
    value
        .checked_mul(millis_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("invalid duration {text:?}: too large"))
}

/// Write a duration in its normalized form: the largest unit that divides it exactly
/// (`10s`, `500ms`, `1m`, `2h`). Used in RateLimit-Policy names and the `-t` summary.
pub fn format_duration(d: Duration) -> String {
    let mut s = String::with_capacity(8);
    write_duration_ms(&mut s, d.as_millis() as u64);
    s
}

/// `format_duration` into an existing string, from milliseconds.
pub fn write_duration_ms(out: &mut String, ms: u64) {
    use std::fmt::Write;
    let _ = if ms != 0 && ms.is_multiple_of(3_600_000) {
        write!(out, "{}h", ms / 3_600_000)
    } else if ms != 0 && ms.is_multiple_of(60_000) {
        write!(out, "{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        write!(out, "{}s", ms / 1000)
    } else {
        write!(out, "{ms}ms")
    };
}

/// A tier's period as written: a fixed length (`10s`, `24h`), or a calendar day, week or month
/// (`1d`, `1w`, `1mo`: see `calendar`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeriodFile {
    Fixed(Duration),
    Calendar(CalendarUnit),
}

/// A period's name in quota headers, metrics and summaries: `10s`, `1h`, or `1d`, `1w`, `1mo`.
pub fn write_period(out: &mut String, ms: u64, calendar: Option<CalendarUnit>) {
    match calendar {
        Some(unit) => out.push_str(unit.as_str()),
        None => write_duration_ms(out, ms),
    }
}

/// A calendar window in words, with its zone: `1 day in America/New_York`, `1 week in UTC`
/// (ISO weeks, from Monday), `1 month in Europe/Berlin`.
pub fn calendar_words(c: &tollgate_limits::calendar::Calendar) -> String {
    let unit = match c.unit {
        CalendarUnit::Day => "1 day",
        CalendarUnit::Week => "1 week",
        CalendarUnit::Month => "1 month",
    };
    format!("{unit} in {}", c.zone_name())
}

impl<'de> Deserialize<'de> for PeriodFile {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PeriodVisitor;
        impl Visitor<'_> for PeriodVisitor {
            type Value = PeriodFile;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(
                    f,
                    "{ACCEPTED}, or 1d, 1w, 1mo (a calendar day, week or month)"
                )
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<PeriodFile, E> {
                DurationVisitor.visit_u64(v).map(|d| PeriodFile::Fixed(d.0))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<PeriodFile, E> {
                DurationVisitor.visit_i64(v).map(|d| PeriodFile::Fixed(d.0))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<PeriodFile, E> {
                DurationVisitor.visit_f64(v).map(|d| PeriodFile::Fixed(d.0))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<PeriodFile, E> {
                match CalendarUnit::parse(v) {
                    Some(unit) => Ok(PeriodFile::Calendar(unit)),
                    None => parse_duration(v).map(PeriodFile::Fixed).map_err(E::custom),
                }
            }
        }
        deserializer.deserialize_any(PeriodVisitor)
    }
}

impl fmt::Display for ConfDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_duration(self.0))
    }
}

struct DurationVisitor;

impl Visitor<'_> for DurationVisitor {
    type Value = ConfDuration;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(ACCEPTED)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<ConfDuration, E> {
        v.checked_mul(1000)
            .map(|ms| ConfDuration(Duration::from_millis(ms)))
            .ok_or_else(|| E::custom("duration too large"))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<ConfDuration, E> {
        if v < 0 {
            return Err(E::custom(format!(
                "invalid duration {v}: must not be negative; expected {ACCEPTED}"
            )));
        }
        self.visit_u64(v as u64)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<ConfDuration, E> {
        Err(E::custom(format!(
            "invalid duration {v}: fractions are not accepted, write \"{}ms\" instead",
            (v * 1000.0).round()
        )))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<ConfDuration, E> {
        parse_duration(v).map(ConfDuration).map_err(E::custom)
    }
}

impl<'de> Deserialize<'de> for ConfDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(DurationVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_bare_seconds() {
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        assert!(parse_duration("10x").unwrap_err().contains("unit"));
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("99999999999999999999s").is_err());
    }

    #[test]
    fn mistakes_are_named_with_the_duration_meant() {
        let err = |t: &str| parse_duration(t).unwrap_err();
        assert!(
            err("-1s").contains("must not be negative"),
            "{}",
            err("-1s")
        );
        assert!(err("1.5s").contains("write \"1500ms\""), "{}", err("1.5s"));
        assert!(err("0.5m").contains("write \"30000ms\""), "{}", err("0.5m"));
        assert!(
            err("1m30s").contains("did you mean \"90s\"?"),
            "{}",
            err("1m30s")
        );
        assert!(
            err("1h30m").contains("did you mean \"90m\"?"),
            "{}",
            err("1h30m")
        );
        assert!(
            err("10 sec").contains("did you mean \"10s\"?"),
            "{}",
            err("10 sec")
        );
        assert!(
            err("5mins").contains("did you mean \"5m\"?"),
            "{}",
            err("5mins")
        );
        assert!(
            err("2 hours").contains("did you mean \"2h\"?"),
            "{}",
            err("2 hours")
        );
        assert!(err("100 millis").contains("did you mean \"100ms\"?"));
    }

    #[test]
    fn formats_with_largest_exact_unit() {
        assert_eq!(format_duration(Duration::from_secs(10)), "10s");
        assert_eq!(format_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(format_duration(Duration::from_secs(60)), "1m");
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        assert_eq!(format_duration(Duration::from_secs(3600)), "1h");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
    }
}
