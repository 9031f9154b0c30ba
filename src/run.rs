//! `run-code`: one program, in a fresh private directory, with a clean environment, a
//! deadline that kills the whole tree, and bounded, separate stdout and stderr.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use schemars::JsonSchema;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::exec::{self, SpawnSpec, Stdio3, env as cenv};
use crate::lang::{Language, Registry, expand, expand_command};
use crate::output::HeadTail;
use crate::pool::{self, Pool, Warm};
use crate::sandbox::{Jail, Lease, Level, Sandbox};
use crate::session::interp::Progress;
use crate::workspace::{PrivateDir, Workspace};

/// What the caller asked for.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    pub code: String,
    pub stdin: Option<String>,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub timeout: Duration,
}

/// Which step a result comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Compile,
    Run,
}

/// The result of one `run-code` call (also its `structuredContent`).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RunReport {
    /// Canonical id of the language that ran.
    pub language: String,
    /// Standard output (head and tail kept when over the cap, with a line saying how many
    /// bytes were left out).
    pub stdout: String,
    pub stderr: String,
    /// Exit code, when the program exited (null when it was killed by a signal).
    pub exit_code: Option<i32>,
    /// Name of the signal that ended the program (for example SIGKILL after a timeout).
    pub signal: Option<String>,
    pub timed_out: bool,
    pub duration_ms: u64,
    /// True when stdout or stderr was cut to the cap.
    pub truncated: bool,
    /// `compile` when a compiled language failed to build (exit_code is the compiler's),
    /// else `run`.
    pub phase: Phase,
    /// Set when the program could not be started at all, or the call was cancelled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The isolation level the program ran under.
    pub sandbox: Level,
}

impl RunReport {
    /// The program ran and exited 0.
    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
            && !self.timed_out
            && self.error.is_none()
            && self.phase == Phase::Run
    }

    /// The text content: exactly stdout on a clean success (as mcp-server-code-runner
    /// returns it), else stdout, stderr and a trailer saying how it ended.
    pub fn text(&self) -> String {
        if self.success() && self.stderr.is_empty() {
            return self.stdout.clone();
        }
        let mut t = self.stdout.clone();
        if !self.stderr.is_empty() {
            end_line(&mut t);
            t.push_str("[stderr]\n");
            t.push_str(&self.stderr);
        }
        end_line(&mut t);
        t.push_str(&self.trailer());
        t
    }

    fn trailer(&self) -> String {
        let during = if self.phase == Phase::Compile {
            " while compiling"
        } else {
            ""
        };
        if self.timed_out {
            return format!("[timed out after {} ms{during}]", self.duration_ms);
        }
        if let Some(e) = &self.error {
            return format!("[{e}]");
        }
        let how = match (&self.exit_code, &self.signal) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(s)) => format!("killed by {s}"),
            (None, None) => "ended".to_string(),
        };
        if self.phase == Phase::Compile {
            format!("[compile error: {how}]")
        } else {
            format!("[{how}]")
        }
    }
}

fn end_line(t: &mut String) {
    if !t.is_empty() && !t.ends_with('\n') {
        t.push('\n');
    }
}

/// Runs programs. Cheap to clone; every call is independent.
#[derive(Clone)]
pub struct Runner {
    pub config: Arc<Config>,
    pub workspace: Arc<Workspace>,
    pub sandbox: Arc<Sandbox>,
    /// Interpreters started ahead of time for languages with a `[run.pool]`.
    pub pool: Arc<Pool>,
}

/// Where a run happens: its directory, the uid it runs as (when the server is root), the
/// placeholders of its command lines and the confinement of its processes.
pub struct Place {
    dir: PrivateDir,
    /// Held for its drop: the uid goes back to the pool after the directory is removed.
    _lease: Option<Lease>,
    exe: String,
    dir_s: String,
    cache: String,
    jail: Jail,
}

impl Place {
    fn vars<'a>(&'a self, lang: &'a Language) -> [(&'a str, &'a str); 4] {
        [
            ("exe", self.exe.as_str()),
            ("file", lang.spec.run.file.as_str()),
            ("dir", self.dir_s.as_str()),
            ("cache", self.cache.as_str()),
        ]
    }
}

