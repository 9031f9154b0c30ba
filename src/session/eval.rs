//! Evaluations: `session_eval`, `session_input` and `session_interrupt` on a session of the
//! table, and how an evaluation's outcome becomes its report.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use tokio_util::sync::CancellationToken;

use super::entry::{End, Phase, Session, lock, unix};
use super::history::{Cell, Outputs, Pending};
use super::interp::{Ending, Interp, Outcome};
use super::manager::SessionManager;
use super::report::{EvalReport, EvalStatus, InterruptReport, apply_ending};
use crate::error::{ErrorKind, ToolError};
use crate::identity::Caller;
use crate::progress::Progress;

/// What `session_input` types: the text, and whether Enter follows it.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    pub text: &'a str,
    pub enter: bool,
}

impl SessionManager {
    pub(super) fn busy_error(&self, session: &Session) -> ToolError {
        let busy = match session.phase() {
            Phase::Busy { eval, since, .. } => Some((eval, since.elapsed())),
            _ => None,
        };
        let what = match busy {
            Some((eval_id, running)) => format!(
                "evaluation {eval_id} (running for {:.1} s)",
                running.as_secs_f64()
            ),
            None => "another call".into(),
        };
        let message = format!(
            "session {} is busy with {what}. Wait for it to finish, stop it with session_interrupt, \
or use another session.",
            session.id
        );
        ToolError::new(ErrorKind::Busy, message)
            .session(&session.id)
            .eval(busy.map(|b| b.0))
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
    ) -> Result<EvalReport, ToolError> {
        // A suspended session is restored first (unless the operator said not to).
        let restored = if self.restores_on_eval(caller, id) {
            Some(self.restore(caller, id).await?)
        } else {
            None
        };
        let mut report = self
            .eval_open(caller, id, code, timeout, cancel, progress)
            .await?;
        if let Some(r) = restored {
            report.notes.insert(
                0,
                format!(
                    "session {id} was suspended: it was restored first ({} cell(s) replayed in {} \
ms{})",
                    r.replayed,
                    r.duration_ms,
                    if r.failed.is_empty() {
                        String::new()
                    } else {
                        format!(", {} failed on replay", r.failed.len())
                    }
                ),
            );
            report.replayed = Some(r.replayed);
            report.replay_failed = r.failed;
        }
        Ok(report)
    }

    async fn eval_open(
        &self,
        caller: &Caller,
        id: &str,
        code: &str,
        timeout: Duration,
        cancel: &CancellationToken,
        progress: Option<&Progress>,
    ) -> Result<EvalReport, ToolError> {
        let session = self.lookup(caller, id)?;
        if let Phase::AwaitingInput { eval, prompt } = session.phase() {
            let message = format!(
                "session {id} is waiting for input to evaluation {eval}{}. Answer it with session_input, \
or stop it with session_interrupt, before evaluating more code.",
                if prompt.is_empty() {
                    String::new()
                } else {
                    format!(" (it asked: {prompt:?})")
                }
            );
            return Err(ToolError::new(ErrorKind::AwaitingInput, message)
                .session(id)
                .eval(Some(eval)));
        }
        let Ok(mut guard) = session.interp.try_lock() else {
            return Err(self.busy_error(&session));
        };
        if guard.is_none() {
            return Err(self.gone_error(&session));
        }
        let eval_id = session.evals.fetch_add(1, Ordering::Relaxed) + 1;
        lock(&session.record).pending = Some(Pending {
            eval_id,
            code: code.to_string(),
            started_at: unix(SystemTime::now()),
            started: Instant::now(),
            timeout_ms: timeout.as_millis() as u64,
            output: String::new(),
            inputs: Vec::new(),
            no_enter: Vec::new(),
        });
        let Some(token) = session.begin(eval_id, cancel) else {
            return Err(self.gone_error(&session));
        };
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + timeout;
        let scope = super::tools::begin(&session, eval_id, deadline, Vec::new());
        let outcome = match guard.as_mut() {
            Some(interp) => interp.eval(eval_id, code, deadline, &token, progress).await,
            None => return Err(self.gone_error(&session)),
        };
        drop(scope);
        let (mut report, awaiting) = self.conclude(&session, &mut guard, eval_id, started, outcome);
        // Still under the interpreter's lock: the next evaluation's files and images must
        // not be taken for this one's.
        self.collect(&session, &mut report).await;
        self.record(&session, &report).await;
        session.finish(awaiting);
        self.retire_exited(&session).await;
        Ok(report)
    }

    /// Answer an evaluation that is waiting for input.
    pub async fn input(
        &self,
        caller: &Caller,
        id: &str,
        answer: Answer<'_>,
        timeout: Duration,
        cancel: &CancellationToken,
        progress: Option<&Progress>,
    ) -> Result<EvalReport, ToolError> {
        let session = self.lookup(caller, id)?;
        let Answer { text, enter } = answer;
        if let Some(long) = text.split('\n').find(|l| l.len() > 4000) {
            return Err(ToolError::invalid(format!(
                "a line of {} bytes is too long for a terminal (4000 at most); write the data to a \
file in the session's directory and read it from there instead",
                long.len()
            )));
        }
        let Ok(mut guard) = session.interp.try_lock() else {
            return Err(self.busy_error(&session));
        };
        if guard.is_none() || session.ended().is_some() {
            return Err(self.gone_error(&session));
        }
        let Some((eval_id, token)) = session.resume(cancel) else {
            return Err(ToolError::new(
                ErrorKind::NotAwaitingInput,
                format!("session {id} is not waiting for input. Use session_eval to run code."),
            )
            .session(id));
        };
        if let Some(p) = lock(&session.record).pending.as_mut() {
            if !enter {
                p.no_enter.push(p.inputs.len());
            }
            p.inputs.push(text.to_string());
        }
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + timeout;
        let scope = super::tools::begin(&session, eval_id, deadline, Vec::new());
        let outcome = match guard.as_mut() {
            Some(interp) => interp.resume(text, enter, deadline, &token, progress).await,
            None => return Err(self.gone_error(&session)),
        };
        drop(scope);
        let (mut report, awaiting) = self.conclude(&session, &mut guard, eval_id, started, outcome);
        self.collect(&session, &mut report).await;
        self.record(&session, &report).await;
        session.finish(awaiting);
        self.retire_exited(&session).await;
        Ok(report)
    }

