//! An MCP server under measurement, driven by rmcp's own client over stdio: start it,
//! call tools and time each call end to end, stop it. Any stdio MCP server can be started
//! this way (replbox itself, or a peer to compare with).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject};
use rmcp::service::{Peer, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;
use tokio::process::Command;

/// Longest wait for a handshake or one tool call before the bench gives up with an error.
// Long enough for the largest ghci cell on a busy machine.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(300);

pub struct McpServer {
    client: RunningService<RoleClient, ()>,
    pid: Option<u32>,
    /// For error messages.
    label: String,
}

impl McpServer {
    /// Spawn `cmd` (its stdin and stdout become the MCP channel; stderr is inherited) and
    /// complete the MCP handshake.
    pub async fn start(cmd: Command) -> Result<Self> {
        let std_cmd = cmd.as_std();
        let label = std::iter::once(std_cmd.get_program())
            .chain(std_cmd.get_args())
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        let transport =
            TokioChildProcess::new(cmd).with_context(|| format!("cannot start `{label}`"))?;
        let pid = transport.id();
        let client = tokio::time::timeout(CALL_TIMEOUT, ().serve(transport))
            .await
            .with_context(|| format!("`{label}` did not complete the MCP handshake in time"))?
            .with_context(|| format!("MCP handshake with `{label}` failed"))?;
        Ok(Self { client, pid, label })
    }

    /// Call `tool` and time it from the request being handed to the client until its result
    /// is back. A protocol error or a timeout is an error.
    pub async fn call(&self, tool: &str, args: &JsonObject) -> Result<(Duration, CallToolResult)> {
        call_peer(self.client.peer(), &self.label, tool, args).await
    }

    /// A handle for calls from other tasks (concurrent calls on one connection).
    pub fn handle(&self) -> Handle {
        Handle {
            peer: self.client.peer().clone(),
            label: self.label.clone(),
        }
    }

    /// Call `tool` and check that it succeeded with exactly `expected` as its text; anything
    /// else is an error, so a wrong result can never become a number in the table.
    pub async fn call_expecting(
        &self,
        tool: &str,
        args: &JsonObject,
        expected: &str,
    ) -> Result<Duration> {
        let (elapsed, result) = self.call(tool, args).await?;
        let text = text_of(&result);
        if result.is_error == Some(true) || text != expected {
            bail!(
                "{tool} on `{}` returned {text:?} (isError: {:?}), expected {expected:?}",
                self.label,
                result.is_error
            );
        }
        Ok(elapsed)
    }

    /// Call `tool` with JSON arguments; a protocol error, a timeout or an `isError` result
    /// is an error. Returns the time, the text and the structured content.
    pub async fn call_ok(&self, tool: &str, args: Value) -> Result<(Duration, String, Value)> {
        let Value::Object(args) = args else {
            bail!("{tool}: arguments must be an object");
        };
        let (elapsed, result) = self.call(tool, &args).await?;
        let text = text_of(&result);
        if result.is_error == Some(true) {
            bail!("{tool} on `{}` failed: {text}", self.label);
        }
        Ok((
            elapsed,
            text,
            result.structured_content.clone().unwrap_or(Value::Null),
        ))
    }

    /// The server's `tools/list` answer as JSON text: what a client reads once per
    /// connection.
    pub async fn tools_list_json(&self) -> Result<String> {
        let tools = tokio::time::timeout(CALL_TIMEOUT, self.client.peer().list_all_tools())
            .await
            .with_context(|| format!("tools/list on `{}` took too long", self.label))?
            .with_context(|| format!("tools/list on `{}` failed", self.label))?;
        Ok(serde_json::to_string(
            &serde_json::json!({ "tools": tools }),
        )?)
    }

    /// The server's process id.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// Wait (at most `within`) until the server's descendants are quiet: the same processes,
    /// using no CPU, over a few consecutive checks. Pooled interpreters being started, or
    /// probes, would otherwise compete with what is measured. Returns false if they were
    /// still busy at the end.
    pub async fn wait_quiet(&self, within: Duration) -> bool {
        let Some(pid) = self.pid else {
            return true;
        };
        let deadline = Instant::now() + within;
        let mut last = tree_cpu(pid);
        let mut calm = 0;
        loop {
            tokio::time::sleep(Duration::from_millis(25)).await;
            let now = tree_cpu(pid);
            calm = if now == last { calm + 1 } else { 0 };
            last = now;
            if calm >= 3 {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
        }
    }

    /// Close the connection and wait for the server to exit (it is killed if it does not).
    pub async fn stop(self) {
        let _ = self.client.cancel().await;
    }
}

/// A clonable handle on a server's connection, for concurrent calls from several tasks.
#[derive(Clone)]
pub struct Handle {
    peer: Peer<RoleClient>,
    label: String,
}

impl Handle {
    /// Call `tool` and return the time and the text, or an error when the call failed or
    /// returned `isError`.
    pub async fn call_text(&self, tool: &str, args: Value) -> Result<(Duration, String)> {
        let Value::Object(args) = args else {
            bail!("{tool}: arguments must be an object");
        };
        let (elapsed, result) = call_peer(&self.peer, &self.label, tool, &args).await?;
        let text = text_of(&result);
        if result.is_error == Some(true) {
            bail!("{tool} on `{}` failed: {text}", self.label);
        }
        Ok((elapsed, text))
    }

    /// Like [`call_text`](Self::call_text), with the structured content too.
    pub async fn call_json(&self, tool: &str, args: Value) -> Result<(Duration, String, Value)> {
        let Value::Object(args) = args else {
            bail!("{tool}: arguments must be an object");
        };
        let (elapsed, result) = call_peer(&self.peer, &self.label, tool, &args).await?;
        let text = text_of(&result);
        if result.is_error == Some(true) {
            bail!("{tool} on `{}` failed: {text}", self.label);
        }
        let structured = result.structured_content.clone().unwrap_or(Value::Null);
        Ok((elapsed, text, structured))
    }
}

async fn call_peer(
    peer: &Peer<RoleClient>,
    label: &str,
    tool: &str,
    args: &JsonObject,
) -> Result<(Duration, CallToolResult)> {
    let params = CallToolRequestParams::new(tool.to_string()).with_arguments(args.clone());
    let started = Instant::now();
    let result = tokio::time::timeout(CALL_TIMEOUT, peer.call_tool(params)).await;
    let elapsed = started.elapsed();
    let result = result
        .with_context(|| format!("{tool} on `{label}` took over {CALL_TIMEOUT:?}"))?
        .with_context(|| format!("{tool} on `{label}` failed"))?;
    Ok((elapsed, result))
}

/// The text contents of a result, concatenated.
pub fn text_of(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
        .collect()
}

/// The processes under `root` and their CPU ticks in total, as a comparable snapshot.
fn tree_cpu(root: u32) -> (Vec<i32>, u64) {
    let mut pids = descendants(root as i32);
    pids.sort_unstable();
    let ticks = pids.iter().filter_map(|p| cpu_ticks(*p)).sum();
    (pids, ticks)
}

/// The live processes below `root`, from /proc (a snapshot: processes come and go).
pub(crate) fn descendants(root: i32) -> Vec<i32> {
    let mut parent_of: Vec<(i32, i32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            if let Some((ppid, state)) = ppid_state(pid)
                && state != "Z"
            {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(pid, ppid) in &parent_of {
            if ppid == p {
                out.push(pid);
                frontier.push(pid);
            }
        }
    }
    out
}

/// The fields of /proc/PID/stat after the command name (which may hold spaces and
/// parentheses, so they start after the last `)`): state first, then ppid, ...
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

fn ppid_state(pid: i32) -> Option<(i32, String)> {
    let f = stat_fields(pid)?;
    Some((f.get(1)?.parse().ok()?, f.first()?.clone()))
}

/// utime + stime of a process, in clock ticks (from /proc/PID/stat).
pub fn cpu_ticks(pid: i32) -> Option<u64> {
    // Fields after the command: state is field 3, utime 14 and stime 15.
    let f = stat_fields(pid)?;
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// What the kernel says about a process: resident memory, threads, open descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ProcStats {
    pub rss_kib: u64,
    pub threads: u64,
    pub fds: u64,
}

impl ProcStats {
    pub fn of(pid: u32) -> Option<Self> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| -> Option<u64> {
            let line = status.lines().find(|l| l.starts_with(name))?;
            line[name.len()..].split_whitespace().next()?.parse().ok()
        };
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
        Some(Self {
            rss_kib: field("VmRSS:")?,
            threads: field("Threads:")?,
            fds,
        })
    }
}
