//! The helper (`replbox-exec`) as the server drives it, through `exec::spawn` at level `none`:
//! what reaches the program and what stays out of the helper, and how a killed tree is
//! reported. Then the same end through MCP: closing a session.

use crate::common;

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use replbox::api::{Jail, Level, Limits, Mode, Sandbox, Settings, SpawnSpec, Stdio3, spawn};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const HELPER: &str = env!("CARGO_BIN_EXE_replbox-exec");

/// A sandbox at level `none` using the built helper, with its own uid range.
fn sandbox(work: &std::path::Path) -> Sandbox {
    replbox::api::set_helper_exe(PathBuf::from(HELPER));
    let settings = Settings {
        mode: Mode::None,
        require: None,
        egress: Default::default(),
        limits: Limits {
            memory_mb: 0,
            processes: 0,
            file_size_mb: 0,
            open_files: 256,
            cpu_s: 0,
            tmpfs_mb: 16,
        },
        masks: Vec::new(),
        expose: Vec::new(),
        uid_base: 240_000,
        uids: 8,
        uids_per_principal: 0,
    };
    let sb = Sandbox::probe(&settings).finish(work).expect("sandbox");
    assert_eq!(sb.level, Level::None);
    sb
}

fn spec(argv: &[&str], env: &[(&str, &str)], cwd: PathBuf, jail: Jail) -> SpawnSpec {
    SpawnSpec {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        cwd,
        stdio: Stdio3::Pipes,
        jail,
    }
}

/// The program gets exactly its environment and arguments; the helper, alive meanwhile,
/// has neither in its own environment or command line.
#[tokio::test(flavor = "multi_thread")]
async fn the_programs_values_stay_out_of_the_helper() {
    let work = tempfile::tempdir().expect("tempdir");
    let sb = sandbox(work.path());
    let mut proc = spawn(
        &sb,
        spec(
            &[
                "sh",
                "-c",
                "read x; /usr/bin/env; echo \"$0 $x\"",
                "secret-arg",
            ],
            &[("CALLER_VAR", "secret-value"), ("PATH", "/nowhere")],
            work.path().to_path_buf(),
            Jail::default(),
        ),
    )
    .expect("spawn");
    let helper = proc.helper_pid().expect("helper pid");
    let environ = std::fs::read(format!("/proc/{helper}/environ")).expect("environ");
    let cmdline = String::from_utf8_lossy(
        &std::fs::read(format!("/proc/{helper}/cmdline")).expect("cmdline"),
    )
    .replace('\0', " ");
    assert!(environ.is_empty(), "{}", String::from_utf8_lossy(&environ));
    assert!(!cmdline.contains("secret"), "{cmdline}");
    assert!(cmdline.contains("--program-fd"), "{cmdline}");
    let mut stdin = proc.child.stdin.take().expect("stdin");
    stdin.write_all(b"typed\n").await.expect("write");
    drop(stdin);
    let mut out = String::new();
    let mut stdout = proc.child.stdout.take().expect("stdout");
    stdout.read_to_string(&mut out).await.expect("read");
    let status = proc.wait().await.expect("wait");
    assert_eq!(status.code(), Some(0), "{out}");
    let mut lines: Vec<&str> = out.lines().collect();
    let last = lines.pop();
    lines.sort();
    // sh adds PWD (and may add SHLVL or `_`); what the caller set is there as given.
    assert!(lines.contains(&"CALLER_VAR=secret-value"), "{out}");
    assert!(lines.contains(&"PATH=/nowhere"), "{out}");
    assert!(
        lines
            .iter()
            .all(|l| ["CALLER_VAR=", "PATH=", "PWD=", "SHLVL=", "_="]
                .iter()
                .any(|p| l.starts_with(p))),
        "{out}"
    );
    assert_eq!(last, Some("secret-arg typed"), "{out}");
}

/// A program name without a slash is looked up on the server's PATH, not the caller's.
#[tokio::test(flavor = "multi_thread")]
async fn the_callers_path_does_not_choose_the_program() {
    let work = tempfile::tempdir().expect("tempdir");
    let sb = sandbox(work.path());
    // A fake `env` in a directory the caller names first on its PATH.
    let fake = work.path().join("env");
    std::fs::write(&fake, "#!/bin/sh\necho fake\n").expect("fake");
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let path = format!("{}:/usr/bin:/bin", work.path().display());
    let mut proc = spawn(
        &sb,
        spec(
            &["env"],
            &[("PATH", &path)],
            work.path().to_path_buf(),
            Jail::default(),
        ),
    )
    .expect("spawn");
    drop(proc.child.stdin.take());
    let mut out = String::new();
    let mut stdout = proc.child.stdout.take().expect("stdout");
    stdout.read_to_string(&mut out).await.expect("read");
    proc.wait().await.expect("wait");
    assert_eq!(out, format!("PATH={path}\n"));
}

