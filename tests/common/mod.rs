//! Test harness: the built `replbox` binary driven through rmcp's MCP client.
//!
//! - Servers: [`Server::stdio()`] and [`Server::http()`], builders with `.arg()`, `.env()`,
//!   `.uid()`, `.token()`, then `.start().await` (`server.rs`); a dropped server takes its
//!   whole process tree with it. `HttpChild` (`http_child.rs`) is the older HTTP launcher a
//!   few files still use; new tests use `Server::http()`.
//! - One test per (behaviour, language): `per_lang!` and `per_row!` (`langs.rs`).
//! - A check that cannot run here calls [`skip`] with the reason (`skip.rs`); with
//!   `REPLBOX_REQUIRE_ALL=1` that fails.
#![allow(dead_code, unused_imports, unused_macros)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, ProgressNotificationParam};
use rmcp::service::NotificationContext;
use rmcp::{ClientHandler, RoleClient};
use serde_json::{Value, json};

mod http_child;
mod langs;
mod server;
mod skip;
pub use http_child::HttpChild;
pub use langs::*;
pub use server::*;
pub use skip::*;

pub const BIN: &str = env!("CARGO_BIN_EXE_replbox");

/// Records what the server sends besides responses.
#[derive(Clone, Default)]
pub struct Recorder {
    pub progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
    /// Log notifications (`notifications/message`), as their JSON.
    pub logs: Arc<Mutex<Vec<Value>>>,
    /// Declare the MCP tasks extension (`io.modelcontextprotocol/tasks`).
    pub tasks: bool,
    /// `notifications/resources/list_changed` received.
    pub resources_changed: Arc<std::sync::atomic::AtomicUsize>,
}

impl Recorder {
    /// The log notifications received so far.
    pub fn logs(&self) -> Vec<Value> {
        self.logs.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

/// A client's configuration that declares the MCP tasks extension.
pub fn tasks_client() -> rmcp::model::ClientConfig {
    rmcp::model::ClientConfig::new(
        rmcp::model::ClientCapabilities::builder()
            .enable_tasks()
            .build(),
        rmcp::model::Implementation::new("replbox-tests", "0"),
    )
}

impl ClientHandler for Recorder {
    fn get_info(&self) -> rmcp::model::ClientConfig {
        if self.tasks {
            tasks_client()
        } else {
            rmcp::model::ClientConfig::default()
        }
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _ctx: NotificationContext<RoleClient>,
    ) {
        if let Ok(mut p) = self.progress.lock() {
            p.push(params);
        }
    }

    async fn on_resource_list_changed(&self, _ctx: NotificationContext<RoleClient>) {
        self.resources_changed
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    #[allow(deprecated)] // MCP logging (SEP-2577)
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _ctx: NotificationContext<RoleClient>,
    ) {
        if let (Ok(mut l), Ok(v)) = (self.logs.lock(), serde_json::to_value(&params)) {
            l.push(v);
        }
    }
}

/// What a tool call returned.
#[derive(Debug, Clone)]
pub struct Out {
    pub text: String,
    pub structured: Value,
    pub is_error: bool,
    /// (mime type, base64 data) of image contents.
    pub images: Vec<(String, String)>,
}

impl Out {
    /// The `kind` of a refused call (`{"error": {"kind", "message", …}}`), or "" when the
    /// result is not a tool error.
    pub fn error_kind(&self) -> &str {
        if !self.is_error {
            return "";
        }
        self.structured["error"]["kind"].as_str().unwrap_or("")
    }

    pub fn s(&self, key: &str) -> &str {
        self.structured[key].as_str().unwrap_or_else(|| {
            panic!(
                "structured field {key} is not a string: {}",
                self.structured
            )
        })
    }
}

/// Parent pid and state of a process, from /proc.
pub fn ppid_state(pid: i32) -> Option<(i32, char)> {
    let stat = procfs::process::Process::new(pid).ok()?.stat().ok()?;
    Some((stat.ppid, stat.state))
}

/// Whether a process exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    ppid_state(pid).is_some_and(|(_, st)| st != 'Z')
}

/// Wait (bounded) until none of `pids` is alive; returns those still alive.
pub async fn wait_gone(pids: &[i32], within: Duration) -> Vec<i32> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let left: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
        if left.is_empty() || tokio::time::Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `status` of a session tool result.
pub fn status(o: &Out) -> &str {
    o.structured["status"].as_str().unwrap_or("?")
}

/// The `output` of a session tool result.
pub fn output(o: &Out) -> &str {
    o.structured["output"].as_str().unwrap_or("")
}

impl TestServer {
    /// Start a session, failing the test if it cannot.
    pub async fn start_session(&self, lang: &str) -> String {
        let out = self.call("session_start", json!({"language": lang})).await;
        assert!(!out.is_error, "session_start {lang}: {}", out.text);
        out.s("session_id").to_string()
    }

