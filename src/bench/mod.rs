//! `replbox bench`: measure this binary, on this machine, against the floor of what it does.
//!
//! A bench is a list of [`SECTIONS`]. Each one has a name (what `--only` takes) and a
//! measurement that returns its samples, plus the samples of a floor to compare with when
//! there is one (for `run-code`, spawning the same interpreter directly). [`run`] runs the
//! chosen sections and turns the samples into a [`Report`]; [`print_table`] prints it.
//!
//! To add a section: write an `async fn(&Ctx) -> Result<Measurement>` and list it in
//! [`SECTIONS`]. [`McpServer`] starts a stdio MCP server (replbox or a peer) and times tool
//! calls; [`alternate`] interleaves our measurement with its floor so that machine noise
//! hits both alike.

mod client;
mod report;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use crate::config::Config;
use crate::exec::env as cenv;
use crate::lang::Registry;

pub use client::McpServer;
pub use report::{FloorReport, Report, SectionReport, Series, Stats, print_table};

/// `replbox bench` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Measured repetitions per section (after a short warm-up).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub iterations: u32,
    /// Print the numbers as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Run only these sections (comma-separated).
    #[arg(
        long,
        value_name = "SECTION",
        value_delimiter = ',',
        value_parser = clap::builder::PossibleValuesParser::new(SECTIONS.iter().map(|s| s.name))
    )]
    pub only: Vec<String>,
    /// Settings for the server the bench starts.
    #[command(flatten)]
    pub config: Config,
}

/// What a section measured: its samples and, if it has one, its floor's.
pub struct Measurement {
    pub samples: Vec<Duration>,
    pub floor: Option<Floor>,
}

pub struct Floor {
    /// What was run as the floor, for the report.
    pub what: String,
    pub samples: Vec<Duration>,
}

type Measure = for<'a> fn(&'a Ctx) -> Pin<Box<dyn Future<Output = Result<Measurement>> + 'a>>;

/// One named measurement.
pub struct Section {
    /// What `--only` takes and the report's key.
    pub name: &'static str,
    pub title: &'static str,
    measure: Measure,
}

/// Every section, in the order they run.
pub const SECTIONS: &[Section] = &[
    Section {
        name: "run_code",
        title: "run-code python print(1+1), end to end through MCP",
        measure: |ctx| Box::pin(run_code(ctx)),
    },
    Section {
        name: "initialize",
        title: "server start -> first initialize reply",
        measure: |ctx| Box::pin(initialize(ctx)),
    },
];

/// What every section gets.
pub struct Ctx {
    pub iterations: usize,
    pub config: Config,
    /// This binary: the server measured is the one running the bench.
    pub exe: PathBuf,
}

impl Ctx {
    /// `replbox serve` with the bench's settings.
    pub fn serve_command(&self) -> Command {
        let mut cmd = Command::new(&self.exe);
        cmd.arg("serve").args(self.config.to_args());
        cmd
    }
}

/// Run the chosen sections (all when `--only` is not given).
pub async fn run(args: BenchArgs) -> Result<Report> {
    let exe = std::env::current_exe().context("cannot find the replbox executable")?;
    let ctx = Ctx {
        iterations: args.iterations as usize,
        config: args.config,
        exe,
    };
    let mut sections = Vec::new();
    for section in SECTIONS {
        if !args.only.is_empty() && !args.only.iter().any(|n| n == section.name) {
            continue;
        }
        let m = (section.measure)(&ctx)
            .await
            .with_context(|| format!("bench section {}", section.name))?;
        let no_samples = || anyhow::anyhow!("bench section {} took no samples", section.name);
        let ours = Series::new(&m.samples).ok_or_else(no_samples)?;
        let floor = match m.floor {
            Some(f) => Some(FloorReport {
                what: f.what,
                series: Series::new(&f.samples).ok_or_else(no_samples)?,
            }),
            None => None,
        };
        sections.push(SectionReport::new(section.name, section.title, ours, floor));
    }
    Ok(Report {
        replbox_version: env!("CARGO_PKG_VERSION"),
        build: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        iterations: ctx.iterations,
        sections,
    })
}

/// Time `ours` and `floor` once per round for `rounds` rounds, swapping which goes first
/// every round so that drift and noise fall on both alike.
pub async fn alternate<A, B, FA, FB>(
    rounds: usize,
    mut ours: A,
    mut floor: B,
) -> Result<(Vec<Duration>, Vec<Duration>)>
where
    A: FnMut() -> FA,
    B: FnMut() -> FB,
    FA: Future<Output = Result<Duration>>,
    FB: Future<Output = Result<Duration>>,
{
    let mut a = Vec::with_capacity(rounds);
    let mut b = Vec::with_capacity(rounds);
    for round in 0..rounds {
        if round % 2 == 0 {
            a.push(ours().await?);
            b.push(floor().await?);
        } else {
            b.push(floor().await?);
            a.push(ours().await?);
        }
    }
    Ok((a, b))
}

