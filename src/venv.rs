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

use std::collections::BTreeSet;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};

use crate::hostfs::{self, CwdPolicy, HostfsError};

/// Links followed from `bin/python` before giving up.
const MAX_HOPS: usize = 32;
/// The most of `pyvenv.cfg` read.
const MAX_CFG: u64 = 64 * 1024;

/// An accepted virtual environment.
#[derive(Debug, Clone)]
pub struct Venv {
    /// Its directory (canonical).
    pub root: PathBuf,
    /// Its handle (`O_PATH`), opened as the lease's uid when it was decided: what the
    /// sandbox binds and rules, whatever the path leads to later.
    pub dir: std::sync::Arc<OwnedFd>,
    /// `<root>/bin/python`: what the child executes (not resolved: Python finds its
    /// `pyvenv.cfg` beside the path it was started as).
    pub python: PathBuf,
    /// From `pyvenv.cfg` (`version` or `version_info`), or `unknown`.
    pub version: String,
    /// Directories the child must be able to read: the venv, and the base interpreter's
    /// installation when the level would hide it.
    pub expose: Vec<PathBuf>,
    /// Those of `expose` that are the caller's (the venv, an installation it leads to),
    /// with their handles opened as the lease's uid: the sandbox shows these, not what the
    /// paths lead to later.
    pub opened: Vec<(PathBuf, std::sync::Arc<OwnedFd>)>,
}

/// What the check needs to know, all from the operator.
#[derive(Debug, Clone, Default)]
pub struct VenvPolicy {
    /// The policy of a caller's directories (masks, `--allow-cwd`, the workspace).
    pub dirs: CwdPolicy,
    /// Installation prefixes of the operator's own interpreters that sessions already see
    /// (pyenv under a masked /root at level bwrap): a venv made from one may use it.
    pub trusted: Vec<PathBuf>,
    /// Trees the sandbox shows of the host (the system): an interpreter there needs nothing
    /// more to be seen.
    pub shown: Vec<PathBuf>,
}

/// Why a virtual environment is refused (or who made it could not be checked). `venv` is
/// the path as the caller gave it.
#[derive(Debug, thiserror::Error)]
pub enum VenvError {
    /// Refused by the policy of a caller's directories.
    #[error(transparent)]
    Path(#[from] HostfsError),
    #[error(
        "venv {venv} is not a Python virtual environment: {why}. Give the directory made by \
         `python3 -m venv DIR` (or uv, virtualenv), the one holding pyvenv.cfg and bin/python"
    )]
    NotVenv { venv: PathBuf, why: NotVenv },
    #[error("venv {venv}: cannot read its pyvenv.cfg: {source}")]
    Cfg {
        venv: PathBuf,
        source: std::io::Error,
    },
    #[error("venv {venv}: bin/python: {source}")]
    Python {
        venv: PathBuf,
        source: std::io::Error,
    },
    /// `bin/python` leads to `to`, which the session's user cannot reach (`blocked`).
    #[error(
        "venv {venv}: bin/python leads to {to}, which {user} cannot reach: {blocked} is not \
         searchable by that user on this host. Create the environment from a Python that user \
         can run (for example `/usr/bin/python3 -m venv DIR`), or give the directories on the \
         way search permission for others"
    )]
    Unreachable {
        venv: PathBuf,
        to: PathBuf,
        user: String,
        blocked: PathBuf,
    },
    #[error(
        "venv {venv}: bin/python leads to {to}, which does not exist: the environment's Python \
         was moved or removed; recreate the environment"
    )]
    Missing { venv: PathBuf, to: PathBuf },
    #[error("venv {venv}: {at}: {source}")]
    Io {
        venv: PathBuf,
        at: PathBuf,
        source: std::io::Error,
    },
    #[error("venv {venv}: bin/python leads to {to}, which is not a file")]
    NotFile { venv: PathBuf, to: PathBuf },
    #[error("venv {venv}: bin/python goes through more than {MAX_HOPS} links")]
    Hops { venv: PathBuf },
    #[error(
        "venv {venv}: bin/python leads to {to}, which is not a Python interpreter; recreate the \
         environment with `python3 -m venv DIR`"
    )]
    NotPython { venv: PathBuf, to: PathBuf },
    #[error(
        "venv {venv}: its interpreter {to} is not executable by {user}; create the environment \
         from a Python that user can run (for example `/usr/bin/python3 -m venv DIR`)"
    )]
    NotExecutable {
        venv: PathBuf,
        to: PathBuf,
        user: String,
    },
    /// Who made a `.venv` found in a cwd could not be checked ([`writers`]).
    #[error("cannot check {at}: {source}")]
    Check { at: PathBuf, source: std::io::Error },
    #[error("cannot read the ACL of {at}: {source}")]
    Acl { at: PathBuf, source: std::io::Error },
    #[error("it has more than {MAX_ENTRIES} entries, too many to check who made them")]
    TooManyEntries,
    #[error("it is more than {MAX_DEPTH} directories deep, too deep to check who made it")]
    TooDeep,
    #[error("{at} changed while it was checked")]
    Changed { at: PathBuf },
}

