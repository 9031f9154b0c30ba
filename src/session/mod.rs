//! Persistent REPL sessions: a table of sessions keyed by id, each one interpreter behind a
//! PTY, driven by its language file.

pub mod interp;
pub mod scan;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use dashmap::DashMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::exec::env as cenv;
use crate::lang::{Language, Registry, expand, expand_command};
use crate::sandbox::{Jail, Lease, Level, Sandbox};
use crate::workspace::{PrivateDir, Workspace};
use interp::{Ending, Interp, Launch};

/// Status of one evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EvalStatus {
    Ok,
    Error,
    Timeout,
    Exited,
    AwaitingInput,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub struct ErrorInfo {
    /// The exception or error class, as the language names it.
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
}

/// The result of `session_eval` (also its `structuredContent`).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct EvalReport {
    pub session_id: String,
    /// Number of this evaluation in the session, from 1.
    pub eval_id: u64,
    pub status: EvalStatus,
    /// What a person would have seen in the terminal: no echo, prompts or escape
    /// sequences; the value of a trailing expression shown as the REPL shows it.
    pub output: String,
    pub truncated: bool,
    pub duration_ms: u64,
    /// The interpreter's exit code, when status is `exited`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended the interpreter, when status is `exited` because of one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// True when the interpreter had to be replaced: the session's state is lost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restarted: Option<bool>,
    /// The error the code raised, where the language tells.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
}

impl EvalReport {
    pub fn is_error(&self) -> bool {
        matches!(
            self.status,
            EvalStatus::Error | EvalStatus::Timeout | EvalStatus::Exited
        )
    }

    /// The text content: the output, then a line saying how it ended when not `ok`.
    pub fn text(&self) -> String {
        let mut t = self.output.clone();
        let trailer = match self.status {
            EvalStatus::Ok => None,
            EvalStatus::Error => Some(match &self.error {
                Some(e) if e.message.is_empty() => format!("[error: {}]", e.kind),
                Some(e) => format!("[error: {}: {}]", e.kind, first_line(&e.message)),
                None => "[error]".to_string(),
            }),
            EvalStatus::Timeout => Some(if self.restarted == Some(true) {
                format!(
                    "[timed out after {} ms; the interpreter did not stop and was restarted: state lost]",
                    self.duration_ms
                )
            } else {
                format!(
                    "[timed out after {} ms; interrupted, the session keeps its state]",
                    self.duration_ms
                )
            }),
            EvalStatus::Exited => Some(format!(
                "[the interpreter exited ({}); start a new session with session_start]",
                match (&self.exit_code, &self.signal) {
                    (Some(c), _) => format!("exit code {c}"),
                    (None, Some(s)) => format!("killed by {s}"),
                    _ => "status unknown".into(),
                }
            )),
            EvalStatus::AwaitingInput => {
                Some("[waiting for input: answer with session_input, or interrupt]".to_string())
            }
        };
        if let Some(tr) = trailer {
            if !t.is_empty() && !t.ends_with('\n') {
                t.push('\n');
            }
            t.push_str(&tr);
        }
        t
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

/// What `session_start` returns.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct StartReport {
    pub session_id: String,
    pub language: String,
    pub version: String,
    /// Process id of the interpreter.
    pub pid: u32,
    pub cwd: String,
    pub idle_timeout_s: u64,
    /// The isolation level the interpreter runs under.
    pub sandbox: Level,
}

/// What `session_close` returns.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CloseReport {
    pub session_id: String,
    pub closed: bool,
    /// The interpreter's exit code (null when it had to be killed).
    pub exit_code: Option<i32>,
}

/// One row of `session_list`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct SessionInfo {
    pub session_id: String,
    pub language: String,
    pub pid: u32,
    pub cwd: String,
    /// Seconds since the Unix epoch.
    pub created_at: u64,
    pub last_used_at: u64,
    pub idle_s: u64,
    pub evals: u64,
    pub busy: bool,
    pub idle_timeout_s: u64,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ListReport {
    pub sessions: Vec<SessionInfo>,
}

/// Who is calling: sessions belong to the principal that started them. Over stdio there is
/// one principal; over HTTP each token is one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller {
    pub principal: String,
}

impl Caller {
    /// The single principal of a stdio connection (and of in-process callers).
    pub fn local() -> Self {
        Self {
            principal: "local".into(),
        }
    }
}

/// What the caller asked `session_start` for.
#[derive(Debug, Clone, Default)]
pub struct StartRequest {
    pub language: String,
    pub cwd: Option<PathBuf>,
    pub env: BTreeMap<String, String>,
    pub idle_timeout_s: Option<u64>,
}

