//! Evaluating in an open session: `session_eval`, `session_input`, `session_interrupt` and
//! `session_vars` on its interpreter, the replay of a restored session's cells, and how an
//! evaluation's outcome becomes its report, its history and its journal line.
//!
//! The evaluator only uses the session it is given and the table (to record that the
//! interpreter exited); what follows an ending (keeping its files) is the caller's.

mod artifacts;
mod display;
mod image;
mod inspect;
mod pip;
mod vars;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use tokio_util::sync::CancellationToken;

use super::history::{Cell, Outputs, Pending, typed};
use super::interp::{Ending, Interp, Outcome};
use super::journal::{self, CellEntry, Entry};
use super::live::{End, Phase, Session, lock, unix};
use super::report::{EvalReport, EvalStatus, InterruptReport, ReplayFailure, apply_ending};
use super::table::Table;
use super::tools;
use crate::config::Config;
use crate::error::{ErrorKind, ToolError};
use crate::progress::Progress;
use crate::workspace::DirId;
pub use inspect::{DEFAULT_BUDGET, InspectReport, MAX_BUDGET, MIN_BUDGET, printable};
pub use vars::VarsReport;

/// What `session_input` types: the text, and whether Enter follows it.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    pub text: &'a str,
    pub enter: bool,
}

/// Runs evaluations in sessions.
pub(super) struct Evaluator {
    config: Arc<Config>,
    /// Directories a session's listing never enters (the server's workspace).
    skip: Vec<DirId>,
}

