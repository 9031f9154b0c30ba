//! The sessions of one server: lifecycle, ownership, limits and the idle reaper, over the
//! [`Table`].

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use super::entry::{End, Phase, Session};
pub use super::journal::StateDir;
use super::report::{CloseReport, ListReport, SessionInfo};
use super::table::{Limits, Miss, Refusal, Slot, Table};
use super::warm::WarmSessions;
use crate::config::Config;
use crate::error::{ErrorKind, ToolError};
use crate::hostfs::CwdPolicy;
use crate::identity::Caller;
use crate::lang::Registry;
use crate::sandbox::Sandbox;
use crate::share::Shares;
use crate::workspace::Workspace;

/// The sessions, shared by every MCP connection.
pub struct SessionManager {
    pub(super) config: Arc<Config>,
    pub(super) registry: Arc<Registry>,
    pub(super) workspace: Arc<Workspace>,
    pub(super) sandbox: Arc<Sandbox>,
    /// Every session id this server knows.
    pub(super) table: Table,
    /// What a caller's cwd may be.
    pub(super) cwd_policy: Arc<CwdPolicy>,
    /// Where sessions are journaled (`--state-dir`).
    pub(super) state: Option<StateDir>,
    /// Every principal's share of sessions and runs (shared with `run-code`).
    pub(super) shares: Arc<Shares>,
    /// Sessions started ahead of time (`--session-pool`).
    pub(super) warm: WarmSessions,
    /// Code mode's upstream MCP servers (set once by the App).
    pub(super) upstreams: std::sync::OnceLock<Arc<crate::upstream::Upstreams>>,
}

impl SessionManager {
    /// The sessions; with a state directory (checked and locked already), its journals are
    /// read: their sessions are suspended.
    pub fn new(
        config: Arc<Config>,
        registry: Arc<Registry>,
        workspace: Arc<Workspace>,
        sandbox: Arc<Sandbox>,
        cwd_policy: Arc<CwdPolicy>,
        state: Option<StateDir>,
        shares: Arc<Shares>,
    ) -> Self {
        let warm = WarmSessions::new(
            config.session_pool,
            config.preload_modules().unwrap_or_default(),
        );
        let table = Table::new(config.max_ended_sessions, config.max_sessions);
        let me = Self {
            config,
            registry,
            workspace,
            sandbox,
            table,
            cwd_policy,
            state,
            shares,
            warm,
            upstreams: std::sync::OnceLock::new(),
        };
        me.load_journals();
        me
    }

    /// Give sessions their way to code mode's upstream MCP servers.
    pub fn set_upstreams(&self, upstreams: Arc<crate::upstream::Upstreams>) {
        let _ = self.upstreams.set(upstreams);
    }

    pub fn count(&self) -> usize {
        self.table.read(|st| st.open().count())
    }

    /// Principals that hold at least one open session.
    pub fn owners(&self) -> usize {
        self.table.read(|st| {
            st.open()
                .map(|s| &s.owner)
                .collect::<HashSet<&Caller>>()
                .len()
        })
    }

