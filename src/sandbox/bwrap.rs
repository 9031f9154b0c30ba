//! The bwrap command line: namespaces, capabilities, the view of the host (an allow-list,
//! read-only, on bwrap's own empty root), the private /tmp and /dev/shm, the spawn's own
//! directories bound by descriptor, and the helper bound in last.
//!
//! bwrap (root, when the server is) mounts onto destination *paths*, following links: whoever
//! may rename an entry on the way to a destination can swap it between bwrap's checks and its
//! mount, and so put a directory of theirs over `/run` (hiding the helper: bwrap then runs
//! their file as root) or `/etc`. The root is bwrap's own tmpfs, so the way to a destination
//! is bwrap's own (nobody else can change it) unless it passes through an earlier mount: a
//! tree of the view, or a directory bound before. Only that part of the way is checked
//! ([`check_dest`]): each directory on it must be changeable by root (or the server's own uid)
//! only. Sources are descriptors: the server's own directories opened without following
//! links, a caller's `cwd` and `venv` the very handles opened as the session's uid when they
//! were decided, so what is mounted is what was checked, whatever its path leads to later.

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use replbox_exec::{ExecArgs, PROGRAM_FD, STATUS_FD};

use super::view::Entry;
use super::{CommandLine, Jail, Sandbox};

/// Where the helper binary appears inside a bwrap sandbox (on the tmpfs that masks /run, or
/// on the private /tmp when there is no /run).
const HELPER_IN_RUN: &str = "/run/replbox-helper";
const HELPER_IN_TMP: &str = "/tmp/.replbox-helper";
/// Where the egress proxy's socket appears, likewise.
const PROXY_IN_RUN: &str = "/run/replbox-egress.sock";
const PROXY_IN_TMP: &str = "/tmp/.replbox-egress.sock";

fn run_is_masked(sb: &Sandbox) -> bool {
    sb.masked.iter().any(|m| m == Path::new("/run"))
}

/// Where the egress proxy's socket is inside the sandbox.
pub fn proxy_socket_inside(sb: &Sandbox) -> &'static str {
    if run_is_masked(sb) {
        PROXY_IN_RUN
    } else {
        PROXY_IN_TMP
    }
}

/// The first descriptor number bwrap (or the helper) finds a directory on (after stdio, the
/// status pipe and the program).
pub const FIRST_BIND_FD: i32 = if STATUS_FD > PROGRAM_FD {
    STATUS_FD + 1
} else {
    PROGRAM_FD + 1
};

/// Open a directory of the server's own to bind without following any symbolic link.
pub(super) fn open_dir(p: &Path) -> std::io::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    nix::fcntl::openat2(nix::fcntl::AT_FDCWD, p, how)
        .map_err(|e| std::io::Error::other(format!("cannot bind {}: {e}", p.display())))
}

fn push(b: &mut Vec<OsString>, args: &[&str]) {
    b.extend(args.iter().map(OsString::from));
}

/// What lies below a mount of the command, for the check of later destinations.
pub(super) enum Below<'a> {
    /// bwrap's own filesystem (the root, a tmpfs, /dev, /proc): nobody else changes it.
    Private,
    /// The host's directory of the same path (a tree of the view).
    Host,
    /// The directory of this handle (a bind).
    Fd(BorrowedFd<'a>),
}

/// A mount of the command, in order.
pub(super) struct Mount<'a> {
    pub dest: PathBuf,
    pub below: Below<'a>,
}

