//! Opening beneath a directory handle: one component at a time, through no link, never on a
//! kernel pseudo-filesystem; and host files a caller names, opened as the calling thread's user.

use super::*;
use crate::workspace::WORKSPACE_MARKER;

/// Kernel pseudo-filesystems: nothing on them is a session's file (`/proc/<server>/environ`
/// is readable by any thread of the server, whatever its uid).
const PSEUDO_FS: &[(i64, &str)] = &[
    (0x9fa0, "proc"),
    (0x6265_6572, "sysfs"),
    (0x1cd1, "devpts"),
    (0x0027_e0eb, "cgroup"),
    (0x6367_7270, "cgroup2"),
    (0x6462_6720, "debugfs"),
    (0x7363_6673, "securityfs"),
    (0x7472_6163, "tracefs"),
    (0xcafe_4a11, "bpf"),
    (0x6265_6570, "configfs"),
    (0x6165_676c, "pstore"),
    (0xde5e_81e4, "efivarfs"),
    (0xf97c_ff8c, "selinuxfs"),
    (0x4341_5d53, "smackfs"),
    (0x4249_4e4d, "binfmt_misc"),
    (0x6e73_6673, "nsfs"),
    (0x6573_5543, "fusectl"),
    (0x1980_0202, "mqueue"),
];

/// The pseudo-filesystem `fd` lies on, if any.
pub fn pseudo_fs(fd: BorrowedFd<'_>) -> io::Result<Option<&'static str>> {
    let st = rustix::fs::fstatfs(fd)?;
    let kind = st.f_type as i64;
    Ok(PSEUDO_FS.iter().find(|(m, _)| *m == kind).map(|(_, n)| *n))
}

/// Refuse what lies on a kernel pseudo-filesystem.
pub fn check_fs(fd: BorrowedFd<'_>) -> io::Result<()> {
    match pseudo_fs(fd)? {
        Some(name) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("it is on the kernel's {name} filesystem, which is never served"),
        )),
        None => Ok(()),
    }
}

/// How [`open_beneath`] walks.
#[derive(Debug, Clone, Default)]
pub struct Walk {
    /// Stay on the handle's filesystem (no mount point crossed).
    pub same_mount: bool,
    /// Directories (device, inode) never entered.
    pub forbidden: Vec<crate::workspace::DirId>,
    /// Enter replbox workspaces (only on the way to the server's own directories).
    pub into_workspaces: bool,
}

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// openat2 is missing (older kernels, some seccomp profiles): fall back to `O_NOFOLLOW`.
static NO_OPENAT2: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Open one path component `name` beneath `dir`, following no link.
pub(super) fn open_one(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    flags: OFlags,
    mode: Mode,
    walk: &Walk,
) -> io::Result<OwnedFd> {
    if name.is_empty() || name == ".." || name.as_bytes().contains(&b'/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a plain name",
        ));
    }
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    if !NO_OPENAT2.load(std::sync::atomic::Ordering::Relaxed) {
        let mut resolve = RESOLVE;
        if walk.same_mount {
            resolve |= ResolveFlags::NO_XDEV;
        }
        match rustix::fs::openat2(dir, name, flags, mode, resolve) {
            Err(rustix::io::Errno::NOSYS) => {
                NO_OPENAT2.store(true, std::sync::atomic::Ordering::Relaxed)
            }
            Err(e) => return Err(e.into()),
            Ok(fd) => return Ok(fd),
        }
    }
    let fd = rustix::fs::openat(dir, name, flags, mode)?;
    if walk.same_mount && rustix::fs::fstat(&fd)?.st_dev != rustix::fs::fstat(dir)?.st_dev {
        return Err(io::Error::from_raw_os_error(libc::EXDEV));
    }
    Ok(fd)
}

/// Open the directory `name` beneath `dir` (`O_PATH` when `path_only`), refusing links,
/// forbidden directories, other servers' workspaces and pseudo-filesystems.
fn open_dir(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    path_only: bool,
    walk: &Walk,
) -> io::Result<OwnedFd> {
    let flags = OFlags::DIRECTORY
        | if path_only {
            OFlags::PATH
        } else {
            OFlags::RDONLY
        };
    let fd = open_one(dir, name, flags, Mode::empty(), walk)?;
    check_dir(fd.as_fd(), walk)?;
    Ok(fd)
}

/// The directory `root` itself, opened for reading its entries (after the same checks).
pub fn open_dir_beneath(root: BorrowedFd<'_>, walk: &Walk) -> io::Result<OwnedFd> {
    open_dir(root, OsStr::new("."), false, walk)
}

/// The subdirectory `name` of `dir`, opened for reading its entries (no link, no forbidden
/// directory, no workspace, no pseudo-filesystem; on the same mount with `walk.same_mount`).
pub fn open_subdir(dir: BorrowedFd<'_>, name: &str, walk: &Walk) -> io::Result<OwnedFd> {
    open_dir(dir, OsStr::new(name), false, walk)
}

fn check_dir(fd: BorrowedFd<'_>, walk: &Walk) -> io::Result<()> {
    check_fs(fd)?;
    if !walk.forbidden.is_empty() {
        let st = rustix::fs::fstat(fd)?;
        if walk
            .forbidden
            .contains(&crate::workspace::DirId::from_stat(&st))
        {
            return Err(refused("the server's own directories are not served"));
        }
    }
    if !walk.into_workspaces && is_workspace(fd) {
        return Err(refused("a replbox server's working area is not served"));
    }
    Ok(())
}

fn refused(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, msg.to_string())
}

