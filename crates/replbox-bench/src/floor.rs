//! Floors: what the measured work costs without replbox, done directly on this machine with
//! the interpreter replbox would use.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::process::{Child, Command};

use replbox::api::env as cenv;
use replbox::api::pty::{self, PtyMaster, ReadOutcome};
use replbox::api::{Config, Registry};

use crate::client::CALL_TIMEOUT;
use crate::langs::RawReplSpec;

/// An interpreter found exactly as the server finds it (its language file's `programs`,
/// then its `resolve` probe, so shims such as pyenv's are skipped the same way).
pub struct Interpreter {
    pub exe: PathBuf,
    pub version: String,
    /// The language's own environment (`[env]`), which every child of it gets.
    pub env: Vec<(String, String)>,
}

impl Interpreter {
    pub async fn resolve(config: &Config, language: &str) -> Result<Self> {
        Self::find(config, language, false).await
    }

    /// The program a session of the language runs (ghci rather than runghc).
    pub async fn resolve_session(config: &Config, language: &str) -> Result<Self> {
        Self::find(config, language, true).await
    }

    async fn find(config: &Config, language: &str, session: bool) -> Result<Self> {
        let registry = Registry::load(config.prompts.as_deref())?;
        let lang = registry.get(language)?;
        let detected = lang
            .detect()
            .await
            .with_context(|| format!("{language} is not installed"))?;
        let exe = if session {
            lang.session_exe(detected).map_err(anyhow::Error::msg)?
        } else {
            detected.exe.clone()
        };
        Ok(Self {
            exe,
            version: detected.version.clone(),
            env: lang
                .spec
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        })
    }

    /// The environment a child of this language gets from the server (allowlist plus the
    /// language's variables), with `dir` as its home.
    fn child_env(&self, dir: &Path, term: &str) -> Vec<(String, String)> {
        let mut env = cenv::base_env(dir, term);
        for (k, v) in &self.env {
            cenv::set(&mut env, k, v.clone());
        }
        env
    }

    /// The interpreter with `args`, in `dir`, with the server's child environment, stdin
    /// empty and stdout piped.
    fn direct(&self, args: &[&str], dir: &Path) -> Command {
        let mut cmd = Command::new(&self.exe);
        cmd.args(args)
            .env_clear()
            .envs(self.child_env(dir, "dumb"))
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    /// Spawn the interpreter directly with `args`, in `dir`, with the environment the server
    /// gives its children (and nothing else), wait for it and check its stdout.
    pub async fn time_run(&self, args: &[&str], dir: &Path, expected: &str) -> Result<Duration> {
        let mut cmd = self.direct(args, dir);
        cmd.stderr(Stdio::piped());
        let started = Instant::now();
        let out = tokio::time::timeout(CALL_TIMEOUT, cmd.output()).await;
        let elapsed = started.elapsed();
        let out = out
            .with_context(|| format!("{} took over {CALL_TIMEOUT:?}", self.exe.display()))?
            .with_context(|| format!("cannot run {}", self.exe.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || stdout != expected {
            bail!(
                "{} {args:?} printed {stdout:?} ({}; stderr {:?}), expected {expected:?}",
                self.exe.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(elapsed)
    }

    /// Spawn the interpreter with `args` and read all of its stdout (for output floors):
    /// returns the time and the number of bytes read.
    pub async fn time_output(&self, args: &[&str], dir: &Path) -> Result<(Duration, usize)> {
        let mut cmd = self.direct(args, dir);
        cmd.stderr(Stdio::null());
        let started = Instant::now();
        let out = tokio::time::timeout(CALL_TIMEOUT, cmd.output())
            .await
            .with_context(|| format!("{} took over {CALL_TIMEOUT:?}", self.exe.display()))?
            .with_context(|| format!("cannot run {}", self.exe.display()))?;
        let elapsed = started.elapsed();
        if !out.status.success() {
            bail!("{} {args:?} failed: {}", self.exe.display(), out.status);
        }
        Ok((elapsed, out.stdout.len()))
    }
}

/// An interpreter's own REPL behind a PTY with echo off, driven directly: type a line, read
/// until the answer and the next prompt. What `session_eval` costs without replbox.
pub struct RawRepl {
    master: PtyMaster,
    child: Child,
    prompt: &'static [u8],
    _dir: tempfile::TempDir,
}

impl RawRepl {
    pub async fn start(interp: &Interpreter, spec: &RawReplSpec) -> Result<Self> {
        let dir = tempfile::tempdir().context("cannot create a directory for the raw REPL")?;
        let (master, slave) = pty::open().context("cannot open a terminal")?;
        let mut env = interp.child_env(dir.path(), "dumb");
        for (k, v) in spec.env {
            cenv::set(&mut env, k, v.to_string());
        }
        let mut cmd = Command::new(&interp.exe);
        cmd.args(spec.args)
            .env_clear()
            .envs(env)
            .current_dir(dir.path())
            .stdin(Stdio::from(slave.try_clone()?))
            .stdout(Stdio::from(slave.try_clone()?))
            .stderr(Stdio::from(slave))
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", interp.exe.display()))?;
        let me = Self {
            master,
            child,
            prompt: spec.prompt.as_bytes(),
            _dir: dir,
        };
        me.read_until_prompt(None)
            .await
            .context("no first prompt")?;
        Ok(me)
    }

    /// Type `line` (a newline is added) and time until `expected` and the prompt are back.
    pub async fn round_trip(&mut self, line: &str, expected: &str) -> Result<Duration> {
        let mut bytes = line.as_bytes().to_vec();
        bytes.push(b'\n');
        let started = Instant::now();
        self.master.write_all(&bytes).await?;
        let got = self.read_until_prompt(Some(expected)).await?;
        let elapsed = started.elapsed();
        let text = String::from_utf8_lossy(&got);
        if !text.contains(expected) {
            bail!("the raw REPL answered {text:?}, expected {expected:?}");
        }
        Ok(elapsed)
    }

    /// Type `text` (many lines, written while the answers are read) and time until
    /// `expected` and a prompt after it are back.
    pub async fn feed(&mut self, text: &str, expected: &str) -> Result<Duration> {
        let started = Instant::now();
        let (written, got) = tokio::join!(
            self.master.write_all(text.as_bytes()),
            self.read_until_prompt(Some(expected))
        );
        written?;
        got?;
        Ok(started.elapsed())
    }

    async fn read_until_prompt(&self, expected: Option<&str>) -> Result<Vec<u8>> {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let deadline = tokio::time::Instant::now() + CALL_TIMEOUT;
        loop {
            let read = tokio::time::timeout_at(deadline, self.master.read(&mut buf))
                .await
                .context("the raw REPL did not answer in time")??;
            match read {
                ReadOutcome::Data(n) => got.extend_from_slice(&buf[..n]),
                ReadOutcome::Closed => {
                    bail!("the raw REPL ended: {:?}", String::from_utf8_lossy(&got))
                }
            }
            let answered =
                expected.is_none_or(|e| memchr::memmem::find(&got, e.as_bytes()).is_some());
            if answered && got.ends_with(self.prompt) {
                return Ok(got);
            }
        }
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}
