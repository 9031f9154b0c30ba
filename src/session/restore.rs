//! Restoring a suspended session: `session_restore` (and the first `session_eval` on one)
//! starts its interpreter again through every check and limit of a new session, then
//! replays the journal's cells that succeeded, in order.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use schemars::JsonSchema;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::entry::{Session, lock};
use super::files::InFile;
use super::history::{Cell, Outputs, Pending};
use super::interp::Ending;
use super::journal::{CellEntry, Entry, Writer};
use super::launch::StartRequest;
use super::manager::SessionManager;
use super::report::{ErrorInfo, EvalReport, EvalStatus};
use super::suspend::{Journaled, now_s};
use super::table::{Miss, Slot};
use crate::error::{ErrorKind, ToolError};
use crate::identity::Caller;

/// A cell that did not succeed when it was replayed.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ReplayFailure {
    pub eval_id: u64,
    pub status: EvalStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
    /// The end of what it printed.
    pub output: String,
}

/// What `session_restore` returns.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RestoreReport {
    pub session_id: String,
    pub language: String,
    pub version: String,
    pub pid: u32,
    pub cwd: String,
    pub sandbox: crate::sandbox::Level,
    /// Cells run again, in order (those that had succeeded).
    pub replayed: u64,
    /// Cells not run again because they had failed (or been interrupted).
    pub skipped: u64,
    /// Replayed cells that did not succeed this time.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<ReplayFailure>,
    pub duration_ms: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl RestoreReport {
    pub fn text(&self) -> String {
        let mut t = format!(
            "session {} restored: {} {} (pid {}) in {}; {} cell(s) replayed",
            self.session_id, self.language, self.version, self.pid, self.cwd, self.replayed
        );
        if self.skipped > 0 {
            t.push_str(&format!(", {} that had failed skipped", self.skipped));
        }
        t.push_str(&format!(" ({} ms)", self.duration_ms));
        for f in &self.failed {
            t.push_str(&format!(
                "\n[cell {} failed on replay: {}]",
                f.eval_id,
                f.error
                    .as_ref()
                    .map(|e| format!("{}: {}", e.kind, e.message))
                    .unwrap_or_else(|| format!("{:?}", f.status).to_lowercase())
            ));
        }
        for n in &self.notes {
            t.push_str(&format!("\n[{n}]"));
        }
        t
    }
}

impl SessionManager {
    /// Restore the caller's suspended session `id`: start its interpreter again (every
    /// check and limit of a new session applies) and replay the cells that succeeded.
    pub async fn restore(&self, caller: &Caller, id: &str) -> Result<RestoreReport, ToolError> {
        let Some(s) = self.suspended_of(caller, id) else {
            return Err(self.not_restorable(caller, id));
        };
        // Out of the restorable ones while it is restored (two calls do not both restore
        // it), and back if the start fails.
        let slot = self.admit(caller, id, true).await?;
        self.restore_from(caller, &s, slot).await
    }

    /// The error for a restore of `id`, which is no suspended session of the caller.
    pub(super) fn not_restorable(&self, caller: &Caller, id: &str) -> ToolError {
        match self.table.open(caller, id) {
            Ok(_) => ToolError::invalid(format!(
                "session {id} is running; there is nothing to restore"
            ))
            .session(id),
            Err(Miss::Ended(how)) => ToolError::new(
                ErrorKind::EndedSession,
                format!(
                    "{} It cannot be restored: it has no journal (session_close deletes it; \
without --state-dir there is none).",
                    how.message(id)
                ),
            )
            .session(id),
            Err(miss) => self.miss_error(id, miss),
        }
    }

