//! The table of sessions: lifecycle, ownership, limits and the idle reaper.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use dashmap::DashMap;
use tokio_util::sync::CancellationToken;

use super::files::{self, InFile, Snapshot};
use super::interp::{Ending, Interp, Launch, Outcome, Progress};
use super::report::{
    Attachment, CloseReport, ErrorInfo, EvalReport, EvalStatus, ImageInfo, ImageRef,
    InterruptReport, ListReport, SessionInfo, StartReport, apply_marker, marker_images,
};
use crate::config::Config;
use crate::exec::env as cenv;
use crate::hostfs::{self, CwdPolicy};
use crate::lang::{Language, Registry, expand, expand_command};
use crate::sandbox::{Jail, Lease, Sandbox};
use crate::workspace::{DirId, PrivateDir, Workspace};

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

    /// Whether this is the local principal (stdio, or HTTP without tokens): the user who
    /// started the server, who may have it copy files of this machine into a session.
    pub fn is_local(&self) -> bool {
        *self == Self::local()
    }
}

/// What the caller asked `session_start` for.
#[derive(Debug, Clone, Default)]
pub struct StartRequest {
    pub language: String,
    pub cwd: Option<PathBuf>,
    pub env: BTreeMap<String, String>,
    pub idle_timeout_s: Option<u64>,
    /// Files to put into the session's directory before it starts.
    pub files: Vec<InFile>,
}

struct Busy {
    eval_id: u64,
    since: Instant,
}

struct Awaiting {
    eval_id: u64,
    prompt: String,
}

/// How a session ended, kept so later calls can say so.
#[derive(Debug, Clone)]
enum Gone {
    Closed,
    Exited {
        code: Option<i32>,
        signal: Option<String>,
    },
    Reaped {
        at: SystemTime,
        idle: Duration,
    },
    Evicted {
        at: SystemTime,
        idle: Duration,
    },
}

impl Gone {
    fn message(&self, id: &str) -> String {
        match self {
            Gone::Closed => format!("session {id} was closed. Start a new one with session_start."),
            Gone::Exited { code, signal } => format!(
                "session {id} ended: its interpreter exited ({}). Start a new one with session_start.",
                describe_exit(*code, signal.as_deref())
            ),
            Gone::Reaped { at, idle } => format!(
                "session {id} was closed for idleness at {} (unix time) after {} s without use. \
Start a new one with session_start (and pass idle_timeout_s to keep it longer).",
                unix(*at),
                idle.as_secs()
            ),
            Gone::Evicted { at, idle } => format!(
                "session {id} was closed at {} (unix time) after {} s without use, to make room \
under the session limit. Start a new one with session_start.",
                unix(*at),
                idle.as_secs()
            ),
        }
    }
}

pub struct Session {
    pub id: String,
    pub owner: Caller,
    pub lang: Arc<Language>,
    pub version: String,
    pub cwd: PathBuf,
    /// A handle on `cwd`: its files are listed and read beneath it, as `uid`.
    cwd_fd: Arc<OwnedFd>,
    /// The uid the interpreter runs as (None: the server's own, when not root).
    uid: Option<u32>,
    pub created_at: SystemTime,
    pub idle_timeout: Duration,
    /// The session's private directory (work and control), removed when dropped.
    _dir: PrivateDir,
    /// A handle on the directory where the interpreter leaves what it hands back (the
    /// figures' PNG files).
    out_fd: Arc<OwnedFd>,
    /// The files of `cwd` as the previous evaluation left them; None when change tracking
    /// is off (the directory is too big to walk at every evaluation).
    files: Mutex<Option<Snapshot>>,
    interp: tokio::sync::Mutex<Option<Interp>>,
    pid: AtomicU64,
    /// The helper the interpreter runs under: what a close signals while an evaluation
    /// holds the interpreter.
    helper: AtomicU64,
    evals: AtomicU64,
    last_used: Mutex<(SystemTime, Instant)>,
    busy: Mutex<Option<Busy>>,
    gone: Mutex<Option<Gone>>,
    awaiting: Mutex<Option<Awaiting>>,
    /// Interrupts the evaluation in flight (session_interrupt from another call).
    interrupt: Mutex<Option<CancellationToken>>,
    /// The uid the interpreter runs as; returned (after a sweep) when the session is gone.
    /// Last, so it is dropped after the interpreter.
    _lease: Option<Lease>,
}

/// The call that marked the session busy is over. Called once its report is complete, with
/// the interpreter's lock still held: a client that sees the session free in session_list
/// must not then be refused by session_eval because the call is still collecting files.
fn release(session: &Session) {
    *lock(&session.busy) = None;
    session.touch();
}

