//! One upstream MCP server as replbox's client sees it: started when first needed, its tools
//! listed once, started again after it dies (at the next use, after a pause that grows while
//! starts keep failing), stopped with replbox. A stdio server is a process group of its own
//! with the environment the operator gave it (over a few basics); its stderr goes to
//! replbox's log, line by line, with its name.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{ClientCapabilities, ClientConfig, Implementation, ProtocolVersion, Tool};
use rmcp::service::{Peer, RunningService};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransport, StreamableHttpClientTransportConfig,
};
use rmcp::{RoleClient, ServiceExt};
use tokio::io::{AsyncBufReadExt, AsyncReadExt};
use tokio::process::{ChildStdin, ChildStdout};

use super::spec::{ServerSpec, Transport};

/// How long an upstream may take to start and answer `initialize` and `tools/list` (an
/// `npx` server may download its package first).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Tools kept of one server's list, and bounds on what each says (upstream text is hostile
/// input: it reaches code, never the server's own output).
const MAX_TOOLS: usize = 1000;
const MAX_DESCRIPTION: usize = 8 * 1024;
const MAX_SCHEMA: usize = 64 * 1024;
/// Longest stderr line logged as one (a longer one is logged in pieces).
const MAX_LOG_LINE: usize = 2048;
/// The variables a stdio upstream gets from replbox's own environment (those MCP clients
/// pass by default), before the operator's `env`.
const INHERITED: &[&str] = &["HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG"];

/// Why an upstream is not running: what a session asking for it, or code calling it, is told.
#[derive(Debug, Clone, thiserror::Error)]
pub enum UpstreamError {
    #[error("MCP server {server} could not be started: {why}")]
    Start { server: String, why: StartError },
    /// Starts keep failing: the last one's error, how many failed in a row, and the seconds
    /// until the next may be tried.
    #[error(
        "MCP server {server} could not be started: {why} (tried {failures} time(s) in a row; \
         trying again in {in_s} s)"
    )]
    Paused {
        server: String,
        why: StartError,
        failures: u32,
        in_s: u64,
    },
}

/// Why one start of an upstream failed. Cloned: the last one is told again until the next
/// start may be tried.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StartError {
    #[error("it did not answer within {} s", START_TIMEOUT.as_secs())]
    Timeout,
    #[error("{command}: {error}")]
    Spawn {
        command: String,
        error: Arc<std::io::Error>,
    },
    #[error("no pipes to the process")]
    NoPipes,
    #[error("MCP handshake failed: {0}")]
    Handshake(Arc<rmcp::service::ClientInitializeError>),
    /// An HTTP server's handshake: its error may quote the URL (a credential in its query),
    /// so the server's log has it and the message does not.
    #[error("its MCP handshake failed (the server's log says why)")]
    HttpHandshake,
    #[error("header {key}: {error}")]
    HeaderName {
        key: String,
        error: Arc<http::header::InvalidHeaderName>,
    },
    #[error("header {0}: not a valid value")]
    HeaderValue(String),
    #[error("HTTP client: {0}")]
    Client(Arc<reqwest::Error>),
    #[error("tools/list failed: {0}")]
    ToolsList(Arc<rmcp::service::ServiceError>),
}

/// An upstream a session asked for did not start: not the caller's mistake, nor the
/// server's own.
impl From<UpstreamError> for crate::error::ToolError {
    fn from(e: UpstreamError) -> Self {
        Self::new(crate::error::ErrorKind::StartFailed, e.to_string())
    }
}

/// A connected upstream: its client and the tools it listed.
pub struct Live {
    service: RunningService<RoleClient, ClientConfig>,
    pub tools: Arc<Vec<Tool>>,
    /// The stdio server's process group, killed when this is dropped.
    _group: Option<Group>,
    pub started: Instant,
}

impl Live {
    pub fn peer(&self) -> &Peer<RoleClient> {
        self.service.peer()
    }

    pub fn is_closed(&self) -> bool {
        self.service.is_closed() || self.service.peer().is_transport_closed()
    }

    pub fn tool(&self, name: &str) -> Option<&Tool> {
        self.tools.iter().find(|t| t.name == name)
    }
}

/// A stdio upstream's process group: SIGTERM, then SIGKILL, when dropped.
struct Group {
    pgid: i32,
    name: String,
}

impl Drop for Group {
    fn drop(&mut self) {
        let pgid = nix::unistd::Pid::from_raw(self.pgid);
        if self.pgid <= 1 {
            return;
        }
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGTERM);
        let name = std::mem::take(&mut self.name);
        // The group is reaped by tokio (the child) and by its own parent (the rest); a
        // group that ignores SIGTERM is killed a moment later.
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(2));
            if nix::sys::signal::killpg(pgid, None).is_ok() {
                tracing::warn!(server = %name, "MCP server ignored SIGTERM; killing it");
                let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
            }
        });
    }
}

