//! The isolation levels and what the operator asks for. A leaf: it imports nothing of the
//! crate, so the configuration can name levels without depending on the sandbox itself.

use schemars::JsonSchema;
use serde::Serialize;

/// The isolation level in force (reported in every result).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    None,
    Landlock,
    Bwrap,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::None => "none",
            Level::Landlock => "landlock",
            Level::Bwrap => "bwrap",
        }
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the operator asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Auto,
    Bwrap,
    Landlock,
    None,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_ordered() {
        assert!(Level::Bwrap > Level::Landlock && Level::Landlock > Level::None);
    }
}