/// The error for a call on a session whose interpreter another call holds.
pub(super) fn busy_error(session: &Session) -> ToolError {
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

impl Evaluator {
    pub(super) fn new(config: Arc<Config>, skip: Vec<DirId>) -> Self {
        Self { config, skip }
    }

    /// Evaluate `code` in `session`.
    pub(super) async fn eval(
        &self,
        table: &Table,
        session: &Session,
        code: &str,
        timeout: Duration,
        cancel: &CancellationToken,
        progress: Option<&Progress>,
    ) -> Result<EvalReport, ToolError> {
        let id = &session.id;
        if let Phase::AwaitingInput { eval, prompt } = session.phase() {
            return Err(awaiting_error(id, eval, &prompt));
        }
        let Ok(mut guard) = session.interp.try_lock() else {
            return Err(busy_error(session));
        };
        if guard.is_none() {
            return Err(session.ended_error());
        }
        // `%pip install` lines: installed by the server (under the interpreter's lock, so
        // the session is busy meanwhile), the rest of the cell evaluated after them.
        let (pip_note, evaluated, pins) =
            match pip::install(&self.config, session, code, cancel).await {
                Ok(Some(d)) => (Some(d.note), d.code, Some(d.pins)),
                Ok(None) => (None, code.to_string(), None),
                Err(e) => return Err(e.session(id)),
            };
        let (typed, code) = (code, evaluated.as_str());
        let eval_id = session.evals.fetch_add(1, Ordering::Relaxed) + 1;
        let started_at = unix(SystemTime::now());
        journal_started(session, eval_id, started_at, typed, pins);
        lock(&session.record).pending = Some(Pending {
            eval_id,
            code: typed.to_string(),
            started_at,
            started: Instant::now(),
            timeout_ms: timeout.as_millis() as u64,
            output: String::new(),
            shown: Default::default(),
            inputs: Vec::new(),
            no_enter: Vec::new(),
        });
        let Some(token) = session.begin(eval_id, cancel) else {
            return Err(session.ended_error());
        };
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + timeout;
        let scope = tools::begin(session, eval_id, deadline, Vec::new());
        let outcome = match guard.as_mut() {
            Some(interp) => interp.eval(eval_id, code, deadline, &token, progress).await,
            None => return Err(session.ended_error()),
        };
        drop(scope);
        let mut report = self
            .complete(table, session, &mut guard, (eval_id, started), outcome)
            .await;
        report.notes.extend(pip_note);
        Ok(report)
    }

    /// Answer the evaluation of `session` that is waiting for input.
    pub(super) async fn input(
        &self,
        table: &Table,
        session: &Session,
        (text, enter): (&str, bool),
        timeout: Duration,
        cancel: &CancellationToken,
        progress: Option<&Progress>,
    ) -> Result<EvalReport, ToolError> {
        if let Some(long) = text.split('\n').find(|l| l.len() > 4000) {
            return Err(ToolError::invalid(format!(
                "a line of {} bytes is too long for a terminal (4000 at most); write the data to a \
file in the session's directory and read it from there instead",
                long.len()
            )));
        }
        let Ok(mut guard) = session.interp.try_lock() else {
            return Err(busy_error(session));
        };
        if guard.is_none() || session.ended().is_some() {
            return Err(session.ended_error());
        }
        let Some((eval_id, token)) = session.resume(cancel) else {
            return Err(ToolError::new(
                ErrorKind::NotAwaitingInput,
                format!(
                    "session {} is not waiting for input. Use session_eval to run code.",
                    session.id
                ),
            )
            .session(&session.id));
        };
        if let Some(p) = lock(&session.record).pending.as_mut() {
            if !enter {
                p.no_enter.push(p.inputs.len());
            }
            p.inputs.push(text.to_string());
        }
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + timeout;
        let scope = tools::begin(session, eval_id, deadline, Vec::new());
        let outcome = match guard.as_mut() {
            Some(interp) => interp.resume(text, enter, deadline, &token, progress).await,
            None => return Err(session.ended_error()),
        };
        drop(scope);
        Ok(self
            .complete(table, session, &mut guard, (eval_id, started), outcome)
            .await)
    }

    /// Interrupt the evaluation of `session` that is waiting for input, or the one running
    /// in another call.
    pub(super) async fn interrupt(
        &self,
        table: &Table,
        session: &Session,
    ) -> Result<InterruptReport, ToolError> {
        let mut report = InterruptReport {
            session_id: session.id.clone(),
            interrupted: false,
            eval_id: None,
            result: None,
        };
        let Ok(mut guard) = session.interp.try_lock() else {
            // An evaluation is running in another call: make it interrupt itself.
            if let Some(eval) = session.interrupt_running() {
                report.interrupted = true;
                report.eval_id = Some(eval);
            }
            return Ok(report);
        };
        let Some((eval_id, _)) = session.resume(&CancellationToken::new()) else {
            return Ok(report); // nothing running
        };
        let started = Instant::now();
        let outcome = match guard.as_mut() {
            Some(interp) => interp.interrupt_paused().await,
            None => return Err(session.ended_error()),
        };
        report.interrupted = true;
        report.eval_id = Some(eval_id);
        let result = self
            .complete(table, session, &mut guard, (eval_id, started), outcome)
            .await;
        report.result = Some(result);
        Ok(report)
    }

    /// The report of an evaluation (or part of one) that is over, its figures and files,
    /// its history and journal; then the session is free again (or paused for input).
    /// Still under the interpreter's lock: the next evaluation's files and images must not
    /// be taken for this one's.
    async fn complete(
        &self,
        table: &Table,
        session: &Session,
        guard: &mut Option<Interp>,
        (eval_id, started): (u64, Instant),
        outcome: Outcome,
    ) -> EvalReport {
        let (mut report, awaiting) =
            self.conclude(table, session, guard, (eval_id, started), outcome);
        self.collect(session, &mut report).await;
        self.record(session, &report).await;
        session.finish(awaiting);
        report
    }

    /// Run the journal's cells that succeeded again, in order, with their own numbers and
    /// deadlines (and the answers they were given); the others only go into the history.
    /// A cell the server stopped in (`unfinished`) is never run again: it goes into the
    /// history as such.
    pub(super) async fn replay(
        &self,
        table: &Table,
        session: &Session,
        cells: &[CellEntry],
        unfinished: &[journal::Unfinished],
        packages: &std::collections::BTreeMap<u64, Vec<String>>,
    ) -> (u64, u64, Vec<ReplayFailure>) {
        let (mut replayed, mut skipped, mut failed) = (0, 0, Vec::new());
        let mut guard = session.interp.lock().await;
        let never = CancellationToken::new();
        let mut stopped_in = unfinished.iter().peekable();
        for c in cells {
            while let Some(u) = stopped_in.next_if(|u| u.eval_id < c.eval_id) {
                skipped += 1;
                lock(&session.record).history.push(stopped_cell(u));
            }
            if c.status != EvalStatus::Ok || guard.is_none() {
                skipped += 1;
                lock(&session.record).history.push(Cell::not_replayed(c));
                continue;
            }
            let started = Instant::now();
            // Its install lines: the same packages installed again (from the cache) before
            // the rest of it runs; a cell whose packages cannot be had is not run.
            let code = match pip::replay(session, &c.code, packages.get(&c.eval_id), &never).await {
                Ok(rest) => rest,
                Err(why) => {
                    let (failure, cell) = package_unavailable(c, &why, started);
                    failed.push(failure);
                    lock(&session.record).history.push(cell);
                    continue;
                }
            };
            let code = code.as_deref().unwrap_or(&c.code);
            let Some((report, cell)) = self
                .rerun(table, session, &mut guard, c, code, started, &never)
                .await
            else {
                break;
            };
            replayed += 1;
            if report.status != EvalStatus::Ok {
                failed.push(failure(c.eval_id, &report));
            }
            lock(&session.record).history.push(cell);
        }
        for u in stopped_in {
            skipped += 1;
            lock(&session.record).history.push(stopped_cell(u));
        }
        drop(guard);
        session.touch();
        if session.ended().is_some() {
            // The replay ended the interpreter.
            lock(&session.record).pending = None::<Pending>;
        }
        (replayed, skipped, failed)
    }

    /// Evaluate one journaled cell again (`code`, its install lines done), with its own
    /// number and deadline: its report and its place in the history. None when the
    /// session ended (nothing more is replayed).
    #[allow(clippy::too_many_arguments)]
    async fn rerun(
        &self,
        table: &Table,
        session: &Session,
        guard: &mut Option<Interp>,
        c: &CellEntry,
        code: &str,
        started: Instant,
        never: &CancellationToken,
    ) -> Option<(EvalReport, Cell)> {
        session.begin(c.eval_id, never)?;
        let timeout = self.config.timeout(Some(c.timeout_ms));
        let deadline = tokio::time::Instant::now() + timeout;
        let interp = guard.as_mut()?;
        // Code mode: the cell's tool calls are answered from the journal's record.
        let scope = tools::begin(session, c.eval_id, deadline, c.tool_calls.clone());
        let (outcome, before) = eval_answering(interp, c, code, deadline, never).await;
        drop(scope);
        let calls = tools::calls(session, c.eval_id);
        let (mut report, _) = self.conclude(table, session, guard, (c.eval_id, started), outcome);
        self.collect(session, &mut report).await;
        session.finish(None);
        let cell = Cell {
            eval_id: c.eval_id,
            code: c.code.clone(),
            status: report.status,
            error: report.error.clone(),
            duration_ms: started.elapsed().as_millis() as u64,
            started_at: unix(SystemTime::now()),
            outputs: Outputs::of(&report, &before),
            replayed: true,
            tool_calls: calls.iter().map(|t| t.without_result()).collect(),
            typed: answered(typed(&c.inputs, &c.no_enter), &report),
        };
        Some((report, cell))
    }

    /// Add a finished evaluation to the session's history (and journal); a part that ended
    /// waiting for input is kept until the evaluation is over.
    async fn record(&self, session: &Session, report: &EvalReport) {
        let cell = {
            let mut r = lock(&session.record);
            if report.status == EvalStatus::AwaitingInput {
                if let Some(p) = r.pending.as_mut() {
                    p.output.push_str(&report.output);
                    let part = Outputs::of(report, "");
                    p.shown.images.extend(part.images);
                    p.shown.displays.extend(part.displays);
                }
                return;
            }
            let Some(p) = r.pending.take() else { return };
            let tool_calls = tools::calls(session, p.eval_id);
            let cell = Cell {
                eval_id: p.eval_id,
                code: p.code,
                status: report.status,
                error: report.error.clone(),
                duration_ms: p.started.elapsed().as_millis() as u64,
                started_at: p.started_at,
                outputs: Outputs::of(report, &p.output).after(p.shown),
                replayed: false,
                tool_calls: tool_calls.iter().map(|t| t.without_result()).collect(),
                typed: answered(typed(&p.inputs, &p.no_enter), report),
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
        journal_cell(session, cell).await;
    }

    /// Turn an outcome into the report, and record what it means for the session: the
    /// evaluation paused for input (its number and prompt), if it did.
    fn conclude(
        &self,
        table: &Table,
        session: &Session,
        guard: &mut Option<Interp>,
        (eval_id, started): (u64, Instant),
        outcome: Outcome,
    ) -> (EvalReport, Option<(u64, String)>) {
        let mut report = EvalReport::empty(&session.id, eval_id);
        report.output = outcome.output.text;
        report.truncated = outcome.output.omitted > 0;
        if !outcome.background.text.is_empty() {
            report.background_output = Some(outcome.background.text);
            report.truncated |= outcome.background.omitted > 0;
        }
        report.notes.extend(outcome.output.notes);
        if let Some(whole) = outcome.output.whole {
            whole_output(&mut report, whole);
        }
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
            Ending::Exited(_) | Ending::Replaced(_) => {
                *guard = None;
                let how = End::Exited {
                    code: report.exit_code,
                    signal: report.signal.clone(),
                    replaced_by: match outcome.ending {
                        Ending::Replaced(program) => Some(program),
                        _ => None,
                    },
                };
                table.mark_ended(session, how);
            }
            _ => {}
        }
        if let Some(i) = guard.as_ref() {
            session.pid.store(u64::from(i.pid), Ordering::Relaxed);
            session
                .helper
                .store(u64::from(i.helper()), Ordering::Relaxed);
        }
        // Nothing left to interrupt; the session stays busy until the report is complete.
        session.outcome_known();
        (report, awaiting)
    }
}

/// Evaluate a replayed cell's code, typing at each prompt the answer it was given there
/// (interrupted at a prompt past them): the outcome, and what it printed before the last
/// prompt.
async fn eval_answering(
    interp: &mut Interp,
    c: &CellEntry,
    code: &str,
    deadline: tokio::time::Instant,
    never: &CancellationToken,
) -> (Outcome, String) {
    let mut outcome = interp.eval(c.eval_id, code, deadline, never, None).await;
    let mut before = String::new();
    let mut answers = c.inputs.iter().enumerate();
    while matches!(outcome.ending, Ending::AwaitingInput) {
        before.push_str(&outcome.output.text);
        outcome = match answers.next() {
            Some((i, a)) => {
                let enter = !c.no_enter.contains(&i);
                interp.resume(a, enter, deadline, never, None).await
            }
            None => interp.interrupt_paused().await,
        };
    }
    (outcome, before)
}

/// A cell the server stopped in, in the history: not run again.
fn stopped_cell(u: &journal::Unfinished) -> Cell {
    Cell {
        eval_id: u.eval_id,
        code: u.code.clone(),
        status: EvalStatus::Error,
        error: Some(super::report::ErrorInfo {
            kind: "ServerStopped".into(),
            message: "the server stopped while this cell ran; it was not run again".into(),
        }),
        duration_ms: 0,
        started_at: u.started_at,
        outputs: Outputs::default(),
        replayed: false,
        tool_calls: Vec::new(),
        typed: String::new(),
    }
}

/// A cell whose packages could not be installed again: its failure and its place in the
/// history (not run).
fn package_unavailable(
    c: &CellEntry,
    why: &pip::ReplayError,
    started: Instant,
) -> (ReplayFailure, Cell) {
    let error = super::report::ErrorInfo {
        kind: "PackageUnavailable".into(),
        message: why.to_string(),
    };
    let failure = ReplayFailure {
        eval_id: c.eval_id,
        status: EvalStatus::Error,
        error: Some(error.clone()),
        output: String::new(),
    };
    let cell = Cell {
        eval_id: c.eval_id,
        code: c.code.clone(),
        status: EvalStatus::Error,
        error: Some(error),
        duration_ms: started.elapsed().as_millis() as u64,
        started_at: unix(SystemTime::now()),
        outputs: Outputs::default(),
        replayed: false,
        tool_calls: Vec::new(),
        typed: String::new(),
    };
    (failure, cell)
}

/// The error for an evaluation asked of a session that waits for input to evaluation
/// `eval` (which asked `prompt`).
fn awaiting_error(id: &str, eval: u64, prompt: &str) -> ToolError {
    let message = format!(
        "session {id} is waiting for input to evaluation {eval}{}. Answer it with session_input, \
or stop it with session_interrupt, before evaluating more code.",
        if prompt.is_empty() {
            String::new()
        } else {
            format!(" (it asked: {prompt:?})")
        }
    );
    ToolError::new(ErrorKind::AwaitingInput, message)
        .session(id)
        .eval(Some(eval))
}

/// Journal that a cell starts: what its install lines installed (`pins`), and the start
/// itself.
fn journal_started(
    session: &Session,
    eval_id: u64,
    started_at: u64,
    typed: &str,
    pins: Option<Vec<String>>,
) {
    let Some(w) = &session.journal else {
        return;
    };
    let id = &session.id;
    // What the install lines installed, for a restore to install the same again.
    if let Some(installed) = pins {
        let entry = Entry::Packages {
            eval_id,
            installed,
            generation: 0,
        };
        if let Err(e) = w.append(&entry) {
            tracing::error!(session = %id, error = %e, "cannot write the session's journal");
        }
    }
    // Before the code is typed: a restore after a stop in this cell must know it ran.
    // One small write, not synced (see `Writer::append`).
    if let Err(e) = w.append(&journal::started(eval_id, started_at, typed)) {
        tracing::error!(session = %id, error = %e, "cannot write the session's journal");
    }
}

/// Journal a finished cell (made durable before the call returns).
async fn journal_cell(session: &Session, done: (Cell, Vec<String>, Vec<usize>, u64)) {
    let Some(w) = session.journal.clone() else {
        return;
    };
    let (cell, inputs, no_enter, timeout_ms) = done;
    let eval_id = cell.eval_id;
    let entry = Entry::Cell(CellEntry {
        eval_id: cell.eval_id,
        code: cell.code,
        status: cell.status,
        error: cell.error,
        duration_ms: cell.duration_ms,
        started_at: cell.started_at,
        timeout_ms,
        inputs,
        no_enter,
        tool_calls: cell.tool_calls,
        generation: 0,
    });
    let was_full = w.is_full();
    let r = tokio::task::spawn_blocking(move || w.append(&entry)).await;
    match r {
        Ok(Ok(journal::Appended::Full)) if !was_full => {
            tracing::warn!(session = %session.id, "the session's journal is full");
        }
        Ok(Ok(journal::Appended::Sealed)) => {
            tracing::warn!(session = %session.id, eval_id, "a cell finished after this node may have lost its session: not journaled");
        }
        Ok(Err(e)) => {
            tracing::error!(session = %session.id, error = %e, "cannot write the session's journal")
        }
        _ => {}
    }
}

/// The output was cut and the renderer kept it whole: a link to it, and a note that says
/// how to read it.
fn whole_output(report: &mut EvalReport, (text, left_out): (String, u64)) {
    use super::files::{OUTPUT_PAGE, human_size, output_uri};
    let uri = output_uri(&report.session_id, report.eval_id);
    let pages = text.len().div_ceil(OUTPUT_PAGE).max(1);
    let kept = if left_out > 0 {
        format!(
            "its first and last {} (--whole-output-mb)",
            human_size(text.len() as u64 / 2)
        )
    } else {
        format!("all {}", human_size(text.len() as u64))
    };
    report.notes.push(format!(
        "the output is cut above, its head and tail shown; {uri} holds {kept}: read it with \
resources/read, or a part with ?page=1 to ?page={pages} ({} each)",
        human_size(OUTPUT_PAGE as u64)
    ));
    report.output_uri = Some(uri.clone());
    report.whole = Some((uri, text));
}

/// A replayed cell that did not succeed, with the end of what it printed.
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

/// What the cell read of what was typed into it: without what it left unread (discarded).
fn answered(mut typed: String, report: &EvalReport) -> String {
    if let Some(unread) = report.discarded_input.as_deref()
        && typed.ends_with(unread)
    {
        typed.truncate(typed.len() - unread.len());
    }
    typed
}
