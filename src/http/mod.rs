//! MCP over streamable HTTP: rmcp's `StreamableHttpService` at `/mcp` on axum, behind a
//! guard that checks Host and Origin, authenticates the bearer token, counts the
//! connection in its principal's share, binds every MCP session id to the principal that
//! created it, bounds how long a request body may take, and counts requests in flight;
//! plus `GET /healthz`, `GET /metrics` and a draining shutdown. Connections are accepted
//! and served by `listener` (a cap on open connections, a share per principal, places
//! past the cap for the probes, a header read timeout); MCP sessions are kept by `sessions`
//! (caps per principal and per server, idle and unused lives, event streams per session
//! and per principal). Only transport lives here: ownership of REPL sessions and their
//! limits are the session manager's.
//!
//! How the principal reaches the tools: the guard puts the authenticated [`Caller`] in
//! the request's extensions; rmcp hands each request's `http::request::Parts` (with those
//! extensions) to the handler, and `ReplboxServer::per_request` reads the caller from
//! there on every call. So the principal is per request, never per MCP session, and the
//! stateless 2026-07-28 path (no MCP session at all) works the same way.

mod auth;
mod listener;
mod policy;
mod sessions;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::get;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::app::{App, InFlight, InFlightGuard};
use crate::config::HttpConfig;
use crate::identity::Caller;
use crate::mcp::ReplboxServer;
use auth::{Presented, Tokens};
use policy::{HostPolicy, OriginPolicy, check_tokenless, is_loopback, loopback_origins};
use sessions::{Activity, CREATING, Creating, Denied, McpSessions, Use};

const SESSION_HEADER: &str = "mcp-session-id";
const REALM: &str = "replbox";

/// State shared by the guard, `/healthz` and shutdown.
struct Shared {
    app: Arc<App>,
    tokens: Tokens,
    hosts: HostPolicy,
    origins: OriginPolicy,
    /// The MCP sessions, each with the principal whose `initialize` created it.
    mcp: Arc<McpSessions>,
    /// POSTs to /mcp whose response has not been sent completely.
    requests: InFlight,
    draining: AtomicBool,
    started: Instant,
    /// Connections served at once, and how long a request may take to arrive.
    limits: listener::Limits,
}

/// Serve MCP over streamable HTTP on `addr` until `terminate` completes, then drain and
/// stop everything the server started.
pub async fn serve(
    app: Arc<App>,
    cfg: &HttpConfig,
    addr: &str,
    terminate: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let (tokens, addr, hosts) = checked(&app, cfg, addr).await?;
    let (listener, local, allowed_origins, origins) = bind(cfg, addr).await?;

    let mcp_ct = CancellationToken::new();
    let shared = shared_state(&app, cfg, tokens, hosts, origins);
    let router = router(&shared, cfg, &allowed_origins, mcp_ct.child_token());

    let stop_accepting = CancellationToken::new();
    let admits = {
        let shared = shared.clone();
        Arc::new(move |h: &HeaderMap| carries_principal(&shared.tokens, h)) as listener::Admits
    };
    let mut server = tokio::spawn(listener::serve(
        listener,
        router,
        shared.limits.clone(),
        admits,
        stop_accepting.clone(),
    ));
    announce(&shared.tokens, local, cfg);
    app.start_background();
    let pruner = tokio::spawn(shared.mcp.clone().reap());

    tokio::select! {
        _ = terminate => {}
        ended = &mut server => {
            // The server stopped by itself: its task failed.
            pruner.abort();
            mcp_ct.cancel();
            app.shutdown().await;
            ended?;
            anyhow::bail!("the HTTP server stopped unexpectedly");
        }
    }
    shut_down(&shared, cfg, &stop_accepting, &mcp_ct, pruner, server).await;
    Ok(())
}

/// The tokens, the address and the Host policy, each checked before binding, so that a
/// refused configuration stops the server before it listens.
async fn checked(
    app: &App,
    cfg: &HttpConfig,
    addr: &str,
) -> anyhow::Result<(Tokens, SocketAddr, HostPolicy)> {
    let tokens = Tokens::load(&cfg.tokens, cfg.tokens_file.as_deref())?;
    let addr = resolve(addr).await?;
    if tokens.is_empty() && !is_loopback(addr.ip()) {
        anyhow::bail!(
            "refusing to serve on {addr} without a token: anyone who can reach it could run code \
             as this user. Give tokens with --token, REPLBOX_TOKENS or --tokens-file, or bind a \
             loopback address such as 127.0.0.1:{}",
            addr.port()
        );
    }
    if tokens.is_empty() {
        check_tokenless(app.sandbox.level, app.sandbox.egress.is_some())?;
    }
    let hosts = HostPolicy::new(&cfg.allowed_hosts, addr.ip())?;
    // Checked before binding, so a bad list stops the server before it listens.
    OriginPolicy::new(&cfg.allowed_origins)?;
    Ok((tokens, addr, hosts))
}