    async fn restore_from(
        &self,
        caller: &Caller,
        s: &Journaled,
        slot: Slot<'_>,
    ) -> Result<RestoreReport, ToolError> {
        let t0 = Instant::now();
        let j = &self.read_journal(s).await?;
        let id = j.session_id.clone();
        // What was kept of its end is superseded by the session itself.
        if let Some(k) = self.table.take_kept(&id) {
            k.release().await;
        }
        let (path, max, full) = (s.path.clone(), self.journal_max(), j.full_at.is_some());
        let writer = tokio::task::spawn_blocking(move || -> std::io::Result<Writer> {
            let w = Writer::reopen(&path, max, full)?;
            w.append(&Entry::Restored { at: now_s() })?;
            Ok(w)
        })
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r)
        .map_err(|e| ToolError::internal(format!("cannot write the session's journal: {e}")))?;
        let req = &j.request;
        let req = StartRequest {
            language: req.language.clone(),
            cwd: req.cwd.as_ref().map(PathBuf::from),
            venv: req.venv.as_ref().map(PathBuf::from),
            allow_domains: req.allow_domains.clone(),
            mcp_servers: req.mcp_servers.clone(),
            env: req.env.clone(),
            idle_timeout_s: req.idle_timeout_s,
            // Files brought into a caller's cwd are still there; a private directory is new.
            files: if req.cwd.is_some() {
                Vec::new()
            } else {
                req.files
                    .iter()
                    .map(|f| InFile {
                        name: f.name.clone(),
                        path: f.path.as_ref().map(PathBuf::from),
                        content: f.content.clone(),
                    })
                    .collect()
            },
        };
        self.check_idle_timeout(req.idle_timeout_s)?;
        let (start, session) = self
            .start_as(caller, req, slot, Some(Arc::new(writer)))
            .await?;
        let last = j.cells.last().map_or(0, |c| c.eval_id);
        session.evals.store(last, Ordering::Relaxed);
        let (replayed, skipped, failed) = self.replay(&session, &j.cells).await;
        let notes = replay_notes(j, start.notes);
        tracing::info!(session = %id, replayed, ms = t0.elapsed().as_millis() as u64, "session restored");
        Ok(RestoreReport {
            session_id: id,
            language: start.language,
            version: start.version,
            pid: session.pid.load(Ordering::Relaxed) as u32,
            cwd: start.cwd,
            sandbox: start.sandbox,
            replayed,
            skipped,
            failed,
            duration_ms: t0.elapsed().as_millis() as u64,
            notes,
        })
    }

    /// Run the journal's cells that succeeded again, in order, with their own numbers and
    /// deadlines (and the answers they were given); the others only go into the history.
    async fn replay(
        &self,
        session: &Arc<Session>,
        cells: &[CellEntry],
    ) -> (u64, u64, Vec<ReplayFailure>) {
        let (mut replayed, mut skipped, mut failed) = (0, 0, Vec::new());
        let mut guard = session.interp.lock().await;
        let never = CancellationToken::new();
        for c in cells {
            if c.status != EvalStatus::Ok || guard.is_none() {
                skipped += 1;
                lock(&session.record).history.push(Cell {
                    eval_id: c.eval_id,
                    code: c.code.clone(),
                    status: c.status,
                    error: c.error.clone(),
                    duration_ms: c.duration_ms,
                    started_at: c.started_at,
                    outputs: Outputs::default(),
                    replayed: false,
                    tool_calls: c.tool_calls.iter().map(|t| t.without_result()).collect(),
                });
                continue;
            }
            let started = Instant::now();
            if session.begin(c.eval_id, &never).is_none() {
                break;
            }
            let timeout = self.config.timeout(Some(c.timeout_ms));
            let deadline = tokio::time::Instant::now() + timeout;
            let Some(interp) = guard.as_mut() else { break };
            // Code mode: the cell's tool calls are answered from the journal's record.
            let scope = super::tools::begin(session, c.eval_id, deadline, c.tool_calls.clone());
            let mut outcome = interp
                .eval(c.eval_id, &c.code, deadline, &never, None)
                .await;
            let mut before = String::new();
            let mut answers = c.inputs.iter().enumerate();
            while matches!(outcome.ending, Ending::AwaitingInput) {
                before.push_str(&outcome.output.text);
                outcome = match answers.next() {
                    Some((i, a)) => {
                        let enter = !c.no_enter.contains(&i);
                        interp.resume(a, enter, deadline, &never, None).await
                    }
                    None => interp.interrupt_paused().await,
                };
            }
            drop(scope);
            let calls = super::tools::calls(session, c.eval_id);
            let (mut report, _) = self.conclude(session, &mut guard, c.eval_id, started, outcome);
            self.collect(session, &mut report).await;
            session.finish(None);
            replayed += 1;
            if report.status != EvalStatus::Ok {
                failed.push(failure(c.eval_id, &report));
            }
            lock(&session.record).history.push(Cell {
                eval_id: c.eval_id,
                code: c.code.clone(),
                status: report.status,
                error: report.error.clone(),
                duration_ms: started.elapsed().as_millis() as u64,
                started_at: now_s(),
                outputs: Outputs::of(&report, &before),
                replayed: true,
                tool_calls: calls.iter().map(|t| t.without_result()).collect(),
            });
        }
        drop(guard);
        session.touch();
        if session.ended().is_some() {
            // The replay ended the interpreter.
            lock(&session.record).pending = None::<Pending>;
        }
        (replayed, skipped, failed)
    }
}

/// What a restore's result says besides the counts.
fn replay_notes(j: &super::journal::Journal, mut notes: Vec<String>) -> Vec<String> {
    if let Some(n) = j.full_at {
        notes.push(format!(
            "the journal was full from cell {n} on (--journal-max-mb): later cells were not \
replayed"
        ));
    }
    if j.torn {
        notes.push(
            "the journal's last line was cut short when the server was killed; that cell was \
not replayed"
                .into(),
        );
    }
    notes.push(
        "replay ran the cells again, side effects included (files written, requests sent)".into(),
    );
    notes
}

fn failure(eval_id: u64, report: &EvalReport) -> ReplayFailure {
    let out = report.output.trim_end();
    let start = out.char_indices().rev().nth(1999).map_or(0, |(i, _)| i);
    ReplayFailure {
        eval_id,
        status: report.status,
        error: report.error.clone(),
        output: out[start..].to_string(),
    }
}