/// One upstream (per replbox server, or per principal), started on demand.
pub struct Instance {
    pub spec: Arc<ServerSpec>,
    /// The principal it serves alone, for a per-principal server.
    pub principal: Option<String>,
    max_message: usize,
    state: tokio::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    live: Option<Arc<Live>>,
    /// Starts that failed in a row, and when the next may be tried.
    failures: u32,
    retry_at: Option<(Instant, StartError)>,
    starts: u64,
}

impl Instance {
    pub fn new(spec: Arc<ServerSpec>, principal: Option<String>, max_message: usize) -> Self {
        Self {
            spec,
            principal,
            max_message,
            state: tokio::sync::Mutex::new(State::default()),
        }
    }

    /// The connected upstream, started now if it is not running (or died).
    pub async fn get(&self) -> Result<Arc<Live>, UpstreamError> {
        let mut st = self.state.lock().await;
        if let Some(live) = &st.live {
            if !live.is_closed() {
                return Ok(live.clone());
            }
            tracing::warn!(
                server = %self.spec.name,
                up_s = live.started.elapsed().as_secs(),
                "MCP server ended; starting it again"
            );
            st.live = None;
        }
        if let Some((at, why)) = &st.retry_at
            && Instant::now() < *at
        {
            return Err(UpstreamError::Paused {
                server: self.spec.name.clone(),
                why: why.clone(),
                failures: st.failures,
                in_s: at.saturating_duration_since(Instant::now()).as_secs() + 1,
            });
        }
        st.starts += 1;
        let started = tokio::time::timeout(START_TIMEOUT, self.start()).await;
        match started {
            Ok(Ok(live)) => {
                let live = Arc::new(live);
                st.live = Some(live.clone());
                st.failures = 0;
                st.retry_at = None;
                tracing::info!(
                    server = %self.spec.name,
                    principal = self.principal.as_deref().unwrap_or("(all)"),
                    kind = self.spec.kind(),
                    tools = live.tools.len(),
                    start = st.starts,
                    "MCP server started"
                );
                Ok(live)
            }
            failed => {
                let why = match failed {
                    Ok(Err(why)) => why,
                    _ => StartError::Timeout,
                };
                let e = UpstreamError::Start {
                    server: self.spec.name.clone(),
                    why: why.clone(),
                };
                tracing::warn!(server = %self.spec.name, "{e}");
                st.failures += 1;
                let pause =
                    Duration::from_secs(1 << st.failures.min(5)).min(Duration::from_secs(30));
                st.retry_at = Some((Instant::now() + pause, why));
                Err(e)
            }
        }
    }

    /// Forget the running upstream (after its transport failed), so the next use starts it.
    pub async fn reset(&self, live: &Arc<Live>) {
        let mut st = self.state.lock().await;
        if st.live.as_ref().is_some_and(|l| Arc::ptr_eq(l, live)) {
            st.live = None;
        }
    }

    /// Stop it (replbox is stopping).
    pub async fn stop(&self) {
        let live = self.state.lock().await.live.take();
        drop(live);
    }

    async fn start(&self) -> Result<Live, StartError> {
        let info = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("replbox", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE);
        let (service, group) = match &self.spec.transport {
            Transport::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                let (stdin, stdout, group) = self.spawn(command, args, env, cwd.as_deref())?;
                let transport = AsyncRwTransport::new_client(stdout, stdin)
                    .with_max_line_length(self.max_message);
                let service = info
                    .serve(transport)
                    .await
                    .map_err(|e| StartError::Handshake(Arc::new(e)))?;
                (service, Some(group))
            }
            Transport::Http { url, headers } => {
                let transport = self.http_transport(url, headers)?;
                // A transport error may quote the URL (a credential in its query): the
                // server's log has it, the caller's message does not.
                let service = info.serve(transport).await.map_err(|e| {
                    tracing::warn!(server = %self.spec.name, "MCP handshake failed: {e}");
                    StartError::HttpHandshake
                })?;
                (service, None)
            }
        };
        let tools = service
            .list_all_tools()
            .await
            .map_err(|e| StartError::ToolsList(Arc::new(e)))?;
        Ok(Live {
            service,
            tools: Arc::new(bound_tools(&self.spec.name, tools)),
            _group: group,
            started: Instant::now(),
        })
    }

    /// A stdio server's process, in a process group of its own, with the few variables it
    /// inherits and the operator's: its stdin and stdout, and its group. Its stderr goes to
    /// the log; it is reaped when it exits.
    fn spawn(
        &self,
        command: &str,
        args: &[String],
        env: &BTreeMap<String, String>,
        cwd: Option<&Path>,
    ) -> Result<(ChildStdin, ChildStdout, Group), StartError> {
        let mut cmd = tokio::process::Command::new(command);
        cmd.args(args).env_clear();
        for k in INHERITED {
            if let Some(v) = std::env::var_os(k) {
                cmd.env(k, v);
            }
        }
        cmd.envs(env);
        if let Some(d) = cwd {
            cmd.current_dir(d);
        } else {
            cmd.current_dir("/");
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| StartError::Spawn {
            command: command.to_string(),
            error: Arc::new(e),
        })?;
        let pid = child.id().map(|p| p as i32).unwrap_or(0);
        let group = Group {
            pgid: pid,
            name: self.spec.name.clone(),
        };
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(StartError::NoPipes);
        };
        if let Some(stderr) = child.stderr.take() {
            log_stderr(self.spec.name.clone(), stderr);
        }
        reap(self.spec.name.clone(), child);
        Ok((stdin, stdout, group))
    }

    /// An HTTP server's streamable HTTP transport, with the operator's headers, its
    /// messages bounded, through no proxy.
    fn http_transport(
        &self,
        url: &str,
        headers: &BTreeMap<String, String>,
    ) -> Result<StreamableHttpClientTransport<reqwest::Client>, StartError> {
        let mut custom = HashMap::new();
        for (k, v) in headers {
            let name =
                http::HeaderName::from_bytes(k.as_bytes()).map_err(|e| StartError::HeaderName {
                    key: k.clone(),
                    error: Arc::new(e),
                })?;
            let value =
                http::HeaderValue::from_str(v).map_err(|_| StartError::HeaderValue(k.clone()))?;
            custom.insert(name, value);
        }
        let config = StreamableHttpClientTransportConfig::with_uri(url)
            .custom_headers(custom)
            .max_sse_event_size(self.max_message)
            .max_json_response_size(self.max_message);
        Ok(StreamableHttpClientTransport::with_client(
            reqwest::Client::builder()
                .no_proxy()
                .build()
                .map_err(|e| StartError::Client(Arc::new(e)))?,
            config,
        ))
    }
}

