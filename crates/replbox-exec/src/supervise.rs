//! The helper's own life: read the program, prepare the confinement, fork, confine and exec
//! the child, then supervise the tree until the program ends or the helper is told to stop.

use std::ffi::{CString, OsString};
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, FdFlag, fcntl};
use nix::sys::resource::{Resource, setrlimit};
use nix::sys::signal::{self, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork, getpid, setsid};

use crate::args::{ExecArgs, MAX_PROGRAM_BYTES, Program};
use crate::confine::Confinement;
use crate::procfs;
use crate::status::{End, Record};

fn die(msg: &str) -> ! {
    eprintln!("replbox-exec: {msg}");
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

/// Take ownership of a descriptor the server passed, checking that it is open.
fn claim(fd: i32, what: &str) -> OwnedFd {
    // SAFETY: F_GETFD only queries the descriptor number; when it succeeds the descriptor is
    // open, and nothing else in this (single-threaded, freshly started) process owns it.
    let owned = unsafe {
        if libc::fcntl(fd, libc::F_GETFD) < 0 {
            die(&format!(
                "{what} descriptor {fd}: {}",
                std::io::Error::last_os_error()
            ));
        }
        OwnedFd::from_raw_fd(fd)
    };
    // The program must not inherit it (it could forge its own end, or read its own request).
    if let Err(e) = fcntl(&owned, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)) {
        die(&format!("{what} descriptor {fd}: {e}"));
    }
    owned
}

fn read_program(fd: Option<i32>) -> Program {
    let Some(fd) = fd else {
        die("no program descriptor (--program-fd)");
    };
    let mut bytes = Vec::new();
    let read = std::fs::File::from(claim(fd, "program"))
        .take(MAX_PROGRAM_BYTES + 1)
        .read_to_end(&mut bytes);
    if let Err(e) = read {
        die(&format!("cannot read the program: {e}"));
    }
    if bytes.len() as u64 > MAX_PROGRAM_BYTES {
        die("the program's arguments and environment are too large");
    }
    Program::decode(&bytes).unwrap_or_else(|e| die(&e))
}

/// What the child hands to `execve`, built before the fork.
struct ExecCall {
    file: CString,
    argv: Vec<CString>,
    env: Vec<CString>,
}

impl ExecCall {
    fn new(p: Program) -> Result<Self, String> {
        let c = |s: &[u8]| CString::new(s).map_err(|_| "a NUL byte in the program".to_string());
        let env = p
            .env
            .iter()
            .map(|(k, v)| {
                let mut kv = k.as_bytes().to_vec();
                kv.push(b'=');
                kv.extend_from_slice(v.as_bytes());
                c(&kv)
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            file: c(p.file.as_bytes())?,
            argv: p
                .argv
                .iter()
                .map(|a| c(a.as_bytes()))
                .collect::<Result<_, _>>()?,
            env,
        })
    }
}

/// Run the helper with its parsed arguments; never returns.
pub fn run(args: ExecArgs) -> ! {
    // The server's death (even SIGKILL) becomes a SIGTERM here, which tears the tree down.
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGTERM) {
        die(&format!("PR_SET_PDEATHSIG: {e}"));
    }
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        die(&format!("PR_SET_CHILD_SUBREAPER: {e}"));
    }
    // A fatal signal we re-raise to mirror the program must not write a core file.
    let _ = setrlimit(Resource::RLIMIT_CORE, 0, libc::RLIM_INFINITY);
    if std::os::unix::process::parent_id() == 1 {
        // The server died before PDEATHSIG was armed.
        std::process::exit(1);
    }
    let status = args.status_fd.map(|fd| claim(fd, "status"));
    let program = read_program(args.program_fd);
    // A new session: the tree is detached from the server's terminal and signals. (Inside
    // bwrap `--new-session` already made one; then this fails harmlessly.)
    let _ = setsid();
    if args.pty {
        // SAFETY: TIOCSCTTY on fd 0 (the PTY slave the server gave us) takes no pointer.
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
    let name = program.argv[0].clone();
    let call = ExecCall::new(program).unwrap_or_else(|e| die(&e));
    // Everything that can fail for a reason worth a message is prepared before the fork.
    let confine = Confinement::prepare(&args).unwrap_or_else(|e| die(&e));
    if let Some(socket) = &args.proxy_socket {
        let port = args
            .proxy_port
            .unwrap_or_else(|| die("--proxy-socket needs --proxy-port"));
        crate::bridge::start(port, socket, args.ids).unwrap_or_else(|e| die(&e));
    }

    // SAFETY: the helper is single-threaded, so the child may do anything the parent could.
    let child = match unsafe { fork() } {
        Ok(ForkResult::Child) => exec_child(&call, &name, confine),
        Ok(ForkResult::Parent { child }) => child,
        Err(e) => die(&format!("fork: {e}")),
    };
    drop(confine);
    supervise(Tree::new(child), &set, status)
}