/// The bound listener, its address, and the allowed origins as a list and as a policy.
async fn bind(
    cfg: &HttpConfig,
    addr: SocketAddr,
) -> anyhow::Result<(
    tokio::net::TcpListener,
    SocketAddr,
    Vec<String>,
    OriginPolicy,
)> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr()?;
    // The operator's origins, and this listener's own when it is on loopback (known once
    // bound, for port 0).
    let allowed_origins: Vec<String> = cfg
        .allowed_origins
        .iter()
        .cloned()
        .chain(loopback_origins(local))
        .collect();
    let origins = OriginPolicy::new(&allowed_origins)?;
    Ok((listener, local, allowed_origins, origins))
}

/// The state shared by the guard, `/healthz` and shutdown, with the limits from the flags.
fn shared_state(
    app: &Arc<App>,
    cfg: &HttpConfig,
    tokens: Tokens,
    hosts: HostPolicy,
    origins: OriginPolicy,
) -> Arc<Shared> {
    let max_connections = usize::try_from(cfg.http_max_connections).unwrap_or(usize::MAX);
    let share = connection_share(cfg, max_connections, tokens.principals());
    Arc::new(Shared {
        app: app.clone(),
        mcp: McpSessions::new(session_limits(cfg)),
        tokens,
        hosts,
        origins,
        requests: InFlight::default(),
        draining: AtomicBool::new(false),
        started: Instant::now(),
        limits: listener::Limits::new(
            Duration::from_millis(cfg.http_read_timeout_ms),
            max_connections,
            share,
        ),
    })
}

/// After `terminate`: drain, stop the app, then give the server task a bounded time to
/// close its connections.
async fn shut_down(
    shared: &Shared,
    cfg: &HttpConfig,
    stop_accepting: &CancellationToken,
    mcp_ct: &CancellationToken,
    pruner: tokio::task::JoinHandle<()>,
    mut server: tokio::task::JoinHandle<()>,
) {
    let t0 = Instant::now();
    drain(shared, cfg, stop_accepting, mcp_ct).await;
    pruner.abort();
    shared.app.shutdown().await;
    match tokio::time::timeout(Duration::from_secs(3), &mut server).await {
        Ok(Err(e)) => tracing::warn!("HTTP server: {e}"),
        Ok(Ok(())) => {}
        Err(_) => {
            tracing::warn!("connections still open after shutdown; closing them");
            server.abort();
        }
    }
    tracing::info!(
        elapsed_ms = t0.elapsed().as_millis() as u64,
        "shut down: all sessions closed"
    );
}

/// `/mcp` (rmcp's service, one handler per MCP session, behind the guard) and `/healthz`.
fn router(
    shared: &Arc<Shared>,
    cfg: &HttpConfig,
    origins: &[String],
    cancel: CancellationToken,
) -> Router {
    // One handler built here; each MCP session gets a copy sharing its tools.
    let handler = ReplboxServer::per_request(shared.app.clone());
    let service = StreamableHttpService::new(
        move || Ok(handler.for_session()),
        shared.mcp.clone(),
        rmcp_config(cfg, &shared.hosts, origins, cancel),
    );
    Router::new()
        .route_service("/mcp", service)
        .route_layer(axum::middleware::from_fn_with_state(shared.clone(), guard))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .with_state(shared.clone())
}

/// The MCP session limits, from the flags.
fn session_limits(cfg: &HttpConfig) -> sessions::Limits {
    let n = |v: u64| usize::try_from(v).unwrap_or(usize::MAX).max(1);
    sessions::Limits {
        per_principal: n(cfg.http_max_mcp_sessions_per_principal),
        total: n(cfg.http_max_mcp_sessions),
        streams_per_principal: u32::try_from(cfg.http_max_streams_per_principal)
            .unwrap_or(u32::MAX)
            .max(1),
        idle: Duration::from_secs(cfg.http_session_idle_s),
        unused: Duration::from_secs(cfg.http_session_unused_s),
    }
}

/// Connections one principal may hold: the flag, else a quarter of the cap (all of it when
/// there is one principal, nobody to share with).
fn connection_share(cfg: &HttpConfig, max: usize, principals: usize) -> usize {
    match cfg.http_max_connections_per_principal {
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        None if principals > 1 => max / 4,
        None => max,
    }
    .clamp(1, max.max(1))
}