/// Killing a tree (what closing a session does) reports the program's own end, a death by
/// SIGKILL, and a tree seen gone: the lease is not marked dirty (before, the helper's sweep
/// reaped the program first, lost its status, and exited 143 without a record).
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_tree_reports_the_programs_end_and_a_clean_tree() {
    let work = tempfile::tempdir().expect("tempdir");
    let sb = sandbox(work.path());
    let dirty = Arc::new(AtomicBool::new(false));
    let jail = Jail {
        dirty: Some(dirty.clone()),
        ..Jail::default()
    };
    let mut proc = spawn(
        &sb,
        spec(
            &["sh", "-c", "sleep 1000 & sleep 1000; wait"],
            &[],
            work.path().to_path_buf(),
            jail,
        ),
    )
    .expect("spawn");
    let helper = proc.helper_pid().expect("helper") as i32;
    // The program and its child have started.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while descendants(helper).len() < 3 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let tree = descendants(helper);
    assert_eq!(tree.len(), 3, "{tree:?}");
    let status = proc.kill_tree().await.expect("status");
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert!(!dirty.load(Ordering::Relaxed), "the lease was marked dirty");
    assert!(wait_gone(&tree, Duration::from_secs(5)).await.is_empty());
}

/// The helper started without a program says what is missing and runs nothing.
#[test]
fn the_helper_refuses_to_start_without_a_program() {
    let mut child = std::process::Command::new(HELPER)
        .args(replbox_exec::ExecArgs::default().to_args())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let status = child.wait().expect("wait");
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    assert_eq!(status.code(), Some(127));
    assert!(err.contains("no program descriptor"), "{err}");
}

/// Closing a session reports a clean end: the interpreter killed (no exit code), not the
/// helper's own 143.
#[tokio::test(flavor = "multi_thread")]
async fn closing_a_session_reports_a_clean_end() {
    if !require("python", "python3") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("python").await;
    let o = s.eval(&id, "x = 1").await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    let o = s.call("session_close", json!({"session_id": id})).await;
    assert!(!o.is_error, "{}", o.text);
    assert_eq!(o.structured["closed"], true, "{}", o.structured);
    assert_eq!(
        o.structured["exit_code"],
        serde_json::Value::Null,
        "{}",
        o.structured
    );
    s.stop().await;
}

/// Without `replbox-exec` beside it (and no REPLBOX_HELPER), the server does not start, and
/// says what is missing.
#[test]
fn the_server_refuses_to_start_without_its_helper() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let lone = dir.path().join("replbox");
    if std::fs::hard_link(BIN, &lone).is_err() {
        std::fs::copy(BIN, &lone).expect("copy the server");
    }
    let out = std::process::Command::new(&lone)
        .arg("languages")
        .env_remove("REPLBOX_HELPER")
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("{}/replbox-exec", dir.path().display())) && err.contains("missing"),
        "{err}"
    );
}

/// Closing a session while an evaluation holds its interpreter signals the session's own
/// helper: the evaluation ends, the tree is gone, and the server still answers.
#[tokio::test(flavor = "multi_thread")]
async fn closing_a_busy_session_ends_its_tree_and_nothing_else() {
    if !require("python", "python3") {
        return;
    }
    let s = std::sync::Arc::new(Server::stdio().start().await);
    let id = s.start_session("python").await;
    let before = s.descendants();
    let (s2, id2) = (s.clone(), id.clone());
    let eval = tokio::spawn(async move {
        s2.eval_t(&id2, "import time\ntime.sleep(600)", 600_000)
            .await
    });
    // Busy once the evaluation holds the interpreter.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let l = s.call("session_list", json!({})).await;
        if l.structured["sessions"][0]["busy"] == true {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never busy: {}",
            l.text
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let o = s.call("session_close", json!({"session_id": id})).await;
    assert_eq!(o.structured["closed"], true, "{}", o.text);
    let e = tokio::time::timeout(Duration::from_secs(20), eval)
        .await
        .expect("the evaluation returned")
        .expect("task");
    assert_ne!(status(&e), "ok", "{}", e.text);
    assert!(wait_gone(&before, Duration::from_secs(5)).await.is_empty());
    let l = s.call("session_list", json!({})).await;
    assert!(
        !l.is_error
            && l.structured["sessions"]
                .as_array()
                .is_some_and(Vec::is_empty),
        "{}",
        l.text
    );
    match std::sync::Arc::try_unwrap(s) {
        Ok(s) => s.stop().await,
        Err(_) => panic!("the server is still shared"),
    }
}
