//! Python virtual environments a caller names (`venv`, or a `.venv` in a session's `cwd`).
//!
//! A venv is a caller path, so everything here runs as the lease's uid (through
//! [`hostfs::as_uid`]) and nothing is ever run: the directory is decided by the one policy
//! for a caller's directories ([`hostfs::check_caller_dir`]), must look like a venv (`pyvenv.cfg`,
//! `bin/python`), its version is read from `pyvenv.cfg`, and `bin/python` is followed link
//! by link, as that uid, to the interpreter it runs. That interpreter must be one the
//! operator's own Python already makes visible (a trusted prefix), or pass the same policy
//! (no system directory, no masked tree unless allowed) and be executable by the uid. The
//! venv's `python` is user code: only the confined child, as the lease's uid, runs it.
//! `home` in `pyvenv.cfg` is read by that python alone, never by the server.

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType};

use crate::hostfs::{self, CwdPolicy};

/// Links followed from `bin/python` before giving up.
const MAX_HOPS: usize = 32;
/// The most of `pyvenv.cfg` read.
const MAX_CFG: u64 = 64 * 1024;

/// An accepted virtual environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Venv {
    /// Its directory (canonical).
    pub root: PathBuf,
    /// `<root>/bin/python`: what the child executes (not resolved: Python finds its
    /// `pyvenv.cfg` beside the path it was started as).
    pub python: PathBuf,
    /// From `pyvenv.cfg` (`version` or `version_info`), or `unknown`.
    pub version: String,
    /// The interpreter `bin/python` leads to: a real file, or a path inside a trusted prefix.
    pub base: PathBuf,
    /// Directories the child must be able to read: the venv, and the base interpreter's
    /// installation when the level would hide it.
    pub expose: Vec<PathBuf>,
}

/// What the check needs to know, all from the operator.
#[derive(Debug, Clone, Default)]
pub struct VenvPolicy {
    /// The policy of a caller's directories (masks, `--allow-cwd`, the workspace).
    pub dirs: CwdPolicy,
    /// Installation prefixes of the operator's own interpreters that sessions already see
    /// (pyenv under a masked /root at level bwrap): a venv made from one may use it.
    pub trusted: Vec<PathBuf>,
}

/// Decide the venv `requested`, run as the lease's uid; `uid` only names the user in
/// messages.
pub fn inspect(policy: &VenvPolicy, requested: &Path, uid: Option<u32>) -> Result<Venv, String> {
    let dir = hostfs::check_caller_dir(&policy.dirs, requested, uid, "venv")?;
    let shown = format!("venv {}", requested.display());
    let not_venv = |what: &str| {
        format!(
            "{shown} is not a Python virtual environment: {what}. Give the directory made by \
`python3 -m venv DIR` (or uv, virtualenv), the one holding pyvenv.cfg and bin/python"
        )
    };
    let walk = hostfs::Walk::default();
    let mut cfg = match hostfs::open_beneath(dir.dir.as_fd(), &["pyvenv.cfg"], &walk) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(not_venv("it has no pyvenv.cfg"));
        }
        Err(e) => return Err(format!("{shown}: cannot read its pyvenv.cfg: {e}")),
    };
    let mut text = Vec::new();
    (&mut cfg)
        .take(MAX_CFG)
        .read_to_end(&mut text)
        .map_err(|e| format!("{shown}: cannot read its pyvenv.cfg: {e}"))?;
    let version = version_of(&String::from_utf8_lossy(&text));
    let bin = hostfs::open_subdir(dir.dir.as_fd(), "bin", &walk)
        .map_err(|e| not_venv(&format!("no bin/ directory ({e})")))?;
    match rustix::fs::statat(&bin, "python", AtFlags::SYMLINK_NOFOLLOW) {
        Ok(_) => {}
        Err(rustix::io::Errno::NOENT) => return Err(not_venv("it has no bin/python")),
        Err(e) => return Err(format!("{shown}: bin/python: {e}")),
    }
    let python = dir.path.join("bin").join("python");
    let user = hostfs::user_name(uid);
    let (base, trusted) = follow(policy, &python, &shown, &user)?;
    let mut expose = vec![dir.path.clone()];
    match trusted {
        Some(prefix) => expose.push(prefix),
        None => expose.extend(installation(policy, &base)),
    }
    Ok(Venv {
        root: dir.path,
        python,
        version,
        base,
        expose,
    })
}

/// The version `pyvenv.cfg` states (`version` from venv, `version_info` from uv and
/// virtualenv), reduced to a short plain string.
fn version_of(cfg: &str) -> String {
    let mut found = None;
    for line in cfg.lines() {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let k = k.trim().to_ascii_lowercase();
        if k == "version" || (k == "version_info" && found.is_none()) {
            found = Some(v.trim().to_string());
        }
    }
    match found {
        Some(v)
            if !v.is_empty()
                && v.len() <= 40
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-')) =>
        {
            v
        }
        _ => "unknown".into(),
    }
}

