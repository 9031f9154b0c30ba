//! replbox installed as a Python package (a wheel: `pip install`, `uvx`, `pipx`). Both
//! binaries then sit in the `bin/` of a Python virtual environment, next to that
//! environment's own `python3`. A launcher such as `uvx` puts that `bin/` first on PATH
//! without activating the environment, and replbox would take its own install's Python
//! (no packages of the user's; in `uvx`'s case inside a cache directory) for every Python
//! run and session. So that directory is dropped from PATH at start, unless it is the
//! environment the user activated (`VIRTUAL_ENV`): that one is theirs.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

/// PATH without the `bin/` of the Python environment replbox runs from (`exe`), when
/// that environment is not the active one; `None` when nothing needs to change.
pub fn path_without_own_env(
    path: &OsStr,
    exe: &Path,
    virtual_env: Option<&OsStr>,
) -> Option<OsString> {
    let bin = exe.parent()?;
    let env_root = bin.parent()?;
    if !env_root.join("pyvenv.cfg").is_file() {
        return None;
    }
    let same = |a: &Path, b: &Path| {
        let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        canon(a) == canon(b)
    };
    if virtual_env.is_some_and(|v| !v.is_empty() && same(Path::new(v), env_root)) {
        return None;
    }
    let dirs: Vec<PathBuf> = std::env::split_paths(path).collect();
    let kept: Vec<&PathBuf> = dirs.iter().filter(|d| !same(d, bin)).collect();
    if kept.len() == dirs.len() {
        return None;
    }
    std::env::join_paths(kept).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn venv() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let t = tempfile::tempdir().expect("tempdir");
        let root = t.path().join("env");
        let bin = root.join("bin");
        std::fs::create_dir_all(&bin).expect("mkdir");
        std::fs::write(root.join("pyvenv.cfg"), "home = /usr/bin\n").expect("write");
        (t, root, bin)
    }

    fn path_of(dirs: &[&Path]) -> OsString {
        std::env::join_paths(dirs).expect("join")
    }

    #[test]
    fn a_launchers_environment_leaves_path() {
        let (_t, _root, bin) = venv();
        let path = path_of(&[&bin, Path::new("/usr/local/bin"), Path::new("/usr/bin")]);
        let new = path_without_own_env(&path, &bin.join("replbox"), None);
        assert_eq!(
            new,
            Some(path_of(&[
                Path::new("/usr/local/bin"),
                Path::new("/usr/bin")
            ]))
        );
        // Every occurrence, and a spelling that is the same directory.
        let dotted = bin.join("..").join("bin");
        let path = path_of(&[&dotted, Path::new("/usr/bin"), &bin]);
        let new = path_without_own_env(&path, &bin.join("replbox"), Some(OsStr::new("")));
        assert_eq!(new, Some(path_of(&[Path::new("/usr/bin")])));
    }

    #[test]
    fn the_activated_environment_stays() {
        let (_t, root, bin) = venv();
        let path = path_of(&[&bin, Path::new("/usr/bin")]);
        let exe = bin.join("replbox");
        assert_eq!(
            path_without_own_env(&path, &exe, Some(root.as_os_str())),
            None
        );
        // Another environment being active does not make this one the user's.
        let (_t2, other, _) = venv();
        assert!(path_without_own_env(&path, &exe, Some(other.as_os_str())).is_some());
    }

    #[test]
    fn outside_a_python_environment_nothing_changes() {
        let t = tempfile::tempdir().expect("tempdir");
        let bin = t.path().join("bin");
        std::fs::create_dir_all(&bin).expect("mkdir");
        let path = path_of(&[&bin, Path::new("/usr/bin")]);
        assert_eq!(
            path_without_own_env(&path, &bin.join("replbox"), None),
            None
        );
        // In an environment that is not on PATH, nothing to drop either.
        let (_t, _root, vbin) = venv();
        assert_eq!(
            path_without_own_env(&path, &vbin.join("replbox"), None),
            None
        );
    }
}