struct Step {
    status: Option<std::process::ExitStatus>,
    stdout: HeadTail,
    stderr: HeadTail,
    timed_out: bool,
    cancelled: bool,
    spawn_error: Option<String>,
}

impl Runner {
    pub async fn run(
        &self,
        lang: &Arc<Language>,
        req: RunRequest,
        cancel: &CancellationToken,
        progress: Option<&Progress>,
    ) -> RunReport {
        let started = Instant::now();
        let deadline = tokio::time::Instant::from_std(started + req.timeout);
        let mut report = RunReport {
            language: lang.id().to_string(),
            stdout: String::new(),
            stderr: String::new(),
            exit_code: None,
            signal: None,
            timed_out: false,
            duration_ms: 0,
            truncated: false,
            phase: Phase::Run,
            error: None,
            sandbox: self.sandbox.level,
        };
        let fail = |mut r: RunReport, msg: String| {
            r.error = Some(msg);
            r.duration_ms = started.elapsed().as_millis() as u64;
            r
        };
        let Some(detected) = lang.detect().await else {
            return fail(report, format!("{} is not installed", lang.id()));
        };
        if !self.sandbox.can_run(&detected.exe) {
            let why = self.sandbox.cannot_run_reason(&detected.exe);
            return fail(report, why);
        }
        let cpu_s = self.cpu_limit(req.timeout);
        // A pooled interpreter when the pool can honour the request, else a cold start.
        let warm = if self.poolable(lang, &req, cpu_s) {
            self.pool.take(lang.id())
        } else {
            None
        };
        let (place, warm) = match warm {
            Some(w) => (w.place, Some(w.proc)),
            None => match self.place(lang, &detected.exe, cpu_s) {
                Ok(p) => (p, None),
                Err(e) => return fail(report, e),
            },
        };
        let spec = &lang.spec.run;
        if let Err(e) = std::fs::write(place.dir.path().join(&spec.file), &req.code) {
            return fail(report, format!("cannot write the program: {e}"));
        }
        let vars = place.vars(lang);
        let env = self.child_env(lang, &detected.exe, place.dir.path(), &vars, &req.env);

        if let Some(compile) = &spec.compile {
            let argv = expand_command(compile, &vars, &[]);
            let spawn = pipes(argv, env.clone(), &place.jail, place.dir.path());
            let step = self.step(spawn, None, deadline, cancel, progress).await;
            let ok = step.status.is_some_and(|s| s.success()) && !step.timed_out;
            if !ok || step.cancelled || step.spawn_error.is_some() {
                report.phase = Phase::Compile;
                Self::fill(&mut report, step);
                report.duration_ms = started.elapsed().as_millis() as u64;
                return report;
            }
        }
        let argv = expand_command(&spec.command, &vars, &req.args);
        // stdin is always a pipe, closed after the caller's input (if any): a pooled
        // interpreter reads its request on that same pipe, and a cold run must see the same.
        let input = req.stdin.map(String::into_bytes).unwrap_or_default();
        let step = match warm {
            Some(proc) => {
                let mut data = pool::request(&spec.file, cpu_s, req.args.len(), &argv, &env);
                data.extend_from_slice(&input);
                self.supervise(proc, data, deadline, cancel, progress).await
            }
            None => {
                let spawn = pipes(argv, env, &place.jail, place.dir.path());
                self.step(spawn, Some(input), deadline, cancel, progress)
                    .await
            }
        };
        Self::fill(&mut report, step);
        report.duration_ms = started.elapsed().as_millis() as u64;
        // The directory, then the uid (its processes are gone by now).
        drop(place);
        // Replace what this run used (or what the pool dropped), now that the run is over.
        self.refill(lang);
        report
    }

    /// RLIMIT_CPU of a run's processes.
    fn cpu_limit(&self, timeout: Duration) -> u64 {
        match self.config.cpu_s {
            // A second past the deadline: a single-threaded program reaches the wall-clock
            // timeout first (reported as a timeout); only several busy threads trip it.
            0 => timeout.as_secs_f64().ceil() as u64 + 1,
            n => n,
        }
        .max(1)
    }

