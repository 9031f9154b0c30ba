//! Scale-out behind a real nginx running deploy/nginx/replbox.conf (its example addresses
//! replaced by three local instances, TLS by a loopback port): MCP sessions and the REPL
//! sessions in them stay on one instance across connections and new MCP sessions, and
//! when that instance is killed clients see what docs/http.md says. Skipped with a printed
//! reason when nginx is not installed (a failure under REPLBOX_REQUIRE_ALL=1).

use crate::common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN_A: &str = "token-of-alice-0123456789";
const TOKEN_B: &str = "token-of-bob-9876543210ab";
/// The instances deploy/nginx/replbox.conf lists, in order (nodes r1, r2, r3).
const EXAMPLE_ADDRS: [&str; 3] = ["10.0.0.11:8765", "10.0.0.12:8765", "10.0.0.13:8765"];

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;
const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

/// nginx is on PATH, or the reason the test is skipped (a failure in CI).
fn have_nginx() -> bool {
    if on_path("nginx") {
        return true;
    }
    skip("nginx scale-out tests skipped: nginx is not on PATH");
    false
}

/// One `replbox serve --http 127.0.0.1:0` with both tokens (the harness's
/// `Server::http()`).
struct Instance {
    srv: HttpServer,
    addr: SocketAddr,
}

impl Instance {
    async fn start() -> Self {
        let srv = Server::http()
            .token(TOKEN_A)
            .token(TOKEN_B)
            .env_remove("REPLBOX_LOG")
            .start()
            .await;
        Self {
            addr: srv.addr,
            srv,
        }
    }

    /// `/healthz`, straight from the instance.
    async fn health(&self) -> Value {
        let r = raw(self.addr, "GET", "/healthz", &[], "").await;
        assert_eq!(r.status, 200, "{r:?}");
        serde_json::from_str(&r.body).expect("healthz is JSON")
    }

    async fn sessions(&self) -> u64 {
        self.health().await["sessions"].as_u64().unwrap_or(u64::MAX)
    }

    async fn kill(&mut self) {
        self.srv.kill().await;
    }
}

/// nginx in the foreground as one process (so killing it leaves nothing), with the deploy
/// configuration pointed at `instances` and listening on a loopback port.
struct Nginx {
    child: std::process::Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// deploy/nginx/replbox.conf with its example instances replaced by `instances` and its
/// TLS listener by a plain one on `listen`.
fn deploy_config(instances: &[SocketAddr], listen: SocketAddr) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/nginx/replbox.conf");
    let mut conf = std::fs::read_to_string(&path).expect("read deploy/nginx/replbox.conf");
    for (example, real) in EXAMPLE_ADDRS.iter().zip(instances) {
        let (example_re, real_re) = (
            example.replace('.', r"\."),
            real.to_string().replace('.', r"\."),
        );
        // The upstream and $replbox_pin name the address, $replbox_node matches it.
        assert_eq!(conf.matches(example).count(), 2, "{example} in {conf}");
        assert_eq!(
            conf.matches(&example_re).count(),
            1,
            "{example_re} in {conf}"
        );
        conf = conf
            .replace(example, &real.to_string())
            .replace(&example_re, &real_re);
    }
    let mut out = String::new();
    for line in conf.lines() {
        let t = line.trim_start();
        if t.starts_with("ssl_") {
            continue;
        }
        if t.starts_with("listen ") {
            out.push_str(&format!("    listen {listen};\n"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    assert!(
        out.contains(&format!("listen {listen};")),
        "no listen line in {path:?}"
    );
    out
}

impl Nginx {
    async fn start(instances: &[SocketAddr]) -> Self {
        // nginx takes a fixed port: pick a free one, and pick again if another process took
        // it before nginx bound it.
        for _ in 0..3 {
            if let Some(nginx) = Self::try_start(instances).await {
                return nginx;
            }
        }
        panic!("nginx did not start on three free ports");
    }

    async fn try_start(instances: &[SocketAddr]) -> Option<Self> {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path().display();
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port");
        std::fs::write(
            dir.path().join("replbox.conf"),
            deploy_config(instances, addr),
        )
        .expect("write replbox.conf");
        let main = format!(
            "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log stderr info;\n\
             events {{ worker_connections 256; }}\n\
             http {{\n  access_log /dev/stderr;\n\
             client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
             fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n\
             scgi_temp_path {d}/scgi;\n  include {d}/replbox.conf;\n}}\n"
        );
        let conf = dir.path().join("nginx.conf");
        std::fs::write(&conf, main).expect("write nginx.conf");
        let check = std::process::Command::new("nginx")
            .arg("-t")
            .arg("-c")
            .arg(&conf)
            .output()
            .expect("run nginx -t");
        assert!(
            check.status.success(),
            "nginx rejects the configuration: {}",
            String::from_utf8_lossy(&check.stderr)
        );
        let child = std::process::Command::new("nginx")
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start nginx");
        let mut nginx = Self {
            child,
            addr,
            _dir: dir,
        };
        // Up when replbox's /healthz answers through it (bounded); gone if it could not bind.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(st)) = nginx.child.try_wait() {
                eprintln!("nginx exited at start ({st}); trying another port");
                return None;
            }
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                let h = raw(addr, "GET", "/healthz", &[], "").await;
                if h.status == 200 && h.body.contains("\"status\":\"ok\"") {
                    return Some(nginx);
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "nginx did not serve on {addr}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }
}

/// An answer read off the socket.
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

    /// The JSON-RPC message with this id in an SSE or JSON body.
    fn rpc(&self, id: u64) -> Value {
        self.body
            .lines()
            .map(|l| l.strip_prefix("data:").unwrap_or(l).trim())
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["id"] == json!(id))
            .unwrap_or_else(|| panic!("no JSON-RPC answer with id {id} in {self:?}"))
    }
}

/// One HTTP/1.1 exchange on a new connection.
async fn raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Raw {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if method == "POST" {
        req.push_str("Content-Type: application/json\r\n");
        req.push_str("Accept: application/json, text/event-stream\r\n");
    }
    req.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    ));
    s.write_all(req.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "no complete answer to {method} {path}");
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Raw {
        status,
        headers,
        body: body.to_string(),
    }
}

