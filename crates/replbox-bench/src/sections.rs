//! The sections of the bench and how they run.
//!
//! A bench is a list of [`SECTIONS`]. Each one has a name (what `--only` takes) and a
//! measurement that returns one or more rows (one per language where that applies), each
//! with its samples, the samples of a floor to compare with when there is one (for
//! `run-code`, spawning the same interpreter directly), and named figures (memory, counts).
//! [`run`] runs the chosen sections and turns the rows into a [`Report`], which also judges
//! the performance targets; [`report::print_table`] prints it.
//!
//! Every server measured is the `replbox` binary ([`Ctx::server`]) started as `replbox
//! serve` and driven through MCP, as a client drives it.
//!
//! To add a section: write an `async fn(&Ctx) -> Result<Vec<Row>>` and list it in
//! [`SECTIONS`]. [`McpServer`] starts a stdio MCP server (replbox or a peer) and times tool
//! calls; [`alternate`] interleaves our measurement with its floor so that machine noise
//! hits both alike; [`McpServer::wait_quiet`] waits until the server's children (a warm
//! pool refilling) use no CPU, so that they do not compete with a sample.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use replbox::api::{Config, Mode, Registry};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use crate::client::{self, Handle, McpServer, ProcStats};
use crate::floor::{Interpreter, RawRepl};
use crate::langs::{LANGS, Lang};
use crate::report::{self, FloorReport, Machine, Report, SectionReport, Series, Stats};
use crate::server::Server;

mod cluster_cost;
mod code_mode;
mod failover;
mod flood;
mod model_bytes;
mod packages;
mod session_pool;

/// `replbox-bench` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// The replbox binary to measure (default: `replbox` beside this program, else
    /// target/release/replbox).
    #[arg(long, value_name = "PATH")]
    pub server: Option<PathBuf>,
    /// Measured repetitions per section (after a short warm-up). Sections whose samples
    /// take a second or more take at most 10.
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
    /// Idle sessions opened to measure the server's memory per session.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub idle_sessions: u32,
    /// Evaluations of the soak section...
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub soak_evals: u32,
    /// ...spread over this many sessions.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub soak_sessions: u32,
    /// Do not install and measure mcp-server-code-runner (by default it is when `npx` is
    /// on PATH; installing it needs the npm registry).
    #[arg(long)]
    pub no_peer: bool,
    /// Settings for the server the bench starts.
    #[command(flatten)]
    pub config: Config,
}

/// What one row measured: its samples, its floor's if it has one, and other figures.
pub struct Measurement {
    pub samples: Vec<Duration>,
    pub floor: Option<Floor>,
    /// Named figures beside the times (memory, counts), for the report and the targets.
    pub metrics: BTreeMap<String, f64>,
}

impl Measurement {
    pub fn new(samples: Vec<Duration>, floor: Option<Floor>) -> Self {
        Self {
            samples,
            floor,
            metrics: BTreeMap::new(),
        }
    }

    /// Samples compared with those of a floor, `what` saying what the floor ran.
    pub fn against(samples: Vec<Duration>, what: impl Into<String>, floor: Vec<Duration>) -> Self {
        Self::new(
            samples,
            Some(Floor {
                what: what.into(),
                samples: floor,
            }),
        )
    }

    pub fn metric(mut self, name: &str, value: f64) -> Self {
        self.metrics.insert(name.to_string(), value);
        self
    }
}

pub struct Floor {
    /// What was run as the floor, for the report.
    pub what: String,
    pub samples: Vec<Duration>,
}

/// One line of the report.
pub struct Row {
    /// `section` or `section:language`.
    pub name: String,
    pub title: String,
    pub measurement: Measurement,
}

type Measure = for<'a> fn(&'a Ctx) -> Pin<Box<dyn Future<Output = Result<Vec<Row>>> + 'a>>;

/// One named measurement.
pub struct Section {
    /// What `--only` takes and the report's key.
    pub name: &'static str,
    measure: Measure,
}

/// Every section, in the order they run.
pub const SECTIONS: &[Section] = &[
    Section {
        name: "initialize",
        measure: |ctx| Box::pin(initialize(ctx)),
    },
    Section {
        name: "run_code",
        measure: |ctx| Box::pin(run_code(ctx)),
    },
    Section {
        name: "run_code_cold",
        measure: |ctx| Box::pin(run_code_cold(ctx)),
    },
    Section {
        name: "run_code_back_to_back",
        measure: |ctx| Box::pin(run_code_back_to_back(ctx)),
    },
    Section {
        name: "session_eval",
        measure: |ctx| Box::pin(session_eval(ctx)),
    },
    Section {
        name: "eval_overhead",
        measure: |ctx| Box::pin(eval_overhead(ctx)),
    },
    Section {
        name: "ghci_cells",
        measure: |ctx| Box::pin(ghci_cells(ctx)),
    },
    Section {
        name: "sandbox",
        measure: |ctx| Box::pin(sandbox_levels(ctx)),
    },
    Section {
        name: "session_pool",
        measure: |ctx| Box::pin(session_pool::session_pool(ctx)),
    },
    Section {
        name: "packages",
        measure: |ctx| Box::pin(packages::packages(ctx)),
    },
    Section {
        name: "sessions_sleep",
        measure: |ctx| Box::pin(sessions_sleep(ctx)),
    },
    Section {
        name: "concurrent_run_code",
        measure: |ctx| Box::pin(concurrent_run_code(ctx)),
    },
    Section {
        name: "big_output",
        measure: |ctx| Box::pin(big_output(ctx)),
    },
    Section {
        name: "model_bytes",
        measure: |ctx| Box::pin(model_bytes::model_bytes(ctx)),
    },
    Section {
        name: "render_flood",
        measure: |ctx| Box::pin(flood::render_flood(ctx)),
    },
    Section {
        name: "idle_memory",
        measure: |ctx| Box::pin(idle_memory(ctx)),
    },
    Section {
        name: "soak",
        measure: |ctx| Box::pin(soak(ctx)),
    },
    Section {
        name: "code_mode",
        measure: |ctx| Box::pin(code_mode::code_mode(ctx)),
    },
    Section {
        name: "cluster",
        measure: |ctx| Box::pin(cluster_cost::cluster_cost(ctx)),
    },
    Section {
        name: "failover",
        measure: |ctx| Box::pin(failover::failover(ctx)),
    },
    Section {
        name: "peer",
        measure: |ctx| Box::pin(peer(ctx)),
    },
];

