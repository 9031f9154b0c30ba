//! The bwrap command line: namespaces, capabilities, the read-only root with the masks, the
//! private /tmp and /dev/shm, the helper bound in, and the spawn's own directories bound by
//! descriptor.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

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
    let mut b = namespaces(sb);
    mounts(sb, &mut b);
    b.push("--ro-bind".into());
    b.push(sb.helper.clone().into());
    b.push(helper_in.into());
    if let Some(socket) = jail.egress.as_ref().and_then(|e| e.socket.as_ref()) {
        // The server made it, in its own directory: no caller chose this path.
        b.push("--ro-bind".into());
        b.push(socket.clone().into());
        b.push(proxy_socket_inside(sb).into());
    }
    let fds = binds(sb, jail, &mut b)?;
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

/// The spawn's own directories, bound by descriptor (read-only ones first, so a session's
/// control directory and its working directory are each what they should be), with the
/// directories on the way created passable.
fn binds(sb: &Sandbox, jail: &Jail, b: &mut Vec<OsString>) -> std::io::Result<Vec<(OwnedFd, i32)>> {
    // Directories bwrap would create on the way to a bind inside a mask are 0700 root:
    // create them 0711 first, so the pool uid can pass through (and still not list).
    let mut parents = BTreeSet::new();
    for p in jail.ro.iter().chain(&jail.rw) {
        for a in p.ancestors().skip(1) {
            if sb.masked.iter().any(|m| a.starts_with(m) && a != m) {
                parents.insert(a.to_path_buf());
            }
        }
    }
    for a in parents {
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
