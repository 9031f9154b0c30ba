//! One channel's state, shared by the socket that serves it (`channel`) and the calls it
//! answers (`relay`): what the code may call, the evaluation in flight and the calls it made.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::net::UnixStream;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::record::CallRecord;
use super::{Access, Shared};

/// Bytes of results a cell keeps in the journal for its replay.
pub const JOURNAL_RESULTS_PER_CELL: usize = 4 * 1024 * 1024;

pub(super) struct Inner {
    pub(super) access: Arc<Access>,
    pub(super) shared: Arc<Shared>,
    /// Names the session or run in the log and the audit.
    pub(super) who: String,
    pub(super) uid: Option<u32>,
    pub(super) secret: String,
    pub(super) state: Mutex<State>,
    pub(super) concurrent: Arc<Semaphore>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) scope: Option<Arc<Scope>>,
    /// The evaluation the calls below belong to.
    pub(super) eval_id: u64,
    pub(super) calls: Vec<CallRecord>,
    /// Result bytes kept in `calls` for the journal.
    pub(super) kept: usize,
}

/// The evaluation in flight: its deadline, what interrupts it, its count of calls and, on
/// a replay, the calls the journal recorded for it.
pub(super) struct Scope {
    pub(super) deadline: tokio::time::Instant,
    pub(super) cancel: CancellationToken,
    pub(super) made: AtomicU32,
    pub(super) replay: Mutex<Vec<CallRecord>>,
}

impl Scope {
    /// The recorded call that answers this one (same server, tool and arguments), taken.
    pub(super) fn recorded(&self, server: &str, tool: &str, args_sha: &str) -> Option<CallRecord> {
        let mut r = self.replay.lock().unwrap_or_else(|p| p.into_inner());
        let i = r
            .iter()
            .position(|c| c.server == server && c.tool == tool && c.arguments_sha256 == args_sha)?;
        Some(r.remove(i))
    }
}

impl Scope {
    /// Count one more call; false when the evaluation has made its most.
    pub(super) fn count(&self, max: u32) -> bool {
        self.made.fetch_add(1, Ordering::Relaxed) < max
    }
}

impl Inner {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn scope(&self) -> Option<Arc<Scope>> {
        self.lock().scope.clone()
    }

    /// Keep a finished call for the evaluation's record (its result only while the cell's
    /// budget for the journal lasts).
    pub(super) fn keep(&self, mut rec: CallRecord) {
        let mut st = self.lock();
        if let Some(r) = &rec.result {
            let n = r.to_string().len();
            if st.kept + n > JOURNAL_RESULTS_PER_CELL {
                rec.result = None;
            } else {
                st.kept += n;
            }
        }
        st.calls.push(rec);
    }

    /// Whether the upstream's uid may use this channel.
    pub(super) fn peer_allowed(&self, stream: &UnixStream) -> bool {
        let Ok(cred) = stream.peer_cred() else {
            return false;
        };
        match self.uid {
            Some(uid) => cred.uid() == uid,
            None => cred.uid() == rustix::process::geteuid().as_raw(),
        }
    }
}

/// A refusal before anything was called.
pub(super) fn refusal(message: String) -> Value {
    json!({"ok": false, "error": {"kind": "refused", "message": message}})
}
