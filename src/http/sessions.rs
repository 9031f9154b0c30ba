//! MCP sessions over HTTP, bounded: rmcp's `LocalSessionManager` behind a table that knows
//! each session's principal, whether a request or event stream of it is open, and when it
//! was last used. A principal holds at most `--http-max-mcp-sessions-per-principal`
//! sessions and the server `--http-max-mcp-sessions`: past either, the least recently used
//! idle session (no request, no stream) gives way (the principal's own at its cap, any at
//! the server's), and when none is idle the new one is refused with a clear error. Idle
//! sessions end after `--http-session-idle-s`, and sessions never used after their
//! `initialize` (no call, no stream) after `--http-session-unused-s`. A session holds at
//! most [`STREAMS_PER_SESSION`] standalone event streams, a principal
//! `--http-max-streams-per-principal`.
//!
//! Every session rmcp creates passes through [`McpSessions::create_session`], which admits
//! it for the principal the guard put in [`CREATING`] around the request: so a session is
//! counted from its creation, even when the client goes away before the answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use futures_core::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError,
};
use rmcp::transport::streamable_http_server::session::{
    ServerSseMessage, SessionId, SessionManager,
};

use crate::identity::Caller;

/// Standalone event streams (`GET /mcp`) one MCP session may hold open. rmcp sends a
/// session's notifications on its first stream only; a second lets a client replace a
/// stream it believes broken before the server notices.
pub(super) const STREAMS_PER_SESSION: u32 = 2;

/// The bounds, from the flags.
#[derive(Debug, Clone)]
pub(super) struct Limits {
    pub per_principal: usize,
    pub total: usize,
    pub streams_per_principal: u32,
    /// How long an idle session that was used lives, and one never used.
    pub idle: Duration,
    pub unused: Duration,
}

/// One MCP session in the table.
struct Entry {
    owner: Caller,
    /// Requests of this session being answered (event streams included).
    busy: u32,
    /// Standalone event streams open.
    streams: u32,
    /// A request other than a notification was answered, or a stream opened.
    used: bool,
    /// When it was created or last stopped being busy.
    last: Instant,
}

impl Entry {
    fn idle(&self) -> bool {
        self.busy == 0
    }
}

#[derive(Default)]
struct Table {
    entries: HashMap<SessionId, Entry>,
    /// Sessions admitted and being created, per principal and in all.
    pending: HashMap<Caller, usize>,
    pending_total: usize,
}

impl Table {
    fn held_by(&self, caller: &Caller) -> usize {
        self.entries.values().filter(|e| e.owner == *caller).count()
            + self.pending.get(caller).copied().unwrap_or(0)
    }

    fn total(&self) -> usize {
        self.entries.len() + self.pending_total
    }

    /// The least recently used idle session, of `owner` only if given.
    fn oldest_idle(&self, owner: Option<&Caller>) -> Option<SessionId> {
        self.entries
            .iter()
            .filter(|(_, e)| e.idle() && owner.is_none_or(|o| e.owner == *o))
            .min_by_key(|(_, e)| e.last)
            .map(|(id, _)| id.clone())
    }

    /// Whether `caller` may have one more session: `Ok` with the session to end first, if
    /// one must give way.
    fn admit(&self, caller: &Caller, limits: &Limits) -> Result<Option<SessionId>, Refusal> {
        if self.held_by(caller) >= limits.per_principal {
            return match self.oldest_idle(Some(caller)) {
                Some(id) => Ok(Some(id)),
                None => Err(Refusal::PrincipalSessions(limits.per_principal)),
            };
        }
        if self.total() >= limits.total {
            return match self.oldest_idle(None) {
                Some(id) => Ok(Some(id)),
                None => Err(Refusal::ServerSessions(limits.total)),
            };
        }
        Ok(None)
    }

    fn unpend(&mut self, caller: &Caller) {
        if let Some(n) = self.pending.get_mut(caller) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.pending.remove(caller);
            }
        }
        self.pending_total = self.pending_total.saturating_sub(1);
    }
}

/// Why a session or a stream is refused. Each answer names the limit and what to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    PrincipalSessions(usize),
    ServerSessions(usize),
    SessionStreams(u32),
    PrincipalStreams(u32),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::PrincipalSessions(n) => write!(
                f,
                "Too Many Requests: this token already holds {n} MCP session(s), each with a \
                 request or an event stream open (--http-max-mcp-sessions-per-principal {n}). \
                 End one it no longer uses (DELETE /mcp with its Mcp-Session-Id), or give each \
                 client a token of its own"
            ),
            Refusal::ServerSessions(n) => write!(
                f,
                "Service Unavailable: the server holds its limit of {n} MCP session(s), each \
                 with a request or an event stream open (--http-max-mcp-sessions {n}); retry \
                 later"
            ),
            Refusal::SessionStreams(n) => write!(
                f,
                "Too Many Requests: this MCP session already has {n} event stream(s) open \
                 (GET /mcp), the most one session may hold; close one before opening another"
            ),
            Refusal::PrincipalStreams(n) => write!(
                f,
                "Too Many Requests: this token already has {n} event stream(s) open (GET /mcp) \
                 across its MCP sessions (--http-max-streams-per-principal {n}); close one \
                 before opening another"
            ),
        }
    }
}

