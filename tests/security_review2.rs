//! Attack tests of the second adversarial review, through the built server: one principal
//! binding many sandbox uids, one principal's sessions filling the egress proxy, and stdio
//! replies piling up for a client that does not read. Each fails without its fix.
//!
//! A level that cannot start here is skipped with its reason, or fails under
//! REPLBOX_REQUIRE_ALL=1.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::json;

const TOKEN_A: &str = "token-of-alice-0123456789";
const TOKEN_B: &str = "token-of-bob-9876543210ab";
const ALL: &[&str] = &["bwrap", "landlock", "none"];

fn we_are_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The principals the lock files of `base..base + n` name (empty: unbound).
fn owners(base: u32, n: u32) -> Vec<String> {
    (base..base + n)
        .map(|uid| {
            std::fs::read_to_string(format!("/run/replbox/{uid}"))
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        })
        .collect()
}

// ----- One principal binds many uids -----

// An ended session keeps its uid while its files are kept, and a principal's next session
// bound a fresh uid rather than take one of its own back: a principal starting and closing
// sessions in a loop bound every uid of the pool, for good (the bindings outlive the
// server), and every other principal was refused. A principal now has at most
// --max-active-per-principal + 4 uids bound; past that its oldest ended session gives its
// uid back (its files are removed).
#[tokio::test(flavor = "multi_thread")]
async fn a_principal_looping_start_and_close_binds_a_bounded_number_of_uids() {
    if !we_are_root() {
        skip("uids are leased only when the server runs as root");
        return;
    }
    const UIDS: u32 = 8;
    // --max-active-per-principal 1, plus 4 for ended sessions' files.
    const BOUND: usize = 5;
    let tokens = format!("{TOKEN_A},{TOKEN_B}");
    // Cold starts only, then with warm sessions (whose uids stay unbound when taken, so
    // they bind nothing; their ended sessions' kept files hold unbound uids, which any
    // caller's start takes back when it needs one).
    for (i, (level, pool)) in ALL.iter().flat_map(|l| [(l, "0"), (l, "4")]).enumerate() {
        let base = 174_000 + 10 * i as u32;
        unbind_test_uids(base, UIDS);
        let (uids, base_s) = (UIDS.to_string(), base.to_string());
        let args = [
            "--sandbox",
            level,
            "--uids",
            &uids,
            "--uid-base",
            &base_s,
            "--max-active-per-principal",
            "1",
            "--session-pool",
            pool,
        ];
        let s = match Server::http()
            .args(args)
            .env("REPLBOX_TOKENS", &tokens)
            .try_start()
            .await
        {
            Ok(s) => s,
            Err(e) => {
                skip(format_args!("level {level} does not work here: {e}"));
                continue;
            }
        };
        let a = s.connect(TOKEN_A).await;
        let b = s.connect(TOKEN_B).await;
        let (mut ids, mut warm) = (Vec::new(), 0);
        for n in 0..UIDS + 2 {
            let o = http_call(&a, "session_start", json!({"language": "bash"})).await;
            assert!(!o.is_error, "{level}: A's start #{n}: {}", o.text);
            warm += usize::from(o.structured["warm"] == json!(true));
            let id = o.s("session_id").to_string();
            let o = http_call(&a, "session_close", json!({"session_id": id})).await;
            assert!(!o.is_error, "{level}: {}", o.text);
            ids.push(id);
        }
        let bound: Vec<String> = owners(base, UIDS)
            .into_iter()
            .filter(|o| !o.is_empty())
            .collect();
        assert!(
            !bound.is_empty() && bound.len() <= BOUND,
            "{level}: A bound {bound:?}, more than {BOUND} ({warm} of its starts warm)"
        );
        eprintln!("{level}: {warm} of A's {} starts were warm", ids.len());
        if pool == "0" {
            assert_eq!(warm, 0, "{level}: warm starts with --session-pool 0");
        }
        // The oldest ended sessions gave their uids back: their files are gone, the newest
        // one's are kept.
        let o = http_call(&a, "session_list", json!({})).await;
        let kept: Vec<&str> = o.structured["ended"]
            .as_array()
            .map(|v| v.as_slice())
            .unwrap_or_default()
            .iter()
            .filter(|e| e.get("files_kept_until").is_some())
            .filter_map(|e| e["session_id"].as_str())
            .collect();
        if warm == 0 {
            assert!(
                kept.len() <= BOUND,
                "{level}: kept {kept:?} of {}",
                o.structured
            );
            assert!(
                kept.contains(&ids[ids.len() - 1].as_str()) && !kept.contains(&ids[0].as_str()),
                "{level}: kept {kept:?} of {ids:?}"
            );
        }
        // B still gets a uid, and its session works.
        let o = http_call(&b, "session_start", json!({"language": "bash"})).await;
        assert!(!o.is_error, "{level}: B's session_start: {}", o.text);
        let o = http_call(
            &b,
            "session_eval",
            json!({"session_id": o.s("session_id"), "code": "echo $((6*7))"}),
        )
        .await;
        assert!(o.text.contains("42"), "{level}: {}", o.text);
        let _ = a.cancel().await;
        let _ = b.cancel().await;
        s.stop().await;
    }
}