/// An MCP session driven by hand through nginx, each request on a new connection.
struct RawSession {
    nginx: SocketAddr,
    token: String,
    /// The id as the client sees it: `<node>.<replbox's id>`.
    id: String,
    next: u64,
}

impl RawSession {
    async fn open(nginx: SocketAddr, token: &str) -> Self {
        let auth = format!("Bearer {token}");
        let r = raw(
            nginx,
            "POST",
            "/mcp",
            &[("Authorization", &auth)],
            INITIALIZE,
        )
        .await;
        assert_eq!(r.status, 200, "initialize through nginx: {r:?}");
        let id = r
            .header("mcp-session-id")
            .unwrap_or_else(|| panic!("no Mcp-Session-Id: {r:?}"))
            .to_string();
        let s = Self {
            nginx,
            token: token.to_string(),
            id,
            next: 2,
        };
        let r = s.post(INITIALIZED).await;
        assert_eq!(r.status, 202, "notifications/initialized: {r:?}");
        s
    }

    /// The instance (index into the deploy file's list) the id names.
    fn node(&self) -> usize {
        let node = self.id.split_once('.').map(|(n, _)| n).unwrap_or_default();
        match node {
            "r1" => 0,
            "r2" => 1,
            "r3" => 2,
            _ => panic!("session id {:?} names no node", self.id),
        }
    }

    async fn post(&self, body: &str) -> Raw {
        let auth = format!("Bearer {}", self.token);
        raw(
            self.nginx,
            "POST",
            "/mcp",
            &[("Authorization", &auth), ("Mcp-Session-Id", &self.id)],
            body,
        )
        .await
    }

    /// A tool call; the answer's `result`.
    async fn call(&mut self, tool: &str, args: Value) -> Value {
        let id = self.next;
        self.next += 1;
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                          "params": {"name": tool, "arguments": args}});
        let r = self.post(&body.to_string()).await;
        assert_eq!(r.status, 200, "{tool}: {r:?}");
        r.rpc(id)["result"].clone()
    }
}

type Client = RunningService<RoleClient, ()>;

