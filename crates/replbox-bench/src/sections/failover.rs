//! A cluster's failover (`--cluster`): an etcd of its own on loopback ports and two
//! `replbox serve --http` nodes with one shared directory of journals. Each round starts
//! both nodes, runs a python session of three cells on the first, kills that node
//! (SIGKILL) and times from the kill to the first correct answer of the session on the
//! other: the lease's TTL, then the claim, the journal's move and the replay. Skipped,
//! with a note, when etcd is not on PATH.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::{Ctx, Measurement, Row, python_here};

pub(super) const TOKEN: &str = "bench-failover-token-0123456789";
/// Longest wait for a node to listen, etcd to answer, or the session to come back.
const WITHIN: Duration = Duration::from_secs(60);

pub(super) async fn failover(ctx: &Ctx) -> Result<Vec<Row>> {
    if !python_here(ctx).await? {
        return Ok(Vec::new());
    }
    if !on_path("etcd") {
        ctx.note("failover: skipped (etcd is not on PATH: apt-get install etcd-server)".into());
        return Ok(Vec::new());
    }
    let dir = tempfile::tempdir()?;
    let root = std::fs::canonicalize(dir.path())?;
    let etcd = etcd(&root).await?;
    let mut samples = Vec::new();
    for round in 0..ctx.slow_rounds() {
        let shared = root.join(format!("shared-{round}"));
        std::fs::create_dir(&shared)?;
        let (dir_a, dir_b) = (shared.join("a"), shared.join("b"));
        let (mut a, b) = tokio::try_join!(
            node(ctx, Some(&etcd.1), &dir_a, "a"),
            node(ctx, Some(&etcd.1), &dir_b, "b")
        )?;
        let (_, started) = call(&a.1, "session_start", json!({"language": "python"})).await?;
        let id = started["session_id"]
            .as_str()
            .context("session_start returned no session_id")?
            .to_string();
        for code in ["x = 1", "y = x + 1", "z = y + 1"] {
            let (error, o) = call(
                &a.1,
                "session_eval",
                json!({"session_id": id, "code": code}),
            )
            .await?;
            if error {
                bail!("session_eval {code:?} on node a: {o}");
            }
        }
        a.0.kill().await?;
        let killed = Instant::now();
        loop {
            let (error, o) = call(
                &b.1,
                "session_eval",
                json!({"session_id": id, "code": "print(z)"}),
            )
            .await?;
            if !error {
                if o["output"] != "3\n" {
                    bail!("the adopted session answered {o}");
                }
                break;
            }
            // The dead node's lease lives on until its TTL: the session is elsewhere.
            let kind = &o["error"]["kind"];
            if kind != "session_elsewhere" && kind != "busy" {
                bail!("node b: {o}");
            }
            if killed.elapsed() > WITHIN {
                bail!("the session was not adopted within {WITHIN:?}: {o}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        samples.push(killed.elapsed());
        drop(b);
    }
    drop(etcd);
    Ok(vec![Row {
        name: "failover".into(),
        title: "cluster: SIGKILL of a python session's node to its first correct answer on \
another (3-cell journal; lease TTL included)"
            .into(),
        measurement: Measurement::new(samples, None),
    }])
}

pub(super) fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(program).is_file()))
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// etcd on loopback ports, killed on drop, and its client URL once it answers.
pub(super) async fn etcd(root: &Path) -> Result<(Child, String)> {
    let (client, peer) = (free_port()?, free_port()?);
    let url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let child = Command::new("etcd")
        .arg("--data-dir")
        .arg(root.join("etcd"))
        .args([
            "--listen-client-urls",
            &url,
            "--advertise-client-urls",
            &url,
        ])
        .args(["--listen-peer-urls", &peer_url])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("default={peer_url}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start etcd")?;
    let t0 = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", client))
        .await
        .is_err()
    {
        if t0.elapsed() > WITHIN {
            bail!("etcd did not listen on {url}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((child, url))
}

/// A node of the cluster at `etcd` (a server of its own without one), with `state_dir`,
/// killed on drop, and its MCP URL once it listens.
pub(super) async fn node(
    ctx: &Ctx,
    etcd: Option<&str>,
    state_dir: &Path,
    id: &str,
) -> Result<(Child, String)> {
    let mut cmd = ctx.serve_with(&ctx.without_pool());
    cmd.args(["--http", "127.0.0.1:0"]);
    if let Some(etcd) = etcd {
        cmd.args(["--cluster", etcd, "--node-id", id]);
    }
    cmd.arg("--state-dir")
        .arg(state_dir)
        .env("REPLBOX_TOKENS", TOKEN)
        .env("REPLBOX_LOG", "warn,replbox::http=info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().context("cannot start a node")?;
    let stderr = child.stderr.take().context("no stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let find = async {
        let mut said = String::new();
        while let Some(line) = lines.next_line().await? {
            if let Some(at) = line.find("listening on http://") {
                let url = line[at + "listening on ".len()..].trim().to_string();
                return Ok(url);
            }
            said.push_str(&line);
            said.push('\n');
        }
        bail!("node {id} exited before it listened:\n{said}")
    };
    let url = tokio::time::timeout(WITHIN, find)
        .await
        .with_context(|| format!("node {id} did not listen"))??;
    // The rest of its log is drained, so that it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, url))
}

/// One tool call through a fresh HTTP client: whether it was an error, and its structured
/// content (a refusal's is `{"error": {"kind", ...}}`).
async fn call(url: &str, tool: &str, args: Value) -> Result<(bool, Value)> {
    let config = StreamableHttpClientTransportConfig::with_uri(url.to_string()).auth_header(TOKEN);
    let client = ().serve(StreamableHttpClientTransport::from_config(config)).await?;
    let params = CallToolRequestParams::new(tool.to_string())
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    let r = tokio::time::timeout(WITHIN, client.call_tool(params)).await;
    let _ = client.cancel().await;
    let r = r.context("a call took too long")??;
    Ok((
        r.is_error.unwrap_or(false),
        r.structured_content.unwrap_or(Value::Null),
    ))
}