/// The tool list within bounds: at most [`MAX_TOOLS`], descriptions cut, oversized schemas
/// replaced by an open object.
fn bound_tools(server: &str, mut tools: Vec<Tool>) -> Vec<Tool> {
    if tools.len() > MAX_TOOLS {
        tracing::warn!(
            server,
            listed = tools.len(),
            "MCP server lists too many tools; keeping {MAX_TOOLS}"
        );
        tools.truncate(MAX_TOOLS);
    }
    for t in &mut tools {
        if let Some(d) = &t.description
            && d.len() > MAX_DESCRIPTION
        {
            let mut cut = MAX_DESCRIPTION;
            while !d.is_char_boundary(cut) {
                cut -= 1;
            }
            t.description = Some(format!("{}…", &d[..cut]).into());
        }
        let big = |s: &serde_json::Map<String, serde_json::Value>| {
            serde_json::to_vec(s).map_or(true, |v| v.len() > MAX_SCHEMA)
        };
        if big(&t.input_schema) {
            let mut open = serde_json::Map::new();
            open.insert("type".into(), "object".into());
            t.input_schema = Arc::new(open);
        }
        if t.output_schema.as_ref().is_some_and(|s| big(s)) {
            t.output_schema = None;
        }
    }
    tools
}

/// Log an upstream's stderr, one bounded line at a time, with its name.
fn log_stderr(name: String, stderr: tokio::process::ChildStderr) {
    tokio::spawn(async move {
        let mut reader = tokio::io::BufReader::new(stderr);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            // Bounded: a line is read in pieces of the buffer's size at most.
            match (&mut reader)
                .take(MAX_LOG_LINE as u64)
                .read_until(b'\n', &mut buf)
                .await
            {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf);
                    let line: String = line
                        .trim_end()
                        .chars()
                        .map(|c| if c.is_control() { ' ' } else { c })
                        .collect();
                    if !line.is_empty() {
                        tracing::info!(target: "replbox::upstream", server = %name, "{line}");
                    }
                }
            }
        }
    });
}

/// Wait for a stdio upstream's exit (so it is reaped) and log it.
fn reap(name: String, mut child: tokio::process::Child) {
    tokio::spawn(async move {
        match child.wait().await {
            Ok(status) => {
                tracing::info!(server = %name, %status, "MCP server process ended");
            }
            Err(e) => tracing::warn!(server = %name, "MCP server process: {e}"),
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_pinned() {
        let start = UpstreamError::Start {
            server: "everything".into(),
            why: StartError::Timeout,
        };
        assert_eq!(
            start.to_string(),
            "MCP server everything could not be started: it did not answer within 60 s"
        );
        let paused = UpstreamError::Paused {
            server: "remote".into(),
            why: StartError::HttpHandshake,
            failures: 2,
            in_s: 4,
        };
        assert_eq!(
            paused.to_string(),
            "MCP server remote could not be started: its MCP handshake failed (the server's log \
             says why) (tried 2 time(s) in a row; trying again in 4 s)"
        );
        let spawn = StartError::Spawn {
            command: "/nonexistent".into(),
            error: Arc::new(std::io::Error::from_raw_os_error(2)),
        };
        assert_eq!(
            spawn.to_string(),
            "/nonexistent: No such file or directory (os error 2)"
        );
        let e: crate::error::ToolError = paused.into();
        assert_eq!(e.kind, crate::error::ErrorKind::StartFailed);
    }
}
