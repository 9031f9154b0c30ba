//! `model_bytes`: what a model reads of a reference data-analysis session, with replbox's
//! display features and without them, in the same run.
//!
//! The session (python, pandas, matplotlib): write a CSV of 5,000 rows, load it, look at
//! the frame, describe it, build a wide frame and look at it, a groupby, a figure, a big
//! printed output, `session_vars`, a file written. "After" does each step the way these
//! features let an agent: `session_inspect` to look at a frame, a cell's value for a table,
//! a big output kept behind a preview and a link. "Before" does the same steps as an agent
//! had to without them: `df.info()` and `df.head()` printed, `print(wide)`, `print()` of each
//! table, and the whole big output inline (a server whose `--output-cap` holds it). Steps
//! that are the same either way (the CSV, the load, the figure, `session_vars`, the file)
//! are run, and counted, in both.
//!
//! What is counted, per call, is what a host hands the model of a result's `content`:
//! - a text block: its text;
//! - an embedded resource: its text and URI (a binary one: its URI and MIME type);
//! - a `resource_link`: its URI, name, description and MIME type;
//! - an image: no bytes, but tokens for its pixels (width × height / 750, the estimate
//!   Anthropic publishes for images), read from the PNG's header;
//! - plus `tools/list` once for the connection (the same in both).
//!
//! `structuredContent` is not counted: most hosts do not show it to the model. Tokens are
//! estimated as bytes / 4 plus the images' tokens, the same way for both.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rmcp::model::CallToolResult;
use serde_json::{Value, json};

use super::{Ctx, Measurement, Row, args_of, close_session, python_here, start_session};
use crate::client::McpServer;

/// The data: 5,000 rows, seeded, written as the session's own file.
const SETUP: &str = r#"import numpy as np, pandas as pd
rng = np.random.default_rng(7)
n = 5000
frame = pd.DataFrame({
    "date": pd.date_range("2025-01-01", periods=n, freq="h").strftime("%Y-%m-%d %H:%M"),
    "region": rng.choice(["north", "south", "east", "west"], n),
    "product": rng.choice(["alpha", "beta", "gamma", "delta", "omega"], n),
    "units": rng.integers(1, 50, n),
    "price": rng.normal(20, 5, n).round(2),
    "channel": rng.choice(["web", "store", "phone"], n),
    "customer_age": rng.integers(18, 80, n).astype(float),
})
frame.loc[rng.choice(n, 150, replace=False), "customer_age"] = np.nan
frame.to_csv("sales.csv", index=False)
del frame, rng, n"#;

const LOAD: &str = r#"import pandas as pd, matplotlib.pyplot as plt
df = pd.read_csv("sales.csv", parse_dates=["date"])
df["revenue"] = df.units * df.price
df.shape"#;

const WIDE: &str = r#"wide = df.pivot_table(index=df.date.dt.date, columns=["region", "product"], values="revenue", aggfunc="sum")"#;

const GROUP: &str = r#"df.groupby("region")[["units", "revenue"]].agg(["sum", "mean"])"#;

const GROUP_PRINTED: &str =
    r#"print(df.groupby("region")[["units", "revenue"]].agg(["sum", "mean"]))"#;

const FIGURE: &str = r#"df.set_index("date").revenue.resample("W").sum().plot(title="weekly revenue")
plt.show()"#;

const BIG: &str = "for row in df.itertuples():\n    print(row)";

const WRITE: &str = r#"df.groupby("region").revenue.sum().to_csv("revenue_by_region.csv")"#;

