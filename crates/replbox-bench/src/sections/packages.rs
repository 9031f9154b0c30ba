//! Packages on demand: a first installation (an empty package cache) through `run-code`
//! against uv itself installing the same into an empty target with an empty cache (the
//! floor: what the installer costs without replbox); and the second session with the same
//! `packages` (the cache has them) against a session without packages, both with the same
//! first cell (the goal: at most 100 ms more; the set's shared layer is taken as it is,
//! read-only, so `install_ms_median` is the server's bookkeeping alone). The package set is
//! the index's (PyPI by default, so these rows need it). docs/packages.md keeps the figures.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;
use tokio::process::Command;

use super::{Ctx, Measurement, Row, alternate, close_session, python_here, python_of};
use crate::client::McpServer;

/// A mid-sized set of pure wheels: rich and its dependencies (markdown-it-py, mdurl,
/// pygments), about 4 MB.
const PACKAGE: &str = "rich";
const IMPORT: &str = "import rich.console; print('ok')";

/// A directory of the bench's own, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Result<Self> {
        // Short: the installer's proxy socket lies below it (a socket path's length is
        // bounded).
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("rbb-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).with_context(|| format!("cannot create {}", p.display()))?;
        Ok(Self(p))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The uv the floor runs: the operator's `--uv`, else the one the `uv` package names.
async fn uv(ctx: &Ctx) -> Option<PathBuf> {
    if let Some(u) = &ctx.config.packages.uv {
        return Some(u.clone());
    }
    let out = Command::new("python3")
        .args(["-c", "import uv; print(uv.find_uv_bin())"])
        .output()
        .await
        .ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    (out.status.success() && p.is_file()).then_some(p)
}

/// `uv pip install` of [`PACKAGE`] for `python` into an empty target with an empty cache.
async fn raw_install(uv: &Path, python: &Path) -> Result<Duration> {
    let dir = Scratch::new("floor")?;
    let t = Instant::now();
    let out = Command::new(uv)
        .args([
            "pip",
            "install",
            "--no-config",
            "--no-progress",
            "--no-build",
        ])
        .arg("--python")
        .arg(python)
        .arg("--cache-dir")
        .arg(dir.0.join("cache"))
        .arg("--target")
        .arg(dir.0.join("target"))
        .args(["--", PACKAGE])
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .context("uv")?;
    let elapsed = t.elapsed();
    if !out.status.success() {
        bail!(
            "uv pip install {PACKAGE} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(elapsed)
}

/// A server with an empty package cache of its own.
async fn server_with_empty_cache(ctx: &Ctx, cache: &Scratch) -> Result<McpServer> {
    let mut config = ctx.without_pool();
    config.packages.package_cache = Some(cache.0.join("c"));
    McpServer::start(ctx.serve_with(&config)).await
}

/// `run-code` with `packages` on a server whose cache is empty (its start untimed).
async fn first_install(ctx: &Ctx) -> Result<Duration> {
    let cache = Scratch::new("first")?;
    let server = server_with_empty_cache(ctx, &cache).await?;
    let r = async {
        let t = Instant::now();
        let (_, text, s) = server
            .call_ok(
                "run-code",
                json!({"languageId": "python", "code": IMPORT, "packages": [PACKAGE]}),
            )
            .await?;
        let elapsed = t.elapsed();
        if !text.starts_with("ok\n") || s["packages"]["downloaded"].as_u64().unwrap_or(0) == 0 {
            bail!("run-code with packages [{PACKAGE}]: {text:?} {s}");
        }
        Ok(elapsed)
    }
    .await;
    server.stop().await;
    r
}

/// `session_start` (with `packages` when given) then a first cell, timed together; the
/// session closed after, untimed. The installation's own duration beside.
async fn session(
    server: &McpServer,
    packages: &[&str],
    cell: &str,
    cached: bool,
) -> Result<(Duration, u64)> {
    let t = Instant::now();
    let mut args = json!({"language": "python"});
    if !packages.is_empty() {
        args["packages"] = json!(packages);
    }
    let (_, _, started) = server.call_ok("session_start", args).await?;
    let id = started["session_id"]
        .as_str()
        .context("session_start returned no session_id")?
        .to_string();
    let (_, text, _) = server
        .call_ok("session_eval", json!({"session_id": id, "code": cell}))
        .await?;
    let elapsed = t.elapsed();
    close_session(server, &id).await;
    if text != "ok\n" {
        bail!("the first cell returned {text:?}");
    }
    if cached && !packages.is_empty() && started["packages"]["downloaded"] != 0 {
        bail!("the second session downloaded: {started}");
    }
    Ok((
        elapsed,
        started["packages"]["duration_ms"].as_u64().unwrap_or(0),
    ))
}

pub(super) async fn packages(ctx: &Ctx) -> Result<Vec<Row>> {
    if !python_here(ctx).await? {
        return Ok(Vec::new());
    }
    if ctx.config.packages.no_packages {
        ctx.note("packages: skipped (--no-packages)".into());
        return Ok(Vec::new());
    }
    let Some(uv) = uv(ctx).await else {
        ctx.note("packages: skipped (uv is not installed)".into());
        return Ok(Vec::new());
    };
    let mut rows = Vec::new();
    // First installations: every sample downloads, so few of them.
    let probe = McpServer::start(ctx.serve_with(&ctx.without_pool())).await?;
    let python = python_of(&probe).await;
    probe.stop().await;
    let python = python?;
    let rounds = ctx.slow_rounds().min(5);
    let (ours, floor) =
        alternate(rounds, || first_install(ctx), || raw_install(&uv, &python)).await?;
    rows.push(Row {
        name: "packages_first".into(),
        title: format!(
            "run-code with packages [{PACKAGE}] (its dependencies too), empty package cache, \
             against uv pip install of the same into an empty target and cache"
        ),
        measurement: Measurement::against(ours, "uv pip install, empty cache", floor),
    });
    // The second session: the cache has them.
    let cache = Scratch::new("second")?;
    let server = server_with_empty_cache(ctx, &cache).await?;
    let second = async {
        // Untimed: the cache filled, detection and page cache warm.
        session(&server, &[PACKAGE], IMPORT, false).await?;
        session(&server, &[], "print('ok')", false).await?;
        let installs = std::cell::RefCell::new(Vec::new());
        let (ours, floor) = alternate(
            ctx.slow_rounds(),
            || async {
                let (t, install) = session(&server, &[PACKAGE], "print('ok')", true).await?;
                installs.borrow_mut().push(install as f64);
                Ok(t)
            },
            || async { Ok(session(&server, &[], "print('ok')", true).await?.0) },
        )
        .await?;
        let mut installs = installs.into_inner();
        installs.sort_by(f64::total_cmp);
        let extra = median(&ours).as_secs_f64() * 1000.0 - median(&floor).as_secs_f64() * 1000.0;
        Ok::<_, anyhow::Error>(Row {
            name: "packages_cached".into(),
            title: format!(
                "session_start with packages [{PACKAGE}] (in the cache) + a first cell, against \
                 session_start without packages + the same cell (goal: at most 100 ms more)"
            ),
            measurement: Measurement::against(ours, "the same without packages", floor)
                .metric("extra_ms_median", extra.round())
                .metric(
                    "install_ms_median",
                    installs.get(installs.len() / 2).copied().unwrap_or(0.0),
                ),
        })
    }
    .await;
    server.stop().await;
    rows.push(second?);
    Ok(rows)
}

fn median(v: &[Duration]) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    s.get(s.len() / 2).copied().unwrap_or_default()
}
