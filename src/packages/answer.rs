//! What the service answers: an installation's result ([`Installed`], the `packages` of a
//! run's or session's result) and why packages could not be had ([`PackageError`], and
//! [`ProgramError`] when the installer program itself is missing), each error with its
//! `ToolError` kind. The words every caller and operator reads, in one place.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::Serialize;

use super::spec;

/// One package installed, with its version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Package {
    pub name: String,
    pub version: String,
}

/// What an installation did (the `packages` of a result).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Installed {
    /// Packages added to the environment (dependencies included), with their versions.
    pub installed: Vec<Package>,
    /// How many the installer had to download (0: all from the server's shared cache).
    pub downloaded: u32,
    pub duration_ms: u64,
    /// What installs the same again, as the installer takes it: every package's exact
    /// version for Python (`name==version`), the requested packages' for npm
    /// (`name@version`; npm resolves their dependencies, which may nest other versions).
    #[serde(skip)]
    pub pins: Vec<String>,
    /// Packages built from source (sdists) for this installation, where the operator
    /// allows it (`--package-builds`); absent when none was.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub built: Vec<Package>,
}

impl Installed {
    /// One line for a result's text.
    pub fn line(&self) -> String {
        let names: Vec<String> = self
            .installed
            .iter()
            .map(|p| format!("{}=={}", p.name, p.version))
            .collect();
        let what = if names.is_empty() {
            "nothing new (already installed)".to_string()
        } else {
            names.join(", ")
        };
        let mut from = match self.downloaded {
            0 => "all from the cache".to_string(),
            n => format!("{n} downloaded"),
        };
        if !self.built.is_empty() {
            let built: Vec<String> = self
                .built
                .iter()
                .map(|p| format!("{}=={}", p.name, p.version))
                .collect();
            from.push_str(&format!("; built from source: {}", built.join(", ")));
        }
        format!("packages: {what} in {} ms ({from})", self.duration_ms)
    }
}

/// Why packages could not be had.
#[derive(Debug, Clone)]
pub enum PackageError {
    /// The request cannot be taken (a specifier, a language without packages, the feature
    /// turned off): the caller's to fix.
    Refused(String),
    /// A package cannot be had from the index, or the installer failed (named, with why).
    Failed(String),
}

impl PackageError {
    pub fn message(&self) -> &str {
        match self {
            Self::Refused(m) | Self::Failed(m) => m,
        }
    }
}

impl From<spec::SpecError> for PackageError {
    fn from(e: spec::SpecError) -> Self {
        Self::Refused(e.to_string())
    }
}

/// Why the installer program (uv, or npm's `npm-cli.js`) cannot be had: the operator's to
/// fix. Cloned out of the once-resolved cell each installation reads.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProgramError {
    #[error(
        "packages: the installer (uv) is not installed on this server; its operator can \
         install it (pip install uv) or name it with --uv"
    )]
    NoUv,
    #[error(
        "packages: the installer {} is not reachable by the installer's uid and cannot be \
         placed in {}: {why}",
        uv.display(),
        root.display()
    )]
    UvNotPlaced {
        uv: PathBuf,
        root: PathBuf,
        why: std::sync::Arc<std::io::Error>,
    },
    #[error(
        "packages: npm is not installed beside node on this server; its \
         operator can install it or name its npm-cli.js with --npm"
    )]
    NoNpm,
    #[error(
        "packages: npm ({}) is not reachable by the installer's uid; \
         its operator can name one that is with --npm",
        .0.display()
    )]
    NpmUnreachable(PathBuf),
    /// The blocking task that looked for it did not finish (a panic, the runtime ending).
    #[error("packages: finding {what} failed: {why}")]
    Lookup { what: &'static str, why: String },
}

impl From<ProgramError> for PackageError {
    fn from(e: ProgramError) -> Self {
        Self::Failed(e.to_string())
    }
}

/// A package request: refused (nothing of it was started), or a package that cannot be had.
impl From<PackageError> for crate::error::ToolError {
    fn from(e: PackageError) -> Self {
        match e {
            PackageError::Refused(m) => Self::invalid(m),
            PackageError::Failed(m) => Self::new(crate::error::ErrorKind::PackageUnavailable, m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_errors_are_pinned() {
        assert_eq!(
            ProgramError::NoUv.to_string(),
            "packages: the installer (uv) is not installed on this server; its operator can \
             install it (pip install uv) or name it with --uv"
        );
        assert_eq!(
            ProgramError::NpmUnreachable("/x/npm-cli.js".into()).to_string(),
            "packages: npm (/x/npm-cli.js) is not reachable by the installer's uid; its \
             operator can name one that is with --npm"
        );
    }
}