    pub async fn eval(&self, id: &str, code: &str) -> Out {
        self.call("session_eval", json!({"session_id": id, "code": code}))
            .await
    }

    pub async fn eval_t(&self, id: &str, code: &str, timeout_ms: u64) -> Out {
        self.call(
            "session_eval",
            json!({"session_id": id, "code": code, "timeout_ms": timeout_ms}),
        )
        .await
    }
}

pub fn descendants(root: i32) -> Vec<i32> {
    let mut table = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok())
            && let Some((ppid, state)) = ppid_state(pid)
            && state != 'Z'
        {
            table.push((pid, ppid));
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(pid, ppid) in &table {
            if ppid == p {
                out.push(pid);
                frontier.push(pid);
            }
        }
    }
    out
}

/// Live processes anywhere on the host whose command line contains `needle` (inside a
/// sandbox's pid namespace a program only knows its namespace pid, so tests find its host
/// pid by something unique it runs with).
pub fn processes_with(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid == std::process::id() as i32 {
            continue;
        }
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(needle) && ppid_state(pid).is_some_and(|(_, st)| st != 'Z') {
            out.push(pid);
        }
    }
    out
}

/// Wait until no live process has `needle` in its command line (bounded); return those left.
pub async fn wait_none_with(needle: &str, within: Duration) -> Vec<i32> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let left = processes_with(needle);
        if left.is_empty() || tokio::time::Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `pid` and its ancestors up to (not including) `stop`.
pub fn chain_up(pid: i32, stop: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut p = pid;
    while p > 1 && p != stop && out.len() < 64 {
        out.push(p);
        match ppid_state(p) {
            Some((pp, _)) => p = pp,
            None => break,
        }
    }
    out
}

/// A random token for canaries.
pub fn token() -> String {
    format!("canary-{}", uuid_like())
}

fn uuid_like() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    let n = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{:x}{:x}", n, std::process::id())
}

/// Unbind this test's own uids (`base..base + n`, used by no other test) from the principals
/// an earlier run of it bound them to: a uid stays bound as long as `/run/replbox` lasts, and
/// the pool only starts interpreters on unbound uids.
pub fn unbind_test_uids(base: u32, n: u32) {
    for uid in base..base + n {
        let p = std::path::PathBuf::from(format!("/run/replbox/{uid}"));
        if let Ok(f) = std::fs::OpenOptions::new().write(true).open(&p) {
            f.set_len(0).expect("unbind a test uid");
        }
    }
}

/// Call `tool` through any connected client (stdio or HTTP) and collect the result.
pub async fn http_call(client: &rmcp::Peer<RoleClient>, tool: &str, args: Value) -> Out {
    let obj = args.as_object().cloned().expect("arguments are an object");
    let r = client
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(obj))
        .await
        .unwrap_or_else(|e| panic!("{tool} call failed at the protocol level: {e}"));
    let mut text = String::new();
    let mut images = Vec::new();
    for c in &r.content {
        if let Some(t) = c.as_text() {
            text.push_str(&t.text);
        } else if let Some(i) = c.as_image() {
            images.push((i.mime_type.clone(), i.data.clone()));
        }
    }
    Out {
        text,
        structured: r.structured_content.clone().unwrap_or(Value::Null),
        is_error: r.is_error.unwrap_or(false),
        images,
    }
}