/// Lock a std mutex, recovering from poisoning (a panic elsewhere must not wedge sessions).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Session {
    fn touch(&self) {
        *lock(&self.last_used) = (SystemTime::now(), Instant::now());
    }

    fn idle_for(&self) -> Duration {
        if lock(&self.busy).is_some() {
            return Duration::ZERO;
        }
        lock(&self.last_used).1.elapsed()
    }

    fn info(&self) -> SessionInfo {
        let (last_wall, _) = *lock(&self.last_used);
        let idle = self.idle_for();
        SessionInfo {
            session_id: self.id.clone(),
            language: self.lang.id().to_string(),
            pid: self.pid.load(Ordering::Relaxed) as u32,
            cwd: self.cwd.display().to_string(),
            created_at: unix(self.created_at),
            last_used_at: unix(last_wall),
            idle_s: idle.as_secs(),
            evals: self.evals.load(Ordering::Relaxed),
            busy: lock(&self.busy).is_some(),
            awaiting_input: lock(&self.awaiting).is_some(),
            idle_timeout_s: self.idle_timeout.as_secs(),
            expires_in_s: self.idle_timeout.saturating_sub(idle).as_secs(),
        }
    }
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Sessions being started, per principal: they count against the limits.
type Starting = Mutex<HashMap<Caller, usize>>;

/// A place under the session limits, held while a session starts.
struct Slot<'a> {
    starting: &'a Starting,
    caller: Caller,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut m = lock(self.starting);
        if let Some(n) = m.get_mut(&self.caller) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.caller);
            }
        }
    }
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
    starting: Starting,
    /// What a caller's cwd may be.
    cwd_policy: Arc<CwdPolicy>,
}

impl SessionManager {
    pub fn new(
        config: Arc<Config>,
        registry: Arc<Registry>,
        workspace: Arc<Workspace>,
        sandbox: Arc<Sandbox>,
    ) -> Self {
        let cwd_policy = Arc::new(CwdPolicy::new(
            workspace.root(),
            sandbox.masked(),
            &config.allow_cwd,
        ));
        Self {
            config,
            registry,
            workspace,
            sandbox,
            sessions: DashMap::new(),
            ended: DashMap::new(),
            starting: Mutex::new(HashMap::new()),
            cwd_policy,
        }
    }

    pub fn count(&self) -> usize {
        self.sessions.len()
    }

    /// Principals that hold at least one open session.
    pub fn owners(&self) -> usize {
        let owners: HashSet<Caller> = self.sessions.iter().map(|s| s.owner.clone()).collect();
        owners.len()
    }

