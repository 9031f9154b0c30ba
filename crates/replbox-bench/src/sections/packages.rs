//! Packages on demand: a first installation (an empty package cache) through `run-code`
//! against two floors measured in the same rounds: plain `pip install` of the same into a
//! fresh virtual environment with an empty pip cache (what a user would otherwise run), and
//! uv itself installing it into an empty target with an empty cache (what the installer
//! replbox runs costs without replbox); and the second session with the same `packages`
//! (the cache has them) against a session without packages, both with the same first cell
//! (the goal: at most 100 ms more; the set's shared layer is taken as it is, read-only, so
//! `install_ms_median` is the server's bookkeeping alone), for Python and for JavaScript
//! (npm's tree shared the same way). The package sets are the
//! indexes' (PyPI and npm's registry by default, so these rows need them).
//! docs/packages.md keeps the figures.

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

/// `pip install` of [`PACKAGE`] into a fresh virtual environment of `python` (made
/// untimed) with an empty pip cache: what a user without replbox runs.
async fn raw_pip(python: &Path) -> Result<Duration> {
    let dir = Scratch::new("pip")?;
    let venv = dir.0.join("venv");
    let made = Command::new(python)
        .args(["-m", "venv"])
        .arg(&venv)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .context("python -m venv")?;
    if !made.status.success() {
        bail!(
            "python -m venv failed: {}",
            String::from_utf8_lossy(&made.stderr)
        );
    }
    let t = Instant::now();
    let out = Command::new(venv.join("bin/python"))
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-input",
        ])
        .arg("--cache-dir")
        .arg(dir.0.join("cache"))
        .args(["--", PACKAGE])
        .env_remove("PIP_CONFIG_FILE")
        .env("PIP_NO_PYTHON_VERSION_WARNING", "1")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .context("pip")?;
    let elapsed = t.elapsed();
    if !out.status.success() {
        bail!(
            "pip install {PACKAGE} failed: {}",
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
    language: &str,
    packages: &[&str],
    cell: &str,
    cached: bool,
) -> Result<(Duration, u64)> {
    let t = Instant::now();
    let mut args = json!({"language": language});
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
    if text.trim_end() != "ok" {
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
    // Each round runs ours and both floors, in an order that turns every round, so that
    // drift and noise fall on all three alike.
    let (mut ours, mut uv_floor, mut pip_floor) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        for step in 0..3 {
            match (round + step) % 3 {
                0 => ours.push(first_install(ctx).await?),
                1 => uv_floor.push(raw_install(&uv, &python).await?),
                _ => pip_floor.push(raw_pip(&python).await?),
            }
        }
    }
    rows.push(Row {
        name: "packages_first".into(),
        title: format!(
            "run-code with packages [{PACKAGE}] (its dependencies too), empty package cache, \
             against pip install of the same into a fresh venv with an empty pip cache"
        ),
        measurement: Measurement::against(ours.clone(), "pip install, fresh venv", pip_floor),
    });
    rows.push(Row {
        name: "packages_first_uv".into(),
        title: format!(
            "run-code with packages [{PACKAGE}] (its dependencies too), empty package cache, \
             against uv pip install of the same into an empty target and cache"
        ),
        measurement: Measurement::against(ours, "uv pip install, empty cache", uv_floor),
    });
    // The second session: the cache has them.
    let cache = Scratch::new("second")?;
    let server = server_with_empty_cache(ctx, &cache).await?;
    let second = async {
        let mut out = vec![second_session(ctx, &server, Second::PYTHON).await?];
        if node_here(ctx).await {
            out.push(second_session(ctx, &server, Second::JAVASCRIPT).await?);
        }
        Ok::<_, anyhow::Error>(out)
    }
    .await;
    server.stop().await;
    rows.extend(second?);
    Ok(rows)
}

/// What a second-session row starts and runs.
struct Second {
    row: &'static str,
    language: &'static str,
    package: &'static str,
    /// A first cell that uses the package, and one that does not.
    uses: &'static str,
    plain: &'static str,
}

impl Second {
    const PYTHON: Self = Self {
        row: "packages_cached",
        language: "python",
        package: PACKAGE,
        uses: IMPORT,
        plain: "print('ok')",
    };
    /// is-odd and its dependency (is-number): the set's shared layer (its `node_modules/`
    /// on NODE_PATH), no npm run.
    const JAVASCRIPT: Self = Self {
        row: "packages_cached_js",
        language: "javascript",
        package: "is-odd@3",
        uses: "console.log(require('is-odd')(3) ? 'ok' : 'no')",
        plain: "console.log('ok')",
    };
}

/// Whether javascript sessions can be driven here (noted once when not).
async fn node_here(ctx: &Ctx) -> bool {
    match super::installed(ctx, true, false).await {
        Ok(langs) => langs.iter().any(|l| l.id == "javascript"),
        Err(_) => false,
    }
}

/// The second session with `s.package` (the cache filled untimed first) against one
/// without packages, each with the same first cell.
async fn second_session(ctx: &Ctx, server: &McpServer, s: Second) -> Result<Row> {
    // Untimed: the cache filled, detection and page cache warm.
    session(server, s.language, &[s.package], s.uses, false).await?;
    session(server, s.language, &[], s.plain, false).await?;
    let installs = std::cell::RefCell::new(Vec::new());
    let (ours, floor) = alternate(
        ctx.slow_rounds(),
        || async {
            let (t, install) = session(server, s.language, &[s.package], s.plain, true).await?;
            installs.borrow_mut().push(install as f64);
            Ok(t)
        },
        || async { Ok(session(server, s.language, &[], s.plain, true).await?.0) },
    )
    .await?;
    let mut installs = installs.into_inner();
    installs.sort_by(f64::total_cmp);
    let extra = median(&ours).as_secs_f64() * 1000.0 - median(&floor).as_secs_f64() * 1000.0;
    Ok(Row {
        name: s.row.into(),
        title: format!(
            "{} session_start with packages [{}] (in the cache) + a first cell, against \
             session_start without packages + the same cell (goal: at most 100 ms more)",
            s.language, s.package
        ),
        measurement: Measurement::against(ours, "the same without packages", floor)
            .metric("extra_ms_median", extra.round())
            .metric(
                "install_ms_median",
                installs.get(installs.len() / 2).copied().unwrap_or(0.0),
            ),
    })
}

fn median(v: &[Duration]) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    s.get(s.len() / 2).copied().unwrap_or_default()
}