/// Untimed calls before measuring: language detection, page cache, first-call paths.
const WARMUP: usize = 3;

/// `run-code` python `print(1+1)` through MCP, against spawning the same interpreter.
async fn run_code(ctx: &Ctx) -> Result<Measurement> {
    let python = Interpreter::resolve(&ctx.config, "python").await?;
    let server = McpServer::start(ctx.serve_command()).await?;
    let measured = async {
        let args = json!({"languageId": "python", "code": "print(1+1)"});
        let args = args.as_object().cloned().unwrap_or_default();
        let floor_dir = tempfile::tempdir().context("cannot create a directory for the floor")?;
        let floor_args = ["-c", "print(1+1)"];
        let ours = || server.call_expecting("run-code", &args, "2\n");
        let floor = || python.time_run(&floor_args, floor_dir.path(), "2\n");
        for _ in 0..WARMUP {
            ours().await?;
            floor().await?;
        }
        if !server.wait_idle(Duration::from_secs(30)).await {
            tracing::warn!("the server still has child processes; measuring anyway");
        }
        let (samples, floor_samples) = alternate(ctx.iterations, ours, floor).await?;
        Ok(Measurement {
            samples,
            floor: Some(Floor {
                what: format!("{} -c 'print(1+1)' spawned directly", python.exe.display()),
                samples: floor_samples,
            }),
        })
    }
    .await;
    server.stop().await;
    measured
}

/// An interpreter found exactly as the server finds it (its language file's `programs`,
/// then its `resolve` probe, so shims such as pyenv's are skipped the same way).
pub struct Interpreter {
    pub exe: PathBuf,
}

impl Interpreter {
    pub async fn resolve(config: &Config, language: &str) -> Result<Self> {
        let registry = Registry::load(config.prompts.as_deref())?;
        let lang = registry.get(language)?;
        let detected = lang
            .detect()
            .await
            .with_context(|| format!("{language} is not installed"))?;
        Ok(Self {
            exe: detected.exe.clone(),
        })
    }

    /// Spawn the interpreter directly with `args`, in `dir`, with the base environment the
    /// server gives its children (and nothing else), wait for it and check its stdout.
    pub async fn time_run(&self, args: &[&str], dir: &Path, expected: &str) -> Result<Duration> {
        let mut cmd = Command::new(&self.exe);
        cmd.args(args)
            .env_clear()
            .envs(cenv::base_env(dir, "dumb"))
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let started = Instant::now();
        let out = tokio::time::timeout(client::CALL_TIMEOUT, cmd.output()).await;
        let elapsed = started.elapsed();
        let out = out
            .with_context(|| {
                format!(
                    "{} took over {:?}",
                    self.exe.display(),
                    client::CALL_TIMEOUT
                )
            })?
            .with_context(|| format!("cannot run {}", self.exe.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || stdout != expected {
            bail!(
                "{} {args:?} printed {stdout:?} ({}; stderr {:?}), expected {expected:?}",
                self.exe.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(elapsed)
    }
}

/// The `initialize` request a client sends first.
const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"replbox-bench","version":"0"}}}"#;

/// Server start to the first `initialize` reply, one fresh server per sample.
async fn initialize(ctx: &Ctx) -> Result<Measurement> {
    // One untimed start so the first sample does not pay for a cold page cache.
    time_initialize(ctx).await?;
    let mut samples = Vec::with_capacity(ctx.iterations);
    for _ in 0..ctx.iterations {
        samples.push(time_initialize(ctx).await?);
    }
    Ok(Measurement {
        samples,
        floor: None,
    })
}

/// Start `replbox serve`, write `initialize` on its stdin and time until the reply line is
/// read from its stdout; then close its stdin and wait for it to exit.
async fn time_initialize(ctx: &Ctx) -> Result<Duration> {
    let mut cmd = ctx.serve_command();
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {} serve", ctx.exe.display()))?;
    let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        bail!("the server's stdin or stdout is not a pipe");
    };
    let mut line = String::with_capacity(INITIALIZE.len() + 1);
    line.push_str(INITIALIZE);
    line.push('\n');
    stdin
        .write_all(line.as_bytes())
        .await
        .context("cannot write initialize to the server")?;
    let mut lines = BufReader::new(stdout).lines();
    let reply = tokio::time::timeout(client::CALL_TIMEOUT, lines.next_line()).await;
    let elapsed = started.elapsed();
    let reply = reply
        .context("no initialize reply in time")?
        .context("cannot read the server's stdout")?
        .context("the server closed stdout without replying to initialize")?;
    let v: Value = serde_json::from_str(&reply)
        .with_context(|| format!("the initialize reply is not JSON: {reply}"))?;
    if v["id"] != 1 || v["result"]["serverInfo"]["name"] != "replbox" {
        bail!("unexpected initialize reply: {reply}");
    }
    // EOF ends the server cleanly (and it stops the probes it started); kill it if not.
    drop(stdin);
    if tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .is_err()
    {
        child.kill().await.context("cannot kill the server")?;
    }
    Ok(elapsed)
}