    /// Close idle sessions in the background for as long as the manager lives.
    pub fn spawn_reaper(self: &Arc<Self>) {
        let weak: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                let Some(me) = weak.upgrade() else { return };
                me.reap_idle().await;
            }
        });
    }

    /// Close every session idle for longer than its idle timeout.
    pub async fn reap_idle(&self) {
        let expired: Vec<Arc<Session>> = self
            .sessions
            .iter()
            .filter(|s| s.idle_for() > s.idle_timeout)
            .map(|s| s.clone())
            .collect();
        for s in expired {
            let idle = s.idle_for();
            tracing::info!(session = %s.id, idle_s = idle.as_secs(), "closing idle session");
            self.end(
                &s,
                Gone::Reaped {
                    at: SystemTime::now(),
                    idle,
                },
            )
            .await;
        }
    }

    /// Take a place under the session limits: the caller's own (per principal), then the
    /// server's, where the idlest session is evicted when configured to.
    async fn admit(&self, caller: &Caller) -> Result<Slot<'_>, String> {
        loop {
            {
                let mut starting = lock(&self.starting);
                let mine_starting = starting.get(caller).copied().unwrap_or(0);
                let limit = self.config.max_sessions_per_principal;
                if limit > 0 {
                    let mine = self.sessions.iter().filter(|s| s.owner == *caller).count();
                    if mine + mine_starting >= limit {
                        return Err(format!(
                            "session limit reached: you already have {mine} open session(s){} and \
the limit per client is {limit} (max_sessions_per_principal). Close one you no longer need with \
session_close (session_list shows them), or reuse one with session_eval.",
                            if mine_starting > 0 {
                                format!(" and {mine_starting} starting")
                            } else {
                                String::new()
                            }
                        ));
                    }
                }
                let all_starting: usize = starting.values().sum();
                if self.sessions.len() + all_starting < self.config.max_sessions {
                    *starting.entry(caller.clone()).or_insert(0) += 1;
                    return Ok(Slot {
                        starting: &self.starting,
                        caller: caller.clone(),
                    });
                }
            }
            let idlest = self
                .sessions
                .iter()
                .filter(|s| lock(&s.busy).is_none())
                .max_by_key(|s| s.idle_for())
                .map(|s| s.clone());
            match idlest {
                Some(victim) if self.config.evict_idle => {
                    let idle = victim.idle_for();
                    tracing::info!(session = %victim.id, "evicting the idlest session");
                    self.end(
                        &victim,
                        Gone::Evicted {
                            at: SystemTime::now(),
                            idle,
                        },
                    )
                    .await;
                }
                _ => return Err(self.limit_message(caller)),
            }
        }
    }

    fn limit_message(&self, caller: &Caller) -> String {
        let mut mine: Vec<(Duration, String)> = self
            .sessions
            .iter()
            .filter(|s| s.owner == *caller)
            .map(|s| {
                (
                    s.idle_for(),
                    format!(
                        "{} ({}, idle {} s)",
                        s.id,
                        s.lang.id(),
                        s.idle_for().as_secs()
                    ),
                )
            })
            .collect();
        mine.sort_by_key(|m| std::cmp::Reverse(m.0));
        let list: Vec<String> = mine.into_iter().take(3).map(|(_, d)| d).collect();
        let yours = if list.is_empty() {
            "none of them are yours".to_string()
        } else {
            format!("your idlest: {}", list.join("; "))
        };
        format!(
            "session limit reached: {} sessions are open (the server allows {}). Close one with \
session_close ({yours}), or wait for idle sessions to be closed.",
            self.sessions.len(),
            self.config.max_sessions
        )
    }

    /// Start a session; errors are messages for the agent.
    pub async fn start(&self, caller: &Caller, req: StartRequest) -> Result<StartReport, String> {
        let _slot = self.admit(caller).await?;
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
        let detected = lang
            .detect()
            .await
            .ok_or_else(|| format!("{} is not installed", lang.id()))?
            .clone();
        let exe_path = lang.session_exe(&detected).map_err(|e| {
            format!(
                "{} sessions cannot start on this host: {e} (run-code still works). Session languages: {}",
                lang.id(),
                self.registry.session_ids().join(", ")
            )
        })?;
        if !self.sandbox.can_run(&exe_path) {
            return Err(self.sandbox.cannot_run_reason(&exe_path));
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
        let out = dir.path().join("out");
        // Handles on the session's own directories, opened with the server's rights: every
        // directory on the way is the server's, so nothing user code made is followed.
        let own = |p: &std::path::Path| {
            hostfs::open_dir_path(p).map_err(|e| format!("cannot open the session directory: {e}"))
        };
        let (work_fd, out_fd) = (own(&work)?, own(&out)?);
        // The caller's cwd and files, with the session's rights (never the server's).
        let prepared = hostfs::as_uid(uid, {
            let policy = self.cwd_policy.clone();
            let (cwd, files, local) = (req.cwd.clone(), req.files, caller.is_local());
            move || prepare_dirs(&policy, uid, cwd, work_fd, out_fd, files, local)
        })
        .await??;
        let Prepared {
            caller_cwd,
            cwd_fd,
            out_fd,
            writable,
            brought,
        } = prepared;
        let cwd = caller_cwd.clone().unwrap_or_else(|| work.clone());
        // Until the session is up, a failure takes the files brought in away again.
        let undo = |e: String| {
            let (fd, names) = (cwd_fd.clone(), brought.clone());
            async move {
                if !names.names.is_empty() {
                    let _ = hostfs::as_uid(uid, move || names.remove(fd.as_fd())).await;
                }
                e
            }
        };
        let nonce = uuid::Uuid::new_v4().simple().to_string()[..16].to_string();
        let ctl_s = ctl.display().to_string();
        let work_s = work.display().to_string();
        // The bootstrap and init lines are code: their placeholders become literals.
        let values = spec.values(
            &nonce,
            &ctl,
            &work,
            &out,
            &cwd,
            u64::from(self.config.max_images),
        );
        let boot_path = ctl.join(&spec.bootstrap.file);
        if let Err(e) = crate::workspace::write_ctl(&boot_path, values.expand(&spec.bootstrap.text))
        {
            return Err(undo(format!("cannot write the bootstrap: {e}")).await);
        }
        let init = spec.init.iter().map(|l| values.expand(l)).collect();
        let exe = exe_path.display().to_string();
        let boot_s = boot_path.display().to_string();
        let cache_dir = crate::workspace::cache_dir(&dir, lang.id(), uid);
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
        // The interpreter's own directory first, so that the tools it runs (a compiler, a
        // package manager) come from the same installation.
        let mut bins: Vec<&std::path::Path> = Vec::new();
        for bin in [exe_path.parent(), detected.exe.parent()]
            .into_iter()
            .flatten()
        {
            if !bins.contains(&bin) {
                bins.push(bin);
            }
        }
        if !bins.is_empty() {
            let mut path = String::new();
            for bin in bins {
                path.push_str(&bin.display().to_string());
                path.push(':');
            }
            path.push_str(&cenv::server_path());
            cenv::set(&mut env, "PATH", path);
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
        let mut rw = vec![work.clone(), out.clone(), cache_dir];
        rw.extend(caller_cwd);
        let mut ro = vec![ctl.clone()];
        for exe in [&exe_path, &detected.exe] {
            for d in self.sandbox.interpreter_dirs(exe) {
                if !ro.contains(&d) {
                    ro.push(d);
                }
            }
        }
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
            init,
            spec: spec.clone(),
            output_cap: self.config.output_cap,
        });
        let interp = match Interp::start(launch, Duration::from_millis(spec.start_timeout_ms)).await
        {
            Ok(i) => i,
            Err(e) => return Err(undo(e).await),
        };
        // The baseline for the first evaluation's file changes: taken once the interpreter
        // is up, so what it wrote while starting is not taken for the code's doing.
        let mut notes = Vec::new();
        if !writable {
            notes.push(read_only_note(&cwd, uid));
        }
        let baseline = self.baseline(uid, &cwd_fd).await;
        if baseline.is_none() && self.config.max_tracked_files > 0 {
            notes.push(self.untracked_note());
        }
        let idle_timeout = self.config.idle_timeout(req.idle_timeout_s);
        let pid = interp.pid;
        let helper = interp.helper();
        let now = SystemTime::now();
        let session = Arc::new(Session {
            id: id.clone(),
            owner: caller.clone(),
            lang: lang.clone(),
            version: detected.version.clone(),
            cwd: cwd.clone(),
            cwd_fd,
            uid,
            created_at: now,
            idle_timeout,
            _dir: dir,
            out_fd,
            files: Mutex::new(baseline),
            interp: tokio::sync::Mutex::new(Some(interp)),
            pid: AtomicU64::new(pid as u64),
            helper: AtomicU64::new(helper as u64),
            evals: AtomicU64::new(0),
            last_used: Mutex::new((now, Instant::now())),
            busy: Mutex::new(None),
            gone: Mutex::new(None),
            awaiting: Mutex::new(None),
            interrupt: Mutex::new(None),
            _lease: lease,
        });
        self.sessions.insert(id.clone(), session);
        Ok(StartReport {
            session_id: id,
            language: lang.id().to_string(),
            version: detected.version,
            pid,
            cwd: cwd.display().to_string(),
            cwd_writable: writable,
            idle_timeout_s: idle_timeout.as_secs(),
            sandbox: self.sandbox.level,
            files: brought.names.clone(),
            notes,
        })
    }

    /// A snapshot of `cwd` to compare the next evaluation against; None when the directory
    /// has more entries than tracking looks at (or tracking is off).
    async fn baseline(&self, uid: Option<u32>, cwd: &Arc<OwnedFd>) -> Option<Snapshot> {
        let max = self.config.max_tracked_files;
        if max == 0 {
            return None;
        }
        let cwd = cwd.clone();
        let skip = self.skip_dirs();
        hostfs::as_uid(uid, move || files::snapshot(cwd.as_fd(), max, &skip))
            .await
            .ok()
            .filter(|s| s.complete)
    }

    /// Directories a session's listing never enters and a read never goes through: the
    /// server's workspace (other sessions' directories), should a caller's cwd contain it.
    fn skip_dirs(&self) -> Vec<DirId> {
        self.workspace.root_id().into_iter().collect()
    }

    fn untracked_note(&self) -> String {
        format!(
            "file changes are not tracked in this session: its directory has more than {} \
files and folders (--max-tracked-files)",
            self.config.max_tracked_files
        )
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
        match self.ended.get(id).map(|g| g.clone()) {
            Some((owner, how)) if owner == *caller => Err(how.message(id)),
            _ => Err(unknown()),
        }
    }

    fn busy_message(&self, session: &Session) -> String {
        let what = lock(&session.busy)
            .as_ref()
            .map(|b| {
                format!(
                    "evaluation {} (running for {:.1} s)",
                    b.eval_id,
                    b.since.elapsed().as_secs_f64()
                )
            })
            .unwrap_or_else(|| "another call".into());
        format!(
            "session {} is busy with {what}. Wait for it to finish, stop it with session_interrupt, \
or use another session.",
            session.id
        )
    }

    /// Evaluate code in a session.
    pub async fn eval(
        &self,
        caller: &Caller,
        id: &str,
        code: &str,
        timeout: Duration,
        cancel: &CancellationToken,
        progress: Option<&Progress>,
    ) -> Result<EvalReport, String> {
        let session = self.lookup(caller, id)?;
        if let Some(a) = lock(&session.awaiting).as_ref() {
            return Err(format!(
                "session {id} is waiting for input to evaluation {}{}. Answer it with session_input, \
or stop it with session_interrupt, before evaluating more code.",
                a.eval_id,
                if a.prompt.is_empty() {
                    String::new()
                } else {
                    format!(" (it asked: {:?})", a.prompt)
                }
            ));
        }
        let Ok(mut guard) = session.interp.try_lock() else {
            return Err(self.busy_message(&session));
        };
        if guard.is_none() {
            return Err(self.gone_message(&session));
        }
        let eval_id = session.evals.fetch_add(1, Ordering::Relaxed) + 1;
        let token = self.begin(&session, eval_id, cancel);
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + timeout;
        let outcome = match guard.as_mut() {
            Some(interp) => interp.eval(eval_id, code, deadline, &token, progress).await,
            None => return Err(self.gone_message(&session)),
        };
        let mut report = self.conclude(&session, &mut guard, eval_id, started, outcome);
        // Still under the interpreter's lock: the next evaluation's files and images must
        // not be taken for this one's.
        self.collect(&session, &mut report).await;
        release(&session);
        Ok(report)
    }

    /// Answer an evaluation that is waiting for input.
    pub async fn input(
        &self,
        caller: &Caller,
        id: &str,
        text: &str,
        timeout: Duration,
        cancel: &CancellationToken,
        progress: Option<&Progress>,
    ) -> Result<EvalReport, String> {
        let session = self.lookup(caller, id)?;
        if let Some(long) = text.split('\n').find(|l| l.len() > 4000) {
            return Err(format!(
                "a line of {} bytes is too long for a terminal (4000 at most); write the data to a \
file in the session's directory and read it from there instead",
                long.len()
            ));
        }
        let Ok(mut guard) = session.interp.try_lock() else {
            return Err(self.busy_message(&session));
        };
        let Some(eval_id) = lock(&session.awaiting).as_ref().map(|a| a.eval_id) else {
            return Err(format!(
                "session {id} is not waiting for input. Use session_eval to run code."
            ));
        };
        *lock(&session.awaiting) = None;
        let token = self.begin(&session, eval_id, cancel);
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + timeout;
        let outcome = match guard.as_mut() {
            Some(interp) => interp.resume(text, deadline, &token, progress).await,
            None => return Err(self.gone_message(&session)),
        };
        let mut report = self.conclude(&session, &mut guard, eval_id, started, outcome);
        self.collect(&session, &mut report).await;
        release(&session);
        Ok(report)
    }

    /// Interrupt the evaluation that is waiting for input, or the one running in another call.
    pub async fn interrupt(&self, caller: &Caller, id: &str) -> Result<InterruptReport, String> {
        let session = self.lookup(caller, id)?;
        let mut report = InterruptReport {
            session_id: id.to_string(),
            interrupted: false,
            eval_id: None,
            result: None,
        };
        match session.interp.try_lock() {
            Ok(mut guard) => {
                let Some(eval_id) = lock(&session.awaiting).take().map(|a| a.eval_id) else {
                    return Ok(report); // nothing running
                };
                let token = self.begin(&session, eval_id, &CancellationToken::new());
                drop(token);
                let started = Instant::now();
                let outcome = match guard.as_mut() {
                    Some(interp) => interp.interrupt_paused().await,
                    None => return Err(self.gone_message(&session)),
                };
                report.interrupted = true;
                report.eval_id = Some(eval_id);
                let mut result = self.conclude(&session, &mut guard, eval_id, started, outcome);
                self.collect(&session, &mut result).await;
                release(&session);
                report.result = Some(result);
            }
            Err(_) => {
                // An evaluation is running in another call: make it interrupt itself.
                if let Some(t) = lock(&session.interrupt).as_ref() {
                    t.cancel();
                    report.interrupted = true;
                    report.eval_id = lock(&session.busy).as_ref().map(|b| b.eval_id);
                }
            }
        }
        Ok(report)
    }

    /// Mark the session busy with `eval_id`; returns the token that interrupts it.
    fn begin(
        &self,
        session: &Session,
        eval_id: u64,
        cancel: &CancellationToken,
    ) -> CancellationToken {
        let token = cancel.child_token();
        *lock(&session.interrupt) = Some(token.clone());
        *lock(&session.busy) = Some(Busy {
            eval_id,
            since: Instant::now(),
        });
        session.touch();
        token
    }

    /// Turn an outcome into the report, and record what it means for the session.
    fn conclude(
        &self,
        session: &Session,
        guard: &mut Option<Interp>,
        eval_id: u64,
        started: Instant,
        outcome: Outcome,
    ) -> EvalReport {
        let mut report = EvalReport::empty(&session.id, eval_id);
        report.output = outcome.output.text;
        report.truncated = outcome.output.omitted > 0;
        report.duration_ms = started.elapsed().as_millis() as u64;
        let error_pattern = session.lang.error_pattern();
        match outcome.ending {
            Ending::Done(marker) => apply_marker(&mut report, &marker, error_pattern),
            Ending::TimedOut { marker } => {
                report.status = EvalStatus::Timeout;
                // The interrupted code may still have drawn figures before its marker.
                if let Some(m) = marker {
                    (report.pending_images, report.images_omitted) = marker_images(&m);
                }
            }
            Ending::Cancelled => {
                report.status = EvalStatus::Error;
                report.error = Some(ErrorInfo {
                    kind: "Interrupted".into(),
                    message: "interrupted on request; the session keeps its state".into(),
                });
            }
            Ending::Restarted { reason } => {
                report.status = EvalStatus::Timeout;
                report.restarted = Some(true);
                tracing::warn!(session = %session.id, %reason, "interpreter restarted");
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
            Ending::AwaitingInput => {
                report.status = EvalStatus::AwaitingInput;
                let prompt = report
                    .output
                    .rsplit('\n')
                    .next()
                    .unwrap_or("")
                    .chars()
                    .take(200)
                    .collect();
                *lock(&session.awaiting) = Some(Awaiting { eval_id, prompt });
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
                    session,
                    Gone::Exited {
                        code: report.exit_code,
                        signal: report.signal.clone(),
                    },
                );
            }
        }
        if let Some(i) = guard.as_ref() {
            session.pid.store(i.pid as u64, Ordering::Relaxed);
            session.helper.store(i.helper() as u64, Ordering::Relaxed);
        }
        // Nothing left to interrupt; the session stays busy until the report is complete.
        *lock(&session.interrupt) = None;
        report
    }

    /// Attach what an evaluation left behind: the images its end marker announced (read
    /// from the control directory, within the caps) and the files it created, changed or
    /// deleted. The file work runs off the async workers.
    async fn collect(&self, session: &Session, report: &mut EvalReport) {
        let refs = std::mem::take(&mut report.pending_images);
        let old = lock(&session.files).take();
        let was_tracked = old.is_some();
        if refs.is_empty() && old.is_none() {
            return;
        }
        let out = session.out_fd.clone();
        let cwd = session.cwd_fd.clone();
        let skip = self.skip_dirs();
        let id = session.id.clone();
        let max_images = self.config.max_images as usize;
        let max_bytes = self.config.max_image_bytes;
        let max_entries = self.config.max_tracked_files;
        // As the session's uid: both directories are the session code's to write.
        let job = hostfs::as_uid(session.uid, move || {
            let images = read_images(out.as_fd(), refs, max_images, max_bytes);
            let tracked = old.map(|old| {
                let new = files::snapshot(cwd.as_fd(), max_entries, &skip);
                let changes = new.complete.then(|| files::diff(&id, &old, &new));
                (new, changes)
            });
            (images, tracked)
        });
        let Ok((images, tracked)) = job.await else {
            tracing::warn!(session = %session.id, "collecting files and images failed");
            return;
        };
        report.images_omitted += images.over_count;
        for (info, data) in images.images {
            report.images.push(info);
            report.attachments.push(data);
        }
        if report.images_omitted > 0 {
            report.notes.push(format!(
                "{} more figure(s) not returned: at most {} images per evaluation \
(--max-images); close figures you are done with, or save them with savefig and read them as \
resources",
                report.images_omitted, self.config.max_images
            ));
        }
        for (name, size) in &images.too_big {
            report.images_omitted += 1;
            report.notes.push(format!(
                "{name} not returned: {} is over the {} cap per image (--max-image-bytes); \
draw it smaller (figsize, dpi) or save it with savefig and read it as a resource",
                files::human_size(*size),
                files::human_size(self.config.max_image_bytes)
            ));
        }
        match tracked {
            Some((new, Some(mut changes))) => {
                const LISTED: usize = 100;
                if changes.len() > LISTED {
                    report.files_omitted = (changes.len() - LISTED) as u64;
                    changes.truncate(LISTED);
                }
                report.files = changes;
                *lock(&session.files) = Some(new);
            }
            Some((_, None)) if was_tracked => {
                // The directory outgrew the walk: stop paying for it at every evaluation.
                report.notes.push(format!(
                    "file changes are no longer tracked in this session: its directory now has \
more than {} files and folders (--max-tracked-files)",
                    self.config.max_tracked_files
                ));
            }
            _ => {}
        }
    }

    /// The files of the caller's sessions (session id, path, size), for `resources/list`;
    /// each session's walk is bounded like change tracking's.
    pub async fn list_files(&self, caller: &Caller) -> Vec<(String, String, u64)> {
        let mut mine: Vec<(SystemTime, String, Arc<OwnedFd>, Option<u32>)> = self
            .sessions
            .iter()
            .filter(|s| s.owner == *caller)
            .map(|s| (s.created_at, s.id.clone(), s.cwd_fd.clone(), s.uid))
            .collect();
        mine.sort_by_key(|m| m.0);
        let max = self.config.max_tracked_files.max(1);
        let mut out = Vec::new();
        // Each session's directory as its own uid.
        for (_, id, cwd, uid) in mine {
            let skip = self.skip_dirs();
            let snap = hostfs::as_uid(uid, move || files::snapshot(cwd.as_fd(), max, &skip))
                .await
                .unwrap_or_default();
            for (path, stamp) in snap.files {
                out.push((id.clone(), path, stamp.size));
            }
        }
        out
    }

    /// Read a file of one of the caller's sessions, by path relative to its directory,
    /// following no symbolic link, within the resource size cap.
    pub async fn read_file(
        &self,
        caller: &Caller,
        id: &str,
        path: &str,
    ) -> Result<FileData, FileError> {
        let parts: Vec<String> = crate::workspace::check_relative(path)
            .map_err(FileError::Invalid)?
            .into_iter()
            .map(str::to_string)
            .collect();
        let session = self.lookup(caller, id).map_err(FileError::NotFound)?;
        let cwd = session.cwd_fd.clone();
        let walk = hostfs::Walk {
            same_mount: true,
            forbidden: self.skip_dirs(),
            into_workspaces: false,
        };
        let cap = self.config.max_resource_bytes;
        let shown = path.to_string();
        let sid = id.to_string();
        // As the session's uid, beneath its directory, on its filesystem, through no link.
        hostfs::as_uid(session.uid, move || {
            let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
            let file = hostfs::open_beneath(cwd.as_fd(), &refs, &walk).map_err(|e| {
                match e.raw_os_error() {
                    Some(libc::ELOOP) | Some(libc::ENOTDIR) | Some(libc::EXDEV) => {
                        FileError::Invalid(format!(
                            "{shown:?} in session {sid} goes through a symbolic link or into \
another filesystem; links and mount points are not followed"
                        ))
                    }
                    Some(libc::ENOENT) => FileError::NotFound(format!(
                        "session {sid} has no file {shown:?}; resources/list shows its files"
                    )),
                    _ => FileError::Invalid(format!("{shown:?} in session {sid}: {e}")),
                }
            })?;
            match crate::workspace::read_capped(file, cap) {
                Ok(Ok(bytes)) => Ok(FileData {
                    bytes,
                    mime: files::mime_for(&shown),
                }),
                Ok(Err(size)) => Err(FileError::TooLarge(format!(
                    "{shown:?} is {} and resources/read returns at most {} \
(--max-resource-bytes); read the part you need in the session (head, a slice, a summary)",
                    files::human_size(size),
                    files::human_size(cap)
                ))),
                Err(e) => Err(FileError::Invalid(format!("{shown:?}: {e}"))),
            }
        })
        .await
        .unwrap_or_else(|e| Err(FileError::Invalid(format!("reading failed: {e}"))))
    }

    fn gone_message(&self, session: &Session) -> String {
        lock(&session.gone)
            .clone()
            .unwrap_or(Gone::Closed)
            .message(&session.id)
    }

    /// Record that a session is gone (the first reason wins) and drop it from the table.
    fn mark_gone(&self, session: &Session, how: Gone) -> bool {
        {
            let mut g = lock(&session.gone);
            if g.is_some() {
                return false;
            }
            *g = Some(how.clone());
        }
        self.sessions.remove(&session.id);
        // Bounded memory of ended sessions.
        if self.ended.len() >= 4096
            && let Some(k) = self.ended.iter().next().map(|e| e.key().clone())
        {
            self.ended.remove(&k);
        }
        self.ended
            .insert(session.id.clone(), (session.owner.clone(), how));
        true
    }

    /// End a session for `how`: forget it and kill its tree.
    async fn end(&self, session: &Session, how: Gone) -> Option<i32> {
        if !self.mark_gone(session, how) {
            return None;
        }
        kill_session(session).await
    }

    /// Close a session: kill its interpreter's tree and remove its directory.
    pub async fn close(&self, caller: &Caller, id: &str) -> Result<CloseReport, String> {
        let session = self.lookup(caller, id)?;
        let exit_code = self.end(&session, Gone::Closed).await;
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
        let mut tasks = Vec::new();
        for s in all {
            if self.mark_gone(&s, Gone::Closed) {
                tasks.push(tokio::spawn(async move {
                    kill_session(&s).await;
                }));
            }
        }
        for t in tasks {
            let _ = t.await;
        }
    }
}

