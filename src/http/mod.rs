//! MCP over streamable HTTP: rmcp's `StreamableHttpService` at `/mcp` on axum, behind a
//! guard that checks Host and Origin, authenticates the bearer token, binds every MCP
//! session id to the principal that created it, and counts requests in flight; plus
//! `GET /healthz` and a draining shutdown. Only transport lives here: ownership of REPL
//! sessions and their limits are the session manager's.
//!
//! How the principal reaches the tools: the guard puts the authenticated [`Caller`] in
//! the request's extensions; rmcp hands each request's `http::request::Parts` (with those
//! extensions) to the handler, and `ReplboxServer::per_request` reads the caller from
//! there on every call. So the principal is per request, never per MCP session, and the
//! stateless 2026-07-28 path (no MCP session at all) works the same way.

pub mod auth;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
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
use dashmap::DashMap;
use rmcp::transport::streamable_http_server::session::SessionManager as _;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use crate::app::{App, InFlight, InFlightGuard};
use crate::config::HttpConfig;
use crate::mcp::ReplboxServer;
use crate::sandbox::Level;
use crate::session::Caller;
use auth::{Presented, Tokens};

const SESSION_HEADER: &str = "mcp-session-id";
const REALM: &str = "replbox";

/// State shared by the guard, `/healthz` and shutdown.
struct Shared {
    app: Arc<App>,
    tokens: Tokens,
    hosts: HostPolicy,
    origins: OriginPolicy,
    /// MCP session id -> the principal whose `initialize` created it.
    owners: DashMap<String, Caller>,
    mcp: Arc<LocalSessionManager>,
    /// POSTs to /mcp whose response has not been sent completely.
    requests: InFlight,
    draining: AtomicBool,
    started: Instant,
}