/// Follow `bin/python` as the calling thread's user, one link at a time, to the interpreter
/// it runs: a path inside a trusted prefix (returned with it), or a real executable file
/// that passes the policy.
fn follow(
    policy: &VenvPolicy,
    python: &Path,
    shown: &str,
    user: &str,
) -> Result<(PathBuf, Option<PathBuf>), String> {
    let unreachable = |p: &Path| {
        let blocked = hostfs::first_unsearchable(p);
        format!(
            "{shown}: bin/python leads to {}, which {user} cannot reach: {} is not searchable \
by that user on this host. Create the environment from a Python that user can run (for example \
`/usr/bin/python3 -m venv DIR`), or give the directories on the way search permission for others",
            p.display(),
            blocked.display()
        )
    };
    let mut p = python.to_path_buf();
    for _ in 0..MAX_HOPS {
        if let Some(t) = policy.trusted.iter().find(|t| p.starts_with(t)) {
            return Ok((p, Some(t.clone())));
        }
        let st = match rustix::fs::statat(rustix::fs::CWD, &p, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::ACCESS) => return Err(unreachable(&p)),
            Err(rustix::io::Errno::NOENT) => {
                return Err(format!(
                    "{shown}: bin/python leads to {}, which does not exist: the environment's \
Python was moved or removed; recreate the environment",
                    p.display()
                ));
            }
            Err(e) => return Err(format!("{shown}: {}: {e}", p.display())),
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(rustix::fs::CWD, &p, Vec::new())
                    .map_err(|e| format!("{shown}: {}: {e}", p.display()))?;
                let target = PathBuf::from(std::ffi::OsStr::from_bytes(target.as_bytes()));
                let parent = p.parent().unwrap_or(Path::new("/"));
                let parent = std::fs::canonicalize(parent).map_err(|e| {
                    if e.raw_os_error() == Some(libc::EACCES) {
                        unreachable(&p)
                    } else {
                        format!("{shown}: {}: {e}", p.display())
                    }
                })?;
                p = hostfs::lexical(&parent.join(target));
            }
            FileType::RegularFile => return base(policy, &p, shown, user).map(|b| (b, None)),
            _ => {
                return Err(format!(
                    "{shown}: bin/python leads to {}, which is not a file",
                    p.display()
                ));
            }
        }
    }
    Err(format!(
        "{shown}: bin/python goes through more than {MAX_HOPS} links"
    ))
}

/// Check the real interpreter file `p` a venv leads to (outside every trusted prefix).
fn base(policy: &VenvPolicy, p: &Path, shown: &str, user: &str) -> Result<PathBuf, String> {
    let real = std::fs::canonicalize(p).map_err(|e| format!("{shown}: {}: {e}", p.display()))?;
    let name = real
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !looks_like_python(&name) {
        return Err(format!(
            "{shown}: bin/python leads to {}, which is not a Python interpreter; recreate the \
environment with `python3 -m venv DIR`",
            real.display()
        ));
    }
    let dir = real.parent().unwrap_or(Path::new("/"));
    let what = format!("{shown}: its interpreter");
    policy.dirs.refuse(dir, &real, &what)?;
    if rustix::fs::accessat(
        rustix::fs::CWD,
        &real,
        rustix::fs::Access::EXEC_OK,
        AtFlags::EACCESS,
    )
    .is_err()
    {
        return Err(format!(
            "{what} {} is not executable by {user}; create the environment from a Python that \
user can run (for example `/usr/bin/python3 -m venv DIR`)",
            real.display()
        ));
    }
    Ok(real)
}

/// `python`, `python3`, `python3.12`, `pypy3`, `python3.13t`, `python3.11-dbg`, …
fn looks_like_python(name: &str) -> bool {
    let rest = name
        .strip_prefix("python")
        .or_else(|| name.strip_prefix("pypy"));
    rest.is_some_and(|r| {
        r.chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | 't' | 'd' | 'm' | '-' | 'b' | 'g'))
    })
}

/// The installation of a base interpreter outside the trusted prefixes that the level would
/// hide (it lies in a masked tree the operator allowed): `<prefix>` for `<prefix>/bin/x`,
/// else its directory; the first of these the policy accepts.
fn installation(policy: &VenvPolicy, base: &Path) -> Vec<PathBuf> {
    if !policy.dirs.masked.iter().any(|m| base.starts_with(m)) {
        return Vec::new();
    }
    let Some(dir) = base.parent() else {
        return Vec::new();
    };
    let prefix = (dir.file_name().is_some_and(|n| n == "bin"))
        .then(|| dir.parent())
        .flatten();
    prefix
        .into_iter()
        .chain([dir])
        .find(|d| policy.dirs.refuse(d, d, "venv").is_ok())
        .map(|d| vec![d.to_path_buf()])
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_read_not_run() {
        assert_eq!(version_of("home = /usr/bin\nversion = 3.11.2\n"), "3.11.2");
        assert_eq!(
            version_of("home = /x\nversion_info = 3.12.1.final.0\n"),
            "3.12.1.final.0"
        );
        assert_eq!(
            version_of("version_info = 3.12.1\nversion = 3.12.2\n"),
            "3.12.2"
        );
        assert_eq!(version_of("home = /usr/bin\n"), "unknown");
        assert_eq!(version_of("version = $(rm -rf /)\n"), "unknown");
        assert_eq!(
            version_of(&format!("version = {}\n", "9".repeat(100))),
            "unknown"
        );
    }

    #[test]
    fn python_names() {
        for ok in [
            "python",
            "python3",
            "python3.11",
            "pypy3",
            "python3.13t",
            "python3.11-dbg",
        ] {
            assert!(looks_like_python(ok), "{ok}");
        }
        for no in [
            "sh",
            "dash",
            "bash",
            "python3;rm",
            "replbox",
            "pythonista",
            "",
        ] {
            assert!(!looks_like_python(no), "{no}");
        }
    }
}
