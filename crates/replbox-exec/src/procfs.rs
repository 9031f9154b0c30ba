//! Every reading of /proc the helper and the server do: process trees, states, the tasks of
//! a uid, and what a thread is blocked in. A process that is gone (or unreadable) simply
//! yields nothing: all of these race with processes ending.

use std::fs::File;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};

/// The most processes a tree walk returns (a fork bomb must not make it unbounded).
pub const MAX_TREE: usize = 4096;

/// Parent pid and state letter from /proc/PID/stat (the command name may contain spaces and
/// parentheses, so the fields are read after the last ')').
pub fn ppid_state(pid: i32) -> Option<(i32, char)> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    let mut it = rest.split_whitespace();
    let state = it.next()?.chars().next()?;
    let ppid = it.next()?.parse().ok()?;
    Some((ppid, state))
}

/// The controlling terminal of a process (`tty_nr` of /proc/PID/stat, a device number as
/// `stat` gives it; 0 for none).
pub fn tty_nr(pid: u32) -> Option<u64> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    // state, ppid, pgrp, session, tty_nr
    let nr: i64 = rest.split_whitespace().nth(4)?.parse().ok()?;
    u64::try_from(nr).ok()
}

/// The thread ids of a process.
pub fn threads(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|t| t.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The children of a process (every thread's, as each thread's children are listed under it).
pub fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for tid in threads(pid) {
        if let Ok(list) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/children")) {
            out.extend(
                list.split_whitespace()
                    .filter_map(|s| s.parse::<u32>().ok()),
            );
        }
    }
    out
}

/// The first child of a single-threaded process (bwrap's helper, the helper's program).
pub fn first_child(pid: u32) -> Option<u32> {
    let list = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    list.split_whitespace().next()?.parse().ok()
}

/// The descendants of `pid` (not `pid` itself), at most [`MAX_TREE`].
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for child in children(p) {
            if out.len() < MAX_TREE {
                out.push(child);
                frontier.push(child);
            }
        }
    }
    out
}

/// Every pid listed in /proc.
fn pids() -> impl Iterator<Item = (i32, std::fs::DirEntry)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse::<i32>().ok()?, e)))
}

/// A field of /proc/PID/status (`Uid:`, `Threads:`...), after its name.
fn status_field(pid: i32, name: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .map(|v| v.trim().to_string())
}

/// Tasks (processes and threads) whose real uid is `uid`: what RLIMIT_NPROC counts.
pub fn tasks_of_uid(uid: u32) -> u64 {
    pids()
        .filter(|(_, e)| e.metadata().ok().map(|m| m.uid()) == Some(uid))
        .filter_map(|(pid, _)| status_field(pid, "Threads:")?.parse::<u64>().ok())
        .sum()
}

/// Processes whose real uid is `uid`.
pub fn pids_of_uid(uid: u32) -> Vec<i32> {
    pids()
        .filter(|(pid, _)| {
            status_field(*pid, "Uid:")
                .and_then(|v| v.split_whitespace().next()?.parse::<u32>().ok())
                == Some(uid)
        })
        .map(|(pid, _)| pid)
        .collect()
}

/// The command name of a process.
pub fn comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// The system call a thread is in, as /proc/PID/task/TID/syscall has it: the number and
/// its arguments, `running`, or nothing.
pub fn syscall(pid: u32, tid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()
}

/// Device number behind `/proc/PID/fd/FD`, if it is a character device.
pub fn fd_rdev(pid: u32, fd: u64) -> Option<u64> {
    let meta = std::fs::metadata(format!("/proc/{pid}/fd/{fd}")).ok()?;
    meta.file_type().is_char_device().then(|| meta.rdev())
}

/// /proc/PID/fdinfo/FD.
pub fn fdinfo(pid: u32, fd: u64) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).ok()
}

/// `len` bytes of a process's memory at `addr`.
pub fn read_mem(pid: u32, addr: u64, len: usize) -> Option<Vec<u8>> {
    let f = File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, addr).ok()?;
    Some(buf)
}

/// One line describing a process tree, for diagnostics: pid, name, state and system call of
/// each process.
pub fn describe_tree(root: u32) -> String {
    std::iter::once(root)
        .chain(descendants(root))
        .map(|pid| {
            let sys = syscall(pid, pid).unwrap_or_default();
            let state = ppid_state(pid as i32).map_or('?', |(_, s)| s);
            format!(
                "{pid} {} {state} [{}]",
                comm(pid).unwrap_or_default(),
                sys.split_whitespace().next().unwrap_or("")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_read() {
        let me = std::process::id();
        let (ppid, state) = ppid_state(me as i32).expect("stat");
        assert_eq!(ppid, std::os::unix::process::parent_id() as i32);
        assert!(state == 'R' || state == 'S', "{state}");
        assert!(threads(me).contains(&me));
        assert!(describe_tree(me).starts_with(&format!("{me} ")));
        assert!(ppid_state(-1).is_none());
        assert!(tty_nr(me).is_some());
    }

    #[test]
    fn a_child_and_its_child_are_descendants() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .expect("sh");
        let sh = child.id();
        // The shell's own child appears once it has forked, and is `sleep` once it has run it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let started = |t: &[u32]| t.len() == 1 && comm(t[0]).as_deref() == Some("sleep");
        let mut tree = descendants(sh);
        while !started(&tree) && std::time::Instant::now() < deadline {
            std::thread::yield_now();
            tree = descendants(sh);
        }
        assert!(children(std::process::id()).contains(&sh));
        assert_eq!(tree.len(), 1, "{tree:?}");
        assert_eq!(first_child(sh), Some(tree[0]));
        assert_eq!(comm(tree[0]).as_deref(), Some("sleep"));
        let _ = child.kill();
        let _ = child.wait();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(tree[0] as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}
