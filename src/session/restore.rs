//! Restoring a suspended session: `session_restore` (and the first `session_eval` on one)
//! starts its interpreter again through every check and limit of a new session, then
//! replays the journal's cells that succeeded, in order.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::files::InFile;
use super::journal::Journaled;
use super::launch::StartRequest;
use super::manager::SessionManager;
use super::report::RestoreReport;
use super::table::{Miss, Slot};
use crate::error::{ErrorKind, ToolError};
use crate::identity::Caller;

impl SessionManager {
    /// Restore the caller's suspended session `id`: start its interpreter again (every
    /// check and limit of a new session applies) and replay the cells that succeeded.
    pub async fn restore(&self, caller: &Caller, id: &str) -> Result<RestoreReport, ToolError> {
        self.cluster_gate(caller, id).await?;
        let Some(s) = self.table.suspended(caller, id) else {
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
        let j = &self.journals.read(s).await?;
        let id = j.session_id.clone();
        // What was kept of its end is superseded by the session itself.
        if let Some(k) = self.table.take_kept(&id) {
            k.release().await;
        }
        let claim = self.journal_claim(j)?;
        let writer = self.journals.reopen(s, j.full_at.is_some(), claim).await?;
        let req = &j.request;
        let req = StartRequest {
            language: req.language.clone(),
            cwd: req.cwd.as_ref().map(PathBuf::from),
            venv: req.venv.as_ref().map(PathBuf::from),
            allow_domains: req.allow_domains.clone(),
            mcp_servers: req.mcp_servers.clone(),
            packages: req.packages.clone(),
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
        self.launcher.check_idle_timeout(req.idle_timeout_s)?;
        let (start, session) = self
            .start_as(caller, req, slot, Some(Arc::new(writer)))
            .await?;
        session.evals.store(j.last_eval(), Ordering::Relaxed);
        let (replayed, skipped, failed) = self
            .evaluator
            .replay(&self.table, &session, &j.cells, &j.unfinished, &j.packages)
            .await;
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
}

/// What a restore's result says besides the counts.
fn replay_notes(j: &super::journal::Journal, mut notes: Vec<String>) -> Vec<String> {
    if let Some(n) = j.full_at {
        notes.push(format!(
            "the journal was full from cell {n} on (--journal-max-mb): later cells were not \
replayed"
        ));
    }
    for u in &j.unfinished {
        notes.push(format!(
            "cell {} was running when the server stopped; it was not run again (the session is \
restored up to the cell before; what it did before the stop is not undone)",
            u.eval_id
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
