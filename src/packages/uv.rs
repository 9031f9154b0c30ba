//! Which uv installs Python packages: the operator's `--uv`, else the one beside the
//! sessions' Python, else one on PATH that is a real program (not a version manager's
//! shim); found once, at the first installation, and placed where the installer's uid can
//! run it when the server is root.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::Packages;
use super::answer::ProgramError;
use super::tree::own_dir;

impl Packages {
    /// The installer program (see `uv`), resolved at the first call with the sessions'
    /// Python (the real executable, as detected).
    pub(super) async fn uv(&self, python: &Path) -> Result<PathBuf, ProgramError> {
        let r = self
            .uv
            .get_or_init(|| {
                let (flag, python, root) = (
                    self.uv_flag.clone(),
                    python.to_path_buf(),
                    self.root.clone(),
                );
                let as_root = self.sandbox.root;
                async move {
                    tokio::task::spawn_blocking(move || resolve_uv(flag, &python, &root, as_root))
                        .await
                        .unwrap_or_else(|e| {
                            Err(ProgramError::Lookup {
                                what: "uv",
                                why: e.to_string(),
                            })
                        })
                }
            })
            .await;
        r.clone()
    }
}

/// The operator's `--uv` must be a program: a typo stops the server at once.
pub(super) fn check_flag(flag: Option<&Path>) -> anyhow::Result<()> {
    if let Some(f) = flag {
        real_program(f)
            .ok_or_else(|| anyhow::anyhow!("--uv {}: not an executable program", f.display()))?;
    }
    Ok(())
}

/// The uv an installation runs, as [`Packages::uv`] says; staged where the installer's
/// uid can run it when the server is root and it lies where other users cannot reach.
fn resolve_uv(
    flag: Option<PathBuf>,
    python: &Path,
    root: &Path,
    as_root: bool,
) -> Result<PathBuf, ProgramError> {
    let uv = find_uv(flag.as_deref(), python).ok_or(ProgramError::NoUv)?;
    if !as_root || crate::sandbox::reachable_by_others(&uv) {
        return Ok(uv);
    }
    let staged = stage_uv(&uv, root).map_err(|e| ProgramError::UvNotPlaced {
        uv: uv.clone(),
        root: root.to_path_buf(),
        why: std::sync::Arc::new(e),
    })?;
    tracing::info!(uv = %uv.display(), staged = %staged.display(), "packages: installer placed");
    Ok(staged)
}

/// `p` with links resolved, when it is a regular file and not a script.
fn real_program(p: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(p)
        .ok()
        .filter(|r| r.is_file() && !is_script(r))
}

/// The real uv program (links and shims resolved): `flag`, else the one installed beside
/// `python` (its path or the file it links to), else the first on PATH that is a real
/// program, not a version manager's shim (a script that runs whatever the manager picks,
/// and that a confined uid may not reach), else the one the `uv` package of the first
/// `python3` on PATH names (pyenv's, whose `uv` on PATH is a shim).
fn find_uv(flag: Option<&Path>, python: &Path) -> Option<PathBuf> {
    if let Some(f) = flag {
        return real_program(f);
    }
    let mut dirs: Vec<PathBuf> = python.parent().map(Path::to_path_buf).into_iter().collect();
    if let Ok(r) = std::fs::canonicalize(python) {
        dirs.extend(r.parent().map(Path::to_path_buf));
    }
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path).filter(|d| !d.ends_with("shims")));
    }
    if let Some(uv) = dirs.iter().find_map(|d| real_program(&d.join("uv"))) {
        return Some(uv);
    }
    let out = std::process::Command::new("python3")
        .args(["-c", "import uv; print(uv.find_uv_bin())"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let named = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !named.is_empty())
        .then(|| real_program(Path::new(&named)))
        .flatten()
}

/// Whether `p` starts with `#!` (a shim, not the program).
fn is_script(p: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 2];
    std::fs::File::open(p)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| &head == b"#!")
}

/// Put the operator's `uv` where the installer's uid can run it: `ROOT/installer/uv`, the
/// server's (root's) and read-only to others, a hard link to it (a copy across file
/// systems). Used when it lies under a directory other users cannot enter (pyenv under a
/// 0700 /root): the installer's uid is such a user, and at levels without a mount namespace
/// nothing can show it the original.
fn stage_uv(uv: &Path, root: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let dir = root.join("installer");
    own_dir(&dir, 0o755, None)?;
    let target = dir.join("uv");
    let src = std::fs::metadata(uv)?;
    // Root's and 0755 (never writable by the installer's uid, which runs it).
    let sound = |m: &std::fs::Metadata| m.is_file() && m.uid() == 0 && m.mode() & 0o7777 == 0o755;
    if let Ok(t) = std::fs::symlink_metadata(&target)
        && sound(&t)
        && ((t.dev(), t.ino()) == (src.dev(), src.ino())
            || (t.len() == src.len() && t.mtime() == src.mtime()))
    {
        return Ok(target);
    }
    let tmp = dir.join(format!("uv.{}", uuid::Uuid::new_v4().simple()));
    let _ = std::fs::remove_file(&tmp);
    if std::fs::hard_link(uv, &tmp).is_err() || !sound(&std::fs::symlink_metadata(&tmp)?) {
        let _ = std::fs::remove_file(&tmp);
        std::fs::copy(uv, &tmp)?;
        let f = std::fs::File::open(&tmp)?;
        f.set_modified(src.modified()?)?;
        std::os::unix::fs::lchown(&tmp, Some(0), Some(0))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    }
    std::fs::rename(&tmp, &target)?;
    Ok(target)
}
