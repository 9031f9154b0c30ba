//! The command line a newcomer meets: `install --client` (each client's format against a
//! golden file, merging into a file that has other servers, the backup, `--print`),
//! `doctor` on this host, each subcommand's help, the tip for a bare `replbox` given a
//! `serve` flag, unknown `REPLBOX_*` variables, a switch's variable set to 1 or 0, and
//! `REPLBOX_TOKEN` over HTTP.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{BIN, Server};

fn replbox(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(BIN);
    c.args(args);
    for var in ["CODEX_HOME", "XDG_CONFIG_HOME", "REPLBOX_LOG"] {
        c.env_remove(var);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run replbox")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The binary's path as `install` writes it (canonical).
fn exe() -> String {
    std::fs::canonicalize(BIN)
        .expect("canonical binary")
        .display()
        .to_string()
}

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/install")
        .join(name)
}

/// Compare with the golden file (`UPDATE_GOLDEN=1` rewrites it).
fn check_golden(name: &str, got: &str) {
    let path = golden(name);
    if std::env::var("UPDATE_GOLDEN").as_deref() == Ok("1") {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, got).expect("write golden");
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
    assert_eq!(got, want, "{name} differs from {}", path.display());
}

#[test]
fn install_print_writes_each_clients_documented_format() {
    let home = tempfile::tempdir().expect("home");
    let project = tempfile::tempdir().expect("project");
    let project_path = std::fs::canonicalize(project.path()).expect("canonical");
    let project_s = project_path.display().to_string();
    let cases = [
        ("claude-code", "claude-code.json"),
        ("cursor", "cursor.json"),
        ("vscode", "vscode.json"),
        ("codex", "codex.toml"),
        ("claude-desktop", "claude-desktop.json"),
    ];
    for (client, file) in cases {
        let mut args = vec![
            "install",
            "--client",
            client,
            "--print",
            "--project",
            &project_s,
        ];
        if client == "claude-desktop" {
            args.extend(["--ssh", "me@linux-box"]);
        }
        let o = replbox(&args, &[("HOME", home.path().to_str().expect("utf-8"))]);
        assert!(o.status.success(), "{client}: {}", text(&o.stderr));
        let got = text(&o.stdout)
            .replace(&exe(), "{REPLBOX}")
            .replace(&project_s, "{PROJECT}");
        check_golden(file, &got);
        // Printing writes nothing.
        assert_eq!(
            std::fs::read_dir(home.path()).expect("home").count(),
            0,
            "{client}: --print wrote a file"
        );
    }
    // Claude Desktop has no Linux build: the SSH form, and where to put it.
    let o = replbox(
        &["install", "--client", "claude-desktop"],
        &[("HOME", home.path().to_str().expect("utf-8"))],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["mcpServers"]["replbox"]["command"], "ssh");
    assert_eq!(v["mcpServers"]["replbox"]["args"][2], exe());
    assert!(text(&o.stderr).contains("claude_desktop_config.json"));
}

/// Each client's user-wide file, under `home`.
fn client_file(client: &str, home: &Path) -> PathBuf {
    match client {
        "claude-code" => home.join(".claude.json"),
        "cursor" => home.join(".cursor/mcp.json"),
        "vscode" => home.join(".config/Code/User/mcp.json"),
        "codex" => home.join(".codex/config.toml"),
        other => panic!("no file for {other}"),
    }
}

fn backups(file: &Path) -> Vec<PathBuf> {
    let name = file
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    let mut v: Vec<PathBuf> = std::fs::read_dir(file.parent().expect("dir"))
        .expect("dir")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                n.to_string_lossy()
                    .starts_with(&format!("{name}.replbox-backup-"))
            })
        })
        .collect();
    v.sort();
    v
}