/// One call of a step: a cell, `session_inspect` of a name, or `session_vars`.
#[derive(Clone, Copy)]
enum Call {
    Eval(&'static str),
    Inspect(&'static str),
    Vars,
}

/// A step of the session: its name, and the call each way.
struct Step {
    name: &'static str,
    after: Call,
    before: Call,
}

fn steps() -> Vec<Step> {
    let same = |name, call| Step {
        name,
        after: call,
        before: call,
    };
    vec![
        same("write_csv", Call::Eval(SETUP)),
        same("load", Call::Eval(LOAD)),
        Step {
            name: "look_at_frame",
            after: Call::Inspect("df"),
            before: Call::Eval("df.info()\nprint(df.head())"),
        },
        Step {
            name: "describe",
            after: Call::Eval("df.describe()"),
            before: Call::Eval("print(df.describe())"),
        },
        same("build_wide", Call::Eval(WIDE)),
        Step {
            name: "look_at_wide",
            after: Call::Inspect("wide"),
            before: Call::Eval("print(wide)"),
        },
        Step {
            name: "groupby",
            after: Call::Eval(GROUP),
            before: Call::Eval(GROUP_PRINTED),
        },
        same("figure", Call::Eval(FIGURE)),
        same("big_output", Call::Eval(BIG)),
        same("session_vars", Call::Vars),
        same("write_file", Call::Eval(WRITE)),
    ]
}

/// What a model reads of results: bytes of text, and tokens of images.
#[derive(Debug, Default, Clone, Copy)]
struct Read {
    bytes: usize,
    image_tokens: f64,
}

impl Read {
    fn tokens(&self) -> f64 {
        (self.bytes as f64 / 4.0 + self.image_tokens).round()
    }

    fn add(&mut self, other: Read) {
        self.bytes += other.bytes;
        self.image_tokens += other.image_tokens;
    }
}

/// What a host shows the model of one result's content (see the module's counting rule).
fn read_of(result: &CallToolResult) -> Read {
    let mut read = Read::default();
    for block in &result.content {
        let Ok(v) = serde_json::to_value(block) else {
            continue;
        };
        let s = |v: &Value, k: &str| v[k].as_str().map_or(0, str::len);
        match v["type"].as_str() {
            Some("text") => read.bytes += s(&v, "text"),
            Some("image") => {
                if let Some((w, h)) = v["data"].as_str().and_then(png_size) {
                    read.image_tokens += f64::from(w) * f64::from(h) / 750.0;
                }
            }
            Some("resource") => {
                let r = &v["resource"];
                read.bytes += s(r, "uri") + s(r, "text");
                if r.get("blob").is_some() {
                    read.bytes += s(r, "mimeType");
                }
            }
            Some("resource_link") => {
                read.bytes +=
                    s(&v, "uri") + s(&v, "name") + s(&v, "description") + s(&v, "mimeType");
            }
            _ => read.bytes += v.to_string().len(),
        }
    }
    read
}

/// Width and height of a PNG given as base64, from its IHDR chunk (the first 24 bytes).
fn png_size(b64: &str) -> Option<(u32, u32)> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bytes = Vec::with_capacity(24);
    for chunk in b64.as_bytes().get(..32)?.chunks(4) {
        let mut n = 0u32;
        for &c in chunk {
            n = n << 6 | ALPHABET.iter().position(|&a| a == c)? as u32;
        }
        bytes.extend_from_slice(&n.to_be_bytes()[1..]);
    }
    if bytes.get(12..16)? != b"IHDR" {
        return None;
    }
    let w = u32::from_be_bytes(bytes[16..20].try_into().ok()?);
    let h = u32::from_be_bytes(bytes[20..24].try_into().ok()?);
    Some((w, h))
}

/// One call of a step in session `id`; an error result is an error.
async fn call(server: &McpServer, id: &str, c: Call) -> Result<CallToolResult> {
    let (tool, args) = match c {
        Call::Eval(code) => (
            "session_eval",
            json!({"session_id": id, "code": code, "timeout_ms": 120_000}),
        ),
        Call::Inspect(name) => ("session_inspect", json!({"session_id": id, "name": name})),
        Call::Vars => ("session_vars", json!({"session_id": id})),
    };
    let (_, result) = server.call(tool, &args_of(args)).await?;
    if result.is_error == Some(true) {
        bail!("{tool} failed: {}", crate::client::text_of(&result));
    }
    if result
        .structured_content
        .as_ref()
        .and_then(|s| s["status"].as_str())
        == Some("error")
    {
        bail!(
            "{tool} ended in an error: {}",
            crate::client::text_of(&result)
        );
    }
    Ok(result)
}

/// The whole session one way (`after` or not) on `server`: its time, and per step what the
/// model read.
async fn session(server: &McpServer, after: bool) -> Result<(Duration, Vec<Read>)> {
    let started = Instant::now();
    let id = start_session(server, "python").await?;
    let mut reads = Vec::new();
    let run = async {
        for step in steps() {
            let c = if after { step.after } else { step.before };
            let result = call(server, &id, c)
                .await
                .with_context(|| format!("step {}", step.name))?;
            reads.push(read_of(&result));
        }
        anyhow::Ok(())
    }
    .await;
    close_session(server, &id).await;
    run?;
    Ok((started.elapsed(), reads))
}

pub(super) async fn model_bytes(ctx: &Ctx) -> Result<Vec<Row>> {
    if !python_here(ctx).await? {
        return Ok(Vec::new());
    }
    let after_server = McpServer::start(ctx.serve_with(&ctx.without_pool())).await?;
    // Without a preview and a link, the whole output is what the agent reads.
    let mut whole = ctx.without_pool();
    whole.output_cap = 4 << 20;
    let before_server = McpServer::start(ctx.serve_with(&whole)).await?;
    let measured = async {
        let probe = start_session(&after_server, "python").await?;
        let (_, text, _) = after_server
            .call_ok(
                "session_eval",
                json!({"session_id": probe, "code": "import pandas, matplotlib; print('ok')"}),
            )
            .await?;
        close_session(&after_server, &probe).await;
        if text != "ok\n" {
            ctx.note(format!(
                "model_bytes: skipped (python has no pandas or matplotlib: {})",
                text.trim()
            ));
            return Ok(Vec::new());
        }
        let tools = after_server.tools_list_json().await?.len();
        let (mut ours, mut floor) = (Vec::new(), Vec::new());
        let mut reads = None;
        for round in 0..ctx.iterations.clamp(1, 3) {
            // Alternated, so that machine noise hits both alike.
            let (a, b) = if round % 2 == 0 {
                let a = session(&after_server, true).await?;
                (a, session(&before_server, false).await?)
            } else {
                let b = session(&before_server, false).await?;
                (session(&after_server, true).await?, b)
            };
            ours.push(a.0);
            floor.push(b.0);
            reads = Some((a.1, b.1));
        }
        let (after, before) = reads.context("no round ran")?;
        let mut m = Measurement::against(
            ours,
            "the same analysis without these features: df.info() and df.head() printed, \
             print() of each table and of the wide frame, the whole big output inline \
             (--output-cap 4 MiB)",
            floor,
        );
        let (mut total_after, mut total_before) = (
            Read {
                bytes: tools,
                image_tokens: 0.0,
            },
            Read {
                bytes: tools,
                image_tokens: 0.0,
            },
        );
        let mut per_step = BTreeMap::new();
        for (k, step) in steps().iter().enumerate() {
            let (a, b) = (after[k], before[k]);
            total_after.add(a);
            total_before.add(b);
            per_step.insert(format!("step.{k:02}.{}.after", step.name), a.bytes as f64);
            per_step.insert(format!("step.{k:02}.{}.before", step.name), b.bytes as f64);
        }
        m = m
            .metric("tools_list_bytes", tools as f64)
            .metric("after_bytes", total_after.bytes as f64)
            .metric("before_bytes", total_before.bytes as f64)
            .metric("after_tokens", total_after.tokens())
            .metric("before_tokens", total_before.tokens())
            .metric("image_tokens", total_after.image_tokens.round())
            .metric(
                "before_over_after",
                ((total_before.tokens() / total_after.tokens().max(1.0)) * 100.0).round() / 100.0,
            );
        for (k, v) in per_step {
            m = m.metric(&k, v);
        }
        Ok(vec![Row {
            name: "model_bytes".into(),
            title: "a reference data-analysis session (python, pandas): the session's time; \
                    the bytes and tokens it returns to the model are its figures"
                .into(),
            measurement: m,
        }])
    }
    .await;
    after_server.stop().await;
    before_server.stop().await;
    measured
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_png_header_gives_its_size() {
        // The first 24 bytes of a 640x480 PNG, in base64.
        let head = "iVBORw0KGgoAAAANSUhEUgAAAoAAAAHgCAYAAAA";
        assert_eq!(png_size(head), Some((640, 480)));
        assert_eq!(png_size("R0lGODlhAQABAAAAACw="), None);
    }
}