/// What every section gets.
pub struct Ctx {
    pub iterations: usize,
    pub config: Config,
    pub args: BenchArgs,
    /// The `replbox` binary measured.
    pub server: PathBuf,
    /// Things the report should say (a section skipped, and why).
    pub notes: Mutex<Vec<String>>,
}

impl Ctx {
    /// `replbox serve` with the bench's settings.
    pub fn serve_command(&self) -> Command {
        self.serve_with(&self.config)
    }

    /// `replbox serve` with other settings.
    pub fn serve_with(&self, config: &Config) -> Command {
        let mut cmd = Command::new(&self.server);
        cmd.arg("serve").args(config.to_args());
        cmd
    }

    /// The bench's settings without warm pools (for sections about sessions, where a pool
    /// refilling would only add noise, and whose session starts are cold ones).
    fn without_pool(&self) -> Config {
        let mut c = self.config.clone();
        c.pool = 0;
        c.session_pool = 0;
        c
    }

    /// Samples for a section whose samples take a second or more.
    fn slow_rounds(&self) -> usize {
        self.iterations.min(10)
    }

    fn note(&self, text: String) {
        tracing::warn!("{text}");
        if let Ok(mut n) = self.notes.lock() {
            n.push(text);
        }
    }

    fn note_once(&self, text: String) {
        let seen = self.notes.lock().is_ok_and(|n| n.contains(&text));
        if !seen {
            self.note(text);
        }
    }
}

/// Run the chosen sections (all when `--only` is not given).
pub async fn run(args: BenchArgs) -> Result<Report> {
    let server = Server::find(args.server.as_deref()).await?;
    let ctx = Ctx {
        iterations: args.iterations as usize,
        config: args.config.clone(),
        args: args.clone(),
        server: server.path.clone(),
        notes: Mutex::new(Vec::new()),
    };
    let load_before = report::load_average();
    let started = Instant::now();
    let mut sections = Vec::new();
    for section in SECTIONS {
        if !args.only.is_empty() && !args.only.iter().any(|n| n == section.name) {
            continue;
        }
        let rows = (section.measure)(&ctx)
            .await
            .with_context(|| format!("bench section {}", section.name))?;
        for row in rows {
            let no_samples = || anyhow::anyhow!("bench row {} took no samples", row.name);
            let m = row.measurement;
            let ours = Series::new(&m.samples).ok_or_else(no_samples)?;
            let floor = match m.floor {
                Some(f) => Some(FloorReport {
                    what: f.what,
                    series: Series::new(&f.samples).ok_or_else(no_samples)?,
                }),
                None => None,
            };
            sections.push(SectionReport::new(
                row.name, row.title, ours, floor, m.metrics,
            ));
        }
    }
    let interpreters = interpreters(&ctx.config).await;
    let notes = ctx.notes.lock().map(|n| n.clone()).unwrap_or_default();
    let targets = report::targets(&sections);
    Ok(Report {
        replbox_version: server.version,
        build: server.build,
        iterations: ctx.iterations,
        machine: Machine {
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            load_before,
            load_after: report::load_average(),
            seconds: started.elapsed().as_secs(),
            pool: ctx.config.pool,
            server: server.path.display().to_string(),
            helper: server.helper.display().to_string(),
            interpreters,
        },
        sections,
        targets,
        notes,
    })
}

/// The interpreters of the languages the bench drives, as the server finds them.
async fn interpreters(config: &Config) -> Vec<String> {
    let mut out = Vec::new();
    for l in LANGS {
        if let Ok(i) = Interpreter::resolve(config, l.id).await {
            out.push(format!("{} {} ({})", l.id, i.version, i.exe.display()));
        }
    }
    out
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

/// A sample at least this long makes a row take [`Ctx::slow_rounds`] samples.
const SLOW: Duration = Duration::from_millis(500);

/// Longest wait for the server's children to calm down before a sample.
const QUIET: Duration = Duration::from_secs(20);

/// The bench languages installed here (with a REPL when `need_session`, with a warm pool
/// when `need_pool`); the ones not installed are noted once.
async fn installed(ctx: &Ctx, need_session: bool, need_pool: bool) -> Result<Vec<&'static Lang>> {
    let registry = Registry::load(ctx.config.prompts.as_deref())?;
    let mut out = Vec::new();
    for l in LANGS {
        let lang = registry.get(l.id)?;
        if (need_session && !lang.has_session()) || (need_pool && lang.spec.run.pool.is_none()) {
            continue;
        }
        let usable = match lang.detect().await {
            None => Err(format!("{} is not installed", l.id)),
            Some(d) if need_session => lang.session_exe(d).map(|_| ()).map_err(|e| e.to_string()),
            Some(_) => Ok(()),
        };
        match usable {
            Ok(()) => out.push(l),
            Err(e) => ctx.note_once(format!("{}: skipped ({e})", l.id)),
        }
    }
    Ok(out)
}

/// Whether python can be driven (run-code and sessions), noting it once when not.
async fn python_here(ctx: &Ctx) -> Result<bool> {
    Ok(installed(ctx, true, false)
        .await?
        .iter()
        .any(|l| l.id == "python"))
}

fn args_of(v: Value) -> rmcp::model::JsonObject {
    match v {
        Value::Object(o) => o,
        _ => Default::default(),
    }
}

/// `run-code` printing 2 per session language, through MCP, against spawning the same
/// interpreter directly; with the bench's settings (the warm pool on by default).
async fn run_code(ctx: &Ctx) -> Result<Vec<Row>> {
    run_code_rows(
        ctx,
        &ctx.config,
        "run_code",
        "run-code print(1+1), end to end through MCP",
        false,
    )
    .await
}

/// The same with `--pool 0`, for the languages that have a pool: what a cold start costs.
async fn run_code_cold(ctx: &Ctx) -> Result<Vec<Row>> {
    run_code_rows(
        ctx,
        &ctx.without_pool(),
        "run_code_cold",
        "run-code print(1+1) with --pool 0 (cold start)",
        true,
    )
    .await
}

