//! One connection to the proxy: an HTTP/1 request head (bounded, with a deadline) carrying
//! the endpoint's credentials (else `407`), then either a CONNECT tunnel (HTTPS; the TLS
//! inside is not looked at) or one plain `http://` request forwarded with `Connection:
//! close`. Whatever the client asks, the upstream is connected to only at an address
//! [`Policy`] allows, checked on the resolved address itself (the name is resolved once,
//! here, and that address is the one connected to). A connection over which nothing moves
//! either way for [`Shared::idle`] is closed.
//!
//! The head is parsed with httparse here rather than by hyper's server (with its CONNECT
//! upgrade), which would be no stricter where it matters and not simpler. hyper parses a
//! request with httparse's defaults too (obs-fold refused; neither looks at `Host` for
//! CONNECT, and the target is checked by `split_authority` either way); what it adds,
//! refusing Transfer-Encoding on HTTP/1.0, one not chunked, or differing Content-Lengths,
//! concerns only the body's framing, which reaches nobody but the upstream already allowed
//! (bytes after a CONNECT's head go into the tunnel, hyper's would read a declared body
//! first). And hyper decodes bodies and keeps a connection for further requests, so the
//! plain `http://` path would need hyper's client side (or the body encoded again) and the
//! upstream's response parsed instead of relayed as bytes, besides a timer for the head's
//! deadline and an extension for the refusal's reason phrase.

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::timeout;

use super::policy::{Policy, normalize, public_address};

/// The largest request head read.
const MAX_HEAD: usize = 16 * 1024;
/// The time a client has to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// The time a refused client has to send its request head before the refusal is written
/// (reading it first lets the client read the answer rather than a reset).
const REFUSAL_HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// Resolving a name, and connecting to one address.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What every connection of an endpoint shares.
#[derive(Debug)]
pub struct Shared {
    pub policy: Policy,
    /// This host's own addresses (never connected to unless the operator names them).
    pub own: Arc<Vec<IpAddr>>,
    /// How long a relayed connection may go without a byte either way.
    pub idle: Duration,
    /// `USER:SECRET`, which the endpoint's own program sends as `Proxy-Authorization: Basic`
    /// (from the credentials in its proxy URL); whoever else finds the endpoint does not
    /// know it.
    pub credentials: Vec<u8>,
}

/// Whether the request presents `expected` as Basic proxy credentials, compared in
/// constant time (so timing tells a guesser nothing of the secret).
fn authorized(req: &httparse::Request<'_, '_>, expected: &[u8]) -> bool {
    use base64::Engine as _;
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    use subtle::ConstantTimeEq as _;
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    let mut ok = subtle::Choice::from(0);
    for h in req.headers.iter() {
        if !h.name.eq_ignore_ascii_case("proxy-authorization") {
            continue;
        }
        let Ok(value) = std::str::from_utf8(h.value) else {
            continue;
        };
        let Some((scheme, token)) = value.trim().split_once(' ') else {
            continue;
        };
        if !scheme.eq_ignore_ascii_case("basic") {
            continue;
        }
        if let Ok(given) = LENIENT.decode(token.trim()) {
            ok |= given.as_slice().ct_eq(expected);
        }
    }
    ok.into()
}

/// The refusal of a connection without the endpoint's credentials.
fn unauthorized() -> Refusal {
    Refusal(
        407,
        "replbox egress: this proxy serves one session or run, whose program has its \
         credentials in its proxy variables (HTTPS_PROXY); use that URL as it is"
            .into(),
    )
}

/// Why a request was not forwarded: the status and a one-line reason (ASCII, no CR/LF), sent
/// as the reason phrase too, so that clients which show only the status line (pip's "Tunnel
/// connection failed: 403 ...") show why.
struct Refusal(u16, String);

/// Serve one client connection; `who` names the session or run it belongs to, for the log.
pub async fn serve<S>(mut client: S, shared: Arc<Shared>, who: Arc<str>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (head, extra) = match timeout(HEAD_TIMEOUT, read_head(&mut client)).await {
        Ok(Some(h)) => h,
        _ => return,
    };
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    let (method, target) = match req.parse(&head) {
        Ok(httparse::Status::Complete(_)) => (
            req.method.unwrap_or_default().to_string(),
            req.path.unwrap_or_default().to_string(),
        ),
        _ => return refuse(&mut client, Refusal(400, "malformed request".into())).await,
    };
    if !authorized(&req, &shared.credentials) {
        tracing::warn!(who = %who, "egress refused: a connection without this endpoint's credentials");
        return refuse(&mut client, unauthorized()).await;
    }
    let result = if method.eq_ignore_ascii_case("CONNECT") {
        tunnel(&mut client, &shared, &who, &target, &extra).await
    } else {
        forward(&mut client, &shared, &who, &method, &target, &req, &extra).await
    };
    if let Err(r) = result {
        tracing::info!(who = %who, target = %printable(&target), "egress refused: {}", r.1);
        refuse(&mut client, r).await;
    }
}