/// bwrap running the helper with `args`.
pub fn command(sb: &Sandbox, jail: &Jail, args: &ExecArgs) -> std::io::Result<CommandLine> {
    let helper_in = if run_is_masked(sb) {
        HELPER_IN_RUN
    } else {
        HELPER_IN_TMP
    };
    let mut b = namespaces(sb);
    // bwrap makes the directories on the way to a mount 0700: the view's are made 0755
    // first (what they hold is the view), those on the way to the spawn's own 0711, so
    // that the pool uid can pass through and not list them.
    let view_dirs = ancestors(sb.view.entries().iter().map(Entry::path), |_| false);
    for a in &view_dirs {
        push(&mut b, &["--perms", "0755", "--dir"]);
        b.push(a.into());
    }
    let mut mounts = view_mounts(sb, &mut b);
    let binds = jail_binds(sb, jail)?;
    let socket = jail.egress.as_ref().and_then(|e| e.socket.as_ref());
    let dests = binds
        .iter()
        .map(|(_, p, _)| p.as_path())
        .chain(socket.map(|_| Path::new(proxy_socket_inside(sb))))
        .chain([Path::new(helper_in)]);
    let made =
        |a: &Path| view_dirs.contains(a) || sb.view.shows(a) || mounts.iter().any(|m| m.dest == a);
    for a in ancestors(dests, made) {
        push(&mut b, &["--perms", "0711", "--dir"]);
        b.push(a.into());
    }
    let mut fds = Vec::new();
    for (flag, dest, fd) in &binds {
        let n = FIRST_BIND_FD + fds.len() as i32;
        check(dest, &mounts)?;
        push(&mut b, &[flag, &n.to_string()]);
        b.push(dest.clone().into());
        mounts.push(Mount {
            dest: dest.clone(),
            below: Below::Fd(fd.as_fd()),
        });
        fds.push(n);
    }
    if let Some(socket) = socket {
        // The server made it, in its own directory: no caller chose this path. Its place is
        // on bwrap's own tmpfs, like the helper's.
        check(Path::new(proxy_socket_inside(sb)), &mounts)?;
        b.push("--ro-bind".into());
        b.push(socket.clone().into());
        b.push(proxy_socket_inside(sb).into());
    }
    // The helper last: no mount made after it can cover it.
    check(Path::new(helper_in), &mounts)?;
    b.push("--ro-bind".into());
    b.push(sb.helper.clone().into());
    b.push(helper_in.into());
    // The root itself read-only: what bwrap made on it (mount points) is all there is.
    push(&mut b, &["--remount-ro", "/"]);
    // bwrap enters "/": the working directory belongs to the pool uid, which root without
    // CAP_DAC_OVERRIDE may not enter. The helper's child enters it after the uid drop.
    push(&mut b, &["--chdir", "/", "--", helper_in]);
    b.extend(args.to_args());
    drop(mounts);
    let fds = binds
        .into_iter()
        .zip(fds)
        .map(|((_, _, fd), n)| (fd, n))
        .collect();
    Ok(CommandLine {
        program: sb.bwrap.clone().unwrap_or_else(|| PathBuf::from("bwrap")),
        args: b,
        wrapped: true,
        fds,
    })
}

