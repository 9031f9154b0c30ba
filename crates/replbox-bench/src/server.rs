//! The replbox binary measured: where it is, and what it says it is.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::process::Command;

/// Where the server is looked for when neither `--server` is given nor a `replbox` sits
/// beside this program.
pub const DEFAULT: &str = "target/release/replbox";

pub struct Server {
    /// Absolute path of the binary.
    pub path: PathBuf,
    /// The version it prints.
    pub version: String,
    /// `release` or `debug` when it lies in a cargo profile directory of that name,
    /// `unknown` otherwise.
    pub build: &'static str,
    /// The helper its children run under, found as the server finds it.
    pub helper: PathBuf,
}

impl Server {
    /// The binary given with `--server`, else `replbox` beside this program, else
    /// [`DEFAULT`]; it must run and call itself replbox.
    pub async fn find(explicit: Option<&Path>) -> Result<Self> {
        let path = match explicit {
            Some(p) => p.to_path_buf(),
            None => std::env::current_exe()
                .ok()
                .and_then(|me| Some(me.parent()?.join("replbox")))
                .filter(|p| is_executable(p))
                .unwrap_or_else(|| PathBuf::from(DEFAULT)),
        };
        if !is_executable(&path) {
            bail!(
                "no replbox binary at {}: build it (cargo build --release) or give --server PATH",
                path.display()
            );
        }
        let path = std::fs::canonicalize(&path)
            .with_context(|| format!("cannot resolve {}", path.display()))?;
        let version = version_of(&path).await?;
        let helper = helper_of(&path);
        Ok(Self {
            build: build_of(&path),
            path,
            version,
            helper,
        })
    }
}

/// `replbox --version` prints `replbox X.Y.Z`.
async fn version_of(path: &Path) -> Result<String> {
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        Command::new(path)
            .arg("--version")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .with_context(|| format!("{} --version did not answer", path.display()))?
    .with_context(|| format!("cannot run {}", path.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.trim().strip_prefix("replbox ") {
        Some(v) if out.status.success() => Ok(v.to_string()),
        _ => bail!(
            "{} is not a replbox binary (--version printed {:?})",
            path.display(),
            text.trim()
        ),
    }
}

/// The profile cargo built `path` with, from the directory it lies in.
fn build_of(path: &Path) -> &'static str {
    match path
        .parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
    {
        Some("release") => "release",
        Some("debug") => "debug",
        _ => "unknown",
    }
}

/// As the server picks it: `REPLBOX_HELPER` (which the servers the bench starts inherit),
/// else the helper binary beside the server (which does not start without it).
fn helper_of(server: &Path) -> PathBuf {
    if let Some(p) = std::env::var_os("REPLBOX_HELPER") {
        return PathBuf::from(p);
    }
    server
        .parent()
        .map(|dir| dir.join(replbox::api::HELPER_BIN))
        .unwrap_or_else(|| PathBuf::from(replbox::api::HELPER_BIN))
}

fn is_executable(p: &Path) -> bool {
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_comes_from_the_profile_directory() {
        assert_eq!(build_of(Path::new("/x/target/release/replbox")), "release");
        assert_eq!(build_of(Path::new("/x/target/debug/replbox")), "debug");
        assert_eq!(build_of(Path::new("/usr/local/bin/replbox")), "unknown");
        assert_eq!(build_of(Path::new("replbox")), "unknown");
    }

    #[tokio::test]
    async fn a_missing_or_foreign_binary_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("replbox");
        let e = Server::find(Some(&missing)).await.err().expect("refused");
        assert!(e.to_string().contains("--server PATH"), "{e:#}");
        // An executable that is not replbox.
        let e = Server::find(Some(Path::new("/bin/true")))
            .await
            .err()
            .expect("refused");
        assert!(e.to_string().contains("not a replbox binary"), "{e:#}");
    }
}
