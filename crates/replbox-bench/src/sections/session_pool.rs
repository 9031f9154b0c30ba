//! Warm sessions (`--session-pool`): `session_start` and a first cell that imports the data
//! stack, agent-paced (a pause between calls lets the pool refill), on a server with warm
//! sessions against one without (`--session-pool 0`) in the same run; and the memory a warm
//! Python session (its whole process tree) holds while it waits.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;

use super::{Ctx, Measurement, QUIET, Row, alternate, close_session, python_here};
use crate::client::McpServer;

/// The first cell an analysis starts with.
const CELL: &str =
    "import pandas as pd, numpy as np, matplotlib.pyplot as plt; pd.DataFrame({'a': [1, 2]}).shape";

/// The pause after each call, as an agent reading a result would take; then the bench also
/// waits for the server's children to be idle (the pool refilled).
const GAP: Duration = Duration::from_secs(2);

/// `session_start` then [`CELL`], timed together; the session is closed after, untimed.
/// Whether the session was warm is returned beside the time.
async fn start_and_import(server: &McpServer) -> Result<(Duration, bool)> {
    let t = Instant::now();
    let (_, _, started) = server
        .call_ok("session_start", json!({"language": "python"}))
        .await?;
    let id = started["session_id"]
        .as_str()
        .context("session_start returned no session_id")?
        .to_string();
    let (_, text, _) = server
        .call_ok("session_eval", json!({"session_id": id, "code": CELL}))
        .await?;
    let elapsed = t.elapsed();
    close_session(server, &id).await;
    if text != "(2, 1)\n" {
        bail!("the first cell returned {text:?} (is pandas installed for python3?)");
    }
    Ok((elapsed, started["warm"] == true))
}

/// Pause like an agent, then until the server's children are idle.
async fn pause(server: &McpServer) {
    tokio::time::sleep(GAP).await;
    server.wait_quiet(QUIET).await;
}

pub(super) async fn session_pool(ctx: &Ctx) -> Result<Vec<Row>> {
    if !python_here(ctx).await? {
        return Ok(Vec::new());
    }
    if ctx.config.session_pool == 0 {
        ctx.note("session_pool: skipped (--session-pool 0)".into());
        return Ok(Vec::new());
    }
    let mut with = ctx.without_pool();
    with.session_pool = ctx.config.session_pool;
    with.preload = ctx.config.preload.clone();
    let mut without = ctx.without_pool();
    without.session_pool = 0;
    let warm = McpServer::start(ctx.serve_with(&with)).await?;
    let cold = McpServer::start(ctx.serve_with(&without)).await?;
    let rows = async {
        // Untimed: detection, page cache, and a first warm session used.
        for server in [&warm, &cold] {
            pause(server).await;
            start_and_import(server).await?;
        }
        let warm_starts = std::cell::Cell::new(0usize);
        let (ours, floor) = alternate(
            ctx.slow_rounds(),
            || async {
                pause(&warm).await;
                let (t, was_warm) = start_and_import(&warm).await?;
                warm_starts.set(warm_starts.get() + usize::from(was_warm));
                Ok(t)
            },
            || async {
                pause(&cold).await;
                Ok(start_and_import(&cold).await?.0)
            },
        )
        .await?;
        let n = ours.len();
        let timing = Row {
            name: "session_pool".into(),
            title: format!(
                "session_start + first cell importing pandas, numpy, pyplot; warm \
                 (--session-pool {}) against --session-pool 0; {} s between calls",
                with.session_pool,
                GAP.as_secs()
            ),
            measurement: Measurement::against(ours, "the same, --session-pool 0", floor)
                .metric("warm_starts", warm_starts.get() as f64)
                .metric("samples", n as f64),
        };
        pause(&warm).await;
        let preload = with.preload.as_deref().unwrap_or("pandas,numpy,matplotlib");
        let memory = pooled_memory(&warm, preload)?;
        Ok::<_, anyhow::Error>(vec![timing, memory])
    }
    .await;
    warm.stop().await;
    cold.stop().await;
    rows
}

/// The memory of the warm sessions waiting (no session open): RSS and PSS summed over each
/// one's process tree (from /proc/PID/smaps_rollup), per warm session. Samples: the time to
/// read them.
fn pooled_memory(server: &McpServer, preload: &str) -> Result<Row> {
    let t = Instant::now();
    let root = server.pid().context("the server has no pid")? as i32;
    let tree = crate::client::descendants(root);
    let pooled = tree.iter().filter(|p| parent(**p) == Some(root)).count();
    if pooled == 0 {
        bail!("no warm session is waiting");
    }
    let (mut rss, mut pss) = (0u64, 0u64);
    for pid in &tree {
        let (r, p) = smaps_rollup(*pid).unwrap_or((0, 0));
        rss += r;
        pss += p;
    }
    let per = |kib: u64| (kib as f64 / pooled as f64 / 1024.0 * 10.0).round() / 10.0;
    Ok(Row {
        name: "session_pool_memory".into(),
        title: format!(
            "memory per warm python session (its process tree, preload {preload:?}), \
             {pooled} waiting"
        ),
        measurement: Measurement::new(vec![t.elapsed()], None)
            .metric("warm_sessions", pooled as f64)
            .metric("rss_mib_per_session", per(rss))
            .metric("pss_mib_per_session", per(pss)),
    })
}

/// A process's parent (from /proc/PID/stat).
fn parent(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// Rss and Pss of a process, in KiB.
fn smaps_rollup(pid: i32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        line[name.len()..].split_whitespace().next()?.parse().ok()
    };
    Some((field("Rss:")?, field("Pss:")?))
}
