//! `replbox serve --http` under one principal's flood: MCP sessions and event streams
//! bounded per principal and per server, a connection share per principal, a reserved
//! slot for `/healthz` and `/metrics`, and other principals still served. Driven with raw
//! HTTP/1.1 over loopback (the attacker) and rmcp's streamable HTTP client (the others).

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOKEN_A: &str = "token-of-alice-0123456789";
const TOKEN_B: &str = "token-of-bob-9876543210ab";
const TOKEN_C: &str = "token-of-carol-5555555555";

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;
const TOOLS_LIST: &str = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;

/// How long a test waits for an answer that must come: a bound on a hang, not a timing
/// assertion (a starved server answers never, not late).
const ANSWER: Duration = Duration::from_secs(30);

fn tokens() -> String {
    format!("{TOKEN_A},{TOKEN_B},{TOKEN_C}")
}

/// A server for these tests: three principals, no warm pools (they count memory).
async fn server(args: &[&str]) -> HttpChild {
    HttpChild::try_start(
        args,
        &[("REPLBOX_TOKENS", &tokens()), ("REPLBOX_SESSION_POOL", "0")],
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// An HTTP answer: status, headers, and the body read so far.
#[derive(Debug)]
struct Raw {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One request's bytes; `close` asks for the connection to close after the answer.
fn request(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    session: Option<&str>,
    body: &str,
    close: bool,
) -> String {
    let mut r = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n");
    if let Some(t) = token {
        r.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    if let Some(s) = session {
        r.push_str(&format!("Mcp-Session-Id: {s}\r\n"));
    }
    match method {
        "POST" => r.push_str(
            "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n",
        ),
        "GET" if path == "/mcp" => r.push_str("Accept: text/event-stream\r\n"),
        _ => {}
    }
    if close {
        r.push_str("Connection: close\r\n");
    }
    r.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    r
}

/// Read an answer's head off `s` (and, with a Content-Length, its body).
async fn read_head(s: &mut TcpStream) -> Raw {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(ANSWER, async {
        while !buf.ends_with(b"\r\n\r\n") {
            match s.read(&mut byte).await {
                Ok(1) => buf.push(byte[0]),
                _ => break,
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no answer within {ANSWER:?}");
    let text = String::from_utf8_lossy(&buf).to_string();
    let mut lines = text.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut raw = Raw {
        status,
        headers,
        body: String::new(),
    };
    if let Some(n) = raw
        .header("content-length")
        .and_then(|v| v.parse::<usize>().ok())
    {
        let mut body = vec![0u8; n];
        if tokio::time::timeout(ANSWER, s.read_exact(&mut body))
            .await
            .is_ok_and(|r| r.is_ok())
        {
            raw.body = String::from_utf8_lossy(&body).to_string();
        }
    }
    raw
}

/// One exchange on a fresh connection that closes after it.
async fn raw(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    session: Option<&str>,
    body: &str,
) -> Raw {
    let mut s = tokio::time::timeout(ANSWER, TcpStream::connect(addr))
        .await
        .expect("connect in time")
        .expect("connect");
    s.write_all(request(addr, method, path, token, session, body, true).as_bytes())
        .await
        .expect("write");
    let mut buf = Vec::new();
    let read = tokio::time::timeout(ANSWER, s.read_to_end(&mut buf)).await;
    assert!(
        read.is_ok(),
        "no complete answer to {method} {path} within {ANSWER:?}"
    );
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"));
    Raw {
        status,
        headers: lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect(),
        body: body.to_string(),
    }
}

/// A new MCP session of `token`: its id.
async fn initialize(addr: &str, token: &str) -> String {
    let r = raw(addr, "POST", "/mcp", Some(token), None, INITIALIZE).await;
    assert_eq!(r.status, 200, "initialize: {r:?}");
    r.header("mcp-session-id")
        .expect("Mcp-Session-Id")
        .to_string()
}

async fn tools_list(addr: &str, token: &str, session: &str) -> Raw {
    raw(addr, "POST", "/mcp", Some(token), Some(session), TOOLS_LIST).await
}

/// `n` connections of `token`'s kept open after a request each (the first starts an MCP
/// session, the others list its tools): their statuses and sockets.
async fn kept_alive_with_statuses(addr: &str, token: &str, n: usize) -> (Vec<u16>, Vec<TcpStream>) {
    let mut kept = Vec::new();
    let mut statuses = Vec::new();
    let mut session: Option<String> = None;
    for _ in 0..n {
        let mut sock = TcpStream::connect(addr).await.expect("connect");
        let req = match &session {
            None => request(addr, "POST", "/mcp", Some(token), None, INITIALIZE, false),
            Some(id) => request(
                addr,
                "POST",
                "/mcp",
                Some(token),
                Some(id),
                TOOLS_LIST,
                false,
            ),
        };
        sock.write_all(req.as_bytes()).await.expect("write");
        let head = read_head(&mut sock).await;
        if session.is_none() {
            session = head.header("mcp-session-id").map(String::from);
            assert!(session.is_some(), "{head:?}");
        }
        if head.status == 429 {
            assert_eq!(head.header("connection"), Some("close"), "{head:?}");
            assert!(
                head.body.contains("--http-max-connections-per-principal"),
                "{head:?}"
            );
        }
        statuses.push(head.status);
        kept.push(sock);
    }
    (statuses, kept)
}

/// `n` connections of `token`'s kept open, each served.
async fn kept_alive(addr: &str, token: &str, n: usize) -> Vec<TcpStream> {
    let (statuses, kept) = kept_alive_with_statuses(addr, token, n).await;
    assert!(statuses.iter().all(|&c| c == 200), "{statuses:?}");
    kept
}

/// A standalone event stream (`GET /mcp`) held open: its answer's head and the socket.
async fn open_stream(addr: &str, token: &str, session: &str) -> (Raw, TcpStream) {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request(addr, "GET", "/mcp", Some(token), Some(session), "", false).as_bytes())
        .await
        .expect("write");
    let head = read_head(&mut s).await;
    (head, s)
}

async fn healthz(addr: &str) -> Value {
    let r = raw(addr, "GET", "/healthz", None, None, "").await;
    assert_eq!(r.status, 200, "{r:?}");
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("healthz JSON: {e}: {r:?}"))
}

/// The server's resident memory, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("VmRSS")
}

/// Principal B starts a Python session and evaluates in it, through rmcp's client.
async fn b_is_served(s: &HttpChild) {
    let b = s.connect(TOKEN_B).await;
    let o = http_call(&b, "session_start", json!({"language": "python"})).await;
    assert!(!o.is_error, "B's session_start: {}", o.text);
    let id = o.s("session_id").to_string();
    let o = http_call(
        &b,
        "session_eval",
        json!({"session_id": id, "code": "6 * 7", "timeout_ms": 30000}),
    )
    .await;
    assert!(!o.is_error, "B's session_eval: {}", o.text);
    assert!(o.text.contains("42"), "{}", o.text);
    let o = http_call(&b, "session_close", json!({"session_id": id})).await;
    assert!(!o.is_error, "{}", o.text);
    let _ = b.cancel().await;
}

/// Round 3, finding 2: principal A floods `initialize` (each MCP session cost ~390 KiB and
/// lived 30 min). The server's memory stays bounded, A's MCP sessions stay within the
/// per-principal cap (the oldest idle one goes), and B is still served.
#[tokio::test(flavor = "multi_thread")]
async fn finding_r3_2_initialize_flood_keeps_memory_bounded_and_others_served() {
    if !require("python", "python3") {
        return;
    }
    let s = server(&[]).await;
    let addr = s.addr.clone();
    // The first MCP session builds what every later one shares.
    initialize(&addr, TOKEN_A).await;
    let before = rss_kib(s.pid());
    const FLOOD: usize = 1200;
    const CONNS: usize = 8;
    let mut tasks = Vec::new();
    for _ in 0..CONNS {
        let addr = addr.clone();
        tasks.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            for _ in 0..FLOOD / CONNS {
                statuses.push(
                    raw(&addr, "POST", "/mcp", Some(TOKEN_A), None, INITIALIZE)
                        .await
                        .status,
                );
            }
            statuses
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.extend(t.await.expect("flood task"));
    }
    // Idle sessions give way to new ones: the flood is not refused, it is bounded.
    assert!(statuses.iter().all(|&c| c == 200), "{statuses:?}");
    let after = rss_kib(s.pid());
    let grown = after.saturating_sub(before);
    eprintln!(
        "RSS {before} KiB -> {after} KiB after {FLOOD} initialize: +{grown} KiB (~{} KiB per MCP session if all were kept)",
        grown / FLOOD as u64
    );
    let h = healthz(&addr).await;
    let live = h["mcp_sessions"].as_u64().expect("mcp_sessions");
    assert!(
        live <= 64,
        "one principal holds {live} MCP sessions after its flood: {h}"
    );
    assert!(
        grown < 64 * 1024,
        "the server grew by {grown} KiB during one principal's initialize flood"
    );
    b_is_served(&s).await;
    s.stop().await;
}

/// Round 3, finding 2: at the per-principal cap the principal's least recently used idle
/// MCP session is ended for a new one; when none is idle (each has a stream open) the new
/// one is refused with a clear error, and another principal is not affected. At the
/// server's cap, idle sessions of any principal give way; when none is idle, refused.
#[tokio::test(flavor = "multi_thread")]
async fn finding_r3_2_mcp_sessions_are_capped_per_principal_and_per_server() {
    let s = server(&[
        "--http-max-mcp-sessions-per-principal",
        "3",
        "--http-max-mcp-sessions",
        "5",
    ])
    .await;
    let addr = s.addr.clone();
    let a1 = initialize(&addr, TOKEN_A).await;
    let a2 = initialize(&addr, TOKEN_A).await;
    let a3 = initialize(&addr, TOKEN_A).await;
    // a1 used last: a2 is now the least recently used.
    assert_eq!(tools_list(&addr, TOKEN_A, &a1).await.status, 200);
    let a4 = initialize(&addr, TOKEN_A).await;
    assert_eq!(
        tools_list(&addr, TOKEN_A, &a2).await.status,
        404,
        "a2 was not evicted"
    );
    for id in [&a1, &a3, &a4] {
        assert_eq!(
            tools_list(&addr, TOKEN_A, id).await.status,
            200,
            "{id} was evicted"
        );
    }

    // Each of A's sessions busy with an open stream: nothing to evict, a clear refusal.
    let mut streams = Vec::new();
    for id in [&a1, &a3, &a4] {
        let (head, sock) = open_stream(&addr, TOKEN_A, id).await;
        assert_eq!(head.status, 200, "{head:?}");
        streams.push(sock);
    }
    let r = raw(&addr, "POST", "/mcp", Some(TOKEN_A), None, INITIALIZE).await;
    assert_eq!(r.status, 429, "{r:?}");
    assert!(r.header("retry-after").is_some(), "{r:?}");
    assert!(
        r.body.contains("--http-max-mcp-sessions-per-principal") && r.body.contains("DELETE"),
        "{}",
        r.body
    );
    for id in [&a1, &a3, &a4] {
        assert_eq!(tools_list(&addr, TOKEN_A, id).await.status, 200);
    }

    // B is under its own cap: served. At the server's cap (5), B's idle sessions give way.
    let b1 = initialize(&addr, TOKEN_B).await;
    let b2 = initialize(&addr, TOKEN_B).await;
    let b3 = initialize(&addr, TOKEN_B).await;
    assert_eq!(
        tools_list(&addr, TOKEN_B, &b1).await.status,
        404,
        "b1 was kept past the server's cap"
    );
    let (h2, s2) = open_stream(&addr, TOKEN_B, &b2).await;
    let (h3, s3) = open_stream(&addr, TOKEN_B, &b3).await;
    assert_eq!((h2.status, h3.status), (200, 200));
    // Every session on the server busy: C is refused, with the server's limit named.
    let r = raw(&addr, "POST", "/mcp", Some(TOKEN_C), None, INITIALIZE).await;
    assert_eq!(r.status, 503, "{r:?}");
    assert!(r.body.contains("--http-max-mcp-sessions"), "{}", r.body);
    // A stream ends: its session becomes idle and gives way to C.
    drop(s3);
    let deadline = Instant::now() + ANSWER;
    loop {
        let r = raw(&addr, "POST", "/mcp", Some(TOKEN_C), None, INITIALIZE).await;
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 503, "{r:?}");
        assert!(
            Instant::now() < deadline,
            "the ended stream's session never gave way"
        );
        tokio::task::yield_now().await;
    }
    assert_eq!(tools_list(&addr, TOKEN_B, &b3).await.status, 404);
    assert_eq!(tools_list(&addr, TOKEN_B, &b2).await.status, 200);
    drop((streams, s2));
    s.stop().await;
}

/// Round 3, finding 2: an MCP session with no call and no stream since its `initialize`
/// lives `--http-session-unused-s`, not the idle time of a session in use; a session that
/// made a call stays. Ending one with DELETE answers 204 (a 202 made the official Python
/// SDK log "Session termination failed: 202").
#[tokio::test(flavor = "multi_thread")]
async fn finding_r3_2_unused_mcp_sessions_end_soon_and_delete_answers_204() {
    let s = server(&["--http-session-unused-s", "1"]).await;
    let addr = s.addr.clone();
    let unused = initialize(&addr, TOKEN_A).await;
    let used = initialize(&addr, TOKEN_A).await;
    assert_eq!(tools_list(&addr, TOKEN_A, &used).await.status, 200);
    let deadline = Instant::now() + ANSWER;
    while healthz(&addr).await["mcp_sessions"].as_u64() != Some(1) {
        assert!(
            Instant::now() < deadline,
            "the unused MCP session was never ended"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(tools_list(&addr, TOKEN_A, &unused).await.status, 404);
    assert_eq!(tools_list(&addr, TOKEN_A, &used).await.status, 200);

    // DELETE: 204, and the session is gone.
    let r = raw(&addr, "DELETE", "/mcp", Some(TOKEN_A), Some(&used), "").await;
    assert_eq!(r.status, 204, "{r:?}");
    assert_eq!(tools_list(&addr, TOKEN_A, &used).await.status, 404);
    // rmcp's client ends its MCP session with DELETE when it closes, and counts any
    // non-success as a failure.
    let c = s.connect(TOKEN_B).await;
    assert_eq!(healthz(&addr).await["mcp_sessions"].as_u64(), Some(1));
    c.cancel().await.expect("the client closed cleanly");
    let deadline = Instant::now() + ANSWER;
    while healthz(&addr).await["mcp_sessions"].as_u64() != Some(0) {
        assert!(
            Instant::now() < deadline,
            "the client's DELETE did not end its session"
        );
        tokio::task::yield_now().await;
    }
    s.stop().await;
}

/// Round 3, finding 3: 48 event streams from token A with `--http-max-connections 48` left
/// B's `/healthz` and every `/mcp` request unanswered. Now A's streams are capped (per MCP
/// session and per principal) and refused with a clear error past the cap, and B, /healthz
/// and /metrics are served while A's streams stay open.
#[tokio::test(flavor = "multi_thread")]
async fn finding_r3_3_one_principals_streams_leave_others_served() {
    if !require("python", "python3") {
        return;
    }
    let s = server(&["--http-max-connections", "48"]).await;
    let addr = s.addr.clone();

    // A: 24 MCP sessions, two streams each.
    let mut a_sessions = Vec::new();
    for _ in 0..24 {
        a_sessions.push(initialize(&addr, TOKEN_A).await);
    }
    let mut held = Vec::new();
    let mut opened = 0;
    let mut refused = 0;
    for id in &a_sessions {
        for _ in 0..2 {
            let (head, sock) = open_stream(&addr, TOKEN_A, id).await;
            match head.status {
                200 => opened += 1,
                429 => {
                    refused += 1;
                    assert!(
                        head.header("retry-after").is_some()
                            && head.header("connection") == Some("close"),
                        "{head:?}"
                    );
                }
                other => panic!("GET /mcp answered {other}: {head:?}"),
            }
            held.push(sock);
        }
    }
    eprintln!("A: {opened} streams open, {refused} refused");

    // With A's streams (and the sockets of its refused ones) still held open:
    let h = healthz(&addr).await;
    assert_eq!(h["status"], "ok", "{h}");
    let m = raw(&addr, "GET", "/metrics", Some(TOKEN_B), None, "").await;
    assert_eq!(m.status, 200, "{m:?}");
    assert!(m.body.contains("replbox_http_connections"), "{}", m.body);
    b_is_served(&s).await;
    assert!((1..=8).contains(&opened), "A holds {opened} streams");
    assert_eq!(opened + refused, 48);
    drop(held);

    // A few standalone streams per MCP session (C's).
    let c1 = initialize(&addr, TOKEN_C).await;
    let mut c_streams = Vec::new();
    let mut c_statuses = Vec::new();
    for _ in 0..3 {
        let (head, sock) = open_stream(&addr, TOKEN_C, &c1).await;
        c_statuses.push(head.status);
        if head.status == 429 {
            assert!(head.header("retry-after").is_some(), "{head:?}");
        }
        c_streams.push(sock);
    }
    assert_eq!(c_statuses, [200, 200, 429], "streams of one MCP session");
    drop(c_streams);

    s.stop().await;
}

/// Round 3, finding 3: connections a principal keeps open between requests count in its
/// share; past it, its request on another connection is refused (429) and that connection
/// closed, while another principal's is served.
#[tokio::test(flavor = "multi_thread")]
async fn finding_r3_3_a_principal_holds_at_most_its_share_of_connections() {
    // A quarter of 16: a share of 4.
    let s = server(&["--http-max-connections", "16"]).await;
    let addr = s.addr.clone();
    // Every connection of A's is kept open: the first starts A's MCP session, the others
    // list the tools in it.
    let (statuses, kept) = kept_alive_with_statuses(&addr, TOKEN_A, 8).await;
    assert_eq!(statuses[..4], [200, 200, 200, 200], "{statuses:?}");
    assert!(statuses[4..].iter().all(|&c| c == 429), "{statuses:?}");
    // B has a share of its own.
    let b = initialize(&addr, TOKEN_B).await;
    assert_eq!(tools_list(&addr, TOKEN_B, &b).await.status, 200);
    drop(kept);
    s.stop().await;
}

/// Round 3, finding 3: `/healthz` and `/metrics` answer even when every connection slot is
/// held (here by one principal's kept-alive connections, with a share as large as the cap);
/// an MCP request past the cap waits for a slot (as in the kernel's queue before), and past
/// a quarter of the cap waiting so, is answered 503 at once.
#[tokio::test(flavor = "multi_thread")]
async fn finding_r3_3_healthz_and_metrics_answer_with_every_slot_taken() {
    let s = server(&[
        "--http-max-connections",
        "8",
        "--http-max-connections-per-principal",
        "8",
        "--http-read-timeout-ms",
        "120000",
    ])
    .await;
    let addr = s.addr.clone();
    let hogs = kept_alive(&addr, TOKEN_A, 8).await;
    // Wait until the hogs hold every slot: /healthz then counts them and itself.
    let until_open = |n: u64| {
        let addr = addr.clone();
        async move {
            let deadline = Instant::now() + ANSWER;
            loop {
                let h = healthz(&addr).await;
                if h["connections"].as_u64() >= Some(n) {
                    return;
                }
                assert!(Instant::now() < deadline, "never {n} connections open: {h}");
                tokio::task::yield_now().await;
            }
        }
    };
    until_open(9).await;
    let m = raw(&addr, "GET", "/metrics", Some(TOKEN_B), None, "").await;
    assert_eq!(m.status, 200, "{m:?}");
    // Requests without a token are refused at once: they never wait for a slot (two of them
    // held both waiting places, for nobody, until a slot freed).
    for _ in 0..3 {
        let r = raw(&addr, "POST", "/mcp", None, None, INITIALIZE).await;
        assert_eq!(r.status, 401, "{r:?}");
    }
    assert_eq!(healthz(&addr).await["connections_waiting"], 0);
    // Two MCP requests wait for a slot (a quarter of 8); a third is told to come back.
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let addr = addr.clone();
            tokio::spawn(async move {
                raw(&addr, "POST", "/mcp", Some(TOKEN_B), None, INITIALIZE).await
            })
        })
        .collect();
    let deadline = Instant::now() + ANSWER;
    loop {
        let h = healthz(&addr).await;
        if h["connections_waiting"].as_u64() == Some(2) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the two requests never waited: {h}"
        );
        tokio::task::yield_now().await;
    }
    let r = raw(&addr, "POST", "/mcp", Some(TOKEN_C), None, INITIALIZE).await;
    assert_eq!(r.status, 503, "{r:?}");
    assert!(r.header("retry-after").is_some(), "{r:?}");
    assert!(r.body.contains("--http-max-connections"), "{}", r.body);
    // The slots free: the waiting requests are served.
    drop(hogs);
    for w in waiting {
        let r = w.await.expect("waiting request");
        assert_eq!(r.status, 200, "{r:?}");
    }
    s.stop().await;
}

/// Round 3, finding 3 (stalled connections): a connection counts in a principal's share only
/// once its request arrives, so a client without a token that opens connections and sends
/// half a request on each, reopening any the server closes, held every slot and every place
/// past the cap for the read timeout (here two minutes): `/healthz` and real requests went
/// unanswered. Now a connection silent past a short grace gives up its place to one that
/// needs it: the probe and B's requests are answered while the attacker keeps trying.
#[tokio::test(flavor = "multi_thread")]
async fn finding_r3_3_stalled_connections_cannot_hold_the_server() {
    let s = server(&[
        "--http-max-connections",
        "8",
        "--http-read-timeout-ms",
        "120000",
    ])
    .await;
    let addr = s.addr.clone();
    // Twice the slots and places: the rest waits in the kernel's queue, ahead of the others.
    let stop = tokio_util::sync::CancellationToken::new();
    let closed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut attackers = Vec::new();
    for _ in 0..24 {
        let (addr, stop, closed) = (addr.clone(), stop.clone(), closed.clone());
        attackers.push(tokio::spawn(async move {
            while !stop.is_cancelled() {
                let Ok(mut sock) = TcpStream::connect(&addr).await else {
                    continue;
                };
                if sock
                    .write_all(b"GET /mcp HTTP/1.1\r\nHost: ")
                    .await
                    .is_err()
                {
                    continue;
                }
                let mut buf = [0u8; 512];
                tokio::select! {
                    // The server closed it (or answered): open another at once.
                    _ = sock.read(&mut buf) => {
                        closed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    _ = stop.cancelled() => return,
                }
            }
        }));
    }
    // The attackers hold everything before the others come.
    let deadline = Instant::now() + ANSWER;
    loop {
        let h = healthz(&addr).await;
        if h["connections_closed_stalled"].as_u64() >= Some(8) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no stalled connection closed: {h}"
        );
    }
    let m = raw(&addr, "GET", "/metrics", Some(TOKEN_B), None, "").await;
    assert_eq!(m.status, 200, "{m:?}");
    let b = initialize(&addr, TOKEN_B).await;
    assert_eq!(tools_list(&addr, TOKEN_B, &b).await.status, 200);
    b_is_served(&s).await;
    let h = healthz(&addr).await;
    stop.cancel();
    for a in attackers {
        a.await.expect("attacker task");
    }
    assert!(
        closed.load(std::sync::atomic::Ordering::Relaxed) >= 8,
        "the attacker's connections were never closed: {h}"
    );
    s.stop().await;
}

/// Requests for no route: a client without a token sent one complete request to a path or
/// method nothing serves (404, 405) on each connection and kept it alive, resending every
/// few seconds: past its first request a connection is no longer pending, and it counted
/// in no principal's share, so such connections held every slot unbounded and B's request
/// waited forever. Now every connection that carries no principal closes after its answer.
#[tokio::test(flavor = "multi_thread")]
async fn finding_r3_3_requests_for_no_route_do_not_keep_slots() {
    let s = server(&[
        "--http-max-connections",
        "8",
        "--http-read-timeout-ms",
        "120000",
    ])
    .await;
    let addr = s.addr.clone();
    let routes = [
        ("GET", "/nope"),
        ("GET", "/mcp/"),
        ("POST", "/healthz"),
        ("OPTIONS", "/metrics"),
    ];
    let mut kept = Vec::new();
    for i in 0..8 {
        let (method, path) = routes[i % routes.len()];
        let mut sock = tokio::time::timeout(ANSWER, TcpStream::connect(&addr))
            .await
            .expect("connect in time")
            .expect("connect");
        sock.write_all(request(&addr, method, path, None, None, "", false).as_bytes())
            .await
            .expect("write");
        let r = read_head(&mut sock).await;
        assert!(matches!(r.status, 404 | 405), "{method} {path}: {r:?}");
        assert_eq!(
            r.header("connection"),
            Some("close"),
            "{method} {path}: {r:?}"
        );
        // The server closes it (the read timeout, two minutes, is past ANSWER).
        let mut rest = Vec::new();
        let eof = tokio::time::timeout(ANSWER, sock.read_to_end(&mut rest)).await;
        assert!(eof.is_ok(), "{method} {path}: the connection was kept open");
        kept.push(sock);
    }
    let b = initialize(&addr, TOKEN_B).await;
    assert_eq!(tools_list(&addr, TOKEN_B, &b).await.status, 200);
    drop(kept);
    s.stop().await;
}
