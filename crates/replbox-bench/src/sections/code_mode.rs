//! Code mode: a tool call made from a Python cell, bridged by replbox to an upstream MCP
//! server, against the same call made directly by an MCP client (rmcp's, over stdio); and
//! a twenty-call chain done both ways, as the time and the bytes an agent would read (each
//! tool result, against one `session_eval` result). The upstream is
//! `examples/upstream_probe` (built beside the server: `cargo build --release --examples`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use serde_json::json;
use tokio::process::Command;

use super::{Ctx, Measurement, Row, args_of, close_session, python_here};
use crate::client::McpServer;

/// The cities of the chain.
const CITIES: [&str; 20] = [
    "Amsterdam",
    "Berlin",
    "Cairo",
    "Denver",
    "Edinburgh",
    "Florence",
    "Geneva",
    "Havana",
    "Istanbul",
    "Jakarta",
    "Kyoto",
    "Lima",
    "Madrid",
    "Nairobi",
    "Oslo",
    "Prague",
    "Quito",
    "Rome",
    "Seoul",
    "Tunis",
];

fn probe_beside(server: &Path) -> Option<PathBuf> {
    let p = server.parent()?.join("examples/upstream_probe");
    p.is_file().then_some(p)
}

pub(super) async fn code_mode(ctx: &Ctx) -> Result<Vec<Row>> {
    if !python_here(ctx).await? {
        return Ok(Vec::new());
    }
    let Some(probe) = probe_beside(&ctx.server) else {
        ctx.note(format!(
            "code_mode: skipped (no examples/upstream_probe beside {}: cargo build --release \
             --examples)",
            ctx.server.display()
        ));
        return Ok(Vec::new());
    };
    let dir = tempfile::tempdir()?;
    let servers = dir.path().join("servers.json");
    std::fs::write(
        &servers,
        json!({"mcpServers": {"probe": {"command": probe}}}).to_string(),
    )?;
    let mut config = ctx.without_pool();
    config.mcp.servers = Some(servers);
    let server = McpServer::start(ctx.serve_with(&config)).await?;
    let direct =
        ().serve(TokioChildProcess::new(Command::new(&probe))?)
            .await
            .context("MCP client to the probe")?;
    let rows = async {
        let (_, _, started) = server
            .call_ok(
                "session_start",
                json!({"language": "python", "mcp_servers": ["probe"]}),
            )
            .await?;
        let id = started["session_id"]
            .as_str()
            .context("no session_id")?
            .to_string();
        let rows = measure(ctx, &server, &direct, &id).await;
        close_session(&server, &id).await;
        rows
    }
    .await;
    let _ = direct.cancel().await;
    server.stop().await;
    rows
}

async fn measure(
    ctx: &Ctx,
    server: &McpServer,
    direct: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    id: &str,
) -> Result<Vec<Row>> {
    let n = ctx.iterations.max(20);
    let add = |i: usize| {
        CallToolRequestParams::new("add").with_arguments(args_of(json!({"a": i, "b": 1})))
    };
    // Warm both ways up (the upstream started, the module imported, the connection open).
    for i in 0..20 {
        direct.call_tool(add(i)).await?;
    }
    let (_, text, _) = server
        .call_ok(
            "session_eval",
            json!({"session_id": id, "code": "from replbox import tools\nimport time, statistics\nfor i in range(20): tools.probe.add(a=i, b=1)\nprint('ok')"}),
        )
        .await?;
    if text.trim() != "ok" {
        bail!("the warm-up cell printed {text:?}");
    }
    let mut floor = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        direct.call_tool(add(i)).await?;
        floor.push(t.elapsed());
    }
    // Each call timed inside the cell, where the code sees it.
    let code = format!(
        "_t = []\nfor i in range({n}):\n    s = time.perf_counter_ns()\n    tools.probe.add(a=i, b=1)\n    _t.append(time.perf_counter_ns() - s)\nprint(','.join(map(str, _t)))"
    );
    let (_, text, _) = server
        .call_ok("session_eval", json!({"session_id": id, "code": code}))
        .await?;
    let ours: Vec<Duration> = text
        .trim()
        .split(',')
        .map(|s| s.parse::<u64>().map(Duration::from_nanos))
        .collect::<Result<_, _>>()
        .with_context(|| format!("the timing cell printed {text:?}"))?;
    let call = Row {
        name: "code_mode_call".into(),
        title: "one tool call from a Python cell through replbox (probe add)".into(),
        measurement: Measurement::against(
            ours,
            "an MCP client calling the upstream directly",
            floor,
        ),
    };
    Ok(vec![call, chain(ctx, server, direct, id).await?])
}

/// Twenty weather lookups and their mean temperature: each tool result read by the agent,
/// against one cell whose result is the mean.
async fn chain(
    ctx: &Ctx,
    server: &McpServer,
    direct: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    id: &str,
) -> Result<Row> {
    let rounds = ctx.slow_rounds().max(5);
    let cities = serde_json::to_string(&CITIES)?;
    let code = format!(
        "rows = [tools.probe.weather(city=c) for c in {cities}]\nround(statistics.mean(r['temperature'] for r in rows), 2)"
    );
    let (mut direct_t, mut ours_t) = (Vec::new(), Vec::new());
    let (mut direct_bytes, mut ours_bytes) = (0usize, 0usize);
    for _ in 0..rounds {
        let t = Instant::now();
        let mut bytes = 0;
        for c in CITIES {
            let r = direct
                .call_tool(
                    CallToolRequestParams::new("weather")
                        .with_arguments(args_of(json!({"city": c}))),
                )
                .await?;
            // What the model reads of a tool result: its JSON as the client passes it on.
            bytes += serde_json::to_vec(&r)?.len();
        }
        direct_t.push(t.elapsed());
        direct_bytes = bytes;
        let (elapsed, result) = server
            .call(
                "session_eval",
                &args_of(json!({"session_id": id, "code": code})),
            )
            .await?;
        ours_t.push(elapsed);
        let text = crate::client::text_of(&result);
        if result.is_error == Some(true) || text.trim().is_empty() {
            bail!("the chain cell failed: {text}");
        }
        ours_bytes = serde_json::to_vec(&result)?.len();
    }
    let ratio = direct_bytes as f64 / ours_bytes.max(1) as f64;
    Ok(Row {
        name: "code_mode_chain".into(),
        title: "20 weather lookups and their mean: one session_eval vs 20 direct calls".into(),
        measurement: Measurement::against(
            ours_t,
            "20 tool calls by the agent, one by one",
            direct_t,
        )
        .metric("bytes_read_direct", direct_bytes as f64)
        .metric("bytes_read_code_mode", ours_bytes as f64)
        .metric("bytes_ratio", ratio),
    })
}
