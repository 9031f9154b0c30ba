//! What the server reads of processes in /proc: trees, states, threads and the system call
//! each is blocked in, the tasks of a uid. Through the `procfs` crate where it models the
//! file (stat, status, tasks, children, syscall, mem); by hand only what it does not: the
//! device behind a descriptor and a descriptor's `fdinfo`. A process that is gone (or
//! unreadable) yields nothing: all of these race with processes ending. Pids are `u32`, as
//! std and the server's reports have them.

use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};

use procfs::process::{Process, Syscall};

/// The most processes a tree walk returns (a fork bomb must not make it unbounded).
pub const MAX_TREE: usize = 4096;

fn process(pid: u32) -> Option<Process> {
    Process::new(i32::try_from(pid).ok()?).ok()
}

/// Parent pid and state letter (`R`, `S`, `Z`, …).
pub fn ppid_state(pid: u32) -> Option<(u32, char)> {
    let stat = process(pid)?.stat().ok()?;
    Some((u32::try_from(stat.ppid).ok()?, stat.state))
}

/// The controlling terminal of a process (`tty_nr`, a device number as `stat` gives it; 0
/// for none).
pub fn tty_nr(pid: u32) -> Option<u64> {
    u64::try_from(process(pid)?.stat().ok()?.tty_nr).ok()
}

/// The thread ids of a process.
pub fn threads(pid: u32) -> Vec<u32> {
    let Some(tasks) = process(pid).and_then(|p| p.tasks().ok()) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| u32::try_from(t.tid).ok())
        .collect()
}

/// The children of a process (every thread's, as each thread's children are listed under it).
pub fn children(pid: u32) -> Vec<u32> {
    let Some(tasks) = process(pid).and_then(|p| p.tasks().ok()) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| t.children().ok())
        .flatten()
        .collect()
}

/// The first child of a single-threaded process (bwrap's helper, the helper's program).
pub fn first_child(pid: u32) -> Option<u32> {
    let main = process(pid)?.task_from_tid(i32::try_from(pid).ok()?).ok()?;
    main.children().ok()?.first().copied()
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

/// Tasks (processes and threads) of `uid`: what RLIMIT_NPROC counts. Processes are picked by
/// their /proc directory's owner (a stat, where the status file would be read and parsed
/// for each: this runs at every spawn without root).
pub fn tasks_of_uid(uid: u32) -> u64 {
    let Ok(all) = procfs::process::all_processes() else {
        return 0;
    };
    all.flatten()
        .filter(|p| p.uid().is_ok_and(|u| u == uid))
        .filter_map(|p| Some(p.status().ok()?.threads))
        .sum()
}

/// Processes whose real uid is `uid`.
pub fn pids_of_uid(uid: u32) -> Vec<u32> {
    let Ok(all) = procfs::process::all_processes() else {
        return Vec::new();
    };
    all.flatten()
        .filter(|p| p.status().is_ok_and(|s| s.ruid == uid))
        .filter_map(|p| u32::try_from(p.pid).ok())
        .collect()
}

/// What tells one program a process runs from the next it `exec`s: where the kernel put the
/// random bytes of its auxiliary vector (`AT_RANDOM`, on the fresh stack every `execve`
/// builds) and its entry point. None when unreadable.
pub fn exec_id(pid: u32) -> Option<(u64, u64)> {
    const AT_ENTRY: u64 = 9;
    const AT_RANDOM: u64 = 25;
    let auxv = process(pid)?.auxv().ok()?;
    Some((*auxv.get(&AT_RANDOM)?, *auxv.get(&AT_ENTRY)?))
}

/// The command name of a process.
pub fn comm(pid: u32) -> Option<String> {
    Some(process(pid)?.stat().ok()?.comm)
}

/// The system call a thread is in (its number and arguments), or that it is running.
pub fn syscall(pid: u32, tid: u32) -> Option<Syscall> {
    let task = process(pid)?.task_from_tid(i32::try_from(tid).ok()?).ok()?;
    task.syscall().ok()
}

/// Device number behind `/proc/PID/fd/FD`, if it is a character device (not modelled by
/// procfs: the link's target is stat'ed).
pub fn fd_rdev(pid: u32, fd: u64) -> Option<u64> {
    let meta = std::fs::metadata(format!("/proc/{pid}/fd/{fd}")).ok()?;
    meta.file_type().is_char_device().then(|| meta.rdev())
}

/// `/proc/PID/fdinfo/FD` as text (its per-kind lines, an epoll's `tfd:` registrations among
/// them, are not modelled by procfs).
pub fn fdinfo(pid: u32, fd: u64) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).ok()
}

/// `len` bytes of a process's memory at `addr`.
pub fn read_mem(pid: u32, addr: u64, len: usize) -> Option<Vec<u8>> {
    let mem = process(pid)?.mem().ok()?;
    let mut buf = vec![0u8; len];
    mem.read_exact_at(&mut buf, addr).ok()?;
    Some(buf)
}

/// One line describing a process tree, for diagnostics: pid, name, state and system call of
/// each process.
pub fn describe_tree(root: u32) -> String {
    std::iter::once(root)
        .chain(descendants(root))
        .map(|pid| {
            let call = match syscall(pid, pid) {
                Some(Syscall::Running) => "running".to_string(),
                Some(Syscall::Blocked { syscall_number, .. }) => syscall_number.to_string(),
                Some(_) | None => String::new(),
            };
            let state = ppid_state(pid).map_or('?', |(_, s)| s);
            format!("{pid} {} {state} [{call}]", comm(pid).unwrap_or_default())
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
        let (ppid, state) = ppid_state(me).expect("stat");
        assert_eq!(ppid, std::os::unix::process::parent_id());
        assert!(state == 'R' || state == 'S', "{state}");
        assert!(threads(me).contains(&me));
        assert!(describe_tree(me).starts_with(&format!("{me} ")));
        assert!(ppid_state(u32::MAX).is_none());
        assert!(tty_nr(me).is_some());
        assert!(comm(me).is_some_and(|c| !c.is_empty()));
        let uid = rustix::process::getuid().as_raw();
        assert!(pids_of_uid(uid).contains(&me));
        assert!(tasks_of_uid(uid) >= threads(me).len() as u64);
        // This thread is in the system call that reads its own syscall file.
        let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
        assert!(syscall(me, tid).is_some());
        let x = 0x5eed_u64.to_ne_bytes();
        assert_eq!(read_mem(me, x.as_ptr() as u64, 8).as_deref(), Some(&x[..]));
        assert!(fdinfo(me, 0).is_some_and(|i| i.contains("flags:")));
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
        // `sleep` has run once its name shows, but may not be in its system call yet.
        let blocked = || matches!(syscall(tree[0], tree[0]), Some(Syscall::Blocked { .. }));
        while !blocked() && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert!(blocked());
        let _ = child.kill();
        let _ = child.wait();
        if let Some(pid) = rustix::process::Pid::from_raw(tree[0] as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
}