impl std::error::Error for Refusal {}

impl Refusal {
    pub(super) fn response(&self) -> Response {
        let status = match self {
            Refusal::ServerSessions(_) => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::TOO_MANY_REQUESTS,
        };
        let mut r = Response::new(Body::from(self.to_string()));
        *r.status_mut() = status;
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        h.insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        // The refused client's connection is not kept for it.
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        r
    }
}

/// What the guard knows around a request that may create an MCP session: who asks, and
/// whether [`McpSessions::create_session`] refused it.
pub(super) struct Creating {
    caller: Caller,
    refused: Mutex<Option<Refusal>>,
}

impl Creating {
    pub(super) fn new(caller: Caller) -> Arc<Self> {
        Arc::new(Self {
            caller,
            refused: Mutex::new(None),
        })
    }

    pub(super) fn refused(&self) -> Option<Refusal> {
        *lock(&self.refused)
    }
}

tokio::task_local! {
    /// Set by the guard around a request without an MCP session id: rmcp creates a session
    /// within that request's task, so its creation finds its principal here.
    pub(super) static CREATING: Arc<Creating>;
}

/// What kind of use a request with a session id makes of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Use {
    /// POST (a request, a notification or a response) or DELETE.
    Call,
    /// GET: a standalone event stream, or one resumed.
    Stream,
}

/// Why a request naming a session cannot go on.
pub(super) enum Denied {
    /// No such session, or another principal's (answered alike).
    Unknown,
    Refused(Refusal),
}