fn check(dest: &Path, mounts: &[Mount<'_>]) -> std::io::Result<()> {
    check_dest(dest, mounts, &trusted_uids()).map_err(std::io::Error::other)
}

/// Namespaces, capabilities and the helper's place as the sandbox's first process.
fn namespaces(sb: &Sandbox) -> Vec<OsString> {
    let mut b = Vec::new();
    // The helper is the sandbox's pid 1: when it exits, the kernel kills whatever is left in
    // the namespace. bwrap dies with the server; the helper dies with bwrap.
    push(
        &mut b,
        &["--die-with-parent", "--new-session", "--as-pid-1"],
    );
    if sb.root {
        // No user namespace: the helper starts as real root with only the capabilities it
        // needs to drop to the pool uid (and to kill that uid's processes), and the program
        // ends up with none. In a user namespace owned by root the pool uid could not be
        // mapped, and without the drop the program would be kernel uid 0.
        push(
            &mut b,
            &[
                "--unshare-ipc",
                "--unshare-pid",
                "--unshare-uts",
                "--unshare-cgroup-try",
                "--cap-drop",
                "ALL",
                "--cap-add",
                "CAP_SETUID",
                "--cap-add",
                "CAP_SETGID",
                "--cap-add",
                "CAP_SETPCAP",
                "--cap-add",
                "CAP_KILL",
            ],
        );
    } else {
        push(
            &mut b,
            &[
                "--unshare-user",
                "--disable-userns",
                "--unshare-ipc",
                "--unshare-pid",
                "--unshare-uts",
                "--unshare-cgroup-try",
                "--cap-drop",
                "ALL",
            ],
        );
    }
    // Always: the network, when the operator allows one, is the egress proxy's socket.
    push(&mut b, &["--unshare-net"]);
    b
}

/// The view of the host, read-only on bwrap's empty root; the masks inside it; the private
/// /tmp, /dev and /dev/shm; /proc. Returns the mounts made, in order.
fn view_mounts<'a>(sb: &Sandbox, b: &mut Vec<OsString>) -> Vec<Mount<'a>> {
    let mut mounts = Vec::new();
    for e in sb.view.entries() {
        match e {
            Entry::Tree(p) | Entry::File(p) => {
                b.push("--ro-bind".into());
                b.push(p.clone().into());
                b.push(p.clone().into());
                let below = match e {
                    Entry::Tree(_) => Below::Host,
                    _ => Below::Private,
                };
                mounts.push(Mount {
                    dest: p.clone(),
                    below,
                });
            }
            Entry::Link(p, target) => {
                b.push("--symlink".into());
                b.push(target.clone().into());
                b.push(p.clone().into());
            }
        }
    }
    // A mask matters only where the view shows the host.
    for m in &sb.masked {
        if m != Path::new("/tmp") && sb.view.trees().any(|t| m.starts_with(t)) {
            b.push("--tmpfs".into());
            b.push(m.clone().into());
            mounts.push(Mount {
                dest: m.clone(),
                below: Below::Private,
            });
        }
    }
    let size = sb
        .limits
        .tmpfs_mb
        .max(1)
        .saturating_mul(1024 * 1024)
        .to_string();
    push(b, &["--perms", "01777", "--size", &size, "--tmpfs", "/tmp"]);
    push(b, &["--dev", "/dev", "--perms", "01777", "--size", &size]);
    push(b, &["--tmpfs", "/dev/shm", "--proc", "/proc"]);
    push(b, &["--hostname", "replbox"]);
    for p in ["/tmp", "/dev", "/dev/shm", "/proc"] {
        mounts.push(Mount {
            dest: p.into(),
            below: Below::Private,
        });
    }
    mounts
}

/// The spawn's own directories to bind, in the order they are mounted: `(flag, destination,
/// source)`. Each at its own path, from a descriptor: a caller's directory the handle opened
/// as the session's uid when it was decided, the server's own directories opened now
/// following no link. A read-only directory already shown (inside a tree of the view, or
/// inside another directory of the spawn) is not bound again; directories inside others
/// come after them.
fn jail_binds(sb: &Sandbox, jail: &Jail) -> std::io::Result<Vec<(&'static str, PathBuf, OwnedFd)>> {
    let inside_another = |p: &PathBuf| {
        jail.ro
            .iter()
            .chain(&jail.rw)
            .any(|q| q != p && p.starts_with(q))
    };
    let mut chosen: Vec<(&'static str, &PathBuf)> = Vec::new();
    for p in &jail.ro {
        let shown = sb.view.shows(p) || inside_another(p) || jail.rw.contains(p);
        if !shown && !chosen.iter().any(|(_, q)| *q == p) {
            chosen.push(("--ro-bind-fd", p));
        }
    }
    for p in &jail.rw {
        if !chosen.iter().any(|(_, q)| *q == p) {
            chosen.push(("--bind-fd", p));
        }
    }
    // Outer directories first (stable: read-only ones before writable ones at one depth).
    chosen.sort_by_key(|(_, p)| p.components().count());
    let mut out = Vec::new();
    for (flag, p) in chosen {
        let fd = match jail.opened(p) {
            Some(fd) => fd.try_clone()?,
            None => open_dir(p)?,
        };
        out.push((flag, p.clone(), fd));
    }
    Ok(out)
}

/// The directories on the way to `paths` (not `/`), outer ones first, but those `skip`
/// says exist already.
fn ancestors<'a>(
    paths: impl Iterator<Item = &'a Path>,
    skip: impl Fn(&Path) -> bool,
) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for p in paths {
        for a in p.ancestors().skip(1) {
            if a != Path::new("/") && !skip(a) {
                out.insert(a.to_path_buf());
            }
        }
    }
    out
}

/// The mounts below a caller's `cwd` before it is bound (the view, its masks, bwrap's own
/// filesystems), for [`check_dest`].
pub(super) fn base_mounts(sb: &Sandbox) -> Vec<Mount<'static>> {
    let mut v = view_mounts(sb, &mut Vec::new());
    v.retain(|m| !matches!(m.below, Below::Fd(_)));
    v
}

