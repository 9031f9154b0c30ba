//! Test harness: the built `replbox` binary driven through rmcp's MCP client over stdio.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, ProgressNotificationParam};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};

mod http_child;
#[allow(unused_imports)]
pub use http_child::HttpChild;

pub const BIN: &str = env!("CARGO_BIN_EXE_replbox");

/// Records what the server sends besides responses.
#[derive(Clone, Default)]
pub struct Recorder {
    pub progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
    /// Log notifications (`notifications/message`), as their JSON.
    pub logs: Arc<Mutex<Vec<Value>>>,
}

impl Recorder {
    /// The log notifications received so far.
    pub fn logs(&self) -> Vec<Value> {
        self.logs.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

impl ClientHandler for Recorder {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _ctx: NotificationContext<RoleClient>,
    ) {
        if let Ok(mut p) = self.progress.lock() {
            p.push(params);
        }
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

pub struct TestServer {
    pub client: RunningService<RoleClient, Recorder>,
    pub pid: u32,
    pub recorder: Recorder,
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

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(&[], &[]).await
    }

    pub async fn start_with(args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::try_start(args, env, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Start a server (as `uid` when given, which needs root), or say why it did not start.
    pub async fn try_start(
        args: &[&str],
        env: &[(&str, &str)],
        uid: Option<u32>,
    ) -> Result<Self, String> {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.arg("serve").args(args);
        // These tests count the server's processes, so no warm pool unless a test asks for
        // one (tests/pool.rs covers pooled runs, tests/session_pool.rs warm sessions).
        cmd.env("REPLBOX_POOL", "0");
        cmd.env("REPLBOX_SESSION_POOL", "0");
        // The audit line of every call would drown the test output; REPLBOX_LOG set for the
        // tests, or by a test, still wins.
        if std::env::var_os("REPLBOX_LOG").is_none() {
            cmd.env("REPLBOX_LOG", "warn");
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        if let Some(uid) = uid {
            // std drops the supplementary groups too when it changes the uid as root.
            cmd.uid(uid).gid(uid);
        }
        cmd.stderr(std::process::Stdio::inherit());
        let transport = TokioChildProcess::new(cmd).map_err(|e| format!("spawn replbox: {e}"))?;
        let pid = transport.id().ok_or("no server pid")?;
        let recorder = Recorder::default();
        let client = recorder
            .clone()
            .serve(transport)
            .await
            .map_err(|e| format!("MCP handshake with replbox {args:?}: {e}"))?;
        Ok(Self {
            client,
            pid,
            recorder,
        })
    }

    /// The server's instructions.
    pub fn instructions(&self) -> String {
        self.client
            .peer_info()
            .and_then(|i| i.instructions.clone())
            .unwrap_or_default()
    }

    pub async fn call(&self, tool: &str, args: Value) -> Out {
        http_call(&self.client, tool, args).await
    }

    pub async fn run(&self, lang: &str, code: &str) -> Out {
        self.call("run-code", json!({"languageId": lang, "code": code}))
            .await
    }

    /// Live descendants of the server process.
    pub fn descendants(&self) -> Vec<i32> {
        descendants(self.pid as i32)
    }

    /// Wait until the server has no descendants left (bounded), returning those that remain.
    pub async fn wait_no_descendants(&self, within: Duration) -> Vec<i32> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let d = self.descendants();
            if d.is_empty() || tokio::time::Instant::now() > deadline {
                return d;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn stop(self) {
        let _ = self.client.cancel().await;
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

/// Whether an executable is on PATH.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
        .unwrap_or(false)
}

/// The languages the README lists as supported: in CI (REPLBOX_REQUIRE_ALL=1) a missing one
/// fails.
pub fn require(language: &str, program: &str) -> bool {
    if on_path(program) {
        return true;
    }
    if std::env::var("REPLBOX_REQUIRE_ALL").is_ok_and(|v| v == "1") {
        panic!("{language} ({program}) is not installed, and REPLBOX_REQUIRE_ALL=1 requires it");
    }
    eprintln!("SKIP: {language} tests skipped: {program} is not on PATH");
    false
}

/// Whether python3 imports matplotlib, pandas and numpy (the data tests' stack); a skip
/// is printed when not, and with REPLBOX_REQUIRE_ALL=1 it fails instead.
pub fn require_data_stack() -> bool {
    if !require("python", "python3") {
        return false;
    }
    let ok = std::process::Command::new("python3")
        .args(["-c", "import matplotlib, pandas, numpy"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        return true;
    }
    if std::env::var("REPLBOX_REQUIRE_ALL").is_ok_and(|v| v == "1") {
        panic!(
            "matplotlib, pandas and numpy are not installed for python3, and \
REPLBOX_REQUIRE_ALL=1 requires them (.ci/run installs them)"
        );
    }
    eprintln!("SKIP: data tests skipped: python3 cannot import matplotlib, pandas and numpy");
    false
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
