//! Several servers as one cluster (`--cluster`): each test starts its own etcd on loopback
//! ports and two or three `replbox serve --http` nodes with one shared directory of
//! journals, and drives them through rmcp's HTTP client. A node killed with SIGKILL, or
//! stopped, leaves its sessions to the others: they adopt them at once as suspended (each
//! on its principal's heir, listed there before any call), and the owner's next call, on
//! whichever node it reaches, replays it; another principal never sees it (one node of
//! three killed with 20 sessions of four principals on them: none lost, none held twice). An etcd of three members that
//! loses one, its leader, changes nothing.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine;
use common::*;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use serde_json::{Value, json};

const ALICE: &str = "alice-token-0123456789abcdef";
const BOB: &str = "bob-token-fedcba9876543210";
/// The four principals of the fleet of sessions (name, token).
const PRINCIPALS: [(&str, &str); 4] = [
    ("alice", ALICE),
    ("bob", BOB),
    ("carol", "carol-token-0a1b2c3d4e5f6789"),
    ("dave", "dave-token-9f8e7d6c5b4a3210"),
];

/// A free loopback port (released for the program that binds it next).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// An etcd of the test's own, of one member or several: loopback ports, a temporary data
/// directory; killed on drop.
struct Etcd {
    members: Vec<tokio::process::Child>,
    /// Each member's client URL.
    urls: Vec<String>,
    /// The first member's.
    url: String,
    _data: tempfile::TempDir,
}

impl Etcd {
    /// One member, started and answering, or `None` (skipped with the reason) where etcd is
    /// missing.
    async fn start() -> Option<Self> {
        Self::start_members(1).await
    }

