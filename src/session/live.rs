//! One session: its interpreter, its directories, its history, and its [`Phase`] (idle,
//! running an evaluation, waiting for input, ended), one state machine under one lock; and
//! [`End`], how a session ended.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio_util::sync::CancellationToken;

use super::history::Record;
use super::interp::Interp;
use super::journal::Writer;
use super::report::SessionInfo;
use super::watch::Tracked;
use crate::error::{ErrorKind, ToolError};
use crate::identity::Caller;
use crate::lang::Language;
use crate::sandbox::Lease;
use crate::share::Share;
use crate::workspace::PrivateDir;

/// Where a session is in its life. Calls move it; the table reads it.
#[derive(Debug, Clone)]
pub(super) enum Phase {
    Idle,
    /// A call runs evaluation `eval` (since `since`); `cancel` interrupts it until its
    /// outcome is known (then None: the call is still collecting its report).
    Busy {
        eval: u64,
        since: Instant,
        cancel: Option<CancellationToken>,
    },
    /// Evaluation `eval` is paused, its program waiting for input; `prompt` is the last
    /// line it printed.
    AwaitingInput {
        eval: u64,
        prompt: String,
    },
    /// It ended (the first reason wins): nothing runs in it any more.
    Ended(End),
}

/// How a session ended, kept so later calls can say so.
#[derive(Debug, Clone)]
pub(super) enum End {
    Closed,
    Exited {
        code: Option<i32>,
        signal: Option<String>,
        /// The code replaced the interpreter with this program (`exec`).
        replaced_by: Option<String>,
    },
    Reaped {
        at: SystemTime,
        idle: Duration,
        /// The evaluation that was waiting for input then, and what it asked.
        waiting: Option<(u64, String)>,
    },
    Evicted {
        at: SystemTime,
        idle: Duration,
        waiting: Option<(u64, String)>,
    },
    /// Its node lost its cluster lease: another node may hold it now (from its journal).
    HandedOver,
}

impl End {
    /// One word for lists: `closed`, `exited`, `reaped`, `evicted`, `handed_over`.
    pub(super) fn reason(&self) -> &'static str {
        match self {
            End::Closed => "closed",
            End::Exited { .. } => "exited",
            End::Reaped { .. } => "reaped",
            End::Evicted { .. } => "evicted",
            End::HandedOver => "handed_over",
        }
    }

    pub(super) fn message(&self, id: &str) -> String {
        match self {
            End::Closed => format!("session {id} was closed. Start a new one with session_start."),
            End::Exited {
                replaced_by: Some(program),
                ..
            } => format!(
                "session {id} ended: a cell replaced its interpreter with another program \
({program:?}, through exec), which replbox cannot drive. Start a new one with session_start."
            ),
            End::Exited { code, signal, .. } => format!(
                "session {id} ended: its interpreter exited ({}). Start a new one with session_start.",
                describe_exit(*code, signal.as_deref())
            ),
            End::Reaped { at, idle, waiting } => format!(
                "session {id} was closed for idleness at {} (unix time) after {} s without use{}. \
Start a new one with session_start (and pass idle_timeout_s to keep it longer).",
                unix(*at),
                idle.as_secs(),
                while_waiting(waiting.as_ref())
            ),
            End::Evicted { at, idle, waiting } => format!(
                "session {id} was closed at {} (unix time) after {} s without use{}, to make \
room under the session limit. Start a new one with session_start.",
                unix(*at),
                idle.as_secs(),
                while_waiting(waiting.as_ref())
            ),
            End::HandedOver => format!(
                "this server lost contact with its cluster registry, so session {id} was stopped \
here (its journal is kept; the cell in flight, if any, is not in it). Call again in a few \
seconds: it is restored from its journal."
            ),
        }
    }
}