/// A virtual environment refused: the caller's to fix (another one, or none).
impl From<VenvError> for crate::error::ToolError {
    fn from(e: VenvError) -> Self {
        match e {
            VenvError::Path(e) => e.into(),
            e => crate::error::ToolError::invalid(e.to_string()),
        }
    }
}

/// What a directory that is not a virtual environment lacks.
#[derive(Debug, thiserror::Error)]
pub enum NotVenv {
    #[error("it has no pyvenv.cfg")]
    Cfg,
    #[error("no bin/ directory ({0})")]
    Bin(#[source] std::io::Error),
    #[error("it has no bin/python")]
    Python,
}

/// Decide the venv `requested`, run as the lease's uid; `uid` only names the user in
/// messages.
pub fn inspect(policy: &VenvPolicy, requested: &Path, uid: Option<u32>) -> Result<Venv, VenvError> {
    let dir = hostfs::check_caller_dir(&policy.dirs, requested, uid, "venv")?;
    let venv = || requested.to_path_buf();
    let not_venv = |why| VenvError::NotVenv { venv: venv(), why };
    let walk = hostfs::Walk::default();
    let mut cfg = match hostfs::open_beneath(dir.dir.as_fd(), &["pyvenv.cfg"], &walk) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(not_venv(NotVenv::Cfg));
        }
        Err(source) => {
            return Err(VenvError::Cfg {
                venv: venv(),
                source,
            });
        }
    };
    let mut text = Vec::new();
    (&mut cfg)
        .take(MAX_CFG)
        .read_to_end(&mut text)
        .map_err(|source| VenvError::Cfg {
            venv: venv(),
            source,
        })?;
    let version = version_of(&String::from_utf8_lossy(&text));
    let bin = hostfs::open_subdir(dir.dir.as_fd(), "bin", &walk)
        .map_err(|e| not_venv(NotVenv::Bin(e)))?;
    match rustix::fs::statat(&bin, "python", AtFlags::SYMLINK_NOFOLLOW) {
        Ok(_) => {}
        Err(rustix::io::Errno::NOENT) => return Err(not_venv(NotVenv::Python)),
        Err(e) => {
            return Err(VenvError::Python {
                venv: venv(),
                source: e.into(),
            });
        }
    }
    let python = dir.path.join("bin").join("python");
    let user = hostfs::user_name(uid);
    let (base, trusted) = follow(policy, &python, requested, &user)?;
    let root = std::sync::Arc::new(dir.dir);
    let mut expose = vec![dir.path.clone()];
    let mut opened = vec![(dir.path.clone(), root.clone())];
    match trusted {
        Some(prefix) => expose.push(prefix),
        None => {
            if let Some((p, fd)) = installation(policy, &base, uid) {
                expose.push(p.clone());
                opened.push((p, std::sync::Arc::new(fd)));
            }
        }
    }
    Ok(Venv {
        root: dir.path,
        dir: root,
        opened,
        python,
        version,
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
    venv: &Path,
    user: &str,
) -> Result<(PathBuf, Option<PathBuf>), VenvError> {
    let unreachable = |p: &Path| VenvError::Unreachable {
        venv: venv.into(),
        to: p.into(),
        user: user.into(),
        blocked: hostfs::first_unsearchable(p),
    };
    let io = |p: &Path, source: std::io::Error| VenvError::Io {
        venv: venv.into(),
        at: p.into(),
        source,
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
                return Err(VenvError::Missing {
                    venv: venv.into(),
                    to: p,
                });
            }
            Err(e) => return Err(io(&p, e.into())),
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(rustix::fs::CWD, &p, Vec::new())
                    .map_err(|e| io(&p, e.into()))?;
                let target = PathBuf::from(std::ffi::OsStr::from_bytes(target.as_bytes()));
                let parent = p.parent().unwrap_or(Path::new("/"));
                let parent = std::fs::canonicalize(parent).map_err(|e| {
                    if e.raw_os_error() == Some(libc::EACCES) {
                        unreachable(&p)
                    } else {
                        io(&p, e)
                    }
                })?;
                p = hostfs::lexical(&parent.join(target));
            }
            FileType::RegularFile => return base(policy, &p, venv, user).map(|b| (b, None)),
            _ => {
                return Err(VenvError::NotFile {
                    venv: venv.into(),
                    to: p,
                });
            }
        }
    }
    Err(VenvError::Hops { venv: venv.into() })
}