    /// `n` members forming one cluster, every one answering.
    async fn start_members(n: usize) -> Option<Self> {
        if !on_path("etcd") {
            skip("cluster tests skipped: etcd is not on PATH (apt-get install etcd-server)");
            return None;
        }
        let data = tempfile::tempdir().expect("tempdir");
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let initial: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect();
        let (mut members, mut urls) = (Vec::new(), Vec::new());
        for (i, (client, peer)) in ports.iter().enumerate() {
            let url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let child = tokio::process::Command::new("etcd")
                .args(["--name", &format!("m{i}")])
                .arg("--data-dir")
                .arg(data.path().join(format!("m{i}")))
                .args([
                    "--listen-client-urls",
                    &url,
                    "--advertise-client-urls",
                    &url,
                ])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &initial.join(",")])
                .args(["--initial-cluster-state", "new"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .expect("spawn etcd");
            members.push(child);
            urls.push(url);
        }
        let me = Self {
            members,
            url: urls[0].clone(),
            urls,
            _data: data,
        };
        // Ready when every member answers a read (a cluster's once it has a leader).
        for url in &me.urls {
            let t0 = Instant::now();
            while range_at(url, "replbox/ready").await.is_err() {
                assert!(
                    t0.elapsed() < Duration::from_secs(30),
                    "etcd did not answer on {url}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Some(me)
    }

    /// The key-value of `key`, from the first live member that answers.
    async fn range(&self, key: &str) -> Result<Option<Value>, String> {
        let mut last = Err("no member".to_string());
        for (url, m) in self.urls.iter().zip(&self.members) {
            if m.id().is_some() {
                last = range_at(url, key).await;
                if last.is_ok() {
                    break;
                }
            }
        }
        last
    }

    /// The value of `key`.
    async fn get(&self, key: &str) -> Result<Option<String>, String> {
        Ok(self.range(key).await?.as_ref().map(value_of))
    }

    /// SIGKILL member `i` (and reap it).
    async fn kill_member(&mut self, i: usize) {
        let _ = self.members[i].kill().await;
    }

    /// The index of the member that leads the cluster now.
    async fn leader(&self) -> usize {
        let mut ids = Vec::new();
        let mut leader = None;
        for url in &self.urls {
            let r = reqwest::Client::new()
                .post(format!("{url}/v3/maintenance/status"))
                .body("{}")
                .send()
                .await
                .expect("status");
            let v: Value = r.json().await.expect("status json");
            ids.push(v["header"]["member_id"].as_str().unwrap_or("").to_string());
            leader = v["leader"].as_str().map(String::from).or(leader);
        }
        let leader = leader.expect("a leader");
        ids.iter()
            .position(|id| *id == leader)
            .expect("the leader is a member")
    }

    /// Freeze or thaw etcd (SIGSTOP, SIGCONT): out of reach without losing its state.
    fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = self.members[0].id().expect("etcd runs") as i32;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).expect("signal etcd");
    }

    /// Wait (bounded) until `key` is gone. A node's key, since its lease has expired then
    /// (a session's key comes back at once when a survivor adopts it eagerly).
    async fn wait_gone(&self, key: &str, within: Duration) {
        let t0 = Instant::now();
        while self.get(key).await != Ok(None) {
            assert!(t0.elapsed() < within, "{key} still held after {within:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The key-value of `key` at the etcd member `url`, as etcd's JSON gateway gives it (as
/// replbox talks to it): value in base64, revisions as strings.
async fn range_at(url: &str, key: &str) -> Result<Option<Value>, String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let body = json!({"key": b64.encode(key)}).to_string();
    let r = reqwest::Client::new()
        .post(format!("{url}/v3/kv/range"))
        .body(body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let v: Value = serde_json::from_slice(&r.bytes().await.map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    if let Some(e) = v.get("error") {
        return Err(e.to_string());
    }
    Ok(v["kvs"].get(0).cloned())
}

/// A key-value's value, decoded.
fn value_of(kv: &Value) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    let raw = b64
        .decode(kv["value"].as_str().unwrap_or(""))
        .unwrap_or_default();
    String::from_utf8_lossy(&raw).into_owned()
}

/// The shared directory of journals and the tokens file.
struct Shared {
    _t: tempfile::TempDir,
    dir: PathBuf,
    tokens: PathBuf,
}

fn shared() -> Shared {
    let t = tempfile::tempdir().expect("tempdir");
    let root = std::fs::canonicalize(t.path()).expect("real path");
    let dir = root.join("shared");
    std::fs::create_dir(&dir).unwrap();
    let tokens = root.join("tokens");
    let lines: String = PRINCIPALS
        .iter()
        .map(|(n, t)| format!("{n}:{t}\n"))
        .collect();
    std::fs::write(&tokens, lines).unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    Shared { _t: t, dir, tokens }
}

/// A node of the cluster.
async fn node(etcd: &Etcd, sh: &Shared, id: &str) -> HttpServer {
    node_at(&etcd.url, sh, id).await
}

/// A node that reaches etcd at `url`.
async fn node_at(url: &str, sh: &Shared, id: &str) -> HttpServer {
    Server::http()
        .arg("--tokens-file")
        .arg(&sh.tokens)
        .args(["--cluster", url, "--node-id", id])
        .arg("--state-dir")
        .arg(sh.dir.join(id))
        .env_remove("REPLBOX_LOG")
        .start()
        .await
}

/// Where MCP calls go: a node, or the router in front of the nodes.
trait Endpoint {
    fn mcp_url(&self) -> String;
}

impl Endpoint for HttpServer {
    fn mcp_url(&self) -> String {
        self.url()
    }
}

/// An endpoint by its URL, for calls made from spawned tasks.
#[derive(Clone)]
struct At(String);

impl Endpoint for At {
    fn mcp_url(&self) -> String {
        self.0.clone()
    }
}

/// One tool call through a fresh HTTP client presenting `token`.
async fn call(s: &impl Endpoint, token: &str, tool: &str, args: Value) -> Out {
    let config =
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
            s.mcp_url(),
        )
        .auth_header(token);
    let client =
        ().serve(StreamableHttpClientTransport::from_config(config))
            .await
            .expect("handshake");
    let r = client
        .call_tool(
            CallToolRequestParams::new(tool.to_string())
                .with_arguments(args.as_object().cloned().unwrap()),
        )
        .await
        .expect("call");
    let _ = client.cancel().await;
    Out {
        text: r
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect(),
        structured: r.structured_content.unwrap_or(Value::Null),
        is_error: r.is_error.unwrap_or(false),
        images: Vec::new(),
    }
}

/// Read a resource through a fresh HTTP client presenting `token`; Err is the protocol
/// error's message.
async fn read(s: &impl Endpoint, token: &str, uri: &str) -> Result<String, String> {
    let config =
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
            s.mcp_url(),
        )
        .auth_header(token);
    let client =
        ().serve(StreamableHttpClientTransport::from_config(config))
            .await
            .expect("handshake");
    let r = client
        .read_resource(rmcp::model::ReadResourceRequestParams::new(uri))
        .await
        .map_err(|e| e.to_string());
    let _ = client.cancel().await;
    match r?.contents.into_iter().next() {
        Some(rmcp::model::ResourceContents::TextResourceContents { text, .. }) => Ok(text),
        other => Err(format!("not text: {other:?}")),
    }
}

async fn eval(s: &impl Endpoint, token: &str, id: &str, code: &str) -> Out {
    call(
        s,
        token,
        "session_eval",
        json!({"session_id": id, "code": code}),
    )
    .await
}

/// Alice's python session on `s` with two cells run: `x = 41`, `y = x + 1`.
async fn alices_session(s: &impl Endpoint) -> String {
    let o = call(s, ALICE, "session_start", json!({"language": "python"})).await;
    assert!(!o.is_error, "{}", o.text);
    let id = o.s("session_id").to_string();
    for code in ["x = 41", "y = x + 1"] {
        let o = eval(s, ALICE, &id, code).await;
        assert_eq!(status(&o), "ok", "{}", o.text);
    }
    id
}

fn journal(dir: &Path, node: &str, id: &str) -> PathBuf {
    dir.join(node).join(format!("{id}.journal"))
}

/// One session of a fleet: the node it was started on, its principal (an index into
/// [`PRINCIPALS`]) and the value its one cell set.
struct Member {
    id: String,
    node: usize,
    principal: usize,
    value: String,
}

/// How many sessions a fleet has.
const FLEET: usize = 20;

/// [`FLEET`] python sessions of the four principals spread over `nodes` (session `i` on
/// node `i % nodes`, of principal `i % 4`: every principal on every node), each with one
/// cell run, `v = '<principal>-<i>'`. One lane of calls per node.
async fn fleet(nodes: &[At]) -> Vec<Member> {
    let mut lanes = tokio::task::JoinSet::new();
    for (n, at) in nodes.iter().enumerate() {
        let (at, count) = (at.clone(), nodes.len());
        lanes.spawn(async move {
            let mut out = Vec::new();
            for i in (n..FLEET).step_by(count) {
                let principal = i % PRINCIPALS.len();
                let (name, token) = PRINCIPALS[principal];
                let o = call(&at, token, "session_start", json!({"language": "python"})).await;
                assert!(!o.is_error, "{}", o.text);
                let id = o.s("session_id").to_string();
                let value = format!("{name}-{i}");
                let o = eval(&at, token, &id, &format!("v = '{value}'")).await;
                assert_eq!(status(&o), "ok", "{}", o.text);
                out.push(Member {
                    id,
                    node: n,
                    principal,
                    value,
                });
            }
            out
        });
    }
    let mut all = Vec::new();
    while let Some(lane) = lanes.join_next().await {
        all.extend(lane.expect("a lane of the fleet"));
    }
    assert_eq!(all.len(), FLEET);
    all
}

/// The sessions `token`'s principal sees held by `at` in its `session_list`: (id, "open")
/// and (id, "suspended") (those that ended, closed ones among them, are not held).
async fn listing(at: &impl Endpoint, token: &str) -> Vec<(String, String)> {
    let l = call(at, token, "session_list", json!({})).await;
    let mut out = Vec::new();
    for e in l.structured["sessions"].as_array().into_iter().flatten() {
        out.push((
            e["session_id"].as_str().unwrap_or("?").into(),
            "open".into(),
        ));
    }
    for e in l.structured["ended"].as_array().into_iter().flatten() {
        if e["state"] == "suspended" {
            let id = e["session_id"].as_str().unwrap_or("?");
            out.push((id.into(), "suspended".into()));
        }
    }
    out
}

/// Every principal's sessions as the live nodes list them, sorted (a session held twice is
/// listed twice).
async fn listed_by_principal(nodes: &[At], live: &[usize]) -> Vec<Vec<(String, String)>> {
    let mut all = Vec::new();
    for (_, token) in PRINCIPALS {
        let mut listed = Vec::new();
        for &n in live {
            listed.extend(listing(&nodes[n], token).await);
        }
        listed.sort();
        all.push(listed);
    }
    all
}

/// After node `dead` of `nodes` died: its sessions are adopted eagerly, listed as
/// suspended by their owners' `session_list` on the live nodes before any call names them;
/// every session of the fleet answers its owner with its value on a live node (the dead
/// node's replayed there, wherever the owner's call lands), and no one else; each
/// principal's `session_list` on the live nodes is exactly its own sessions, each once.
/// One lane of calls per principal.
async fn check_fleet(fleet: Vec<Member>, nodes: &[At], dead: usize, dir: &Path, names: &[&str]) {
    let live: Vec<usize> = (0..nodes.len()).filter(|&n| n != dead).collect();
    let want = |state_of_orphans: &str| -> Vec<Vec<(String, String)>> {
        (0..PRINCIPALS.len())
            .map(|p| {
                let mut v: Vec<(String, String)> = fleet
                    .iter()
                    .filter(|m| m.principal == p)
                    .map(|m| {
                        let state = if m.node == dead {
                            state_of_orphans
                        } else {
                            "open"
                        };
                        (m.id.clone(), state.to_string())
                    })
                    .collect();
                v.sort();
                v
            })
            .collect()
    };
    let (want_suspended, want_open) = (want("suspended"), want("open"));
    // Eager adoption: before any call names them, the dead node's sessions are listed as
    // suspended by their owners on the live nodes, each on one node.
    let t0 = Instant::now();
    loop {
        let now = listed_by_principal(nodes, &live).await;
        if now == want_suspended {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "not adopted eagerly: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut lanes = tokio::task::JoinSet::new();
    let mut by_principal: Vec<Vec<Member>> = (0..PRINCIPALS.len()).map(|_| Vec::new()).collect();
    for m in fleet {
        by_principal[m.principal].push(m);
    }
    for members in by_principal {
        let (nodes, live) = (nodes.to_vec(), live.clone());
        let (dir, names): (PathBuf, Vec<String>) = (
            dir.to_path_buf(),
            names.iter().map(|s| s.to_string()).collect(),
        );
        lanes.spawn(async move {
            for (k, m) in members.iter().enumerate() {
                let orphan = m.node == dead;
                // An orphan goes to whichever live node its owner's next call reaches.
                let serving = if orphan { live[k % live.len()] } else { m.node };
                let at = &nodes[serving];
                let (_, token) = PRINCIPALS[m.principal];
                let (stranger_name, stranger) = PRINCIPALS[(m.principal + 1) % PRINCIPALS.len()];
                // Another principal's call neither reaches nor moves it.
                let o = eval(at, stranger, &m.id, "print(v)").await;
                assert_eq!(
                    o.error_kind(),
                    "unknown_session",
                    "{stranger_name}: {}",
                    o.text
                );
                if orphan {
                    assert!(!journal(&dir, &names[dead], &m.id).exists(), "{}", m.id);
                }
                let o = eval(at, token, &m.id, "print(v)").await;
                assert_eq!(output(&o), format!("{}\n", m.value), "{}", o.text);
                if orphan {
                    assert_eq!(o.structured["replayed"], 1, "{}", o.structured);
                    assert!(journal(&dir, &names[serving], &m.id).is_file(), "{}", m.id);
                }
                let o = eval(at, stranger, &m.id, "print(v)").await;
                assert_eq!(
                    o.error_kind(),
                    "unknown_session",
                    "{stranger_name}: {}",
                    o.text
                );
            }
        });
    }
    while let Some(lane) = lanes.join_next().await {
        lane.expect("a principal's lane");
    }
    // Nothing lost, nothing shown to another principal, nothing listed twice (a session
    // taken over from the node that adopted it eagerly is no longer listed there).
    assert_eq!(listed_by_principal(nodes, &live).await, want_open);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_nodes_sessions_are_adopted_once_and_only_by_their_owners() {
    if !require("python", "python3") {
        return;
    }
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let sh = shared();
    let (mut a, b, c) = tokio::join!(
        node(&etcd, &sh, "a"),
        node(&etcd, &sh, "b"),
        node(&etcd, &sh, "c")
    );
    let id = alices_session(&a).await;
    let key = format!("replbox/sessions/{id}");
    // A fleet of sessions of four principals on the three nodes, a's among them.
    let ats = [At(a.url()), At(b.url()), At(c.url())];
    let fleet = fleet(&ats).await;

    // The registry names the node and the principal, never a token.
    let record = etcd.get(&key).await.unwrap().expect("the session's key");
    let record: Value = serde_json::from_str(&record).unwrap();
    assert_eq!(record["node"], "a", "{record}");
    assert_eq!(record["principal"], "alice", "{record}");
    assert!(!record.to_string().contains("token"), "{record}");

    // While its node lives: elsewhere for its owner, unknown for anyone else.
    let o = eval(&b, ALICE, &id, "y").await;
    assert_eq!(o.error_kind(), "session_elsewhere", "{}", o.text);
    assert!(!o.text.contains("\"a\""), "names no node: {}", o.text);
    let o = eval(&b, BOB, &id, "y").await;
    assert_eq!(o.error_kind(), "unknown_session", "{}", o.text);
    // A session id that is a path names no journal.
    for bad in ["../a/x", "a", &format!("../a/{id}")] {
        let o = eval(&b, ALICE, bad, "y").await;
        assert_eq!(o.error_kind(), "unknown_session", "{bad}: {}", o.text);
    }

    a.kill().await;
    let killed = Instant::now();
    // Adopted eagerly once a's lease expired, before any call names it: suspended on
    // exactly one live node (the heir of alice's sessions), listed there for her only, its
    // journal moved there.
    let t0 = Instant::now();
    let heir = loop {
        let mut holders = Vec::new();
        for (name, n) in [("b", &b), ("c", &c)] {
            let l = listing(n, ALICE).await;
            if l.contains(&(id.clone(), "suspended".to_string())) {
                holders.push(name);
            }
        }
        assert!(holders.len() <= 1, "adopted twice: {holders:?}");
        if let [h] = holders[..] {
            break h;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "never adopted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let record: Value = serde_json::from_str(&etcd.get(&key).await.unwrap().unwrap()).unwrap();
    assert_eq!(record["node"], heir, "{record}");
    assert_eq!(record["suspended"], true, "{record}");
    assert!(journal(&sh.dir, heir, &id).is_file());
    assert!(!journal(&sh.dir, "a", &id).exists());
    // Another principal still sees nothing, and moves nothing.
    for n in [&b, &c] {
        let o = eval(n, BOB, &id, "y").await;
        assert_eq!(o.error_kind(), "unknown_session", "{}", o.text);
        let l = call(n, BOB, "session_list", json!({})).await;
        assert!(!l.structured.to_string().contains(&id), "{}", l.structured);
    }

    // Its owner's calls race on two nodes: exactly one serves it (the heir restoring it,
    // or the other node taking it over from the heir).
    let asked = Instant::now();
    let (ob, oc) = tokio::join!(eval(&b, ALICE, &id, "y"), eval(&c, ALICE, &id, "y"));
    let served = Instant::now();
    let (won, lost, winner) = match (ob.is_error, oc.is_error) {
        (false, true) => (ob, oc, "b"),
        (true, false) => (oc, ob, "c"),
        _ => panic!(
            "exactly one node serves it:\nb: {}\nc: {}",
            ob.text, oc.text
        ),
    };
    assert_eq!(output(&won), "42\n", "{}", won.text);
    assert_eq!(won.structured["replayed"], 2, "{}", won.structured);
    assert!(
        ["session_elsewhere", "busy"].contains(&lost.error_kind()),
        "{}",
        lost.text
    );
    eprintln!(
        "adoption: {} ms from SIGKILL to the first answer (lease TTL included), {} ms of it \
the call (a take-over, if any, and the replay)",
        served.duration_since(killed).as_millis(),
        served.duration_since(asked).as_millis()
    );
    // The journal moved to the winner; the registry says so.
    assert!(journal(&sh.dir, winner, &id).is_file());
    assert!(!journal(&sh.dir, "a", &id).exists());
    let record: Value = serde_json::from_str(&etcd.get(&key).await.unwrap().unwrap()).unwrap();
    assert_eq!(record["node"], winner, "{record}");
    let (w, other) = if winner == "b" { (&b, &c) } else { (&c, &b) };
    let o = eval(w, ALICE, &id, "x + y").await;
    assert_eq!(output(&o), "83\n", "{}", o.text);
    let o = eval(other, ALICE, &id, "x").await;
    assert_eq!(o.error_kind(), "session_elsewhere", "{}", o.text);
    let o = eval(w, BOB, &id, "x").await;
    assert_eq!(o.error_kind(), "unknown_session", "{}", o.text);
    // Closed: out of the registry and off the disk.
    let o = call(w, ALICE, "session_close", json!({"session_id": id})).await;
    assert!(!o.is_error, "{}", o.text);
    assert_eq!(etcd.get(&key).await.unwrap(), None);
    assert!(!journal(&sh.dir, winner, &id).exists());

    // Every session of the fleet: none lost, each served only to its owner.
    check_fleet(fleet, &ats, 0, &sh.dir, &["a", "b", "c"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_node_hands_its_sessions_over_at_once_behind_haproxy() {
    if !require("python", "python3") {
        return;
    }
    if !on_path("haproxy") {
        skip(
            "the cluster behind haproxy is not tested: haproxy is not on PATH (apt-get install haproxy)",
        );
        return;
    }
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let sh = shared();
    let (a, b) = tokio::join!(node(&etcd, &sh, "a"), node(&etcd, &sh, "b"));
    let router = Haproxy::start(&[a.addr, b.addr]).await;
    // Through deploy/haproxy/replbox.cfg: alice's calls land on the node her token hashes to.
    let id = alices_session(&router).await;
    let key = format!("replbox/sessions/{id}");
    let record: Value = serde_json::from_str(&etcd.get(&key).await.unwrap().unwrap()).unwrap();
    let (owner, other, heir) = match record["node"].as_str() {
        Some("a") => (a, b, "b"),
        Some("b") => (b, a, "a"),
        _ => panic!("{record}"),
    };
    let o = eval(&router, ALICE, &id, "open('note.txt', 'w').write('kept')").await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    // SIGTERM: the node revokes its lease as it leaves, so nothing waits for the TTL, and
    // haproxy sends the next call to the other node, which adopts the session. A resource
    // of the session is reachable first: adopting it there replays the cell that wrote it.
    owner.stop().await;
    let uri = format!("replbox://sessions/{id}/files/note.txt");
    assert_eq!(
        read(&router, BOB, &uri).await.map_err(|e| e.contains(&id)),
        Err(true)
    );
    assert_eq!(read(&router, ALICE, &uri).await.as_deref(), Ok("kept"));
    let o = eval(&router, ALICE, &id, "y").await;
    assert_eq!(output(&o), "42\n", "{}", o.text);
    assert!(journal(&sh.dir, heir, &id).is_file());
    let o = eval(&other, ALICE, &id, "x + y").await;
    assert_eq!(output(&o), "83\n", "{}", o.text);
}

/// haproxy in the foreground running deploy/haproxy/replbox.cfg, its example nodes replaced
/// by `nodes` and its port by a free loopback one; killed on drop.
struct Haproxy {
    _child: tokio::process::Child,
    addr: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

impl Endpoint for Haproxy {
    fn mcp_url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }
}

impl Haproxy {
    async fn start(nodes: &[std::net::SocketAddr]) -> Self {
        let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/haproxy/replbox.cfg");
        let shipped = std::fs::read_to_string(shipped).unwrap();
        let port = free_port();
        let mut cfg = String::new();
        for line in shipped.lines() {
            let t = line.trim_start();
            if t.starts_with("bind :") {
                cfg.push_str(&format!("    bind 127.0.0.1:{port}\n"));
            } else if t.starts_with("server r1 ") {
                for (i, n) in nodes.iter().enumerate() {
                    cfg.push_str(&format!("    server r{} {n}\n", i + 1));
                }
            } else if !t.starts_with("server r") {
                cfg.push_str(line);
                cfg.push('\n');
            }
        }
        assert!(cfg.contains(&format!("bind 127.0.0.1:{port}")), "{cfg}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replbox.cfg");
        std::fs::write(&path, cfg).unwrap();
        let child = tokio::process::Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start haproxy");
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let t0 = Instant::now();
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "haproxy did not listen on {addr}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Self {
            _child: child,
            addr,
            _dir: dir,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_flags_are_checked_at_start() {
    let sh = shared();
    for (args, says) in [
        (
            vec!["--cluster", "http://127.0.0.1:1", "--node-id", "../x"],
            "--node-id",
        ),
        (
            vec!["--cluster", "http://127.0.0.1:1", "--node-id", "n"],
            "--state-dir",
        ),
        (vec!["--node-id", "n"], "needs --cluster"),
    ] {
        let e = Server::http()
            .arg("--tokens-file")
            .arg(&sh.tokens)
            .args(&args)
            .try_start()
            .await
            .err()
            .unwrap_or_else(|| panic!("{args:?} started"));
        assert!(e.log.contains(says), "{args:?}: {}", e.log);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_cut_off_from_etcd_serves_nothing_until_it_is_back() {
    if !require("python", "python3") {
        return;
    }
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let sh = shared();
    let a = node(&etcd, &sh, "a").await;
    let id = alices_session(&a).await;
    etcd.signal(nix::sys::signal::Signal::SIGSTOP);
    // Fenced once its lease may have expired: no evaluation, no new session, a clear error.
    let t0 = Instant::now();
    let refused = loop {
        let o = eval(&a, ALICE, &id, "y").await;
        if o.is_error {
            break o;
        }
        assert_eq!(output(&o), "42\n", "{}", o.text);
        assert!(t0.elapsed() < Duration::from_secs(30), "still serving");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let started = call(&a, ALICE, "session_start", json!({"language": "python"})).await;
    etcd.signal(nix::sys::signal::Signal::SIGCONT);
    assert_eq!(started.error_kind(), "unavailable", "{}", started.text);
    assert_eq!(refused.error_kind(), "unavailable", "{}", refused.text);
    assert!(
        refused.text.contains("cluster registry"),
        "{}",
        refused.text
    );
    // Back: the session is served again, from memory or replayed from its journal.
    let t0 = Instant::now();
    loop {
        let o = eval(&a, ALICE, &id, "x + y").await;
        if !o.is_error {
            assert_eq!(output(&o), "83\n", "{}", o.text);
            break;
        }
        assert_eq!(o.error_kind(), "unavailable", "{}", o.text);
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "not back: {}",
            o.text
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let o = call(&a, ALICE, "session_start", json!({"language": "python"})).await;
    assert!(!o.is_error, "{}", o.text);
}

/// Session `id`'s entry in `s`'s session_list for alice, if open.
async fn listed(s: &HttpServer, id: &str) -> Option<Value> {
    let l = call(s, ALICE, "session_list", json!({})).await;
    l.structured["sessions"]
        .as_array()?
        .iter()
        .find(|e| e["session_id"] == id)
        .cloned()
}

/// A TCP relay to etcd that the test can cut (every connection dropped, new ones refused)
/// and mend: one node's link to the registry, and only that one.
struct Link {
    url: String,
    cut: tokio::sync::watch::Sender<bool>,
    _accept: tokio::task::JoinHandle<()>,
}

impl Link {
    async fn to(etcd: &Etcd) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let target = etcd.url.trim_start_matches("http://").to_string();
        let (cut, watch) = tokio::sync::watch::channel(false);
        let accept = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut watch = watch.clone();
                if *watch.borrow() {
                    continue; // dropped: refused
                }
                let target = target.clone();
                tokio::spawn(async move {
                    let Ok(mut up) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut conn, &mut up) => {}
                        _ = watch.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Self {
            url,
            cut,
            _accept: accept,
        }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cut_off_owner_never_appends_to_a_journal_another_node_adopted() {
    if !require("python", "python3") {
        return;
    }
    let Some(etcd) = Etcd::start().await else {
        return;
    };
    let sh = shared();
    let link = Link::to(&etcd).await;
    let (a, b) = tokio::join!(node_at(&link.url, &sh, "a"), node(&etcd, &sh, "b"));
    let id = alices_session(&a).await;
    // A cell runs on a until the test lets it finish.
    let cell = "import os, time\nwhile not os.path.exists('go'): time.sleep(0.02)\nz = 1";
    let (in_flight, ()) = tokio::join!(eval(&a, ALICE, &id, cell), async {
        let t0 = Instant::now();
        let cwd = loop {
            if let Some(e) = listed(&a, &id).await.filter(|e| e["busy"] == true) {
                break PathBuf::from(e["cwd"].as_str().expect("cwd"));
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "the cell never ran");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        // a loses etcd (nothing else): its lease expires, b adopts the session.
        link.set_cut(true);
        etcd.wait_gone("replbox/nodes/a", Duration::from_secs(30))
            .await;
        let o = eval(&b, ALICE, &id, "y").await;
        assert_eq!(output(&o), "42\n", "{}", o.text);
        assert_eq!(o.structured["replayed"], 2, "{}", o.structured);
        // Now the cell on a ends; a still cannot renew, and has not learnt it lost the lease.
        std::fs::write(cwd.join("go"), "").unwrap();
    });
    // Its answer is no result, and its line is not in the journal b writes now.
    assert_eq!(in_flight.error_kind(), "unavailable", "{}", in_flight.text);
    let j = std::fs::read_to_string(journal(&sh.dir, "b", &id)).unwrap();
    // Its `started` line is there (it began before the cut), its `cell` line is not.
    let cells = j.lines().filter(|l| l.contains(r#""type":"cell""#));
    assert!(
        !cells.clone().any(|l| l.contains("exists('go')")),
        "the cut-off node's cell was journaled:\n{j}"
    );
    assert_eq!(cells.count(), 3, "x = 41, y = x + 1, y: {j}");
    assert!(j.contains("\"type\":\"claimed\""), "{j}");
    let o = eval(&b, ALICE, &id, "z").await;
    assert!(o.text.contains("NameError"), "{}", o.text);
    let o = eval(&b, ALICE, &id, "x + y").await;
    assert_eq!(output(&o), "83\n", "{}", o.text);
    // Mended: a serves the session no more; it is b's.
    link.set_cut(false);
    let t0 = Instant::now();
    loop {
        let o = eval(&a, ALICE, &id, "x").await;
        if o.error_kind() == "session_elsewhere" {
            break;
        }
        assert_eq!(o.error_kind(), "unavailable", "{}", o.text);
        assert!(t0.elapsed() < Duration::from_secs(30), "{}", o.text);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn the_shipped_haproxy_and_kubernetes_examples_are_valid() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    if on_path("haproxy") {
        let cfg = deploy.join("haproxy/replbox.cfg");
        let out = std::process::Command::new("haproxy")
            .arg("-c")
            .arg("-f")
            .arg(&cfg)
            .output()
            .expect("run haproxy -c");
        let said = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{}: {said}", cfg.display());
        assert!(!said.contains("[WARNING]"), "{said}");
    } else {
        skip(
            "the haproxy example is not checked: haproxy is not on PATH (apt-get install haproxy)",
        );
    }
    // The built-in kinds against Kubernetes' schemas, offline (kubernetes-validate carries
    // them); the Gateway API kinds against their CRDs' schemas, kept in deploy/k8s/schemas.
    let k8s = deploy.join("k8s");
    let python = |code: &str, args: &[&Path]| {
        let out = std::process::Command::new("python3")
            .arg("-c")
            .arg(code)
            .args(args)
            .output()
            .expect("run python3");
        let said = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), said)
    };
    if python("import kubernetes_validate, yaml, jsonschema", &[]).0 {
        let (ok, said) = python(
            "import sys\nfrom kubernetes_validate.__main__ import main\nsys.argv[0] = 'kubernetes-validate'\nsys.exit(main())",
            &[
                Path::new("--strict"),
                &k8s.join("etcd.yaml"),
                &k8s.join("replbox.yaml"),
            ],
        );
        assert!(ok, "{said}");
        assert_eq!(said.matches(" passed ").count(), 8, "{said}");
        let (ok, said) = python(GATEWAY_CHECK, &[&k8s]);
        assert!(
            ok && said.trim() == "HTTPRoute ok\nBackendTrafficPolicy ok",
            "{said}"
        );
    } else {
        skip(
            "the Kubernetes examples are not validated: python3 cannot import \
kubernetes_validate (pip install kubernetes-validate)",
        );
    }
}

/// Checks every document of `ARGV[1]/gateway.yaml` against its kind's schema in
/// `ARGV[1]/schemas`, and that the schemas do refuse a wrong value; prints `KIND ok` for each.
const GATEWAY_CHECK: &str = r#"import json, os, sys, yaml, jsonschema
k8s = sys.argv[1]
schemas = {
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute-v1.json",
    ("gateway.envoyproxy.io/v1alpha1", "BackendTrafficPolicy"): "backendtrafficpolicy-v1alpha1.json",
}
for doc in yaml.safe_load_all(open(os.path.join(k8s, "gateway.yaml"))):
    name = schemas[(doc["apiVersion"], doc["kind"])]
    v = jsonschema.Draft7Validator(json.load(open(os.path.join(k8s, "schemas", name))))
    errors = [e.message for e in v.iter_errors(doc)]
    assert not errors, (doc["kind"], errors)
    wrong = json.loads(json.dumps(doc))
    if doc["kind"] == "HTTPRoute":
        wrong["spec"]["rules"][0]["timeouts"]["request"] = "forever"
    else:
        wrong["spec"]["loadBalancer"]["type"] = "Nonsense"
    assert list(v.iter_errors(wrong)), (doc["kind"], "a wrong value passes")
    print(doc["kind"], "ok")
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_three_member_etcd_loses_its_leader_and_the_cluster_goes_on() {
    if !require("python", "python3") {
        return;
    }
    let Some(mut etcd) = Etcd::start_members(3).await else {
        return;
    };
    let sh = shared();
    // Every node tries the leader first: its loss is the worst one.
    let leader = etcd.leader().await;
    let mut order = vec![etcd.urls[leader].clone()];
    for (i, u) in etcd.urls.iter().enumerate() {
        if i != leader {
            order.push(u.clone());
        }
    }
    let urls = order.join(",");
    let (a, mut b) = tokio::join!(node_at(&urls, &sh, "a"), node_at(&urls, &sh, "b"));
    let id = alices_session(&a).await;
    let key = format!("replbox/sessions/{id}");
    let held = etcd.range(&key).await.unwrap().expect("alice's key");
    let bob = BOB;
    let o = call(&b, bob, "session_start", json!({"language": "python"})).await;
    let bobs = o.s("session_id").to_string();
    let o = eval(&b, bob, &bobs, "z = 7").await;
    assert_eq!(status(&o), "ok", "{}", o.text);

    // The leader dies, then node b. b's lease expires (through the two members left);
    // a's is renewed through them meanwhile: its claim is the same one.
    etcd.kill_member(leader).await;
    b.kill().await;
    etcd.wait_gone("replbox/nodes/b", Duration::from_secs(60))
        .await;
    let still = etcd.range(&key).await.unwrap().expect("alice's key kept");
    assert_eq!(still["create_revision"], held["create_revision"], "{still}");
    assert_eq!(still["lease"], held["lease"], "{still}");
    // a serves its session from memory, adopts b's, starts new ones.
    let o = eval(&a, ALICE, &id, "x + y").await;
    assert_eq!(output(&o), "83\n", "{}", o.text);
    assert!(o.structured["replayed"].is_null(), "{}", o.structured);
    let o = eval(&a, bob, &bobs, "print(z)").await;
    assert_eq!(output(&o), "7\n", "{}", o.text);
    assert_eq!(o.structured["replayed"], 1, "{}", o.structured);
    let o = call(&a, ALICE, "session_start", json!({"language": "python"})).await;
    assert!(!o.is_error, "{}", o.text);
}
