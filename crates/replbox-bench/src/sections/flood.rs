//! Output that is expensive to render: a python session writing the cursor-escape flood
//! (`ESC[999999;999999H ESC[2J` 200,000 times, 4 MB). How long it takes to come back,
//! against its `timeout_ms`; and a bystander's `run-code` while two such floods run,
//! against the same call on the quiet server.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde_json::{Value, json};

use super::{Ctx, Measurement, QUIET, Row, args_of, close_session, python_here};
use crate::client::{Handle, McpServer};

/// The session's deadline for the flood.
const TIMEOUT_MS: u64 = 60_000;

/// The 4 MB flood, then a line.
const FLOOD: &str = "import sys\n\
sys.stdout.write('\\x1b[999999;999999H\\x1b[2J' * 200000)\n\
print('flood done')";

/// The flood written again and again from when it creates `started` until `release`
/// appears in its directory (or 50 s pass, which is reported as an error).
const ENDLESS_FLOOD: &str = r#"import os, sys, time
open('started', 'w').close()
flood = '\x1b[999999;999999H\x1b[2J' * 200000
released = False
give_up = time.monotonic() + 50
while not released and time.monotonic() < give_up:
    sys.stdout.write(flood)
    sys.stdout.flush()
    released = os.path.exists('release')
print('released' if released else 'gave up')"#;

pub(super) async fn render_flood(ctx: &Ctx) -> Result<Vec<Row>> {
    if !python_here(ctx).await? {
        return Ok(Vec::new());
    }
    let server = McpServer::start(ctx.serve_command()).await?;
    let mut sessions = Vec::new();
    let measured = async {
        for _ in 0..3 {
            let (_, _, started) = server
                .call_ok("session_start", json!({"language": "python"}))
                .await?;
            let (Some(id), Some(cwd)) = (started["session_id"].as_str(), started["cwd"].as_str())
            else {
                bail!("session_start returned no session_id or cwd: {started}");
            };
            sessions.push((id.to_string(), PathBuf::from(cwd)));
        }
        let h = server.handle();
        let rounds = ctx.slow_rounds();

        // One flood at a time.
        let (id, _) = &sessions[0];
        flood_once(&h, id).await?;
        let mut samples = Vec::with_capacity(rounds);
        let mut server_ms: f64 = 0.0;
        for _ in 0..rounds {
            server.wait_quiet(QUIET).await;
            let (t, reported) = flood_once(&h, id).await?;
            samples.push(t);
            server_ms = server_ms.max(reported as f64);
        }
        let one = Row {
            name: "render_flood".into(),
            title: format!(
                "4 MB cursor-escape flood through session_eval (timeout_ms {TIMEOUT_MS})"
            ),
            measurement: Measurement::new(samples, None)
                .metric("timeout_ms", TIMEOUT_MS as f64)
                .metric("largest_duration_ms_reported", server_ms),
        };

        // A bystander's run-code while two endless floods run, against it alone.
        let print1 = args_of(json!({"languageId": "python", "code": "print(1)"}));
        for _ in 0..3 {
            server.call_expecting("run-code", &print1, "1\n").await?;
        }
        let mut alone = Vec::with_capacity(rounds);
        let mut busy = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            server.wait_quiet(QUIET).await;
            alone.push(server.call_expecting("run-code", &print1, "1\n").await?);
            server.wait_quiet(QUIET).await;
            busy.push(bystander_during_floods(&server, &h, &sessions[1..]).await?);
        }
        let bystander = Row {
            name: "render_flood:bystander".into(),
            title: "run-code python print(1) while two sessions flood".into(),
            measurement: Measurement::against(busy, "the same call on the quiet server", alone),
        };
        Ok(vec![one, bystander])
    }
    .await;
    for (id, _) in &sessions {
        close_session(&server, id).await;
    }
    server.stop().await;
    measured
}

/// One flood: the time, and the `duration_ms` the server reported. Anything but `ok` with
/// the line after the flood at the end is an error.
async fn flood_once(h: &Handle, id: &str) -> Result<(Duration, u64)> {
    let (t, _, out) = h
        .call_json(
            "session_eval",
            json!({"session_id": id, "code": FLOOD, "timeout_ms": TIMEOUT_MS}),
        )
        .await?;
    check_flood(&out, "flood done\n")?;
    Ok((t, out["duration_ms"].as_u64().unwrap_or(u64::MAX)))
}

fn check_flood(out: &Value, ending: &str) -> Result<()> {
    let output = out["output"].as_str().unwrap_or("");
    if out["status"] != "ok" || !output.ends_with(ending) {
        let last: String = output
            .chars()
            .rev()
            .take(200)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        bail!(
            "the flood ended {} with output ending {last:?}",
            out["status"]
        );
    }
    Ok(())
}

/// Start the endless flood in both sessions, time `run-code print(1)` once both are
/// writing, then release them and check that they ended well.
async fn bystander_during_floods(
    server: &McpServer,
    h: &Handle,
    floods: &[(String, PathBuf)],
) -> Result<Duration> {
    for (_, cwd) in floods {
        for name in ["started", "release"] {
            let _ = std::fs::remove_file(cwd.join(name));
        }
    }
    let run = |id: &str| {
        let id = id.to_string();
        async move {
            h.call_json(
                "session_eval",
                json!({"session_id": id, "code": ENDLESS_FLOOD, "timeout_ms": TIMEOUT_MS}),
            )
            .await
        }
    };
    let bystander = async {
        for (_, cwd) in floods {
            wait_for(&cwd.join("started")).await?;
        }
        let print1 = args_of(json!({"languageId": "python", "code": "print(1)"}));
        let t = server.call_expecting("run-code", &print1, "1\n").await;
        for (_, cwd) in floods {
            std::fs::write(cwd.join("release"), b"")?;
        }
        t
    };
    let (a, b, t) = tokio::join!(run(&floods[0].0), run(&floods[1].0), bystander);
    for r in [a, b] {
        check_flood(&r?.2, "released\n")?;
    }
    t
}

/// Wait (at most 30 s) until `path` exists.
async fn wait_for(path: &Path) -> Result<()> {
    let started = Instant::now();
    while !path.exists() {
        if started.elapsed() > Duration::from_secs(30) {
            bail!("{} did not appear within 30 s", path.display());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}