    /// A fresh place for a run: a uid from the pool (when the server is root; returned when
    /// the place is dropped, after its processes are gone) and a private directory it owns.
    fn place(&self, lang: &Language, exe: &Path, cpu_s: u64) -> Result<Place, String> {
        let lease = self.sandbox.lease()?;
        let uid = lease.as_ref().map(|l| l.uid);
        let dir = self
            .workspace
            .new_run_dir(uid)
            .map_err(|e| format!("cannot create a working directory: {e}"))?;
        let cache_dir = crate::workspace::cache_dir(&dir, lang.id(), uid);
        let jail = Jail {
            uid,
            rw: vec![dir.path().to_path_buf(), cache_dir.clone()],
            ro: self.sandbox.interpreter_dirs(exe),
            cpu_s: Some(cpu_s),
            dirty: lease.as_ref().map(|l| l.dirty_flag()),
        };
        Ok(Place {
            exe: exe.display().to_string(),
            dir_s: dir.path().display().to_string(),
            cache: cache_dir.display().to_string(),
            dir,
            _lease: lease,
            jail,
        })
    }

    /// Whether a pooled interpreter can run this request exactly as a cold start would.
    fn poolable(&self, lang: &Language, req: &RunRequest, cpu_s: u64) -> bool {
        let Some(p) = &lang.spec.run.pool else {
            return false;
        };
        self.pool.enabled()
            && lang.spec.run.compile.is_none()
            // Pooled interpreters start with the largest CPU limit and lower it to the run's.
            && cpu_s <= self.cpu_limit(self.max_timeout())
            // NUL cannot be passed to a cold start either; let it fail the cold way.
            && !req.code.contains('\0')
            && !req.args.iter().any(|a| a.contains('\0'))
            && !req
                .env
                .keys()
                .any(|k| pool::starts_differently(k, &p.cold_env))
    }

    /// The longest a run can take (callers' timeouts are clamped to it).
    fn max_timeout(&self) -> Duration {
        Duration::from_millis(self.config.max_timeout_ms.max(1))
    }

    /// Start filling the pools of every installed language that has one (`serve` does this
    /// once it is up; from then on every run refills what it used).
    pub fn fill_pools(&self, registry: &Registry) {
        if !self.pool.enabled() {
            return;
        }
        self.pool.activate();
        for lang in registry.all() {
            if lang.installed() && lang.spec.run.pool.is_some() {
                self.refill(lang);
            }
        }
    }

    /// Start as many pooled interpreters of `lang` as it lacks, in the background.
    pub fn refill(&self, lang: &Arc<Language>) {
        if lang.spec.run.pool.is_none() {
            return;
        }
        for _ in 0..self.pool.reserve(lang.id()) {
            let me = self.clone();
            let lang = lang.clone();
            tokio::spawn(async move {
                let warm = me.start_warm(&lang).await;
                me.pool.started(lang.id(), warm);
            });
        }
    }

    /// Start one pooled interpreter: a fresh place, the environment of a run there (without
    /// any caller's variables), and the language's loader, through `exec::spawn` (so in the
    /// sandbox, as the run's uid) like every other child.
    async fn start_warm(&self, lang: &Language) -> Result<Warm, String> {
        let Some(p) = &lang.spec.run.pool else {
            return Err("the language has no pool".into());
        };
        let detected = lang
            .detect()
            .await
            .ok_or_else(|| format!("{} is not installed", lang.id()))?;
        if !self.sandbox.can_run(&detected.exe) {
            return Err(self.sandbox.cannot_run_reason(&detected.exe));
        }
        let place = self.place(lang, &detected.exe, self.cpu_limit(self.max_timeout()))?;
        let vars = place.vars(lang);
        let env = self.child_env(
            lang,
            &detected.exe,
            place.dir.path(),
            &vars,
            &BTreeMap::new(),
        );
        let mut with_loader = vars.to_vec();
        with_loader.push(("loader", p.loader.text.as_str()));
        let argv = expand_command(&p.command, &with_loader, &[]);
        let proc = exec::spawn(
            &self.sandbox,
            pipes(argv, env, &place.jail, place.dir.path()),
        )
        .map_err(|e| format!("cannot start {}: {e}", detected.exe.display()))?;
        Ok(Warm {
            proc,
            place,
            born: Instant::now(),
        })
    }