async fn run_code_rows(
    ctx: &Ctx,
    config: &Config,
    section: &str,
    title: &str,
    pooled_only: bool,
) -> Result<Vec<Row>> {
    let langs = installed(ctx, false, pooled_only).await?;
    if langs.is_empty() {
        return Ok(Vec::new());
    }
    let server = McpServer::start(ctx.serve_with(config)).await?;
    let measured = async {
        let mut rows = Vec::new();
        for l in langs {
            let interp = Interpreter::resolve(&ctx.config, l.id).await?;
            let args = args_of(json!({"languageId": l.id, "code": l.program}));
            let floor_dir =
                tempfile::tempdir().context("cannot create a directory for the floor")?;
            if let Some((name, text)) = l.floor_file {
                std::fs::write(floor_dir.path().join(name), text)
                    .context("cannot write the floor's program")?;
            }
            let ours = || async {
                server.wait_quiet(QUIET).await;
                server.call_expecting("run-code", &args, "2\n").await
            };
            let floor = || async {
                server.wait_quiet(QUIET).await;
                interp.time_run(l.floor_args, floor_dir.path(), "2\n").await
            };
            let mut warm = Duration::ZERO;
            for _ in 0..WARMUP {
                warm = warm.max(ours().await?);
                floor().await?;
            }
            // Languages that compile first (runghc) take a second or more per sample.
            let rounds = if warm >= SLOW {
                ctx.slow_rounds()
            } else {
                ctx.iterations
            };
            let (samples, floor_samples) = alternate(rounds, ours, floor).await?;
            rows.push(Row {
                name: format!("{section}:{}", l.id),
                title: format!("{title} ({})", l.id),
                measurement: Measurement::against(
                    samples,
                    format!(
                        "{} {} spawned directly",
                        interp.exe.display(),
                        l.floor_args.join(" ")
                    ),
                    floor_samples,
                ),
            });
        }
        Ok(rows)
    }
    .await;
    server.stop().await;
    measured
}

/// Calls of one back-to-back burst.
const BURST: usize = 50;

/// `run-code` printing 2, [`BURST`] calls one right after the other (no pause for the pool
/// to refill), per language with a warm pool, with the bench's settings. A first burst lets
/// the pools grow to what such use makes them (up to `--pool`); the measured bursts follow
/// once the server is quiet again. Each row's floor is the interpreter spawned directly,
/// once per call, between bursts.
async fn run_code_back_to_back(ctx: &Ctx) -> Result<Vec<Row>> {
    let langs = installed(ctx, false, true).await?;
    if langs.is_empty() {
        return Ok(Vec::new());
    }
    let server = McpServer::start(ctx.serve_command()).await?;
    let measured = async {
        let mut rows = Vec::new();
        let bursts = ctx.iterations.div_ceil(BURST).max(1);
        for l in langs {
            let interp = Interpreter::resolve(&ctx.config, l.id).await?;
            let args = args_of(json!({"languageId": l.id, "code": l.program}));
            let floor_dir =
                tempfile::tempdir().context("cannot create a directory for the floor")?;
            if let Some((name, text)) = l.floor_file {
                std::fs::write(floor_dir.path().join(name), text)
                    .context("cannot write the floor's program")?;
            }
            let mut samples = Vec::new();
            let mut floor_samples = Vec::new();
            for burst in 0..=bursts {
                server.wait_quiet(QUIET).await;
                let mut these = Vec::with_capacity(BURST);
                for _ in 0..BURST {
                    these.push(server.call_expecting("run-code", &args, "2\n").await?);
                }
                // The first burst is the warm-up.
                if burst > 0 {
                    samples.extend(these);
                    server.wait_quiet(QUIET).await;
                    for _ in 0..BURST.min(ctx.iterations) {
                        floor_samples
                            .push(interp.time_run(l.floor_args, floor_dir.path(), "2\n").await?);
                    }
                }
            }
            rows.push(Row {
                name: format!("run_code_back_to_back:{}", l.id),
                title: format!(
                    "run-code print(1+1), {BURST} calls back to back, pool grown by a first burst ({})",
                    l.id
                ),
                measurement: Measurement::against(
                    samples,
                    format!(
                        "{} {} spawned directly",
                        interp.exe.display(),
                        l.floor_args.join(" ")
                    ),
                    floor_samples,
                ),
            });
        }
        Ok(rows)
    }
    .await;
    server.stop().await;
    measured
}

/// The `initialize` request a client sends first.
const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"replbox-bench","version":"0"}}}"#;

/// Server start to the first `initialize` reply, one fresh server per sample.
async fn initialize(ctx: &Ctx) -> Result<Vec<Row>> {
    // One untimed start so the first sample does not pay for a cold page cache.
    time_initialize(ctx.serve_command(), Some("replbox")).await?;
    let mut samples = Vec::with_capacity(ctx.iterations);
    for _ in 0..ctx.iterations {
        samples.push(time_initialize(ctx.serve_command(), Some("replbox")).await?);
    }
    Ok(vec![Row {
        name: "initialize".into(),
        title: "server start -> first initialize reply".into(),
        measurement: Measurement::new(samples, None),
    }])
}

/// Start a stdio MCP server, write `initialize` on its stdin and time until the reply is
/// read from its stdout (lines that are not JSON-RPC, which some servers print, are
/// skipped); then close its stdin and wait for it to exit. With `name`, the reply must be
/// that server's.
async fn time_initialize(mut cmd: Command, name: Option<&str>) -> Result<Duration> {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let program = cmd.as_std().get_program().to_string_lossy().into_owned();
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {program}"))?;
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
    let reply = tokio::time::timeout(client::CALL_TIMEOUT, async {
        loop {
            let Some(l) = lines.next_line().await? else {
                return Ok::<_, std::io::Error>(None);
            };
            if let Ok(v) = serde_json::from_str::<Value>(&l)
                && v["id"] == 1
            {
                return Ok(Some(v));
            }
        }
    })
    .await;
    let elapsed = started.elapsed();
    let reply = reply
        .context("no initialize reply in time")?
        .context("cannot read the server's stdout")?
        .context("the server closed stdout without replying to initialize")?;
    if reply["result"]["serverInfo"].is_null()
        || name.is_some_and(|n| reply["result"]["serverInfo"]["name"] != n)
    {
        bail!("unexpected initialize reply: {reply}");
    }
    // EOF ends the server cleanly (and it stops what it started); kill it if not.
    drop(stdin);
    if tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .is_err()
    {
        child.kill().await.context("cannot kill the server")?;
    }
    Ok(elapsed)
}

/// Start a session and return its id.
async fn start_session(server: &McpServer, language: &str) -> Result<String> {
    let (_, _, structured) = server
        .call_ok("session_start", json!({"language": language}))
        .await?;
    structured["session_id"]
        .as_str()
        .map(str::to_string)
        .context("session_start returned no session_id")
}

async fn close_session(server: &McpServer, id: &str) {
    let _ = server
        .call_ok("session_close", json!({"session_id": id}))
        .await;
}

