//! Attack tests of an adversarial review, one or more per finding (named after it), through
//! the built server: stale workspaces of a killed server, no-token HTTP where user code can
//! call the server back, stdio lines rmcp cannot read, a bare `replbox` and its
//! environment, token names that collide with the stdio principal, and the fair share of
//! sandbox uids between principals.
//!
//! Tests that depend on the sandbox run at every level that applies, as root and as an
//! unprivileged uid when the tests run as root; a level that cannot start here is skipped
//! with its reason, or fails under REPLBOX_REQUIRE_ALL=1.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::*;
use rmcp::RoleClient;
use rmcp::service::RunningService;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const ALL: &[&str] = &["bwrap", "landlock", "none"];
/// Unprivileged servers each get a uid of their own (RLIMIT_NPROC counts per uid).
static NEXT_UID: AtomicU32 = AtomicU32::new(62_000);

const TOKEN_A: &str = "token-of-alice-0123456789";
const TOKEN_B: &str = "token-of-bob-9876543210ab";

#[derive(Debug, Clone, Copy)]
struct Setup {
    level: &'static str,
    /// The server runs as root (user code then runs as a pool uid).
    root: bool,
}

fn we_are_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn setups(levels: &[&'static str]) -> Vec<Setup> {
    let mut v = Vec::new();
    for &level in levels {
        if we_are_root() {
            v.push(Setup { level, root: true });
        }
        v.push(Setup { level, root: false });
    }
    v
}

/// The uid a setup's server runs as (None: this process's own).
fn uid_for(setup: Setup) -> Option<u32> {
    (!setup.root && we_are_root()).then(|| NEXT_UID.fetch_add(1, Ordering::Relaxed))
}

/// Start a stdio server for `setup` as `uid`, or None (skipped) when the level does not
/// work here.
async fn start_as(
    setup: Setup,
    uid: Option<u32>,
    args: &[&str],
    env: &[(&str, &str)],
) -> Option<TestServer> {
    let mut a = vec!["--sandbox", setup.level];
    a.extend_from_slice(args);
    match TestServer::try_start(&a, env, uid).await {
        Ok(s) => {
            assert!(
                s.instructions()
                    .contains(&format!("Sandbox: {} (", setup.level)),
                "{setup:?}: {}",
                s.instructions()
            );
            Some(s)
        }
        Err(e) => {
            skip(format_args!(
                "{setup:?}: level {} does not work here: {e}",
                setup.level
            ));
            None
        }
    }
}

/// A directory for `--work-dir`, owned by `uid` (the server's), that pool uids can pass.
fn work_parent(uid: Option<u32>) -> tempfile::TempDir {
    let d = tempfile::tempdir_in("/tmp").expect("tempdir");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    if let Some(uid) = uid {
        std::os::unix::fs::chown(d.path(), Some(uid), Some(uid)).expect("chown");
    }
    d
}

/// The workspace root of a session, from its default `cwd` (`ROOT/sessions/ID/work`).
fn workspace_of(start: &Out) -> PathBuf {
    let cwd = PathBuf::from(start.s("cwd"));
    cwd.ancestors()
        .nth(3)
        .unwrap_or_else(|| panic!("no workspace above {}", cwd.display()))
        .to_path_buf()
}

/// Wait (bounded) until `path` no longer exists; whether it is gone.
async fn wait_removed(path: &Path, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if std::fs::symlink_metadata(path).is_err() {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ----- Finding 11: stale workspaces -----

// A SIGKILLed server cannot remove its workspace (session files, the code's links and all):
// the next server to start in the same directory removes it, without following the links
// user code planted in it, and leaves a live server's workspace alone.
#[tokio::test(flavor = "multi_thread")]
async fn finding_11_a_killed_servers_workspace_is_removed_at_the_next_start() {
    for setup in setups(ALL) {
        let uid = uid_for(setup);
        let parent = work_parent(uid);
        let work = parent.path().to_str().expect("UTF-8").to_string();
        let args = ["--work-dir", work.as_str()];
        // What the planted links point to: must survive the sweep.
        let canary = tempfile::tempdir().expect("tempdir");
        std::fs::write(canary.path().join("secret.txt"), "keep me").expect("write");

        let Some(live) = start_as(setup, uid, &args, &[]).await else {
            continue;
        };
        let live_start = live
            .call("session_start", json!({"language": "bash"}))
            .await;
        assert!(!live_start.is_error, "{setup:?}: {}", live_start.text);
        let live_root = workspace_of(&live_start);
        let live_id = live_start.s("session_id").to_string();

        let Some(doomed) = start_as(setup, uid, &args, &[]).await else {
            continue;
        };
        let o = doomed
            .call(
                "session_start",
                json!({"language": "bash", "files": [{"name": "notes.txt", "content": "data"}]}),
            )
            .await;
        assert!(!o.is_error, "{setup:?}: {}", o.text);
        let root = workspace_of(&o);
        let id = o.s("session_id").to_string();
        let canary_dir = canary.path().display().to_string();
        let canary_file = canary.path().join("secret.txt").display().to_string();
        let o = doomed
            .eval(
                &id,
                &format!(
                    "ln -s {canary_dir} dir-link && ln -s {canary_file} file-link && mkdir -p a/b \
                     && ln -s / a/b/root-link && ls"
                ),
            )
            .await;
        assert!(!o.is_error, "{setup:?}: {}", o.text);
        assert!(output(&o).contains("notes.txt"), "{setup:?}: {}", o.text);
        assert!(root.join(".replbox-workspace").exists(), "{setup:?}");
        assert_ne!(root, live_root);

        let tree = doomed.descendants();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(doomed.pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("SIGKILL");
        let mut gone = tree;
        gone.push(doomed.pid as i32);
        let left = wait_gone(&gone, Duration::from_secs(20)).await;
        assert!(left.is_empty(), "{setup:?}: still alive: {left:?}");
        assert!(
            root.join("sessions").is_dir(),
            "{setup:?}: a killed server cannot clean up"
        );

        let Some(next) = start_as(setup, uid, &args, &[]).await else {
            continue;
        };
        assert!(
            wait_removed(&root, Duration::from_secs(30)).await,
            "{setup:?}: the killed server's workspace {} is still there",
            root.display()
        );
        assert_eq!(
            std::fs::read_to_string(canary.path().join("secret.txt")).ok(),
            Some("keep me".to_string()),
            "{setup:?}: the sweep followed a planted link"
        );
        assert!(std::path::Path::new("/etc/passwd").exists());
        // The live server's workspace and session are untouched.
        assert!(live_root.join(".replbox-workspace").is_file(), "{setup:?}");
        let o = live.eval(&live_id, "echo still here").await;
        assert_eq!(output(&o), "still here\n", "{setup:?}: {}", o.text);
        let o = next.run("bash", "echo fresh").await;
        assert_eq!(o.text, "fresh\n", "{setup:?}");
        let _ = doomed.client.cancel().await;
        live.stop().await;
        next.stop().await;
    }
}

// Only what is proved to be a dead replbox workspace of this server's uid is removed: not a
// link named like one, not a directory without the lock file (another program's, or an
// older replbox's), not one of another user, not one whose name does not say replbox.
#[tokio::test(flavor = "multi_thread")]
async fn finding_11_the_sweep_removes_nothing_it_cannot_prove_dead() {
    let parent = work_parent(None);
    let p = parent.path();
    let make = |dir: &Path, lock: bool| {
        std::fs::create_dir_all(dir.join("sessions")).expect("mkdir");
        std::fs::write(dir.join(".replbox-workspace"), "").expect("marker");
        if lock {
            std::fs::write(dir.join(".replbox-lock"), "").expect("lock");
        }
        std::fs::write(dir.join("sessions/file"), "x").expect("file");
    };
    // A dead workspace, so the test knows the sweep ran.
    make(&p.join("replbox-dead"), true);
    // Kept: no lock file.
    make(&p.join("replbox-nolock"), false);
    // Kept: a name that is not a workspace's.
    make(&p.join("other-dead"), true);
    // Kept: a link named like a workspace, to a directory that looks dead.
    let victim = tempfile::tempdir().expect("tempdir");
    make(victim.path(), true);
    std::os::unix::fs::symlink(victim.path(), p.join("replbox-link")).expect("symlink");
    // Kept: a lock file that is a link.
    make(&p.join("replbox-lock-link"), false);
    std::os::unix::fs::symlink(
        victim.path().join(".replbox-lock"),
        p.join("replbox-lock-link/.replbox-lock"),
    )
    .expect("symlink");
    // Kept: another user's (root only can make one).
    if we_are_root() {
        let theirs = p.join("replbox-theirs");
        make(&theirs, true);
        for f in ["", ".replbox-workspace", ".replbox-lock"] {
            std::os::unix::fs::chown(theirs.join(f), Some(54_321), Some(54_321)).expect("chown");
        }
    }
    let work = p.to_str().expect("UTF-8");
    let s = TestServer::start_with(&["--work-dir", work], &[]).await;
    assert!(
        wait_removed(&p.join("replbox-dead"), Duration::from_secs(30)).await,
        "a dead workspace was not removed"
    );
    for kept in [
        "replbox-nolock",
        "other-dead",
        "replbox-link",
        "replbox-lock-link",
    ] {
        assert!(
            std::fs::symlink_metadata(p.join(kept)).is_ok(),
            "{kept} was removed"
        );
    }
    assert!(victim.path().join("sessions/file").is_file());
    if we_are_root() {
        assert!(p.join("replbox-theirs/sessions/file").is_file());
    }
    let o = s.run("bash", "echo ok").await;
    assert_eq!(o.text, "ok\n");
    s.stop().await;
}

// ----- Finding 11: no-token HTTP where user code reaches the host's loopback -----

/// The harness's `replbox serve --http 127.0.0.1:0` (with the server's own log level), and
/// its address as text.
struct HttpServer {
    srv: common::HttpServer,
    addr: String,
}

impl HttpServer {
    /// Start, or the exit status and log of a server that stopped before listening.
    async fn try_start(args: &[&str], env: &[(&str, &str)]) -> Result<Self, (String, String)> {
        Server::http()
            .env_remove("REPLBOX_LOG")
            .args(args)
            .envs(env.iter().copied())
            .try_start()
            .await
            .map(|srv| Self {
                addr: srv.addr.to_string(),
                srv,
            })
            .map_err(|e| (e.status, e.log))
    }

    async fn connect(&self, token: &str) -> RunningService<RoleClient, ()> {
        self.srv.connect(token).await
    }

    async fn stop(self) {
        self.srv.stop().await;
    }
}

/// Bash that POSTs an MCP `initialize` without a token to the server at `addr` from inside
/// the sandbox and prints the status line it gets (or why it could not connect).
fn call_back(addr: &str) -> String {
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"0"}}}"#;
    format!(
        "exec 3<>/dev/tcp/{host}/{port} || exit 7\n\
         printf 'POST /mcp HTTP/1.1\\r\\nHost: {addr}\\r\\nContent-Type: application/json\\r\\n\
         Accept: application/json, text/event-stream\\r\\nContent-Length: {}\\r\\n\
         Connection: close\\r\\n\\r\\n%s' '{body}' >&3\n\
         head -n 1 <&3 | tr -d '\\r'",
        body.len()
    )
}

// Without a token every request is the local principal, which may copy host files into a
// session. Where user code can reach the host's loopback (level none, or landlock with network),
// it could call the server back and do that: such a server refuses to start, saying to
// give a token. With a token, user code calling back is refused (401).
#[tokio::test(flavor = "multi_thread")]
async fn finding_11_no_token_http_is_refused_where_user_code_reaches_loopback() {
    for (level, net) in [("none", false), ("none", true), ("landlock", true)] {
        let mut args = vec!["--sandbox", level];
        if net {
            args.push("--allow-network");
        }
        // Whether the level works here at all: with a token it must start.
        let with_token = match HttpServer::try_start(&args, &[("REPLBOX_TOKENS", TOKEN_A)]).await {
            Ok(s) => s,
            Err((status, log)) => {
                skip(format_args!(
                    "level {level} (network {net}) does not work here: {status}: {log}"
                ));
                continue;
            }
        };
        match HttpServer::try_start(&args, &[]).await {
            Ok(s) => {
                s.stop().await;
                panic!("level {level}, network {net}: served HTTP without a token");
            }
            Err((status, log)) => {
                assert!(
                    status.contains("exit status") && !status.contains("exit status: 0"),
                    "{level}/{net}: {status}"
                );
                assert!(
                    log.contains("without a token")
                        && log.contains("--token")
                        && log.contains("loopback")
                        && !log.contains("listening"),
                    "{level}/{net}: {log}"
                );
            }
        }
        // The attack through the server that does start: user code calls it back.
        let c = with_token.connect(TOKEN_A).await;
        let o = http_call(
            &c,
            "run-code",
            json!({"languageId": "bash", "code": call_back(&with_token.addr)}),
        )
        .await;
        // Refused by the token, or no way to the server at all.
        assert!(
            o.text == "HTTP/1.1 401 Unauthorized\n" || !o.text.contains("HTTP/1.1"),
            "{level}/{net}: {}",
            o.text
        );
        let _ = c.cancel().await;
        with_token.stop().await;
    }
    // Where user code cannot reach the host's loopback (bwrap, whose network namespace has
    // its own, even with network through the egress proxy; landlock without network), a
    // loopback server without a token still serves.
    for args in [
        &["--sandbox", "bwrap"][..],
        &["--sandbox", "bwrap", "--allow-network"],
        &["--sandbox", "landlock"],
    ] {
        let level = args.join(" ");
        match HttpServer::try_start(args, &[]).await {
            Ok(s) => s.stop().await,
            Err((status, log)) => {
                skip(format_args!(
                    "level {level} does not work here: {status}: {log}"
                ));
            }
        }
    }
}

// ----- Finding 11: stdio framing -----

/// A `replbox serve` child spoken to in raw lines.
struct RawStdio {
    srv: RawServer,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl RawStdio {
    async fn start(args: &[&str]) -> Self {
        let mut srv = Server::stdio().args(args).spawn_raw();
        let stdin = srv.child.stdin.take().expect("stdin");
        let stdout = BufReader::new(srv.child.stdout.take().expect("stdout")).lines();
        let mut s = Self { srv, stdin, stdout };
        s.send(br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#)
            .await;
        let init = s.next().await;
        assert_eq!(init["id"], 0, "{init}");
        assert!(init["result"]["serverInfo"].is_object(), "{init}");
        s.send(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
            .await;
        s
    }

    async fn send(&mut self, line: &[u8]) {
        self.stdin.write_all(line).await.expect("write");
        self.stdin.write_all(b"\n").await.expect("write");
        self.stdin.flush().await.expect("flush");
    }

    /// The next line on stdout, which must be one JSON-RPC message.
    async fn next(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(30), self.stdout.next_line())
            .await
            .expect("no answer within 30 s")
            .expect("read")
            .expect("stdout closed");
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("stdout carried a line that is not JSON ({e}): {line:?}"));
        assert_eq!(v["jsonrpc"], "2.0", "{line}");
        v
    }
}

// A line rmcp cannot read (not UTF-8, not JSON, too long, JSON that is no request) used to
// get no answer at all, so the client waited forever. Each now gets a JSON-RPC error (with
// the request's id where it can be read, null otherwise), stdout carries nothing but
// JSON-RPC, and the connection keeps working.
#[tokio::test(flavor = "multi_thread")]
async fn finding_11_stdio_lines_rmcp_cannot_read_get_json_rpc_errors() {
    let mut s = RawStdio::start(&["--max-line-bytes", "4096"]).await;
    let long_code = "x".repeat(10_000);
    let too_long = format!(
        r#"{{"jsonrpc":"2.0","id":"big-1","method":"tools/call","params":{{"name":"run-code","arguments":{{"languageId":"bash","code":"{long_code}"}}}}}}"#
    );
    // (line, expected code, expected id)
    let mut cases: Vec<(Vec<u8>, i64, Value)> = vec![
        (b"\xff\xfe not utf-8 at all".to_vec(), -32700, Value::Null),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/list\",\"params\":{\"x\":\"\xff\"}}"
                .to_vec(),
            -32700,
            json!(7),
        ),
        (b"this is not json".to_vec(), -32700, Value::Null),
        (
            br#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"#.to_vec(),
            -32700,
            json!(8),
        ),
        (too_long.into_bytes(), -32600, json!("big-1")),
        (
            br#"{"jsonrpc":"2.0","id":9,"method":42}"#.to_vec(),
            -32600,
            json!(9),
        ),
        (br#"[1,2,3]"#.to_vec(), -32600, Value::Null),
        (br#""just a string""#.to_vec(), -32600, Value::Null),
    ];
    // A line far past the limit, with no id in reach.
    let mut huge = vec![b'['; 3];
    huge.extend(std::iter::repeat_n(b' ', 100_000));
    cases.push((huge, -32600, Value::Null));
    for (line, _, _) in &cases {
        s.send(line).await;
    }
    // A notification that cannot be read gets no answer (JSON-RPC answers no notification).
    s.send(br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":5}"#)
        .await;
    s.send(br#"{"jsonrpc":"2.0","id":10,"method":"tools/list"}"#)
        .await;
    let mut answers = Vec::new();
    loop {
        let v = s.next().await;
        if v["id"] == 10 {
            assert!(v["result"]["tools"].is_array(), "{v}");
            break;
        }
        answers.push(v);
    }
    assert_eq!(
        answers.len(),
        cases.len(),
        "one answer per bad line: {answers:#?}"
    );
    for ((line, code, id), a) in cases.iter().zip(&answers) {
        let shown = String::from_utf8_lossy(&line[..line.len().min(60)]).into_owned();
        assert_eq!(a["error"]["code"], *code, "{shown}: {a}");
        assert_eq!(a["id"], *id, "{shown}: {a}");
        assert!(
            a["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{a}"
        );
    }
    let big = &answers[4]["error"]["message"];
    assert!(
        big.as_str()
            .is_some_and(|m| m.contains("4096") && m.contains("--max-line-bytes")),
        "{big}"
    );
    // A tool call after all that still works.
    s.send(br#"{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"run-code","arguments":{"languageId":"bash","code":"echo after"}}}"#)
        .await;
    let v = s.next().await;
    assert_eq!(v["id"], 11, "{v}");
    assert_eq!(v["result"]["structuredContent"]["stdout"], "after\n", "{v}");
    drop(s.stdin);
    let st = tokio::time::timeout(Duration::from_secs(20), s.srv.child.wait())
        .await
        .expect("the server ends when stdin closes")
        .expect("wait");
    assert!(st.success(), "{st}");
}

// ----- Finding 12: a bare `replbox` reads the REPLBOX_* variables -----

// A bare `replbox` is `replbox serve`: it used to take the built-in defaults and ignore the
// environment, so `REPLBOX_REQUIRE_SANDBOX=bwrap` with `REPLBOX_SANDBOX=none` served anyway.
#[tokio::test(flavor = "multi_thread")]
async fn finding_12_a_bare_replbox_reads_the_replbox_variables() {
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(BIN)
            .env("REPLBOX_SANDBOX", "none")
            .env("REPLBOX_REQUIRE_SANDBOX", "bwrap")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("a bare replbox with an unmet requirement must stop, not serve")
    .expect("run replbox");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{}", out.status);
    assert!(
        err.contains("below the required bwrap") && err.contains("--require-sandbox"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "stdout: {:?}", out.stdout);

    // And a limit from the environment applies to a bare replbox, through an MCP client.
    let s = Server::stdio()
        .bare()
        .env("REPLBOX_MAX_SESSIONS_PER_PRINCIPAL", "1")
        .start()
        .await;
    let o = s.call("session_start", json!({"language": "bash"})).await;
    assert!(!o.is_error, "{}", o.text);
    let o = s.call("session_start", json!({"language": "bash"})).await;
    assert!(
        o.is_error,
        "a second session past REPLBOX_MAX_SESSIONS_PER_PRINCIPAL=1: {}",
        o.text
    );
    assert!(o.text.contains("is 1"), "{}", o.text);
    s.stop().await;
}

// ----- Finding 12: token names -----

// A token named `local` got the stdio principal's rights (copying host files into a
// session with `files[].path`). Names that could collide with an internal principal are
// refused when tokens are loaded.
#[tokio::test(flavor = "multi_thread")]
async fn finding_12_a_token_named_like_the_local_principal_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    for name in ["local", "LOCAL", "Local"] {
        let file = dir.path().join(format!("tokens-{name}"));
        std::fs::write(
            &file,
            format!("# team\nalice:{TOKEN_B}\n{name}:{TOKEN_A}\n"),
        )
        .expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let path = file.to_str().expect("UTF-8");
        match HttpServer::try_start(&["--tokens-file", path], &[]).await {
            Ok(s) => {
                s.stop().await;
                panic!("a token named {name:?} was accepted");
            }
            Err((status, log)) => {
                assert!(!status.contains("exit status: 0"), "{name}: {status}");
                assert!(
                    log.contains(&format!("{path} line 3"))
                        && log.contains("reserved")
                        && log.contains("local"),
                    "{name}: {log}"
                );
            }
        }
    }
}

// ----- Finding 7: a fair share of sessions and runs per principal -----

/// Bash that sleeps in a process whose command line is `sleep {needle}` (found on the host
/// with `processes_with`), then says so.
fn sleeper(needle: &str) -> String {
    format!("sleep {needle}; echo woke")
}

/// Wait (bounded) until `n` processes run `sleep {needle}`; their pids.
async fn wait_sleepers(needle: &str, n: usize) -> Vec<i32> {
    let what = format!("sleep {needle}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let pids = processes_with(&what);
        if pids.len() >= n {
            return pids;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{n} × `{what}` not running within 60 s (found {pids:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn kill_all(pids: &[i32]) {
    for &pid in pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// A refusal of the per-principal cap: an error of kind `limit` that says which limit,
/// how many the caller holds and what to do.
fn assert_cap_refusal(o: &Out, cap: usize, sessions: usize, runs: usize, what: &str) {
    assert!(o.is_error, "{what}: not refused: {}", o.text);
    assert_eq!(
        o.structured["error"]["kind"], "limit",
        "{what}: {}",
        o.structured
    );
    for part in [
        format!("{cap} of the {cap}"),
        format!("{sessions} session(s) open or starting"),
        format!("{runs} run-code call(s) running"),
        "--max-active-per-principal".to_string(),
        "session_close".to_string(),
    ] {
        assert!(o.text.contains(&part), "{what}: no {part:?} in {}", o.text);
    }
}

// One principal could take every sandbox uid with concurrent sleeping runs, and every other
// caller's session_start failed. Each principal now holds at most
// --max-active-per-principal sessions and runs together: past it, its calls are refused
// naming the limit, and other principals are unaffected.
#[tokio::test(flavor = "multi_thread")]
async fn finding_7_one_principal_cannot_take_every_uid_over_http() {
    let tokens = format!("{TOKEN_A},{TOKEN_B}");
    for (i, level) in ALL.iter().enumerate() {
        // 5 uids: A's 3, and B's session and run; a range no other test's server uses
        // (servers share the uids of a range).
        let base = (171_000 + 10 * i).to_string();
        let args = [
            "--sandbox",
            level,
            "--uids",
            "5",
            "--uid-base",
            &base,
            "--max-active-per-principal",
            "3",
        ];
        let s = match HttpServer::try_start(&args, &[("REPLBOX_TOKENS", &tokens)]).await {
            Ok(s) => s,
            Err((status, log)) => {
                skip(format_args!(
                    "level {level} does not work here: {status}: {log}"
                ));
                continue;
            }
        };
        let a = s.connect(TOKEN_A).await;
        let b = s.connect(TOKEN_B).await;
        let started = http_call(&a, "session_start", json!({"language": "bash"})).await;
        assert!(!started.is_error, "{level}: {}", started.text);
        let session = started.s("session_id").to_string();
        let needle = format!("31.7{i}");
        let mut runs = Vec::new();
        for _ in 0..2 {
            let peer = a.peer().clone();
            let code = sleeper(&needle);
            runs.push(tokio::spawn(async move {
                http_call(
                    &peer,
                    "run-code",
                    json!({"languageId": "bash", "code": code}),
                )
                .await
            }));
        }
        let sleeping = wait_sleepers(&needle, 2).await;

        // A holds its 3: its next run and its next session are refused, naming the cap.
        let o = http_call(
            &a,
            "run-code",
            json!({"languageId": "bash", "code": "echo x"}),
        )
        .await;
        assert_cap_refusal(&o, 3, 1, 2, &format!("{level}: A's run-code"));
        let o = http_call(&a, "session_start", json!({"language": "bash"})).await;
        assert_cap_refusal(&o, 3, 1, 2, &format!("{level}: A's session_start"));

        // B is unaffected.
        let o = http_call(&b, "session_start", json!({"language": "bash"})).await;
        assert!(!o.is_error, "{level}: B's session_start: {}", o.text);
        let o = http_call(
            &b,
            "session_eval",
            json!({"session_id": o.s("session_id"), "code": "echo $((6*7))"}),
        )
        .await;
        assert_eq!(o.structured["status"], "ok", "{level}: {}", o.text);
        assert!(o.text.contains("42"), "{level}: {}", o.text);
        let o = http_call(
            &b,
            "run-code",
            json!({"languageId": "bash", "code": "echo from-b"}),
        )
        .await;
        assert!(!o.is_error, "{level}: B's run-code: {}", o.text);
        assert_eq!(o.text, "from-b\n", "{level}");

        // A share comes back when A closes its session.
        let o = http_call(&a, "session_close", json!({"session_id": session})).await;
        assert!(!o.is_error, "{level}: {}", o.text);
        let o = http_call(
            &a,
            "run-code",
            json!({"languageId": "bash", "code": "echo again"}),
        )
        .await;
        assert!(
            !o.is_error,
            "{level}: A's run-code after a close: {}",
            o.text
        );
        assert_eq!(o.text, "again\n", "{level}");

        kill_all(&sleeping);
        for r in runs {
            let o = r.await.expect("run task");
            assert!(o.text.contains("woke"), "{level}: {}", o.text);
        }
        let _ = a.cancel().await;
        let _ = b.cancel().await;
        s.stop().await;
    }
}

// Over stdio the single principal is capped as well, with the same clear refusal.
#[tokio::test(flavor = "multi_thread")]
async fn finding_7_the_stdio_principal_is_capped_too() {
    for (i, setup) in setups(ALL).into_iter().enumerate() {
        let uid = uid_for(setup);
        let base = (172_000 + 10 * i).to_string();
        let args = ["--max-active-per-principal", "2", "--uid-base", &base];
        let Some(s) = start_as(setup, uid, &args, &[]).await else {
            continue;
        };
        let session = s.start_session("bash").await;
        let needle = format!("32.7{i}");
        let slow = s.call(
            "run-code",
            json!({"languageId": "bash", "code": sleeper(&needle)}),
        );
        let checks = async {
            let sleeping = wait_sleepers(&needle, 1).await;
            let o = s
                .call("run-code", json!({"languageId": "bash", "code": "echo x"}))
                .await;
            assert_cap_refusal(&o, 2, 1, 1, &format!("{setup:?}: run-code"));
            let o = s.call("session_start", json!({"language": "bash"})).await;
            assert_cap_refusal(&o, 2, 1, 1, &format!("{setup:?}: session_start"));
            // The session itself still works.
            let o = s.eval(&session, "echo $((6*7))").await;
            assert!(o.text.contains("42"), "{setup:?}: {}", o.text);
            kill_all(&sleeping);
        };
        let (slow, ()) = tokio::join!(slow, checks);
        assert!(slow.text.contains("woke"), "{setup:?}: {}", slow.text);
        // Both shares are back once the run ended and the session is closed.
        let o = s
            .call("session_close", json!({"session_id": session}))
            .await;
        assert!(!o.is_error, "{setup:?}: {}", o.text);
        let two = tokio::join!(s.run("bash", "echo one"), s.run("bash", "echo two"));
        assert_eq!(
            (two.0.text.as_str(), two.1.text.as_str()),
            ("one\n", "two\n"),
            "{setup:?}"
        );
        s.stop().await;
    }
}

/// GET /metrics with a token; the value of the sample line that begins with `name`.
async fn metric(addr: &str, token: &str, name: &str) -> Option<f64> {
    use tokio::io::AsyncReadExt;
    let mut c = tokio::net::TcpStream::connect(addr).await.ok()?;
    let req = format!(
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    c.write_all(req.as_bytes()).await.ok()?;
    let mut body = String::new();
    c.read_to_string(&mut body).await.ok()?;
    body.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

// The warm pool's interpreters hold uids too. When they hold every uid, a caller's session
// or run stops one and takes its uid, rather than being refused.
#[tokio::test(flavor = "multi_thread")]
async fn finding_7_the_warm_pool_yields_its_uids_to_callers() {
    if !we_are_root() {
        skip("uids are leased only when the server runs as root");
        return;
    }
    for (i, level) in ALL.iter().enumerate() {
        // As root at level none there is no warm pool (a run's uid is bound to its caller
        // before it starts: docs/security.md, Uids and principals), so nothing to yield.
        if *level == "none" {
            continue;
        }
        let base = 173_000 + 10 * i as u32;
        unbind_test_uids(base, 4);
        let base = base.to_string();
        // 4 uids: the pool takes 2 (it leaves a quarter, at least 2, free for callers).
        let args = ["--sandbox", level, "--uids", "4", "--uid-base", &base];
        let s = match HttpServer::try_start(
            &args,
            &[("REPLBOX_TOKENS", TOKEN_A), ("REPLBOX_POOL", "2")],
        )
        .await
        {
            Ok(s) => s,
            Err((status, log)) => {
                skip(format_args!(
                    "level {level} does not work here: {status}: {log}"
                ));
                continue;
            }
        };
        // The pools (of every pooled language, refilling at once) fill in the background:
        // wait (bounded) until they hold 2 uids, then watch them a while longer. They never
        // hold more: each start checks for short uids and takes one in one step (several
        // starts used to pass the check before any took a uid, and took all 4).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let mut full = None;
        while tokio::time::Instant::now() < deadline {
            let uids = metric(&s.addr, TOKEN_A, "replbox_uids_in_use").await;
            assert!(
                uids.is_none_or(|u| u <= 2.0),
                "{level}: the pools hold {uids:?} of the 4 uids"
            );
            match full {
                None if uids.is_some_and(|u| u >= 2.0) => {
                    full = Some(tokio::time::Instant::now() + Duration::from_secs(3));
                }
                Some(until) if tokio::time::Instant::now() > until => break,
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let full = full.is_some();
        let c = s.connect(TOKEN_A).await;
        if !full {
            let o = http_call(
                &c,
                "run-code",
                json!({"languageId": "python", "code": "print(1)"}),
            )
            .await;
            let why = format!(
                "level {level}: python's warm pool did not fill here: {}",
                o.text
            );
            // At levels without a mount namespace, a python the pool's uids cannot reach
            // (pyenv under /root) has no pool, whatever the host installed.
            if o.text.contains("not reachable") {
                skip_optional(why.to_string());
            } else {
                skip(why);
            }
            let _ = c.cancel().await;
            s.stop().await;
            continue;
        }
        // Two sessions take what is free (if anything); what follows needs the pools' uids.
        for _ in 0..2 {
            let o = http_call(&c, "session_start", json!({"language": "bash"})).await;
            assert!(!o.is_error, "{level}: a session on a free uid: {}", o.text);
        }
        let o = http_call(&c, "session_start", json!({"language": "bash"})).await;
        assert!(
            !o.is_error,
            "{level}: session_start with the pool full: {}",
            o.text
        );
        let o = http_call(
            &c,
            "run-code",
            json!({"languageId": "bash", "code": "echo ran"}),
        )
        .await;
        assert!(
            !o.is_error,
            "{level}: run-code with the pool full: {}",
            o.text
        );
        assert_eq!(o.text, "ran\n", "{level}");
        let _ = c.cancel().await;
        s.stop().await;
    }
}

// ----- session_input's deadline covers typing the answer -----

// Finding (low): `session_input` typed its whole answer before its deadline started to
// count, so an answer larger than the terminal's input buffer, typed into a program that
// read one line and went on with other work, held the call until the program read the
// rest (12-18 s against a 2 s `timeout_ms`; here, forever). The deadline now covers the
// whole call: what could not be typed in time is not, the evaluation times out as it
// would while running, the result says how much was typed, and the session goes on.
#[tokio::test(flavor = "multi_thread")]
async fn finding_r3_7_session_inputs_deadline_covers_typing_a_large_answer() {
    if !require("python", "python3") {
        return;
    }
    let srv = TestServer::start().await;
    let id = srv.start_session("python").await;
    let o = srv
        .eval(&id, "line = input('? ')\nimport time\ntime.sleep(3600)")
        .await;
    assert_eq!(status(&o), "awaiting_input", "{}", o.text);
    // 2,000 lines of 1,000 bytes (and Enter): the program reads the first, the terminal
    // holds a few KiB.
    let text = vec!["y".repeat(1000); 2000].join("\n");
    let call = srv.call(
        "session_input",
        json!({"session_id": id, "text": text, "timeout_ms": 2000}),
    );
    // Not a timing assertion: a bound far past the deadline, so that a call that waits for
    // the program fails here instead of hanging the test.
    let o = tokio::time::timeout(Duration::from_secs(90), call)
        .await
        .expect("session_input did not answer: its deadline did not cover typing the answer");
    assert_eq!(status(&o), "timeout", "{}", o.text);
    assert!(
        o.text
            .contains("of the answer's 2002000 bytes were typed before the deadline"),
        "the result says the answer was cut: {}",
        o.text
    );
    // The session goes on, and nothing left of the answer runs as code.
    let o = srv.eval(&id, "print(6 * 7)").await;
    assert_eq!((status(&o), output(&o)), ("ok", "42\n"), "{}", o.text);
    srv.stop().await;
}
