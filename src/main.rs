//! Command line: `serve` (MCP over stdio, or streamable HTTP with `--http`), `run`,
//! and `languages`. (Every child runs under the helper, the `replbox-exec` binary installed
//! beside this one.)

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use replbox::app::App;
use replbox::config::{Config, HttpConfig, LogFormat};
use replbox::mcp::ReplboxServer;
use replbox::run::RunRequest;
use rmcp::ServiceExt;

#[derive(Parser)]
#[command(
    name = "replbox",
    version,
    about = "MCP server for persistent interpreter sessions and one-shot code runs"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,

    /// How log lines on stderr are written: `text`, or `json` (one object per line). The
    /// filter is REPLBOX_LOG (default `warn,replbox=info`: replbox's own events, including
    /// one audit line per tool call, and other crates' warnings).
    #[arg(
        long,
        global = true,
        env = "REPLBOX_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text
    )]
    log_format: LogFormat,
}

/// `serve`'s settings alone, for a bare `replbox`.
#[derive(Parser)]
#[command(name = "replbox")]
struct BareServe {
    #[command(flatten)]
    config: Config,
    #[command(flatten)]
    http: HttpConfig,
}

#[derive(Subcommand)]
enum Command {
    /// Serve MCP over stdio (the default when no command is given), or over streamable
    /// HTTP with --http ADDR.
    Serve {
        #[command(flatten)]
        config: Config,
        #[command(flatten)]
        http: HttpConfig,
    },
    /// Run a program once and print its result, exiting with the program's status.
    Run {
        /// Language id or alias.
        language: String,
        /// The code (or use -f).
        code: Option<String>,
        /// Read the code from this file ("-" for stdin).
        #[arg(short = 'f', long = "file", conflicts_with = "code")]
        file: Option<PathBuf>,
        /// Text for the program's standard input.
        #[arg(long)]
        stdin: Option<String>,
        /// Timeout in milliseconds.
        #[arg(long)]
        timeout_ms: Option<u64>,
        /// Arguments for the program (after --).
        #[arg(last = true)]
        args: Vec<String>,
        #[command(flatten)]
        config: Config,
    },
    /// List the languages this host can run, with their versions.
    Languages {
        #[command(flatten)]
        config: Config,
    },
}