    /// The open sessions (a copy of the list: no lock held while they are used).
    pub(super) fn open_sessions(&self, of: Option<&Caller>) -> Vec<Arc<Session>> {
        self.table.read(|st| {
            st.open()
                .filter(|s| of.is_none_or(|c| s.owner == *c))
                .cloned()
                .collect()
        })
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
                me.expire_kept().await;
                me.expire_journals().await;
            }
        });
    }

    /// Close every session idle for longer than its idle timeout.
    pub async fn reap_idle(&self) {
        let expired: Vec<Arc<Session>> = self.table.read(|st| {
            st.open()
                .filter(|s| s.idle_for() > s.idle_timeout)
                .cloned()
                .collect()
        });
        for s in expired {
            let idle = s.idle_for();
            tracing::info!(session = %s.id, idle_s = idle.as_secs(), "closing idle session");
            let how = End::Reaped {
                at: SystemTime::now(),
                idle,
            };
            self.end(s, how).await;
        }
    }

    /// Take a place under the session limits for `id` (a new session, or the caller's
    /// suspended one when `restore`): the caller's own (per principal), then the server's,
    /// where the idlest session is evicted when configured to.
    pub(super) async fn admit(
        &self,
        caller: &Caller,
        id: &str,
        restore: bool,
    ) -> Result<Slot<'_>, ToolError> {
        let limits = Limits {
            max: self.config.max_sessions,
            per_principal: self.config.max_sessions_per_principal,
        };
        loop {
            match self.table.admit(caller, id, restore, &limits, &self.shares) {
                Ok(slot) => return Ok(slot),
                Err(Refusal::Principal {
                    mine,
                    starting,
                    limit,
                }) => {
                    return Err(ToolError::new(
                        ErrorKind::Limit,
                        format!(
                            "session limit reached: you already have {mine} open session(s){} and \
the limit per client is {limit} (max_sessions_per_principal). Close one you no longer need with \
session_close (session_list shows them), or reuse one with session_eval.",
                            if starting > 0 {
                                format!(" and {starting} starting")
                            } else {
                                String::new()
                            }
                        ),
                    ));
                }
                Err(Refusal::Share(e)) => return Err(e),
                Err(Refusal::NotSuspended) => return Err(self.not_restorable(caller, id)),
                Err(Refusal::Server) => {}
            }
            let idlest = self
                .open_sessions(None)
                .into_iter()
                .filter(|s| !matches!(s.phase(), Phase::Busy { .. }))
                .max_by_key(|s| s.idle_for());
            match idlest {
                Some(victim) if self.config.evict_idle => {
                    let idle = victim.idle_for();
                    tracing::info!(session = %victim.id, "evicting the idlest session");
                    let how = End::Evicted {
                        at: SystemTime::now(),
                        idle,
                    };
                    self.end(victim, how).await;
                }
                _ => return Err(ToolError::new(ErrorKind::Limit, self.limit_message(caller))),
            }
        }
    }

    fn limit_message(&self, caller: &Caller) -> String {
        let open = self.open_sessions(None);
        let mut mine: Vec<(Duration, String)> = open
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
            open.len(),
            self.config.max_sessions
        )
    }

    /// Find a session of this caller. Another principal's session is "no session", so
    /// its existence is not revealed.
    pub(super) fn lookup(&self, caller: &Caller, id: &str) -> Result<Arc<Session>, ToolError> {
        self.table
            .open(caller, id)
            .map_err(|miss| self.miss_error(id, miss))
    }

    /// The error for a call on an id that is not an open session of the caller.
    pub(super) fn miss_error(&self, id: &str, miss: Miss) -> ToolError {
        match miss {
            Miss::Unknown => ToolError::new(
                ErrorKind::UnknownSession,
                format!(
                    "no session {id:?}. Start one with session_start, or see session_list for the open ones."
                ),
            )
            .session(id),
            Miss::Starting => ToolError::new(
                ErrorKind::Busy,
                format!(
                    "session {id} is being restored by another call. Try again once that call \
has returned."
                ),
            )
            .session(id),
            Miss::Ended(how) => {
                ToolError::new(ErrorKind::EndedSession, how.message(id)).session(id)
            }
            Miss::Suspended(s) => self.suspended_error(&s),
        }
    }

    /// The error for a call on a session that has ended since it was looked up.
    pub(super) fn gone_error(&self, session: &Session) -> ToolError {
        let how = session.ended().unwrap_or(End::Closed);
        ToolError::new(ErrorKind::EndedSession, how.message(&session.id)).session(&session.id)
    }

    /// Record that a session ended (the first reason wins) and take it out of the open
    /// ones.
    pub(super) fn mark_gone(&self, session: &Session, how: End) -> bool {
        let (first, leaving) = self.table.end(session, how);
        if !leaving.0.is_empty() {
            tokio::spawn(leaving.release());
        }
        first
    }

    /// End a session for `how`: forget it, kill its tree, keep its files for a while (or
    /// remove its directory).
    async fn end(&self, session: Arc<Session>, how: End) -> Option<i32> {
        if !self.mark_gone(&session, how.clone()) {
            return None;
        }
        let exit_code = kill_session(&session).await;
        self.journal_end(&session, &how).await;
        self.retire(session).await;
        exit_code
    }

    /// Close a session: kill its interpreter's tree and remove its directory (after the
    /// files are kept a while) and its journal. A suspended session's journal is deleted.
    pub async fn close(&self, caller: &Caller, id: &str) -> Result<CloseReport, ToolError> {
        if self.discard(caller, id).await {
            return Ok(CloseReport {
                session_id: id.to_string(),
                closed: true,
                exit_code: None,
            });
        }
        let session = self.lookup(caller, id)?;
        let exit_code = self.end(session, End::Closed).await;
        Ok(CloseReport {
            session_id: id.to_string(),
            closed: true,
            exit_code,
        })
    }

    /// The language id of one of the caller's open sessions (for logs and metrics).
    pub fn language_of(&self, caller: &Caller, id: &str) -> Option<String> {
        self.table
            .open(caller, id)
            .ok()
            .map(|s| s.lang.id().to_string())
    }

    /// The caller's open sessions, and those that ended (files kept) or are suspended.
    pub fn list(&self, caller: &Caller) -> ListReport {
        let mut sessions: Vec<SessionInfo> = self
            .open_sessions(Some(caller))
            .iter()
            .map(|s| s.info())
            .collect();
        sessions.sort_by_key(|s| s.created_at);
        let mut ended = self.ended_rows(caller);
        for row in self.suspended_rows(caller) {
            // A kept session that is also restorable is one row.
            match ended.iter_mut().find(|e| e.session_id == row.session_id) {
                Some(e) => {
                    e.state = row.state;
                    e.restorable = true;
                }
                None => ended.push(row),
            }
        }
        ListReport { sessions, ended }
    }

    /// Close every session (server shutdown).
    pub async fn shutdown(&self) {
        let mut tasks = Vec::new();
        for s in self.open_sessions(None) {
            if self.mark_gone(&s, End::Closed) {
                tasks.push(tokio::spawn(finish(s)));
            }
        }
        for t in tasks {
            let _ = t.await;
        }
        self.release_kept().await;
    }
}

/// Kill a gone session's tree; then, unless a call still holds it, remove its directory and
/// return its uid.
async fn finish(session: Arc<Session>) -> Option<i32> {
    let exit_code = kill_session(&session).await;
    session.dispose().await;
    exit_code
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