    fn fill(report: &mut RunReport, step: Step) {
        let (stdout, o1) = step.stdout.finish();
        let (stderr, o2) = step.stderr.finish();
        report.stdout = stdout;
        report.stderr = stderr;
        report.truncated = o1 > 0 || o2 > 0;
        report.timed_out = step.timed_out;
        if let Some(status) = &step.status {
            let (code, sig) = exec::describe_status(status);
            report.exit_code = code;
            report.signal = sig;
        }
        if step.timed_out {
            // The tree was killed; whatever status the helper mirrored, it was our SIGKILL.
            report.exit_code = None;
            report.signal = Some("SIGKILL".into());
        }
        if let Some(e) = step.spawn_error {
            report.error = Some(e);
        } else if step.cancelled {
            report.error = Some("cancelled by the client".into());
        }
    }

    /// The environment of a child: the allowlist, the language's settings, then the caller's.
    fn child_env(
        &self,
        lang: &Language,
        exe: &Path,
        home: &Path,
        vars: &[(&str, &str)],
        caller: &BTreeMap<String, String>,
    ) -> Vec<(String, String)> {
        let mut env = cenv::base_env(home, "dumb");
        // The interpreter's own directory first, so `python3`/`pip` in a subprocess match it.
        if let Some(bin) = exe.parent() {
            let path = format!("{}:{}", bin.display(), cenv::server_path());
            cenv::set(&mut env, "PATH", path);
        }
        cenv::set(&mut env, "TMPDIR", home.display().to_string());
        for (k, v) in lang.spec.env.iter().chain(lang.spec.run.env.iter()) {
            cenv::set(&mut env, k, expand(v, vars));
        }
        for (k, v) in caller {
            cenv::set(&mut env, k, v.clone());
        }
        env
    }

    async fn step(
        &self,
        spec: SpawnSpec,
        stdin: Option<Vec<u8>>,
        deadline: tokio::time::Instant,
        cancel: &CancellationToken,
        progress: Option<&Progress>,
    ) -> Step {
        let program = spec.argv.first().cloned().unwrap_or_default();
        match exec::spawn(&self.sandbox, spec) {
            Ok(proc) => {
                self.supervise(proc, stdin.unwrap_or_default(), deadline, cancel, progress)
                    .await
            }
            Err(e) => {
                let mut step = self.empty_step();
                step.spawn_error = Some(format!("failed to start {program}: {e}"));
                step
            }
        }
    }

    fn empty_step(&self) -> Step {
        let cap = self.config.output_cap;
        Step {
            status: None,
            stdout: HeadTail::new(cap),
            stderr: HeadTail::new(cap),
            timed_out: false,
            cancelled: false,
            spawn_error: None,
        }
    }

    /// Feed `stdin` (then close it), capture both streams, and wait for the end, the
    /// deadline or a cancel (which kill the tree).
    async fn supervise(
        &self,
        mut proc: exec::Proc,
        stdin: Vec<u8>,
        deadline: tokio::time::Instant,
        cancel: &CancellationToken,
        progress: Option<&Progress>,
    ) -> Step {
        let cap = self.config.output_cap;
        let mut step = self.empty_step();
        if let Some(mut pipe) = proc.child.stdin.take() {
            tokio::spawn(async move {
                // A program that does not read its input is not an error.
                let _ = pipe.write_all(&stdin).await;
                let _ = pipe.shutdown().await;
            });
        }
        // The last bytes written to either stream, for progress messages.
        let recent = Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let out_task = proc
            .child
            .stdout
            .take()
            .map(|p| tokio::spawn(capture(p, cap, recent.clone())));
        let err_task = proc
            .child
            .stderr
            .take()
            .map(|p| tokio::spawn(capture(p, cap, recent.clone())));

        let every = Duration::from_millis(500);
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                status = proc.wait() => { step.status = status.ok(); break; }
                _ = tokio::time::sleep_until(deadline) => {
                    step.timed_out = true;
                    step.status = proc.kill_tree().await;
                    break;
                }
                _ = cancel.cancelled() => {
                    step.cancelled = true;
                    step.status = proc.kill_tree().await;
                    break;
                }
                _ = tick.tick(), if progress.is_some() => {
                    if let Some(report) = progress {
                        let bytes = recent.lock().map(|b| b.clone()).unwrap_or_default();
                        report(last_line(&bytes));
                    }
                }
            }
        }
        // The helper has killed the tree, so the pipes close; bound the wait anyway in case
        // something outside the tree holds them.
        for (task, slot) in [(out_task, &mut step.stdout), (err_task, &mut step.stderr)] {
            if let Some(task) = task {
                match tokio::time::timeout(Duration::from_secs(2), task).await {
                    Ok(Ok(buf)) => *slot = buf,
                    _ => slot.push(b"\n[output stream did not close; capture stopped]\n"),
                }
            }
        }
        step
    }
}