pub struct Session {
    pub id: String,
    pub owner: Caller,
    pub lang: Arc<Language>,
    pub cwd: PathBuf,
    /// A handle on `cwd`: its files are listed and read beneath it, as `uid`.
    pub(super) cwd_fd: Arc<OwnedFd>,
    /// The uid the interpreter runs as (None: the server's own, when not root).
    pub(super) uid: Option<u32>,
    pub created_at: SystemTime,
    pub idle_timeout: Duration,
    /// The session's private directory and uid, released by [`dispose`](Self::dispose)
    /// or when dropped, or kept a while after it ended
    /// ([`take_footprint`](Self::take_footprint)).
    pub(super) footprint: Mutex<Option<Footprint>>,
    /// A handle on the directory where the interpreter leaves what it hands back (the
    /// figures' PNG files).
    pub(super) out_fd: Arc<OwnedFd>,
    /// The files of `cwd` as the previous evaluation left them; None when change tracking
    /// is off (the directory is too big to track at every evaluation).
    pub(super) files: Mutex<Option<Tracked>>,
    pub(super) interp: tokio::sync::Mutex<Option<Interp>>,
    pub(super) pid: AtomicU64,
    /// The helper the interpreter runs under: what a close signals while an evaluation
    /// holds the interpreter.
    pub(super) helper: AtomicU64,
    pub(super) evals: AtomicU64,
    pub(super) last_used: Mutex<(SystemTime, Instant)>,
    phase: Mutex<Phase>,
    /// What it leaves once it ended has been dealt with (by one call only).
    retired: AtomicBool,
    /// The cells it ran and the evaluation in flight (session_history, session_export);
    /// shared with what is kept of it once it ended.
    pub(super) record: Arc<Mutex<Record>>,
    /// Its journal, with `--state-dir`.
    pub(super) journal: Option<Arc<Writer>>,
    /// The owner's share of sessions and runs it holds while it is open.
    pub(super) share: Mutex<Option<Share>>,
    /// Code mode: its channel to the MCP tools it may call.
    pub(super) tools: Option<Arc<crate::upstream::Channel>>,
    /// Its package layer (Python outside a caller's venv, packages on).
    pub(super) packages: Option<Arc<crate::packages::SessionPackages>>,
    /// The evaluation whose figures and displays were named last, and the next number:
    /// the parts of an evaluation paused for input go on numbering.
    pub(super) shown: Mutex<(u64, u64)>,
}

/// What a session holds on the host besides its processes: its private directory (work,
/// control, out) and the uid it runs as. The directory goes first, then the uid (returned
/// after a sweep when its tree was not confirmed gone).
pub(super) struct Footprint {
    pub dir: PrivateDir,
    pub lease: Option<Lease>,
}

impl Footprint {
    /// Remove the directory, then return the uid (on the blocking pool).
    pub fn release(self) -> Option<tokio::task::JoinHandle<()>> {
        self.dir.remove_then(self.lease)
    }
}

/// Lock a std mutex, recovering from poisoning (a panic elsewhere must not wedge sessions).
pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drop for Session {
    fn drop(&mut self) {
        self.release();
    }
}

/// What a session is made of, before it enters the table.
pub(super) struct Parts {
    pub id: String,
    pub owner: Caller,
    pub lang: Arc<Language>,
    pub cwd: PathBuf,
    pub cwd_fd: Arc<OwnedFd>,
    pub out_fd: Arc<OwnedFd>,
    pub idle_timeout: Duration,
    pub footprint: Footprint,
    pub baseline: Option<Tracked>,
    pub interp: Interp,
    pub record: Record,
    pub journal: Option<Arc<Writer>>,
    pub share: Option<Share>,
    pub tools: Option<Arc<crate::upstream::Channel>>,
    pub packages: Option<Arc<crate::packages::SessionPackages>>,
}

