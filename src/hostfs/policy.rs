//! The one policy for host paths a caller names (`cwd`, `venv`, `files[].path`): system
//! directories, workspaces, masked trees unless the operator allows them, reachability by the
//! session's user; decided by name and by where the path really leads.

use super::*;
use crate::workspace::WORKSPACE_MARKER;

/// Directories never used as a `cwd`, whatever the operator allows: kernel interfaces and
/// the runtime state of system services (sockets, other servers' uid locks).
const SYSTEM_DIRS: &[&str] = &["/proc", "/sys", "/dev", "/run"];

#[derive(Debug, Clone, Default)]
pub struct CwdPolicy {
    /// This server's workspace (canonical).
    pub workspace: PathBuf,
    /// Trees hidden from user code (canonical): the defaults and `--mask`.
    pub masked: Vec<PathBuf>,
    /// Trees the operator allows as a `cwd` although masked (`--allow-cwd`, canonical).
    pub allowed: Vec<PathBuf>,
}

/// An accepted `cwd`.
#[derive(Debug)]
pub struct Cwd {
    /// Canonical.
    pub path: PathBuf,
    /// Its handle (`O_PATH`), opened as the session's user.
    pub dir: OwnedFd,
    /// Whether the session's user may create files there.
    pub writable: bool,
}

impl CwdPolicy {
    /// The policy for a server with this workspace, masked trees and `--allow-cwd` trees
    /// (made canonical here, as the operator's paths may go through links).
    pub fn new(workspace: &Path, masked: &[PathBuf], allowed: &[PathBuf]) -> Self {
        let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| lexical(p));
        Self {
            workspace: canonical(workspace),
            masked: masked.iter().map(|p| canonical(p)).collect(),
            allowed: allowed.iter().map(|p| canonical(p)).collect(),
        }
    }

    /// Why `path` (absolute, free of `.`/`..`) may not be a caller's directory (`what`:
    /// `cwd`, `venv`), by its name alone.
    pub fn refuse(&self, path: &Path, shown: &Path, what: &str) -> Result<(), HostfsError> {
        let (what, path_shown) = (what.to_string(), shown.to_path_buf());
        for sys in SYSTEM_DIRS {
            if path.starts_with(sys) {
                return Err(HostfsError::System {
                    what,
                    path: path_shown,
                    sys,
                });
            }
            if Path::new(sys).starts_with(path) {
                return Err(HostfsError::ContainsSystem {
                    what,
                    path: path_shown,
                    sys,
                });
            }
        }
        if path.starts_with(&self.workspace) || self.workspace.starts_with(path) {
            return Err(HostfsError::Workspace {
                what,
                path: path_shown,
                workspace: self.workspace.clone(),
            });
        }
        if let Some(ws) = path.ancestors().find(|a| looks_like_workspace(a)) {
            return Err(HostfsError::OtherWorkspace {
                what,
                path: path_shown,
                workspace: ws.to_path_buf(),
            });
        }
        for m in &self.masked {
            if m.starts_with(path) && m != path {
                return Err(HostfsError::ContainsMasked {
                    what,
                    path: path_shown,
                    masked: m.clone(),
                });
            }
            if path.starts_with(m) && !self.allowed.iter().any(|a| path.starts_with(a)) {
                return Err(HostfsError::Masked {
                    what,
                    path: path_shown,
                    masked: m.clone(),
                });
            }
        }
        Ok(())
    }
}

/// A directory named like a workspace root (`replbox-*`) with its `sessions` and `runs`.
fn looks_like_workspace(dir: &Path) -> bool {
    dir.file_name()
        .is_some_and(|n| n.as_bytes().starts_with(b"replbox-"))
        && dir.join("sessions").is_dir()
        && dir.join("runs").is_dir()
        || std::fs::symlink_metadata(dir.join(WORKSPACE_MARKER)).is_ok()
}

/// `path` made absolute lexically, without `.` and `..` (which are resolved as names: the
/// canonical form is checked again after resolving links).
pub fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

/// Decide a caller's `cwd`, run as the session's user (through [`as_uid`]): refused when it is
/// a system directory, overlaps a replbox workspace, lies in or contains a masked tree (unless
/// the operator allowed it) or is not reachable by that user on the host; otherwise its
/// canonical path, a handle, and whether the session may write there. `uid` only names the
/// user in messages.
pub fn check_cwd(
    policy: &CwdPolicy,
    requested: &Path,
    uid: Option<u32>,
) -> Result<Cwd, HostfsError> {
    check_caller_dir(policy, requested, uid, "cwd")
}

