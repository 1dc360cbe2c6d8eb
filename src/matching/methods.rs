//! A set of HTTP methods as a bit mask: matching costs one branch and no allocation.

use http::Method;

/// The methods a set may name.
pub const NAMES: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MethodSet(u16);

impl MethodSet {
    /// Every method, including ones outside the list above.
    pub const ALL: MethodSet = MethodSet(u16::MAX);

    pub fn parse<S: AsRef<str>>(names: &[S]) -> Result<Self, String> {
        if names.is_empty() {
            return Err(format!(
                "methods must not be empty: omit the key for all methods, or list some of {}",
                NAMES.join(", ")
            ));
        }
        let mut bits = 0u16;
        for n in names {
            let n = n.as_ref();
            match NAMES.iter().position(|k| k.eq_ignore_ascii_case(n)) {
                Some(i) => bits |= 1 << i,
                None => {
                    return Err(format!(
                        "unknown method {n:?}: expected one of {}",
                        NAMES.join(", ")
                    ))
                }
            }
        }
        Ok(MethodSet(bits))
    }

    /// Does a method belong to both sets?
    pub fn overlaps(self, other: MethodSet) -> bool {
        self.0 & other.0 != 0
    }

    pub fn contains(&self, method: &Method) -> bool {
        if self.0 == u16::MAX {
            return true;
        }
        let bit = match *method {
            Method::GET => 0,
            Method::HEAD => 1,
            Method::POST => 2,
            Method::PUT => 3,
            Method::DELETE => 4,
            Method::PATCH => 5,
            Method::OPTIONS => 6,
            Method::CONNECT => 7,
            Method::TRACE => 8,
            _ => return false,
        };
        self.0 & (1 << bit) != 0
    }

    pub fn is_all(&self) -> bool {
        self.0 == u16::MAX
    }

    pub fn names(&self) -> Vec<&'static str> {
        NAMES
            .iter()
            .enumerate()
            .filter(|(i, _)| self.0 & (1 << i) != 0)
            .map(|(_, n)| *n)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_contains() {
        let s = MethodSet::parse(&["GET", "put"]).unwrap();
        assert!(s.contains(&Method::GET));
        assert!(s.contains(&Method::PUT));
        assert!(!s.contains(&Method::POST));
        assert!(MethodSet::ALL.contains(&Method::from_bytes(b"PROPFIND").unwrap()));
        assert!(MethodSet::parse(&["GETT"])
            .unwrap_err()
            .contains("expected one of"));
        assert!(MethodSet::parse::<&str>(&[]).is_err());
    }
}
