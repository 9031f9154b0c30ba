//! An MCP server under measurement, driven by rmcp's own client over stdio: start it,
//! call tools and time each call end to end, stop it. Any stdio MCP server can be started
//! this way (replbox itself, or a peer to compare with).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::unistd::Pid;
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject};
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use tokio::process::Command;

/// Longest wait for a handshake or one tool call before the bench gives up with an error.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

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
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(args.clone());
        let started = Instant::now();
        let result = tokio::time::timeout(CALL_TIMEOUT, self.client.call_tool(params)).await;
        let elapsed = started.elapsed();
        let result = result
            .with_context(|| format!("{tool} on `{}` took over {CALL_TIMEOUT:?}", self.label))?
            .with_context(|| format!("{tool} on `{}` failed", self.label))?;
        Ok((elapsed, result))
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
        let text: String = result
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
            .collect();
        if result.is_error == Some(true) || text != expected {
            bail!(
                "{tool} on `{}` returned {text:?} (isError: {:?}), expected {expected:?}",
                self.label,
                result.is_error
            );
        }
        Ok(elapsed)
    }

    /// Wait (at most `within`) until the server has no child processes left, such as the
    /// interpreter probes it starts after the handshake, so that they do not run during the
    /// measurement. Returns false if some were still running at the end.
    pub async fn wait_idle(&self, within: Duration) -> bool {
        let Some(pid) = self.pid else {
            return true;
        };
        let pid = Pid::from_raw(pid as i32);
        let deadline = Instant::now() + within;
        loop {
            if crate::exec::helper::descendants(pid).is_empty() {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Close the connection and wait for the server to exit (it is killed if it does not).
    pub async fn stop(self) {
        let _ = self.client.cancel().await;
    }
}