struct Busy {
    eval_id: u64,
    since: Instant,
}

/// How a session ended, kept so later calls can say so.
#[derive(Debug, Clone)]
enum Gone {
    Closed,
    Exited {
        code: Option<i32>,
        signal: Option<String>,
    },
}

pub struct Session {
    pub id: String,
    pub owner: Caller,
    pub lang: Arc<Language>,
    pub version: String,
    pub cwd: PathBuf,
    pub created_at: SystemTime,
    pub idle_timeout: Duration,
    /// The session's private directory (work and control), removed when dropped.
    _dir: PrivateDir,
    interp: tokio::sync::Mutex<Option<Interp>>,
    pid: AtomicU64,
    evals: AtomicU64,
    last_used: Mutex<(SystemTime, Instant)>,
    busy: Mutex<Option<Busy>>,
    gone: Mutex<Option<Gone>>,
    /// The uid the interpreter runs as; returned (after a sweep) when the session is gone.
    /// Last, so it is dropped after the interpreter.
    _lease: Option<Lease>,
}

impl Session {
    fn touch(&self) {
        if let Ok(mut l) = self.last_used.lock() {
            *l = (SystemTime::now(), Instant::now());
        }
    }

    fn idle_for(&self) -> Duration {
        self.last_used
            .lock()
            .map(|l| l.1.elapsed())
            .unwrap_or_default()
    }

    fn info(&self) -> SessionInfo {
        let (last_wall, _) = self
            .last_used
            .lock()
            .map(|l| *l)
            .unwrap_or((self.created_at, Instant::now()));
        SessionInfo {
            session_id: self.id.clone(),
            language: self.lang.id().to_string(),
            pid: self.pid.load(Ordering::Relaxed) as u32,
            cwd: self.cwd.display().to_string(),
            created_at: unix(self.created_at),
            last_used_at: unix(last_wall),
            idle_s: self.idle_for().as_secs(),
            evals: self.evals.load(Ordering::Relaxed),
            busy: self.busy.lock().map(|b| b.is_some()).unwrap_or(false),
            idle_timeout_s: self.idle_timeout.as_secs(),
        }
    }
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The table of sessions, shared by every MCP connection.
pub struct SessionManager {
    config: Arc<Config>,
    registry: Arc<Registry>,
    workspace: Arc<Workspace>,
    sandbox: Arc<Sandbox>,
    sessions: DashMap<String, Arc<Session>>,
    /// Sessions that ended, so a later call can say how (bounded).
    ended: DashMap<String, (Caller, Gone)>,
}

impl SessionManager {
    pub fn new(
        config: Arc<Config>,
        registry: Arc<Registry>,
        workspace: Arc<Workspace>,
        sandbox: Arc<Sandbox>,
    ) -> Self {
        Self {
            config,
            registry,
            workspace,
            sandbox,
            sessions: DashMap::new(),
            ended: DashMap::new(),
        }
    }

    pub fn count(&self) -> usize {
        self.sessions.len()
    }