// ----- One principal's sessions fill the egress proxy -----

/// A loopback listener that accepts connections and holds them open (a tunnel's upstream
/// that never closes), until the test ends.
fn holding_listener() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in l.incoming().flatten() {
            held.push(c);
        }
    });
    port
}

/// Python (run once per session) defining `tunnels(n)`: open `n` CONNECT tunnels through
/// the session's proxy to 127.0.0.1:`port` (with the credentials of its proxy URL), keep the ones that opened, and print one line
/// per distinct answer (the refusals with their text).
fn tunnels_code(port: u16) -> String {
    format!(
        r#"import base64, os, socket, collections, urllib.parse
_u = urllib.parse.urlsplit(os.environ['HTTP_PROXY'])
_h, _p = _u.hostname, _u.port
_auth = base64.b64encode((_u.username + ':' + _u.password).encode())
held = []
def tunnels(n):
    seen = []
    for _ in range(n):
        s = socket.create_connection((_h, int(_p)), timeout=30)
        s.sendall(b'CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nProxy-Authorization: Basic ' + _auth + b'\r\n\r\n')
        d = b''
        while b'\r\n\r\n' not in d:
            c = s.recv(4096)
            if not c:
                break
            d += c
        if d.startswith(b'HTTP/1.1 200 '):
            held.append(s)
            seen.append('open')
            continue
        while True:
            c = s.recv(4096)
            if not c:
                break
            d += c
        s.close()
        seen.append('refused: ' + d.split(b'\r\n\r\n', 1)[-1].decode(errors='replace').strip())
    for k, v in collections.Counter(seen).items():
        print(v, k)
"#
    )
}

/// A python session of `client` with `tunnels` defined.
async fn tunnel_session(client: &rmcp::Peer<rmcp::RoleClient>, port: u16, level: &str) -> String {
    let o = http_call(client, "session_start", json!({"language": "python"})).await;
    assert!(!o.is_error, "{level}: session_start: {}", o.text);
    let id = o.s("session_id").to_string();
    let o = http_call(
        client,
        "session_eval",
        json!({"session_id": id, "code": tunnels_code(port)}),
    )
    .await;
    assert_eq!(o.structured["status"], "ok", "{level}: {}", o.text);
    id
}

/// Open `n` tunnels in session `id`; what `tunnels` printed.
async fn open_tunnels(client: &rmcp::Peer<rmcp::RoleClient>, id: &str, n: usize) -> String {
    let o = http_call(
        client,
        "session_eval",
        json!({"session_id": id, "code": format!("tunnels({n})")}),
    )
    .await;
    assert_eq!(o.structured["status"], "ok", "{}", o.text);
    o.text
}