/// CONNECT host:port: open the tunnel, then relay both ways.
async fn tunnel<S>(
    client: &mut S,
    shared: &Shared,
    who: &str,
    target: &str,
    extra: &[u8],
) -> Result<(), Refusal>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (host, port) = split_authority(target, None)
        .ok_or_else(|| Refusal(400, "CONNECT needs HOST:PORT".into()))?;
    let mut up = connect(shared, who, &host, port).await?;
    if client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .is_err()
        || up.write_all(extra).await.is_err()
    {
        return Ok(());
    }
    if relay(client, &mut up, shared.idle).await == Relayed::Idle {
        tracing::info!(who = %who, target = %printable(target), "egress: an idle tunnel closed");
    }
    Ok(())
}

/// A plain `http://` request: sent upstream in origin form, without the proxy's own headers
/// and with `Connection: close`; then the response (and any body) relayed as it comes.
async fn forward<S>(
    client: &mut S,
    shared: &Shared,
    who: &str,
    method: &str,
    target: &str,
    req: &httparse::Request<'_, '_>,
    extra: &[u8],
) -> Result<(), Refusal>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let rest = target
        .strip_prefix("http://")
        .or_else(|| target.strip_prefix("HTTP://"))
        .ok_or_else(|| {
            Refusal(
                400,
                "only http:// URLs are forwarded (https goes through CONNECT)".into(),
            )
        })?;
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    let (host, port) = split_authority(authority, Some(80))
        .ok_or_else(|| Refusal(400, "the URL has no valid host".into()))?;
    let mut up = connect(shared, who, &host, port).await?;
    let mut head = format!("{method} {path} HTTP/1.1\r\n").into_bytes();
    for h in req.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        if name.starts_with("proxy-") || name == "connection" || name == "keep-alive" {
            continue;
        }
        head.extend_from_slice(h.name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(h.value);
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"Connection: close\r\n\r\n");
    if up.write_all(&head).await.is_err() || up.write_all(extra).await.is_err() {
        return Ok(());
    }
    relay(client, &mut up, shared.idle).await;
    Ok(())
}

/// Connect to `host:port` if the policy allows the name and the address it resolves to.
async fn connect(shared: &Shared, who: &str, host: &str, port: u16) -> Result<TcpStream, Refusal> {
    let p = &shared.policy;
    let shown = printable(host);
    if !p.name_allowed(host, port) {
        return Err(Refusal(
            403,
            format!(
                "replbox egress: {shown} is not on the allowlist (allowed: {})",
                p.describe()
            ),
        ));
    }
    let named = p.named_host(host, port);
    let addrs: Vec<SocketAddr> = match timeout(
        RESOLVE_TIMEOUT,
        tokio::net::lookup_host((host.to_string(), port)),
    )
    .await
    {
        Ok(Ok(a)) => a.collect(),
        _ => {
            return Err(Refusal(
                502,
                format!("replbox egress: cannot resolve {shown}"),
            ));
        }
    };
    let allowed: Vec<SocketAddr> = addrs
        .iter()
        .copied()
        .filter(|a| named || public_address(a.ip(), &shared.own))
        .collect();
    if allowed.is_empty() {
        let first = addrs
            .first()
            .map(|a| a.ip().to_string())
            .unwrap_or_default();
        return Err(Refusal(
            403,
            format!(
                "replbox egress: {shown} resolves to {first}, a loopback, private, link-local \
                 or this host's own address, which user code may not reach (the operator can \
                 allow one host with --allow-host HOST:PORT)"
            ),
        ));
    }
    for addr in allowed {
        if let Ok(Ok(s)) = timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            tracing::info!(who = %who, host = %shown, %addr, "egress connected");
            return Ok(s);
        }
    }
    Err(Refusal(
        502,
        format!("replbox egress: cannot connect to {shown}:{port}"),
    ))
}

/// How a relay ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Relayed {
    /// Both sides finished, or one failed.
    Done,
    /// Nothing moved either way for the idle timeout.
    Idle,
}

/// Relay both ways between `a` and `b` until both are done, or until no byte has been
/// read from either for `idle` (a write that does not move counts as nothing moving).
pub async fn relay<A, B>(a: &mut A, b: &mut B, idle: Duration) -> Relayed
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let last = Arc::new(Mutex::new(tokio::time::Instant::now()));
    let mut a = Watched(a, last.clone());
    let mut b = Watched(b, last.clone());
    let watch = async {
        loop {
            let due = *last.lock().unwrap_or_else(|p| p.into_inner()) + idle;
            if tokio::time::Instant::now() >= due {
                return;
            }
            tokio::time::sleep_until(due).await;
        }
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut a, &mut b) => Relayed::Done,
        () = watch => Relayed::Idle,
    }
}

/// A stream that notes when it last read a byte.
struct Watched<'a, S>(&'a mut S, Arc<Mutex<tokio::time::Instant>>);