/// rmcp's side of the transport: cancelled with `cancel`, the body size limit, and the same
/// Host and Origin lists as the guard, which checks them first.
fn rmcp_config(
    cfg: &HttpConfig,
    hosts: &HostPolicy,
    origins: &[String],
    cancel: CancellationToken,
) -> StreamableHttpServerConfig {
    let mut c = StreamableHttpServerConfig::default()
        .with_cancellation_token(cancel)
        .with_max_request_body_bytes(cfg.http_max_body);
    c = match hosts {
        HostPolicy::Any => c.disable_allowed_hosts(),
        HostPolicy::List { raw, .. } => c.with_allowed_hosts(raw.clone()),
    };
    // Enforced even when the list is empty: then every request with an Origin is refused.
    c.with_allowed_origins(origins.to_vec())
        .enforce_origin_validation()
}

/// Say where the server listens and who can reach it.
fn announce(tokens: &Tokens, local: SocketAddr, cfg: &HttpConfig) {
    if tokens.is_empty() {
        tracing::warn!(
            "no token configured: every local user and process that can reach {local} can run \
             code as this user (all as principal \"local\"); give --token or --tokens-file on a \
             shared host"
        );
    } else {
        tracing::info!(
            principals = tokens.principals(),
            "bearer-token authentication on"
        );
    }
    if local.ip().is_unspecified() && cfg.allowed_hosts.is_empty() {
        tracing::warn!(
            "listening on every interface, but only loopback Host headers are accepted: give \
             the names clients use with --allowed-host (or REPLBOX_ALLOWED_HOSTS)"
        );
    }
    tracing::info!("listening on http://{local}/mcp");
}

