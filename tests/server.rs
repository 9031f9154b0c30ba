//! Server identity, the stdio channel and shutdown.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

#[tokio::test(flavor = "multi_thread")]
async fn identity_and_instructions() {
    let s = Server::stdio().start().await;
    let info = s.client.peer_info().expect("server info");
    let server = info.server_info.clone().expect("serverInfo");
    assert_eq!(server.name, "replbox");
    assert_eq!(server.version, env!("CARGO_PKG_VERSION"));
    let instructions = info.instructions.clone().unwrap_or_default();
    assert!(instructions.contains("run-code"), "{instructions}");
    assert!(instructions.contains("python"), "{instructions}");
    let tools = s.client.list_all_tools().await.unwrap();
    let run = tools.iter().find(|t| t.name == "run-code").unwrap();
    assert!(
        run.output_schema.is_some(),
        "run-code declares an output schema"
    );
    s.stop().await;
}

/// Drive the server by hand and check every byte it writes to stdout is JSON-RPC.
#[test]
fn stdout_carries_only_json_rpc_and_eof_ends_the_server() {
    let mut child = Command::new(BIN)
        .arg("serve")
        .env("REPLBOX_LOG", "debug") // plenty of logs, which must all go to stderr
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let requests = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
        r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"run-code","arguments":{"languageId":"shellscript","code":"echo to-stdout; echo to-stderr >&2"}}}"#,
        r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"no-such-tool","arguments":{}}}"#,
    ];
    for r in requests {
        writeln!(stdin, "{r}").unwrap();
    }
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let mut seen = std::collections::HashSet::new();
    let mut lines = stdout.lines();
    while seen.len() < 4 {
        let line = lines.next().expect("server closed stdout early").unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert_eq!(v["jsonrpc"], "2.0", "{line}");
        if let Some(id) = v["id"].as_i64() {
            seen.insert(id);
            if id == 3 {
                let text = v["result"]["content"][0]["text"].as_str().unwrap();
                assert!(
                    text.contains("to-stdout") && text.contains("to-stderr"),
                    "{text}"
                );
            }
        }
    }
    // stdin EOF ends the server promptly.
    drop(stdin);
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "server did not exit on EOF"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "{status:?}");
    for line in lines {
        let line = line.unwrap();
        serde_json::from_str::<serde_json::Value>(&line)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_ends_the_server_with_no_child_left() {
    let s = Server::stdio().start().await;
    let pid = s.pid as i32;
    // Leave a long-running program in flight.
    let client = std::sync::Arc::new(s);
    let c2 = client.clone();
    let inflight = tokio::spawn(async move {
        let _ = c2
            .call(
                "run-code",
                serde_json::json!({"languageId": "shellscript", "code": "sleep 60", "timeout_ms": 60000}),
            )
            .await;
    });
    // Wait until the program is running.
    let t = Instant::now();
    while descendants(pid).len() < 2 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "program never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let children = descendants(pid);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let t = Instant::now();
    while alive(pid) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "server did not exit on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Every process it had started is gone too.
    let left = wait_gone(&children, Duration::from_secs(3)).await;
    assert!(left.is_empty(), "left behind: {left:?}");
    inflight.abort();
}

#[test]
fn malformed_prompt_file_names_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("broken.toml"),
        "id = 'broken'\nname = 'B'\nprograms = ['true']\n[run]\nfile = 'x'\ncommand = []\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["languages", "--prompts"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("broken.toml"), "{err}");
    assert!(err.contains("run.command"), "{err}");
}

#[test]
fn prompts_dir_adds_a_language_without_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("shout.toml"),
        "id = 'shout'\nname = 'Shout'\naliases = ['loud']\nprograms = ['bash']\n[run]\nfile = 'main.txt'\ncommand = ['{exe}', '-c', 'tr a-z A-Z < main.txt']\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["run", "loud", "hello", "--prompts"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "HELLO");
    let list = Command::new(BIN)
        .args(["languages", "--prompts"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&list.stdout).contains("shout"));
}

#[test]
fn cli_run_mirrors_the_exit_status() {
    let out = Command::new(BIN)
        .args(["run", "python", "import sys; print('x'); sys.exit(7)"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "x\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("[exit code 7]"));
    let out = Command::new(BIN)
        .args(["run", "shellscript", "--timeout-ms", "300", "sleep 5"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(124));
}