#[test]
fn install_merges_into_an_existing_file_and_keeps_a_backup() {
    let home = tempfile::tempdir().expect("home");
    let home_s = home.path().to_str().expect("utf-8").to_string();
    let project = tempfile::tempdir().expect("project");
    let project_s = std::fs::canonicalize(project.path())
        .expect("canonical")
        .display()
        .to_string();
    // Each file as a user has it: comments (where the format allows), settings of its own,
    // another server, and an old replbox entry in one of them.
    let existing = [
        (
            "claude-code",
            "{\n  \"numStartups\": 12,\n  \"mcpServers\": {\n    \"github\": {\"type\": \"stdio\", \"command\": \"gh-mcp\", \"args\": []}\n  },\n  \"projects\": {\"/x\": {\"allowedTools\": []}}\n}\n",
        ),
        (
            "cursor",
            "{\n  // my servers\n  \"mcpServers\": {\n    \"other\": { \"command\": \"npx\", \"args\": [\"-y\", \"other-mcp\"] },\n    \"replbox\": { \"command\": \"/old/replbox\", \"args\": [\"serve\"] },\n  },\n}\n",
        ),
        (
            "vscode",
            "{\n  \"inputs\": [],\n  /* kept */\n  \"servers\": {\n    \"fetch\": { \"type\": \"stdio\", \"command\": \"uvx\", \"args\": [\"mcp-server-fetch\"] }\n  }\n}\n",
        ),
        (
            "codex",
            "# my codex settings\nmodel = \"o4-mini\"\n\n[mcp_servers.docs]\ncommand = \"docs-mcp\"\nargs = [\"--stdio\"]\n",
        ),
    ];
    for (client, old) in existing {
        let file = client_file(client, home.path());
        std::fs::create_dir_all(file.parent().expect("dir")).expect("mkdir");
        std::fs::write(&file, old).expect("seed");
        let args = ["install", "--client", client, "--project", &project_s];
        let o = replbox(&args, &[("HOME", &home_s)]);
        assert!(o.status.success(), "{client}: {}", text(&o.stderr));
        let said = text(&o.stdout);
        let new = std::fs::read_to_string(&file).expect("read");
        // The other servers and settings, and the comments, are as they were.
        for keep in [
            "\"numStartups\": 12",
            "gh-mcp",
            "\"projects\"",
            "// my servers",
            "other-mcp",
            "/* kept */",
            "mcp-server-fetch",
            "# my codex settings",
            "model = \"o4-mini\"",
            "[mcp_servers.docs]",
        ] {
            if old.contains(keep) {
                assert!(new.contains(keep), "{client}: {keep} lost:\n{new}");
            }
        }
        assert!(new.contains(&exe()), "{client}:\n{new}");
        assert!(new.contains(&project_s), "{client}:\n{new}");
        assert!(!new.contains("/old/replbox"), "{client}:\n{new}");
        if client == "cursor" {
            assert!(said.contains("replaced"), "{said}");
        } else {
            assert!(said.contains("added"), "{said}");
        }
        // The backup is the file as it was, byte for byte.
        let b = backups(&file);
        assert_eq!(b.len(), 1, "{client}: {b:?}");
        assert_eq!(std::fs::read_to_string(&b[0]).expect("backup"), old);
        assert!(said.contains(&b[0].display().to_string()), "{said}");
        // Again: nothing to change, no second backup.
        let o = replbox(&args, &[("HOME", &home_s)]);
        assert!(o.status.success(), "{client}: {}", text(&o.stderr));
        assert!(text(&o.stdout).contains("unchanged"), "{}", text(&o.stdout));
        assert_eq!(std::fs::read_to_string(&file).expect("read"), new);
        assert_eq!(backups(&file).len(), 1, "{client}");
    }
    // A file that did not exist is created, 0600, with no backup.
    let fresh = tempfile::tempdir().expect("home");
    let o = replbox(
        &["install", "--client", "cursor"],
        &[("HOME", fresh.path().to_str().expect("utf-8"))],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let file = fresh.path().join(".cursor/mcp.json");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file)
        .expect("created")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(backups(&file).is_empty());
    // --config names the file (a project's own).
    let own = fresh.path().join("proj/.vscode/mcp.json");
    let own_s = own.display().to_string();
    let o = replbox(&["install", "--client", "vscode", "--config", &own_s], &[]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&own).expect("written")).expect("json");
    assert_eq!(v["servers"]["replbox"]["type"], "stdio");
}

