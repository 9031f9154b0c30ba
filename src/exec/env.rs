//! Child environments are built from an allowlist, never inherited: a secret in the server's
//! environment must not reach user code.

use std::path::Path;

/// Variables every child gets, whatever the language.
pub fn base_env(home: &Path, term: &str) -> Vec<(String, String)> {
    vec![
        ("PATH".into(), server_path()),
        ("HOME".into(), home.display().to_string()),
        ("LANG".into(), "C.UTF-8".into()),
        ("LC_ALL".into(), "C.UTF-8".into()),
        ("TERM".into(), term.into()),
    ]
}

/// The PATH children search: the server's own (it holds no secrets and is how the operator
/// chose interpreters), or a sane default.
pub fn server_path() -> String {
    std::env::var("PATH")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into())
}

/// Environment for version probes at start-up. These run the operator's own tools, not
/// user code, so toolchain managers (rustup, pyenv) get the variables they need to work.
pub fn probe_env() -> Vec<(String, String)> {
    let home = std::env::var_os("HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let mut env = base_env(&home, "dumb");
    for key in [
        "RUSTUP_HOME",
        "CARGO_HOME",
        "RUSTUP_TOOLCHAIN",
        "PYENV_ROOT",
        "PYENV_VERSION",
    ] {
        if let Ok(v) = std::env::var(key) {
            env.push((key.to_string(), v));
        }
    }
    env
}

/// Set `key` in `env`, replacing an earlier value (later layers win).
pub fn set(env: &mut Vec<(String, String)>, key: &str, value: String) {
    if let Some(slot) = env.iter_mut().find(|(k, _)| k == key) {
        slot.1 = value;
    } else {
        env.push((key.to_string(), value));
    }
}

/// A caller's environment variable refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error(
        "invalid environment variable name {name:?}: names must be non-empty and contain neither '=' nor NUL"
    )]
    Name { name: String },
    #[error("environment variable {name} contains a NUL byte")]
    Nul { name: String },
}

/// Check a caller-supplied variable name: what the user may set must be a valid name.
pub fn validate_name(name: &str) -> Result<(), EnvError> {
    if name.is_empty() || name.contains('=') || name.contains('\0') {
        return Err(EnvError::Name { name: name.into() });
    }
    Ok(())
}

pub fn validate_value(name: &str, value: &str) -> Result<(), EnvError> {
    if value.contains('\0') {
        return Err(EnvError::Nul { name: name.into() });
    }
    Ok(())
}

/// A variable refused: the caller's to fix.
impl From<EnvError> for crate::error::ToolError {
    fn from(e: EnvError) -> Self {
        Self::invalid(e.to_string())
    }
}
