//! `replbox __exec [OPTIONS] -- PROGRAM ARGS…`: the small supervisor every child of the
//! server runs under. It is the small `replbox-exec` binary (or, without it, the server's
//! own binary re-executed), single-threaded and without tokio, and it stays alive as the
//! program's parent:
//!
//! * it is a child subreaper, so anything the program double-forks or `setsid`s away is
//!   re-parented to it and can still be found and killed (inside bwrap it is the pid
//!   namespace's first process, which does the same and more: the kernel kills the whole
//!   namespace when it exits);
//! * it starts a new session and, with `--pty`, takes the PTY on fd 0 as its controlling
//!   terminal, so Ctrl-C written to the PTY reaches the program's process group;
//! * when the program ends it kills whatever the program left behind and exits with the
//!   program's status (re-raising a fatal signal, and writing it to `--status-fd`, because
//!   bwrap and a pid namespace's first process cannot pass a death by signal on);
//! * SIGTERM or SIGHUP (and the server's death, through `PR_SET_PDEATHSIG`) kill the whole
//!   tree before it exits.
//!
//! The confinement layers are applied in the forked child only, just before `exec`, in this
//! order: rlimits; the uid drop (bounding set emptied, supplementary groups dropped, gid,
//! uid); `chdir` (as the new uid, so a directory it may not enter is refused here); Landlock;
//! seccomp; closing every descriptor above 2. The helper itself keeps its identity: it must
//! still be able to read /proc and kill the program's whole tree.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::{self, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork, getpid, setsid};

mod confine;

/// Whether the Landlock ruleset must be enforced (level `landlock`) or is defence in depth
/// (inside bwrap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LandlockMode {
    Required,
    BestEffort,
}

/// Parsed `__exec` arguments.
#[derive(Debug, Default)]
pub struct HelperArgs {
    pub pty: bool,
    /// Descriptor to report the program's end on (`exit N` or `signal N`).
    pub status_fd: Option<i32>,
    /// Directory to enter, after the uid drop.
    pub chdir: Option<PathBuf>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// (resource, value) pairs, soft = hard.
    pub rlimits: Vec<(Rlimit, u64)>,
    pub landlock: Option<LandlockMode>,
    pub read: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
    /// Network allowed (no TCP rules in Landlock, IP sockets allowed by seccomp).
    pub net: bool,
    pub seccomp: bool,
    pub argv: Vec<OsString>,
}

/// The resource limits the helper knows by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rlimit {
    Data,
    Nproc,
    Fsize,
    Nofile,
    Cpu,
}

impl Rlimit {
    fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "data" => Rlimit::Data,
            "nproc" => Rlimit::Nproc,
            "fsize" => Rlimit::Fsize,
            "nofile" => Rlimit::Nofile,
            "cpu" => Rlimit::Cpu,
            _ => return None,
        })
    }

    fn resource(self) -> libc::__rlimit_resource_t {
        match self {
            Rlimit::Data => libc::RLIMIT_DATA,
            Rlimit::Nproc => libc::RLIMIT_NPROC,
            Rlimit::Fsize => libc::RLIMIT_FSIZE,
            Rlimit::Nofile => libc::RLIMIT_NOFILE,
            Rlimit::Cpu => libc::RLIMIT_CPU,
        }
    }
}

pub const SUBCOMMAND: &str = "__exec";