    /// Start a session; errors are messages for the agent.
    pub async fn start(&self, caller: &Caller, req: StartRequest) -> Result<StartReport, String> {
        let lang = self.registry.get(&req.language).map_err(|e| match e {
            crate::lang::LookupError::Unknown(n) => format!(
                "unknown language {n:?}. Session languages on this host: {}",
                self.registry.session_ids().join(", ")
            ),
            crate::lang::LookupError::NotInstalled { id, reason } => format!(
                "language {id:?} is not installed on this host ({reason}). Session languages: {}",
                self.registry.session_ids().join(", ")
            ),
        })?;
        let Some(spec) = lang.spec.session.clone() else {
            return Err(format!(
                "{} has no REPL driver, so it cannot hold a session; use run-code for it. Session languages: {}",
                lang.id(),
                self.registry.session_ids().join(", ")
            ));
        };
        for (k, v) in &req.env {
            cenv::validate_name(k).and_then(|_| cenv::validate_value(k, v))?;
        }
        let cwd = match &req.cwd {
            Some(dir) => {
                let meta =
                    std::fs::metadata(dir).map_err(|e| format!("cwd {}: {e}", dir.display()))?;
                if !meta.is_dir() {
                    return Err(format!("cwd {} is not a directory", dir.display()));
                }
                let dir = std::fs::canonicalize(dir)
                    .map_err(|e| format!("cwd {}: {e}", dir.display()))?;
                self.sandbox.check_cwd(&dir, self.workspace.root())?;
                Some(dir)
            }
            None => None,
        };
        let detected = lang
            .detect()
            .await
            .ok_or_else(|| format!("{} is not installed", lang.id()))?
            .clone();
        if !self.sandbox.can_run(&detected.exe) {
            return Err(self.sandbox.cannot_run_reason(&detected.exe));
        }
        let lease = self.sandbox.lease()?;
        let uid = lease.as_ref().map(|l| l.uid);
        let id = uuid::Uuid::new_v4().to_string();
        let dir = self
            .workspace
            .new_session_dir(&id, uid)
            .map_err(|e| format!("cannot create the session directory: {e}"))?;
        let work = dir.path().join("work");
        let ctl = dir.path().join("ctl");
        let caller_cwd = cwd.clone();
        let cwd = cwd.unwrap_or_else(|| work.clone());
        let nonce = uuid::Uuid::new_v4().simple().to_string()[..16].to_string();
        let ctl_s = ctl.display().to_string();
        let work_s = work.display().to_string();
        let bootstrap = expand(
            &spec.bootstrap,
            &[("nonce", &nonce), ("ctl", &ctl_s), ("work", &work_s)],
        );
        let boot_path = ctl.join(&spec.bootstrap_file);
        std::fs::write(&boot_path, bootstrap)
            .map_err(|e| format!("cannot write the bootstrap: {e}"))?;
        let exe = detected.exe.display().to_string();
        let boot_s = boot_path.display().to_string();
        let cache_dir = self.workspace.cache_dir(lang.id(), uid);
        let cache = cache_dir.display().to_string();
        let vars = [
            ("exe", exe.as_str()),
            ("bootstrap", boot_s.as_str()),
            ("ctl", ctl_s.as_str()),
            ("work", work_s.as_str()),
            ("cache", cache.as_str()),
            ("nonce", nonce.as_str()),
        ];
        let argv = expand_command(&spec.command, &vars, &[]);
        let mut env = cenv::base_env(&work, "dumb");
        if let Some(bin) = detected.exe.parent() {
            cenv::set(
                &mut env,
                "PATH",
                format!("{}:{}", bin.display(), cenv::server_path()),
            );
        }
        cenv::set(&mut env, "TMPDIR", work_s.clone());
        for (k, v) in lang.spec.env.iter().chain(spec.env.iter()) {
            cenv::set(&mut env, k, expand(v, &vars));
        }
        for (k, v) in &req.env {
            cenv::set(&mut env, k, v.clone());
        }
        // Writable: the session's own directory, a caller's cwd (the kernel still decides what
        // the session's uid may do there), the build cache. Readable: the control directory
        // and the interpreter's prefix when a mask would hide it.
        let mut rw = vec![work.clone(), cache_dir];
        rw.extend(caller_cwd);
        let mut ro = vec![ctl.clone()];
        ro.extend(self.sandbox.interpreter_dirs(&detected.exe));
        let jail = Jail {
            uid,
            rw,
            ro,
            cpu_s: None,
            dirty: lease.as_ref().map(|l| l.dirty_flag()),
        };
        let launch = Arc::new(Launch {
            sandbox: self.sandbox.clone(),
            jail,
            argv,
            env,
            cwd: cwd.clone(),
            ctl,
            nonce,
            spec: spec.clone(),
            output_cap: self.config.output_cap,
        });
        let interp = Interp::start(launch, Duration::from_millis(spec.start_timeout_ms)).await?;
        let idle_timeout = Duration::from_secs(req.idle_timeout_s.unwrap_or(30 * 60));
        let pid = interp.pid;
        let now = SystemTime::now();
        let session = Arc::new(Session {
            id: id.clone(),
            owner: caller.clone(),
            lang: lang.clone(),
            version: detected.version.clone(),
            cwd: cwd.clone(),
            created_at: now,
            idle_timeout,
            _dir: dir,
            interp: tokio::sync::Mutex::new(Some(interp)),
            pid: AtomicU64::new(pid as u64),
            evals: AtomicU64::new(0),
            last_used: Mutex::new((now, Instant::now())),
            busy: Mutex::new(None),
            gone: Mutex::new(None),
            _lease: lease,
        });
        self.sessions.insert(id.clone(), session);
        Ok(StartReport {
            session_id: id,
            language: lang.id().to_string(),
            version: detected.version,
            pid,
            cwd: cwd.display().to_string(),
            idle_timeout_s: idle_timeout.as_secs(),
            sandbox: self.sandbox.level,
        })
    }

