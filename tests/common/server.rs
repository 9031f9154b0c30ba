//! Starting `replbox` for a test: one builder for every way the tests run the server.
//!
//! ```ignore
//! let s = Server::stdio().start().await;                       // MCP over stdio
//! let s = Server::stdio().args(["--sandbox", "bwrap"]).env("REPLBOX_LOG", "info").start().await;
//! let h = Server::http().token(TOKEN_A).token(TOKEN_B).start().await;  // --http 127.0.0.1:0
//! let c = h.connect(TOKEN_A).await;                            // an rmcp client of it
//! ```
//!
//! Every server starts with the same environment: no run-code pool and no warm sessions
//! (`REPLBOX_POOL=0`, `REPLBOX_SESSION_POOL=0`: tests count the server's processes; a test
//! that wants them sets the variable), the operator variables of the test's own environment
//! removed (`REPLBOX_TOKENS`, `REPLBOX_HTTP`, …), the directory of the real `python3` first on
//! PATH when the one on PATH is a shim (unless the test sets PATH), and `REPLBOX_LOG=warn` (with
//! `replbox=info` over HTTP, whose address is read from the log) unless the test sets it.
//! The server's stderr is echoed to the test's (tagged with its pid) and kept: `log()`.
//!
//! A server is stopped by `stop().await` (the graceful way: stdin closed, or SIGTERM over
//! HTTP, and its exit awaited). One that is dropped instead, by a failing assertion or a test
//! that simply ends, gets SIGTERM and, if it has not exited within a few seconds, SIGKILL for
//! it and every process below it: no test leaves processes behind.

use std::ffi::{OsStr, OsString};
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;

use super::{BIN, Out, Recorder, descendants, http_call};

/// Variables of the operator's environment a test server never inherits: a developer's
/// shell, or CI's, must not change what the tests see. A test sets them with `.env()`.
const SCRUBBED: &[&str] = &[
    "REPLBOX_HTTP",
    "REPLBOX_TOKENS",
    "REPLBOX_TOKENS_FILE",
    "REPLBOX_ALLOWED_HOSTS",
    "REPLBOX_ALLOWED_ORIGINS",
    "REPLBOX_LOG_FORMAT",
];

/// How long a dropped server has after SIGTERM before its tree is killed.
const DROP_GRACE: Duration = Duration::from_secs(5);

/// How long an HTTP server has to say where it listens.
const LISTEN_WITHIN: Duration = Duration::from_secs(30);

/// The most of a server's log a test keeps (the echo to stderr is not cut).
const LOG_CAP: usize = 8 << 20;

/// Builders of test servers: [`Server::stdio`] and [`Server::http`].
pub struct Server;

impl Server {
    /// `replbox serve` driven over stdio by rmcp's client (a [`TestServer`]).
    pub fn stdio() -> StdioBuilder {
        StdioBuilder {
            spec: Spec::new(),
            bare: false,
            tasks: false,
        }
    }

    /// `replbox serve --http 127.0.0.1:0` (an [`HttpServer`]); `.arg("--http")` with an
    /// address of the test's choosing replaces the default one.
    pub fn http() -> HttpBuilder {
        HttpBuilder {
            spec: Spec::new(),
            tokens: Vec::new(),
        }
    }
}

/// A change to the server's command before it is spawned (`configure`).
type Configure = Box<dyn FnOnce(&mut tokio::process::Command) + Send>;

/// What both kinds of server are started with.
struct Spec {
    args: Vec<OsString>,
    env: Vec<(OsString, Option<OsString>)>,
    uid: Option<u32>,
    configure: Vec<Configure>,
}

impl Spec {
    fn new() -> Self {
        Self {
            args: Vec::new(),
            env: Vec::new(),
            uid: None,
            configure: Vec::new(),
        }
    }

    fn sets(&self, var: &str) -> bool {
        self.env.iter().any(|(k, _)| k == var)
    }