fn main() -> ExitCode {
    drop_own_python_env_from_path();
    let cli = Cli::parse();
    // A bare `replbox` is exactly `replbox serve`: its settings come from the REPLBOX_*
    // variables as serve's do (no flag can be given without a command).
    let command = cli.command.unwrap_or_else(|| {
        let bare = BareServe::parse_from(["replbox"]);
        Command::Serve {
            config: bare.config,
            http: bare.http,
        }
    });
    init_logging(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("replbox: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async move {
        match command {
            Command::Serve { config, http } => match http.addr.clone() {
                Some(addr) => serve_http(config, http, addr).await,
                None => serve(config).await,
            },
            Command::Run {
                language,
                code,
                file,
                stdin,
                timeout_ms,
                args,
                config,
            } => run(config, language, code, file, stdin, timeout_ms, args).await,
            Command::Languages { config } => languages(config).await,
        }
    });
    // Do not wait for stray blocking tasks (a stdin read) at exit.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("replbox: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Installed from a wheel, replbox must not take its own environment's Python for the
/// user's (see `replbox::install`).
fn drop_own_python_env_from_path() {
    let (Some(path), Ok(exe)) = (std::env::var_os("PATH"), std::env::current_exe()) else {
        return;
    };
    let active = std::env::var_os("VIRTUAL_ENV");
    if let Some(new) = replbox::install::path_without_own_env(&path, &exe, active.as_deref()) {
        // SAFETY: called first thing in `main`, before the runtime or any other thread
        // exists, so nothing reads the environment concurrently.
        unsafe { std::env::set_var("PATH", new) };
    }
}

/// replbox's own events (the audit line of every call, start-up, sessions closed) and other
/// crates' warnings.
const DEFAULT_LOG: &str = "warn,replbox=info";

fn init_logging(format: LogFormat) {
    use tracing_subscriber::Layer;
    use tracing_subscriber::filter::FilterExt;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let filter = tracing_subscriber::EnvFilter::try_from_env("REPLBOX_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG));
    // rmcp logs every JSON-RPC error it answers at WARN ("response error"), so a client's
    // mistake (a missing resource, a bad cursor, an unknown tool) would read as a server
    // problem; replbox logs those itself, below WARN.
    let not_a_client_mistake = tracing_subscriber::filter::filter_fn(|meta| {
        !(meta.target() == "rmcp::service"
            && *meta.level() == tracing::Level::WARN
            && meta.fields().field("id").is_some()
            && meta.fields().field("error").is_some())
    });
    // stdout is the protocol channel: logs go to stderr only.
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false);
    let stderr = match format {
        LogFormat::Text => stderr.boxed(),
        LogFormat::Json => stderr.json().boxed(),
    };
    tracing_subscriber::registry()
        .with(stderr.with_filter(filter.and(not_a_client_mistake)))
        .with(replbox::mcp::client_log::layer())
        .init();
}

/// On a terminal, say what `serve` is waiting for: it looks hung otherwise.
fn hint_if_terminal() {
    use std::io::IsTerminal;
    if std::io::stdin().is_terminal() {
        eprintln!(
            "replbox: MCP server on stdio, waiting for an MCP client's JSON-RPC messages on \
             stdin (configure it in your MCP client rather than typing here); Ctrl-C stops it."
        );
    }
}

async fn serve(config: Config) -> anyhow::Result<ExitCode> {
    hint_if_terminal();
    let app = App::new(config)?;
    app.log_settings();
    let server = ReplboxServer::new(app.clone());
    let framing = replbox::stdio::transport(app.config.max_line_bytes);
    let service = server.serve(framing).await?;
    tracing::info!("serving MCP on stdio");
    // Detection and the warm pools spawn interpreters; start them after the handshake so
    // they do not slow it.
    app.start_background();
    let ct = service.cancellation_token();
    tokio::spawn(async move {
        wait_for_termination().await;
        ct.cancel();
    });
    let reason = service.waiting().await;
    tracing::info!(?reason, "MCP service ended");
    app.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

async fn serve_http(config: Config, http: HttpConfig, addr: String) -> anyhow::Result<ExitCode> {
    let app = App::new(config)?;
    app.log_settings();
    replbox::http::serve(app, &http, &addr, wait_for_termination()).await?;
    Ok(ExitCode::SUCCESS)
}

async fn wait_for_termination() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

async fn run(
    config: Config,
    language: String,
    code: Option<String>,
    file: Option<PathBuf>,
    stdin: Option<String>,
    timeout_ms: Option<u64>,
    args: Vec<String>,
) -> anyhow::Result<ExitCode> {
    let code = match (code, file) {
        (Some(c), _) => c,
        (None, Some(f)) if f.as_os_str() == "-" => std::io::read_to_string(std::io::stdin())?,
        (None, Some(f)) => std::fs::read_to_string(&f)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", f.display()))?,
        (None, None) => anyhow::bail!("give the code as an argument or with -f FILE"),
    };
    let app = App::new(config)?;
    let lang = app.registry.get(&language).map_err(|e| {
        anyhow::anyhow!(
            "{e}.{} Available: {}",
            replbox::lang::did_you_mean(app.registry.suggest(&language, false).as_deref()),
            app.registry.available_names().join(", ")
        )
    })?;
    let req = RunRequest {
        code,
        stdin,
        args,
        env: Default::default(),
        timeout: app.config.timeout(timeout_ms),
        venv: None,
        // The command line is the local principal, as stdio is.
        principal: "local".into(),
        allow_domains: Vec::new(),
        mcp_servers: Vec::new(),
    };
    let cancel = tokio_util::sync::CancellationToken::new();
    let c2 = cancel.clone();
    tokio::spawn(async move {
        wait_for_termination().await;
        c2.cancel();
    });
    let report = app
        .runner
        .run(&lang, req, &cancel, None)
        .await
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(report.stdout.as_bytes());
    let _ = out.flush();
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(report.stderr.as_bytes());
    if !report.success() {
        let text = report.text();
        let trailer = text.rsplit('\n').next().unwrap_or_default();
        if !report.stderr.is_empty() && !report.stderr.ends_with('\n') {
            let _ = err.write_all(b"\n");
        }
        let _ = writeln!(err, "{trailer}");
    }
    Ok(exit_code_for(&report))
}

/// The process exit status mirroring the program's (128+N for a signal, 124 on timeout).
fn exit_code_for(report: &replbox::run::RunReport) -> ExitCode {
    if report.timed_out {
        return ExitCode::from(124);
    }
    if let Some(code) = report.exit_code {
        return ExitCode::from((code & 0xff) as u8);
    }
    if let Some(sig) = &report.signal {
        let n = nix::sys::signal::Signal::iterator()
            .find(|s| s.as_str() == sig)
            .map(|s| s as i32)
            .unwrap_or(1);
        return ExitCode::from((128 + n) as u8);
    }
    ExitCode::from(125)
}

async fn languages(config: Config) -> anyhow::Result<ExitCode> {
    let app = App::new(config)?;
    app.registry.detect_all().await;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:<12} {:<10} {:<8} {:<16} {:<28} EXECUTABLE",
        "ID", "STATUS", "SESSION", "VERSION", "ALIASES"
    )?;
    let mut notes = Vec::new();
    for lang in app.registry.all() {
        let (status, version, exe) = match (&lang.program, lang.detected()) {
            (Ok(_), Some(d)) => ("installed", d.version.clone(), lang.info(&d.exe).line()),
            (Ok(p), None) => ("installed", "?".into(), lang.info(p).line()),
            (Err(why), _) => ("missing", "-".into(), why.clone()),
        };
        if let Some(skipped) = lang.skipped.as_ref().filter(|_| lang.installed()) {
            notes.push(format!("{}: {skipped}", lang.id()));
        }
        if lang.installed() && lang.spec.venv {
            notes.push(format!(
                "{}: a run or session can use a virtual environment instead (venv, or a .venv \
in a session's cwd)",
                lang.id()
            ));
        }
        writeln!(
            out,
            "{:<12} {:<10} {:<8} {:<16} {:<28} {}",
            lang.id(),
            status,
            match (lang.has_session(), lang.session_available()) {
                (false, _) => "-",
                (true, true) => "yes",
                (true, false) => "missing",
            },
            version,
            lang.spec.aliases.join(","),
            exe
        )?;
    }
    for n in notes {
        writeln!(out, "\n{n}")?;
    }
    Ok(ExitCode::SUCCESS)
}
