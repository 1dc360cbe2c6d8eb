//! Path globs (contract section 3): `*` is exactly one non-empty segment, `**` is zero or more
//! segments, `{tenant}` is one segment, captured. Patterns match normalized paths.

use super::normalize::normalize_path;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    Literal(Box<str>),
    One,
    Any,
    Capture,
}

/// A compiled path pattern.
#[derive(Debug, Clone)]
pub struct PathPattern {
    source: String,
    segs: Vec<Seg>,
    has_capture: bool,
}

impl PartialEq for PathPattern {
    fn eq(&self, other: &Self) -> bool {
        self.segs == other.segs
    }
}

impl PathPattern {
    /// Compile a pattern; the error says what is accepted.
    pub fn compile(pattern: &str) -> Result<Self, String> {
        if !pattern.starts_with('/') {
            return Err(format!("path pattern {pattern:?} must start with '/'"));
        }
        if pattern.contains(['?', '#']) {
            return Err(format!(
                "path pattern {pattern:?} must not contain '?' or '#': patterns match the path only"
            ));
        }
        let body = pattern[1..].strip_suffix('/').unwrap_or(&pattern[1..]);
        let mut segs = Vec::new();
        let mut captures = 0;
        if !body.is_empty() {
            for seg in body.split('/') {
                let s = match seg {
                    "" => {
                        return Err(format!(
                            "path pattern {pattern:?} has an empty segment ('//')"
                        ))
                    }
                    "." | ".." => {
                        return Err(format!(
                        "path pattern {pattern:?} has a '{seg}' segment; write the normalized path"
                    ))
                    }
                    "*" => Seg::One,
                    "**" => {
                        if segs.last() == Some(&Seg::Any) {
                            continue; // `**/**` is `**`
                        }
                        Seg::Any
                    }
                    "{tenant}" => {
                        captures += 1;
                        Seg::Capture
                    }
                    s if s.contains(['*', '{', '}']) => {
                        return Err(format!(
                            "path pattern {pattern:?}: segment {s:?} is not accepted; '*' and '**' \
                             must be whole segments and the only capture is '{{tenant}}'"
                        ))
                    }
                    s => {
                        let normal = normalize_path(&format!("/{s}")).into_owned();
                        Seg::Literal(normal[1..].into())
                    }
                };
                segs.push(s);
            }
        }
        if captures > 1 {
            return Err(format!(
                "path pattern {pattern:?} captures {{tenant}} more than once"
            ));
        }
        Ok(PathPattern {
            source: pattern.to_string(),
            segs,
            has_capture: captures == 1,
        })
    }

    /// The pattern as written in the config.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    pub fn has_capture(&self) -> bool {
        self.has_capture
    }

    /// Does the normalized `path` match?
    pub fn matches(&self, path: &str) -> bool {
        self.match_capture(path).is_some()
    }

    /// Match the normalized `path`; on a match, return the `{tenant}` segment if the pattern
    /// has one. Runs in O(segments x pattern length) whatever the input, with no allocation.
    pub fn match_capture<'a>(&self, path: &'a str) -> Option<Option<&'a str>> {
        let body = path.strip_prefix('/').unwrap_or(path);
        let end = body.len();
        let next_start = |seg_end: usize| if seg_end < end { seg_end + 1 } else { end };
        let seg_end_at = |s: usize| body[s..].find('/').map_or(end, |i| s + i);

        let mut p = 0; // index into segs
        let mut s = 0; // byte offset of the current path segment (== end: no segments left)
        let mut star: Option<(usize, usize)> = None; // (pattern index after **, resume offset)
        let mut capture: Option<&'a str> = None;
        loop {
            if p < self.segs.len() {
                if self.segs[p] == Seg::Any {
                    star = Some((p + 1, s));
                    p += 1;
                    continue;
                }
                if s < end {
                    let e = seg_end_at(s);
                    let seg = &body[s..e];
                    let ok = match &self.segs[p] {
                        Seg::Literal(l) => **l == *seg,
                        Seg::One | Seg::Capture => !seg.is_empty(),
                        Seg::Any => false,
                    };
                    if ok {
                        if self.segs[p] == Seg::Capture {
                            capture = Some(seg);
                        }
                        p += 1;
                        s = next_start(e);
                        continue;
                    }
                }
            } else if s >= end {
                return Some(capture);
            }
            // mismatch: let the last `**` swallow one more segment
            match star {
                Some((sp, ss)) if ss < end => {
                    let resume = next_start(seg_end_at(ss));
                    star = Some((sp, resume));
                    p = sp;
                    s = resume;
                }
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, path: &str) -> bool {
        PathPattern::compile(p).unwrap().matches(path)
    }

    #[test]
    fn single_star_is_one_nonempty_segment() {
        assert!(m("/product/*", "/product/7"));
        assert!(!m("/product/*", "/product"));
        assert!(!m("/product/*", "/product/7/x"));
    }

    #[test]
    fn double_star_is_zero_or_more_segments() {
        assert!(m("/**", "/"));
        assert!(m("/**", "/a/b/c"));
        assert!(m("/v1/**", "/v1"));
        assert!(m("/v1/**/x", "/v1/x"));
        assert!(m("/v1/**/x", "/v1/a/b/x"));
        assert!(!m("/v1/**/x", "/v1/a/b/y"));
        assert!(m("/a/**/b/**/c", "/a/1/b/2/b/3/c"));
        assert!(!m("/a/**/b/**/c", "/a/1/c/2/b"));
    }

    #[test]
    fn capture_returns_tenant_segment() {
        let p = PathPattern::compile("/v1/organizations/{tenant}/**").unwrap();
        assert_eq!(
            p.match_capture("/v1/organizations/acme/product/7"),
            Some(Some("acme"))
        );
        assert_eq!(p.match_capture("/v1/organizations"), None);
        assert!(p.has_capture());
    }

    #[test]
    fn literal_segments_are_normalized() {
        assert!(m("/%7Euser/", "/~user"));
        assert!(m("/", "/"));
        assert!(!m("/", "/a"));
    }

    #[test]
    fn bad_patterns_are_rejected_with_reason() {
        assert!(PathPattern::compile("product/*")
            .unwrap_err()
            .contains("start with '/'"));
        assert!(PathPattern::compile("/a*b")
            .unwrap_err()
            .contains("whole segments"));
        assert!(PathPattern::compile("/{org}")
            .unwrap_err()
            .contains("{tenant}"));
        assert!(PathPattern::compile("/a//b")
            .unwrap_err()
            .contains("empty segment"));
        assert!(PathPattern::compile("/{tenant}/{tenant}").is_err());
        assert!(PathPattern::compile("/a/../b").is_err());
    }
}