/// Drain: refuse new work, stop accepting connections, let calls in flight finish (bounded
/// by `--drain-timeout-ms`), then cancel the MCP sessions and give the cancelled calls a
/// moment to stop their children.
async fn drain(
    shared: &Shared,
    cfg: &HttpConfig,
    stop_accepting: &CancellationToken,
    mcp_ct: &CancellationToken,
) {
    let t0 = Instant::now();
    shared.draining.store(true, Ordering::SeqCst);
    stop_accepting.cancel();
    let app = &shared.app;
    let deadline = t0 + Duration::from_millis(cfg.drain_timeout_ms);
    let busy = || shared.requests.get() + app.calls.get();
    tracing::info!(
        in_flight = busy(),
        "shutting down: draining calls in flight"
    );
    while busy() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if busy() > 0 {
        tracing::warn!(
            calls = app.calls.get(),
            "drain timeout ({} ms): cancelling the calls still running",
            cfg.drain_timeout_ms
        );
    }
    mcp_ct.cancel();
    // Cancelled calls stop their children; give them a moment to return.
    let cancel_deadline = Instant::now() + Duration::from_secs(3);
    while app.calls.get() > 0 && Instant::now() < cancel_deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `host:port` or `ip:port`; a name is resolved and its first address used.
async fn resolve(addr: &str) -> anyhow::Result<SocketAddr> {
    if let Ok(a) = addr.parse::<SocketAddr>() {
        return Ok(a);
    }
    tokio::net::lookup_host(addr)
        .await
        .map_err(|e| {
            anyhow::anyhow!("--http {addr}: {e} (expected HOST:PORT, e.g. 127.0.0.1:8765)")
        })?
        .next()
        .ok_or_else(|| anyhow::anyhow!("--http {addr}: the name has no address"))
}

fn plain(status: StatusCode, text: &'static str) -> Response {
    plain_owned(status, text.to_string())
}

fn plain_owned(status: StatusCode, text: String) -> Response {
    let mut r = Response::new(Body::from(text));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// What the challenge and the 401 body say, so that a client (or the person configuring
/// it) looks for a token and does not start an OAuth flow this server cannot finish.
const STATIC_TOKEN: &str = "this server takes a static bearer token from its operator \
(Authorization: Bearer <token>); it has no OAuth authorization server";

fn unauthorized(error: Option<&'static str>) -> Response {
    let (challenge, text) = match error {
        None => (
            format!("Bearer realm=\"{REALM}\", error_description=\"{STATIC_TOKEN}\""),
            "Unauthorized: send Authorization: Bearer <token>, a static token from the \
             server's operator (no OAuth)",
        ),
        Some(e) => (
            format!(
                "Bearer realm=\"{REALM}\", error=\"{e}\", error_description=\"{STATIC_TOKEN}\""
            ),
            "Unauthorized: the token is not valid; ask the server's operator for a static \
             bearer token (no OAuth)",
        ),
    };
    let mut r = plain(StatusCode::UNAUTHORIZED, text);
    if let Ok(v) = HeaderValue::from_str(&challenge) {
        r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    r
}

/// rmcp's own answer for an unknown session: a session of another principal gets exactly
/// this, so its existence is not revealed.
fn unknown_session() -> Response {
    plain(StatusCode::NOT_FOUND, "Not Found: Session not found")
}

/// In front of `/mcp`: Host, Origin, token, the connection's share, MCP session ownership
/// and use (the caps on sessions and streams), in-flight count.
async fn guard(State(s): State<Arc<Shared>>, mut req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let (caller, session) = match admit(&s, req.headers(), &method) {
        Ok(admitted) => admitted,
        Err(refused) => return refused.response(),
    };
    tracing::debug!(principal = %caller.principal, %method, "MCP request");
    req.extensions_mut().insert(caller.clone());
    let counting = (method == Method::POST).then(|| s.requests.enter());
    // The body must arrive in time too: a half-sent one would otherwise hold its
    // connection (and its slot) for as long as the client likes.
    let read_timeout = s.limits.read_timeout;
    let req = req.map(|body| Body::new(Deadline::new(body, read_timeout)));
    let (response, activity) = match session {
        Some(activity) => {
            let response = next.run(req).await;
            if response.status() == StatusCode::OK {
                activity.used();
            }
            (response, Some(activity))
        }
        // Without a session id a POST may create one: rmcp does it within this task, where
        // the session's creation finds its principal (and may refuse it).
        None => {
            let creating = Creating::new(caller);
            let response = CREATING.scope(creating.clone(), next.run(req)).await;
            if let Some(refusal) = creating.refused() {
                return refusal.response();
            }
            (response, None)
        }
    };
    // Ending a session answers 204 (rmcp says 202, which clients count as a failure).
    let response = if method == Method::DELETE && response.status() == StatusCode::ACCEPTED {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::NO_CONTENT;
        r
    } else {
        response
    };
    if counting.is_none() && activity.is_none() {
        return response;
    }
    // Counted until the response body (an SSE stream for a call, or a GET's stream) is
    // finished.
    response.map(|inner| {
        Body::new(Tracked {
            inner,
            _guards: (counting, activity),
        })
    })
}

/// Why the guard refuses a request.
enum Refused {
    Draining,
    Host,
    Origin,
    /// No valid token; the `error` of the challenge, if any.
    Unauthorized(Option<&'static str>),
    /// The principal holds its share of connections with others.
    Share(usize),
    /// A session id that does not exist, or belongs to another principal.
    UnknownSession,
    /// A limit on MCP sessions or event streams.
    Limit(sessions::Refusal),
}

impl Refused {
    fn response(self) -> Response {
        let mut r = match self {
            Refused::Draining => {
                let mut r = plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "Service Unavailable: the server is shutting down",
                );
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                r
            }
            Refused::Host => plain(
                StatusCode::FORBIDDEN,
                "Forbidden: Host header is not allowed",
            ),
            Refused::Origin => plain(
                StatusCode::FORBIDDEN,
                "Forbidden: Origin header is not allowed",
            ),
            Refused::Unauthorized(error) => unauthorized(error),
            Refused::Share(n) => {
                let mut r = plain_owned(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "Too Many Requests: this token already holds {n} open connection(s) to \
                         this server, its share (--http-max-connections-per-principal {n}); \
                         reuse one, or close one before opening another"
                    ),
                );
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                r
            }
            Refused::UnknownSession => return unknown_session(),
            Refused::Limit(refusal) => return refusal.response(),
        };
        // Nobody's connection to keep: it is not held open for a refused client.
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        r
    }
}

/// Whether a request to `/mcp` may go on, and for whom: the server is not draining, Host
/// and Origin are allowed, the token is valid, the connection fits in the principal's
/// share, and the MCP session it names (if any) was created by the same principal and
/// may be used so (a stream within its caps). The caller and that session's use.
fn admit(
    s: &Shared,
    headers: &HeaderMap,
    method: &Method,
) -> Result<(Caller, Option<Activity>), Refused> {
    if s.draining.load(Ordering::SeqCst) {
        return Err(Refused::Draining);
    }
    let caller = check_client(s, headers)?;
    let counted = listener::CONN
        .try_with(|conn| conn.attribute(&caller))
        .unwrap_or(true);
    if !counted {
        tracing::debug!(principal = %caller.principal, "connection share full");
        return Err(Refused::Share(s.limits.share));
    }
    // An MCP session id is usable only by the principal that created it.
    let session = match headers.get(SESSION_HEADER) {
        None => {
            if *method == Method::POST
                && let Some(refusal) = s.mcp.would_refuse(&caller)
            {
                return Err(Refused::Limit(refusal));
            }
            None
        }
        Some(v) => {
            let what = if *method == Method::GET {
                Use::Stream
            } else {
                Use::Call
            };
            let entered = v
                .to_str()
                .map_err(|_| Denied::Unknown)
                .and_then(|id| s.mcp.enter(id, &caller, what));
            match entered {
                Ok(activity) => Some(activity),
                Err(Denied::Unknown) => {
                    tracing::debug!(principal = %caller.principal, "unknown or foreign MCP session id");
                    return Err(Refused::UnknownSession);
                }
                Err(Denied::Refused(refusal)) => return Err(Refused::Limit(refusal)),
            }
        }
    };
    Ok((caller, session))
}

/// Host, Origin and token: who this request comes from, if it may come at all.
fn check_client(s: &Shared, headers: &HeaderMap) -> Result<Caller, Refused> {
    if !s.hosts.allows(headers) {
        tracing::warn!(
            host = ?headers.get(header::HOST),
            "refused a request with a Host header that is not allowed"
        );
        return Err(Refused::Host);
    }
    if !s.origins.allows(headers) {
        tracing::warn!(
            origin = ?headers.get(header::ORIGIN),
            "refused a request with an Origin header that is not allowed"
        );
        return Err(Refused::Origin);
    }
    authenticate(&s.tokens, headers)
}

/// The principal of the request's bearer token (`local` when no token is configured).
fn authenticate(tokens: &Tokens, headers: &HeaderMap) -> Result<Caller, Refused> {
    if tokens.is_empty() {
        return Ok(Caller::local());
    }
    let value = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
    match auth::presented(value) {
        Presented::Missing => Err(Refused::Unauthorized(None)),
        Presented::Malformed => Err(Refused::Unauthorized(Some("invalid_request"))),
        Presented::Bearer(token) => tokens.verify(token).ok_or_else(|| {
            tracing::warn!("refused a request with an unknown token");
            Refused::Unauthorized(Some("invalid_token"))
        }),
    }
}

/// Whether the request carries a principal (a known token, or none needed), without the
/// log line a refusal writes: what a request past the cap must show to wait for a slot.
fn carries_principal(tokens: &Tokens, headers: &HeaderMap) -> bool {
    if tokens.is_empty() {
        return true;
    }
    let value = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
    match auth::presented(value) {
        Presented::Bearer(token) => tokens.verify(token).is_some(),
        Presented::Missing | Presented::Malformed => false,
    }
}

/// A response body that keeps a request counted (in flight, and as its MCP session's use)
/// until it is done.
struct Tracked {
    inner: Body,
    _guards: (Option<InFlightGuard>, Option<Activity>),
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A request body that fails once `deadline` has passed before its end.
struct Deadline {
    inner: Body,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl Deadline {
    fn new(inner: Body, within: Duration) -> Self {
        Self {
            inner,
            sleep: Box::pin(tokio::time::sleep(within)),
        }
    }
}

impl HttpBody for Deadline {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(
                "the request body did not arrive in time",
            )))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Prometheus metrics: behind Host, Origin and the token like `/mcp` (no MCP session).
async fn metrics(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Err(refused) = check_client(&s, &headers) {
        return refused.response();
    }
    s.app.metrics.set_http_connections(s.limits.open());
    let mut r = Response::new(Body::from(s.app.metrics_text()));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // A probe's or a scraper's connection counts in nobody's share: not kept open.
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Liveness and counts; no token needed, no secrets shown.
async fn healthz(State(s): State<Arc<Shared>>) -> Response {
    let draining = s.draining.load(Ordering::SeqCst);
    let mcp_sessions = s.mcp.count();
    let body = serde_json::json!({
        "status": if draining { "draining" } else { "ok" },
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_s": s.started.elapsed().as_secs(),
        "sessions": s.app.sessions.count(),
        "mcp_sessions": mcp_sessions,
        "principals": if s.tokens.is_empty() { 1 } else { s.tokens.principals() },
        "principals_with_sessions": s.app.sessions.owners(),
        "in_flight": s.app.calls.get(),
        "connections": s.limits.open(),
        "connections_waiting": s.limits.waiting(),
        "connections_closed_stalled": s.limits.stalled_closed(),
        "auth": if s.tokens.is_empty() { "none" } else { "bearer" },
    });
    let mut r = Response::new(Body::from(body.to_string()));
    if draining {
        *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    }
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // A probe's or a scraper's connection counts in nobody's share: not kept open.
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}