impl HelperArgs {
    /// Parse the arguments after `__exec`.
    pub fn parse(args: impl Iterator<Item = OsString>) -> Result<Self, String> {
        let mut out = HelperArgs::default();
        let mut args = args.peekable();
        let value = |args: &mut std::iter::Peekable<_>, name: &str| -> Result<OsString, String> {
            args.next().ok_or_else(|| format!("{name} needs a value"))
        };
        let num = |v: OsString, name: &str| -> Result<u64, String> {
            v.to_str()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| format!("{name}: not a number: {v:?}"))
        };
        while let Some(a) = args.next() {
            match a.to_str() {
                Some("--pty") => out.pty = true,
                Some("--net") => out.net = true,
                Some("--seccomp") => out.seccomp = true,
                Some(name @ "--status-fd") => {
                    let v = num(value(&mut args, name)?, name)?;
                    out.status_fd = Some(i32::try_from(v).map_err(|_| "--status-fd too large")?);
                }
                Some(name @ "--chdir") => out.chdir = Some(value(&mut args, name)?.into()),
                Some(name @ "--uid") => {
                    let v = num(value(&mut args, name)?, name)?;
                    out.uid = Some(u32::try_from(v).map_err(|_| "--uid too large")?);
                }
                Some(name @ "--gid") => {
                    let v = num(value(&mut args, name)?, name)?;
                    out.gid = Some(u32::try_from(v).map_err(|_| "--gid too large")?);
                }
                Some(name @ "--rlimit") => {
                    let v = value(&mut args, name)?;
                    let s = v.to_str().ok_or("--rlimit: not UTF-8")?;
                    let (k, n) = s
                        .split_once('=')
                        .ok_or_else(|| format!("--rlimit {s}: expected NAME=VALUE"))?;
                    let r = Rlimit::parse(k).ok_or_else(|| format!("--rlimit: unknown {k}"))?;
                    out.rlimits.push((r, num(n.into(), name)?));
                }
                Some(name @ "--landlock") => {
                    out.landlock = Some(match value(&mut args, name)?.to_str() {
                        Some("required") => LandlockMode::Required,
                        Some("best-effort") => LandlockMode::BestEffort,
                        other => return Err(format!("--landlock: unknown mode {other:?}")),
                    })
                }
                Some(name @ "--read") => out.read.push(value(&mut args, name)?.into()),
                Some(name @ "--write") => out.write.push(value(&mut args, name)?.into()),
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
        if out.uid.is_some() != out.gid.is_some() {
            return Err("--uid and --gid go together".into());
        }
        Ok(out)
    }

    /// The argument list that makes the helper run `argv` with no confinement.
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
    if let Some(fd) = args.status_fd {
        // The program must not inherit the report channel (it could forge its own end).
        // SAFETY: F_SETFD on a descriptor number; a bad one just fails.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
            die(&format!(
                "--status-fd {fd}: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    // A new session: the tree is detached from the server's terminal and signals. (Inside
    // bwrap `--new-session` already made one; then this fails harmlessly.)
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
    // Everything that can fail for a reason worth a message is prepared before the fork.
    let confine = confine::Confinement::prepare(&args).unwrap_or_else(|e| die(&e));

    // SAFETY: the helper is single-threaded, so the child may do anything the parent could.
    let child = match unsafe { fork() } {
        Ok(ForkResult::Child) => exec_child(&argv, confine),
        Ok(ForkResult::Parent { child }) => child,
        Err(e) => die(&format!("fork: {e}")),
    };
    drop(confine);
    supervise(child, &set, args.status_fd)
}

fn exec_child(argv: &[CString], confine: confine::Confinement) -> ! {
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
    if let Err(e) = confine.apply() {
        child_fail(&format!("replbox: {e}\n"));
    }
    let err = nix::unistd::execvp(&argv[0], argv).unwrap_err();
    child_fail(&format!(
        "replbox: cannot run {}: {}\n",
        argv[0].to_string_lossy(),
        std::io::Error::from_raw_os_error(err as i32)
    ))
}

/// Report a failure of the child before exec and exit 127 without running any atexit code.
fn child_fail(msg: &str) -> ! {
    // SAFETY: write(2) and _exit(2).
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::_exit(127)
    }
}

fn supervise(main: Pid, set: &SigSet, status_fd: Option<i32>) -> ! {
    loop {
        let sig = match set.wait() {
            Ok(s) => s,
            Err(_) => continue,
        };
        match sig {
            Signal::SIGCHLD => {
                if let Some(status) = reap_all(main) {
                    let clean = kill_descendants();
                    mirror(status, status_fd, clean);
                }
            }
            Signal::SIGTERM | Signal::SIGHUP => {
                let _ = signal::kill(main, Signal::SIGKILL);
                let clean = kill_descendants();
                // The main program is dead now; report its (killed) status.
                match waitpid(main, None) {
                    Ok(status) => mirror(status, status_fd, clean),
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
/// child, so "no children left" means "no descendants left". False if some were still
/// there at the deadline.
fn kill_descendants() -> bool {
    let me = getpid();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        // Reap what is already dead; stop as soon as we have no children at all.
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => break,
                Ok(_) => continue,
                Err(_) => return true, // ECHILD: nothing left
            }
        }
        let victims = descendants(me);
        for pid in &victims {
            let _ = signal::kill(*pid, Signal::SIGKILL);
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

/// Exit the way the program did, after saying so on the status descriptor (with whether the
/// whole tree is known to be gone: the server then need not sweep the uid).
fn mirror(status: WaitStatus, status_fd: Option<i32>, clean: bool) -> ! {
    let tree = if clean { "clean" } else { "left" };
    let record = match status {
        WaitStatus::Exited(_, code) => format!("exit {code} {tree}\n"),
        WaitStatus::Signaled(_, sig, _) => format!("signal {} {tree}\n", sig as i32),
        _ => String::new(),
    };
    if let Some(fd) = status_fd
        && !record.is_empty()
    {
        // SAFETY: one small write to our own descriptor; a closed pipe only fails.
        unsafe {
            libc::write(fd, record.as_ptr().cast(), record.len());
        }
    }
    match status {
        WaitStatus::Exited(_, code) => std::process::exit(code),
        WaitStatus::Signaled(_, sig, _) => {
            // SAFETY: restore the default action, unblock, and deliver the same signal to
            // ourselves so the server observes a death by that signal. (As a pid namespace's
            // first process the kernel ignores it, hence the status record and the exit.)
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

/// Parse a status record written by [`mirror`]: the raw wait status it stands for, and
/// whether the helper saw the whole tree gone.
pub fn parse_status_record(record: &str) -> Option<(i32, bool)> {
    let mut it = record.split_whitespace();
    let (kind, n, tree) = (it.next()?, it.next()?, it.next()?);
    let n: i32 = n.parse().ok()?;
    let raw = match kind {
        "exit" if (0..=255).contains(&n) => n << 8,
        "signal" if (1..128).contains(&n) => n,
        _ => return None,
    };
    Some((raw, tree == "clean"))
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
    fn parse_confinement_flags() {
        let args: Vec<OsString> = [
            "--status-fd",
            "3",
            "--chdir",
            "/w",
            "--uid",
            "100001",
            "--gid",
            "100001",
            "--rlimit",
            "data=1024",
            "--rlimit",
            "nproc=5",
            "--landlock",
            "required",
            "--read",
            "/usr",
            "--write",
            "/w",
            "--seccomp",
            "--",
            "true",
        ]
        .into_iter()
        .map(OsString::from)
        .collect();
        let p = HelperArgs::parse(args.into_iter()).expect("parses");
        assert_eq!(p.status_fd, Some(3));
        assert_eq!(p.uid, Some(100001));
        assert_eq!(p.rlimits, vec![(Rlimit::Data, 1024), (Rlimit::Nproc, 5)]);
        assert_eq!(p.landlock, Some(LandlockMode::Required));
        assert!(p.seccomp && !p.net);
        assert!(
            HelperArgs::parse(["--uid".into(), "1".into(), "--".into(), "x".into()].into_iter())
                .is_err()
        );
        assert!(
            HelperArgs::parse(
                ["--rlimit".into(), "bogus=1".into(), "--".into(), "x".into()].into_iter()
            )
            .is_err()
        );
    }

    #[test]
    fn status_records_round_trip() {
        use std::os::unix::process::ExitStatusExt;
        let (raw, clean) = parse_status_record("exit 3 clean\n").expect("exit");
        assert_eq!(std::process::ExitStatus::from_raw(raw).code(), Some(3));
        assert!(clean);
        let (raw, clean) = parse_status_record("signal 11 left").expect("sig");
        assert_eq!(std::process::ExitStatus::from_raw(raw).signal(), Some(11));
        assert!(!clean);
        assert_eq!(parse_status_record("exit 300 clean"), None);
        assert_eq!(parse_status_record("exit 3"), None);
        assert_eq!(parse_status_record("garbage"), None);
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