/// Evaluate and check the text exactly.
async fn eval_expecting(h: &Handle, id: &str, code: &str, expected: &str) -> Result<Duration> {
    let (t, text) = h
        .call_text("session_eval", json!({"session_id": id, "code": code}))
        .await?;
    if text != expected {
        bail!("session_eval {code:?} returned {text:?}, expected {expected:?}");
    }
    Ok(t)
}

/// `session_eval` of `1+1` per session language, against the interpreter's own REPL behind
/// a PTY driven directly (type the line, read the answer and the next prompt).
async fn session_eval(ctx: &Ctx) -> Result<Vec<Row>> {
    let langs = installed(ctx, true, false).await?;
    if langs.is_empty() {
        return Ok(Vec::new());
    }
    let server = McpServer::start(ctx.serve_with(&ctx.without_pool())).await?;
    let measured = async {
        let mut rows = Vec::new();
        for l in langs {
            let raw_spec = &l.raw;
            let interp = Interpreter::resolve_session(&ctx.config, l.id).await?;
            let id = start_session(&server, l.id).await?;
            let mut raw = RawRepl::start(&interp, raw_spec).await?;
            let h = server.handle();
            let result = async {
                for _ in 0..WARMUP {
                    eval_expecting(&h, &id, l.expr, l.answer).await?;
                    raw.round_trip(l.expr, l.raw.answer).await?;
                }
                server.wait_quiet(QUIET).await;
                let raw = std::sync::Arc::new(tokio::sync::Mutex::new(&mut raw));
                let (samples, floor_samples) = alternate(
                    ctx.iterations,
                    || eval_expecting(&h, &id, l.expr, l.answer),
                    || {
                        let raw = raw.clone();
                        async move { raw.lock().await.round_trip(l.expr, l.raw.answer).await }
                    },
                )
                .await?;
                Ok::<_, anyhow::Error>((samples, floor_samples))
            }
            .await;
            raw.stop().await;
            close_session(&server, &id).await;
            let (samples, floor_samples) = result?;
            rows.push(Row {
                name: format!("session_eval:{}", l.id),
                title: format!("session_eval {} ({})", l.expr, l.id),
                measurement: Measurement::against(
                    samples,
                    format!(
                        "{} {} behind a PTY driven directly (raw round trip)",
                        interp.exe.display(),
                        raw_spec.args.join(" ")
                    ),
                    floor_samples,
                ),
            });
        }
        Ok(rows)
    }
    .await;
    server.stop().await;
    measured
}

/// What an evaluation costs besides the interpreter: an empty tool call (`session_list`,
/// the MCP round trip through the server, no floor), and `session_eval` `1+1` (python) in a
/// session whose directory holds 1,000 files (what change tracking costs), against the raw
/// round trip.
async fn eval_overhead(ctx: &Ctx) -> Result<Vec<Row>> {
    let server = McpServer::start(ctx.serve_with(&ctx.without_pool())).await?;
    let measured = async {
        let h = server.handle();
        let mut empty = Vec::with_capacity(ctx.iterations);
        for round in 0..WARMUP + ctx.iterations {
            let (t, _) = h.call_text("session_list", json!({})).await?;
            if round >= WARMUP {
                empty.push(t);
            }
        }
        let mut rows = vec![Row {
            name: "mcp:empty_call".into(),
            title: "an empty tool call (session_list): the MCP round trip".into(),
            measurement: Measurement::new(empty, None),
        }];
        if python_here(ctx).await? {
            rows.push(eval_among_files(ctx, &server).await?);
        }
        Ok::<_, anyhow::Error>(rows)
    }
    .await;
    server.stop().await;
    measured
}

