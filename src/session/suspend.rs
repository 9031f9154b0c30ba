//! Sessions that outlive the server (`--state-dir`): each session's journal is written as it
//! runs; a server that stops leaves its sessions suspended (their journals stay); the next
//! server on the same directory lists them as `suspended` (see `restore` for the way back).
//! Only session_close deletes a journal; a session reaped, evicted or exited keeps it,
//! restorable, for `--keep-journals-s`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use super::ended::EndedInfo;
use super::entry::{End, Session, unix};
use super::history::Cell;
use super::journal::{self, CellEntry, Entry, FileEntry, Journal, StartEntry, Writer};
use super::launch::StartRequest;
use super::manager::SessionManager;
use super::report::EvalStatus;
use super::table;
use crate::error::{ErrorKind, ToolError};
use crate::identity::Caller;

/// What lists need of a session's journal (the journal itself is read again when it is
/// restored or exported, so memory does not grow with journals).
#[derive(Debug, Clone)]
pub(super) struct Journaled {
    pub id: String,
    pub owner: Caller,
    pub language: String,
    pub ended: Option<(String, u64)>,
    pub modified: u64,
    /// The number of its last cell.
    pub evals: u64,
    /// Cells that succeeded (what a restore replays).
    pub ok_cells: usize,
    pub path: PathBuf,
}

impl Journaled {
    fn of(j: &Journal, path: PathBuf) -> Self {
        Self {
            id: j.session_id.clone(),
            owner: Caller {
                principal: j.owner.clone(),
            },
            language: j.request.language.clone(),
            ended: j.ended.clone(),
            modified: j.modified,
            evals: j.cells.last().map_or(0, |c| c.eval_id),
            ok_cells: j
                .cells
                .iter()
                .filter(|c| c.status == EvalStatus::Ok)
                .count(),
            path,
        }
    }

    /// How it stopped: how it ended, or `server_stopped`.
    pub fn reason(&self) -> &str {
        self.ended
            .as_ref()
            .map_or("server_stopped", |(how, _)| how.as_str())
    }

    /// Whether the first session_eval restores it by itself (not after its code exited).
    fn restores_by_itself(&self) -> bool {
        self.reason() != "exited"
    }

    fn since(&self) -> u64 {
        self.ended.as_ref().map_or(self.modified, |(_, at)| *at)
    }
}

pub(super) fn now_s() -> u64 {
    unix(SystemTime::now())
}

impl SessionManager {
    /// Read the journals of the state directory (at start): each good one is a suspended
    /// session; a corrupt one is reported, set aside and skipped; an old one is deleted.
    pub(super) fn load_journals(&self) {
        let Some(state) = &self.state else { return };
        let max = self.journal_max();
        let now = now_s();
        for id in state.journals() {
            let path = state.journal_path(&id);
            match journal::read(&path, &id, max) {
                Ok(j) => {
                    let torn = j.torn;
                    let s = Journaled::of(&j, path);
                    if now.saturating_sub(s.since()) > self.config.keep_journals_s {
                        tracing::info!(session = %id, "deleting a journal older than --keep-journals-s");
                        let _ = std::fs::remove_file(&s.path);
                        continue;
                    }
                    if torn {
                        tracing::warn!(session = %id, "the journal's last line was cut short (the server was killed while writing it); it was dropped");
                    }
                    self.table.load(s);
                }
                Err(why) => {
                    let aside = path.with_extension("journal.corrupt");
                    tracing::error!(
                        journal = %path.display(),
                        %why,
                        "corrupt session journal skipped; moved to {}",
                        aside.display()
                    );
                    let _ = std::fs::rename(&path, &aside);
                }
            }
        }
        let count = self.table.read(|st| {
            st.entries()
                .filter(|(_, e)| matches!(e, table::Entry::Suspended(_)))
                .count()
        });
        if count > 0 {
            tracing::info!(count, "suspended sessions found in the state directory");
        }
    }

    pub(super) fn journal_max(&self) -> u64 {
        self.config.journal_max_mb.saturating_mul(1 << 20)
    }

