//! Path normalization (idempotent) and glob matching on any request path and pattern.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tollgate::matching::{normalize_path, PathPattern, Segments};

fuzz_target!(|data: (&str, &str)| {
    let (pattern, path) = data;
    let once = normalize_path(path).into_owned();
    assert_eq!(normalize_path(&once), once.as_str());
    if let Ok(p) = PathPattern::compile(pattern) {
        let _ = p.matches(&once);
        let _ = p.match_capture(&once);
        let _ = p.matches_segments(&Segments::new(&once));
    }
});
