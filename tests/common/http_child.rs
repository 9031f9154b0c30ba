//! A `replbox serve --http 127.0.0.1:0` child for tests that need several principals (one
//! token each); its address is read from its log.

use std::process::Stdio;
use std::time::Duration;

use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use tokio::io::{AsyncBufReadExt, BufReader};

pub struct HttpChild {
    child: tokio::process::Child,
    pub addr: String,
}

impl HttpChild {
    /// Start with `args` (and no warm pool unless `env` sets `REPLBOX_POOL`), or the log of
    /// a server that stopped before listening.
    pub async fn try_start(args: &[&str], env: &[(&str, &str)]) -> Result<Self, String> {
        Self::try_start_as(args, env, None).await
    }

    /// [`try_start`](Self::try_start) as `uid` (and its gid) when given, which needs root.
    pub async fn try_start_as(
        args: &[&str],
        env: &[(&str, &str)],
        uid: Option<u32>,
    ) -> Result<Self, String> {
        let mut cmd = tokio::process::Command::new(super::BIN);
        if let Some(uid) = uid {
            // std drops the supplementary groups too when it changes the uid as root.
            cmd.uid(uid).gid(uid);
        }
        cmd.args(["serve", "--http", "127.0.0.1:0"]).args(args);
        for var in ["REPLBOX_TOKENS", "REPLBOX_TOKENS_FILE", "REPLBOX_LOG"] {
            cmd.env_remove(var);
        }
        cmd.env("REPLBOX_POOL", "0")
            .env("REPLBOX_LOG", "warn,replbox=info");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| format!("spawn replbox: {e}"))?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let (tx, rx) = tokio::sync::oneshot::channel::<String>();
        tokio::spawn(async move {
            let mut tx = Some(tx);
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("[replbox http] {line}");
                if let Some(rest) = line.split("listening on http://").nth(1)
                    && let Some(addr) = rest.split('/').next()
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(addr.to_string());
                }
            }
        });
        match tokio::time::timeout(Duration::from_secs(30), rx).await {
            Ok(Ok(addr)) => Ok(Self { child, addr }),
            _ => {
                let _ = child.kill().await;
                Err(format!(
                    "replbox {args:?} did not listen (its log is above)"
                ))
            }
        }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    /// An MCP client presenting `token`.
    pub async fn connect(&self, token: &str) -> RunningService<RoleClient, ()> {
        let config =
            StreamableHttpClientTransportConfig::with_uri(format!("http://{}/mcp", self.addr))
                .auth_header(token.to_string());
        ().serve(StreamableHttpClientTransport::from_config(config))
            .await
            .unwrap_or_else(|e| panic!("MCP handshake over HTTP failed: {e}"))
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}
