//! The bwrap command line: namespaces, capabilities, the read-only root with the masks, the
//! private /tmp and /dev/shm, the spawn's own directories bound by descriptor, and the helper
//! bound in last.
//!
//! bwrap (root, when the server is) mounts onto destination *paths*, following links, in a
//! root that is the host's own: whoever may rename an entry on the way to a destination can
//! swap it between bwrap's checks and its mount, and so put a directory of theirs over
//! `/run` (hiding the helper: bwrap then runs their file as root) or `/etc`. So every
//! destination is checked ([`check_dest`]): each directory on the way that bwrap sees from the
//! host must be changeable by root (or the server's own uid) only. Below a masked tree, the
//! way is bwrap's own private tmpfs, which nobody else can change.

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use replbox_exec::{ExecArgs, PROGRAM_FD, STATUS_FD};

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

/// The first descriptor number bwrap finds a directory to bind on (after stdio, the status
/// pipe and the program).
const FIRST_BIND_FD: i32 = if STATUS_FD > PROGRAM_FD {
    STATUS_FD + 1
} else {
    PROGRAM_FD + 1
};

/// Open a directory to bind without following any symbolic link: a link swapped in after
/// the path was checked must not make bwrap (root) bind something else.
fn open_dir(p: &Path) -> std::io::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    nix::fcntl::openat2(nix::fcntl::AT_FDCWD, p, how)
        .map_err(|e| std::io::Error::other(format!("cannot bind {}: {e}", p.display())))
}

fn push(b: &mut Vec<OsString>, args: &[&str]) {
    b.extend(args.iter().map(OsString::from));
}