async fn eval_among_files(ctx: &Ctx, server: &McpServer) -> Result<Row> {
    let Some(l) = LANGS.iter().find(|l| l.id == "python") else {
        bail!("python is not in the bench's table");
    };
    let interp = Interpreter::resolve_session(&ctx.config, l.id).await?;
    let id = start_session(server, l.id).await?;
    let mut raw = RawRepl::start(&interp, &l.raw).await?;
    let h = server.handle();
    let result = async {
        let (_, text) = h
            .call_text(
                "session_eval",
                json!({"session_id": id, "code": "import os
for i in range(1000):
    open(f'f{i:04}.txt', 'w').write('x')
len(os.listdir('.'))"}),
            )
            .await?;
        if !text.starts_with("1000") {
            bail!("creating 1,000 files answered {text:?}");
        }
        for _ in 0..WARMUP {
            eval_expecting(&h, &id, l.expr, l.answer).await?;
            raw.round_trip(l.expr, l.raw.answer).await?;
        }
        server.wait_quiet(QUIET).await;
        let raw = std::sync::Arc::new(tokio::sync::Mutex::new(&mut raw));
        alternate(
            ctx.iterations,
            || eval_expecting(&h, &id, l.expr, l.answer),
            || {
                let raw = raw.clone();
                async move { raw.lock().await.round_trip(l.expr, l.raw.answer).await }
            },
        )
        .await
    }
    .await;
    raw.stop().await;
    close_session(server, &id).await;
    let (samples, floor) = result?;
    Ok(Row {
        name: "session_eval_files:python".into(),
        title: "session_eval 1+1 (python) with 1,000 files in the session's directory".into(),
        measurement: Measurement::against(
            samples,
            format!(
                "{} {} behind a PTY driven directly (raw round trip)",
                interp.exe.display(),
                l.raw.args.join(" ")
            ),
            floor,
        ),
    })
}

/// Long ghci cells: 300 and 1,000 `let` lines and 10,000 declarations, each followed by an
/// expression, in a fresh session per sample, against ghci itself taking the same lines
/// the same way behind a PTY (typed all at once; the declarations as one `:{ :}` block,
/// which is how the session sends consecutive declarations).
async fn ghci_cells(ctx: &Ctx) -> Result<Vec<Row>> {
    let Some(l) = LANGS.iter().find(|l| l.id == "haskell") else {
        bail!("haskell is not in the bench's table");
    };
    if !installed(ctx, true, false)
        .await?
        .iter()
        .any(|x| x.id == l.id)
    {
        return Ok(Vec::new());
    }
    let interp = Interpreter::resolve_session(&ctx.config, l.id).await?;
    let server = McpServer::start(ctx.serve_with(&ctx.without_pool())).await?;
    let lets = |n: usize| {
        let mut cell: String = (0..n).map(|i| format!("let x{i} = {i} :: Int\n")).collect();
        cell.push_str(&format!("x{} * 1000 + 7\n", n - 1));
        (cell.clone(), cell, format!("{}", (n - 1) * 1000 + 7))
    };
    let decls = |n: usize| {
        let body: String = (0..n).map(|i| format!("f{i} = {i} :: Int\n")).collect();
        let tail = format!("f{} * 1000 + 7\n", n - 1);
        (
            format!("{body}{tail}"),
            format!(":{{\n{body}:}}\n{tail}"),
            format!("{}", (n - 1) * 1000 + 7),
        )
    };
    let cases = [
        ("let300", "300 `let` lines", lets(300), 5),
        ("let1000", "1,000 `let` lines", lets(1000), 5),
        ("decl10000", "10,000 declarations", decls(10_000), 3),
    ];
    let measured = async {
        let mut rows = Vec::new();
        for (name, what, (cell, typed, answer), rounds) in cases {
            let expected = format!("{answer}\n");
            let ours = || async {
                let id = start_session(&server, l.id).await?;
                let r = server
                    .handle()
                    .call_text(
                        "session_eval",
                        json!({"session_id": id, "code": cell, "timeout_ms": 600_000}),
                    )
                    .await;
                close_session(&server, &id).await;
                let (t, text) = r?;
                if text != expected {
                    bail!("ghci cell {name} returned {text:?}, expected {expected:?}");
                }
                Ok(t)
            };
            let floor = || async {
                let mut raw = RawRepl::start(&interp, &l.raw).await?;
                let t = raw.feed(&typed, &answer).await;
                raw.stop().await;
                t
            };
            let (samples, floor_samples) =
                alternate(rounds.min(ctx.iterations), ours, floor).await?;
            rows.push(Row {
                name: format!("ghci_cell:{name}"),
                title: format!("a ghci cell of {what} and an expression (fresh session)"),
                measurement: Measurement::against(
                    samples,
                    format!(
                        "the same lines typed into {} {} behind a PTY",
                        interp.exe.display(),
                        l.raw.args.join(" ")
                    ),
                    floor_samples,
                ),
            });
        }
        Ok::<_, anyhow::Error>(rows)
    }
    .await;
    server.stop().await;
    measured
}

/// What confinement costs: `run-code` python print(1+1) with `--pool 0` (every call starts
/// a confined process) and `session_eval` 1+1, at `landlock` and at `bwrap`, each against
/// the same at `none` on a server started beside it, all with the same python. (As root,
/// `none` and `landlock` cannot use an interpreter only root can reach, such as pyenv's
/// under /root, and pick another from PATH; the others are then given that one first on
/// their PATH.)
async fn sandbox_levels(ctx: &Ctx) -> Result<Vec<Row>> {
    if !python_here(ctx).await? {
        return Ok(Vec::new());
    }
    let serve = |mode: Mode, path: Option<std::ffi::OsString>| {
        let mut c = ctx.without_pool();
        c.sandbox = mode;
        let mut cmd = ctx.serve_with(&c);
        if let Some(p) = path {
            cmd.env("PATH", p);
        }
        McpServer::start(cmd)
    };
    let none = serve(Mode::None, None).await?;
    let measured = async {
        let mut rows = Vec::new();
        let python = python_of(&none).await?;
        let mut dirs = vec![python.parent().map(Path::to_path_buf).unwrap_or_default()];
        dirs.extend(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        ));
        let path = std::env::join_paths(dirs).context("cannot build a PATH")?;
        let none_id = start_session(&none, "python").await?;
        for (mode, level) in [(Mode::Landlock, "landlock"), (Mode::Bwrap, "bwrap")] {
            let server = match serve(mode, Some(path.clone())).await {
                Ok(s) => s,
                Err(e) => {
                    ctx.note(format!(
                        "sandbox {level}: skipped (the level does not work here: {e:#})"
                    ));
                    continue;
                }
            };
            let same = python_of(&server).await;
            if !same.as_ref().is_ok_and(|p| *p == python) {
                server.stop().await;
                bail!(
                    "sandbox {level}: the server runs another python ({same:?}) than at none ({})",
                    python.display()
                );
            }
            let level_rows = sandbox_level_rows(ctx, &none, &none_id, &server, level).await;
            server.stop().await;
            rows.extend(level_rows?);
        }
        close_session(&none, &none_id).await;
        Ok(rows)
    }
    .await;
    none.stop().await;
    measured
}

/// The python a server's `run-code` runs.
async fn python_of(server: &McpServer) -> Result<PathBuf> {
    let (_, text, _) = server
        .call_ok(
            "run-code",
            json!({"languageId": "python", "code": "import sys\nprint(sys.executable)"}),
        )
        .await?;
    Ok(PathBuf::from(text.trim_end()))
}

async fn sandbox_level_rows(
    ctx: &Ctx,
    none: &McpServer,
    none_id: &str,
    server: &McpServer,
    level: &str,
) -> Result<Vec<Row>> {
    let run = json!({"languageId": "python", "code": "print(1+1)"});
    let (_, _, structured) = server.call_ok("run-code", run.clone()).await?;
    if structured["sandbox"] != level {
        bail!(
            "the server asked for {level} reports {}",
            structured["sandbox"]
        );
    }
    let args = args_of(run);
    let ours = || async {
        server.wait_quiet(QUIET).await;
        server.call_expecting("run-code", &args, "2\n").await
    };
    let floor = || async {
        none.wait_quiet(QUIET).await;
        none.call_expecting("run-code", &args, "2\n").await
    };
    for _ in 0..WARMUP {
        ours().await?;
        floor().await?;
    }
    let (run_samples, run_floor) = alternate(ctx.iterations, ours, floor).await?;

    let id = start_session(server, "python").await?;
    let (h, hn) = (server.handle(), none.handle());
    let evals = async {
        for _ in 0..WARMUP {
            eval_expecting(&h, &id, "1+1", "2\n").await?;
            eval_expecting(&hn, none_id, "1+1", "2\n").await?;
        }
        alternate(
            ctx.iterations,
            || eval_expecting(&h, &id, "1+1", "2\n"),
            || eval_expecting(&hn, none_id, "1+1", "2\n"),
        )
        .await
    }
    .await;
    close_session(server, &id).await;
    let (eval_samples, eval_floor) = evals?;
    Ok(vec![
        Row {
            name: format!("sandbox:run_code:{level}"),
            title: format!("run-code python print(1+1), --pool 0, at {level}"),
            measurement: Measurement::against(
                run_samples,
                "the same at --sandbox none, with the same python",
                run_floor,
            ),
        },
        Row {
            name: format!("sandbox:session_eval:{level}"),
            title: format!("session_eval 1+1 (python) at {level}"),
            measurement: Measurement::against(
                eval_samples,
                "the same at --sandbox none, with the same python",
                eval_floor,
            ),
        },
    ])
}

/// Run `calls` at once on one connection; the time until all are back, and how many
/// returned exactly what they should.
async fn all_at_once(
    calls: Vec<(Handle, &'static str, Value, String)>,
) -> Result<(Duration, usize)> {
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for (h, tool, args, expected) in calls {
        set.spawn(async move {
            let (_, text) = h.call_text(tool, args).await?;
            Ok::<_, anyhow::Error>(text == expected)
        });
    }
    let mut right = 0;
    while let Some(done) = set.join_next().await {
        if done.context("a call's task failed")?? {
            right += 1;
        }
    }
    Ok((started.elapsed(), right))
}

/// 4 python sessions each sleeping 1 s at once, against one session sleeping 1 s.
async fn sessions_sleep(ctx: &Ctx) -> Result<Vec<Row>> {
    if !python_here(ctx).await? {
        return Ok(Vec::new());
    }
    let server = McpServer::start(ctx.serve_with(&ctx.without_pool())).await?;
    let mut ids = Vec::new();
    let measured = async {
        for _ in 0..4 {
            ids.push(start_session(&server, "python").await?);
        }
        let h = server.handle();
        let sleep = "import time\ntime.sleep(1)";
        for id in &ids {
            eval_expecting(&h, id, "1+1", "2\n").await?;
        }
        let ours = || {
            let calls = ids
                .iter()
                .map(|id| {
                    (
                        h.clone(),
                        "session_eval",
                        json!({"session_id": id, "code": sleep}),
                        String::new(),
                    )
                })
                .collect();
            async {
                let (t, right) = all_at_once(calls).await?;
                if right != 4 {
                    bail!("{} of 4 sleeping sessions answered wrongly", 4 - right);
                }
                Ok(t)
            }
        };
        let floor = || eval_expecting(&h, &ids[0], sleep, "");
        let (samples, floor_samples) = alternate(ctx.slow_rounds(), ours, floor).await?;
        Ok::<_, anyhow::Error>(Row {
            name: "sessions_sleep".into(),
            title: "4 python sessions each sleeping 1 s, at once".into(),
            measurement: Measurement::against(
                samples,
                "one session sleeping 1 s alone",
                floor_samples,
            ),
        })
    }
    .await;
    for id in &ids {
        close_session(&server, id).await;
    }
    server.stop().await;
    Ok(vec![measured?])
}

/// 8 `run-code` calls at once (python), against one call, with the bench's settings.
async fn concurrent_run_code(ctx: &Ctx) -> Result<Vec<Row>> {
    if !python_here(ctx).await? {
        return Ok(Vec::new());
    }
    const N: usize = 8;
    let server = McpServer::start(ctx.serve_command()).await?;
    let measured = async {
        let h = server.handle();
        let one = args_of(json!({"languageId": "python", "code": "print(1+1)"}));
        let mut least_right = N;
        for _ in 0..WARMUP {
            server.call_expecting("run-code", &one, "2\n").await?;
        }
        let rounds = ctx.iterations.min(20);
        let mut samples = Vec::with_capacity(rounds);
        let mut floor_samples = Vec::with_capacity(rounds);
        for round in 0..rounds {
            let calls: Vec<_> = (0..N)
                .map(|i| {
                    (
                        h.clone(),
                        "run-code",
                        json!({"languageId": "python", "code": format!("import os\nprint({i}, sorted(os.listdir('.')))")}),
                        format!("{i} ['main.py']\n"),
                    )
                })
                .collect();
            let all = async {
                server.wait_quiet(QUIET).await;
                all_at_once(calls).await
            };
            let single = async {
                server.wait_quiet(QUIET).await;
                server.call_expecting("run-code", &one, "2\n").await
            };
            if round % 2 == 0 {
                let (t, right) = all.await?;
                samples.push(t);
                least_right = least_right.min(right);
                floor_samples.push(single.await?);
            } else {
                floor_samples.push(single.await?);
                let (t, right) = all.await?;
                samples.push(t);
                least_right = least_right.min(right);
            }
        }
        // What the machine itself takes to run the same 8 pythons at once, for comparison.
        let interp = Interpreter::resolve(&ctx.config, "python").await?;
        let dirs: Vec<tempfile::TempDir> = (0..N)
            .map(|_| tempfile::tempdir())
            .collect::<std::io::Result<_>>()
            .context("cannot create directories for the direct runs")?;
        let mut direct = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            server.wait_quiet(QUIET).await;
            let started = Instant::now();
            let runs = dirs
                .iter()
                .map(|d| interp.time_run(&["-c", "print(1+1)"], d.path(), "2\n"));
            for r in futures_join(runs).await {
                r?;
            }
            direct.push(started.elapsed());
        }
        let direct_median = Stats::of(&direct).map_or(f64::NAN, |s| s.median_ms);
        Ok::<_, anyhow::Error>(Row {
            name: "concurrent_run_code".into(),
            title: format!("{N} run-code python calls at once (pool {})", ctx.config.pool),
            measurement: Measurement::against(samples, "one run-code python call on the same server", floor_samples)
            .metric("calls", N as f64)
            .metric("least_right", least_right as f64)
            .metric("direct_8_at_once_median_ms", direct_median),
        })
    }
    .await;
    server.stop().await;
    Ok(vec![measured?])
}

/// Await all of `futs` concurrently (on this task), in order.
async fn futures_join<F: Future>(futs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pinned: Vec<Pin<Box<F>>> = futs.map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, slot) in pinned.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *slot = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

/// 200,000 printed lines through run-code and through a session, against python printing
/// them to a pipe directly.
async fn big_output(ctx: &Ctx) -> Result<Vec<Row>> {
    if !python_here(ctx).await? {
        return Ok(Vec::new());
    }
    let interp = Interpreter::resolve(&ctx.config, "python").await?;
    let floor_dir = tempfile::tempdir().context("cannot create a directory for the floor")?;
    let cap = ctx.config.output_cap as f64;
    let server = McpServer::start(ctx.serve_with(&ctx.without_pool())).await?;
    let id = start_session(&server, "python").await;
    let measured = async {
        let id = id?;
        let h = server.handle();
        let floor_args = ["-u", "-c", LINES_PROGRAM];
        let mut rows = Vec::new();
        for via in ["run_code", "session"] {
            let mut largest = 0usize;
            let mut flagged = true;
            let ours = || print_lines(&server, &h, via, &id);
            let mut samples = Vec::new();
            let mut floor_samples = Vec::new();
            for round in 0..ctx.slow_rounds() {
                let floor = interp.time_output(&floor_args, floor_dir.path());
                if round % 2 == 0 {
                    let (t, len, tr) = ours().await?;
                    samples.push(t);
                    largest = largest.max(len);
                    flagged &= tr;
                    floor_samples.push(floor.await?.0);
                } else {
                    floor_samples.push(floor.await?.0);
                    let (t, len, tr) = ours().await?;
                    samples.push(t);
                    largest = largest.max(len);
                    flagged &= tr;
                }
            }
            rows.push(Row {
                name: format!("big_output:{via}"),
                title: format!(
                    "200,000 printed lines (python) through {}",
                    if via == "run_code" {
                        "run-code"
                    } else {
                        "session_eval"
                    }
                ),
                measurement: Measurement::against(
                    samples,
                    format!(
                        "{} -u -c <the same loop>, stdout read from a pipe",
                        interp.exe.display()
                    ),
                    floor_samples,
                )
                .metric("largest_text_bytes", largest as f64)
                .metric("output_cap_bytes", cap)
                .metric("truncation_flagged", if flagged { 1.0 } else { 0.0 }),
            });
        }
        close_session(&server, &id).await;
        Ok(rows)
    }
    .await;
    server.stop().await;
    measured
}

/// One run of the 200,000-line program through run-code or a session: the time, the size
/// of the text returned, and whether it says it was cut.
async fn print_lines(
    server: &McpServer,
    h: &Handle,
    via: &str,
    id: &str,
) -> Result<(Duration, usize, bool)> {
    let (t, text, structured) = if via == "run_code" {
        server
            .call_ok(
                "run-code",
                json!({"languageId": "python", "code": LINES_PROGRAM}),
            )
            .await?
    } else {
        let (t, text) = h
            .call_text(
                "session_eval",
                json!({"session_id": id, "code": LINES_PROGRAM}),
            )
            .await?;
        (t, text, Value::Null)
    };
    if !text.starts_with("0\n1\n") || !text.ends_with("199999\n") {
        bail!("{via}: the output lost its head or tail");
    }
    let truncated =
        structured["truncated"].as_bool().unwrap_or(true) && text.contains("bytes omitted");
    Ok((t, text.len(), truncated))
}

const LINES_PROGRAM: &str = "for i in range(200000):\n    print(i)";

/// The server's resident memory per idle session: RSS with N idle python sessions open
/// minus RSS with none (after one session was opened and closed, so one-time set-up is not
/// counted), over N. The interpreters are other processes and are not counted. The samples
/// are the session starts.
async fn idle_memory(ctx: &Ctx) -> Result<Vec<Row>> {
    if !python_here(ctx).await? {
        return Ok(Vec::new());
    }
    let n = ctx.args.idle_sessions as usize;
    let mut config = ctx.without_pool();
    config.max_sessions = n + 4;
    config.max_sessions_per_principal = 0;
    config.max_active_per_principal = 0;
    let server = McpServer::start(ctx.serve_with(&config)).await?;
    let pid = server.pid().context("the server has no pid")?;
    let mut ids = Vec::new();
    let measured = async {
        let h = server.handle();
        for _ in 0..2 {
            let id = start_session(&server, "python").await?;
            eval_expecting(&h, &id, "1+1", "2\n").await?;
            close_session(&server, &id).await;
        }
        server.wait_quiet(QUIET).await;
        let before = settled_stats(pid).await?;
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            ids.push(start_session(&server, "python").await?);
            samples.push(t.elapsed());
        }
        server.wait_quiet(QUIET).await;
        let open = settled_stats(pid).await?;
        for id in ids.drain(..) {
            close_session(&server, &id).await;
        }
        server.wait_quiet(QUIET).await;
        let closed = settled_stats(pid).await?;
        let per = (open.rss_kib as f64 - before.rss_kib as f64) / n as f64;
        Ok::<_, anyhow::Error>(Row {
            name: "idle_memory".into(),
            title: format!("server RSS per idle python session, {n} open (samples: session_start)"),
            measurement: Measurement::new(samples, None)
                .metric("sessions", n as f64)
                .metric("rss_kib_before", before.rss_kib as f64)
                .metric("rss_kib_open", open.rss_kib as f64)
                .metric("rss_kib_closed", closed.rss_kib as f64)
                .metric("per_session_kib", (per * 10.0).round() / 10.0)
                .metric("fds_before", before.fds as f64)
                .metric("fds_open", open.fds as f64)
                .metric("fds_closed", closed.fds as f64)
                .metric("threads_before", before.threads as f64)
                .metric("threads_open", open.threads as f64),
        })
    }
    .await;
    for id in &ids {
        close_session(&server, id).await;
    }
    server.stop().await;
    Ok(vec![measured?])
}