/// Why bwrap could be made to mount at another place than a destination, or the server's own
/// directory swapped (see [`check_dest`]).
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("{} is not a canonical path", .dest.display())]
    NotCanonical { dest: PathBuf },
    /// A directory on the way (`at`) could not be opened or looked at.
    #[error("cannot check the way to {} at {}: {error}", .dest.display(), .at.display())]
    Check {
        dest: PathBuf,
        at: PathBuf,
        error: std::io::Error,
    },
    /// The directory `at` on the way, owned by `owner` (a trusted uid or not), lets a user
    /// other than root rename its entry `name`.
    #[error(
        "{} is reached by its path, and {} (owner uid {owner}, mode {mode:04o}) lets {} rename \
         {name:?} in it, which could put another directory in its place (for root to mount, \
         or to write in). Every directory on the way to it must be changeable by root only: \
         owned by root and writable by no one else (in a sticky directory such as /tmp, an \
         entry root owns is fine)",
        .dest.display(),
        .at.display(),
        who(.owner, .owner_trusted)
    )]
    Changeable {
        dest: PathBuf,
        at: PathBuf,
        owner: u32,
        owner_trusted: bool,
        mode: u32,
        name: OsString,
    },
}

/// Who may rename an entry of a directory owned by `owner`.
fn who(owner: &u32, trusted: &bool) -> String {
    if *trusted {
        "users other than root".to_string()
    } else {
        format!("its owner (uid {owner})")
    }
}

/// Why the server's own directory `dir` (its workspace) could be swapped by another user:
/// the way to it from `/` must be changeable by root (or the server's uid) only, since the
/// server opens, writes and binds what lies there with its own rights.
pub(super) fn check_own(dir: &Path) -> Result<(), BindError> {
    let root = [Mount {
        dest: PathBuf::from("/"),
        below: Below::Host,
    }];
    check_dest(dir, &root, &trusted_uids())
}

/// The uids whose directories may lie on the way to a mount: root's, and the server's own
/// (without root, bwrap runs as the server's uid, and so does user code).
pub(super) fn trusted_uids() -> Vec<u32> {
    let me = rustix::process::geteuid().as_raw();
    if me == 0 { vec![0] } else { vec![0, me] }
}