/// rmcp's client through nginx. When a response stream breaks, rmcp resumes it (GET with
/// `Last-Event-ID`); by default it retries without end, backing off from the server's
/// `retry` (3 s), so a call in flight on a dead instance would wait for the caller's own
/// timeout. Two retries here make the call fail as a client with a bounded policy sees it.
async fn connect(url: &str, token: &str) -> Client {
    let mut config =
        StreamableHttpClientTransportConfig::with_uri(url.to_string()).auth_header(token);
    let mut policy = rmcp::transport::common::client_side_sse::ExponentialBackoff::default();
    policy.max_times = Some(2);
    config.retry_config = std::sync::Arc::new(policy);
    ().serve(StreamableHttpClientTransport::from_config(config))
        .await
        .unwrap_or_else(|e| panic!("MCP handshake through nginx failed: {e}"))
}

async fn call(c: &Client, tool: &str, args: Value) -> Result<Value, ServiceError> {
    let obj = args.as_object().cloned().expect("arguments are an object");
    let r = c
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(obj))
        .await?;
    Ok(serde_json::to_value(r).expect("result as JSON"))
}

fn text(result: &Value) -> String {
    result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["text"].as_str())
        .collect()
}

async fn three_behind_nginx() -> (Vec<Instance>, Nginx) {
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(Instance::start().await);
    }
    let addrs: Vec<SocketAddr> = instances.iter().map(|i| i.addr).collect();
    let nginx = Nginx::start(&addrs).await;
    (instances, nginx)
}

/// Which instances hold REPL sessions, straight from each one's /healthz.
async fn session_counts(instances: &[Instance]) -> Vec<u64> {
    let mut v = Vec::new();
    for i in instances {
        v.push(i.sessions().await);
    }
    v
}

