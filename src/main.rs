//! Command line: `serve` (MCP over stdio, or streamable HTTP with `--http`), `run`,
//! `languages`, `install` (a client's configuration) and `doctor` (what this host gives).
//! (Every child runs under the helper, the `replbox-exec` binary installed beside this one.)

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use replbox::api::{App, Config, HttpConfig, LogFormat, ReplboxServer, RunRequest};
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
    /// Add replbox to an MCP client's configuration (or print the entry with --print).
    Install {
        /// The client whose configuration to write.
        #[arg(long, value_enum)]
        client: replbox::api::clients::Client,
        /// A project directory sessions may use as their `cwd` although the sandbox hides
        /// its tree (`--allow-cwd DIR` in the entry); repeatable.
        #[arg(long = "project", value_name = "DIR")]
        projects: Vec<PathBuf>,
        /// Print the configuration instead of writing it.
        #[arg(long)]
        print: bool,
        /// Write this file instead of the client's user-wide one (say, a project's
        /// `.mcp.json`, `.cursor/mcp.json` or `.vscode/mcp.json`).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Start replbox over SSH on this host (`ssh -T HOST /path/to/replbox serve`), for a
        /// client on another machine; claude-desktop always does (default: this host's name).
        #[arg(long, value_name = "HOST")]
        ssh: Option<String>,
        /// The server's name in the client.
        #[arg(long, default_value = "replbox")]
        name: String,
    },
    /// Say what this host gives replbox: the sandbox level and why, the languages found,
    /// the data stack, the directories sessions may use, the network for packages; and the
    /// line that fixes each problem.
    Doctor {
        #[command(flatten)]
        config: Config,
    },
}

/// The flags of `Config` each subcommand other than `serve` uses; the others are hidden
/// from its help and refused on its command line.
const RUN_FLAGS: &[&str] = &[
    "prompts",
    "python",
    "default_timeout_ms",
    "max_timeout_ms",
    "output_cap",
    "work_dir",
    "sandbox",
    "require_sandbox",
    "allow_network",
    "allow_domain",
    "allow_host",
    "memory_mb",
    "processes",
    "file_size_mb",
    "open_files",
    "cpu_s",
    "tmpfs_mb",
    "uid_base",
    "uids",
    "mask",
];
const LANGUAGES_FLAGS: &[&str] = &["prompts", "python", "sandbox", "work_dir", "mask"];
const DOCTOR_FLAGS: &[&str] = &[
    "prompts",
    "python",
    "sandbox",
    "require_sandbox",
    "work_dir",
    "mask",
    "allow_cwd",
    "allow_network",
    "allow_domain",
    "allow_host",
    "caller_domains",
    "uid_base",
    "uids",
];

/// The command line parsed: subcommands other than `serve` show and take only the flags
/// that apply to them; a bare `replbox` given `serve`'s flags is told where they go.
fn parse_cli() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let config_ids: Vec<String> = <Config as clap::Args>::augment_args(clap::Command::new("c"))
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .collect();
    let only: [(&str, &[&str]); 3] = [
        ("run", RUN_FLAGS),
        ("languages", LANGUAGES_FLAGS),
        ("doctor", DOCTOR_FLAGS),
    ];
    let mut cmd = Cli::command();
    for (sub, keep) in only {
        for id in config_ids.iter().filter(|id| !keep.contains(&id.as_str())) {
            cmd = cmd.mut_subcommand(sub, |c| c.mut_arg(id.as_str(), |a| a.hide(true)));
        }
    }
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let matches = match cmd.clone().try_get_matches_from(&argv) {
        Ok(m) => m,
        Err(e) => {
            if e.kind() == clap::error::ErrorKind::UnknownArgument
                && argv
                    .get(1)
                    .is_some_and(|a| a.to_string_lossy().starts_with('-'))
                && BareServe::try_parse_from(&argv).is_ok()
            {
                let rest: Vec<String> = argv[1..]
                    .iter()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect();
                let _ = e.print();
                eprintln!(
                    "\ntip: a bare `replbox` is `replbox serve`, but flags go after the \
                     command: replbox serve {}",
                    rest.join(" ")
                );
                std::process::exit(2);
            }
            e.exit()
        }
    };
    for (sub, keep) in only {
        let Some(m) = matches.subcommand_matches(sub) else {
            continue;
        };
        for id in config_ids.iter().filter(|id| !keep.contains(&id.as_str())) {
            if m.value_source(id) == Some(clap::parser::ValueSource::CommandLine) {
                let flag = format!("--{}", id.replace('_', "-"));
                cmd.error(
                    clap::error::ErrorKind::ArgumentConflict,
                    format!("{flag} is a flag of `replbox serve`, not of `replbox {sub}`"),
                )
                .exit();
            }
        }
    }
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