impl Session {
    pub(super) fn new(p: Parts) -> Self {
        let now = SystemTime::now();
        Session {
            uid: p.footprint.lease.as_ref().map(|l| l.uid),
            id: p.id,
            owner: p.owner,
            lang: p.lang,
            cwd: p.cwd,
            cwd_fd: p.cwd_fd,
            created_at: now,
            idle_timeout: p.idle_timeout,
            footprint: Mutex::new(Some(p.footprint)),
            out_fd: p.out_fd,
            files: Mutex::new(p.baseline),
            pid: AtomicU64::new(u64::from(p.interp.pid)),
            helper: AtomicU64::new(u64::from(p.interp.helper())),
            interp: tokio::sync::Mutex::new(Some(p.interp)),
            evals: AtomicU64::new(0),
            last_used: Mutex::new((now, Instant::now())),
            phase: Mutex::new(Phase::Idle),
            retired: AtomicBool::new(false),
            record: Arc::new(Mutex::new(p.record)),
            journal: p.journal,
            share: Mutex::new(p.share),
            tools: p.tools,
            packages: p.packages,
            shown: Mutex::new((u64::MAX, 1)),
        }
    }

    /// Its phase now.
    pub(super) fn phase(&self) -> Phase {
        lock(&self.phase).clone()
    }

    /// The evaluation paused waiting for input, and the prompt it printed, if one is.
    pub(super) fn waiting_for_input(&self) -> Option<(u64, String)> {
        match &*lock(&self.phase) {
            Phase::AwaitingInput { eval, prompt } => Some((*eval, prompt.clone())),
            _ => None,
        }
    }

    /// A call starts evaluation `eval` (from idle, or resuming one paused for input):
    /// the token that interrupts it. None when the session has ended.
    pub(super) fn begin(&self, eval: u64, cancel: &CancellationToken) -> Option<CancellationToken> {
        let token = cancel.child_token();
        {
            let mut p = lock(&self.phase);
            if matches!(*p, Phase::Ended(_)) {
                return None;
            }
            *p = Phase::Busy {
                eval,
                since: Instant::now(),
                cancel: Some(token.clone()),
            };
        }
        self.touch();
        Some(token)
    }

    /// Resume the evaluation paused for input (to answer or interrupt it): its number and
    /// the token that interrupts it. None when no evaluation is paused.
    pub(super) fn resume(&self, cancel: &CancellationToken) -> Option<(u64, CancellationToken)> {
        let token = cancel.child_token();
        let mut p = lock(&self.phase);
        let Phase::AwaitingInput { eval, .. } = *p else {
            return None;
        };
        *p = Phase::Busy {
            eval,
            since: Instant::now(),
            cancel: Some(token.clone()),
        };
        drop(p);
        self.touch();
        Some((eval, token))
    }

    /// The outcome of the evaluation in flight is known: nothing is left to interrupt (the
    /// session stays busy until the call's report is complete).
    pub(super) fn outcome_known(&self) {
        if let Phase::Busy { cancel, .. } = &mut *lock(&self.phase) {
            *cancel = None;
        }
    }

    /// The call that made the session busy is over: idle, or paused waiting for input.
    /// Called once its report is complete, with the interpreter's lock still held: a client
    /// that sees the session free in session_list must not then be refused by
    /// session_eval because the call is still collecting files.
    pub(super) fn finish(&self, awaiting: Option<(u64, String)>) {
        {
            let mut p = lock(&self.phase);
            if matches!(*p, Phase::Busy { .. }) {
                *p = match awaiting {
                    Some((eval, prompt)) => Phase::AwaitingInput { eval, prompt },
                    None => Phase::Idle,
                };
            }
        }
        self.touch();
    }

    /// Interrupt the evaluation another call runs: the one interrupted.
    pub(super) fn interrupt_running(&self) -> Option<u64> {
        match &*lock(&self.phase) {
            Phase::Busy {
                eval,
                cancel: Some(t),
                ..
            } => {
                t.cancel();
                Some(*eval)
            }
            _ => None,
        }
    }

    /// It ended for `how`, unless it had ended already (false).
    pub(super) fn end(&self, how: End) -> bool {
        let mut p = lock(&self.phase);
        if matches!(*p, Phase::Ended(_)) {
            return false;
        }
        *p = Phase::Ended(how);
        true
    }

