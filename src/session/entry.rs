//! One entry of the session table: a running session, its bookkeeping (busy, waiting for
//! input, last use), and how it ended.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio_util::sync::CancellationToken;

use super::history::Record;
use super::interp::Interp;
use super::journal::Writer;
use super::report::SessionInfo;
use super::watch::Tracked;
use crate::identity::Caller;
use crate::lang::Language;
use crate::sandbox::Lease;
use crate::share::Share;
use crate::workspace::PrivateDir;

pub(super) struct Busy {
    pub(super) eval_id: u64,
    pub(super) since: Instant,
}

pub(super) struct Awaiting {
    pub(super) eval_id: u64,
    pub(super) prompt: String,
}

/// How a session ended, kept so later calls can say so.
#[derive(Debug, Clone)]
pub(super) enum Gone {
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
    /// One word for lists: `closed`, `exited`, `reaped`, `evicted`.
    pub(super) fn reason(&self) -> &'static str {
        match self {
            Gone::Closed => "closed",
            Gone::Exited { .. } => "exited",
            Gone::Reaped { .. } => "reaped",
            Gone::Evicted { .. } => "evicted",
        }
    }

    pub(super) fn message(&self, id: &str) -> String {
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
    pub cwd: PathBuf,
    /// A handle on `cwd`: its files are listed and read beneath it, as `uid`.
    pub(super) cwd_fd: Arc<OwnedFd>,
    /// The uid the interpreter runs as (None: the server's own, when not root).
    pub(super) uid: Option<u32>,
    pub created_at: SystemTime,
    pub idle_timeout: Duration,
    /// The session's private directory and uid, released by [`dispose`](Self::dispose)
    /// or when dropped, or kept a while after it ended ([`take_remains`](Self::take_remains)).
    pub(super) remains: Mutex<Option<Remains>>,
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
    pub(super) busy: Mutex<Option<Busy>>,
    pub(super) gone: Mutex<Option<Gone>>,
    pub(super) awaiting: Mutex<Option<Awaiting>>,
    /// Interrupts the evaluation in flight (session_interrupt from another call).
    pub(super) interrupt: Mutex<Option<CancellationToken>>,
    /// The cells it ran and the evaluation in flight (session_history, session_export);
    /// shared with its ended record.
    pub(super) record: Arc<Mutex<Record>>,
    /// Its journal, with `--state-dir`.
    pub(super) journal: Option<Arc<Writer>>,
    /// The owner's share of sessions and runs it holds while it is open.
    pub(super) share: Mutex<Option<Share>>,
    /// Code mode: its channel to the MCP tools it may call.
    pub(super) tools: Option<Arc<crate::upstream::Channel>>,
}

/// What a session holds on the host besides its processes: its private directory (work,
/// control, out) and the uid it runs as. The directory goes first, then the uid (returned
/// after a sweep when its tree was not confirmed gone).
pub(super) struct Remains {
    pub dir: PrivateDir,
    pub lease: Option<Lease>,
}

impl Remains {
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

impl Session {
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
        let remains = self
            .remains
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        remains.and_then(Remains::release)
    }

    /// The directory and uid of a session whose interpreter is gone, to keep its files
    /// readable for a while; its uid is swept now if its tree was not confirmed gone, so
    /// nothing of the session runs while they are read (blocking: call it off the workers).
    pub(super) fn take_remains(&self) -> Option<Remains> {
        let remains = lock(&self.remains).take();
        if let Some(lease) = remains.as_ref().and_then(|r| r.lease.as_ref()) {
            lease.sweep_now();
        }
        remains
    }

    pub(super) fn touch(&self) {
        *lock(&self.last_used) = (SystemTime::now(), Instant::now());
    }

    pub(super) fn idle_for(&self) -> Duration {
        if lock(&self.busy).is_some() {
            return Duration::ZERO;
        }
        lock(&self.last_used).1.elapsed()
    }

    pub(super) fn info(&self) -> SessionInfo {
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

pub(super) fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn describe_exit(code: Option<i32>, signal: Option<&str>) -> String {
    match (code, signal) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by {s}"),
        _ => "status unknown".into(),
    }
}
