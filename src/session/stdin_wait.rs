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
//! sandbox's /dev looks like.

use replbox_exec::procfs;

use crate::lang::spec::InputWait;

#[cfg(target_arch = "x86_64")]
mod nr {
    pub const READ: &[u64] = &[0, 17, 19]; // read, pread64, readv
    pub const POLL: &[u64] = &[7, 271]; // poll, ppoll
    pub const SELECT: &[u64] = &[23, 270]; // select, pselect6
    pub const EPOLL: &[u64] = &[232, 281, 441]; // epoll_wait, epoll_pwait, epoll_pwait2
}

#[cfg(target_arch = "aarch64")]
mod nr {
    pub const READ: &[u64] = &[63, 65, 67]; // read, readv, pread64
    pub const POLL: &[u64] = &[73]; // ppoll
    pub const SELECT: &[u64] = &[72]; // pselect6
    pub const EPOLL: &[u64] = &[22, 441]; // epoll_pwait, epoll_pwait2
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
mod nr {
    pub const READ: &[u64] = &[];
    pub const POLL: &[u64] = &[];
    pub const SELECT: &[u64] = &[];
    pub const EPOLL: &[u64] = &[];
}

/// A process in the tree rooted at `root` (excluding `root` itself, the helper) blocked
/// waiting for input from the terminal with device number `tty`, judged by the kinds of
/// wait in `signals`: which thread, in which system call.
pub fn tree_reader(root: u32, tty: u64, signals: &[InputWait]) -> Option<String> {
    for pid in procfs::descendants(root) {
        for tid in procfs::threads(pid) {
            if let Some(line) = procfs::syscall(pid, tid)
                && blocked_on_tty(pid, &line, tty, signals)
            {
                return Some(format!(
                    "pid {pid} thread {tid} in syscall {}",
                    line.split_whitespace().next().unwrap_or("?")
                ));
            }
        }
    }
    None
}

/// Interpret one `/proc/.../syscall` line.
fn blocked_on_tty(pid: u32, line: &str, tty: u64, signals: &[InputWait]) -> bool {
    let mut fields = line.split_whitespace();
    let Some(Ok(nr)) = fields.next().map(|f| f.parse::<u64>()) else {
        return false; // "running", or not in a system call
    };
    let args: Vec<u64> = fields
        .take(6)
        .filter_map(|f| u64::from_str_radix(f.trim_start_matches("0x"), 16).ok())
        .collect();
    if args.len() < 3 {
        return false;
    }
    let on = |w: InputWait| signals.contains(&w);
    if on(InputWait::Read) && nr::READ.contains(&nr) {
        return fd_is_tty(pid, args[0], tty);
    }
    if on(InputWait::Select) && nr::SELECT.contains(&nr) {
        return select_reads_tty(pid, args[0], args[1], tty);
    }
    if on(InputWait::Poll) && nr::POLL.contains(&nr) {
        return poll_reads_tty(pid, args[0], args[1], tty);
    }
    if on(InputWait::Epoll) && nr::EPOLL.contains(&nr) {
        return epoll_reads_tty(pid, args[0], tty);
    }
    false
}

fn fd_is_tty(pid: u32, fd: u64, tty: u64) -> bool {
    procfs::fd_rdev(pid, fd) == Some(tty)
}

/// `select(nfds, readfds, …)`: read the readfds bitmap from the process's memory.
fn select_reads_tty(pid: u32, nfds: u64, readfds: u64, tty: u64) -> bool {
    if readfds == 0 || nfds == 0 || nfds > 1024 {
        return false;
    }
    let bytes = nfds.div_ceil(64) * 8;
    let Some(bits) = procfs::read_mem(pid, readfds, bytes as usize) else {
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
    let Some(raw) = procfs::read_mem(pid, fds, (nfds * 8) as usize) else {
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
    let Some(info) = procfs::fdinfo(pid, epfd) else {
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

    fn wait_until(f: impl Fn() -> bool) -> bool {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    #[test]
    fn parses_running_and_garbage() {
        let all = [InputWait::Read, InputWait::Epoll];
        assert!(!blocked_on_tty(1, "running", 0, &all));
        assert!(!blocked_on_tty(1, "", 0, &all));
        assert!(!blocked_on_tty(1, "0 0x0", 0, &all));
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
            std::fs::read_to_string(format!("/proc/{pid}/syscall"))
                .map(|s| nr::READ.iter().any(|n| s.starts_with(&format!("{n} 0x0 "))))
                .unwrap_or(false)
        }));
        // A pipe is not a character device, so it never matches a terminal.
        assert_eq!(tree_reader(std::process::id(), 0, &[InputWait::Read]), None);
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(b"x\n");
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}
