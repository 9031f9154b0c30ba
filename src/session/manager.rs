//! The table of sessions: lifecycle, ownership, limits and the idle reaper.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use dashmap::DashMap;

use super::ended::Kept;
use super::entry::{Gone, Session, lock};
pub use super::journal::StateDir;
use super::recent::Recent;
use super::report::{CloseReport, ListReport, SessionInfo};
use super::suspend::Suspended;
use super::warm::WarmSessions;
use crate::config::Config;
use crate::error::{ErrorKind, ToolError};
use crate::hostfs::CwdPolicy;
use crate::identity::Caller;
use crate::lang::Registry;
use crate::sandbox::Sandbox;
use crate::share::{Share, Shares, Use};
use crate::workspace::Workspace;

/// Sessions being started, per principal: they count against the limits.
type Starting = Mutex<HashMap<Caller, usize>>;

/// A place under the session limits, held while a session starts.
pub(super) struct Slot<'a> {
    starting: &'a Starting,
    caller: Caller,
    /// The caller's share, handed to the session once it runs.
    share: Option<Share>,
}

impl Slot<'_> {
    /// The share this slot holds, for the session to hold until it ends.
    pub(super) fn share(&mut self) -> Option<Share> {
        self.share.take()
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut m = lock(self.starting);
        if let Some(n) = m.get_mut(&self.caller) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.caller);
            }
        }
    }
}

/// The table of sessions, shared by every MCP connection.
pub struct SessionManager {
    pub(super) config: Arc<Config>,
    pub(super) registry: Arc<Registry>,
    pub(super) workspace: Arc<Workspace>,
    pub(super) sandbox: Arc<Sandbox>,
    pub(super) sessions: DashMap<String, Arc<Session>>,
    /// Sessions that ended, so a later call can say how (`--max-ended-sessions`, the
    /// oldest forgotten first). A std lock: no guard of it is held across an await or
    /// another lock.
    pub(super) ended: Mutex<Recent<(Caller, Gone)>>,
    pub(super) starting: Starting,
    /// What a caller's cwd may be.
    pub(super) cwd_policy: Arc<CwdPolicy>,
    /// Ended sessions whose files and history are kept for a while.
    pub(super) kept: DashMap<String, Arc<Kept>>,
    /// Where sessions are journaled (`--state-dir`).
    pub(super) state: Option<StateDir>,
    /// Sessions a journal can start again.
    pub(super) suspended: DashMap<String, Suspended>,
    /// Every principal's share of sessions and runs (shared with `run-code`).
    pub(super) shares: Arc<Shares>,
    /// Sessions started ahead of time (`--session-pool`).
    pub(super) warm: WarmSessions,
    /// Code mode's upstream MCP servers (set once by the App).
    pub(super) upstreams: std::sync::OnceLock<Arc<crate::upstream::Upstreams>>,
}

impl SessionManager {
    /// The table; with a state directory (checked and locked already), its journals are
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
        let ended = Mutex::new(Recent::new(config.max_ended_sessions));
        let me = Self {
            config,
            registry,
            workspace,
            sandbox,
            sessions: DashMap::new(),
            ended,
            starting: Mutex::new(HashMap::new()),
            cwd_policy,
            kept: DashMap::new(),
            state,
            suspended: DashMap::new(),
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
        self.sessions.len()
    }

    /// Principals that hold at least one open session.
    pub fn owners(&self) -> usize {
        let owners: HashSet<Caller> = self.sessions.iter().map(|s| s.owner.clone()).collect();
        owners.len()
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
        let expired: Vec<Arc<Session>> = self
            .sessions
            .iter()
            .filter(|s| s.idle_for() > s.idle_timeout)
            .map(|s| s.clone())
            .collect();
        for s in expired {
            let idle = s.idle_for();
            tracing::info!(session = %s.id, idle_s = idle.as_secs(), "closing idle session");
            self.end(
                s,
                Gone::Reaped {
                    at: SystemTime::now(),
                    idle,
                },
            )
            .await;
        }
    }

