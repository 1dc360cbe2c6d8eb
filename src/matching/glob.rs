//! Path globs (contract section 3): `*` is exactly one non-empty segment, `**` is zero or more
//! segments, `{tenant}` is one segment, captured. Patterns match normalized paths.

use super::normalize::normalize_path;
use smallvec::SmallVec;

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

    /// Could one path match both patterns? (Segment by segment; `**` takes none or more.)
    pub fn overlaps(&self, other: &PathPattern) -> bool {
        fn meet(a: &[Seg], b: &[Seg]) -> bool {
            match (a.split_first(), b.split_first()) {
                (None, None) => true,
                (Some((Seg::Any, rest)), _) => meet(rest, b) || (!b.is_empty() && meet(a, &b[1..])),
                (_, Some((Seg::Any, rest))) => meet(a, rest) || (!a.is_empty() && meet(&a[1..], b)),
                (Some((x, ra)), Some((y, rb))) => {
                    let one = match (x, y) {
                        (Seg::Literal(p), Seg::Literal(q)) => p == q,
                        _ => true,
                    };
                    one && meet(ra, rb)
                }
                _ => false,
            }
        }
        meet(&self.segs, &other.segs)
    }

    /// `/**`: every path.
    pub fn any() -> Self {
        PathPattern {
            source: "/**".to_string(),
            segs: vec![Seg::Any],
            has_capture: false,
        }
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
        self.matches_segments(&Segments::new(path))
    }

    /// Match the normalized `path`; on a match, return the `{tenant}` segment if the pattern
    /// has one.
    pub fn match_capture<'a>(&self, path: &'a str) -> Option<Option<&'a str>> {
        let segs = Segments::new(path);
        self.match_at(&segs).map(|cap| cap.map(|i| segs.get(i)))
    }

    /// Does a path, already split, match? (The request path is split once and matched against
    /// every route and rule.)
    pub fn matches_segments(&self, segs: &Segments) -> bool {
        self.match_at(segs).is_some()
    }

    /// The matcher: `**` backtracks to its last position only, so this runs in
    /// O(segments x pattern length) whatever the input, with no allocation. On a match, returns
    /// the index of the captured segment, if any.
    fn match_at(&self, segs: &Segments) -> Option<Option<usize>> {
        let n = segs.len();
        let mut p = 0; // index into the pattern
        let mut s = 0; // index into the path's segments
        let mut star: Option<(usize, usize)> = None; // (pattern index after **, resume segment)
        let mut capture = None;
        loop {
            if let Some(at) = self.segs.get(p) {
                if matches!(at, Seg::Any) {
                    if p + 1 == self.segs.len() {
                        // a last `**` takes whatever is left
                        return Some(capture);
                    }
                    star = Some((p + 1, s));
                    p += 1;
                    continue;
                }
                if s < n {
                    let seg = segs.bytes(s);
                    let ok = match at {
                        Seg::Literal(l) => l.as_bytes() == seg,
                        Seg::One | Seg::Capture => !seg.is_empty(),
                        Seg::Any => false,
                    };
                    if ok {
                        if matches!(at, Seg::Capture) {
                            capture = Some(s);
                        }
                        p += 1;
                        s += 1;
                        continue;
                    }
                }
            } else if s >= n {
                return Some(capture);
            }
            // mismatch: let the last `**` swallow one more segment
            match star {
                Some((sp, ss)) if ss < n => {
                    star = Some((sp, ss + 1));
                    p = sp;
                    s = ss + 1;
                }
                _ => return None,
            }
        }
    }
}

/// A normalized path split into segments (`/` alone has none), kept inline for short paths.
pub struct Segments<'a> {
    path: &'a str,
    bounds: SmallVec<[(u32, u32); 12]>,
}

impl<'a> Segments<'a> {
    pub fn new(path: &'a str) -> Self {
        let bytes = path.as_bytes();
        let mut bounds = SmallVec::new();
        let mut start = usize::from(bytes.first() == Some(&b'/'));
        if start < bytes.len() {
            for (i, &b) in bytes.iter().enumerate().skip(start) {
                if b == b'/' {
                    bounds.push((start as u32, i as u32));
                    start = i + 1;
                }
            }
            bounds.push((start as u32, bytes.len() as u32));
        }
        Segments { path, bounds }
    }

    pub fn len(&self) -> usize {
        self.bounds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bounds.is_empty()
    }

    pub fn get(&self, i: usize) -> &'a str {
        let (a, b) = self.bounds[i];
        &self.path[a as usize..b as usize]
    }

    /// Segment `i`'s bytes (no char boundary to check: the bounds are at `/`s).
    fn bytes(&self, i: usize) -> &'a [u8] {
        let (a, b) = self.bounds[i];
        self.path
            .as_bytes()
            .get(a as usize..b as usize)
            .unwrap_or_default()
    }

    pub fn path(&self) -> &'a str {
        self.path
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn patterns_overlap_when_one_path_can_match_both() {
        let p = |s: &str| PathPattern::compile(s).unwrap();
        let yes = [
            ("/v1/**", "/v1/orders/*"),
            ("/**", "/x"),
            ("/v1/*/product/*", "/v1/acme/**"),
            ("/a/**/z", "/a/b/c/z"),
            ("/{tenant}/x", "/acme/*"),
            ("/v1", "/v1/**"),
        ];
        for (a, b) in yes {
            assert!(p(a).overlaps(&p(b)) && p(b).overlaps(&p(a)), "{a} {b}");
        }
        let no = [
            ("/v1/**", "/v2/**"),
            ("/a/*", "/a"),
            ("/a/*/c", "/a/b/d"),
            ("/x/y", "/x"),
        ];
        for (a, b) in no {
            assert!(!p(a).overlaps(&p(b)) && !p(b).overlaps(&p(a)), "{a} {b}");
        }
    }

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

#[cfg(test)]
mod proptests {
    use super::*;
    use proptest::prelude::*;

    /// A naive reference: recursive matching over segment lists.
    fn reference(pat: &[&str], path: &[&str]) -> bool {
        match pat.split_first() {
            None => path.is_empty(),
            Some((&"**", rest)) => (0..=path.len()).any(|i| reference(rest, &path[i..])),
            Some((p, rest)) => match path.split_first() {
                Some((s, prest)) => {
                    (*p == "*" || *p == "{tenant}" || p == s)
                        && !s.is_empty()
                        && reference(rest, prest)
                }
                None => false,
            },
        }
    }

    fn seg() -> impl Strategy<Value = &'static str> {
        prop_oneof![Just("a"), Just("b"), Just("c")]
    }

    fn pat_seg() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            Just("a"),
            Just("b"),
            Just("*"),
            Just("**"),
            Just("{tenant}")
        ]
    }

    proptest! {
        #[test]
        fn agrees_with_reference(pat in proptest::collection::vec(pat_seg(), 0..6),
                                 path in proptest::collection::vec(seg(), 0..8)) {
            if pat.iter().filter(|s| **s == "{tenant}").count() > 1 {
                return Ok(());
            }
            let text = format!("/{}", pat.join("/"));
            let compiled = PathPattern::compile(&text).unwrap();
            let p = format!("/{}", path.join("/"));
            prop_assert_eq!(compiled.matches(&p), reference(&pat, &path), "{} vs {}", text, p);
        }
    }
}
