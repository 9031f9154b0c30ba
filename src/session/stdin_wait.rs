//! Is a process tree blocked reading its terminal? Decided from process state under /proc,
//! never from a timer: for every thread of every process in the tree, the system call it is
//! blocked in (`/proc/PID/task/TID/syscall`) and the descriptors it waits on:
//!
//! * `read`/`readv`/`pread64` on a descriptor that is the terminal;
//! * `poll`/`ppoll`/`select`/`pselect6` whose descriptor set (read from `/proc/PID/mem`)
//!   includes the terminal for reading;
//! * `epoll_wait`/`epoll_pwait*` on an epoll instance (`/proc/PID/fdinfo`) that has the
//!   terminal registered for input.
//!
//! "The terminal" is matched by device number, so it works whatever the path inside a
//! sandbox's /dev looks like; a descriptor opened on `/dev/tty` (getpass, a child asking
//! for a password) is the terminal when the process's controlling terminal is.
//!
//! A wait also has its timeout (the system call's argument, or the terminal's VTIME for a
//! read), so a program that waits a moment for optional input is told from one that waits
//! for an answer.

use std::time::Duration;

use procfs::process::Syscall;

use crate::proc;

use crate::lang::spec::InputWait;

/// The waiting system calls by number, with where each keeps its timeout.
#[cfg(target_arch = "x86_64")]
const CALLS: &[(u64, Kind)] = &[
    (0, Kind::Read),
    (17, Kind::Read),     // pread64
    (19, Kind::Read),     // readv
    (7, Kind::Poll),      // timeout in ms, third argument
    (271, Kind::Ppoll),   // struct timespec *, third argument
    (23, Kind::Select),   // struct timeval *, fifth argument
    (270, Kind::Pselect), // pselect6: struct timespec *, fifth argument
    (232, Kind::Epoll),   // epoll_wait: ms, fourth argument
    (281, Kind::Epoll),   // epoll_pwait
    (441, Kind::Epoll2),  // epoll_pwait2: struct timespec *, fourth argument
];

#[cfg(target_arch = "aarch64")]
const CALLS: &[(u64, Kind)] = &[
    (63, Kind::Read),
    (65, Kind::Read),    // readv
    (67, Kind::Read),    // pread64
    (73, Kind::Ppoll),   // ppoll
    (72, Kind::Pselect), // pselect6
    (22, Kind::Epoll),   // epoll_pwait
    (441, Kind::Epoll2), // epoll_pwait2
];

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const CALLS: &[(u64, Kind)] = &[];

/// `/dev/tty`: whichever terminal is the process's controlling one.
const DEV_TTY: u64 = 5 << 8;

/// A wait for input from the terminal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wait {
    /// Which thread, in which system call (for the logs).
    pub(crate) who: String,
    /// How long the wait lasts at most (None: until input comes).
    pub(crate) timeout: Option<Duration>,
}

/// The terminal a tree is judged against: its device number, the kinds of wait that count,
/// and how long a read on it lasts (None: until input comes; the terminal's VTIME when it
/// is out of canonical mode with VMIN 0).
pub(crate) struct Terminal<'a> {
    pub(crate) rdev: u64,
    pub(crate) signals: &'a [InputWait],
    pub(crate) read_timeout: Option<Duration>,
}

/// A process in the tree rooted at `root` (excluding `root` itself, the helper) blocked
/// waiting for input from the terminal. When several are, an untimed wait wins, then the
/// longest.
pub(crate) fn tree_wait(root: u32, term: &Terminal<'_>) -> Option<Wait> {
    let mut best: Option<Wait> = None;
    for pid in proc::descendants(root) {
        if let Some(w) = process_wait(pid, term)
            && better(w.timeout, best.as_ref())
        {
            let untimed = w.timeout.is_none();
            best = Some(w);
            if untimed {
                break;
            }
        }
    }
    best
}

