//! `replbox __exec [OPTIONS] -- PROGRAM ARGS…`: the small supervisor every child of the
//! server runs under. It is the small `replbox-exec` binary (or, without it, the server's
//! own binary re-executed), single-threaded and without tokio, and it stays alive as the
//! program's parent:
//!
//! * it is a child subreaper, so anything the program double-forks or `setsid`s away is
//!   re-parented to it and can still be found and killed;
//! * it starts a new session and, with `--pty`, takes the PTY on fd 0 as its controlling
//!   terminal, so Ctrl-C written to the PTY reaches the program's process group;
//! * when the program ends it kills whatever the program left behind and exits with the
//!   program's status (re-raising a fatal signal), so the server sees the program's result;
//! * SIGTERM or SIGHUP (and the server's death, through `PR_SET_PDEATHSIG`) kill the whole
//!   tree before it exits.
//!
//! Later layers (rlimits, Landlock, seccomp, uid drop) belong here too, so that they apply
//! to every interpreter the same way.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, Instant};

use nix::sys::signal::{self, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork, getpid, setsid};

/// Parsed `__exec` arguments.
#[derive(Debug, Default)]
pub struct HelperArgs {
    pub pty: bool,
    pub argv: Vec<OsString>,
}

pub const SUBCOMMAND: &str = "__exec";

impl HelperArgs {
    /// Parse the arguments after `__exec`.
    pub fn parse(args: impl Iterator<Item = OsString>) -> Result<Self, String> {
        let mut out = HelperArgs::default();
        let mut args = args.peekable();
        while let Some(a) = args.next() {
            match a.to_str() {
                Some("--pty") => out.pty = true,
                Some("--") => {
                    out.argv = args.collect();
                    break;
                }
                _ => return Err(format!("unknown option {:?}", a)),
            }
        }
        if out.argv.is_empty() {
            return Err("no program given after --".into());
        }
        Ok(out)
    }

    /// The argument list that makes the helper run `argv` with these options.
    pub fn to_args(pty: bool, argv: &[String]) -> Vec<String> {
        let mut v = Vec::with_capacity(argv.len() + 3);
        v.push(SUBCOMMAND.to_string());
        if pty {
            v.push("--pty".to_string());
        }
        v.push("--".to_string());
        v.extend(argv.iter().cloned());
        v
    }
}

fn die(msg: &str) -> ! {
    eprintln!("replbox: {msg}");
    std::process::exit(127)
}

/// Signals the helper handles synchronously (blocked, then taken with `sigwait`).
fn handled_signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGINT,
        Signal::SIGQUIT,
        Signal::SIGTSTP,
        Signal::SIGTTIN,
        Signal::SIGTTOU,
    ] {
        set.add(s);
    }
    set
}

/// Run the helper; never returns.
pub fn run(args: HelperArgs) -> ! {
    // SAFETY: plain prctl calls with integer arguments.
    unsafe {
        // The server's death (even SIGKILL) becomes a SIGTERM here, which tears the tree down.
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGTERM as libc::c_ulong,
            0,
            0,
            0,
        );
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0);
        // A fatal signal we re-raise to mirror the program must not write a core file.
        let zero = libc::rlimit {
            rlim_cur: 0,
            rlim_max: libc::RLIM_INFINITY,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &zero);
    }
    if std::os::unix::process::parent_id() == 1 {
        // The server died before PDEATHSIG was armed.
        std::process::exit(1);
    }
    // A new session: the tree is detached from the server's terminal and signals.
    let _ = setsid();
    if args.pty {
        // SAFETY: TIOCSCTTY on fd 0, which the server made the PTY slave.
        let rc = unsafe { libc::ioctl(0, libc::TIOCSCTTY as _, 0) };
        if rc != 0 {
            die(&format!(
                "cannot take the terminal: {}",
                std::io::Error::last_os_error()
            ));
        }
    }

    let set = handled_signals();
    if let Err(e) = signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), None) {
        die(&format!("sigprocmask: {e}"));
    }

    let argv: Vec<CString> = args
        .argv
        .iter()
        .map(|a| CString::new(a.as_bytes()).unwrap_or_else(|_| die("argument contains NUL")))
        .collect();

    // SAFETY: single-threaded process; the child only calls async-signal-safe functions
    // (sigprocmask, signal, execvp, write, _exit) before exec.
    let child = match unsafe { fork() } {
        Ok(ForkResult::Child) => exec_child(&argv),
        Ok(ForkResult::Parent { child }) => child,
        Err(e) => die(&format!("fork: {e}")),
    };
    supervise(child, &set)
}