/// bwrap running the helper with `args`.
pub fn command(sb: &Sandbox, jail: &Jail, args: &ExecArgs) -> std::io::Result<CommandLine> {
    let helper_in = if run_is_masked(sb) {
        HELPER_IN_RUN
    } else {
        HELPER_IN_TMP
    };
    check_mounts(sb, jail, Path::new(helper_in))?;
    let mut b = namespaces(sb);
    mounts(sb, &mut b);
    let fds = binds(sb, jail, &mut b)?;
    if let Some(socket) = jail.egress.as_ref().and_then(|e| e.socket.as_ref()) {
        // The server made it, in its own directory: no caller chose this path. Its place is
        // on bwrap's own tmpfs, like the helper's.
        b.push("--ro-bind".into());
        b.push(socket.clone().into());
        b.push(proxy_socket_inside(sb).into());
    }
    // The helper last: no mount made after it can cover it.
    b.push("--ro-bind".into());
    b.push(sb.helper.clone().into());
    b.push(helper_in.into());
    // bwrap enters "/": the working directory belongs to the pool uid, which root without
    // CAP_DAC_OVERRIDE may not enter. The helper's child enters it after the uid drop.
    push(&mut b, &["--chdir", "/", "--", helper_in]);
    b.extend(args.to_args());
    Ok(CommandLine {
        program: sb.bwrap.clone().unwrap_or_else(|| PathBuf::from("bwrap")),
        args: b,
        wrapped: true,
        fds,
    })
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

/// The read-only root, the masks, the private /tmp, /dev and /dev/shm, /proc.
fn mounts(sb: &Sandbox, b: &mut Vec<OsString>) {
    // Order matters: the read-only root, then the masks, then what is bound back in.
    push(b, &["--ro-bind", "/", "/"]);
    for m in &sb.masked {
        if m != Path::new("/tmp") {
            b.push("--tmpfs".into());
            b.push(m.clone().into());
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
}

/// Directories bwrap would create on the way to a bind inside a mask (0700 root by default).
fn parents(sb: &Sandbox, jail: &Jail) -> BTreeSet<PathBuf> {
    let mut parents = BTreeSet::new();
    for p in jail.ro.iter().chain(&jail.rw) {
        for a in p.ancestors().skip(1) {
            if sb.masked.iter().any(|m| a.starts_with(m) && a != m) {
                parents.insert(a.to_path_buf());
            }
        }
    }
    parents
}

/// The spawn's own directories, bound by descriptor (read-only ones first, so a session's
/// control directory and its working directory are each what they should be), with the
/// directories on the way created passable.
fn binds(sb: &Sandbox, jail: &Jail, b: &mut Vec<OsString>) -> std::io::Result<Vec<(OwnedFd, i32)>> {
    // Create the directories on the way 0711 first, so the pool uid can pass through (and
    // still not list).
    for a in parents(sb, jail) {
        push(b, &["--perms", "0711", "--dir"]);
        b.push(a.into());
    }
    let mut fds = Vec::new();
    let targets = jail.ro.iter().map(|p| ("--ro-bind-fd", p));
    for (flag, p) in targets.chain(jail.rw.iter().map(|p| ("--bind-fd", p))) {
        let n = FIRST_BIND_FD + fds.len() as i32;
        fds.push((open_dir(p)?, n));
        push(b, &[flag, &n.to_string()]);
        b.push(p.clone().into());
    }
    Ok(fds)
}

/// Where bwrap mounts over the host's root with a filesystem of its own, fresh and private:
/// what lies below is bwrap's to create, and nobody else can change it.
pub(super) fn private_roots(sb: &Sandbox) -> Vec<PathBuf> {
    let mut roots = sb.masked.clone();
    roots.extend(["/tmp", "/dev"].map(PathBuf::from));
    roots
}

/// The uids whose directories may lie on the way to a mount: root's, and the server's own
/// (without root, bwrap runs as the server's uid, and so does user code).
pub(super) fn trusted_uids() -> Vec<u32> {
    let me = rustix::process::geteuid().as_raw();
    if me == 0 { vec![0] } else { vec![0, me] }
}

/// Check every destination of the command before bwrap gets it: the masks, bwrap's own
/// filesystems, the directories made on the way to binds, the binds and the helper's place.
fn check_mounts(sb: &Sandbox, jail: &Jail, helper_in: &Path) -> std::io::Result<()> {
    let roots = private_roots(sb);
    let binds: Vec<PathBuf> = jail.ro.iter().chain(&jail.rw).cloned().collect();
    let trusted = trusted_uids();
    let fixed = ["/tmp", "/dev", "/dev/shm", "/proc"].map(PathBuf::from);
    let made = parents(sb, jail);
    let all = sb
        .masked
        .iter()
        .chain(&fixed)
        .chain(&made)
        .chain(&binds)
        .chain(std::iter::once(&helper_in.to_path_buf()))
        .cloned()
        .collect::<Vec<_>>();
    for dest in &all {
        check_dest(dest, &roots, &binds, &trusted).map_err(std::io::Error::other)?;
    }
    Ok(())
}

/// Why bwrap could be made to mount at another place than `dest` (absolute, no `.`, `..` or
/// link): the first directory on the way, as bwrap sees it, that a user outside `trusted`
/// can change — owned by another user, or writable by group or others (a sticky one only
/// for an entry a trusted user owns: its owner may rename it). Directories under one of
/// `roots` (masks, bwrap's /tmp and /dev) are bwrap's private tmpfs unless one of `binds`
/// brings the host's back there.
pub(super) fn check_dest(
    dest: &Path,
    roots: &[PathBuf],
    binds: &[PathBuf],
    trusted: &[u32],
) -> Result<(), String> {
    use rustix::fs::{Mode, OFlags};
    let private = |at: &Path| {
        roots.iter().any(|m| at.starts_with(m)) && !binds.iter().any(|b| at.starts_with(b))
    };
    let shown = dest.display();
    let io = |at: &Path, e: rustix::io::Errno| {
        format!("cannot check the way to {shown} at {}: {e}", at.display())
    };
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut at = PathBuf::from("/");
    let mut dir =
        rustix::fs::open("/", flags | OFlags::DIRECTORY, Mode::empty()).map_err(|e| io(&at, e))?;
    for c in dest.components() {
        let name: &OsStr = match c {
            Component::RootDir => continue,
            Component::Normal(n) => n,
            _ => return Err(format!("{shown} is not a canonical path")),
        };
        if private(&at)
            && !binds
                .iter()
                .any(|b| b != dest && dest.starts_with(b) && b.starts_with(&at))
        {
            // bwrap's own from here down to `dest`.
            return Ok(());
        }
        let child = rustix::fs::openat(dir.as_fd(), name, flags, Mode::empty());
        if !private(&at) {
            let st = rustix::fs::fstat(&dir).map_err(|e| io(&at, e))?;
            let mode = st.st_mode & 0o7777;
            let safe_dir = trusted.contains(&st.st_uid) && mode & 0o022 == 0;
            let safe_entry = || {
                let child = child.as_ref().map_err(|e| io(&at, *e))?;
                let cst = rustix::fs::fstat(child).map_err(|e| io(&at, e))?;
                Ok::<bool, String>(
                    trusted.contains(&st.st_uid)
                        && mode & 0o1000 != 0
                        && trusted.contains(&cst.st_uid),
                )
            };
            if !safe_dir && !safe_entry()? {
                let who = if trusted.contains(&st.st_uid) {
                    "users other than root".to_string()
                } else {
                    format!("its owner (uid {})", st.st_uid)
                };
                return Err(format!(
                    "{shown} is mounted into the sandbox by its path, and {} (owner uid {}, \
mode {mode:04o}) lets {who} rename {:?} in it, which could redirect the mount (and run code \
as root). Every directory on the way to a directory given to the sandbox must be changeable by \
root only: owned by root and writable by no one else (in a sticky directory such as /tmp, an \
entry root owns is fine)",
                    at.display(),
                    st.st_uid,
                    name,
                ));
            }
        }
        match child {
            Ok(fd) => dir = fd,
            Err(rustix::io::Errno::NOENT) if private(&at) => return Ok(()),
            Err(e) => return Err(io(&at, e)),
        }
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
        let root_only = |p: &Path| check_dest(p, &[], &[], &[0]);
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
        // Under a private root (a mask), the way is bwrap's own tmpfs...
        assert!(check_dest(&below, std::slice::from_ref(&base), &[], &[0]).is_ok());
        // ...unless a bind brings the host's directory back there.
        let e = check_dest(
            &below.join("x"),
            std::slice::from_ref(&base),
            std::slice::from_ref(&theirs),
            &[0],
        )
        .unwrap_err();
        assert!(e.contains("uid 54321"), "{e}");
        // The server's own uid counts as root's (without root, user code runs as it anyway).
        assert!(
            check_dest(&below, &[], &[], &[0, 54_321]).is_err(),
            "base is 0777"
        );
        chmod(&base, 0o755);
        assert!(check_dest(&below, &[], &[], &[0, 54_321]).is_ok());
        assert!(check_dest(Path::new("/a/../b"), &[], &[], &[0]).is_err());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
