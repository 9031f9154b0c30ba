//! Server side of spawning: every child goes through [`spawn`], which runs the program under
//! the helper (itself under bwrap at that level), in its own session, with the sandbox's
//! confinement. bwrap and the helper start with an empty environment, in `/`: the program's
//! path, arguments and environment (the caller's values among them) reach the helper as data
//! on a descriptor, and only the confined program gets them.

use std::io::{Seek, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use replbox_exec::status::Record;
use replbox_exec::{PROGRAM_FD, Program, STATUS_FD};
use rustix::process::{Pid, Signal};
use tokio::process::{Child, Command};

use crate::sandbox::{Jail, Sandbox};

/// What a child's stdio is connected to.
pub enum Stdio3 {
    /// A pipe each for stdin, stdout and stderr.
    Pipes,
    /// All three are this PTY slave; the helper makes it the controlling terminal.
    Pty(OwnedFd),
}

/// One program to start.
pub struct SpawnSpec {
    pub argv: Vec<String>,
    /// The program's complete environment (nothing is inherited from the server). It
    /// reaches only the program, after confinement.
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub stdio: Stdio3,
    /// How this program is confined beyond what the sandbox level does for all.
    pub jail: Jail,
}

/// The file to execute for `argv0`: itself when it names a path (relative ones are taken
/// from the working directory), else the first match on the server's own PATH (the
/// operator's, never a caller's), else the bare name, which then fails to run.
fn program_file(argv0: &str) -> String {
    if argv0.contains('/') {
        return argv0.to_string();
    }
    let path = super::env::server_path();
    std::env::split_paths(&path)
        .filter(|d| d.is_absolute())
        .map(|d| d.join(argv0))
        .find(|p| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| argv0.to_string())
}

/// The program's description, in a memory file the helper reads on [`PROGRAM_FD`].
fn program_fd(spec: &SpawnSpec) -> std::io::Result<OwnedFd> {
    let argv0 = spec
        .argv
        .first()
        .ok_or_else(|| std::io::Error::other("no program to run"))?;
    // Sorted by name, a later value replacing an earlier one: the environment a program
    // started by `std::process::Command` gets (the warm pool's loader does the same).
    let env: std::collections::BTreeMap<&str, &str> = spec
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let program = Program {
        file: program_file(argv0).into(),
        argv: spec.argv.iter().map(Into::into).collect(),
        env: env.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
    };
    let bytes = program.encode().map_err(std::io::Error::other)?;
    let fd = rustix::fs::memfd_create(c"replbox-program", rustix::fs::MemfdFlags::CLOEXEC)?;
    let mut file = std::fs::File::from(fd);
    file.write_all(&bytes)?;
    file.rewind()?;
    Ok(file.into())
}

/// Put each `(descriptor, number)` at its number in a child about to exec, without one
/// clobbering another: first every source is copied above all the numbers, then each copy is
/// moved to its place (`dup2` clears close-on-exec there; the copies keep it and vanish).
fn place_fds(fds: &[(i32, i32)], scratch: &mut [i32]) -> std::io::Result<()> {
    let above = fds.iter().map(|&(_, n)| n).max().unwrap_or(0) + 1;
    for (i, &(src, _)) in fds.iter().enumerate() {
        // SAFETY: fcntl(F_DUPFD_CLOEXEC) is async-signal-safe and only makes a descriptor.
        let copy = unsafe { libc::fcntl(src, libc::F_DUPFD_CLOEXEC, above) };
        if copy < 0 {
            return Err(std::io::Error::last_os_error());
        }
        scratch[i] = copy;
    }
    for (i, &(_, n)) in fds.iter().enumerate() {
        // SAFETY: dup2 is async-signal-safe; both numbers are descriptors of this child.
        if unsafe { libc::dup2(scratch[i], n) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Start a program under the helper, confined by `sandbox` and the spec's jail.
pub fn spawn(sandbox: &Sandbox, spec: SpawnSpec) -> std::io::Result<Proc> {
    let pty = matches!(spec.stdio, Stdio3::Pty(_));
    let program = program_fd(&spec)?;
    // Close-on-exec in the server, so no other concurrently spawned child inherits it; the
    // write end is placed at STATUS_FD in this child only (pre_exec below).
    let (status_r, status_w) = rustix::pipe::pipe_with(
        rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
    )?;
    let line = sandbox.command(&spec.jail, &spec.cwd, pty)?;
    let mut cmd = Command::new(&line.program);
    cmd.args(&line.args)
        .env_clear()
        .current_dir("/")
        .kill_on_drop(false);
    if line.wrapped {
        // Out of the server's process group, so a Ctrl-C at the server's own terminal does
        // not reach bwrap (the helper makes its own session anyway).
        cmd.process_group(0);
    }
    let mut fds = vec![
        (status_w.as_raw_fd(), STATUS_FD),
        (program.as_raw_fd(), PROGRAM_FD),
    ];
    fds.extend(line.fds.iter().map(|(fd, n)| (fd.as_raw_fd(), *n)));
    let mut scratch = vec![0; fds.len()];
    // SAFETY: place_fds only calls fcntl and dup2 (async-signal-safe) and allocates nothing.
    unsafe {
        cmd.pre_exec(move || place_fds(&fds, &mut scratch));
    }
    match spec.stdio {
        Stdio3::Pipes => {
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
        }
        Stdio3::Pty(slave) => {
            cmd.stdin(Stdio::from(slave.try_clone()?))
                .stdout(Stdio::from(slave.try_clone()?))
                .stderr(Stdio::from(slave));
        }
    }
    let child = cmd.spawn()?;
    drop((status_w, program, line.fds));
    let pid = child
        .id()
        .ok_or_else(|| std::io::Error::other("child exited before its pid was read"))?;
    Ok(Proc {
        child,
        pid,
        wrapped: line.wrapped,
        status: Some(std::fs::File::from(status_r)),
        dirty: spec.jail.dirty.clone(),
    })
}

/// A running child: the helper, or bwrap with the helper as its only child. Its exit status
/// (completed by the helper's status record) is the program's.
pub struct Proc {
    pub child: Child,
    pub pid: u32,
    /// bwrap is in between: the helper is `pid`'s child.
    wrapped: bool,
    /// Read end of the helper's status descriptor.
    status: Option<std::fs::File>,
    /// The lease's flag to set when this ends without the helper confirming a clean tree.
    dirty: Option<Arc<AtomicBool>>,
}

impl Proc {
    /// The helper's pid (bwrap's child when wrapped; None while bwrap is still starting it).
    pub fn helper_pid(&self) -> Option<u32> {
        if self.wrapped {
            crate::proc::first_child(self.pid)
        } else {
            Some(self.pid)
        }
    }

    /// The program's pid (the helper's first child).
    pub fn program_pid(&self) -> Option<u32> {
        self.helper_pid().and_then(crate::proc::first_child)
    }

    /// Wait for the end, with the program's exact status.
    pub async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        let status = self.child.wait().await?;
        Ok(self.reported(status))
    }

    /// The status as the helper reported it, when it did (bwrap turns a death by signal
    /// into an exit code, and a pid namespace's first process cannot re-raise it).
    fn reported(&mut self, status: std::process::ExitStatus) -> std::process::ExitStatus {
        use std::io::Read;
        use std::os::unix::process::ExitStatusExt;
        let Some(mut f) = self.status.take() else {
            return status;
        };
        let mut buf = [0u8; 64];
        let record = match f.read(&mut buf) {
            Ok(n) if n > 0 => std::str::from_utf8(&buf[..n]).ok().and_then(Record::parse),
            _ => None,
        };
        match record {
            Some(r) => {
                if !r.clean {
                    self.mark_dirty();
                }
                std::process::ExitStatus::from_raw(r.wait_status())
            }
            None => {
                self.mark_dirty();
                status
            }
        }
    }

    fn mark_dirty(&self) {
        if let Some(d) = &self.dirty {
            d.store(true, Ordering::Relaxed);
        }
    }

    /// Kill the program and everything it started, and reap it. The helper kills the tree
    /// on SIGTERM (inside bwrap it is the pid namespace's first process, whose exit also
    /// makes the kernel kill whatever is left); if it does not end within a moment, it and
    /// its process group are killed.
    pub async fn kill_tree(&mut self) -> Option<std::process::ExitStatus> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Some(self.reported(status));
        }
        // Signal the helper, not bwrap: bwrap would die at once and leave the sandbox to
        // die a moment later, after this returned.
        let helper = self.helper_pid().unwrap_or(self.pid);
        terminate_helper(helper);
        match tokio::time::timeout(Duration::from_secs(3), self.child.wait()).await {
            Ok(Ok(status)) => Some(self.reported(status)),
            _ => {
                self.mark_dirty();
                if let (Some(helper), Some(pid)) = (pid_of(helper), pid_of(self.pid)) {
                    let _ = rustix::process::kill_process(helper, Signal::KILL);
                    let _ = rustix::process::kill_process_group(pid, Signal::KILL);
                    let _ = rustix::process::kill_process(pid, Signal::KILL);
                }
                self.child.wait().await.ok()
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // Never leave a tree behind: the helper tears it down on SIGTERM, and tokio reaps
        // the child in the background.
        if matches!(self.child.try_wait(), Ok(None)) {
            self.mark_dirty();
            terminate_helper(self.helper_pid().unwrap_or(self.pid));
        }
    }
}

/// Ask a helper to tear its tree down (SIGTERM). Refuses what cannot be a helper of ours:
/// pids 0 and 1 (0 would signal the server's whole process group), the server itself and
/// its process group.
pub fn terminate_helper(pid: u32) -> bool {
    let me = std::process::id();
    let group = rustix::process::getpgrp().as_raw_nonzero().get() as u32;
    let target = pid_of(pid).filter(|_| pid > 1 && pid != me && pid != group);
    let Some(target) = target else {
        tracing::warn!(pid, "refusing to signal a pid that is not a helper");
        return false;
    };
    rustix::process::kill_process(target, Signal::TERM).is_ok()
}

/// A pid as the kernel takes it (None for 0 and what does not fit).
fn pid_of(pid: u32) -> Option<Pid> {
    Pid::from_raw(i32::try_from(pid).ok()?)
}

/// Exit code and signal name from a status.
pub fn describe_status(status: &std::process::ExitStatus) -> (Option<i32>, Option<String>) {
    use std::os::unix::process::ExitStatusExt;
    if let Some(code) = status.code() {
        (Some(code), None)
    } else if let Some(sig) = status.signal() {
        (None, Some(signal_name(sig)))
    } else {
        (None, None)
    }
}

pub fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("signal {sig}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SIGTERM to any of these would end this test process (or its group) itself.
    #[test]
    fn never_signals_the_server_or_its_group() {
        let group = rustix::process::getpgrp().as_raw_nonzero().get() as u32;
        for pid in [0, 1, std::process::id(), group, u32::MAX] {
            assert!(!terminate_helper(pid), "{pid}");
        }
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        assert!(terminate_helper(child.id()));
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().expect("wait").signal(), Some(libc::SIGTERM));
    }

    #[test]
    fn programs_are_found_on_the_servers_path_only() {
        assert_eq!(program_file("./main"), "./main");
        assert_eq!(program_file("/bin/sh"), "/bin/sh");
        assert!(program_file("sh").ends_with("/sh") && program_file("sh").starts_with('/'));
        assert_eq!(program_file("no-such-program-here"), "no-such-program-here");
    }

    #[test]
    fn descriptors_are_placed_without_clobbering_each_other() {
        use std::os::unix::process::CommandExt;
        let a = std::fs::File::open("/dev/null").expect("a");
        let b = std::fs::File::open("/proc/self/stat").expect("b");
        // Each source sits at the other's target: a naive dup2 would lose one.
        let (ra, rb) = (a.as_raw_fd(), b.as_raw_fd());
        let mut cmd = std::process::Command::new("sh");
        cmd.args([
            "-c",
            &format!("readlink /proc/self/fd/{ra} /proc/self/fd/{rb}"),
        ]);
        let fds = [(ra, rb), (rb, ra)];
        let mut scratch = [0; 2];
        // SAFETY: place_fds only calls fcntl and dup2.
        unsafe {
            cmd.pre_exec(move || place_fds(&fds, &mut scratch));
        }
        let out = cmd.output().expect("sh");
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].ends_with("stat"), "{text}");
        assert_eq!(lines[1], "/dev/null", "{text}");
    }
}
