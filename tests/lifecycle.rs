//! Waiting for input, idle reaping, limits, cancellation, progress and long work, through a
//! real MCP client.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use rmcp::model::{CallToolRequestParams, ClientRequest, Request};
use rmcp::service::PeerRequestOptions;
use serde_json::{Value, json};

async fn start(s: &TestServer, lang: &str, extra: Value) -> String {
    let mut args = json!({"language": lang});
    if let (Some(a), Some(e)) = (args.as_object_mut(), extra.as_object()) {
        a.extend(e.clone());
    }
    let o = s.call("session_start", args).await;
    assert!(!o.is_error, "session_start {lang}: {}", o.text);
    o.s("session_id").to_string()
}

async fn eval(s: &TestServer, id: &str, code: &str) -> Out {
    s.call("session_eval", json!({"session_id": id, "code": code}))
        .await
}

async fn list(s: &TestServer) -> Vec<Value> {
    s.call("session_list", json!({})).await.structured["sessions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

struct InputCase {
    /// Code that asks for a line and then prints something with it.
    ask: &'static str,
    prompt: &'static str,
    answered: &'static str,
    /// Code that reads a line without a prompt (a plain read of stdin).
    plain_read: &'static str,
    plain_answered: &'static str,
    sleep: &'static str,
    /// Another question, to be interrupted.
    ask_again: &'static str,
    set_x: &'static str,
    read_x: &'static str,
}

fn input_case(lang: &str) -> InputCase {
    match lang {
        "python" => InputCase {
            ask: "name = input('Name? ')\nprint('hello', name)",
            prompt: "Name? ",
            answered: "hello Ada\n",
            plain_read: "import sys\nline = sys.stdin.readline()\nprint(repr(line))",
            plain_answered: "'plain text\\n'\n",
            sleep: "import time; time.sleep(1.2); print('slept')",
            ask_again: "input('Again? ')",
            set_x: "x = 7",
            read_x: "x",
        },
        "javascript" => InputCase {
            ask: "const rl = require('readline').createInterface({input: process.stdin, output: process.stdout})\nconst name = await new Promise(r => rl.question('Name? ', r))\nrl.close()\nconsole.log('hello', name)",
            prompt: "Name? ",
            answered: "hello Ada\n",
            plain_read: "const rl2 = require('readline').createInterface({input: process.stdin})\nconst line = await new Promise(r => rl2.once('line', r))\nrl2.close()\nconsole.log(JSON.stringify(line))",
            plain_answered: "\"plain text\"\n",
            sleep: "await new Promise(r => setTimeout(r, 1200)); console.log('slept')",
            ask_again: "await new Promise(r => require('readline').createInterface({input: process.stdin, output: process.stdout}).question('Again? ', r))",
            set_x: "var x = 7",
            read_x: "x",
        },
        "ruby" => InputCase {
            ask: "print 'Name? '\nname = gets.chomp\nputs \"hello #{name}\"\nnil",
            prompt: "Name? ",
            answered: "hello Ada\n",
            plain_read: "line = STDIN.readline\np line\nnil",
            plain_answered: "\"plain text\\n\"\n",
            sleep: "sleep 1.2; puts 'slept'",
            ask_again: "print 'Again? '; gets",
            set_x: "x = 7; nil",
            read_x: "puts x",
        },
        "haskell" => InputCase {
            ask: "putStr \"Name? \"\nname <- getLine\nputStrLn (\"hello \" ++ name)",
            prompt: "Name? ",
            answered: "hello Ada\n",
            plain_read: "line <- getLine\nprint line",
            plain_answered: "\"plain text\"\n",
            sleep: "Control.Concurrent.threadDelay 1200000 >> putStrLn \"slept\"",
            ask_again: "putStr \"Again? \" >> getLine",
            set_x: "let x = 7",
            read_x: "x",
        },
        "shellscript" => InputCase {
            ask: "read -p 'Name? ' name\necho \"hello $name\"",
            prompt: "Name? ",
            answered: "hello Ada\n",
            plain_read: "read -r line\necho \"[$line]\"",
            plain_answered: "[plain text]\n",
            sleep: "sleep 1.2; echo slept",
            ask_again: "read -p 'Again? ' again",
            set_x: "x=7",
            read_x: "echo $x",
        },
        other => panic!("no input case for {other}"),
    }
}

per_lang!(
    waiting_for_input_is_detected_answered_and_interruptible,
    [python, javascript, ruby, haskell, shellscript],
    |lang| {
        let s = Server::stdio().start().await;
        let c = input_case(lang);
        let id = start(&s, lang, json!({})).await;
        eval(&s, &id, c.set_x).await;

        // Blocked on input: reported as waiting, not left to run into its deadline (the
        // default, 30 s), with the prompt printed so far. Not bounded by the test's clock:
        // beside three CPU hogs on two cores the answer took 0.40-0.66 s, and a busier
        // machine stretches that.
        let o = eval(&s, &id, c.ask).await;
        assert_eq!(status(&o), "awaiting_input", "{lang}: {}", o.text);
        assert!(!o.is_error, "{lang}: awaiting input is not an error");
        assert!(output(&o).ends_with(c.prompt), "{lang}: {:?}", output(&o));
        assert!(o.text.contains("session_input"), "{lang}: {}", o.text);
        let eval_id = o.structured["eval_id"].clone();
        let l = list(&s).await;
        let row = l.iter().find(|r| r["session_id"] == id.as_str()).unwrap();
        assert_eq!(row["awaiting_input"], true, "{lang}");

        // More code is refused with a message that says what to do.
        let o = eval(&s, &id, "1").await;
        assert_eq!(o.error_kind(), "awaiting_input", "{lang}: {}", o.text);
        assert_eq!(o.structured["error"]["eval_id"], eval_id, "{lang}");
        assert!(o.text.contains("session_input"), "{lang}: {}", o.text);

        // The answer continues the same evaluation.
        let o = s
            .call("session_input", json!({"session_id": id, "text": "Ada"}))
            .await;
        assert_eq!(status(&o), "ok", "{lang}: {}", o.text);
        assert_eq!(o.structured["eval_id"], eval_id, "{lang}");
        assert!(output(&o).ends_with(c.answered), "{lang}: {:?}", output(&o));

        // A plain read of stdin.
        let o = eval(&s, &id, c.plain_read).await;
        assert_eq!(status(&o), "awaiting_input", "{lang}: {}", o.text);
        let o = s
            .call(
                "session_input",
                json!({"session_id": id, "text": "plain text\n"}),
            )
            .await;
        assert_eq!(output(&o), c.plain_answered, "{lang}");

        // Sleeping is not waiting for input.
        let o = eval(&s, &id, c.sleep).await;
        assert_eq!((status(&o), output(&o)), ("ok", "slept\n"), "{lang}");

        // Interrupting a program that waits for input keeps the session's state.
        let o = eval(&s, &id, c.ask_again).await;
        assert_eq!(status(&o), "awaiting_input", "{lang}: {}", o.text);
        let o = s.call("session_interrupt", json!({"session_id": id})).await;
        assert!(!o.is_error, "{lang}: {}", o.text);
        assert_eq!(o.structured["interrupted"], true, "{lang}");
        assert!(
            o.structured["result"]["status"].is_string(),
            "{lang}: {}",
            o.structured
        );
        let o = eval(&s, &id, c.read_x).await;
        assert_eq!(
            (status(&o), output(&o)),
            ("ok", "7\n"),
            "{lang}: state kept"
        );

        // Answering a session that is not waiting is a clear error.
        let o = s
            .call("session_input", json!({"session_id": id, "text": "x"}))
            .await;
        assert_eq!(o.error_kind(), "not_awaiting_input", "{lang}: {}", o.text);
        s.stop().await;
    }
);

#[tokio::test(flavor = "multi_thread")]
async fn idle_sessions_are_reaped() {
    if !require("python", "python3") {
        return;
    }
    // An ended session's directory is kept a second, read-only, then removed.
    let s = TestServer::start_with(&["--keep-files-s", "1"], &[]).await;
    let o = s
        .call(
            "session_start",
            json!({"language": "python", "idle_timeout_s": 1}),
        )
        .await;
    assert_eq!(o.structured["idle_timeout_s"], 1);
    let id = o.s("session_id").to_string();
    let pid = o.structured["pid"].as_i64().unwrap() as i32;
    let cwd = std::path::PathBuf::from(o.s("cwd"));
    // Listed at once: a second session's start may take longer than the 1 s of idleness
    // on a loaded host.
    let l = list(&s).await;
    let row = l.iter().find(|r| r["session_id"] == id.as_str()).unwrap();
    assert!(row["expires_in_s"].as_u64().unwrap() <= 1);
    assert_eq!(row["idle_timeout_s"], 1);
    let kept = start(&s, "python", json!({})).await;
    // Gone within a few seconds, process and directory included.
    let t = Instant::now();
    while list(&s)
        .await
        .iter()
        .any(|r| r["session_id"] == id.as_str())
    {
        assert!(t.elapsed() < Duration::from_secs(5), "not reaped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let t = Instant::now();
    while alive(pid) || cwd.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "process or directory survived reaping"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let o = eval(&s, &id, "1").await;
    assert_eq!(o.error_kind(), "ended_session", "{}", o.text);
    assert!(
        o.text.contains("idleness")
            && o.text.contains("s without use")
            && o.text.contains("session_start"),
        "{}",
        o.text
    );
    // The other session (default idle timeout) is still there.
    let o = eval(&s, &kept, "1 + 1").await;
    assert_eq!(output(&o), "2\n");
    let l = list(&s).await;
    assert_eq!(l.len(), 1);
    assert_eq!(l[0]["idle_timeout_s"], 1800);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_session_limit_refuses_or_evicts() {
    if !require("python", "python3") {
        return;
    }
    let s = TestServer::start_with(&["--max-sessions", "2"], &[]).await;
    let a = start(&s, "python", json!({})).await;
    let _b = start(&s, "python", json!({})).await;
    eval(&s, &a, "1").await; // a was used last: b is the idlest
    let o = s.call("session_start", json!({"language": "python"})).await;
    assert_eq!(o.error_kind(), "limit", "{}", o.text);
    assert!(o.text.contains("allows 2"), "{}", o.text);
    assert!(o.text.contains(&_b), "names the idlest session: {}", o.text);
    s.stop().await;

    let s = TestServer::start_with(&["--max-sessions", "2", "--evict-idle"], &[]).await;
    let a = start(&s, "python", json!({})).await;
    let b = start(&s, "python", json!({})).await;
    eval(&s, &a, "1").await;
    let c = start(&s, "python", json!({})).await;
    let ids: Vec<String> = list(&s)
        .await
        .iter()
        .map(|r| r["session_id"].as_str().unwrap().to_string())
        .collect();
    assert!(
        ids.contains(&a) && ids.contains(&c) && !ids.contains(&b),
        "{ids:?}"
    );
    let o = eval(&s, &b, "1").await;
    assert_eq!(o.error_kind(), "ended_session", "{}", o.text);
    assert!(o.text.contains("make room"), "{}", o.text);
    s.stop().await;
}

per_lang!(
    cancelling_a_call_interrupts_it,
    [python, javascript, ruby, haskell, shellscript],
    |lang| {
        let s = Server::stdio().start().await;
        let (set_x, spin, read_x, five) = match lang {
            "python" => ("x = 5", "while True: pass", "x", "5\n"),
            "javascript" => ("var x = 5", "while (true) {}", "x", "5\n"),
            "ruby" => ("x = 5", "loop { }", "x", "=> 5\n"),
            "haskell" => ("let x = 5", "length [1..]", "x", "5\n"),
            _ => ("x=5", "while :; do :; done", "echo $x", "5\n"),
        };
        let id = start(&s, lang, json!({})).await;
        eval(&s, &id, set_x).await;
        let params = CallToolRequestParams::new("session_eval").with_arguments(
            json!({"session_id": id, "code": spin, "timeout_ms": 60000})
                .as_object()
                .unwrap()
                .clone(),
        );
        let handle = s
            .client
            .peer()
            .send_cancellable_request(
                ClientRequest::CallToolRequest(Request::new(params)),
                PeerRequestOptions::no_options(),
            )
            .await
            .unwrap();
        let t = Instant::now();
        while !list(&s).await.iter().any(|r| r["busy"] == true) {
            assert!(t.elapsed() < Duration::from_secs(5));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        handle.cancel(Some("test gave up".into())).await.unwrap();
        // The session is free again promptly and kept its state.
        let t = Instant::now();
        while list(&s).await.iter().any(|r| r["busy"] == true) {
            // Its timeout is 60 s: being free well before that means the cancel interrupted it.
            assert!(
                t.elapsed() < Duration::from_secs(15),
                "{lang}: still busy after cancel"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let o = eval(&s, &id, read_x).await;
        assert_eq!((status(&o), output(&o)), ("ok", five), "{lang}: {}", o.text);
        s.stop().await;
    }
);

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_a_run_code_call_kills_its_tree() {
    if !require_language("shellscript") {
        return;
    }
    let s = Server::stdio().start().await;
    // run-code: the process tree is killed. Its programs are told apart by their argument
    // (the server's warm pools start and stop interpreters of their own meanwhile).
    let nap = format!("300.{}", std::process::id());
    let params = CallToolRequestParams::new("run-code").with_arguments(
        json!({"languageId": "shellscript", "code": format!("sleep {nap} & sleep {nap}"), "timeout_ms": 60000})
            .as_object()
            .unwrap()
            .clone(),
    );
    let ours = |s: &TestServer| {
        s.descendants()
            .into_iter()
            .filter(|p| {
                std::fs::read(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&nap))
                    && ppid_state(*p).is_some_and(|(_, st)| st != 'Z')
            })
            .count()
    };
    let handle = s
        .client
        .peer()
        .send_cancellable_request(
            ClientRequest::CallToolRequest(Request::new(params)),
            PeerRequestOptions::no_options(),
        )
        .await
        .unwrap();
    let t = Instant::now();
    while ours(&s) < 2 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "program never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    handle.cancel(Some("test gave up".into())).await.unwrap();
    let t = Instant::now();
    while ours(&s) > 0 {
        assert!(
            t.elapsed() < Duration::from_secs(40),
            "run-code tree survived the cancel"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn long_work_reports_progress() {
    let s = Server::stdio().start().await;
    let cases: Vec<(&str, Value)> = vec![
        (
            "session_eval",
            json!({"code": "import time\nfor i in range(6):\n    print('step', i, flush=True)\n    time.sleep(0.4)"}),
        ),
        (
            "run-code",
            json!({"languageId": "python", "code": "import time\nfor i in range(6):\n    print('step', i, flush=True)\n    time.sleep(0.4)"}),
        ),
    ];
    let id = start(&s, "python", json!({})).await;
    for (tool, mut args) in cases {
        if tool == "session_eval" {
            args["session_id"] = json!(id);
        }
        s.recorder.progress.lock().unwrap().clear();
        let t = Instant::now();
        let o = s.call(tool, args).await;
        let took = t.elapsed().as_secs_f64();
        assert!(!o.is_error, "{tool}: {}", o.text);
        let progress = s.recorder.progress.lock().unwrap().clone();
        // About twice a second: at least two over 2.4 s, never more than the rate allows.
        assert!(
            progress.len() >= 2,
            "{tool}: {} notifications",
            progress.len()
        );
        assert!(
            (progress.len() as f64) <= took * 2.0 + 1.0,
            "{tool}: {} notifications in {took:.1} s",
            progress.len()
        );
        let values: Vec<f64> = progress.iter().map(|p| p.progress).collect();
        assert!(
            values.windows(2).all(|w| w[0] < w[1]),
            "{tool}: progress increases: {values:?}"
        );
        let last = progress.last().unwrap().message.clone().unwrap_or_default();
        assert!(
            last.starts_with("step "),
            "{tool}: message is the latest line: {last:?}"
        );
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn timeouts_are_capped_by_the_server_maximum() {
    let s = TestServer::start_with(&["--max-timeout-ms", "1500"], &[]).await;
    let t = Instant::now();
    let o = s
        .call(
            "run-code",
            json!({"languageId": "shellscript", "code": "sleep 30", "timeout_ms": 600000}),
        )
        .await;
    assert_eq!(o.structured["timed_out"], true);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    if require("python", "python3") {
        let id = start(&s, "python", json!({})).await;
        let t = Instant::now();
        let o = s
            .call(
                "session_eval",
                json!({"session_id": id, "code": "import time; time.sleep(30)", "timeout_ms": 600000}),
            )
            .await;
        assert_eq!(status(&o), "timeout");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }
    s.stop().await;
}

/// A driver whose typed line leaves the REPL asking for more (here: a missing parenthesis)
/// must fail to start cleanly, and the server must keep serving.
#[tokio::test(flavor = "multi_thread")]
async fn a_broken_driver_fails_cleanly() {
    if !require("python", "python3") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The built-in python folder, with its eval line broken.
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("prompts/python");
    let folder = dir.path().join("python");
    std::fs::create_dir(&folder).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, folder.join(path.file_name().unwrap())).unwrap();
    }
    let python = std::fs::read_to_string(folder.join("language.toml"))
        .unwrap()
        .replace("eval = \"__rbx_eval({n})\"", "eval = \"__rbx_eval({n}\"");
    std::fs::write(folder.join("language.toml"), python).unwrap();
    let s = TestServer::start_with(&["--prompts", dir.path().to_str().unwrap()], &[]).await;
    let t = Instant::now();
    let o = s.call("session_start", json!({"language": "python"})).await;
    assert_eq!(o.error_kind(), "start_failed", "{}", o.text);
    assert!(o.text.contains("while starting"), "{}", o.text);
    assert!(t.elapsed() < Duration::from_secs(40));
    let o = s.run("python", "print('still serving')").await;
    assert_eq!(o.text, "still serving\n");
    let left = s.wait_no_descendants(Duration::from_secs(3)).await;
    assert!(left.is_empty(), "{left:?}");
    s.stop().await;
}

/// Ended sessions are remembered up to a cap (`--max-ended-sessions`, here small so the test
/// is quick); the eviction past it once held the map's read guard across its own removal,
/// so the close past the cap never answered, and the server then ignored SIGTERM and left
/// that session's sandbox running. Now the oldest is forgotten first, every close answers,
/// and the server still stops cleanly.
#[tokio::test(flavor = "multi_thread")]
async fn finding_r3_8_ended_sessions_past_the_cap_neither_deadlock_nor_outlive_sigterm() {
    if !require("shellscript", "bash") {
        return;
    }
    const CAP: usize = 4;
    const CYCLES: usize = 3 * CAP;
    let s = TestServer::start_with(&["--max-ended-sessions", &CAP.to_string()], &[]).await;
    let bounded = Duration::from_secs(60);
    let mut ids = Vec::new();
    for i in 0..CYCLES {
        let id = start(&s, "shellscript", json!({})).await;
        let close = s.call("session_close", json!({"session_id": id}));
        let o = tokio::time::timeout(bounded, close)
            .await
            .unwrap_or_else(|_| panic!("close {} of {CYCLES} never answered", i + 1));
        assert_eq!(o.structured["closed"], true, "{}", o.text);
        ids.push(id);
    }
    // The newest CAP are remembered, the older ones forgotten, oldest first.
    for (i, id) in ids.iter().enumerate() {
        let o = eval(&s, id, "echo hi").await;
        let want = if i >= CYCLES - CAP {
            "ended_session"
        } else {
            "unknown_session"
        };
        assert_eq!(
            o.error_kind(),
            want,
            "session {} of {CYCLES}: {}",
            i + 1,
            o.text
        );
    }
    // Still serving, with a session open and busy when the server is told to stop.
    let last = start(&s, "shellscript", json!({})).await;
    let o = eval(&s, &last, "echo still serving").await;
    assert_eq!(output(&o), "still serving\n", "{}", o.text);
    let pid = s.pid as i32;
    let busy_id = last.clone();
    let busy = tokio::spawn({
        let peer = s.client.peer().clone();
        async move {
            let args = json!({"session_id": busy_id, "code": "sleep 600", "timeout_ms": 600000});
            http_call(&peer, "session_eval", args).await
        }
    });
    let deadline = Instant::now() + bounded;
    while !descendants(pid).iter().any(|p| {
        std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c.starts_with(b"sleep\x00600"))
    }) {
        assert!(Instant::now() < deadline, "the evaluation never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let tree = descendants(pid);
    assert!(!tree.is_empty());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let left = wait_gone(&[pid], bounded).await;
    assert!(left.is_empty(), "the server ignored SIGTERM");
    let left = wait_gone(&tree, Duration::from_secs(10)).await;
    assert!(left.is_empty(), "left behind after SIGTERM: {left:?}");
    busy.abort();
}