/// The server's process figures once they stop moving (the median of a few readings).
async fn settled_stats(pid: u32) -> Result<ProcStats> {
    let mut readings = Vec::new();
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        readings.push(ProcStats::of(pid).context("cannot read the server's /proc entries")?);
    }
    readings.sort_by_key(|s| s.rss_kib);
    Ok(readings[readings.len() / 2])
}

/// Many evaluations across many sessions: the server's descriptors, threads and memory
/// before and after must not grow. Samples: every evaluation.
async fn soak(ctx: &Ctx) -> Result<Vec<Row>> {
    if !python_here(ctx).await? {
        return Ok(Vec::new());
    }
    let sessions = ctx.args.soak_sessions as usize;
    let evals = ctx.args.soak_evals as usize;
    let mut config = ctx.without_pool();
    config.max_sessions = sessions + 4;
    config.max_sessions_per_principal = 0;
    config.max_active_per_principal = 0;
    let server = McpServer::start(ctx.serve_with(&config)).await?;
    let pid = server.pid().context("the server has no pid")?;
    let mut ids = Vec::new();
    let measured = async {
        let h = server.handle();
        for _ in 0..sessions {
            ids.push(start_session(&server, "python").await?);
        }
        // Every session evaluates a little first, so that what grows once is not counted.
        for round in 0..3 {
            for id in &ids {
                eval_expecting(&h, id, &format!("{round}+1"), &format!("{}\n", round + 1)).await?;
            }
        }
        server.wait_quiet(QUIET).await;
        let before = settled_stats(pid).await?;
        // Four at a time, each session used by one evaluation at a time.
        const AT_ONCE: usize = 4;
        let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let ids_shared = std::sync::Arc::new(ids.clone());
        let mut set = tokio::task::JoinSet::new();
        for worker in 0..AT_ONCE.min(sessions) {
            let h = h.clone();
            let next = next.clone();
            let ids = ids_shared.clone();
            set.spawn(async move {
                let mut times = Vec::new();
                // Worker w owns the sessions w, w+AT_ONCE, …, so no session is shared.
                let mine: Vec<&String> = ids.iter().skip(worker).step_by(AT_ONCE).collect();
                let mut k = 0usize;
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= evals {
                        return Ok::<_, anyhow::Error>(times);
                    }
                    let id = mine[k % mine.len()];
                    k += 1;
                    times.push(
                        eval_expecting(&h, id, &format!("{i}*2"), &format!("{}\n", i * 2))
                            .await?,
                    );
                }
            });
        }
        let mut samples = Vec::with_capacity(evals);
        while let Some(done) = set.join_next().await {
            samples.extend(done.context("a soak worker failed")??);
        }
        server.wait_quiet(QUIET).await;
        let right_after = settled_stats(pid).await?;
        // Threads the runtime started for blocking work (directory walks) end after 10 s
        // idle: what stays after that is what the server keeps.
        let mut after = right_after;
        let settle = Instant::now();
        while after.threads > before.threads && settle.elapsed() < Duration::from_secs(15) {
            tokio::time::sleep(Duration::from_millis(500)).await;
            after = ProcStats::of(pid).context("cannot read the server's /proc entries")?;
        }
        Ok::<_, anyhow::Error>(Row {
            name: "soak".into(),
            title: format!(
                "{evals} session_eval across {sessions} python sessions, {AT_ONCE} at a time (samples: each evaluation)"
            ),
            measurement: Measurement::new(samples, None)
                .metric("evals", evals as f64)
                .metric("sessions", sessions as f64)
                .metric("fds_before", before.fds as f64)
                .metric("fds_after", after.fds as f64)
                .metric("threads_before", before.threads as f64)
                .metric("threads_right_after", right_after.threads as f64)
                .metric("threads_after", after.threads as f64)
                .metric("rss_kib_before", before.rss_kib as f64)
                .metric("rss_kib_after", after.rss_kib as f64),
        })
    }
    .await;
    for id in &ids {
        close_session(&server, id).await;
    }
    server.stop().await;
    Ok(vec![measured?])
}

