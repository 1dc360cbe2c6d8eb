//! Configuration errors: always `FILE:LINE:COLUMN: message`, naming the field and what would
//! be accepted.

use std::fmt;
use std::path::{Path, PathBuf};

/// A position in a config file (1-based line and column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pos {
    pub line: usize,
    pub column: usize,
}

/// One configuration error, located in a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    pub pos: Pos,
    pub message: String,
}

impl ConfigError {
    pub fn new(file: &Path, pos: Pos, message: impl Into<String>) -> Self {
        ConfigError {
            file: file.to_path_buf(),
            pos,
            message: message.into(),
        }
    }

    /// An error about the file as a whole (cannot be read), reported at 1:1.
    pub fn whole_file(file: &Path, message: impl Into<String>) -> Self {
        Self::new(file, Pos { line: 1, column: 1 }, message)
    }

    /// Convert a serde_yaml error (syntax, type, unknown field...) into a located error.
    pub fn from_yaml(file: &Path, err: &serde_yaml::Error) -> Self {
        let pos = err
            .location()
            .map(|l| Pos {
                line: l.line(),
                column: l.column(),
            })
            .unwrap_or(Pos { line: 1, column: 1 });
        // serde_yaml appends " at line L column C"; the position is already in front.
        let text = err.to_string();
        let message = match text.rfind(" at line ") {
            Some(i) => text[..i].to_string(),
            None => text,
        };
        Self::new(file, pos, message)
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file.display(),
            self.pos.line,
            self.pos.column,
            self.message
        )
    }
}

/// Every error found in one load (a file with several mistakes reports all it can).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        ConfigErrors(vec![e])
    }
}
