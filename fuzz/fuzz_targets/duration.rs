//! Durations as written in config files.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let _ = tollgate::config::duration::parse_duration(text);
});