/// The one policy for every host path a caller names (`what` names it in messages: `cwd`,
/// `venv`, `path`), run as the session's user (`user` names it): an absolute path, refused
/// by its name (system directories, replbox workspaces, masked trees unless `--allow-cwd`
/// allows them), then by where it really leads once links are resolved with that user's
/// rights. Returns the canonical path, which the caller then opens following no link, so
/// that a link swapped in afterwards is refused rather than followed.
pub fn check_caller_path(
    policy: &CwdPolicy,
    requested: &Path,
    user: &str,
    what: &str,
) -> Result<PathBuf, HostfsError> {
    if !requested.is_absolute() {
        return Err(HostfsError::Relative {
            what: what.into(),
            path: requested.into(),
        });
    }
    if requested.as_os_str().as_bytes().contains(&0) {
        return Err(HostfsError::Nul { what: what.into() });
    }
    let lex = lexical(requested);
    policy.refuse(&lex, requested, what)?;
    let real = std::fs::canonicalize(requested).map_err(|e| match e.raw_os_error() {
        Some(libc::EACCES) => cannot_enter(what, requested, &first_unsearchable(&lex), user),
        _ if what == "path" => cannot_read(requested, user, e),
        _ => HostfsError::Io {
            what: what.into(),
            path: requested.into(),
            source: e,
        },
    })?;
    policy.refuse(&real, requested, what)?;
    Ok(real)
}

/// Open the host file a caller named (`files[].path`) as the calling thread's user (run it
/// through [`as_uid`]), after [`check_caller_path`]: the canonical path that passed is opened
/// from `/` following no link, so what is read is what was checked.
pub fn open_caller_file(
    policy: &CwdPolicy,
    requested: &Path,
    user: &str,
) -> Result<File, HostfsError> {
    let what = "path";
    let real = check_caller_path(policy, requested, user, what)?;
    let changed = || HostfsError::Changed {
        what: what.into(),
        path: requested.into(),
    };
    let (Some(parent), Some(name)) = (real.parent(), real.file_name()) else {
        return Err(HostfsError::NotFile {
            what: what.into(),
            path: requested.into(),
        });
    };
    let (dir, _) =
        walk_path(parent, &Walk::default()).map_err(|(e, at)| match e.raw_os_error() {
            Some(libc::EACCES) => cannot_enter(what, requested, &at, user),
            Some(libc::ELOOP) | Some(libc::ENOTDIR) => changed(),
            _ => cannot_read(requested, user, e),
        })?;
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd =
        open_one(dir.as_fd(), name, flags, Mode::empty(), &Walk::default()).map_err(|e| match e
            .raw_os_error()
        {
            Some(libc::ELOOP) => changed(),
            _ => cannot_read(requested, user, e),
        })?;
    regular_file(fd).map_err(|e| cannot_read(requested, user, e))
}

fn cannot_read(requested: &Path, user: &str, e: io::Error) -> HostfsError {
    HostfsError::CannotRead {
        path: requested.into(),
        user: user.into(),
        source: e,
    }
}

/// [`check_cwd`] for any directory a caller names (`what` names it in messages: `cwd`,
/// `venv`): the one policy for a caller's directories.
pub fn check_caller_dir(
    policy: &CwdPolicy,
    requested: &Path,
    uid: Option<u32>,
    what: &str,
) -> Result<Cwd, HostfsError> {
    let user = user_name(uid);
    let real = check_caller_path(policy, requested, &user, what)?;
    let (dir, _) =
        walk_path(&real, &Walk::default()).map_err(|(e, at)| match e.raw_os_error() {
            Some(libc::EACCES) => cannot_enter(what, requested, &at, &user),
            Some(libc::ELOOP) | Some(libc::ENOTDIR) => HostfsError::Changed {
                what: what.into(),
                path: requested.into(),
            },
            _ => HostfsError::Io {
                what: what.into(),
                path: requested.into(),
                source: e,
            },
        })?;
    if !rustix::fs::fstat(&dir)
        .map(|st| {
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory
        })
        .unwrap_or(false)
    {
        return Err(HostfsError::NotDirectory {
            what: what.into(),
            path: requested.into(),
        });
    }
    if !may(dir.as_fd(), rustix::fs::Access::EXEC_OK) {
        return Err(cannot_enter(what, requested, &real, &user));
    }
    let writable = may(
        dir.as_fd(),
        rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK,
    );
    Ok(Cwd {
        path: real,
        dir,
        writable,
    })
}

/// The first directory on the way to `lex` that the calling thread's user may not search
/// (`lex` itself when there is none).
pub fn first_unsearchable(lex: &Path) -> PathBuf {
    let mut at = PathBuf::from("/");
    let mut blocked = PathBuf::from("/");
    for c in lex.components() {
        if let Component::Normal(n) = c {
            let ok = rustix::fs::accessat(
                rustix::fs::CWD,
                &at,
                rustix::fs::Access::EXEC_OK,
                AtFlags::EACCESS,
            )
            .is_ok();
            if !ok {
                blocked = at.clone();
                break;
            }
            at.push(n);
            blocked = at.clone();
        }
    }
    blocked
}

/// A path the session's user cannot resolve: `blocked` is the first directory on the way
/// it may not search.
fn cannot_enter(what: &str, requested: &Path, blocked: &Path, user: &str) -> HostfsError {
    HostfsError::CannotEnter {
        what: what.into(),
        path: requested.into(),
        blocked: blocked.into(),
        user: user.into(),
    }
}