/// The version of mcp-server-code-runner measured beside replbox.
pub const PEER: &str = "mcp-server-code-runner@0.1.8";

/// mcp-server-code-runner, installed with npm into a temporary folder, against replbox:
/// server start to the initialize reply, and run-code python (the peer is given the same
/// python, first on its PATH). Skipped (with a note) without npx or with --no-peer.
async fn peer(ctx: &Ctx) -> Result<Vec<Row>> {
    if ctx.args.no_peer {
        ctx.note(format!("{PEER}: not measured (--no-peer)"));
        return Ok(Vec::new());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    if replbox::api::which("npx", &path).is_none() {
        ctx.note(format!("{PEER}: not measured (npx is not on PATH)"));
        return Ok(Vec::new());
    }
    let dir = tempfile::tempdir().context("cannot create a folder for the peer")?;
    let bin = match install_peer(dir.path()).await {
        Ok(b) => b,
        Err(e) => {
            ctx.note(format!("{PEER}: not measured (cannot install it: {e:#})"));
            return Ok(Vec::new());
        }
    };
    let python = Interpreter::resolve(&ctx.config, "python").await?;
    let peer_path = match python.exe.parent() {
        Some(bin_dir) => {
            let mut p = std::ffi::OsString::from(bin_dir);
            p.push(":");
            p.push(&path);
            p
        }
        None => path.clone(),
    };
    let peer_command = || {
        let mut cmd = Command::new(&bin);
        cmd.env("PATH", &peer_path).current_dir(dir.path());
        cmd
    };
    let mut rows = Vec::new();

    // Start-up, alternating fresh servers of each.
    time_initialize(peer_command(), None).await?;
    time_initialize(ctx.serve_command(), Some("replbox")).await?;
    let (samples, floor_samples) = alternate(
        ctx.iterations,
        || time_initialize(ctx.serve_command(), Some("replbox")),
        || time_initialize(peer_command(), None),
    )
    .await?;
    rows.push(Row {
        name: "peer:initialize".into(),
        title: format!("server start -> initialize reply, replbox against {PEER}"),
        measurement: Measurement::against(
            samples,
            format!("{PEER} (node {})", bin.display()),
            floor_samples,
        ),
    });

    // run-code python, one server of each.
    let ours = McpServer::start(ctx.serve_command()).await?;
    let theirs = McpServer::start(peer_command()).await;
    let measured = async {
        let theirs = theirs?;
        let args = args_of(json!({"languageId": "python", "code": "print(1+1)"}));
        let result = async {
            let a = || async {
                ours.wait_quiet(QUIET).await;
                ours.call_expecting("run-code", &args, "2\n").await
            };
            let b = || async {
                ours.wait_quiet(QUIET).await;
                theirs.call_expecting("run-code", &args, "2\n").await
            };
            for _ in 0..WARMUP {
                a().await?;
                b().await?;
            }
            alternate(ctx.iterations, a, b).await
        }
        .await;
        theirs.stop().await;
        let (samples, floor_samples) = result?;
        Ok::<_, anyhow::Error>(Row {
            name: "peer:run_code".into(),
            title: format!("run-code python print(1+1), replbox against {PEER}"),
            measurement: Measurement::against(
                samples,
                format!("{PEER} with {} first on PATH", python.exe.display()),
                floor_samples,
            ),
        })
    }
    .await;
    ours.stop().await;
    rows.push(measured?);
    Ok(rows)
}

/// `npm install` the peer into `dir`; its executable.
async fn install_peer(dir: &Path) -> Result<PathBuf> {
    let out = tokio::time::timeout(
        Duration::from_secs(300),
        Command::new("npm")
            .args(["install", "--prefix"])
            .arg(dir)
            .args([PEER, "--no-audit", "--no-fund", "--loglevel=error"])
            .stdin(Stdio::null())
            .output(),
    )
    .await
    .context("npm install took over 5 minutes")?
    .context("cannot run npm")?;
    if !out.status.success() {
        bail!(
            "npm install {PEER} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let bin = dir.join("node_modules/.bin/mcp-server-code-runner");
    if !bin.exists() {
        bail!("npm installed no {}", bin.display());
    }
    Ok(bin)
}