/// A program with its three streams on pipes; stdin is closed after its input (if any).
fn pipes(argv: Vec<String>, env: Vec<(String, String)>, jail: &Jail, cwd: &Path) -> SpawnSpec {
    SpawnSpec {
        argv,
        env,
        cwd: cwd.to_path_buf(),
        stdio: Stdio3::Pipes,
        jail: jail.clone(),
    }
}

/// Read a pipe to its end, keeping head and tail, and the most recent bytes in `recent`.
async fn capture(
    mut pipe: impl AsyncRead + Unpin,
    cap: usize,
    recent: Arc<std::sync::Mutex<Vec<u8>>>,
) -> HeadTail {
    const RECENT: usize = 512;
    let mut buf = HeadTail::new(cap);
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                buf.push(&chunk[..n]);
                if let Ok(mut r) = recent.lock() {
                    r.extend_from_slice(&chunk[n.saturating_sub(RECENT)..n]);
                    let excess = r.len().saturating_sub(RECENT);
                    r.drain(..excess);
                }
            }
        }
    }
    buf
}

/// The last non-empty line of some output, as a person would read it.
fn last_line(bytes: &[u8]) -> String {
    let text = crate::output::render_all(bytes, 4096).text;
    text.trim_end()
        .rsplit('\n')
        .next()
        .unwrap_or("")
        .chars()
        .take(200)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> RunReport {
        RunReport {
            language: "python".into(),
            stdout: "out\n".into(),
            stderr: String::new(),
            exit_code: Some(0),
            signal: None,
            timed_out: false,
            duration_ms: 12,
            truncated: false,
            phase: Phase::Run,
            error: None,
            sandbox: Level::Bwrap,
        }
    }

    #[test]
    fn clean_success_is_exactly_stdout() {
        assert_eq!(report().text(), "out\n");
        let mut r = report();
        r.stdout = "no newline".into();
        assert_eq!(r.text(), "no newline");
    }

    #[test]
    fn stderr_and_exit_code_are_kept() {
        let mut r = report();
        r.stderr = "warn".into();
        assert!(r.success());
        assert_eq!(r.text(), "out\n[stderr]\nwarn\n[exit code 0]");
        r.exit_code = Some(3);
        r.stdout = "partial".into();
        r.stderr.clear();
        assert!(!r.success());
        assert_eq!(r.text(), "partial\n[exit code 3]");
    }

    #[test]
    fn trailers() {
        let mut r = report();
        r.timed_out = true;
        r.exit_code = None;
        r.signal = Some("SIGKILL".into());
        r.duration_ms = 2003;
        assert!(r.text().ends_with("[timed out after 2003 ms]"));
        let mut r = report();
        r.phase = Phase::Compile;
        r.exit_code = Some(1);
        r.stdout.clear();
        r.stderr = "main.c:1: error".into();
        assert_eq!(
            r.text(),
            "[stderr]\nmain.c:1: error\n[compile error: exit code 1]"
        );
        let mut r = report();
        r.exit_code = None;
        r.signal = Some("SIGSEGV".into());
        assert!(r.text().ends_with("[killed by SIGSEGV]"));
    }
}