/// Why bwrap could be made to mount at another place than `dest` (absolute, no `.`, `..` or
/// link), given the `mounts` made before it: none when the way is bwrap's own (the deepest
/// earlier mount above `dest` is a private one, or there is none: the root is bwrap's
/// tmpfs). Otherwise the way runs through that mount's directory (the host's, or a bind's),
/// and every directory on it from there must be changeable only by `trusted` users: owned by
/// one, and writable by no group or other (a sticky one only for an entry a trusted user
/// owns: its owner may rename it); the first that is not is the reason.
pub(super) fn check_dest(
    dest: &Path,
    mounts: &[Mount<'_>],
    trusted: &[u32],
) -> Result<(), BindError> {
    use rustix::fs::{Mode, OFlags};
    let not_canonical = || BindError::NotCanonical { dest: dest.into() };
    if dest
        .components()
        .any(|c| !matches!(c, Component::RootDir | Component::Normal(_)))
    {
        return Err(not_canonical());
    }
    let Some(m) = mounts
        .iter()
        .filter(|m| m.dest != dest && dest.starts_with(&m.dest))
        .max_by_key(|m| m.dest.components().count())
    else {
        return Ok(());
    };
    let io = |at: &Path, e: std::io::Error| BindError::Check {
        dest: dest.into(),
        at: at.into(),
        error: e,
    };
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut at = m.dest.clone();
    let mut dir = match &m.below {
        Below::Private => return Ok(()),
        Below::Host => {
            let how = OpenHow::new()
                .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
                .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS);
            nix::fcntl::openat2(nix::fcntl::AT_FDCWD, at.as_path(), how)
                .map_err(|e| io(&at, std::io::Error::from_raw_os_error(e as i32)))?
        }
        Below::Fd(fd) => fd.try_clone_to_owned().map_err(|e| io(&at, e))?,
    };
    let rest = dest.strip_prefix(&m.dest).unwrap_or(dest);
    for c in rest.components() {
        let Component::Normal(name) = c else {
            return Err(not_canonical());
        };
        let name: &OsStr = name;
        let child = rustix::fs::openat(dir.as_fd(), name, flags, Mode::empty())
            .map_err(|e| io(&at.join(name), e.into()))?;
        let st = rustix::fs::fstat(&dir).map_err(|e| io(&at, e.into()))?;
        let mode = st.st_mode & 0o7777;
        let cst = rustix::fs::fstat(&child).map_err(|e| io(&at, e.into()))?;
        let safe = trusted.contains(&st.st_uid)
            && (mode & 0o022 == 0 || (mode & 0o1000 != 0 && trusted.contains(&cst.st_uid)));
        if !safe {
            return Err(BindError::Changeable {
                dest: dest.into(),
                at,
                owner: st.st_uid,
                owner_trusted: trusted.contains(&st.st_uid),
                mode,
                name: name.into(),
            });
        }
        dir = child;
        at.push(name);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_destination_others_can_rename_on_the_way_is_refused() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("SKIP: the destination check test chowns, which needs root");
            return;
        }
        let base = std::fs::canonicalize(tempfile::tempdir().unwrap().keep()).unwrap();
        let host = || Mount {
            dest: PathBuf::from("/"),
            below: Below::Host,
        };
        let root_only = |p: &Path| check_dest(p, &[host()], &[0]).map_err(|e| e.to_string());
        // /tmp itself is sticky: an entry root owns is safe, one a user owns is not.
        chmod(&base, 0o1777);
        let theirs = base.join("theirs");
        let ours = base.join("ours");
        std::fs::create_dir(&theirs).unwrap();
        std::fs::create_dir(&ours).unwrap();
        std::os::unix::fs::chown(&theirs, Some(54_321), None).unwrap();
        assert!(root_only(&ours).is_ok());
        let e = root_only(&theirs).unwrap_err();
        assert!(e.contains("mode 1777") && e.contains("\"theirs\""), "{e}");
        // Writable by others without the sticky bit: any entry can be renamed.
        chmod(&base, 0o777);
        assert!(root_only(&ours).is_err());
        // Below a user's directory: its owner may rename anything in it.
        chmod(&base, 0o755);
        let below = theirs.join("d");
        std::fs::create_dir(&below).unwrap();
        let e = root_only(&below).unwrap_err();
        assert!(e.contains("its owner (uid 54321)"), "{e}");
        chmod(&base, 0o777);
        // On bwrap's own root, with no mount above, nobody else can change the way...
        assert!(check_dest(&below, &[], &[0]).is_ok());
        // ...nor below a private mount (a tmpfs) made after the host's tree...
        let private = Mount {
            dest: base.clone(),
            below: Below::Private,
        };
        assert!(check_dest(&below, &[host(), private], &[0]).is_ok());
        // ...but below a bind of a user's directory, its owner can.
        let fd = open_dir(&theirs).unwrap();
        let bind = Mount {
            dest: theirs.clone(),
            below: Below::Fd(fd.as_fd()),
        };
        let e = check_dest(&below, &[bind], &[0]).unwrap_err().to_string();
        assert!(e.contains("uid 54321"), "{e}");
        // The server's own uid counts as root's (without root, user code runs as it anyway).
        assert!(
            check_dest(&below, &[host()], &[0, 54_321]).is_err(),
            "base is 0777"
        );
        chmod(&base, 0o755);
        assert!(check_dest(&below, &[host()], &[0, 54_321]).is_ok());
        assert!(check_dest(Path::new("/a/../b"), &[host()], &[0]).is_err());
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// The refusal a caller's cwd gets, byte for byte (the check itself needs root, above).
    #[test]
    fn bind_messages_are_pinned() {
        let e = BindError::Changeable {
            dest: "/srv/data/x".into(),
            at: "/srv/data".into(),
            owner: 1000,
            owner_trusted: false,
            mode: 0o755,
            name: "x".into(),
        };
        assert_eq!(
            e.to_string(),
            "/srv/data/x is reached by its path, and /srv/data (owner uid 1000, mode 0755) lets \
its owner (uid 1000) rename \"x\" in it, which could put another directory in its place (for \
root to mount, or to write in). Every directory on the way to it must be changeable by root \
only: owned by root and writable by no one else (in a sticky directory such as /tmp, an entry \
root owns is fine)"
        );
        let e = BindError::Changeable {
            dest: "/srv/data/x".into(),
            at: "/srv/data".into(),
            owner: 0,
            owner_trusted: true,
            mode: 0o777,
            name: "x".into(),
        };
        assert!(
            e.to_string()
                .contains("(owner uid 0, mode 0777) lets users other than root rename \"x\""),
            "{e}"
        );
        assert_eq!(
            check_dest(Path::new("/a/../b"), &[], &[0])
                .unwrap_err()
                .to_string(),
            "/a/../b is not a canonical path"
        );
        let gone = Path::new("/nonexistent-replbox-dir/x");
        let host = Mount {
            dest: PathBuf::from("/"),
            below: Below::Host,
        };
        assert_eq!(
            check_dest(gone, &[host], &[0]).unwrap_err().to_string(),
            "cannot check the way to /nonexistent-replbox-dir/x at \
             /nonexistent-replbox-dir: No such file or directory (os error 2)"
        );
    }
}