/// One process (any of its threads) blocked waiting for input from the terminal. A runtime
/// may wait for the terminal in one thread with no timeout while another thread keeps the
/// timer that ends the wait (GHC's `System.Timeout.timeout`): the longest timed wait of the
/// process's other threads then bounds the read.
pub(crate) fn process_wait(pid: u32, term: &Terminal<'_>) -> Option<Wait> {
    let mut best: Option<Wait> = None;
    let mut timer: Option<Duration> = None;
    for tid in proc::threads(pid) {
        let Some(call) = proc::syscall(pid, tid).and_then(|s| Call::of(&s)) else {
            continue;
        };
        if !call.reads_tty(pid, term) {
            if let Some(t) = call.timeout(pid, term) {
                timer = timer.max(t);
            }
            continue;
        }
        let timeout = call.timeout(pid, term).unwrap_or(None);
        if better(timeout, best.as_ref()) {
            best = Some(Wait {
                who: format!("pid {pid} thread {tid} in syscall {}", call.nr),
                timeout,
            });
        }
    }
    if let Some(w) = best.as_mut()
        && w.timeout.is_none()
    {
        w.timeout = timer;
    }
    best
}

/// Whether a wait with `timeout` says more than `than`: untimed beats timed, then longer.
fn better(timeout: Option<Duration>, than: Option<&Wait>) -> bool {
    match than {
        None => true,
        Some(b) => match (timeout, b.timeout) {
            (None, Some(_)) => true,
            (Some(a), Some(b)) => a > b,
            _ => false,
        },
    }
}

/// Which waiting system call a thread is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Poll,
    Ppoll,
    Select,
    Pselect,
    Epoll,
    Epoll2,
}

/// A thread's system call (`/proc/.../syscall`): its number and arguments.
struct Call {
    nr: u64,
    kind: Kind,
    args: [u64; 6],
}

impl Call {
    /// None for a running thread, or a call that is not a wait.
    fn of(call: &Syscall) -> Option<Self> {
        let Syscall::Blocked {
            syscall_number,
            argument_registers,
            ..
        } = call
        else {
            return None;
        };
        let nr = u64::try_from(*syscall_number).ok()?;
        let kind = CALLS.iter().find(|(n, _)| *n == nr)?.1;
        Some(Self {
            nr,
            kind,
            args: *argument_registers,
        })
    }

    /// Whether the call waits for input from the terminal, judged by the kinds of wait the
    /// language counts.
    fn reads_tty(&self, pid: u32, term: &Terminal<'_>) -> bool {
        let (a, tty) = (&self.args, term.rdev);
        let on = |w: InputWait| term.signals.contains(&w);
        match self.kind {
            Kind::Read => on(InputWait::Read) && fd_is_tty(pid, a[0], tty),
            Kind::Select | Kind::Pselect => {
                on(InputWait::Select) && select_reads_tty(pid, a[0], a[1], tty)
            }
            Kind::Poll | Kind::Ppoll => on(InputWait::Poll) && poll_reads_tty(pid, a[0], a[1], tty),
            Kind::Epoll | Kind::Epoll2 => on(InputWait::Epoll) && epoll_reads_tty(pid, a[0], tty),
        }
    }

    /// How long the call waits at most: None when it is no timed wait at all (a read of
    /// something else than the terminal), Some(None) when it waits until something comes.
    fn timeout(&self, pid: u32, term: &Terminal<'_>) -> Option<Option<Duration>> {
        let a = &self.args;
        Some(match self.kind {
            Kind::Read => {
                if fd_is_tty(pid, a[0], term.rdev) {
                    term.read_timeout
                } else {
                    return None;
                }
            }
            Kind::Select => timeval(pid, a[4], TimeUnit::Micros),
            Kind::Pselect => timeval(pid, a[4], TimeUnit::Nanos),
            Kind::Poll => millis(a[2]),
            Kind::Ppoll => timeval(pid, a[2], TimeUnit::Nanos),
            Kind::Epoll => millis(a[3]),
            Kind::Epoll2 => timeval(pid, a[3], TimeUnit::Nanos),
        })
    }
}

/// A timeout in milliseconds as a C `int` (negative: none).
fn millis(arg: u64) -> Option<Duration> {
    let ms = arg as u32 as i32;
    (ms >= 0).then(|| Duration::from_millis(ms as u64))
}