    /// The journal of a new session; a failure leaves the session unjournaled, with a note.
    pub(super) async fn create_journal(
        &self,
        id: &str,
        caller: &Caller,
        req: &StartRequest,
        notes: &mut Vec<String>,
    ) -> Option<Arc<Writer>> {
        let state = self.state.as_ref()?;
        let path = state.journal_path(id);
        let entry = Entry::Start {
            version: 1,
            session_id: id.to_string(),
            owner: caller.principal.clone(),
            created_at: now_s(),
            request: StartEntry {
                language: req.language.clone(),
                cwd: req.cwd.as_ref().map(|p| p.display().to_string()),
                venv: req.venv.as_ref().map(|p| p.display().to_string()),
                allow_domains: req.allow_domains.clone(),
                mcp_servers: req.mcp_servers.clone(),
                env: req.env.clone(),
                idle_timeout_s: req.idle_timeout_s,
                files: req
                    .files
                    .iter()
                    .map(|f| FileEntry {
                        name: f.name.clone(),
                        path: f.path.as_ref().map(|p| p.display().to_string()),
                        content: f.content.clone(),
                    })
                    .collect(),
            },
        };
        let max = self.journal_max();
        let made =
            tokio::task::spawn_blocking(move || Writer::create(&path, &entry, max.max(4096)))
                .await
                .map_err(std::io::Error::other)
                .and_then(|r| r);
        match made {
            Ok(w) => Some(Arc::new(w)),
            Err(e) => {
                tracing::error!(session = %id, error = %e, "cannot create the session's journal");
                notes.push(format!(
                    "this session is not journaled ({e}): it will not survive a restart of the server"
                ));
                None
            }
        }
    }