    /// Interrupt the evaluation that is waiting for input, or the one running in another call.
    pub async fn interrupt(&self, caller: &Caller, id: &str) -> Result<InterruptReport, ToolError> {
        let session = self.lookup(caller, id)?;
        let mut report = InterruptReport {
            session_id: id.to_string(),
            interrupted: false,
            eval_id: None,
            result: None,
        };
        match session.interp.try_lock() {
            Ok(mut guard) => {
                let Some((eval_id, _)) = session.resume(&CancellationToken::new()) else {
                    return Ok(report); // nothing running
                };
                let started = Instant::now();
                let outcome = match guard.as_mut() {
                    Some(interp) => interp.interrupt_paused().await,
                    None => return Err(self.gone_error(&session)),
                };
                report.interrupted = true;
                report.eval_id = Some(eval_id);
                let (mut result, awaiting) =
                    self.conclude(&session, &mut guard, eval_id, started, outcome);
                self.collect(&session, &mut result).await;
                self.record(&session, &result).await;
                session.finish(awaiting);
                self.retire_exited(&session).await;
                report.result = Some(result);
            }
            Err(_) => {
                // An evaluation is running in another call: make it interrupt itself.
                if let Some(eval) = session.interrupt_running() {
                    report.interrupted = true;
                    report.eval_id = Some(eval);
                }
            }
        }
        Ok(report)
    }

    /// After a call whose evaluation ended the interpreter: keep the session's files and
    /// history for a while.
    pub(super) async fn retire_exited(&self, session: &Arc<Session>) {
        if let Some(how @ End::Exited { .. }) = session.ended() {
            self.journal_end(session, &how).await;
            self.retire(session.clone()).await;
        }
    }

    /// Add a finished evaluation to the session's history (and journal); a part that ended
    /// waiting for input is kept until the evaluation is over.
    pub(super) async fn record(&self, session: &Session, report: &EvalReport) {
        let cell = {
            let mut r = lock(&session.record);
            if report.status == EvalStatus::AwaitingInput {
                if let Some(p) = r.pending.as_mut() {
                    p.output.push_str(&report.output);
                }
                return;
            }
            let Some(p) = r.pending.take() else { return };
            let tool_calls = super::tools::calls(session, p.eval_id);
            let cell = Cell {
                eval_id: p.eval_id,
                code: p.code,
                status: report.status,
                error: report.error.clone(),
                duration_ms: p.started.elapsed().as_millis() as u64,
                started_at: p.started_at,
                outputs: Outputs::of(report, &p.output),
                replayed: false,
                tool_calls: tool_calls.iter().map(|t| t.without_result()).collect(),
            };
            if session.journal.is_none() {
                r.history.push(cell);
                return;
            }
            r.history.push(cell.clone());
            // The journal keeps the results too, for a restore's replay.
            let cell = Cell { tool_calls, ..cell };
            (cell, p.inputs, p.no_enter, p.timeout_ms)
        };
        self.journal_cell(session, cell).await;
    }

    /// Turn an outcome into the report, and record what it means for the session: the
    /// evaluation paused for input (its number and prompt), if it did.
    pub(super) fn conclude(
        &self,
        session: &Session,
        guard: &mut Option<Interp>,
        eval_id: u64,
        started: Instant,
        outcome: Outcome,
    ) -> (EvalReport, Option<(u64, String)>) {
        let mut report = EvalReport::empty(&session.id, eval_id);
        report.output = outcome.output.text;
        report.truncated = outcome.output.omitted > 0;
        report.notes.extend(outcome.output.notes);
        report.duration_ms = started.elapsed().as_millis() as u64;
        apply_ending(&mut report, &outcome.ending, session.lang.error_pattern());
        report.discarded(&outcome.typed);
        report.notes.extend(outcome.notes);
        let mut awaiting = None;
        match outcome.ending {
            Ending::Restarted { reason } => {
                tracing::warn!(session = %session.id, %reason, "interpreter restarted");
            }
            Ending::AwaitingInput => {
                let prompt = report
                    .output
                    .rsplit('\n')
                    .next()
                    .unwrap_or("")
                    .chars()
                    .take(200)
                    .collect();
                awaiting = Some((eval_id, prompt));
            }
            Ending::Exited(_) => {
                *guard = None;
                self.mark_gone(
                    session,
                    End::Exited {
                        code: report.exit_code,
                        signal: report.signal.clone(),
                    },
                );
            }
            _ => {}
        }
        if let Some(i) = guard.as_ref() {
            session.pid.store(i.pid as u64, Ordering::Relaxed);
            session.helper.store(i.helper() as u64, Ordering::Relaxed);
        }
        // Nothing left to interrupt; the session stays busy until the report is complete.
        session.outcome_known();
        (report, awaiting)
    }
}