enum TimeUnit {
    Micros,
    Nanos,
}

/// A `struct timeval` or `struct timespec` in the process's memory (a null pointer, or one
/// that cannot be read: no timeout). The kernel writes the time left back only when the
/// call returns, so this is the wait's whole timeout.
fn timeval(pid: u32, addr: u64, unit: TimeUnit) -> Option<Duration> {
    if addr == 0 {
        return None;
    }
    let raw = proc::read_mem(pid, addr, 16)?;
    let sec = i64::from_ne_bytes(raw[..8].try_into().ok()?);
    let frac = i64::from_ne_bytes(raw[8..].try_into().ok()?);
    if sec < 0 || frac < 0 {
        return None;
    }
    let frac = match unit {
        TimeUnit::Micros => Duration::from_micros(frac as u64),
        TimeUnit::Nanos => Duration::from_nanos(frac as u64),
    };
    Some(Duration::from_secs(sec as u64).saturating_add(frac))
}

/// Whether descriptor `fd` of `pid` is the terminal: the terminal's own device, or
/// `/dev/tty` in a process whose controlling terminal it is.
fn fd_is_tty(pid: u32, fd: u64, tty: u64) -> bool {
    match proc::fd_rdev(pid, fd) {
        Some(rdev) if rdev == tty => true,
        Some(DEV_TTY) => proc::tty_nr(pid) == Some(tty),
        _ => false,
    }
}

/// `select(nfds, readfds, …)`: read the readfds bitmap from the process's memory.
fn select_reads_tty(pid: u32, nfds: u64, readfds: u64, tty: u64) -> bool {
    if readfds == 0 || nfds == 0 || nfds > 1024 {
        return false;
    }
    let bytes = nfds.div_ceil(64) * 8;
    let Some(bits) = proc::read_mem(pid, readfds, bytes as usize) else {
        return false;
    };
    (0..nfds).any(|fd| {
        let byte = bits[(fd / 8) as usize];
        byte & (1 << (fd % 8)) != 0 && fd_is_tty(pid, fd, tty)
    })
}

/// `poll(fds, nfds, …)`: each `struct pollfd` is {int fd; short events; short revents}.
fn poll_reads_tty(pid: u32, fds: u64, nfds: u64, tty: u64) -> bool {
    if fds == 0 || nfds == 0 || nfds > 4096 {
        return false;
    }
    let Some(raw) = proc::read_mem(pid, fds, (nfds * 8) as usize) else {
        return false;
    };
    raw.chunks_exact(8).any(|p| {
        let fd = i32::from_ne_bytes([p[0], p[1], p[2], p[3]]);
        let events = i16::from_ne_bytes([p[4], p[5]]);
        fd >= 0 && events & (libc::POLLIN | libc::POLLPRI) != 0 && fd_is_tty(pid, fd as u64, tty)
    })
}

