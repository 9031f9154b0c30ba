//! Server side of spawning: every child goes through [`spawn`], which runs the program under
//! the `__exec` helper (itself under bwrap at that level) with a clean environment, its own
//! session, a private directory and the sandbox's confinement.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::sandbox::{Jail, STATUS_FD, Sandbox};

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
    /// The complete environment (nothing is inherited from the server).
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub stdio: Stdio3,
    /// How this program is confined beyond what the sandbox level does for all.
    pub jail: Jail,
}

static HELPER_EXE: OnceLock<PathBuf> = OnceLock::new();

/// Where the helper is: `REPLBOX_HELPER` if set (the library's unit tests run inside the
/// test binary, which is not replbox); else the small `replbox-exec` binary installed
/// beside the server's executable (same arguments, much cheaper to start: see
/// `src/bin/replbox-exec.rs`); else the server's own executable, whose `__exec` command
/// runs the same code.
pub fn helper_exe() -> &'static Path {
    HELPER_EXE.get_or_init(|| {
        if let Some(p) = std::env::var_os("REPLBOX_HELPER") {
            return PathBuf::from(p);
        }
        let me = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("replbox"));
        match me.parent().map(|dir| dir.join(HELPER_BIN)) {
            Some(small) if is_executable(&small) => small,
            _ => me,
        }
    })
}

/// File name of the dedicated helper binary.
pub const HELPER_BIN: &str = "replbox-exec";

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Set the helper executable explicitly (before the first spawn).
pub fn set_helper_exe(path: PathBuf) {
    let _ = HELPER_EXE.set(path);
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

/// Start a program under the helper, confined by `sandbox` and the spec's jail.
pub fn spawn(sandbox: &Sandbox, spec: SpawnSpec) -> std::io::Result<Proc> {
    let pty = matches!(spec.stdio, Stdio3::Pty(_));
    // Close-on-exec in the server, so no other concurrently spawned child inherits it; the
    // write end is placed at STATUS_FD in this child only (pre_exec below).
    let (status_r, status_w) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(std::io::Error::from)?;
    let line = sandbox.command(&spec.jail, &spec.cwd, pty, Some(STATUS_FD), &spec.argv);
    let mut cmd = Command::new(&line.program);
    cmd.args(&line.args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .current_dir(&spec.cwd)
        .kill_on_drop(false);
    if line.wrapped {
        // Out of the server's process group, so a Ctrl-C at the server's own terminal does
        // not reach bwrap (the helper makes its own session anyway).
        cmd.process_group(0);
    }
    let w = status_w.as_raw_fd();
    // SAFETY: dup2 and fcntl are async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if w == STATUS_FD {
                if libc::fcntl(w, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(w, STATUS_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
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
    drop(status_w);
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

impl Proc {
    /// The helper's pid (bwrap's child when wrapped; None while bwrap is still starting it).
    pub fn helper_pid(&self) -> Option<u32> {
        if self.wrapped {
            child_of(self.pid)
        } else {
            Some(self.pid)
        }
    }

    /// The program's pid (the helper's first child).
    pub fn program_pid(&self) -> Option<u32> {
        self.helper_pid().and_then(child_of)
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
            Ok(n) if n > 0 => std::str::from_utf8(&buf[..n])
                .ok()
                .and_then(super::helper::parse_status_record),
            _ => None,
        };
        match record {
            Some((raw, clean)) => {
                if !clean {
                    self.mark_dirty();
                }
                std::process::ExitStatus::from_raw(raw)
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
        let target = Pid::from_raw(self.helper_pid().unwrap_or(self.pid) as i32);
        let _ = signal::kill(target, Signal::SIGTERM);
        match tokio::time::timeout(Duration::from_secs(3), self.child.wait()).await {
            Ok(Ok(status)) => Some(self.reported(status)),
            _ => {
                self.mark_dirty();
                let pid = Pid::from_raw(self.pid as i32);
                let _ = signal::kill(target, Signal::SIGKILL);
                let _ = signal::killpg(pid, Signal::SIGKILL);
                let _ = signal::kill(pid, Signal::SIGKILL);
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
            let target = self.helper_pid().unwrap_or(self.pid);
            let _ = signal::kill(Pid::from_raw(target as i32), Signal::SIGTERM);
        }
    }
}

/// The first child of `pid`.
pub fn child_of(pid: u32) -> Option<u32> {
    let list = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    list.split_whitespace().next()?.parse().ok()
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
    Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("signal {sig}"))
}
