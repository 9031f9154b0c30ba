//! `replbox doctor`: what this host gives a server started with these flags, found the way
//! the server finds it (the same probe, registry and sandbox, a real run for what user code
//! sees), with the line that fixes each problem.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use crate::app::App;
use crate::config::Config;
use crate::run::RunRequest;
use crate::sandbox::Level;

/// One problem and the line that fixes it.
struct Problem {
    what: String,
    fix: String,
}

/// Print the report on stdout. Exits 0 whatever it finds (its problems are advice); only a
/// server that cannot start at all with these flags is an error, as it would be for `serve`.
pub async fn run(config: Config) -> anyhow::Result<ExitCode> {
    let mut out = String::new();
    let mut problems = Vec::new();
    let exe = std::env::current_exe().unwrap_or_default();
    let _ = writeln!(
        out,
        "replbox {} at {}",
        env!("CARGO_PKG_VERSION"),
        exe.display()
    );
    let app = match App::new(config) {
        Ok(app) => app,
        Err(e) => {
            println!("{out}");
            println!("the server cannot start with these flags: {e:#}");
            return Ok(ExitCode::FAILURE);
        }
    };
    sandbox_section(&app, &mut out, &mut problems);
    app.registry.detect_all().await;
    languages_section(&app, &mut out, &mut problems);
    data_section(&app, &mut out, &mut problems).await;
    cwd_section(&app, &mut out, &mut problems);
    network_section(&app, &mut out, &mut problems).await;
    if problems.is_empty() {
        let _ = writeln!(out, "\nNo problems found.");
    } else {
        let _ = writeln!(
            out,
            "\nProblems ({}), each with the line that fixes it:",
            problems.len()
        );
        for p in &problems {
            let _ = writeln!(out, "  - {}\n      fix: {}", p.what, p.fix);
        }
    }
    print!("{out}");
    app.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

fn read_sysctl(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// The first line `program args` prints, when it runs.
fn version_of(program: &Path, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .ok()?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    text.lines().next().map(|l| l.trim().to_string())
}

fn sandbox_section(app: &App, out: &mut String, problems: &mut Vec<Problem>) {
    let sb = &app.sandbox;
    let _ = writeln!(out, "\nSandbox level: {}", sb.level);
    let bwrap = crate::sandbox::probe::find_on_path("bwrap");
    let userns_max = read_sysctl("/proc/sys/user/max_user_namespaces");
    let userns_clone = read_sysctl("/proc/sys/kernel/unprivileged_userns_clone");
    let apparmor = read_sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns");
    let userns = userns_state(
        userns_max.as_deref(),
        userns_clone.as_deref(),
        apparmor.as_deref(),
    );
    let _ = writeln!(out, "  user namespaces: {userns}");
    let _ = writeln!(out, "  Landlock: {}", landlock_state(sb.landlock_abi));
    match &bwrap {
        Some(b) => {
            let v = version_of(b, &["--version"]).unwrap_or_else(|| "version unknown".into());
            let _ = writeln!(out, "  bubblewrap: {} ({v})", b.display());
        }
        None => {
            let _ = writeln!(out, "  bubblewrap: not on PATH");
        }
    }
    let _ = writeln!(
        out,
        "  running as {}",
        if sb.root {
            "root: user code runs as a uid of the pool (--uid-base, --uids)"
        } else {
            "an ordinary user: user code runs as this user"
        }
    );
    let why = level_reason(
        sb.level,
        bwrap.is_none(),
        apparmor.as_deref(),
        userns_clone.as_deref(),
        problems,
    );
    let _ = writeln!(out, "  why: {why}");
}

/// Whether unprivileged user namespaces (which bubblewrap needs) are available, from the
/// three sysctls that can turn them off.
fn userns_state(max: Option<&str>, clone: Option<&str>, apparmor: Option<&str>) -> String {
    match (max, clone, apparmor) {
        (Some("0"), _, _) => "off (user.max_user_namespaces = 0)".to_string(),
        (_, Some("0"), _) => {
            "off for unprivileged users (kernel.unprivileged_userns_clone = 0)".to_string()
        }
        (_, _, Some("1")) => {
            "restricted by AppArmor (kernel.apparmor_restrict_unprivileged_userns = 1)".to_string()
        }
        (Some(m), _, _) => format!("available (user.max_user_namespaces = {m})"),
        _ => "unknown (no /proc/sys/user/max_user_namespaces)".to_string(),
    }
}

/// What Landlock this kernel offers.
fn landlock_state(abi: i32) -> String {
    match abi {
        0 => "not available in this kernel".to_string(),
        n => format!(
            "ABI {n}{}",
            if n < 4 {
                " (no TCP rules before ABI 4)"
            } else {
                ""
            }
        ),
    }
}

/// Why the sandbox is at `level`; below bwrap, the problem and its fix go to `problems`.
fn level_reason(
    level: Level,
    no_bwrap: bool,
    apparmor: Option<&str>,
    userns_clone: Option<&str>,
    problems: &mut Vec<Problem>,
) -> String {
    match level {
        Level::Bwrap => "bubblewrap works here: the strongest level".to_string(),
        Level::Landlock if no_bwrap => {
            problems.push(Problem {
                what: "bubblewrap is not installed: the sandbox is landlock, not bwrap".into(),
                fix: "apt-get install bubblewrap   (or dnf install bubblewrap)".into(),
            });
            "bubblewrap is not on PATH; Landlock and seccomp work".to_string()
        }
        Level::Landlock => {
            problems.push(Problem {
                what: "bubblewrap is installed but cannot create its namespaces here".into(),
                fix: if apparmor == Some("1") {
                    "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0   (or run the \
                     server as root)"
                        .into()
                } else if userns_clone == Some("0") {
                    "sysctl -w kernel.unprivileged_userns_clone=1   (or run the server as root)"
                        .into()
                } else {
                    "allow unprivileged user namespaces (sysctl user.max_user_namespaces), or \
                     run the server as root; inside a container, give it --privileged or a \
                     seccomp profile that allows clone(CLONE_NEWUSER)"
                        .into()
                },
            });
            "bubblewrap cannot set up namespaces here; Landlock and seccomp work".to_string()
        }
        Level::None => {
            problems.push(Problem {
                what: "user code runs without isolation (level none)".into(),
                fix: "apt-get install bubblewrap, and a kernel with Landlock (5.13 or newer)"
                    .into(),
            });
            "neither bubblewrap nor Landlock works here".to_string()
        }
    }
}

fn languages_section(app: &App, out: &mut String, problems: &mut Vec<Problem>) {
    let _ = writeln!(out, "\nLanguages found:");
    let mut missing = Vec::new();
    for lang in app.registry.all() {
        let id = lang.id();
        match (&lang.program, lang.detected()) {
            (Ok(p), d) => {
                let (exe, version) = match d {
                    Some(d) => (d.exe.clone(), d.version.clone()),
                    None => (p.clone(), "?".into()),
                };
                let session = if lang.session_available() {
                    ", sessions"
                } else if lang.has_session() {
                    ", run-code only (its REPL program is missing)"
                } else {
                    ""
                };
                let _ = writeln!(out, "  {id:<12} {version:<12} {}{session}", exe.display());
                if let Some(skipped) = &lang.skipped {
                    let _ = writeln!(out, "  {:<12} note: {skipped}", "");
                }
            }
            (Err(_), _) => missing.push(id.to_string()),
        }
    }
    if !missing.is_empty() {
        let _ = writeln!(out, "  not found: {}", missing.join(", "));
    }
    let sessions = [
        "python",
        "javascript",
        "ruby",
        "haskell",
        "shellscript",
        "r",
    ];
    let packages = [
        ("python", "python3"),
        ("javascript", "nodejs"),
        ("ruby", "ruby"),
        ("haskell", "ghc"),
        ("r", "r-base-core"),
    ];
    for (id, pkg) in packages {
        if sessions.contains(&id) && missing.iter().any(|m| m == id) {
            problems.push(Problem {
                what: format!("{id} is not installed: no {id} sessions or runs"),
                fix: format!(
                    "apt-get install {pkg}   (the interpreter must be on the server's PATH)"
                ),
            });
        }
    }
}

/// Why a probe's program gave no output to read.
#[derive(Debug, thiserror::Error)]
enum ProbeError {
    #[error(transparent)]
    Language(crate::lang::LookupError),
    /// The run was refused (its message).
    #[error("{}", .0.message)]
    Refused(crate::error::ToolError),
    /// The program failed: what it printed.
    #[error("{0}")]
    Failed(String),
}

/// A short program run the way `run-code` runs it (same sandbox and user), its output.
async fn probe_run(app: &Arc<App>, language: &str, code: &str) -> Result<String, ProbeError> {
    let lang = app.registry.get(language).map_err(ProbeError::Language)?;
    let req = RunRequest {
        code: code.into(),
        stdin: None,
        args: Vec::new(),
        env: Default::default(),
        timeout: std::time::Duration::from_secs(30),
        venv: None,
        principal: "local".into(),
        allow_domains: Vec::new(),
        mcp_servers: Vec::new(),
        packages: Vec::new(),
    };
    let cancel = tokio_util::sync::CancellationToken::new();
    let report = app
        .runner
        .run(&lang, req, &cancel, None)
        .await
        .map_err(ProbeError::Refused)?;
    if report.exit_code == Some(0) {
        Ok(report.stdout)
    } else {
        Err(ProbeError::Failed(
            format!("{}{}", report.stdout, report.stderr)
                .trim()
                .to_string(),
        ))
    }
}

async fn data_section(app: &Arc<App>, out: &mut String, problems: &mut Vec<Problem>) {
    let _ = writeln!(
        out,
        "\nData stack (imported by python code in the sandbox):"
    );
    let code = "import importlib\n\
                for m in ('pandas', 'numpy', 'matplotlib'):\n\
                \x20   try:\n\
                \x20       v = getattr(importlib.import_module(m), '__version__', '?')\n\
                \x20       print(m, v)\n\
                \x20   except Exception as e:\n\
                \x20       print(m, 'MISSING', type(e).__name__)\n";
    let python = app
        .registry
        .get("python")
        .ok()
        .and_then(|l| l.detected().map(|d| d.exe.clone()));
    match probe_run(app, "python", code).await {
        Ok(text) => {
            for line in text.lines() {
                let mut parts = line.split_whitespace();
                let (Some(m), Some(v)) = (parts.next(), parts.next()) else {
                    continue;
                };
                if v == "MISSING" {
                    let _ = writeln!(out, "  {m:<12} does not import");
                    let py = python
                        .as_deref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_else(|| "python3".into());
                    problems.push(Problem {
                        what: format!("{m} does not import: no tables or figures from it"),
                        fix: format!(
                            "{py} -m pip install {m}   (a Debian Python: apt-get install \
                             python3-{m})"
                        ),
                    });
                } else {
                    let _ = writeln!(out, "  {m:<12} {v}");
                }
            }
        }
        Err(e) => {
            let _ = writeln!(out, "  python does not run here: {e}");
        }
    }
}

fn cwd_section(app: &App, out: &mut String, problems: &mut Vec<Problem>) {
    let _ = writeln!(out, "\nDirectories a session may use as its cwd:");
    let masked: Vec<String> = app
        .sandbox
        .masked()
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    // The kernel's and the system's runtime trees are never a cwd, allowed or not.
    let mut never: Vec<String> = masked.clone();
    for sys in ["/proc", "/sys", "/dev", "/run"] {
        if !never.iter().any(|m| m == sys) {
            never.push(sys.to_string());
        }
    }
    let allowed = &app.runner.cwd_policy.allowed;
    let _ = writeln!(
        out,
        "  any directory outside {}{}",
        never.join(", "),
        if app.sandbox.root {
            ", that a session's uid can reach (every directory on the way searchable by others)"
        } else {
            ""
        }
    );
    if allowed.is_empty() {
        let _ = writeln!(out, "  allowed inside those trees: none (--allow-cwd)");
    } else {
        for a in allowed {
            let _ = writeln!(out, "  allowed: {} (--allow-cwd)", a.display());
        }
    }
    let _ = writeln!(
        out,
        "  to allow more: replbox serve --allow-cwd DIR   (or: replbox install --client \
         NAME --project DIR)"
    );
    // Where the doctor runs is most often the project the user means.
    if let Ok(here) = std::env::current_dir() {
        let here_shown = here.display().to_string();
        let lexical = crate::hostfs::lexical(&here);
        match app.runner.cwd_policy.refuse(&lexical, &here, "cwd") {
            Ok(()) if app.sandbox.root && !dir_reachable(&here) => {
                let _ = writeln!(
                    out,
                    "  this directory, {here_shown}: refused (a session's uid cannot reach it)"
                );
                problems.push(Problem {
                    what: format!("{here_shown} cannot be a session's cwd: a directory on the way is not searchable by others"),
                    fix: format!("chmod o+x {}", unreachable_dirs(&here).join(" ")),
                });
            }
            Ok(()) => {
                let _ = writeln!(out, "  this directory, {here_shown}: usable");
            }
            Err(why) => {
                let _ = writeln!(out, "  this directory, {here_shown}: refused ({why})");
                if masked.iter().any(|m| here.starts_with(m)) {
                    problems.push(Problem {
                        what: format!("{here_shown} is hidden by the sandbox: sessions cannot use it as their cwd"),
                        fix: format!("replbox serve --allow-cwd {here_shown}   (or: replbox install --client NAME --project {here_shown})"),
                    });
                }
            }
        }
    }
}

/// Every directory on the way to `dir` (and itself) searchable by others.
fn dir_reachable(dir: &Path) -> bool {
    unreachable_dirs(dir).is_empty()
}

fn unreachable_dirs(dir: &Path) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    let real = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut bad: Vec<PathBuf> = real
        .ancestors()
        .filter(|d| {
            std::fs::metadata(d)
                .map(|m| m.permissions().mode() & 0o001 == 0)
                .unwrap_or(true)
        })
        .map(Path::to_path_buf)
        .collect();
    bad.reverse();
    bad.iter().map(|p| p.display().to_string()).collect()
}

async fn network_section(app: &Arc<App>, out: &mut String, problems: &mut Vec<Problem>) {
    let _ = writeln!(out, "\nNetwork and packages:");
    let policy = app.sandbox.egress.as_ref().map(|e| e.policy().describe());
    match &policy {
        Some(p) => {
            let _ = writeln!(out, "  egress proxy: on, to {p}");
            if app.sandbox.level == Level::Landlock && app.sandbox.landlock_abi < 4 {
                problems.push(Problem {
                    what: "Landlock before ABI 4 cannot hold user code to the proxy: its network \
                           rules are advisory here"
                        .into(),
                    fix: "apt-get install bubblewrap   (level bwrap has no network but the proxy)"
                        .into(),
                });
            }
        }
        None => {
            let _ = writeln!(
                out,
                "  egress proxy: off (user code has no network; pip and uv find nothing)"
            );
        }
    }
    // What user code finds: the installers, as a run sees them.
    let code = "command -v uv >/dev/null && uv --version || echo 'uv: not found'\n\
                python3 -m pip --version 2>/dev/null | cut -d' ' -f1,2 || echo 'pip: not found'\n";
    match probe_run(app, "shellscript", code).await {
        Ok(text) => {
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                let _ = writeln!(out, "  in the sandbox: {}", line.trim());
            }
            if text.contains("uv: not found") {
                let _ = writeln!(
                    out,
                    "  (uv is optional: `python -m pip install` in a session works through the \
                     proxy as well)"
                );
            }
        }
        Err(e) => {
            let _ = writeln!(out, "  bash does not run here: {e}");
        }
    }
    if policy.is_none() {
        problems.push(Problem {
            what: "packages cannot be installed by user code (no network)".into(),
            fix: "replbox serve --allow-domain pypi.org,files.pythonhosted.org   (only if \
                  sessions should install packages)"
                .into(),
        });
    }
}