    /// Find a session of this caller. Another principal's session is "no session", so
    /// its existence is not revealed.
    fn lookup(&self, caller: &Caller, id: &str) -> Result<Arc<Session>, String> {
        let unknown = || {
            format!(
                "no session {id:?}. Start one with session_start, or see session_list for the open ones."
            )
        };
        if let Some(s) = self.sessions.get(id) {
            if s.owner != *caller {
                return Err(unknown());
            }
            return Ok(s.clone());
        }
        Err(match self.ended.get(id).map(|g| g.clone()) {
            Some((owner, _)) if owner != *caller => unknown(),
            Some((_, Gone::Closed)) => {
                format!("session {id} was closed. Start a new one with session_start.")
            }
            Some((_, Gone::Exited { code, signal })) => format!(
                "session {id} ended: its interpreter exited ({}). Start a new one with session_start.",
                describe_exit(code, signal.as_deref())
            ),
            None => unknown(),
        })
    }

    /// Evaluate code in a session.
    pub async fn eval(
        &self,
        caller: &Caller,
        id: &str,
        code: &str,
        timeout: Duration,
        cancel: &CancellationToken,
    ) -> Result<EvalReport, String> {
        let session = self.lookup(caller, id)?;
        let mut guard = match session.interp.try_lock() {
            Ok(g) => g,
            Err(_) => {
                let what = session
                    .busy
                    .lock()
                    .ok()
                    .and_then(|b| {
                        b.as_ref().map(|b| {
                            format!(
                                "evaluation {} (running for {:.1} s)",
                                b.eval_id,
                                b.since.elapsed().as_secs_f64()
                            )
                        })
                    })
                    .unwrap_or_else(|| "another call".into());
                return Err(format!(
                    "session {id} is busy with {what}. Wait for it to finish, or use another session."
                ));
            }
        };
        let Some(interp) = guard.as_mut() else {
            drop(guard);
            return Err(self.lookup_gone(&session));
        };
        let eval_id = session.evals.fetch_add(1, Ordering::Relaxed) + 1;
        if let Ok(mut b) = session.busy.lock() {
            *b = Some(Busy {
                eval_id,
                since: Instant::now(),
            });
        }
        session.touch();
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + timeout;
        let outcome = interp.eval(eval_id, code, deadline, cancel).await;
        let duration_ms = started.elapsed().as_millis() as u64;
        let mut report = EvalReport {
            session_id: id.to_string(),
            eval_id,
            status: EvalStatus::Ok,
            output: outcome.output.text,
            truncated: outcome.output.omitted > 0,
            duration_ms,
            exit_code: None,
            signal: None,
            restarted: None,
            error: None,
        };
        let error_pattern = session
            .lang
            .spec
            .session
            .as_ref()
            .and_then(|s| s.error_pattern.clone());
        match outcome.ending {
            Ending::Done(marker) => apply_marker(&mut report, &marker, error_pattern.as_deref()),
            Ending::TimedOut { .. } | Ending::Cancelled => report.status = EvalStatus::Timeout,
            Ending::Restarted { reason } => {
                report.status = EvalStatus::Timeout;
                report.restarted = Some(true);
                tracing::warn!(session = id, %reason, "interpreter restarted");
            }
            Ending::Incomplete => {
                report.status = EvalStatus::Error;
                report.error = Some(ErrorInfo {
                    kind: "IncompleteInput".into(),
                    message: "the REPL expected more input".into(),
                });
            }
            Ending::Failed(reason) => {
                report.status = EvalStatus::Error;
                report.error = Some(ErrorInfo {
                    kind: "ReplboxError".into(),
                    message: reason,
                });
            }
            Ending::Exited(status) => {
                report.status = EvalStatus::Exited;
                if let Some(st) = status {
                    let (code, sig) = crate::exec::describe_status(&st);
                    report.exit_code = code;
                    report.signal = sig;
                }
                *guard = None;
                self.mark_gone(
                    &session,
                    Gone::Exited {
                        code: report.exit_code,
                        signal: report.signal.clone(),
                    },
                );
            }
        }
        if let Some(i) = guard.as_ref() {
            session.pid.store(i.pid as u64, Ordering::Relaxed);
        }
        drop(guard);
        if let Ok(mut b) = session.busy.lock() {
            *b = None;
        }
        session.touch();
        Ok(report)
    }

    fn lookup_gone(&self, session: &Session) -> String {
        match session.gone.lock().ok().and_then(|g| g.clone()) {
            Some(Gone::Exited { code, signal }) => format!(
                "session {} ended: its interpreter exited ({}). Start a new one with session_start.",
                session.id,
                describe_exit(code, signal.as_deref())
            ),
            _ => format!(
                "session {} was closed. Start a new one with session_start.",
                session.id
            ),
        }
    }

