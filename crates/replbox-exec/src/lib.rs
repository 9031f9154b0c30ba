//! `replbox-exec`: the small supervisor every child of the replbox server runs under, and the
//! only code that runs with the server's privileges (root, when the server is) once the
//! server hands a program over. This crate is that security boundary, to be read on its own.
//!
//! The server starts it as `replbox-exec ARGS` ([`ExecArgs`]; at level `bwrap` as the first
//! process of a bubblewrap sandbox) with an empty environment, in `/`, and two descriptors:
//! the status pipe ([`STATUS_FD`]) and the [`Program`] ([`PROGRAM_FD`]): the path, argv
//! and environment to run, which carry the caller's values as data.
//!
//! What it guarantees:
//!
//! * The caller's values (arguments, environment) are never in the helper's own
//!   environment or command line; they reach only `execve` in the child, after every layer
//!   below is in place. The program is not searched for on a `PATH`.
//! * In the child, in this order, before `execve`: rlimits; with `--private-shm` (level
//!   `landlock`) a private /dev/shm where the kernel allows one; as root the uid drop
//!   (capability bounding set emptied, supplementary groups dropped, gid, uid,
//!   `no_new_privs`, verified); `chdir` as that uid; Landlock (rules opened without
//!   following symbolic links); seccomp; every descriptor above 2 closed. A layer that fails
//!   stops the child (exit 127) with a message on stderr.
//! * The helper keeps its identity (it must read /proc and kill the whole tree). It is a
//!   child subreaper in its own session (with `--pty`, the PTY on fd 0 becomes the
//!   controlling terminal), so nothing the program forks or daemonizes escapes it.
//! * When the program ends, or on SIGTERM or SIGHUP (the server's death arrives as SIGTERM
//!   through `PR_SET_PDEATHSIG`), every process of the tree is killed and reaped; the helper
//!   then writes the program's exact end and whether the tree was seen gone ([`status`]) and
//!   exits the same way.
//! * With `--proxy-socket` (inside bwrap's network namespace), a bridge process of the tree,
//!   as the program's uid, relays `127.0.0.1:PORT` to the server's egress proxy ([`bridge`]);
//!   with `--proxy-port`, Landlock lets the program connect to that TCP port and no other,
//!   and seccomp allows IP stream sockets only.
//!
mod args;
mod bridge;
mod confine;
mod landlock;
mod procfs;
mod seccomp;
pub mod status;
mod supervise;

pub use args::{ExecArgs, LandlockMode, MAX_PROGRAM_BYTES, PROGRAM_FD, Program, Rlimit, STATUS_FD};
pub use supervise::run;

/// The binary's entry point: parse the command line and run; returns only on a bad one.
#[cfg(target_os = "linux")]
pub fn main() -> i32 {
    // glibc hands the arguments to std before `main` runs, so `args_os` works without
    // Rust's runtime start-up.
    match ExecArgs::from_args(std::env::args_os().skip(1)) {
        Ok(args) => run(args),
        Err(e) => {
            eprintln!("replbox-exec: {e} (this is replbox's internal helper; run `replbox`)");
            127
        }
    }
}