    /// The command: `BIN` with `sub` (when any) then the test's arguments, and the common
    /// environment under the test's own.
    fn command(self, sub: &[&str], default_log: &str) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.args(sub).args(&self.args);
        for var in SCRUBBED {
            cmd.env_remove(var);
        }
        cmd.env("REPLBOX_POOL", "0")
            .env("REPLBOX_SESSION_POOL", "0")
            .env("REPLBOX_LOG", default_log);
        // REPLBOX_LOG set for the whole test run still wins over the default.
        if let Some(v) = std::env::var_os("REPLBOX_LOG") {
            cmd.env("REPLBOX_LOG", v);
        }
        // A `python3` on PATH that is a wrapper (pyenv's shim, a bash script that runs a
        // dozen more) costs every server about 0.15 s of CPU to resolve: the interpreter's
        // own directory goes first instead, unless the test sets PATH itself.
        if !self.sets("PATH")
            && let Some(dir) = python_dir()
        {
            let mut path = dir;
            path.push(":");
            path.push(std::env::var_os("PATH").unwrap_or_default());
            cmd.env("PATH", path);
        }
        for (k, v) in self.env {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        if let Some(uid) = self.uid {
            // std drops the supplementary groups too when it changes the uid as root.
            cmd.uid(uid).gid(uid);
        }
        for f in self.configure {
            f(&mut cmd);
        }
        cmd
    }
}

/// The directory of the interpreter that the `python3` on PATH runs, when that `python3` is
/// a script (a version manager's shim) rather than the interpreter; found once per test run
/// and kept in the target's temporary directory (each test is a process of its own).
fn python_dir() -> Option<OsString> {
    use std::os::unix::ffi::OsStrExt;
    static DIR: std::sync::OnceLock<Option<OsString>> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let path = std::env::var_os("PATH")?;
        let shim = std::env::split_paths(&path)
            .map(|d| d.join("python3"))
            .find(|p| p.is_file())?;
        let head = std::fs::read(&shim).ok()?;
        if !head.starts_with(b"#!") {
            return None; // the interpreter itself
        }
        let mut key = shim.as_os_str().as_bytes().to_vec();
        key.push(0);
        key.extend_from_slice(path.as_bytes());
        let digest = key.iter().fold(0xcbf29ce484222325u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x100000001b3)
        });
        let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("python3-dir-{digest:016x}"));
        if let Ok(dir) = std::fs::read(&cache) {
            return Some(std::ffi::OsStr::from_bytes(&dir).to_owned());
        }
        let out = std::process::Command::new(&shim)
            .args([
                "-c",
                "import os, sys; print(os.path.dirname(sys.executable))",
            ])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let dir = out.stdout.strip_suffix(b"\n")?;
        if !out.status.success()
            || !std::path::Path::new(std::ffi::OsStr::from_bytes(dir))
                .join("python3")
                .is_file()
        {
            return None;
        }
        let tmp = cache.with_extension(format!("{}", std::process::id()));
        if std::fs::write(&tmp, dir).is_ok() {
            let _ = std::fs::rename(&tmp, &cache);
        }
        Some(std::ffi::OsStr::from_bytes(dir).to_owned())
    })
    .clone()
}

macro_rules! spec_setters {
    () => {
        /// One more argument after `serve`.
        pub fn arg(mut self, a: impl AsRef<OsStr>) -> Self {
            self.spec.args.push(a.as_ref().to_owned());
            self
        }

        /// More arguments after `serve`.
        pub fn args<I, S>(mut self, args: I) -> Self
        where
            I: IntoIterator<Item = S>,
            S: AsRef<OsStr>,
        {
            self.spec
                .args
                .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
            self
        }

        /// Set a variable of the server's environment (over the harness's defaults).
        pub fn env(mut self, k: impl AsRef<OsStr>, v: impl AsRef<OsStr>) -> Self {
            self.spec
                .env
                .push((k.as_ref().to_owned(), Some(v.as_ref().to_owned())));
            self
        }

        /// Set several variables (`&[("K", "V")]`, as the older helpers took them).
        pub fn envs<K: AsRef<OsStr>, V: AsRef<OsStr>>(
            mut self,
            vars: impl IntoIterator<Item = (K, V)>,
        ) -> Self {
            for (k, v) in vars {
                self = self.env(k, v);
            }
            self
        }

        /// Remove a variable from the server's environment (a harness default too).
        pub fn env_remove(mut self, k: impl AsRef<OsStr>) -> Self {
            self.spec.env.push((k.as_ref().to_owned(), None));
            self
        }

        /// Run the server as `uid` (and gid `uid`, no supplementary groups): needs root.
        pub fn uid(mut self, uid: impl Into<Option<u32>>) -> Self {
            self.spec.uid = uid.into();
            self
        }

        /// Anything else about the command (a `pre_exec`, say), after the rest is set.
        pub fn configure(
            mut self,
            f: impl FnOnce(&mut tokio::process::Command) + Send + 'static,
        ) -> Self {
            self.spec.configure.push(Box::new(f));
            self
        }
    };
}

/// A stdio server to be started: [`Server::stdio`].
pub struct StdioBuilder {
    spec: Spec,
    bare: bool,
    tasks: bool,
}