#[test]
fn install_leaves_a_file_it_cannot_read_alone() {
    let home = tempfile::tempdir().expect("home");
    let file = home.path().join(".cursor/mcp.json");
    std::fs::create_dir_all(file.parent().expect("dir")).expect("mkdir");
    let bad = "{\"mcpServers\": [1, 2]}\n";
    std::fs::write(&file, bad).expect("seed");
    let o = replbox(
        &["install", "--client", "cursor"],
        &[("HOME", home.path().to_str().expect("utf-8"))],
    );
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(err.contains("`mcpServers` is not an object"), "{err}");
    assert!(err.contains("nothing was changed"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).expect("read"), bad);
    assert!(backups(&file).is_empty());
    // A project that is not there is refused before anything is written.
    let o = replbox(
        &["install", "--client", "codex", "--project", "/no/such/dir"],
        &[("HOME", home.path().to_str().expect("utf-8"))],
    );
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("--project /no/such/dir"));
    assert!(!home.path().join(".codex").exists());
}

#[test]
fn doctor_names_the_level_and_every_language_found() {
    let o = replbox(&["doctor"], &[]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let report = text(&o.stdout);
    eprintln!("{report}");
    let level = report
        .lines()
        .find_map(|l| l.strip_prefix("Sandbox level: "))
        .unwrap_or_else(|| panic!("no level:\n{report}"));
    assert!(["bwrap", "landlock", "none"].contains(&level), "{level}");
    for piece in ["user namespaces:", "Landlock:", "bubblewrap:", "why:"] {
        assert!(report.contains(piece), "{piece}:\n{report}");
    }
    // Every language `languages` finds installed, with its version and path.
    let l = replbox(&["languages"], &[]);
    assert!(l.status.success());
    let mut found = 0;
    for line in text(&l.stdout).lines().skip(1) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() < 5 || cols[1] != "installed" {
            continue;
        }
        let (id, version) = (cols[0], cols[3]);
        let row = report
            .lines()
            .find(|r| r.trim_start().starts_with(&format!("{id} ")))
            .unwrap_or_else(|| panic!("{id} not in the report:\n{report}"));
        assert!(row.contains(version), "{id} {version}: {row}");
        assert!(row.contains('/'), "{id}: no path: {row}");
        found += 1;
    }
    assert!(found > 0, "no language installed?\n{report}");
    for section in [
        "Data stack",
        "Directories a session may use as its cwd:",
        "--allow-cwd",
        "Network and packages:",
        "egress proxy:",
    ] {
        assert!(report.contains(section), "{section}:\n{report}");
    }
    // Each problem comes with its fix.
    let problems = report.matches("\n  - ").count();
    assert_eq!(problems, report.matches("      fix: ").count(), "{report}");
}

#[test]
fn each_subcommand_shows_only_its_own_flags() {
    let help = |sub: &str| {
        let o = replbox(&[sub, "--help"], &[]);
        assert!(o.status.success(), "{sub}: {}", text(&o.stderr));
        text(&o.stdout)
    };
    let serve = help("serve");
    for f in [
        "--session-pool",
        "--max-sessions",
        "--http",
        "--allow-cwd",
        "--sandbox",
    ] {
        assert!(serve.contains(f), "serve lacks {f}");
    }
    let run = help("run");
    for f in ["--timeout-ms", "--sandbox", "--memory-mb", "--stdin"] {
        assert!(run.contains(f), "run lacks {f}:\n{run}");
    }
    for f in [
        "--session-pool",
        "--max-sessions",
        "--http",
        "--history-cells",
        "--state-dir",
    ] {
        assert!(!run.contains(f), "run shows {f}:\n{run}");
    }
    let languages = help("languages");
    assert!(languages.contains("--python"), "{languages}");
    for f in ["--pool", "--memory-mb", "--idle-timeout-s", "--max-images"] {
        assert!(!languages.contains(f), "languages shows {f}:\n{languages}");
    }
    // Some 50 flags before: now the run's own and those that shape a run.
    let flags = run
        .lines()
        .filter(|l| l.trim_start().starts_with("--"))
        .count();
    assert!(flags <= 25, "run --help lists {flags} flags:\n{run}");
    let doctor = help("doctor");
    for f in ["--allow-cwd", "--allow-domain", "--sandbox"] {
        assert!(doctor.contains(f), "doctor lacks {f}");
    }
    let install = help("install");
    for f in [
        "--client",
        "--project",
        "--print",
        "--ssh",
        "claude-code",
        "codex",
    ] {
        assert!(install.contains(f), "install lacks {f}");
    }
    // A serve flag given to run is refused, saying whose it is.
    let o = replbox(&["run", "--session-pool", "2", "python", "print(1)"], &[]);
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(
        err.contains("--session-pool is a flag of `replbox serve`"),
        "{err}"
    );
}