/// `epoll_wait(epfd, …)`: the registrations are listed in /proc/PID/fdinfo/EPFD as
/// `tfd: FD events: MASK …`.
fn epoll_reads_tty(pid: u32, epfd: u64, tty: u64) -> bool {
    let Some(info) = proc::fdinfo(pid, epfd) else {
        return false;
    };
    info.lines().any(|l| {
        let mut it = l.split_whitespace();
        if it.next() != Some("tfd:") {
            return false;
        }
        let fd = it.next().and_then(|s| s.parse::<u64>().ok());
        let events = match (it.next(), it.next()) {
            (Some("events:"), Some(m)) => u32::from_str_radix(m, 16).ok(),
            _ => None,
        };
        match (fd, events) {
            (Some(fd), Some(ev)) => ev & (libc::EPOLLIN as u32) != 0 && fd_is_tty(pid, fd, tty),
            _ => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    fn wait_until(mut f: impl FnMut() -> bool) -> bool {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    fn term(rdev: u64) -> Terminal<'static> {
        Terminal {
            rdev,
            signals: &[
                InputWait::Read,
                InputWait::Poll,
                InputWait::Select,
                InputWait::Epoll,
            ],
            read_timeout: None,
        }
    }

    /// A `/proc/.../syscall` line as procfs reads it.
    fn call(line: &str) -> Option<Call> {
        let s: Syscall = procfs::FromRead::from_read(line.as_bytes()).ok()?;
        Call::of(&s)
    }

    #[test]
    fn parses_running_and_garbage() {
        assert!(call("running").is_none());
        assert!(call("").is_none());
        assert!(call("-1 0x7ffc 0x7ff").is_none()); // blocked, not in a system call
        assert!(call("202 0x1 0x2 0x3 0x4 0x5 0x6 0x7 0x8").is_none()); // futex
        let poll = call("7 0x10 0x2 0xbb8 0x0 0x0 0x0 0x7ff 0x7ff").expect("poll");
        assert_eq!(
            poll.timeout(1, &term(0)),
            Some(Some(Duration::from_millis(3000)))
        );
        assert_eq!(millis(u64::from(u32::MAX)), None);
        assert_eq!(millis(1500), Some(Duration::from_millis(1500)));
    }

    /// A shell reading a terminal, on a terminal of its own (its controlling one when
    /// `ctty`): where it waits, and for how long.
    fn shell_on_a_terminal(script: &str, ctty: bool) -> (Option<Wait>, u64) {
        use std::os::unix::process::CommandExt;
        let pty = nix::pty::openpty(None, None).expect("openpty");
        let rdev = nix::sys::stat::fstat(&pty.slave).expect("fstat").st_rdev;
        let mut cmd = Command::new("bash");
        cmd.args(["--norc", "--noprofile", "-c", script])
            .stdin(Stdio::from(pty.slave.try_clone().expect("dup")))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if ctty {
            // SAFETY: setsid and TIOCSCTTY on the child's own stdin, async-signal-safe.
            unsafe {
                cmd.pre_exec(|| {
                    libc::setsid();
                    libc::ioctl(0, libc::TIOCSCTTY, 0);
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().expect("bash");
        let pid = child.id();
        let mut seen = None;
        wait_until(|| {
            seen = process_wait(pid, &term(rdev));
            seen.is_some()
        });
        let _ = child.kill();
        let _ = child.wait();
        (seen, rdev)
    }

    #[test]
    fn an_untimed_read_has_no_timeout() {
        let (seen, _) = shell_on_a_terminal("read x", false);
        assert_eq!(seen.map(|w| w.timeout), Some(None));
    }

    #[test]
    fn a_timed_read_has_its_timeout() {
        // bash sets what is left of its 7 s, a hair less.
        let (seen, _) = shell_on_a_terminal("read -t 7 x", false);
        let timeout = seen.and_then(|w| w.timeout);
        assert!(
            timeout.is_some_and(|t| t > Duration::from_secs(6) && t <= Duration::from_secs(7)),
            "{timeout:?}"
        );
    }

    /// `/dev/tty` is the terminal for a process whose controlling terminal it is.
    #[test]
    fn a_read_of_dev_tty_is_a_read_of_the_terminal() {
        let (seen, _) = shell_on_a_terminal("read x < /dev/tty", true);
        assert_eq!(seen.map(|w| w.timeout), Some(None));
    }

    /// A child reading a pipe is "blocked reading fd 0", and the device check tells a pipe
    /// from a terminal: with the pipe's own identity it is recognised, with another it is not.
    #[test]
    fn read_on_a_descriptor_is_seen() {
        let mut child = Command::new("cat")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("cat");
        let pid = child.id();
        // Wait until cat is blocked in read(0).
        assert!(wait_until(|| {
            std::fs::read_to_string(format!("/proc/{pid}/syscall")).is_ok_and(|s| {
                CALLS
                    .iter()
                    .any(|(n, k)| *k == Kind::Read && s.starts_with(&format!("{n} 0x0 ")))
            })
        }));
        // A pipe is not a character device, so it never matches a terminal.
        assert_eq!(tree_wait(std::process::id(), &term(0)), None);
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(b"x\n");
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}