fn exec_child(argv: &[CString]) -> ! {
    // Dispositions set to "ignore" survive exec (Rust ignores SIGPIPE): restore defaults so
    // the program starts the way a shell would start it.
    for sig in 1..32 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: resetting a signal disposition to default.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
        }
    }
    let _ = signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
    let err = nix::unistd::execvp(&argv[0], argv).unwrap_err();
    let msg = format!(
        "replbox: cannot run {}: {}\n",
        argv[0].to_string_lossy(),
        std::io::Error::from_raw_os_error(err as i32)
    );
    // SAFETY: write(2) and _exit(2) are async-signal-safe.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::_exit(127)
    }
}

fn supervise(main: Pid, set: &SigSet) -> ! {
    loop {
        let sig = match set.wait() {
            Ok(s) => s,
            Err(_) => continue,
        };
        match sig {
            Signal::SIGCHLD => {
                if let Some(status) = reap_all(main) {
                    kill_descendants();
                    mirror(status);
                }
            }
            Signal::SIGTERM | Signal::SIGHUP => {
                let _ = signal::kill(main, Signal::SIGKILL);
                kill_descendants();
                // The main program is dead now; report its (killed) status.
                match waitpid(main, None) {
                    Ok(status) => mirror(status),
                    Err(_) => std::process::exit(128 + sig as i32),
                }
            }
            // Terminal signals go to the whole foreground group; the program gets its own.
            _ => {}
        }
    }
}

/// Reap every exited child; return the main program's status if it was among them.
fn reap_all(main: Pid) -> Option<WaitStatus> {
    let mut main_status = None;
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => break,
            Ok(status) => {
                if status.pid() == Some(main)
                    && matches!(status, WaitStatus::Exited(..) | WaitStatus::Signaled(..))
                {
                    main_status = Some(status);
                }
            }
        }
    }
    main_status
}

/// Kill every remaining descendant. As a subreaper, anything orphaned in the tree is our
/// child, so "no children left" means "no descendants left".
fn kill_descendants() {
    let me = getpid();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        // Reap what is already dead; stop as soon as we have no children at all.
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => break,
                Ok(_) => continue,
                Err(_) => return, // ECHILD: nothing left
            }
        }
        let victims = descendants(me);
        for pid in &victims {
            let _ = signal::kill(*pid, Signal::SIGKILL);
        }
        if Instant::now() > deadline {
            return;
        }
        if victims.is_empty() {
            // Only zombies of ours remain, or children not yet visible: wait a moment.
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// All live descendants of `root`, from /proc.
pub fn descendants(root: Pid) -> Vec<Pid> {
    let mut parent_of: Vec<(i32, i32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            if let Some((ppid, state)) = read_ppid_state(pid)
                && state != 'Z'
            {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![root.as_raw()];
    while let Some(p) = frontier.pop() {
        for &(pid, ppid) in &parent_of {
            if ppid == p {
                out.push(Pid::from_raw(pid));
                frontier.push(pid);
            }
        }
    }
    out
}

/// Parent pid and state letter from /proc/PID/stat (the command name may contain spaces and
/// parentheses, so parse after the last ')').
pub fn read_ppid_state(pid: i32) -> Option<(i32, char)> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    let mut it = rest.split_whitespace();
    let state = it.next()?.chars().next()?;
    let ppid = it.next()?.parse().ok()?;
    Some((ppid, state))
}

/// Exit the way the program did.
fn mirror(status: WaitStatus) -> ! {
    match status {
        WaitStatus::Exited(_, code) => std::process::exit(code),
        WaitStatus::Signaled(_, sig, _) => {
            // SAFETY: restore the default action, unblock, and deliver the same signal to
            // ourselves so the server observes a death by that signal.
            unsafe {
                libc::signal(sig as i32, libc::SIG_DFL);
            }
            let mut one = SigSet::empty();
            one.add(sig);
            let _ = signal::sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&one), None);
            let _ = signal::raise(sig);
            std::process::exit(128 + sig as i32)
        }
        _ => std::process::exit(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_round_trip() {
        let args = HelperArgs::to_args(true, &["python3".into(), "-c".into(), "--".into()]);
        let parsed =
            HelperArgs::parse(args.into_iter().skip(1).map(OsString::from)).expect("parses");
        assert!(parsed.pty);
        assert_eq!(parsed.argv, vec!["python3", "-c", "--"]);
    }

    #[test]
    fn parse_rejects_missing_program() {
        assert!(HelperArgs::parse(["--pty".into(), "--".into()].into_iter()).is_err());
        assert!(HelperArgs::parse(["--what".into()].into_iter()).is_err());
    }

    #[test]
    fn ppid_of_self() {
        let (ppid, state) = read_ppid_state(std::process::id() as i32).expect("stat");
        assert_eq!(ppid, std::os::unix::process::parent_id() as i32);
        assert!(state == 'R' || state == 'S');
    }
}