#[test]
fn a_bare_replbox_with_a_serve_flag_is_told_where_it_goes() {
    let o = replbox(&["--http", "127.0.0.1:0"], &[]);
    assert_eq!(o.status.code(), Some(2));
    let err = text(&o.stderr);
    assert!(err.contains("replbox serve --http 127.0.0.1:0"), "{err}");
    // Not a serve flag: the plain error, no tip.
    let o = replbox(&["--no-such-flag"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(!text(&o.stderr).contains("tip:"));
}

#[test]
fn an_unknown_replbox_variable_is_named_with_the_closest_known_one() {
    // stdin is closed: serve stops at once, after its start-up warnings.
    let o = Command::new(BIN)
        .arg("serve")
        .env("REPLBOX_MAX_SESION", "3")
        .env("REPLBOX_POOL", "0")
        .env("REPLBOX_SESSION_POOL", "0")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run");
    let err = text(&o.stderr);
    assert!(
        err.contains("REPLBOX_MAX_SESION is set, but replbox reads no variable of that name (did you mean REPLBOX_MAX_SESSIONS?)"),
        "{err}"
    );
    assert!(!err.contains("REPLBOX_POOL is set"), "{err}");
}

/// A switch's variable takes what an operator writes, 1 and 0 (and yes/no) as well as
/// true/false: `REPLBOX_PACKAGE_BUILDS=1` at level none is `--package-builds` there (the
/// server does not start, saying why), `=no` is its absence (the server starts, and stops
/// at once: stdin is closed); a value that is neither is refused by name.
#[test]
fn a_switch_variable_takes_one_and_zero() {
    let cache = tempfile::tempdir().expect("tempdir");
    let serve = |builds: &str| {
        Command::new(BIN)
            .args(["serve", "--sandbox", "none", "--package-cache"])
            .arg(cache.path().join("packages"))
            .env("REPLBOX_PACKAGE_BUILDS", builds)
            .env("REPLBOX_EVICT_IDLE", "1")
            .env("REPLBOX_NO_AUTO_RESTORE", "yes")
            .env("REPLBOX_ALLOW_NETWORK", "0")
            .env("REPLBOX_POOL", "0")
            .env("REPLBOX_SESSION_POOL", "0")
            .env_remove("REPLBOX_NO_PACKAGES")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run")
    };
    let on = serve("1");
    let err = text(&on.stderr);
    assert!(!on.status.success(), "{err}");
    assert!(
        err.contains("--package-builds needs the sandbox level bwrap, and this server's is none"),
        "{err}"
    );
    let off = serve("no");
    let err = text(&off.stderr);
    assert_ne!(off.status.code(), Some(2), "{err}");
    assert!(err.contains("sandbox and limits sandbox=none"), "{err}");
    assert!(!err.contains("--package-builds"), "{err}");
    let bad = serve("maybe");
    assert_eq!(bad.status.code(), Some(2));
    let err = text(&bad.stderr);
    assert!(
        err.contains("'maybe'") && err.contains("--package-builds"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn replbox_token_is_taken_as_a_bearer_token() {
    let tok = common::token();
    let s = Server::http().env("REPLBOX_TOKEN", &tok).start().await;
    let addr = s.addr.to_string();
    // Without the token: refused.
    let status = raw_post(&addr, None);
    assert!(status.starts_with("HTTP/1.1 401"), "{status}");
    let status = raw_post(&addr, Some("wrong"));
    assert!(status.starts_with("HTTP/1.1 401"), "{status}");
    // With it: a real tool call.
    let client = s.connect(&tok).await;
    let o = common::http_call(
        client.peer(),
        "run-code",
        serde_json::json!({"languageId": "python", "code": "print(6*7)"}),
    )
    .await;
    assert_eq!(o.text.trim(), "42", "{}", o.text);
    let _ = client.cancel().await;
    s.stop().await;
}

/// The status line of an `initialize` POST to `/mcp`, with `token` as the bearer.
fn raw_post(addr: &str, token: Option<&str>) -> String {
    use std::io::{Read, Write};
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut c = std::net::TcpStream::connect(addr).expect("connect");
    c.write_all(req.as_bytes()).expect("write");
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    out.lines().next().unwrap_or_default().to_string()
}

#[test]
fn missing_preload_modules_are_one_info_line() {
    use std::io::{BufRead, BufReader, Write};
    if !common::require("python", "python3") {
        return;
    }
    let mut child = Command::new(BIN)
        .args([
            "serve",
            "--preload",
            "no_such_mod_a,no_such_mod_b",
            "--session-pool",
            "1",
        ])
        .env("REPLBOX_POOL", "0")
        .env("REPLBOX_LOG", "info")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().expect("stdin");
    // The warm pool starts once the server has answered `initialize`.
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-06-18","capabilities":{{}},"clientInfo":{{"name":"t","version":"0"}}}}}}"#
    )
    .expect("initialize");
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#
    )
    .expect("initialized");
    // A guard against a server that never says it, not a measurement.
    let pid = child.id() as i32;
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let guard = std::thread::spawn(move || {
        if done_rx
            .recv_timeout(std::time::Duration::from_secs(180))
            .is_err()
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    });
    let mut lines = Vec::new();
    let mut reader = BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    while reader.read_line(&mut line).unwrap_or(0) > 0 {
        let done = line.contains("no_such_mod");
        lines.push(std::mem::take(&mut line));
        if done {
            break;
        }
    }
    drop(stdin);
    while reader.read_line(&mut line).unwrap_or(0) > 0 {
        lines.push(std::mem::take(&mut line));
    }
    let _ = child.wait();
    let _ = done_tx.send(());
    let _ = guard.join();
    let about: Vec<&String> = lines.iter().filter(|l| l.contains("no_such_mod")).collect();
    assert_eq!(about.len(), 1, "{lines:#?}");
    assert!(about[0].contains(" INFO "), "{}", about[0]);
    assert!(
        about[0].contains("no_such_mod_a, no_such_mod_b"),
        "{}",
        about[0]
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.contains(" WARN ") && l.contains("preload")),
        "{lines:#?}"
    );
}

/// The README is read in five minutes: short, the Quick start first, every page it links
/// to there.
#[test]
fn the_readme_is_short_and_starts_with_the_quick_start() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).expect("README");
    let lines = readme.lines().count();
    assert!(
        lines <= 300,
        "README.md is {lines} lines: move detail into docs/"
    );
    let first = readme
        .lines()
        .find(|l| l.starts_with("## "))
        .expect("a section");
    assert_eq!(first, "## Quick start");
    for link in regex_links(&readme) {
        if link.starts_with("http") || link.starts_with('#') {
            continue;
        }
        let path = link.split('#').next().unwrap_or(&link);
        assert!(
            Path::new(root).join(path).exists(),
            "README links to {link}, which is not there"
        );
    }
    // No package the project does not own: PyPI's `replbox` is another project's.
    for stranger in [
        "uvx replbox",
        "pipx install replbox",
        "pip install replbox",
        "uv tool install replbox",
    ] {
        for (n, l) in readme.lines().enumerate() {
            assert!(
                !l.contains(stranger) || l.contains("replbox-mcp") || l.contains("replbox_mcp"),
                "README line {}: {l}",
                n + 1
            );
        }
    }
}

/// The targets of Markdown links `[text](target)`.
fn regex_links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(j) = rest.find(')') {
            out.push(rest[..j].to_string());
            rest = &rest[j..];
        }
    }
    out
}