/// Kill a session's interpreter tree, even while an evaluation holds it.
async fn kill_session(session: &Session) -> Option<i32> {
    let mut guard = match session.interp.try_lock() {
        Ok(g) => g,
        Err(_) => {
            // The evaluation in flight returns promptly once its tree is gone. The helper's
            // pid is kept for this: the interpreter's parent could be the server itself.
            let helper = session.helper.load(Ordering::Relaxed);
            crate::exec::spawn::terminate_helper(u32::try_from(helper).unwrap_or(0));
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

fn describe_exit(code: Option<i32>, signal: Option<&str>) -> String {
    match (code, signal) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by {s}"),
        _ => "status unknown".into(),
    }
}

/// A session file read for `resources/read`.
pub struct FileData {
    pub bytes: Vec<u8>,
    /// What its name suggests.
    pub mime: Option<&'static str>,
}

/// Why a session file cannot be read.
#[derive(Debug)]
pub enum FileError {
    /// No such session (of this caller) or file.
    NotFound(String),
    /// A path that is refused (outside the directory, through a link, not a file).
    Invalid(String),
    TooLarge(String),
}

#[derive(Default)]
struct ImagesRead {
    images: Vec<(ImageInfo, Attachment)>,
    /// Left out over the count cap.
    over_count: u64,
    /// Left out over the size cap: (name, bytes).
    too_big: Vec<(String, u64)>,
}

/// Read the images an end marker announced from the session's `out/` directory, within
/// the caps, removing each file once read. Code in the session could forge a marker, so a
/// name is only ever a plain file name in that directory, opened without following links.
fn read_images(
    out_dir: std::os::fd::BorrowedFd<'_>,
    refs: Vec<ImageRef>,
    max_images: usize,
    max_bytes: u64,
) -> ImagesRead {
    let mut out = ImagesRead::default();
    for (k, r) in refs.into_iter().enumerate() {
        let file = r.file.as_str();
        if file.is_empty() || file.contains('/') || file.starts_with('.') {
            tracing::warn!(file, "ignored an image name that is not a plain file name");
            continue;
        }
        let name = match r.figure {
            Some(n) => format!("figure-{n}.png"),
            None => format!("image-{}.png", k + 1),
        };
        if out.images.len() >= max_images {
            out.over_count += 1;
        } else {
            let read = hostfs::open_beneath(out_dir, &[file], &hostfs::Walk::default())
                .and_then(|f| crate::workspace::read_capped(f, max_bytes));
            match read {
                Ok(Ok(data)) => match png_size(&data) {
                    Some((width, height)) => out.images.push((
                        ImageInfo {
                            name,
                            mime_type: "image/png".into(),
                            bytes: data.len() as u64,
                            width,
                            height,
                        },
                        Attachment {
                            mime_type: "image/png".into(),
                            data,
                        },
                    )),
                    None => tracing::warn!(file, "ignored an image that is not a PNG"),
                },
                Ok(Err(size)) => out.too_big.push((name, size)),
                Err(e) => tracing::warn!(file, error = %e, "cannot read an image"),
            }
        }
        let _ = hostfs::remove_beneath(out_dir, &[file], false);
    }
    out
}

/// Width and height of a PNG, from its signature and IHDR chunk.
fn png_size(data: &[u8]) -> Option<(u32, u32)> {
    const SIG: &[u8] = b"\x89PNG\r\n\x1a\n";
    if data.len() < 24 || &data[..8] != SIG || &data[12..16] != b"IHDR" {
        return None;
    }
    let w = u32::from_be_bytes(data[16..20].try_into().ok()?);
    let h = u32::from_be_bytes(data[20..24].try_into().ok()?);
    Some((w, h))
}

/// A session's directories once the caller's cwd and files are dealt with.
struct Prepared {
    /// The caller's cwd, canonical (None: the private `work/`).
    caller_cwd: Option<PathBuf>,
    cwd_fd: Arc<OwnedFd>,
    out_fd: Arc<OwnedFd>,
    /// Whether the session's uid may write in its cwd.
    writable: bool,
    brought: Arc<files::Written>,
}

/// Decide the caller's cwd (else the session's `work/`) and bring the files in: run as the
/// session's uid (through [`hostfs::as_uid`]).
fn prepare_dirs(
    policy: &CwdPolicy,
    uid: Option<u32>,
    cwd: Option<PathBuf>,
    work_fd: OwnedFd,
    out_fd: OwnedFd,
    in_files: Vec<InFile>,
    local: bool,
) -> Result<Prepared, String> {
    let (caller_cwd, cwd_fd, writable) = match cwd {
        Some(p) => {
            let c = hostfs::check_cwd(policy, &p, uid)?;
            (Some(c.path), c.dir, c.writable)
        }
        None => (None, work_fd, true),
    };
    let brought = if in_files.is_empty() {
        files::Written::default()
    } else {
        files::bring_in(in_files, cwd_fd.as_fd(), local, &hostfs::user_name(uid))?
    };
    Ok(Prepared {
        caller_cwd,
        cwd_fd: Arc::new(cwd_fd),
        out_fd: Arc::new(out_fd),
        writable,
        brought: Arc::new(brought),
    })
}

/// What the start result says about a cwd the session may not write.
fn read_only_note(cwd: &std::path::Path, uid: Option<u32>) -> String {
    let who = uid.map_or("the server's user".to_string(), |u| format!("uid {u}"));
    format!(
        "cwd {} is read-only for this session: its code runs as {who}, which may not write \
there; it can read the files. To let sessions write there, give the directory write permission \
for that user (for example an ACL, setfacl -m u:{}:rwx, or mode 1777), or leave cwd out to work \
in a private directory",
        cwd.display(),
        uid.map_or("USER".to_string(), |u| u.to_string()),
    )
}