fn exec_child(call: &ExecCall, name: &OsString, confine: Confinement) -> ! {
    // Dispositions set to "ignore" survive exec (Rust ignores SIGPIPE): restore defaults so
    // the program starts the way a shell would start it.
    for sig in 1..32 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: resetting a disposition to the default installs no handler.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
        }
    }
    let _ = signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
    if let Err(e) = confine.apply() {
        child_fail(&format!("replbox-exec: {e}\n"));
    }
    // No PATH search: the server resolved the program; a relative path is taken from the
    // working directory entered above.
    let err = match nix::unistd::execve(&call.file, &call.argv, &call.env) {
        Err(e) => e,
        Ok(never) => match never {},
    };
    child_fail(&format!(
        "replbox-exec: cannot run {}: {}\n",
        name.to_string_lossy(),
        std::io::Error::from(err)
    ))
}

/// Report a failure of the child before exec and exit 127 without running any atexit code
/// (the parent's buffered output must not be flushed twice).
fn child_fail(msg: &str) -> ! {
    let _ = nix::unistd::write(std::io::stderr(), msg.as_bytes());
    // SAFETY: _exit ends the process at once; nothing is left to run.
    unsafe { libc::_exit(127) }
}

/// The helper's children: the program and, as a subreaper, every orphan of its tree.
struct Tree {
    main: Pid,
    /// The program's end, once reaped (whichever wait reaped it).
    main_status: Option<WaitStatus>,
}

impl Tree {
    fn new(main: Pid) -> Self {
        Self {
            main,
            main_status: None,
        }
    }

    /// Reap every child that has ended, keeping the program's status. False when no child
    /// is left at all.
    fn reap(&mut self) -> bool {
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => return true,
                Ok(st @ (WaitStatus::Exited(..) | WaitStatus::Signaled(..)))
                    if st.pid() == Some(self.main) =>
                {
                    self.main_status = Some(st);
                }
                Ok(_) => {}
                Err(_) => return false, // ECHILD: nothing left
            }
        }
    }

    /// Kill every remaining descendant. As a subreaper, anything orphaned in the tree is our
    /// child, so "no children left" means "no descendants left". False if some were still
    /// there at the deadline.
    fn kill_all(&mut self) -> bool {
        let me = getpid().as_raw() as u32;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if !self.reap() {
                return true;
            }
            let victims = procfs::descendants(me);
            for pid in &victims {
                let _ = signal::kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
            }
            if Instant::now() > deadline {
                return false;
            }
            if victims.is_empty() {
                // Only zombies of ours remain, or children not yet visible: wait a moment.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

fn supervise(mut tree: Tree, set: &SigSet, status_fd: Option<OwnedFd>) -> ! {
    loop {
        let Ok(sig) = set.wait() else {
            continue;
        };
        match sig {
            Signal::SIGCHLD => {
                tree.reap();
                if let Some(status) = tree.main_status {
                    let clean = tree.kill_all();
                    mirror(status, status_fd.as_ref(), clean);
                }
            }
            Signal::SIGTERM | Signal::SIGHUP => {
                if tree.main_status.is_none() {
                    let _ = signal::kill(tree.main, Signal::SIGKILL);
                }
                let clean = tree.kill_all();
                // The program is dead now (reaped by whichever wait came first): report its
                // (killed) status.
                let status = match tree.main_status {
                    Some(st) => Ok(st),
                    None => waitpid(tree.main, None),
                };
                match status {
                    Ok(st) => mirror(st, status_fd.as_ref(), clean),
                    Err(_) => std::process::exit(128 + sig as i32),
                }
            }
            // Terminal signals go to the whole foreground group; the program gets its own.
            _ => {}
        }
    }
}

/// Exit the way the program did, after saying so on the status descriptor (with whether the
/// whole tree is known to be gone).
fn mirror(status: WaitStatus, status_fd: Option<&OwnedFd>, clean: bool) -> ! {
    let end = match status {
        WaitStatus::Exited(_, code) => End::Exited(code),
        WaitStatus::Signaled(_, sig, _) => End::Signaled(sig as i32),
        _ => std::process::exit(1),
    };
    if let Some(fd) = status_fd {
        // One small write; a closed pipe only fails.
        let _ = nix::unistd::write(fd, Record { end, clean }.line().as_bytes());
    }
    match status {
        WaitStatus::Signaled(_, sig, _) => {
            // Restore the default action, unblock, and deliver the same signal to ourselves
            // so the server observes a death by that signal. (As a pid namespace's first
            // process the kernel ignores it, hence the status record and the exit.)
            // SAFETY: resetting a disposition to the default installs no handler.
            unsafe {
                libc::signal(sig as i32, libc::SIG_DFL);
            }
            let mut one = SigSet::empty();
            one.add(sig);
            let _ = signal::sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&one), None);
            let _ = signal::raise(sig);
            std::process::exit(128 + sig as i32)
        }
        WaitStatus::Exited(_, code) => std::process::exit(code),
        _ => std::process::exit(1),
    }
}