impl StdioBuilder {
    spec_setters!();

    /// Run a bare `replbox` (which serves over stdio), without the `serve` subcommand.
    pub fn bare(mut self) -> Self {
        self.bare = true;
        self
    }

    /// Drive it with a client that declares the MCP tasks extension.
    pub fn tasks(mut self) -> Self {
        self.tasks = true;
        self
    }

    /// Start and complete the MCP handshake; panics, with the server's log, if it cannot.
    pub async fn start(self) -> TestServer {
        self.try_start().await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// Start, or say why the server did not start (its log included).
    pub async fn try_start(self) -> Result<TestServer, String> {
        let sub: &[&str] = if self.bare { &[] } else { &["serve"] };
        let args = self.spec.args.clone();
        let cmd = self.spec.command(sub, "warn");
        let (transport, stderr) = TokioChildProcess::builder(cmd)
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn replbox: {e}"))?;
        let pid = transport.id().ok_or("no server pid")?;
        let guard = TreeGuard { pid: pid as i32 };
        let log = Log::default();
        if let Some(stderr) = stderr {
            log.follow(stderr, pid, None);
        }
        let recorder = Recorder {
            tasks: self.tasks,
            ..Recorder::default()
        };
        match recorder.clone().serve(transport).await {
            Ok(client) => Ok(TestServer {
                client,
                pid,
                recorder,
                log,
                guard,
            }),
            Err(e) => {
                let log = log.settled().await;
                Err(format!(
                    "MCP handshake with replbox {args:?}: {e}\nits log:\n{log}"
                ))
            }
        }
    }

    /// Spawn with stdin and stdout piped and no MCP client, for tests that write the
    /// protocol's bytes themselves (stderr is followed as for any server).
    pub fn spawn_raw(self) -> RawServer {
        let sub: &[&str] = if self.bare { &[] } else { &["serve"] };
        let mut cmd = self.spec.command(sub, "warn");
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn replbox");
        let pid = child.id().expect("pid");
        let log = Log::default();
        if let Some(stderr) = child.stderr.take() {
            log.follow(stderr, pid, None);
        }
        RawServer {
            guard: TreeGuard { pid: pid as i32 },
            child,
            pid,
            log,
        }
    }
}

/// A server started over stdio and driven by rmcp's client.
pub struct TestServer {
    // First, so that it is dropped first: rmcp's own drop SIGKILLs the server alone, which
    // would orphan its tree.
    guard: TreeGuard,
    pub client: RunningService<RoleClient, Recorder>,
    pub pid: u32,
    pub recorder: Recorder,
    log: Log,
}

impl TestServer {
    /// `replbox serve` with the harness's defaults (`Server::stdio().start()`).
    pub async fn start() -> Self {
        Server::stdio().start().await
    }

    /// `Server::stdio().args(args).envs(env).start()`.
    pub async fn start_with(args: &[&str], env: &[(&str, &str)]) -> Self {
        Server::stdio()
            .args(args)
            .envs(env.iter().copied())
            .start()
            .await
    }

    /// `Server::stdio().args(args).envs(env).uid(uid).try_start()`.
    pub async fn try_start(
        args: &[&str],
        env: &[(&str, &str)],
        uid: Option<u32>,
    ) -> Result<Self, String> {
        Server::stdio()
            .args(args)
            .envs(env.iter().copied())
            .uid(uid)
            .try_start()
            .await
    }

    /// What the server has written to stderr so far.
    pub fn log(&self) -> String {
        self.log.text()
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
        self.call(
            "run-code",
            serde_json::json!({"languageId": lang, "code": code}),
        )
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

    /// Close the server's stdin and wait for it to exit (rmcp's graceful shutdown). What it
    /// leaves behind is left for the test to see.
    pub async fn stop(self) {
        self.stop_and_log().await;
    }

    /// [`stop`](Self::stop), then the server's whole log.
    pub async fn stop_and_log(self) -> String {
        let TestServer {
            client, guard, log, ..
        } = self;
        let _ = client.cancel().await;
        guard.disarm();
        log.settled().await
    }
}

/// An HTTP server to be started: [`Server::http`].
pub struct HttpBuilder {
    spec: Spec,
    tokens: Vec<String>,
}

impl HttpBuilder {
    spec_setters!();

    /// Accept `token` (one principal per token; several make `REPLBOX_TOKENS`).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.tokens.push(token.into());
        self
    }

    /// Start; panics, with the server's exit status and log, if it does not listen.
    pub async fn start(self) -> HttpServer {
        self.try_start()
            .await
            .unwrap_or_else(|e| panic!("server did not start ({}):\n{}", e.status, e.log))
    }