/// Check the real interpreter file `p` a venv leads to (outside every trusted prefix).
fn base(policy: &VenvPolicy, p: &Path, venv: &Path, user: &str) -> Result<PathBuf, VenvError> {
    let real = std::fs::canonicalize(p).map_err(|source| VenvError::Io {
        venv: venv.into(),
        at: p.into(),
        source,
    })?;
    let name = real
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !looks_like_python(&name) {
        return Err(VenvError::NotPython {
            venv: venv.into(),
            to: real,
        });
    }
    let dir = real.parent().unwrap_or(Path::new("/"));
    let what = format!("venv {}: its interpreter", venv.display());
    policy.dirs.refuse(dir, &real, &what)?;
    if rustix::fs::accessat(
        rustix::fs::CWD,
        &real,
        rustix::fs::Access::EXEC_OK,
        AtFlags::EACCESS,
    )
    .is_err()
    {
        return Err(VenvError::NotExecutable {
            venv: venv.into(),
            to: real,
            user: user.into(),
        });
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

/// The installation of a base interpreter outside the trusted prefixes that the sandbox does
/// not show (it lies outside the view: in a project, or a masked tree the operator allowed):
/// `<prefix>` for `<prefix>/bin/x`, else its directory; the first of these the policy
/// accepts, opened as the calling thread's user.
fn installation(policy: &VenvPolicy, base: &Path, uid: Option<u32>) -> Option<(PathBuf, OwnedFd)> {
    if policy.shown.iter().any(|t| base.starts_with(t)) {
        return None;
    }
    let dir = base.parent()?;
    let prefix = (dir.file_name().is_some_and(|n| n == "bin"))
        .then(|| dir.parent())
        .flatten();
    prefix
        .into_iter()
        .chain([dir])
        .find_map(|d| hostfs::check_caller_dir(&policy.dirs, d, uid, "venv").ok())
        .map(|c| (c.path, c.dir))
}

/// Who could have made, or could change, a `.venv` found in a session's cwd: the uids and
/// gids that own it or may write where it lies, or anyone.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Writers {
    pub uids: BTreeSet<u32>,
    pub gids: BTreeSet<u32>,
    /// Set when permissions let every user write there: which directory or file.
    pub anyone: Option<String>,
}

/// The most entries of a `.venv` looked at: a larger one is not taken from a cwd unasked.
const MAX_ENTRIES: usize = 200_000;
/// The deepest directory of a `.venv` looked at.
const MAX_DEPTH: usize = 32;

/// Who could have put the environment `venv` (the `.venv` of the cwd `cwd`, both handles
/// opened as the session's uid) where it is, or could change it: run as the session's uid.
/// For every directory from `/` down to `cwd`, whoever may rename the next entry on the way
/// (its owner; its group and the users and groups of its ACL when they may write; every user
/// when others may write, unless it is sticky, which leaves only the entry's owner); for the
/// environment, the owner of each of its entries, and whoever else may write in each of its
/// directories and files. Links inside it are not followed (their owner is counted).
pub fn writers(
    cwd: &Path,
    cwd_fd: BorrowedFd<'_>,
    venv: BorrowedFd<'_>,
) -> Result<Writers, VenvError> {
    let mut w = Writers::default();
    // The way's last handle (checked to be `venv`) stays open until the environment is walked.
    let (at, _venv_by_path) = the_way(&mut w, cwd, cwd_fd, venv)?;
    the_environment(&mut w, &at, venv)?;
    Ok(w)
}

/// Handles opened only to be looked at (fstat, the next step of a path), through no link.
const LOOK: OFlags = OFlags::PATH.union(OFlags::NOFOLLOW).union(OFlags::CLOEXEC);

/// A check's failure at `at`.
fn check_failed(at: &Path, e: rustix::io::Errno) -> VenvError {
    VenvError::Check {
        at: at.into(),
        source: e.into(),
    }
}

/// [`writers`]' way: who may rename an entry on the way from `/` down to `cwd`'s `.venv`,
/// opened by path, ending where the handles are (else it changed meanwhile). Returns the
/// `.venv`'s path and the handle opened by it.
fn the_way(
    w: &mut Writers,
    cwd: &Path,
    cwd_fd: BorrowedFd<'_>,
    venv: BorrowedFd<'_>,
) -> Result<(PathBuf, OwnedFd), VenvError> {
    let mut at = PathBuf::from("/");
    let mut dir = rustix::fs::open("/", LOOK | OFlags::DIRECTORY, Mode::empty())
        .map_err(|e| check_failed(Path::new("/"), e))?;
    let names = cwd
        .components()
        .filter_map(|c| match c {
            std::path::Component::Normal(n) => Some(n.to_os_string()),
            _ => None,
        })
        .chain([".venv".into()]);
    for name in names {
        let shown = at.join(&name);
        let child = rustix::fs::openat(&dir, name.as_os_str(), LOOK, Mode::empty())
            .map_err(|e| check_failed(&shown, e))?;
        let (dst, cst) = (fstat(&dir, &at)?, fstat(&child, &shown)?);
        w.may_rename(&dir, &dst, &cst, &at)?;
        if at == cwd && !same(&dir, cwd_fd) {
            return Err(changed(cwd));
        }
        dir = child;
        at = shown;
    }
    if !same(&dir, venv) {
        return Err(changed(&at));
    }
    Ok((at, dir))
}

/// [`writers`]' environment, every entry beneath `venv` (at `at`): each one's owner, and
/// whoever else may write in it; links not followed (their owner counted).
fn the_environment(w: &mut Writers, at: &Path, venv: BorrowedFd<'_>) -> Result<(), VenvError> {
    let read = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut todo = vec![(PathBuf::new(), 0usize)];
    let mut seen = 0usize;
    while let Some((rel, depth)) = todo.pop() {
        let shown = at.join(&rel);
        let path = if rel.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            rel.clone()
        };
        let d = beneath(venv, &path, read).map_err(|e| check_failed(&shown, e))?;
        let st = fstat(&d, &shown)?;
        w.owns(&st, &d, &shown)?;
        let entries = rustix::fs::Dir::read_from(&d).map_err(|e| check_failed(&shown, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| check_failed(&shown, e))?;
            let name = std::ffi::OsStr::from_bytes(entry.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            seen += 1;
            if seen > MAX_ENTRIES {
                return Err(VenvError::TooManyEntries);
            }
            let shown = shown.join(name);
            let est = rustix::fs::statat(&d, name, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| check_failed(&shown, e))?;
            match FileType::from_raw_mode(est.st_mode) {
                FileType::Directory if depth + 1 > MAX_DEPTH => {
                    return Err(VenvError::TooDeep);
                }
                FileType::Directory => todo.push((rel.join(name), depth + 1)),
                FileType::Symlink => {
                    w.uids.insert(est.st_uid);
                }
                _ => {
                    let f = rustix::fs::openat(&d, name, LOOK, Mode::empty())
                        .map_err(|e| check_failed(&shown, e))?;
                    w.owns(&est, &f, &shown)?;
                }
            }
        }
    }
    Ok(())
}

impl Writers {
    /// Who may rename (or replace) the entry `entry` of the directory `dir` (`at`).
    fn may_rename(
        &mut self,
        fd: &OwnedFd,
        dir: &rustix::fs::Stat,
        entry: &rustix::fs::Stat,
        at: &Path,
    ) -> Result<(), VenvError> {
        self.uids.insert(dir.st_uid);
        if dir.st_mode & 0o020 != 0 {
            self.group(fd, dir, at)?;
        }
        if dir.st_mode & 0o002 != 0 {
            if dir.st_mode & 0o1000 != 0 {
                self.uids.insert(entry.st_uid);
            } else {
                self.anyone = Some(format!("{} is writable by every user", at.display()));
            }
        }
        Ok(())
    }

    /// The owner of an entry of the environment, and whoever else may write it.
    fn owns(&mut self, st: &rustix::fs::Stat, fd: &OwnedFd, at: &Path) -> Result<(), VenvError> {
        self.uids.insert(st.st_uid);
        if st.st_mode & 0o020 != 0 {
            self.group(fd, st, at)?;
        }
        if st.st_mode & 0o002 != 0 {
            self.anyone = Some(format!("{} is writable by every user", at.display()));
        }
        Ok(())
    }

    /// A group-writable entry: its group, and with an ACL (whose mask the group bits then
    /// are) the users and groups it lets write.
    fn group(&mut self, fd: &OwnedFd, st: &rustix::fs::Stat, at: &Path) -> Result<(), VenvError> {
        use std::os::fd::AsRawFd;
        self.gids.insert(st.st_gid);
        // The handle may be O_PATH: its xattrs are read through its /proc/self/fd link
        // (this thread's own process, whatever its fs credentials).
        let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let mut buf = vec![0u8; 4096];
        let n = match rustix::fs::getxattr(link.as_str(), "system.posix_acl_access", &mut buf) {
            Ok(n) => n,
            Err(rustix::io::Errno::NODATA | rustix::io::Errno::OPNOTSUPP) => return Ok(()),
            Err(e) => {
                return Err(VenvError::Acl {
                    at: at.into(),
                    source: e.into(),
                });
            }
        };
        // Version 2: a 4-byte header, then (tag u16, perm u16, id u32) entries.
        for e in buf[..n.min(buf.len())]
            .get(4..)
            .unwrap_or(&[])
            .chunks_exact(8)
        {
            let tag = u16::from_le_bytes([e[0], e[1]]);
            let perm = u16::from_le_bytes([e[2], e[3]]);
            let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
            if perm & 2 != 0 {
                match tag {
                    0x02 => {
                        self.uids.insert(id);
                    }
                    0x08 => {
                        self.gids.insert(id);
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

fn fstat(fd: &OwnedFd, at: &Path) -> Result<rustix::fs::Stat, VenvError> {
    rustix::fs::fstat(fd).map_err(|e| VenvError::Check {
        at: at.into(),
        source: e.into(),
    })
}

/// Whether two handles are the same directory.
fn same(a: &OwnedFd, b: BorrowedFd<'_>) -> bool {
    match (rustix::fs::fstat(a), rustix::fs::fstat(b)) {
        (Ok(x), Ok(y)) => x.st_dev == y.st_dev && x.st_ino == y.st_ino,
        _ => false,
    }
}

fn changed(p: &Path) -> VenvError {
    VenvError::Changed { at: p.into() }
}

/// Open `rel` beneath `root`, through no link and on no other mount.
fn beneath(root: BorrowedFd<'_>, rel: &Path, flags: OFlags) -> rustix::io::Result<OwnedFd> {
    let how = ResolveFlags::BENEATH
        | ResolveFlags::NO_SYMLINKS
        | ResolveFlags::NO_MAGICLINKS
        | ResolveFlags::NO_XDEV;
    rustix::fs::openat2(root, rel, flags, Mode::empty(), how)
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