    fn mark_gone(&self, session: &Session, how: Gone) {
        if let Ok(mut g) = session.gone.lock() {
            if g.is_some() {
                return; // closed while the evaluation ran: it stays "closed"
            }
            *g = Some(how.clone());
        }
        self.sessions.remove(&session.id);
        self.remember(session, how);
    }

    fn remember(&self, session: &Session, how: Gone) {
        // Bounded memory of ended sessions.
        if self.ended.len() >= 4096
            && let Some(k) = self.ended.iter().next().map(|e| e.key().clone())
        {
            self.ended.remove(&k);
        }
        self.ended
            .insert(session.id.clone(), (session.owner.clone(), how));
    }

    /// Close a session: kill its interpreter's tree and remove its directory.
    pub async fn close(&self, caller: &Caller, id: &str) -> Result<CloseReport, String> {
        let session = self.lookup(caller, id)?;
        self.sessions.remove(id);
        self.remember(&session, Gone::Closed);
        // An evaluation in flight holds the lock; killing the tree makes it return.
        let exit_code = close_session(&session).await;
        Ok(CloseReport {
            session_id: id.to_string(),
            closed: true,
            exit_code,
        })
    }

    /// The caller's open sessions.
    pub fn list(&self, caller: &Caller) -> ListReport {
        let mut sessions: Vec<SessionInfo> = self
            .sessions
            .iter()
            .filter(|s| s.owner == *caller)
            .map(|s| s.info())
            .collect();
        sessions.sort_by_key(|s| s.created_at);
        ListReport { sessions }
    }

    /// Close every session (server shutdown).
    pub async fn shutdown(&self) {
        let all: Vec<Arc<Session>> = self.sessions.iter().map(|s| s.clone()).collect();
        self.sessions.clear();
        let mut tasks = Vec::new();
        for s in all {
            tasks.push(tokio::spawn(async move {
                close_session(&s).await;
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
    }
}

/// Kill a session's interpreter tree (waiting out a running evaluation's lock).
async fn close_session(session: &Session) -> Option<i32> {
    if let Ok(mut g) = session.gone.lock() {
        g.get_or_insert(Gone::Closed);
    }
    // If an evaluation holds the interpreter, kill the tree by pid so it returns promptly.
    let mut guard = match session.interp.try_lock() {
        Ok(g) => g,
        Err(_) => {
            let pid = session.pid.load(Ordering::Relaxed) as i32;
            if let Some(helper) = parent_of(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(helper),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            session.interp.lock().await
        }
    };
    let status = match guard.as_mut() {
        Some(i) => i.kill().await,
        None => None,
    };
    *guard = None;
    status.and_then(|s| s.code())
}

fn parent_of(pid: i32) -> Option<i32> {
    crate::exec::helper::read_ppid_state(pid).map(|(p, _)| p)
}

fn describe_exit(code: Option<i32>, signal: Option<&str>) -> String {
    match (code, signal) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by {s}"),
        _ => "status unknown".into(),
    }
}

/// Fill status and error from the end marker (or the language's error pattern).
fn apply_marker(report: &mut EvalReport, marker: &scan::EndMarker, error_pattern: Option<&str>) {
    let payload: Option<ErrorInfo> = if marker.payload.is_empty() {
        None
    } else {
        base64::engine::general_purpose::STANDARD
            .decode(marker.payload.as_bytes())
            .ok()
            .and_then(|b| serde_json::from_slice::<ErrorInfo>(&b).ok())
    };
    report.status = match marker.status.as_str() {
        "ok" => EvalStatus::Ok,
        "error" => EvalStatus::Error,
        // The code itself raised the interrupt (a deadline goes through the timeout path).
        "interrupted" => {
            report.error.get_or_insert(ErrorInfo {
                kind: "KeyboardInterrupt".into(),
                message: String::new(),
            });
            EvalStatus::Error
        }
        _ => {
            // `?`: the REPL cannot tell; look at the output.
            match error_pattern.and_then(|p| regex::Regex::new(p).ok()) {
                Some(re) => match re.captures(&report.output) {
                    Some(c) => {
                        if payload.is_none() {
                            report.error = Some(ErrorInfo {
                                kind: c
                                    .get(1)
                                    .map(|m| m.as_str().to_string())
                                    .unwrap_or_else(|| "error".into()),
                                message: c
                                    .get(2)
                                    .map(|m| m.as_str().trim().to_string())
                                    .unwrap_or_default(),
                            });
                        }
                        EvalStatus::Error
                    }
                    None => EvalStatus::Ok,
                },
                None => EvalStatus::Ok,
            }
        }
    };
    if payload.is_some() {
        report.error = payload;
    }
}