    /// Start, or the exit status and log of a server that did not listen.
    pub async fn try_start(mut self) -> Result<HttpServer, NotStarted> {
        if !self.tokens.is_empty() {
            let tokens = self.tokens.join(",");
            self = self.env("REPLBOX_TOKENS", tokens);
        }
        let custom_listen = self.spec.args.iter().any(|a| a == "--http");
        let sets_log = self.spec.sets("REPLBOX_LOG");
        let sub: &[&str] = if custom_listen {
            &["serve"]
        } else {
            &["serve", "--http", "127.0.0.1:0"]
        };
        let mut cmd = self.spec.command(sub, "warn,replbox=info");
        if !sets_log && std::env::var_os("REPLBOX_LOG").is_some() {
            // The address is read from an info line: the run's REPLBOX_LOG must not hide it.
            cmd.env("REPLBOX_LOG", "warn,replbox=info");
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| NotStarted {
            status: format!("spawn: {e}"),
            log: String::new(),
        })?;
        let pid = child.id().unwrap_or(0);
        let guard = TreeGuard { pid: pid as i32 };
        let log = Log::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<SocketAddr>();
        if let Some(stderr) = child.stderr.take() {
            log.follow(stderr, pid, Some(tx));
        }
        match tokio::time::timeout(LISTEN_WITHIN, rx).await {
            Ok(Ok(addr)) => Ok(HttpServer {
                child,
                pid,
                addr,
                log,
                guard,
            }),
            _ => {
                let status = match tokio::time::timeout(Duration::from_secs(5), child.wait()).await
                {
                    Ok(Ok(st)) => st.to_string(),
                    _ => {
                        let _ = child.kill().await;
                        "still running, not listening".to_string()
                    }
                };
                guard.disarm();
                Err(NotStarted {
                    status,
                    log: log.settled().await,
                })
            }
        }
    }
}

/// Why an HTTP server did not start: its exit status (or that it never listened) and log.
#[derive(Debug)]
pub struct NotStarted {
    pub status: String,
    pub log: String,
}

impl std::fmt::Display for NotStarted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "replbox did not listen ({}):\n{}", self.status, self.log)
    }
}

/// A `replbox serve --http` child.
pub struct HttpServer {
    // First, so that it is dropped before the child (killed on drop, alone).
    guard: TreeGuard,
    child: tokio::process::Child,
    pub pid: u32,
    /// Where it listens.
    pub addr: SocketAddr,
    log: Log,
}

impl HttpServer {
    /// `http://ADDR/mcp`.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }

    /// What the server has written to stderr so far.
    pub fn log(&self) -> String {
        self.log.text()
    }

    /// An rmcp client presenting `token` (none when empty).
    pub async fn connect(&self, token: &str) -> RunningService<RoleClient, ()> {
        self.try_connect(token)
            .await
            .unwrap_or_else(|e| panic!("MCP handshake over HTTP failed: {e}"))
    }

    /// An rmcp client presenting `token`, or why the handshake failed.
    pub async fn try_connect(&self, token: &str) -> Result<RunningService<RoleClient, ()>, String> {
        let mut config = StreamableHttpClientTransportConfig::with_uri(self.url());
        if !token.is_empty() {
            config = config.auth_header(token.to_string());
        }
        ().serve(StreamableHttpClientTransport::from_config(config))
            .await
            .map_err(|e| e.to_string())
    }

    /// An rmcp client presenting `token` that declares the MCP tasks extension.
    pub async fn connect_tasks(
        &self,
        token: &str,
    ) -> RunningService<RoleClient, rmcp::model::ClientConfig> {
        let mut config = StreamableHttpClientTransportConfig::with_uri(self.url());
        if !token.is_empty() {
            config = config.auth_header(token.to_string());
        }
        super::tasks_client()
            .serve(StreamableHttpClientTransport::from_config(config))
            .await
            .unwrap_or_else(|e| panic!("MCP handshake over HTTP failed: {e}"))
    }

    /// Live descendants of the server process.
    pub fn descendants(&self) -> Vec<i32> {
        descendants(self.pid as i32)
    }

    /// SIGTERM (the operator's stop) and wait for the exit (SIGKILL after a while); its
    /// status. What the server leaves behind is left for the test to see.
    pub async fn stop(mut self) -> Option<std::process::ExitStatus> {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let st = match tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await {
            Ok(st) => st.ok(),
            Err(_) => {
                let _ = self.child.kill().await;
                None
            }
        };
        self.guard.pid = 0;
        st
    }