#[tokio::test]
async fn a_session_stays_on_its_instance_across_connections_and_reconnects() {
    if !have_nginx() || !require("python", "python3") {
        return;
    }
    let (instances, nginx) = three_behind_nginx().await;

    // Every request below is a new TCP connection to nginx; the MCP session id routes it.
    let mut s = RawSession::open(nginx.addr, TOKEN_A).await;
    let node = s.node();
    let started = s.call("session_start", json!({"language": "python"})).await;
    assert_eq!(started["isError"], json!(false), "{started}");
    let sid = started["structuredContent"]["session_id"]
        .as_str()
        .expect("session_id")
        .to_string();
    let set = s
        .call("session_eval", json!({"session_id": sid, "code": "x = 41"}))
        .await;
    assert_eq!(set["structuredContent"]["status"], "ok", "{set}");
    let mut expected = vec![0, 0, 0];
    expected[node] = 1;
    assert_eq!(
        session_counts(&instances).await,
        expected,
        "the REPL session is on the node its MCP session names"
    );
    for _ in 0..5 {
        let got = s
            .call("session_eval", json!({"session_id": sid, "code": "x + 1"}))
            .await;
        assert_eq!(got["structuredContent"]["output"], "42\n", "{got}");
    }

    // A new MCP session of the same principal (a client restarted) lands on the same
    // instance, so the REPL session is still there.
    let c = connect(&nginx.url(), TOKEN_A).await;
    let listed = call(&c, "session_list", json!({}))
        .await
        .expect("session_list");
    assert!(text(&listed).contains(&sid), "{listed}");
    let got = call(
        &c,
        "session_eval",
        json!({"session_id": sid, "code": "x + 1"}),
    )
    .await
    .expect("session_eval");
    assert_eq!(got["structuredContent"]["output"], "42\n", "{got}");
    let _ = c.cancel().await;

    // Another principal behind the same balancer cannot see it, wherever it lands.
    let mut b = RawSession::open(nginx.addr, TOKEN_B).await;
    let other = b
        .call("session_eval", json!({"session_id": sid, "code": "x"}))
        .await;
    assert_eq!(other["isError"], json!(true), "{other}");
    assert!(text(&other).contains("no session"), "{other}");
    assert_eq!(session_counts(&instances).await, expected);

    // The route comes from the session id, not the token: the same id under another
    // node's name reaches that instance, which does not know it.
    let (_, bare) = s.id.split_once('.').expect("node.id");
    let elsewhere = RawSession {
        nginx: nginx.addr,
        token: TOKEN_A.to_string(),
        id: format!("r{}.{bare}", (node + 1) % 3 + 1),
        next: 2,
    };
    let r = elsewhere
        .post(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#)
        .await;
    assert_eq!(r.status, 404, "{r:?}");
    let r = s
        .post(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#)
        .await;
    assert_eq!(r.status, 200, "{r:?}");

    // A session id naming a node is routed only to the listed instances; a made-up node
    // is balanced like a request without one and is unknown there.
    let forged = RawSession {
        nginx: nginx.addr,
        token: TOKEN_A.to_string(),
        id: "r9.00000000-0000-0000-0000-000000000000".into(),
        next: 2,
    };
    let r = forged
        .post(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#)
        .await;
    assert_eq!(r.status, 404, "{r:?}");
}

#[tokio::test]
async fn when_an_instance_is_killed_clients_see_what_the_docs_say() {
    if !have_nginx() || !require("python", "python3") {
        return;
    }
    let (mut instances, nginx) = three_behind_nginx().await;

    // rmcp's client through nginx: a REPL session with state, then a call in flight.
    let c = connect(&nginx.url(), TOKEN_A).await;
    let started = call(&c, "session_start", json!({"language": "python"}))
        .await
        .expect("session_start");
    let sid = started["structuredContent"]["session_id"]
        .as_str()
        .expect("session_id")
        .to_string();
    let set = call(
        &c,
        "session_eval",
        json!({"session_id": sid, "code": "x = 41"}),
    )
    .await
    .expect("session_eval");
    assert_eq!(set["structuredContent"]["status"], "ok", "{set}");
    let counts = session_counts(&instances).await;
    let node = counts
        .iter()
        .position(|&n| n == 1)
        .unwrap_or_else(|| panic!("no instance holds the session: {counts:?}"));
    // A raw MCP session of the same principal lands on the same instance.
    let raw_session = RawSession::open(nginx.addr, TOKEN_A).await;
    assert_eq!(raw_session.node(), node);

    let c = std::sync::Arc::new(c);
    let c2 = c.clone();
    let sid2 = sid.clone();
    let in_flight = tokio::spawn(async move {
        call(
            &c2,
            "session_eval",
            json!({"session_id": sid2, "code": "import time; time.sleep(60)", "timeout_ms": 120000}),
        )
        .await
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while instances[node].health().await["in_flight"] != json!(1) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the call never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    instances[node].kill().await;

    // The call in flight gets no result: its stream broke, resuming it is answered 404,
    // and once the retries are spent the call fails. Its outcome is unknown.
    let outcome = tokio::time::timeout(Duration::from_secs(60), in_flight)
        .await
        .expect("the call in flight neither failed nor returned")
        .expect("task");
    assert!(
        matches!(outcome, Err(ServiceError::TransportClosed)),
        "a call in flight on a killed instance: {outcome:?}"
    );

    // A request with the old MCP session id: the instance is gone, nginx answers as for an
    // unknown session.
    let r = raw_session
        .post(r#"{"jsonrpc":"2.0","id":9,"method":"tools/list"}"#)
        .await;
    assert_eq!(r.status, 404, "{r:?}");
    assert!(r.body.contains("Session not found"), "{r:?}");

    // rmcp's client re-initializes by itself on that 404 and lands on another instance,
    // where the REPL session does not exist.
    let listed = call(&c, "session_list", json!({}))
        .await
        .expect("session_list after the kill");
    assert!(!text(&listed).contains(&sid), "{listed}");
    let gone = call(
        &c,
        "session_eval",
        json!({"session_id": sid, "code": "x + 1"}),
    )
    .await
    .expect("session_eval after the kill");
    assert_eq!(gone["isError"], json!(true), "{gone}");
    assert!(
        text(&gone).contains("no session") && text(&gone).contains("Start one with session_start"),
        "{gone}"
    );
    // Starting again works, on a live instance.
    let again = call(&c, "session_start", json!({"language": "python"}))
        .await
        .expect("session_start after the kill");
    assert_eq!(again["isError"], json!(false), "{again}");
    let mut live = Vec::new();
    for (i, inst) in instances.iter().enumerate() {
        if i != node {
            live.push(inst.sessions().await);
        }
    }
    assert_eq!(live.iter().sum::<u64>(), 1, "{live:?}");
    // The balancer's health endpoint still answers.
    let h = raw(nginx.addr, "GET", "/healthz", &[], "").await;
    assert_eq!(h.status, 200, "{h:?}");
}
