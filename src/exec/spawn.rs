//! Server side of spawning: every child goes through [`spawn`], which runs the program under
//! the `__exec` helper with a clean environment, its own session and a private directory.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use super::helper::HelperArgs;

/// What a child's stdio is connected to.
pub enum Stdio3 {
    /// Separate pipes for stdout and stderr; stdin is a pipe when `stdin` is true, else
    /// /dev/null.
    Pipes { stdin: bool },
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

/// A running child (the helper, whose exit status mirrors the program's).
pub struct Proc {
    pub child: Child,
    pub pid: u32,
}

/// Start a program under the helper.
pub fn spawn(spec: SpawnSpec) -> std::io::Result<Proc> {
    let pty = matches!(spec.stdio, Stdio3::Pty(_));
    let mut cmd = Command::new(helper_exe());
    cmd.args(HelperArgs::to_args(pty, &spec.argv))
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .current_dir(&spec.cwd)
        .kill_on_drop(false);
    match spec.stdio {
        Stdio3::Pipes { stdin } => {
            cmd.stdin(if stdin { Stdio::piped() } else { Stdio::null() })
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
    let pid = child
        .id()
        .ok_or_else(|| std::io::Error::other("child exited before its pid was read"))?;
    Ok(Proc { child, pid })
}

impl Proc {
    /// Kill the program and everything it started, and reap the helper. The helper kills
    /// the tree on SIGTERM; if it does not exit within a moment, its process group is killed.
    pub async fn kill_tree(&mut self) -> Option<std::process::ExitStatus> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Some(status);
        }
        let pid = Pid::from_raw(self.pid as i32);
        let _ = signal::kill(pid, Signal::SIGTERM);
        match tokio::time::timeout(Duration::from_secs(3), self.child.wait()).await {
            Ok(Ok(status)) => Some(status),
            _ => {
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
        // the helper in the background.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = signal::kill(Pid::from_raw(self.pid as i32), Signal::SIGTERM);
        }
    }
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
