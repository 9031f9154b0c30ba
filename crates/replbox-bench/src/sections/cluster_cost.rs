//! What cluster mode (`--cluster`) costs a node: `session_start` (which claims the session
//! in etcd) and `session_eval` (which asks etcd nothing) on a node of a cluster, an etcd of
//! its own on loopback ports, against the same on a server without `--cluster`. Both serve
//! HTTP with a state directory (journals), without warm pools, each driven by one MCP
//! client; their samples are interleaved. Skipped, with a note, when etcd is not on PATH.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

use super::failover::{TOKEN, etcd, node, on_path};
use super::{Ctx, Measurement, Row, alternate, python_here};

type Client = RunningService<RoleClient, ()>;

pub(super) async fn cluster_cost(ctx: &Ctx) -> Result<Vec<Row>> {
    if !python_here(ctx).await? {
        return Ok(Vec::new());
    }
    if !on_path("etcd") {
        ctx.note("cluster: skipped (etcd is not on PATH: apt-get install etcd-server)".into());
        return Ok(Vec::new());
    }
    let dir = tempfile::tempdir()?;
    let root = std::fs::canonicalize(dir.path())?;
    let etcd = etcd(&root).await?;
    let (shared, single) = (root.join("shared"), root.join("single"));
    std::fs::create_dir(&shared)?;
    std::fs::create_dir(&single)?;
    let (dir_c, dir_s) = (shared.join("a"), single.join("a"));
    let (clustered, alone) = tokio::try_join!(
        node(ctx, Some(&etcd.1), &dir_c, "a"),
        node(ctx, None, &dir_s, "a")
    )?;
    let (c, s) = tokio::try_join!(client(&clustered.1), client(&alone.1))?;

    // session_start, then an untimed session_close (which releases the claim).
    let start = |cl: &Client| {
        let peer = cl.peer().clone();
        async move {
            let t0 = Instant::now();
            let o = call(&peer, "session_start", json!({"language": "python"})).await?;
            let took = t0.elapsed();
            let id = o["session_id"].as_str().context("no session_id")?;
            call(&peer, "session_close", json!({"session_id": id})).await?;
            Ok(took)
        }
    };
    start(&c).await?;
    start(&s).await?;
    let rounds = ctx.iterations.min(20);
    let (ours, floor) = alternate(rounds, || start(&c), || start(&s)).await?;
    let start_row = Row {
        name: "cluster:session_start".into(),
        title: "session_start (python) on a --cluster node (claims it in etcd) against a \
single server, both with --state-dir"
            .into(),
        measurement: Measurement::against(ours, "the same without --cluster", floor),
    };

    // session_eval 1+1 in one session on each.
    let session = |cl: &Client| {
        let peer = cl.peer().clone();
        async move {
            let o = call(&peer, "session_start", json!({"language": "python"})).await?;
            Ok::<_, anyhow::Error>(
                o["session_id"]
                    .as_str()
                    .context("no session_id")?
                    .to_string(),
            )
        }
    };
    let (ic, is) = tokio::try_join!(session(&c), session(&s))?;
    let eval = |cl: &Client, id: &str| {
        let (peer, id) = (cl.peer().clone(), id.to_string());
        async move {
            let t0 = Instant::now();
            let o = call(
                &peer,
                "session_eval",
                json!({"session_id": id, "code": "1+1"}),
            )
            .await?;
            let took = t0.elapsed();
            if o["output"] != "2\n" {
                bail!("session_eval 1+1 answered {o}");
            }
            Ok(took)
        }
    };
    for _ in 0..3 {
        eval(&c, &ic).await?;
        eval(&s, &is).await?;
    }
    let (ours, floor) = alternate(ctx.iterations, || eval(&c, &ic), || eval(&s, &is)).await?;
    let eval_row = Row {
        name: "cluster:session_eval".into(),
        title: "session_eval 1+1 (python) on a --cluster node against a single server, both \
with --state-dir"
            .into(),
        measurement: Measurement::against(ours, "the same without --cluster", floor),
    };
    let _ = c.cancel().await;
    let _ = s.cancel().await;
    drop((clustered, alone, etcd));
    Ok(vec![start_row, eval_row])
}

async fn client(url: &str) -> Result<Client> {
    let config = StreamableHttpClientTransportConfig::with_uri(url.to_string()).auth_header(TOKEN);
    Ok(
        ().serve(StreamableHttpClientTransport::from_config(config))
            .await?,
    )
}

/// One tool call: its structured content; a refusal is an error.
async fn call(peer: &rmcp::Peer<RoleClient>, tool: &str, args: Value) -> Result<Value> {
    let params = CallToolRequestParams::new(tool.to_string())
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    let r = tokio::time::timeout(Duration::from_secs(60), peer.call_tool(params))
        .await
        .context("a call took too long")??;
    let v = r.structured_content.unwrap_or(Value::Null);
    if r.is_error.unwrap_or(false) {
        bail!("{tool}: {v}");
    }
    Ok(v)
}
