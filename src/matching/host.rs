//! Host matching: an exact name (`api.example.com`) or a leading wildcard (`*.example.com`),
//! case-insensitive, ignoring the port and a trailing dot of the request's Host.

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatch {
    Exact(String),
    /// `*.example.com`, stored as `.example.com`.
    Suffix(String),
}

impl HostMatch {
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim().to_ascii_lowercase();
        let valid = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        };
        if let Some(rest) = t.strip_prefix("*.") {
            if valid(rest) {
                return Ok(HostMatch::Suffix(format!(".{rest}")));
            }
        } else if valid(&t) {
            return Ok(HostMatch::Exact(t));
        }
        Err(format!(
            "invalid host {text:?}: expected a host name such as \"api.example.com\" or \"*.example.com\" (no port)"
        ))
    }

    /// Match against the request's Host (`name[:port]`).
    /// Could one host match both?
    pub fn overlaps(&self, other: &HostMatch) -> bool {
        match (self, other) {
            (HostMatch::Exact(a), _) => other.matches(a),
            (_, HostMatch::Exact(b)) => self.matches(b),
            // `*.a.example.com` and `*.example.com` share `x.a.example.com`
            (HostMatch::Suffix(a), HostMatch::Suffix(b)) => {
                a.ends_with(b.as_str()) || b.ends_with(a.as_str())
            }
        }
    }

    pub fn matches(&self, request_host: &str) -> bool {
        let host = strip_port(request_host);
        let host = host.strip_suffix('.').unwrap_or(host);
        match self {
            HostMatch::Exact(h) => host.eq_ignore_ascii_case(h),
            HostMatch::Suffix(sfx) => {
                host.len() > sfx.len()
                    && host.is_char_boundary(host.len() - sfx.len())
                    && host[host.len() - sfx.len()..].eq_ignore_ascii_case(sfx)
            }
        }
    }

    pub fn as_display(&self) -> String {
        match self {
            HostMatch::Exact(h) => h.clone(),
            HostMatch::Suffix(s) => format!("*{s}"),
        }
    }
}

fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        // [v6]:port
        return match host.find(']') {
            Some(i) => &host[..=i],
            None => host,
        };
    }
    match host.rfind(':') {
        Some(i) if host[i + 1..].bytes().all(|b| b.is_ascii_digit()) => &host[..i],
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_and_wildcard() {
        let h = HostMatch::parse("API.example.com").unwrap();
        assert!(h.matches("api.example.com"));
        assert!(h.matches("Api.Example.Com:8080"));
        assert!(h.matches("api.example.com."));
        assert!(!h.matches("xapi.example.com"));
        let w = HostMatch::parse("*.example.com").unwrap();
        assert!(w.matches("a.example.com"));
        assert!(!w.matches("example.com"));
        assert!(HostMatch::parse("a b").is_err());
        assert!(HostMatch::parse("host:80").is_err());
    }
}