/// Whether the directory `fd` is the root of a replbox workspace.
pub fn is_workspace(fd: BorrowedFd<'_>) -> bool {
    rustix::fs::statat(fd, WORKSPACE_MARKER, AtFlags::SYMLINK_NOFOLLOW).is_ok()
}

/// Open the regular file `parts` (checked by [`check_relative`](crate::workspace::check_relative))
/// beneath the directory `root`, read-only and non-blocking (a FIFO planted under the name
/// must not hang the server), following no link.
pub fn open_beneath(root: BorrowedFd<'_>, parts: &[&str], walk: &Walk) -> io::Result<File> {
    let Some((last, dirs)) = parts.split_last() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no file named"));
    };
    check_dir(root, walk)?;
    let mut held: Option<OwnedFd> = None;
    for d in dirs {
        let next = open_dir(
            held.as_ref().map_or(root, |f| f.as_fd()),
            OsStr::new(d),
            true,
            walk,
        )?;
        held = Some(next);
    }
    let parent = held.as_ref().map_or(root, |f| f.as_fd());
    let fd = open_one(
        parent,
        OsStr::new(last),
        OFlags::RDONLY | OFlags::NONBLOCK,
        Mode::empty(),
        walk,
    )?;
    check_fs(fd.as_fd())?;
    let file = File::from(fd);
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(file)
}

/// Create the new regular file `parts` beneath `root` (mode 0644, directories on the way
/// 0755 as needed), following no link and overwriting nothing: `O_CREAT | O_EXCL` fails on
/// any existing name, a dangling link included. Returns the file and the directories made.
pub fn create_beneath(root: BorrowedFd<'_>, parts: &[&str]) -> io::Result<(File, Vec<String>)> {
    let Some((last, dirs)) = parts.split_last() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no file named"));
    };
    let walk = Walk::default();
    check_dir(root, &walk)?;
    let mut made = Vec::new();
    let mut held: Option<OwnedFd> = None;
    for (i, d) in dirs.iter().enumerate() {
        let parent = held.as_ref().map_or(root, |f| f.as_fd());
        match rustix::fs::mkdirat(parent, *d, Mode::from_raw_mode(0o755)) {
            Ok(()) => made.push(dirs[..=i].join("/")),
            Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        let next = open_dir(parent, OsStr::new(d), true, &walk)?;
        held = Some(next);
    }
    let parent = held.as_ref().map_or(root, |f| f.as_fd());
    let fd = open_one(
        parent,
        OsStr::new(last),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
        Mode::from_raw_mode(0o644),
        &walk,
    )?;
    Ok((File::from(fd), made))
}

/// Remove the file (or, with `dir`, the empty directory) `parts` beneath `root`, following
/// no link on the way.
pub fn remove_beneath(root: BorrowedFd<'_>, parts: &[&str], dir: bool) -> io::Result<()> {
    let Some((last, dirs)) = parts.split_last() else {
        return Ok(());
    };
    let walk = Walk::default();
    let mut held: Option<OwnedFd> = None;
    for d in dirs {
        let next = open_dir(
            held.as_ref().map_or(root, |f| f.as_fd()),
            OsStr::new(d),
            true,
            &walk,
        )?;
        held = Some(next);
    }
    let parent = held.as_ref().map_or(root, |f| f.as_fd());
    let flags = if dir {
        AtFlags::REMOVEDIR
    } else {
        AtFlags::empty()
    };
    Ok(rustix::fs::unlinkat(parent, *last, flags)?)
}

/// A directory handle (`O_PATH`) on `path`, opened as the calling thread's user, following no
/// link anywhere on the way and refusing pseudo-filesystems: for the server's own directories
/// that user code can write (`work/`, `out/`).
pub fn open_dir_path(path: &Path) -> io::Result<OwnedFd> {
    let walk = Walk {
        into_workspaces: true,
        ..Walk::default()
    };
    let (fd, _) = walk_path(path, &walk).map_err(|(e, _)| e)?;
    Ok(fd)
}

/// Open the absolute, canonical `path` component by component from `/` (`O_PATH`), following
/// no link; on failure, also the deepest directory reached (for messages).
pub(super) fn walk_path(
    path: &Path,
    walk: &Walk,
) -> Result<(OwnedFd, PathBuf), (io::Error, PathBuf)> {
    let mut at = PathBuf::from("/");
    let root = rustix::fs::open(
        "/",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| (e.into(), at.clone()))?;
    let mut fd = root;
    for c in path.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(name) => {
                let next = open_dir(fd.as_fd(), name, true, walk).map_err(|e| (e, at.clone()))?;
                fd = next;
                at.push(name);
            }
            _ => {
                return Err((
                    io::Error::new(io::ErrorKind::InvalidInput, "not a canonical path"),
                    at,
                ));
            }
        }
    }
    Ok((fd, at))
}

/// `fd` as a file, when it is a regular one and not on a pseudo-filesystem.
pub(super) fn regular_file(fd: OwnedFd) -> io::Result<File> {
    check_fs(fd.as_fd())?;
    let file = File::from(fd);
    let meta = file.metadata()?;
    if meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "is a directory; to work in a folder pass it as cwd",
        ));
    }
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(file)
}

/// Whether the calling thread's user may `access` (`R_OK`, `W_OK`, `X_OK` bits) the directory
/// `fd`, with its effective (filesystem) rights.
pub fn may(fd: BorrowedFd<'_>, access: rustix::fs::Access) -> bool {
    rustix::fs::accessat(fd, ".", access, AtFlags::EACCESS).is_ok()
}

// ----- the cwd policy -----

/// How messages name the user a session's file work runs as.
pub fn user_name(uid: Option<u32>) -> String {
    match uid {
        Some(u) => format!("the session's user (uid {u})"),
        None => "the server's user".to_string(),
    }
}