    /// Journal a finished cell (made durable before the call returns).
    pub(super) async fn journal_cell(
        &self,
        session: &Session,
        done: (Cell, Vec<String>, Vec<usize>, u64),
    ) {
        let Some(w) = session.journal.clone() else {
            return;
        };
        let (cell, inputs, no_enter, timeout_ms) = done;
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
        });
        let was_full = w.is_full();
        let r = tokio::task::spawn_blocking(move || w.append(&entry)).await;
        match r {
            Ok(Ok(journal::Appended::Full)) if !was_full => {
                tracing::warn!(session = %session.id, "the session's journal is full");
            }
            Ok(Err(e)) => {
                tracing::error!(session = %session.id, error = %e, "cannot write the session's journal")
            }
            _ => {}
        }
    }

    /// A session ended: session_close deletes its journal; reaped, evicted or exited, it is
    /// kept and the session becomes restorable.
    pub(super) async fn journal_end(&self, session: &Session, how: &End) {
        let Some(w) = session.journal.clone() else {
            return;
        };
        let how = how.reason();
        let id = session.id.clone();
        let max = self.journal_max();
        let read = tokio::task::spawn_blocking(move || {
            if how == "closed" {
                w.remove();
                return None;
            }
            if let Err(e) = w.append(&Entry::End {
                how: how.to_string(),
                at: now_s(),
            }) {
                tracing::error!(session = %id, error = %e, "cannot write the session's journal");
            }
            Some(journal::read(w.path(), &id, max).map(|j| (j, w.path().to_path_buf())))
        })
        .await;
        if let Ok(Some(Ok((journal, path)))) = read {
            self.table.suspend(Journaled::of(&journal, path));
            self.cap_journals(&session.owner).await;
        }
    }

    /// A principal keeps at most as many restorable journals as it may hold sessions (the
    /// server's limit when it has none): the oldest go.
    async fn cap_journals(&self, owner: &Caller) {
        let cap = match self.config.max_sessions_per_principal {
            0 => self.config.max_sessions,
            n => n,
        }
        .max(1);
        let mut mine: Vec<(u64, String)> = self.suspended_of_where(|s| s.owner == *owner);
        mine.sort();
        while mine.len() > cap {
            let (_, id) = mine.remove(0);
            if let Some(s) = self.table.unsuspend(None, &id) {
                tracing::info!(session = %id, "deleting the oldest journal of its principal");
                let _ = tokio::task::spawn_blocking(move || std::fs::remove_file(&s.path)).await;
            }
        }
    }

    /// The suspended sessions `f` accepts: (since, id).
    fn suspended_of_where(&self, f: impl Fn(&Journaled) -> bool) -> Vec<(u64, String)> {
        self.table.read(|st| {
            st.entries()
                .filter_map(|(id, e)| match e {
                    table::Entry::Suspended(s) if f(&s.journal) => {
                        Some((s.journal.since(), id.clone()))
                    }
                    _ => None,
                })
                .collect()
        })
    }

    /// Read a suspended session's journal again (off the async workers).
    pub(super) async fn read_journal(&self, s: &Journaled) -> Result<Journal, ToolError> {
        let (path, id, max) = (s.path.clone(), s.id.clone(), self.journal_max());
        tokio::task::spawn_blocking(move || journal::read(&path, &id, max))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r)
            .map_err(|why| {
                ToolError::internal(format!(
                    "the journal of session {} cannot be read any more: {why}",
                    s.id
                ))
                .session(&s.id)
            })
    }

    /// Delete a suspended session's journal (session_close on it).
    pub(super) async fn discard(&self, caller: &Caller, id: &str) -> bool {
        let Some(s) = self.table.unsuspend(Some(caller), id) else {
            return false;
        };
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_file(&s.path)).await;
        true
    }

    /// Forget journals kept longer than `--keep-journals-s`.
    pub(super) async fn expire_journals(&self) {
        let now = now_s();
        let keep = self.config.keep_journals_s;
        let old = self.suspended_of_where(|s| now.saturating_sub(s.since()) > keep);
        for (_, id) in old {
            if let Some(s) = self.table.unsuspend(None, &id) {
                let _ = tokio::task::spawn_blocking(move || std::fs::remove_file(&s.path)).await;
            }
        }
    }

    /// The caller's suspended session `id`, if any.
    pub(super) fn suspended_of(&self, caller: &Caller, id: &str) -> Option<Journaled> {
        self.table.read(|st| match st.get(id) {
            Some(table::Entry::Suspended(s)) if s.journal.owner == *caller => {
                Some(s.journal.clone())
            }
            _ => None,
        })
    }

    /// The error for a call on a suspended session.
    pub(super) fn suspended_error(&self, s: &Journaled) -> ToolError {
        let id = &s.id;
        let why = match s.reason() {
            "server_stopped" => "the server it ran in stopped".to_string(),
            "exited" => "its interpreter exited".to_string(),
            "reaped" => "it was closed for idleness".to_string(),
            other => format!("it ended ({other})"),
        };
        let auto = if s.restores_by_itself() && !self.config.no_auto_restore {
            ", or just session_eval: the first evaluation restores it"
        } else {
            ""
        };
        ToolError::new(
            ErrorKind::Suspended,
            format!(
                "session {id} is suspended: {why}. Restore it with session_restore, which starts \
its interpreter again and replays its {} cell(s) that succeeded{auto}.",
                s.ok_cells
            ),
        )
        .session(id)
    }

    /// Whether a session_eval on the caller's session `id` should restore it first.
    pub(super) fn restores_on_eval(&self, caller: &Caller, id: &str) -> bool {
        !self.config.no_auto_restore
            && self
                .suspended_of(caller, id)
                .is_some_and(|s| s.restores_by_itself())
    }

    /// The caller's suspended sessions, for `session_list`.
    pub(super) fn suspended_rows(&self, caller: &Caller) -> Vec<EndedInfo> {
        let mut rows: Vec<EndedInfo> = self.table.read(|st| {
            st.entries()
                .filter_map(|(_, e)| match e {
                    table::Entry::Suspended(s) if s.journal.owner == *caller => Some(&s.journal),
                    _ => None,
                })
                .map(|s| EndedInfo {
                    session_id: s.id.clone(),
                    language: s.language.clone(),
                    state: "suspended".into(),
                    reason: s.reason().to_string(),
                    ended_at: s.ended.as_ref().map(|(_, at)| *at),
                    files_kept_until: None,
                    evals: s.evals,
                    restorable: true,
                })
                .collect()
        });
        rows.sort_by(|a, b| a.session_id.cmp(&b.session_id));
        rows
    }
}