/// The sessions and their table.
pub(super) struct McpSessions {
    inner: LocalSessionManager,
    table: Mutex<Table>,
    limits: Limits,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing in these critical sections panics; a poisoned lock keeps its data usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl McpSessions {
    pub(super) fn new(limits: Limits) -> Arc<Self> {
        let mut inner = LocalSessionManager::default();
        // The idle policy is this table's: a session with a call running or a stream open
        // is never idle, whatever rmcp's worker sees.
        inner.session_config.keep_alive = None;
        Arc::new(Self {
            inner,
            table: Mutex::new(Table::default()),
            limits,
        })
    }

    /// Sessions alive now.
    pub(super) fn count(&self) -> usize {
        lock(&self.table).entries.len()
    }

    /// Whether a new session of `caller` would be refused now (checked before the request
    /// reaches rmcp, so a refusal is a clear answer rather than rmcp's error).
    pub(super) fn would_refuse(&self, caller: &Caller) -> Option<Refusal> {
        lock(&self.table).admit(caller, &self.limits).err()
    }

    /// A request of `caller` naming session `id`: counted as the session's use until the
    /// returned [`Activity`] is dropped (with the answer's body).
    pub(super) fn enter(
        self: &Arc<Self>,
        id: &str,
        caller: &Caller,
        what: Use,
    ) -> Result<Activity, Denied> {
        let mut t = lock(&self.table);
        let principal_streams = if what == Use::Stream {
            t.entries
                .values()
                .filter(|e| e.owner == *caller)
                .map(|e| e.streams)
                .sum::<u32>()
        } else {
            0
        };
        let key = match t.entries.get_key_value(id) {
            Some((key, e)) if e.owner == *caller => key.clone(),
            _ => return Err(Denied::Unknown),
        };
        let Some(e) = t.entries.get_mut(&key) else {
            return Err(Denied::Unknown);
        };
        if what == Use::Stream {
            if e.streams >= STREAMS_PER_SESSION {
                return Err(Denied::Refused(Refusal::SessionStreams(
                    STREAMS_PER_SESSION,
                )));
            }
            if principal_streams >= self.limits.streams_per_principal {
                return Err(Denied::Refused(Refusal::PrincipalStreams(
                    self.limits.streams_per_principal,
                )));
            }
            e.streams += 1;
            e.used = true;
        }
        e.busy += 1;
        Ok(Activity {
            sessions: self.clone(),
            id: key,
            stream: what == Use::Stream,
        })
    }

    /// Sessions past their life, taken out of the table.
    fn expired(&self, now: Instant) -> Vec<SessionId> {
        let mut t = lock(&self.table);
        let ids: Vec<SessionId> = t
            .entries
            .iter()
            .filter(|(_, e)| {
                let life = if e.used {
                    self.limits.idle
                } else {
                    self.limits.unused
                };
                e.idle() && now.saturating_duration_since(e.last) >= life
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in &ids {
            t.entries.remove(id);
        }
        ids
    }

    /// End the sessions past their life, every `tick`, until the task is aborted.
    pub(super) async fn reap(self: Arc<Self>) {
        let shortest = self.limits.unused.min(self.limits.idle);
        let tick = (shortest / 4).clamp(Duration::from_millis(250), Duration::from_secs(15));
        let mut interval = tokio::time::interval(tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            for id in self.expired(Instant::now()) {
                tracing::debug!(session = %id, "MCP session ended: idle");
                self.end(&id).await;
            }
        }
    }

    /// Stop rmcp's side of a session already out of the table.
    async fn end(&self, id: &SessionId) {
        if let Err(e) = self.inner.close_session(id).await {
            tracing::debug!(session = %id, "ending MCP session: {e}");
        }
    }
}

/// A request (or an event stream) of a session being answered; dropped with its body.
pub(super) struct Activity {
    sessions: Arc<McpSessions>,
    id: SessionId,
    stream: bool,
}

impl Activity {
    /// The request was one that is answered (not a notification): the session is in use.
    pub(super) fn used(&self) {
        if let Some(e) = lock(&self.sessions.table).entries.get_mut(&self.id) {
            e.used = true;
        }
    }
}

impl Drop for Activity {
    fn drop(&mut self) {
        if let Some(e) = lock(&self.sessions.table).entries.get_mut(&self.id) {
            e.busy = e.busy.saturating_sub(1);
            if self.stream {
                e.streams = e.streams.saturating_sub(1);
            }
            e.last = Instant::now();
        }
    }
}

/// A session admitted and being created: counted until it is in the table, or no longer
/// if its creation fails or is dropped.
struct Reservation<'a> {
    table: &'a Mutex<Table>,
    caller: Caller,
    done: bool,
}

impl Reservation<'_> {
    fn commit(mut self, id: SessionId) {
        let mut t = lock(self.table);
        t.unpend(&self.caller);
        t.entries.insert(
            id,
            Entry {
                owner: self.caller.clone(),
                busy: 0,
                streams: 0,
                used: false,
                last: Instant::now(),
            },
        );
        self.done = true;
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.done {
            lock(self.table).unpend(&self.caller);
        }
    }
}

#[derive(Debug)]
pub(super) enum Error {
    Local(LocalSessionManagerError),
    Refused(Refusal),
    /// A session creation outside a request the guard admitted (none is).
    NoCaller,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Local(e) => e.fmt(f),
            Error::Refused(r) => r.fmt(f),
            Error::NoCaller => {
                f.write_str("an MCP session is created only for an admitted request")
            }
        }
    }
}

impl std::error::Error for Error {}

impl From<LocalSessionManagerError> for Error {
    fn from(e: LocalSessionManagerError) -> Self {
        Error::Local(e)
    }
}

impl SessionManager for McpSessions {
    type Error = Error;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let creating = CREATING
            .try_with(|c| c.clone())
            .map_err(|_| Error::NoCaller)?;
        let caller = creating.caller.clone();
        let (reservation, evict) = {
            let mut t = lock(&self.table);
            let evict = match t.admit(&caller, &self.limits) {
                Ok(evict) => evict,
                Err(refusal) => {
                    *lock(&creating.refused) = Some(refusal);
                    return Err(Error::Refused(refusal));
                }
            };
            if let Some(id) = &evict {
                t.entries.remove(id);
            }
            *t.pending.entry(caller.clone()).or_default() += 1;
            t.pending_total += 1;
            let r = Reservation {
                table: &self.table,
                caller: caller.clone(),
                done: false,
            };
            (r, evict)
        };
        if let Some(id) = evict {
            tracing::debug!(
                principal = %caller.principal,
                session = %id,
                "MCP session limit reached: the least recently used idle MCP session ends"
            );
            self.end(&id).await;
        }
        let (id, transport) = self.inner.create_session().await?;
        reservation.commit(id.clone());
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        Ok(self.inner.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.inner.has_session(id).await?)
    }

    /// DELETE, or rmcp ending a session whose service stopped.
    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        lock(&self.table).entries.remove(id);
        Ok(self.inner.close_session(id).await?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.create_stream(id, message).await?)
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        Ok(self.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.create_standalone_stream(id).await?)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.inner.resume(id, last_event_id).await?)
    }
}

#[cfg(test)]
mod tests;
