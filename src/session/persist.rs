//! Sessions that outlive the server (`--state-dir`): each session's journal is written as it
//! runs; a server that stops leaves its sessions suspended (their journals stay); the next
//! server on the same directory lists them as `suspended` (see `restore` for the way back).
//! Only session_close deletes a journal; a session reaped, evicted or exited keeps it,
//! restorable, for `--keep-journals-s`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use super::journal::{
    self, Claim, Entry, FileEntry, Journal, Journaled, StartEntry, StateDir, Writer,
};
use super::launch::StartRequest;
use super::live::{End, Session, unix};
use super::report::EndedInfo;
use super::table::{self, Table};
use crate::config::Config;
use crate::error::{ErrorKind, ToolError};
use crate::identity::Caller;

pub(super) fn now_s() -> u64 {
    unix(SystemTime::now())
}

/// The journals of the state directory, and the suspended sessions they make.
pub(super) struct Journals {
    config: Arc<Config>,
    /// Where sessions are journaled (`--state-dir`).
    state: Option<StateDir>,
}

impl Journals {
    pub(super) fn new(config: Arc<Config>, state: Option<StateDir>) -> Self {
        Self { config, state }
    }

    /// Read the journals of the state directory (at start): each good one is a suspended
    /// session of `table`; a corrupt one is reported, set aside and skipped; an old one is
    /// deleted.
    pub(super) fn load(&self, table: &Table) {
        let Some(state) = &self.state else { return };
        let max = self.max();
        let now = now_s();
        let mut count = 0;
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
                    table.load(s);
                    count += 1;
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
        if count > 0 {
            tracing::info!(count, "suspended sessions found in the state directory");
        }
    }

    /// Where session `id`'s journal is written here (with `--state-dir`).
    pub(super) fn path_of(&self, id: &str) -> Option<PathBuf> {
        self.state.as_ref().map(|s| s.journal_path(id))
    }

    /// The most bytes of one journal (`--journal-max-mb`).
    pub(super) fn max(&self) -> u64 {
        self.config.journal_max_mb.saturating_mul(1 << 20)
    }

    /// The journal of a new session; a failure leaves the session unjournaled, with a note.
    pub(super) async fn create(
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
                packages: req.packages.clone(),
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
        let max = self.max();
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

    /// A suspended session's journal, to be written again by the session restored from it
    /// (its `restored` line appended).
    /// Cluster: it is written under `claim`.
    pub(super) async fn reopen(
        &self,
        s: &Journaled,
        full: bool,
        claim: Option<Claim>,
    ) -> Result<Writer, ToolError> {
        let (path, max) = (s.path.clone(), self.max());
        let id = s.id.clone();
        let written = tokio::task::spawn_blocking(move || -> std::io::Result<_> {
            let w = Writer::reopen(&path, max, full)?;
            if let Some(c) = claim {
                w.resume_claim(c);
            }
            let appended = w.append(&Entry::Restored {
                at: now_s(),
                generation: 0,
            })?;
            Ok((w, appended))
        })
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r)
        .map_err(|e| ToolError::internal(format!("cannot write the session's journal: {e}")))?;
        match written {
            (_, journal::Appended::Sealed) => Err(ToolError::new(
                ErrorKind::Unavailable,
                format!(
                    "session {id} may have been taken over by another server of this cluster: \
this one lost contact with its cluster registry. Try again in a few seconds."
                ),
            )
            .session(&id)),
            (w, _) => Ok(w),
        }
    }

    /// A session ended: session_close deletes its journal; reaped, evicted or exited, it is
    /// kept and the session becomes restorable.
    pub(super) async fn end(&self, table: &Table, session: &Session, how: &End) {
        let Some(w) = session.journal.clone() else {
            return;
        };
        let how = how.reason();
        let id = session.id.clone();
        let max = self.max();
        let read = tokio::task::spawn_blocking(move || {
            if how == "closed" {
                w.remove();
                return None;
            }
            if let Err(e) = w.append(&Entry::End {
                how: how.to_string(),
                at: now_s(),
                generation: 0,
            }) {
                tracing::error!(session = %id, error = %e, "cannot write the session's journal");
            }
            Some(journal::read(w.path(), &id, max).map(|j| (j, w.path().to_path_buf())))
        })
        .await;
        if let Ok(Some(Ok((journal, path)))) = read {
            table.suspend(Journaled::of(&journal, path));
            self.cap(table, &session.owner).await;
        }
    }

    /// A principal keeps at most as many restorable journals as it may hold sessions (the
    /// server's limit when it has none): the oldest go.
    async fn cap(&self, table: &Table, owner: &Caller) {
        let cap = match self.config.max_sessions_per_principal {
            0 => self.config.max_sessions,
            n => n,
        }
        .max(1);
        let mut mine = suspended_where(table, |s| s.owner == *owner);
        mine.sort();
        while mine.len() > cap {
            let (_, id) = mine.remove(0);
            if let Some(s) = table.unsuspend(None, &id) {
                tracing::info!(session = %id, "deleting the oldest journal of its principal");
                remove(s.path).await;
            }
        }
    }

    /// Read a suspended session's journal again (off the async workers).
    pub(super) async fn read(&self, s: &Journaled) -> Result<Journal, ToolError> {
        let (path, id, max) = (s.path.clone(), s.id.clone(), self.max());
        let why = match tokio::task::spawn_blocking(move || journal::read(&path, &id, max)).await {
            Ok(Ok(j)) => return Ok(j),
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        Err(ToolError::internal(format!(
            "the journal of session {} cannot be read any more: {why}",
            s.id
        ))
        .session(&s.id))
    }

    /// Delete the caller's suspended session's journal (session_close on it).
    pub(super) async fn discard(&self, table: &Table, caller: &Caller, id: &str) -> bool {
        let Some(s) = table.unsuspend(Some(caller), id) else {
            return false;
        };
        remove(s.path).await;
        true
    }

    /// Forget journals kept longer than `--keep-journals-s`.
    pub(super) async fn expire(&self, table: &Table) {
        let now = now_s();
        let keep = self.config.keep_journals_s;
        for (_, id) in suspended_where(table, |s| now.saturating_sub(s.since()) > keep) {
            if let Some(s) = table.unsuspend(None, &id) {
                remove(s.path).await;
            }
        }
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
    pub(super) fn restores_on_eval(&self, table: &Table, caller: &Caller, id: &str) -> bool {
        !self.config.no_auto_restore
            && table
                .suspended(caller, id)
                .is_some_and(|s| s.restores_by_itself())
    }
}

/// The suspended sessions of `table` that `f` accepts: (since, id).
fn suspended_where(table: &Table, f: impl Fn(&Journaled) -> bool) -> Vec<(u64, String)> {
    table.read(|st| {
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

/// The caller's suspended sessions, for `session_list`.
pub(super) fn suspended_rows(table: &Table, caller: &Caller) -> Vec<EndedInfo> {
    let mut rows: Vec<EndedInfo> = table.read(|st| {
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

/// Delete a journal file (off the async workers).
async fn remove(path: PathBuf) {
    let _ = tokio::task::spawn_blocking(move || std::fs::remove_file(&path)).await;
}