    /// The error for a call on it once it has ended.
    pub(super) fn ended_error(&self) -> ToolError {
        let how = self.ended().unwrap_or(End::Closed);
        // Not ended for its owner: served again once adopted, so a retry is the answer.
        let kind = match how {
            End::HandedOver => ErrorKind::Unavailable,
            _ => ErrorKind::EndedSession,
        };
        ToolError::new(kind, how.message(&self.id)).session(&self.id)
    }

    /// Whether this caller is the one to deal with what it leaves now that it ended
    /// (true once only).
    pub(super) fn claim_retirement(&self) -> bool {
        !self.retired.swap(true, Ordering::AcqRel)
    }

    /// How it ended, if it has.
    pub(super) fn ended(&self) -> Option<End> {
        match &*lock(&self.phase) {
            Phase::Ended(how) => Some(how.clone()),
            _ => None,
        }
    }

    /// For a session that is gone: if this is its last reference, remove its directory and
    /// then return its uid, on the blocking pool, and wait for both; otherwise the last
    /// holder's drop does it.
    pub(super) async fn dispose(self: Arc<Self>) {
        let Ok(mut session) = Arc::try_unwrap(self) else {
            return;
        };
        if let Some(task) = session.release() {
            let _ = task.await;
        }
    }

    /// The interpreter first (its tree told to go, the lease marked for a sweep when it
    /// was still there), then the directory, then the uid.
    fn release(&mut self) -> Option<tokio::task::JoinHandle<()>> {
        drop(self.interp.get_mut().take());
        // The watches on its directory (an inotify instance of the server's few).
        if let Ok(files) = self.files.get_mut() {
            files.take();
        }
        let footprint = self
            .footprint
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        footprint.and_then(Footprint::release)
    }

    /// The directory and uid of a session whose interpreter is gone, to keep its files
    /// readable for a while; its uid is swept now if its tree was not confirmed gone, so
    /// nothing of the session runs while they are read (blocking: call it off the workers).
    pub(super) fn take_footprint(&self) -> Option<Footprint> {
        let footprint = lock(&self.footprint).take();
        if let Some(lease) = footprint.as_ref().and_then(|r| r.lease.as_ref()) {
            lease.sweep_now();
        }
        footprint
    }

    pub(super) fn touch(&self) {
        *lock(&self.last_used) = (SystemTime::now(), Instant::now());
    }

    pub(super) fn idle_for(&self) -> Duration {
        if matches!(*lock(&self.phase), Phase::Busy { .. }) {
            return Duration::ZERO;
        }
        lock(&self.last_used).1.elapsed()
    }

    pub(super) fn info(&self) -> SessionInfo {
        let (last_wall, _) = *lock(&self.last_used);
        let idle = self.idle_for();
        let phase = self.phase();
        SessionInfo {
            session_id: self.id.clone(),
            language: self.lang.id().to_string(),
            pid: self.pid.load(Ordering::Relaxed) as u32,
            cwd: self.cwd.display().to_string(),
            created_at: unix(self.created_at),
            last_used_at: unix(last_wall),
            idle_s: idle.as_secs(),
            evals: self.evals.load(Ordering::Relaxed),
            busy: matches!(phase, Phase::Busy { .. }),
            awaiting_input: matches!(phase, Phase::AwaitingInput { .. }),
            idle_timeout_s: self.idle_timeout.as_secs(),
            expires_in_s: self.idle_timeout.saturating_sub(idle).as_secs(),
        }
    }
}

pub(super) fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// What a session ended while waiting for input was waiting for (the answer never typed).
fn while_waiting(waiting: Option<&(u64, String)>) -> String {
    match waiting {
        None => String::new(),
        Some((eval, prompt)) if prompt.is_empty() => format!(
            " while evaluation {eval} was waiting for input (no answer was typed; it was not run \
to its end)"
        ),
        Some((eval, prompt)) => format!(
            " while evaluation {eval} was waiting for input (it asked: {prompt:?}; no answer was \
typed, and it was not run to its end)"
        ),
    }
}

fn describe_exit(code: Option<i32>, signal: Option<&str>) -> String {
    match (code, signal) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by {s}"),
        _ => "status unknown".into(),
    }
}