    /// Take a place under the session limits: the caller's own (per principal), then the
    /// server's, where the idlest session is evicted when configured to.
    pub(super) async fn admit(&self, caller: &Caller) -> Result<Slot<'_>, ToolError> {
        loop {
            {
                let mut starting = lock(&self.starting);
                let mine_starting = starting.get(caller).copied().unwrap_or(0);
                let limit = self.config.max_sessions_per_principal;
                if limit > 0 {
                    let mine = self.sessions.iter().filter(|s| s.owner == *caller).count();
                    if mine + mine_starting >= limit {
                        return Err(ToolError::new(
                            ErrorKind::Limit,
                            format!(
                                "session limit reached: you already have {mine} open session(s){} and \
the limit per client is {limit} (max_sessions_per_principal). Close one you no longer need with \
session_close (session_list shows them), or reuse one with session_eval.",
                                if mine_starting > 0 {
                                    format!(" and {mine_starting} starting")
                                } else {
                                    String::new()
                                }
                            ),
                        ));
                    }
                }
                let all_starting: usize = starting.values().sum();
                if self.sessions.len() + all_starting < self.config.max_sessions {
                    // Sessions and runs together, after the sessions' own limit, whose
                    // message is the more useful one when both are reached.
                    let share = self.shares.take(caller, Use::Session)?;
                    *starting.entry(caller.clone()).or_insert(0) += 1;
                    return Ok(Slot {
                        starting: &self.starting,
                        caller: caller.clone(),
                        share: Some(share),
                    });
                }
            }
            let idlest = self
                .sessions
                .iter()
                .filter(|s| lock(&s.busy).is_none())
                .max_by_key(|s| s.idle_for())
                .map(|s| s.clone());
            match idlest {
                Some(victim) if self.config.evict_idle => {
                    let idle = victim.idle_for();
                    tracing::info!(session = %victim.id, "evicting the idlest session");
                    self.end(
                        victim,
                        Gone::Evicted {
                            at: SystemTime::now(),
                            idle,
                        },
                    )
                    .await;
                }
                _ => return Err(ToolError::new(ErrorKind::Limit, self.limit_message(caller))),
            }
        }
    }

    fn limit_message(&self, caller: &Caller) -> String {
        let mut mine: Vec<(Duration, String)> = self
            .sessions
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
            self.sessions.len(),
            self.config.max_sessions
        )
    }

    /// Find a session of this caller. Another principal's session is "no session", so
    /// its existence is not revealed.
    pub(super) fn lookup(&self, caller: &Caller, id: &str) -> Result<Arc<Session>, ToolError> {
        let unknown = || {
            ToolError::new(
                ErrorKind::UnknownSession,
                format!(
                    "no session {id:?}. Start one with session_start, or see session_list for the open ones."
                ),
            )
            .session(id)
        };
        if let Some(s) = self.sessions.get(id) {
            if s.owner != *caller {
                return Err(unknown());
            }
            return Ok(s.clone());
        }
        if let Some(s) = self.suspended_of(caller, id) {
            return Err(self.suspended_error(&s));
        }
        let ended = lock(&self.ended).get(id).cloned();
        match ended {
            Some((owner, how)) if owner == *caller => {
                Err(ToolError::new(ErrorKind::EndedSession, how.message(id)).session(id))
            }
            _ => Err(unknown()),
        }
    }

    /// The error for a call on a session that has ended since it was looked up.
    pub(super) fn gone_error(&self, session: &Session) -> ToolError {
        let how = lock(&session.gone).clone().unwrap_or(Gone::Closed);
        ToolError::new(ErrorKind::EndedSession, how.message(&session.id)).session(&session.id)
    }

    /// Record that a session is gone (the first reason wins) and drop it from the table.
    pub(super) fn mark_gone(&self, session: &Session, how: Gone) -> bool {
        {
            let mut g = lock(&session.gone);
            if g.is_some() {
                return false;
            }
            *g = Some(how.clone());
        }
        self.sessions.remove(&session.id);
        // Its share goes back with its place in the table: what it keeps after it ended
        // (files, their uid) is reclaimed when a uid is needed.
        drop(lock(&session.share).take());
        // Bounded memory of ended sessions, the oldest forgotten first.
        lock(&self.ended).insert(session.id.clone(), (session.owner.clone(), how));
        true
    }

    /// End a session for `how`: forget it, kill its tree, keep its files for a while (or
    /// remove its directory).
    async fn end(&self, session: Arc<Session>, how: Gone) -> Option<i32> {
        if !self.mark_gone(&session, how.clone()) {
            return None;
        }
        let exit_code = kill_session(&session).await;
        self.journal_end(&session, &how).await;
        self.retire(session, how).await;
        exit_code
    }

    /// Close a session: kill its interpreter's tree and remove its directory (after the
    /// files are kept a while) and its journal. A suspended session's journal is deleted.
    pub async fn close(&self, caller: &Caller, id: &str) -> Result<CloseReport, ToolError> {
        if !self.sessions.contains_key(id) && self.discard(caller, id).await {
            return Ok(CloseReport {
                session_id: id.to_string(),
                closed: true,
                exit_code: None,
            });
        }
        let session = self.lookup(caller, id)?;
        let exit_code = self.end(session, Gone::Closed).await;
        Ok(CloseReport {
            session_id: id.to_string(),
            closed: true,
            exit_code,
        })
    }

    /// The language id of one of the caller's open sessions (for logs and metrics).
    pub fn language_of(&self, caller: &Caller, id: &str) -> Option<String> {
        self.sessions
            .get(id)
            .filter(|s| s.owner == *caller)
            .map(|s| s.lang.id().to_string())
    }

    /// The caller's open sessions, and those that ended (files kept) or are suspended.
    pub fn list(&self, caller: &Caller) -> ListReport {
        let mut sessions: Vec<SessionInfo> = self
            .sessions
            .iter()
            .filter(|s| s.owner == *caller)
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
        let all: Vec<Arc<Session>> = self.sessions.iter().map(|s| s.clone()).collect();
        let mut tasks = Vec::new();
        for s in all {
            if self.mark_gone(&s, Gone::Closed) {
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
