//! Configuration: the YAML file model (`file`), its validation (`validate`) into the running
//! model (`model`, with the TLS `certificates` it names and the `dns` lookups of upstream
//! servers given by name), with every error located (`error`, `locate`).

/// Calendar windows live in the limits core (`crates/limits`).
pub use tollgate_limits::calendar;
pub mod certificates;
pub mod defaults;
pub mod dns;
pub mod duration;
pub mod error;
pub mod file;
pub mod locate;
pub mod model;
pub mod redis_client;
pub mod summary;
pub mod validate;

pub use error::{ConfigError, ConfigErrors};
pub use model::Config;

use std::path::Path;

/// Read, parse and validate a config file and everything it includes.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::whole_file(path, format!("cannot read config file: {e}")))?;
    load_str(path, &text)
}

/// Parse and validate config text as if read from `path` (includes resolve against it).
pub fn load_str(path: &Path, text: &str) -> Result<Config, ConfigErrors> {
    let loc = locate::Locator::new(text);
    let duplicates = loc.duplicate_errors(path, "");
    if !duplicates.is_empty() {
        return Err(ConfigErrors(duplicates));
    }
    let model: file::FileConfig = serde_yaml::from_str(text).map_err(|e| {
        let mut err = ConfigError::from_yaml(path, &e);
        if let Some(hint) = loc.hint(&err.message, err.pos) {
            err.message = format!("{}; {hint}", err.message);
        }
        err
    })?;
    validate::validate(path, loc, model)
}