    /// SIGKILL the server alone (a crash, say) and reap it; what was below it is left
    /// for the test to see.
    pub async fn kill(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
        self.guard.pid = 0;
    }

    /// The server's process, for tests that wait on or signal it.
    pub fn child(&mut self) -> &mut tokio::process::Child {
        &mut self.child
    }
}

/// A server with raw pipes: [`StdioBuilder::spawn_raw`].
pub struct RawServer {
    guard: TreeGuard,
    pub child: tokio::process::Child,
    pub pid: u32,
    log: Log,
}

impl RawServer {
    /// What the server has written to stderr so far.
    pub fn log(&self) -> String {
        self.log.text()
    }

    /// The exit has been seen by the test (or it killed the server): nothing to clean up.
    pub fn disarm(&mut self) {
        self.guard.pid = 0;
    }
}

impl Drop for RawServer {
    fn drop(&mut self) {
        // Before the child's own kill on drop, which would orphan the server's tree.
        reap_tree(std::mem::take(&mut self.guard.pid));
    }
}

/// A server's stderr, echoed to the test's and kept (up to `LOG_CAP`).
#[derive(Clone, Default)]
struct Log {
    text: Arc<Mutex<String>>,
    done: Arc<tokio::sync::Notify>,
    ended: Arc<std::sync::atomic::AtomicBool>,
}

impl Log {
    fn text(&self) -> String {
        self.text.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Read `stderr` to its end; send the first `listening on http://ADDR/` to `listening`.
    fn follow(
        &self,
        stderr: tokio::process::ChildStderr,
        pid: u32,
        listening: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
    ) {
        use std::io::BufRead;
        let me = self.clone();
        // On a thread of its own, not a task: a test that blocks its runtime must not leave
        // the server blocked on a full stderr pipe.
        let Ok(fd) = stderr.into_owned_fd() else {
            return;
        };
        std::thread::spawn(move || {
            let mut tx = listening;
            let lines = std::io::BufReader::new(std::fs::File::from(fd)).lines();
            for line in lines.map_while(Result::ok) {
                eprintln!("[replbox {pid}] {line}");
                if let Some(rest) = line.split("listening on http://").nth(1)
                    && let Some(addr) = rest.split('/').next().and_then(|a| a.parse().ok())
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(addr);
                }
                if let Ok(mut l) = me.text.lock()
                    && l.len() < LOG_CAP
                {
                    l.push_str(&line);
                    l.push('\n');
                }
            }
            me.ended.store(true, std::sync::atomic::Ordering::SeqCst);
            me.done.notify_waiters();
        });
    }

    /// The log once the server has closed its stderr (or after a short wait).
    async fn settled(&self) -> String {
        let notified = self.done.notified();
        if !self.ended.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = tokio::time::timeout(Duration::from_secs(2), notified).await;
        }
        self.text()
    }
}

/// Ends a server that a test dropped without stopping it, and everything below it.
struct TreeGuard {
    /// 0 once there is nothing to do.
    pid: i32,
}

impl TreeGuard {
    fn disarm(mut self) {
        self.pid = 0;
    }
}

impl Drop for TreeGuard {
    fn drop(&mut self) {
        reap_tree(std::mem::take(&mut self.pid));
    }
}

/// SIGTERM `pid`; once it has exited (or after `DROP_GRACE`), SIGKILL whatever of its tree
/// is still alive. Blocking: this runs in `drop`, where nothing can be awaited.
fn reap_tree(pid: i32) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    if pid <= 0 || !super::alive(pid) {
        return;
    }
    // Collected while the server lives (once it exits, its children are re-parented and can
    // no longer be found from it), each with its start time, so that a pid reused meanwhile
    // is never signalled.
    let mut tree: Vec<(i32, u64)> = Vec::new();
    let collect = |tree: &mut Vec<(i32, u64)>| {
        for p in descendants(pid) {
            if let Some(t) = start_time(p)
                && !tree.contains(&(p, t))
            {
                tree.push((p, t));
            }
        }
    };
    collect(&mut tree);
    let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    let deadline = Instant::now() + DROP_GRACE;
    while super::alive(pid) && Instant::now() < deadline {
        collect(&mut tree);
        std::thread::sleep(Duration::from_millis(20));
    }
    if super::alive(pid) {
        collect(&mut tree);
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    for (p, t) in tree {
        if super::alive(p) && start_time(p) == Some(t) {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
    }
}

/// When a process started (field 22 of /proc/PID/stat, in clock ticks since boot).
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from its end.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}