// The proxy's 512 connections were shared by every session of the server: one principal's
// 16 sessions, each holding its 32, took them all and other principals' code had no
// egress. A principal's sessions and runs now hold at most 64 connections together (the
// next is refused with a 429 saying so), and other principals still get through.
#[tokio::test(flavor = "multi_thread")]
async fn one_principals_sessions_cannot_hold_every_egress_connection() {
    if !we_are_root() {
        skip("the egress tests run the server as root");
        return;
    }
    if !require("python", "python3") {
        return;
    }
    let tokens = format!("{TOKEN_A},{TOKEN_B}");
    let port = holding_listener();
    let host = format!("127.0.0.1:{port}");
    for level in ["bwrap", "landlock"] {
        let args = ["--sandbox", level, "--allow-host", &host];
        let s = match Server::http()
            .args(args)
            .env("REPLBOX_TOKENS", &tokens)
            .try_start()
            .await
        {
            Ok(s) => s,
            Err(e) => {
                skip(format_args!("level {level} does not work here: {e}"));
                continue;
            }
        };
        let a = s.connect(TOKEN_A).await;
        let b = s.connect(TOKEN_B).await;
        // Two of A's sessions hold 32 tunnels each (an endpoint's most).
        let a1 = tunnel_session(&a, port, level).await;
        let a2 = tunnel_session(&a, port, level).await;
        for id in [&a1, &a2] {
            let out = open_tunnels(&a, id, 32).await;
            assert_eq!(out, "32 open\n", "{level}");
        }
        // A third session of A is refused by the proxy, saying why.
        let a3 = tunnel_session(&a, port, level).await;
        let out = open_tunnels(&a, &a3, 1).await;
        assert!(
            out.starts_with("1 refused: replbox egress: this client's sessions and runs already have 64 connections")
                && out.contains("close some"),
            "{level}: {out}"
        );
        // B is not affected.
        let b1 = tunnel_session(&b, port, level).await;
        let out = open_tunnels(&b, &b1, 2).await;
        assert_eq!(out, "2 open\n", "{level}");
        // Once A closes a session, its tunnels are given back.
        let o = http_call(&a, "session_close", json!({"session_id": a1})).await;
        assert!(!o.is_error, "{level}: {}", o.text);
        // (They are given back as the closed session's connections are dropped: poll.)
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let out = open_tunnels(&a, &a3, 1).await;
            if out == "1 open\n" {
                break;
            }
            assert!(
                out.contains("already have 64") && tokio::time::Instant::now() < deadline,
                "{level}: {out}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let _ = a.cancel().await;
        let _ = b.cancel().await;
        s.stop().await;
    }
}

// ----- Stdio replies pile up for a client that does not read -----

/// VmRSS of `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// A server on stdio driven line by line, initialized: the child, its pid, its stdin and
/// its stdout's lines.
struct Raw {
    srv: RawServer,
    pid: u32,
    /// None while a flood's writer has it.
    stdin: Option<tokio::process::ChildStdin>,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Raw {
    async fn start(args: &[&str]) -> Raw {
        use tokio::io::{AsyncBufReadExt, BufReader};
        let mut srv = Server::stdio().args(args).spawn_raw();
        let pid = srv.pid;
        let stdin = srv.child.stdin.take();
        let lines = BufReader::new(srv.child.stdout.take().expect("stdout")).lines();
        let mut raw = Raw {
            srv,
            pid,
            stdin,
            lines,
        };
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"}}});
        let first = raw.call(init).await;
        assert_eq!(first["id"], 0, "{first}");
        raw.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        raw
    }

    async fn send(&mut self, v: serde_json::Value) {
        use tokio::io::AsyncWriteExt;
        let line = format!("{v}\n");
        let stdin = self.stdin.as_mut().expect("stdin");
        stdin.write_all(line.as_bytes()).await.expect("write");
    }

    /// The next answer (notifications, which carry no id, passed over).
    async fn read(&mut self) -> serde_json::Value {
        loop {
            let line = self.lines.next_line().await.expect("read").expect("a line");
            let v: serde_json::Value = serde_json::from_str(&line).expect("JSON");
            if v.get("id").is_some() {
                return v;
            }
        }
    }

    async fn call(&mut self, v: serde_json::Value) -> serde_json::Value {
        self.send(v).await;
        self.read().await
    }

    /// Write `requests` from another task and watch the server's RSS for 10 s while
    /// nothing is read (the answers of a server that reads everything keep piling up
    /// after the writes are done): at most `bound_kib` over where it started. Then read `requests.len()` answers, each checked by `ok`; their ids.
    async fn flood(
        &mut self,
        requests: Vec<String>,
        bound_kib: u64,
        ok: impl Fn(&serde_json::Value) -> bool,
    ) -> Vec<u64> {
        use tokio::io::AsyncWriteExt;
        let n = requests.len();
        let base = rss_kib(self.pid);
        let mut stdin = self.stdin.take().expect("stdin");
        let writer = tokio::spawn(async move {
            for chunk in requests.chunks(50) {
                stdin
                    .write_all(chunk.concat().as_bytes())
                    .await
                    .expect("write");
            }
            stdin
        });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut peak = base;
        while tokio::time::Instant::now() < deadline {
            peak = peak.max(rss_kib(self.pid));
            assert!(
                peak <= base + bound_kib,
                "the server's RSS grew from {base} KiB to {peak} KiB"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        eprintln!("RSS {base} KiB at the start, at most {peak} KiB while the client did not read");
        let mut ids = Vec::new();
        while ids.len() < n {
            let v = self.read().await;
            assert!(ok(&v), "{:.300}", v.to_string());
            ids.push(v["id"].as_u64().expect("an id"));
        }
        self.stdin = Some(writer.await.expect("writer"));
        ids.sort_unstable();
        ids
    }
}

// Over stdio the server kept reading requests while their answers waited for a client
// that did not read them, and its memory grew without end. Reading now stops while 64
// answers wait: a client that writes thousands of tools/list requests (about 13 KB of
// answer each) and reads none leaves the server's memory bounded, and once it reads,
// every answer arrives, once (rmcp handles requests concurrently, so answers come in the
// order their handlers finish, not necessarily the order asked).
#[tokio::test(flavor = "multi_thread")]
async fn stdio_answers_to_a_client_that_does_not_read_are_bounded() {
    const N: u64 = 4000;
    // Far below the ~52 MB the answers take (13 KB each), far above what 64 of them take
    // (under 1 MB; the server grew by 2.4 MiB here).
    const BOUND_KIB: u64 = 16 * 1024;
    let mut raw = Raw::start(&[]).await;
    let requests = (1..=N)
        .map(|i| format!("{{\"jsonrpc\":\"2.0\",\"id\":{i},\"method\":\"tools/list\"}}\n"))
        .collect();
    let ids = raw
        .flood(requests, BOUND_KIB, |v| v["result"]["tools"].is_array())
        .await;
    assert_eq!(ids, (1..=N).collect::<Vec<_>>());
    let _ = raw.srv.child.kill().await;
}

// The bound above counted answers only once made: requests whose handler takes a moment
// (reading a 4 MiB file as a resource) were all read at once, and 300 of them took the
// server from 29 MiB to 2,160 MiB. Requests read and not yet answered count too now. (A
// 1 MiB file here: the bound holds the same way, and the client parses a quarter of it.)
#[tokio::test(flavor = "multi_thread")]
async fn stdio_answers_being_made_are_bounded_too() {
    const N: u64 = 150;
    // 150 answers of 1.4 MB (with the file read for each) are about 360 MB; 8 in the
    // making plus 8 MiB queued are about 30.
    const BOUND_KIB: u64 = 64 * 1024;
    let mut raw = Raw::start(&[]).await;
    let call = |id: u64, name: &str, args: serde_json::Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": name, "arguments": args}})
    };
    let o = raw
        .call(call(1, "session_start", json!({"language": "bash"})))
        .await;
    let id = o["result"]["structuredContent"]["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{o}"))
        .to_string();
    let code = "head -c 1048000 /dev/zero | tr '\\0' x > big.txt; echo made";
    let o = raw
        .call(call(
            2,
            "session_eval",
            json!({"session_id": id, "code": code}),
        ))
        .await;
    assert!(o.to_string().contains("made"), "{o}");
    let uri = format!("replbox://sessions/{id}/files/big.txt");
    let requests = (100..100 + N)
        .map(|i| {
            let r = json!({"jsonrpc": "2.0", "id": i, "method": "resources/read",
                           "params": {"uri": uri}});
            format!("{r}\n")
        })
        .collect();
    let ids = raw
        .flood(requests, BOUND_KIB, |v| v["result"]["contents"].is_array())
        .await;
    assert_eq!(ids, (100..100 + N).collect::<Vec<_>>());
    let _ = raw.srv.child.kill().await;
}