impl<S: AsyncRead + Unpin> AsyncRead for Watched<'_, S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut *self.0).poll_read(cx, buf);
        if buf.filled().len() > before {
            *self.1.lock().unwrap_or_else(|p| p.into_inner()) = tokio::time::Instant::now();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<'_, S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

/// Answer a connection over one of the proxy's caps with `why` (429), after reading its
/// request head (briefly), and close it; one without the endpoint's credentials learns
/// nothing of its caps (407).
pub async fn turn_away<S: AsyncRead + AsyncWrite + Unpin>(
    mut client: S,
    shared: &Shared,
    why: String,
) {
    let head = timeout(REFUSAL_HEAD_TIMEOUT, read_head(&mut client))
        .await
        .ok()
        .flatten();
    let known = head.is_some_and(|(h, _)| {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        matches!(req.parse(&h), Ok(httparse::Status::Complete(_)))
            && authorized(&req, &shared.credentials)
    });
    let refusal = if known {
        Refusal(429, why)
    } else {
        unauthorized()
    };
    refuse(&mut client, refusal).await;
}

/// Read up to the end of the request head; returns the head and what came after it.
async fn read_head<S: AsyncRead + Unpin>(s: &mut S) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = memchr::memmem::find(&buf[from..], b"\r\n\r\n") {
            let end = from + i + 4;
            let extra = buf.split_off(end);
            return Some((buf, extra));
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
    }
}

/// `host:port` (or `[v6]:port`); `default` when the port is left out.
fn split_authority(a: &str, default: Option<u16>) -> Option<(String, u16)> {
    let a = a.rsplit_once('@').map_or(a, |(_, h)| h);
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => default?,
            None => return None,
        };
        (h.to_string(), port)
    } else {
        match a.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse().ok()?),
            None => (a.to_string(), default?),
        }
    };
    let host = normalize(&host);
    let ok = !host.is_empty()
        && host.len() <= 253
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':' | '_'));
    (ok && port != 0).then_some((host, port))
}

/// A client-given string, safe for a status line and a log: printable ASCII, bounded.
fn printable(s: &str) -> String {
    s.chars()
        .take(200)
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .collect()
}

async fn refuse<S: AsyncWrite + Unpin>(client: &mut S, Refusal(code, msg): Refusal) {
    let reason: String = msg
        .chars()
        .take(400)
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect();
    let body = format!("{msg}\n");
    let challenge = if code == 407 {
        "Proxy-Authenticate: Basic realm=\"replbox\"\r\n"
    } else {
        ""
    };
    let text = format!(
        "HTTP/1.1 {code} {reason}\r\n{challenge}Content-Type: text/plain\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = client.write_all(text.as_bytes()).await;
    let _ = client.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_parse() {
        assert_eq!(
            split_authority("PyPI.org:443", None),
            Some(("pypi.org".into(), 443))
        );
        assert_eq!(
            split_authority("[::1]:8080", None),
            Some(("::1".into(), 8080))
        );
        assert_eq!(
            split_authority("example.com", Some(80)),
            Some(("example.com".into(), 80))
        );
        assert_eq!(
            split_authority("user:pw@example.com", Some(80)),
            Some(("example.com".into(), 80))
        );
        assert_eq!(split_authority("example.com", None), None);
        assert_eq!(split_authority("a b:80", None), None);
        assert_eq!(split_authority("x:0", None), None);
        assert_eq!(split_authority("x:99999", None), None);
    }

    // Paused time: the relay's timer is the only thing that moves the clock, so the close
    // is awaited, not slept for.
    #[tokio::test(start_paused = true)]
    async fn a_tunnel_with_nothing_moving_is_closed_after_the_idle_timeout() {
        let idle = Duration::from_secs(60);
        let (mut client, mut a) = tokio::io::duplex(1024);
        let (mut b, mut upstream) = tokio::io::duplex(1024);
        let start = tokio::time::Instant::now();
        let relay = tokio::spawn(async move { relay(&mut a, &mut b, idle).await });
        let mut buf = [0u8; 16];
        client.write_all(b"ping").await.expect("write");
        upstream.read_exact(&mut buf[..4]).await.expect("relayed");
        assert_eq!(&buf[..4], b"ping");
        // Bytes the other way, 40 s later, put the deadline back.
        tokio::time::sleep(Duration::from_secs(40)).await;
        upstream.write_all(b"pong").await.expect("write");
        client.read_exact(&mut buf[..4]).await.expect("relayed");
        assert_eq!(&buf[..4], b"pong");
        let moved = tokio::time::Instant::now();
        let ended = timeout(idle * 2, relay)
            .await
            .expect("closed within the timeout");
        assert_eq!(ended.expect("relay task"), Relayed::Idle);
        assert_eq!(tokio::time::Instant::now() - moved, idle);
        assert!(moved - start >= Duration::from_secs(40));
        // Both ends see the connection closed.
        assert_eq!(client.read(&mut buf).await.expect("eof"), 0);
        assert_eq!(upstream.read(&mut buf).await.expect("eof"), 0);
    }
}