/// Serve MCP over streamable HTTP on `addr` until `terminate` completes, then drain and
/// stop everything the server started.
pub async fn serve(
    app: Arc<App>,
    cfg: &HttpConfig,
    addr: &str,
    terminate: impl Future<Output = ()>,
) -> anyhow::Result<()> {
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
    // Without a token every request is the local principal, which may copy host files into
    // a session: user code that can reach this host's loopback must not be able to call it.
    let level = app.sandbox.level;
    if tokens.is_empty() && (level == Level::None || app.sandbox.network) {
        anyhow::bail!(
            "refusing to serve HTTP without a token at sandbox level {level}{}: user code can \
             reach this host's loopback there, call this server back as the local principal \
             and have it copy files only the server may read. Give tokens with --token, \
             REPLBOX_TOKENS or --tokens-file (user code never sees them), or use a level that \
             keeps user code off the network (bwrap or landlock without --allow-network)",
            if app.sandbox.network {
                " with --allow-network"
            } else {
                ""
            }
        );
    }
    let hosts = HostPolicy::new(&cfg.allowed_hosts, addr.ip())?;
    let origins = OriginPolicy::new(&cfg.allowed_origins)?;

    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr()?;

    let mcp_ct = CancellationToken::new();
    let mut rmcp_config = StreamableHttpServerConfig::default()
        .with_cancellation_token(mcp_ct.child_token())
        .with_max_request_body_bytes(cfg.http_max_body);
    // The guard checks Host and Origin first; rmcp checks the same lists again.
    rmcp_config = match &hosts {
        HostPolicy::Any => rmcp_config.disable_allowed_hosts(),
        HostPolicy::List { raw, .. } => rmcp_config.with_allowed_hosts(raw.clone()),
    };
    rmcp_config = rmcp_config.with_allowed_origins(cfg.allowed_origins.clone());
    if cfg.allowed_origins.is_empty() {
        rmcp_config = rmcp_config.enforce_origin_validation();
    }
    let mut manager = LocalSessionManager::default();
    // An MCP session must outlive the longest evaluation it may be waiting for.
    let floor = Duration::from_millis(app.config.max_timeout_ms) + Duration::from_secs(60);
    manager.session_config.keep_alive =
        Some(Duration::from_secs(cfg.http_session_idle_s).max(floor));
    let manager = Arc::new(manager);
    let factory_app = app.clone();
    let service = StreamableHttpService::new(
        move || Ok(ReplboxServer::per_request(factory_app.clone())),
        manager.clone(),
        rmcp_config,
    );

    let principals = tokens.principals();
    let authenticated = !tokens.is_empty();
    let shared = Arc::new(Shared {
        app: app.clone(),
        tokens,
        hosts,
        origins,
        owners: DashMap::new(),
        mcp: manager,
        requests: InFlight::default(),
        draining: AtomicBool::new(false),
        started: Instant::now(),
    });
    let router = Router::new()
        .route_service("/mcp", service)
        .route_layer(axum::middleware::from_fn_with_state(shared.clone(), guard))
        .route("/healthz", get(healthz))
        .with_state(shared.clone());

    let stop_accepting = CancellationToken::new();
    let mut server = tokio::spawn(
        axum::serve(listener, router)
            .with_graceful_shutdown(stop_accepting.clone().cancelled_owned())
            .into_future(),
    );
    if authenticated {
        tracing::info!(principals, "bearer-token authentication on");
    } else {
        tracing::warn!(
            "no token configured: every local user and process that can reach {local} can run \
             code as this user (all as principal \"local\"); give --token or --tokens-file on a \
             shared host"
        );
    }
    if addr.ip().is_unspecified() && cfg.allowed_hosts.is_empty() {
        tracing::warn!(
            "listening on every interface, but only loopback Host headers are accepted: give \
             the names clients use with --allowed-host (or REPLBOX_ALLOWED_HOSTS)"
        );
    }
    tracing::info!("listening on http://{local}/mcp");
    app.start_background();
    let pruner = tokio::spawn(prune_owners(shared.clone()));

    tokio::select! {
        _ = terminate => {}
        ended = &mut server => {
            // The server stopped by itself: a listener error.
            pruner.abort();
            mcp_ct.cancel();
            app.shutdown().await;
            ended??;
            anyhow::bail!("the HTTP server stopped unexpectedly");
        }
    }

    // Drain: refuse new work, stop accepting connections, let calls in flight finish
    // (bounded), then end the MCP sessions, close every REPL session and go.
    let t0 = Instant::now();
    shared.draining.store(true, Ordering::SeqCst);
    stop_accepting.cancel();
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
    pruner.abort();
    app.shutdown().await;
    match tokio::time::timeout(Duration::from_secs(3), &mut server).await {
        Ok(Ok(Err(e))) => tracing::warn!("HTTP server: {e}"),
        Ok(_) => {}
        Err(_) => {
            tracing::warn!("connections still open after shutdown; closing them");
            server.abort();
        }
    }
    tracing::info!(
        elapsed_ms = t0.elapsed().as_millis() as u64,
        "shut down: all sessions closed"
    );
    Ok(())
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

fn is_loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

/// Which `Host` header values are served (DNS-rebinding protection).
enum HostPolicy {
    Any,
    List {
        raw: Vec<String>,
        parsed: Vec<(String, Option<u16>)>,
    },
}

fn normalize_host(h: &str) -> String {
    h.trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase()
}

/// `host` or `host:port` (IPv6 in brackets, or bare without a port).
fn parse_authority(s: &str) -> Option<(String, Option<u16>)> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    match axum::http::uri::Authority::try_from(s) {
        Ok(a) => Some((normalize_host(a.host()), a.port_u16())),
        Err(_) if s.parse::<std::net::Ipv6Addr>().is_ok() => Some((s.to_ascii_lowercase(), None)),
        Err(_) => None,
    }
}

