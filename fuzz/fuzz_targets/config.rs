//! The config loader: any text gives a config or errors located in the file, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let path = std::path::Path::new("/nonexistent/fuzz.yaml");
        if let Err(errors) = tollgate::config::load_str(path, text) {
            for e in &errors.0 {
                assert!(e.pos.line >= 1 && e.pos.column >= 1);
            }
        }
    }
});