fn main() -> ExitCode {
    drop_own_python_env_from_path();
    let cli = parse_cli();
    // A bare `replbox` is exactly `replbox serve`: its settings come from the REPLBOX_*
    // variables as serve's do (no flag can be given without a command).
    let command = cli.command.unwrap_or_else(|| {
        let bare = BareServe::parse_from(["replbox"]);
        Command::Serve {
            config: bare.config,
            http: bare.http,
        }
    });
    // install prints what it did; doctor's report is the output (its probes' own warnings
    // are in the report).
    match &command {
        Command::Install { .. } => return install(command),
        Command::Doctor { .. } => init_logging(cli.log_format, Some("error")),
        _ => init_logging(cli.log_format, None),
    }
    if let Command::Serve { .. } = &command {
        warn_unknown_variables();
    }
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
            Command::Doctor { config } => replbox::api::doctor(config).await,
            Command::Install { .. } => unreachable!("handled before the runtime"),
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
/// user's (see `replbox::api::path_without_own_env`).
fn drop_own_python_env_from_path() {
    let (Some(path), Ok(exe)) = (std::env::var_os("PATH"), std::env::current_exe()) else {
        return;
    };
    let active = std::env::var_os("VIRTUAL_ENV");
    if let Some(new) = replbox::api::path_without_own_env(&path, &exe, active.as_deref()) {
        // SAFETY: called first thing in `main`, before the runtime or any other thread
        // exists, so nothing reads the environment concurrently.
        unsafe { std::env::set_var("PATH", new) };
    }
}

/// replbox's own events (the audit line of every call, start-up, sessions closed) and other
/// crates' warnings.
const DEFAULT_LOG: &str = "warn,replbox=info";

fn init_logging(format: LogFormat, filter: Option<&str>) {
    use tracing_subscriber::Layer;
    use tracing_subscriber::filter::FilterExt;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let filter = match filter {
        Some(f) => tracing_subscriber::EnvFilter::new(f),
        None => tracing_subscriber::EnvFilter::try_from_env("REPLBOX_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG)),
    };
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
        .with(replbox::api::client_log_layer())
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
    if !config.cluster.cluster.is_empty() {
        anyhow::bail!("--cluster needs --http: the nodes of a cluster serve MCP over HTTP");
    }
    let app = App::new(config)?;
    app.log_settings();
    let server = ReplboxServer::new(app.clone());
    let framing = replbox::api::stdio_transport(app.config.max_line_bytes);
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

async fn serve_http(
    config: Config,
    mut http: HttpConfig,
    addr: String,
) -> anyhow::Result<ExitCode> {
    // The name clients' examples use for their one token: taken as one more token rather
    // than ignored (REPLBOX_TOKENS takes several).
    if let Ok(token) = std::env::var("REPLBOX_TOKEN")
        && !token.trim().is_empty()
        && !http.tokens.contains(&token)
    {
        http.tokens.push(token);
        tracing::info!(
            "REPLBOX_TOKEN taken as bearer token #{} (REPLBOX_TOKENS takes several, \
             comma-separated)",
            http.tokens.len()
        );
    }
    let app = App::new(config)?;
    app.log_settings();
    app.join_cluster().await;
    replbox::api::serve_http(app, &http, &addr, wait_for_termination()).await?;
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
            replbox::api::did_you_mean(app.registry.suggest(&language, false).as_deref()),
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
        packages: Vec::new(),
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
fn exit_code_for(report: &replbox::api::RunReport) -> ExitCode {
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
            (Err(why), _) => ("missing", "-".into(), why.to_string()),
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

/// Variables named `REPLBOX_*` that replbox reads besides the flags' own.
const OTHER_VARIABLES: &[&str] = &[
    "REPLBOX_LOG",
    "REPLBOX_HELPER",
    "REPLBOX_TOKEN",
    // The test suite's, the benchmark's and CI's own.
    "REPLBOX_REQUIRE_ALL",
    "REPLBOX_BENCH_TEST",
    "REPLBOX_CI_CACHE",
    "REPLBOX_PACKAGES_PROFILE",
    "REPLBOX_SKIP_LOG",
    "REPLBOX_FUZZ_RUNS",
    "REPLBOX_FUZZ_SEED",
    "REPLBOX_FUZZ_SECS",
];

/// A `REPLBOX_*` variable that nothing reads is most likely a misspelling: say so by name
/// (never its value), with the closest known name.
fn warn_unknown_variables() {
    use clap::CommandFactory;
    let cmd = Cli::command();
    let mut known: Vec<String> = OTHER_VARIABLES.iter().map(|s| s.to_string()).collect();
    let mut add = |c: &clap::Command| {
        for a in c.get_arguments() {
            if let Some(env) = a.get_env() {
                known.push(env.to_string_lossy().into_owned());
            }
        }
    };
    add(&cmd);
    for sub in cmd.get_subcommands() {
        add(sub);
    }
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if !name.starts_with("REPLBOX_") || known.iter().any(|k| *k == name) {
            continue;
        }
        let closest = known
            .iter()
            .map(|k| (strsim::jaro_winkler(k, &name), k))
            .filter(|(score, _)| *score > 0.85)
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, k)| format!(" (did you mean {k}?)"))
            .unwrap_or_default();
        tracing::warn!("{name} is set, but replbox reads no variable of that name{closest}");
    }
}

/// `replbox install`: the entry written into (or printed for) the client's configuration.
fn install(command: Command) -> ExitCode {
    use replbox::api::clients::{self, Entry};
    let Command::Install {
        client,
        projects,
        print,
        config,
        ssh,
        name,
    } = command
    else {
        return ExitCode::FAILURE;
    };
    let fail = |msg: String| {
        eprintln!("replbox install: {msg}");
        ExitCode::FAILURE
    };
    let exe = match install_exe() {
        Ok(p) => p,
        Err(msg) => return fail(msg),
    };
    let dirs = match project_dirs(&projects) {
        Ok(d) => d,
        Err(msg) => return fail(msg),
    };
    let ssh = match ssh_host(ssh, client) {
        Ok(h) => h,
        Err(msg) => return fail(msg),
    };
    let entry = Entry::new(&name, &exe, &dirs, ssh.as_deref());
    let file = config.or_else(|| clients::default_file(client, &|k| std::env::var(k).ok()));
    let file = match (print, file) {
        (false, Some(f)) => f,
        (true, _) | (false, None) => {
            print_entry(client, &entry, print, ssh.as_deref());
            return ExitCode::SUCCESS;
        }
    };
    match clients::install(client, &file, &entry) {
        Ok(done) => {
            say_installed(
                client,
                &entry.name,
                &done.file,
                done.change,
                done.backup.as_deref(),
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(e.to_string()),
    }
}

/// The replbox the entry starts: this one, with a note when it runs from a cache that goes.
fn install_exe() -> Result<PathBuf, String> {
    use replbox::api::clients;
    let exe = match std::env::current_exe().and_then(std::fs::canonicalize) {
        Ok(p) => p,
        Err(e) => return Err(format!("cannot tell where this replbox is: {e}")),
    };
    if let Some(launcher) = clients::transient_exe(&exe) {
        eprintln!(
            "replbox install: note: this replbox runs from {launcher}'s cache ({}), which goes \
             when the cache is cleaned; for a lasting entry install it first (`uv tool install` \
             the wheel, or `npm install -g` the package) and run `replbox install` from there",
            exe.display()
        );
    }
    Ok(exe)
}

/// The `--project` directories, each resolved and checked to be a directory.
fn project_dirs(projects: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut dirs = Vec::new();
    for p in projects {
        match std::fs::canonicalize(p) {
            Ok(d) if d.is_dir() => dirs.push(d),
            Ok(d) => return Err(format!("--project {}: not a directory", d.display())),
            Err(e) => return Err(format!("--project {}: {e}", p.display())),
        }
    }
    Ok(dirs)
}

/// The host the entry reaches replbox on over SSH: `--ssh`, else this host's name for a
/// client that runs elsewhere, else none.
fn ssh_host(
    ssh: Option<String>,
    client: replbox::api::clients::Client,
) -> Result<Option<String>, String> {
    Ok(match (ssh, client.runs_elsewhere()) {
        (Some(h), _) if h.is_empty() || h.starts_with('-') => {
            return Err(format!("--ssh {h:?}: give a host name (or user@host)"));
        }
        (Some(h), _) => Some(h),
        (None, true) => Some(
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "localhost".into()),
        ),
        (None, false) => None,
    })
}

/// The entry printed, with where to merge it when no file is written.
fn print_entry(
    client: replbox::api::clients::Client,
    entry: &replbox::api::clients::Entry,
    print: bool,
    ssh: Option<&str>,
) {
    use replbox::api::clients::{self, Client};
    print!("{}", clients::render(client, entry));
    if client == Client::ClaudeDesktop {
        eprintln!(
            "replbox install: Claude Desktop runs on macOS or Windows: merge this into \
             its claude_desktop_config.json there (macOS: ~/Library/Application \
             Support/Claude/, Windows: %APPDATA%\\Claude\\); it starts replbox on \
             this host over SSH (`ssh -T {}` must log in without a prompt)",
            ssh.unwrap_or_default()
        );
    } else if !print {
        eprintln!("replbox install: no HOME: merge this into the client's file by hand");
    }
}

/// What an install did to `file`, and what the user does next.
fn say_installed(
    client: replbox::api::clients::Client,
    name: &str,
    file: &std::path::Path,
    change: replbox::api::clients::Change,
    backup: Option<&std::path::Path>,
) {
    use replbox::api::clients::Change;
    let what = match change {
        Change::Added => "added",
        Change::Replaced => "replaced",
        Change::Unchanged => "already there, unchanged",
    };
    println!(
        "{}: server \"{name}\" {what} in {}",
        client.name(),
        file.display()
    );
    if let Some(b) = backup {
        println!("the file as it was: {}", b.display());
    }
    if change != Change::Unchanged {
        println!(
            "restart {} (or reload its MCP servers) to use it",
            client.name()
        );
    }
}