impl HostPolicy {
    fn new(configured: &[String], bound: IpAddr) -> anyhow::Result<Self> {
        let configured: Vec<String> = configured
            .iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        if configured.iter().any(|h| h == "*") {
            return Ok(Self::Any);
        }
        let raw = if configured.is_empty() {
            let mut d: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
            if !bound.is_unspecified() && !is_loopback(bound) {
                d.push(bound.to_string());
            }
            d
        } else {
            configured
        };
        let parsed = raw
            .iter()
            .map(|h| {
                parse_authority(h).ok_or_else(|| {
                    anyhow::anyhow!("--allowed-host {h:?}: expected HOST or HOST:PORT")
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self::List { raw, parsed })
    }

    fn allows(&self, headers: &HeaderMap) -> bool {
        let Self::List { parsed, .. } = self else {
            return true;
        };
        let Some((host, port)) = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_authority)
        else {
            return false;
        };
        parsed
            .iter()
            .any(|(h, p)| *h == host && p.is_none_or(|p| Some(p) == port))
    }
}

/// Which browser `Origin`s are served. Requests without an Origin header (every
/// non-browser MCP client) always pass.
struct OriginPolicy {
    allow_null: bool,
    /// (scheme, host, port; None = any port)
    allowed: Vec<(String, String, Option<u16>)>,
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

/// `scheme://host[:port]` as (scheme, host, port with the scheme's default filled in).
fn parse_origin(s: &str) -> Option<(String, String, Option<u16>)> {
    let uri = axum::http::Uri::try_from(s.trim()).ok()?;
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let auth = uri.authority()?;
    if uri.path() != "/" && !uri.path().is_empty() {
        return None;
    }
    let port = auth.port_u16().or_else(|| default_port(&scheme));
    Some((scheme, normalize_host(auth.host()), port))
}

impl OriginPolicy {
    fn new(configured: &[String]) -> anyhow::Result<Self> {
        let mut p = Self {
            allow_null: false,
            allowed: Vec::new(),
        };
        for o in configured
            .iter()
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
        {
            if o.eq_ignore_ascii_case("null") {
                p.allow_null = true;
                continue;
            }
            let bad = || {
                anyhow::anyhow!(
                    "--allowed-origin {o:?}: expected SCHEME://HOST[:PORT] or SCHEME://HOST:*"
                )
            };
            let entry = match o.strip_suffix(":*") {
                Some(base) => {
                    let (scheme, host, _) = parse_origin(base).ok_or_else(bad)?;
                    (scheme, host, None)
                }
                None => parse_origin(o).ok_or_else(bad)?,
            };
            p.allowed.push(entry);
        }
        Ok(p)
    }

    fn allows(&self, headers: &HeaderMap) -> bool {
        let Some(v) = headers.get(header::ORIGIN) else {
            return true;
        };
        let Ok(v) = v.to_str() else {
            return false;
        };
        if v.trim().eq_ignore_ascii_case("null") {
            return self.allow_null;
        }
        let Some((scheme, host, port)) = parse_origin(v) else {
            return false;
        };
        self.allowed
            .iter()
            .any(|(s, h, p)| *s == scheme && *h == host && p.is_none_or(|p| Some(p) == port))
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response {
    let mut r = Response::new(Body::from(text));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn unauthorized(error: Option<&'static str>) -> Response {
    let (challenge, text) = match error {
        None => (
            format!("Bearer realm=\"{REALM}\""),
            "Unauthorized: send Authorization: Bearer <token>",
        ),
        Some(e) => (
            format!("Bearer realm=\"{REALM}\", error=\"{e}\""),
            "Unauthorized: the token is not valid",
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

/// In front of `/mcp`: Host, Origin, token, MCP session ownership, in-flight count.
async fn guard(State(s): State<Arc<Shared>>, mut req: Request, next: Next) -> Response {
    if s.draining.load(Ordering::SeqCst) {
        let mut r = plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "Service Unavailable: the server is shutting down",
        );
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return r;
    }
    if !s.hosts.allows(req.headers()) {
        tracing::warn!(
            host = ?req.headers().get(header::HOST),
            "refused a request with a Host header that is not allowed"
        );
        return plain(
            StatusCode::FORBIDDEN,
            "Forbidden: Host header is not allowed",
        );
    }
    if !s.origins.allows(req.headers()) {
        tracing::warn!(
            origin = ?req.headers().get(header::ORIGIN),
            "refused a request with an Origin header that is not allowed"
        );
        return plain(
            StatusCode::FORBIDDEN,
            "Forbidden: Origin header is not allowed",
        );
    }
    let caller = if s.tokens.is_empty() {
        Caller::local()
    } else {
        let value = req
            .headers()
            .get(header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        match auth::presented(value) {
            Presented::Missing => return unauthorized(None),
            Presented::Malformed => return unauthorized(Some("invalid_request")),
            Presented::Bearer(token) => match s.tokens.verify(token) {
                Some(c) => c,
                None => {
                    tracing::warn!("refused a request with an unknown token");
                    return unauthorized(Some("invalid_token"));
                }
            },
        }
    };
    // An MCP session id is usable only by the principal that created it.
    let session = match req.headers().get(SESSION_HEADER) {
        None => None,
        Some(v) => match v.to_str() {
            Ok(id) if s.owners.get(id).is_some_and(|o| *o == caller) => Some(id.to_string()),
            _ => {
                tracing::debug!(principal = %caller.principal, "unknown or foreign MCP session id");
                return unknown_session();
            }
        },
    };
    let method = req.method().clone();
    tracing::debug!(principal = %caller.principal, %method, "MCP request");
    req.extensions_mut().insert(caller.clone());
    let counting = (method == Method::POST).then(|| s.requests.enter());
    let response = next.run(req).await;
    if session.is_none()
        && let Some(id) = response
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
    {
        s.owners.insert(id.to_string(), caller);
    }
    if method == Method::DELETE
        && response.status().is_success()
        && let Some(id) = &session
    {
        s.owners.remove(id);
    }
    match counting {
        // Counted until the response body (an SSE stream for a call) is finished.
        Some(g) => response.map(|inner| Body::new(Counted { inner, _guard: g })),
        None => response,
    }
}

/// A response body that keeps a request counted as in flight until it is done.
struct Counted {
    inner: Body,
    _guard: InFlightGuard,
}

impl HttpBody for Counted {
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

/// Liveness and counts; no token needed, no secrets shown.
async fn healthz(State(s): State<Arc<Shared>>) -> Response {
    let draining = s.draining.load(Ordering::SeqCst);
    let mcp_sessions = s.mcp.sessions.read().await.len();
    let body = serde_json::json!({
        "status": if draining { "draining" } else { "ok" },
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_s": s.started.elapsed().as_secs(),
        "sessions": s.app.sessions.count(),
        "mcp_sessions": mcp_sessions,
        "principals": if s.tokens.is_empty() { 1 } else { s.tokens.principals() },
        "principals_with_sessions": s.app.sessions.owners(),
        "in_flight": s.app.calls.get(),
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
    r
}

/// Forget the owners of MCP sessions rmcp has dropped (idle, deleted, failed).
async fn prune_owners(s: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    tick.tick().await;
    loop {
        tick.tick().await;
        let ids: Vec<String> = s.owners.iter().map(|e| e.key().clone()).collect();
        for id in ids {
            let sid: Arc<str> = Arc::from(id.as_str());
            if !s.mcp.has_session(&sid).await.unwrap_or(true) {
                s.owners.remove(&id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(k.clone(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn host_policy() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let p = HostPolicy::new(&[], lo).unwrap();
        for ok in ["127.0.0.1:8080", "localhost", "LOCALHOST:1", "[::1]:9"] {
            assert!(p.allows(&headers(&[(header::HOST, ok)])), "{ok}");
        }
        for bad in ["evil.example", "127.0.0.2:80", "localhost.evil.example"] {
            assert!(!p.allows(&headers(&[(header::HOST, bad)])), "{bad}");
        }
        assert!(!p.allows(&HeaderMap::new()), "no Host header");
        let ext: IpAddr = "192.0.2.7".parse().unwrap();
        let p = HostPolicy::new(&[], ext).unwrap();
        assert!(p.allows(&headers(&[(header::HOST, "192.0.2.7:8765")])));
        let p = HostPolicy::new(&["mcp.example:443".into()], lo).unwrap();
        assert!(p.allows(&headers(&[(header::HOST, "mcp.example:443")])));
        assert!(!p.allows(&headers(&[(header::HOST, "mcp.example:80")])));
        assert!(!p.allows(&headers(&[(header::HOST, "localhost")])));
        let p = HostPolicy::new(&["*".into()], lo).unwrap();
        assert!(p.allows(&headers(&[(header::HOST, "anything")])));
        assert!(HostPolicy::new(&["a b".into()], lo).is_err());
    }

    #[test]
    fn origin_policy() {
        let p = OriginPolicy::new(&[]).unwrap();
        assert!(p.allows(&HeaderMap::new()), "no Origin passes");
        assert!(!p.allows(&headers(&[(header::ORIGIN, "http://localhost:3000")])));
        assert!(!p.allows(&headers(&[(header::ORIGIN, "null")])));
        let p = OriginPolicy::new(&[
            "https://app.example".into(),
            "http://localhost:*".into(),
            "null".into(),
        ])
        .unwrap();
        assert!(p.allows(&headers(&[(header::ORIGIN, "https://app.example")])));
        assert!(p.allows(&headers(&[(header::ORIGIN, "https://app.example:443")])));
        assert!(!p.allows(&headers(&[(header::ORIGIN, "https://app.example:8443")])));
        assert!(!p.allows(&headers(&[(header::ORIGIN, "http://app.example")])));
        assert!(p.allows(&headers(&[(header::ORIGIN, "http://localhost:5173")])));
        assert!(p.allows(&headers(&[(header::ORIGIN, "null")])));
        assert!(OriginPolicy::new(&["app.example".into()]).is_err());
    }

    #[test]
    fn loopback() {
        for a in ["127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1"] {
            assert!(is_loopback(a.parse().unwrap()), "{a}");
        }
        for a in ["0.0.0.0", "::", "192.0.2.1", "::ffff:192.0.2.1"] {
            assert!(!is_loopback(a.parse().unwrap()), "{a}");
        }
    }
}
