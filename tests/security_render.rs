//! Finding 4: rendering a session's output must not stall the server. A program that prints
//! escape sequences by the megabyte (`ESC[999999;999999H ESC[2J` 200,000 times, 4 MB) once
//! cost the server about a minute of CPU on its async workers: the evaluation overran its
//! deadline and every other caller waited. Rendering now runs off the async workers, clamps
//! cursor parameters to the screen and spends a bounded budget per evaluation, after which
//! the rest is shown with its escape sequences removed.
//!
//! Through the MCP client: the flood (and two at once) returns `ok` within its `timeout_ms`
//! with bounded output; a bystander's `run-code` issued while two floods run answers first;
//! hostile sequences (huge parameter lists, strings without a terminator, a megabyte of
//! backspaces, alternate screen switches, scroll regions, far cursor jumps) each return
//! within the deadline with bounded output, keep the server's memory bounded and leave the
//! session working.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use serde_json::json;

/// The deadline the finding's evaluation ran with.
const TIMEOUT_MS: u64 = 60_000;
/// The server's default output cap, and room for the notes rendering adds.
const BOUND: usize = 64 * 1024 + 1024;

/// The finding's payload: 4 MB of cursor jumps and screen clears, then a line after it.
const FLOOD: &str = "import sys\n\
sys.stdout.write('\\x1b[999999;999999H\\x1b[2J' * 200000)\n\
print('flood done')";

fn duration_ms(o: &Out) -> u64 {
    o.structured["duration_ms"].as_u64().unwrap_or(u64::MAX)
}

/// An evaluation of `what` returned `ok` within its deadline with output within the bound.
fn assert_bounded(o: &Out, what: &str) {
    assert_eq!(status(o), "ok", "{what}: {}", o.text);
    assert!(
        duration_ms(o) < TIMEOUT_MS,
        "{what}: took {} ms, beyond its timeout_ms {TIMEOUT_MS}",
        duration_ms(o)
    );
    assert!(
        output(o).len() <= BOUND,
        "{what}: {} bytes of output, beyond {BOUND}",
        output(o).len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn finding_4_cursor_flood_returns_within_its_deadline() {
    if !require("python", "python3") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("python").await;
    let o = s.eval_t(&id, FLOOD, TIMEOUT_MS).await;
    assert_bounded(&o, "the 4 MB cursor flood");
    // Jumps and clears of an empty screen show nothing; the line after them is there.
    assert!(output(&o).ends_with("flood done\n"), "{}", output(&o));
    let o = s.eval(&id, "print(1 + 1)").await;
    assert_eq!((status(&o), output(&o)), ("ok", "2\n"), "{}", o.text);
    s.stop().await;
}

/// A file the test and a session's code both see: the session's directory on the host.
fn in_cwd(started: &Out, name: &str) -> PathBuf {
    Path::new(started.s("cwd")).join(name)
}

/// Wait (bounded) until `path` exists.
async fn wait_for(path: &Path, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while !path.exists() {
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

#[tokio::test(flavor = "multi_thread")]
async fn finding_4_bystander_answers_while_two_floods_run() {
    if !require("python", "python3") {
        return;
    }
    let s = Server::stdio().start().await;
    let mut floods = Vec::new();
    for _ in 0..2 {
        let o = s.call("session_start", json!({"language": "python"})).await;
        assert!(!o.is_error, "session_start: {}", o.text);
        floods.push(o);
    }
    // Each flood repeats the finding's 4 MB until the test releases it (after the
    // bystander's answer), or gives up after 30 s and says so.
    let code = r#"import os, sys, time
open('started', 'w').close()
flood = '\x1b[999999;999999H\x1b[2J' * 200000
released = False
give_up = time.monotonic() + 30
while not released and time.monotonic() < give_up:
    sys.stdout.write(flood)
    sys.stdout.flush()
    released = os.path.exists('release')
print('released' if released else 'gave up')"#;
    let order = AtomicUsize::new(0);
    let flood = |o: &Out| {
        let id = o.s("session_id").to_string();
        let (s, order) = (&s, &order);
        async move {
            let out = s.eval_t(&id, code, TIMEOUT_MS).await;
            (order.fetch_add(1, Ordering::SeqCst), out)
        }
    };
    let bystander = async {
        for o in &floods {
            assert!(
                wait_for(&in_cwd(o, "started"), Duration::from_secs(30)).await,
                "a flood never started"
            );
        }
        let out = s.run("python", "print(1)").await;
        let place = order.fetch_add(1, Ordering::SeqCst);
        for o in &floods {
            std::fs::write(in_cwd(o, "release"), b"").expect("release the flood");
        }
        (place, out)
    };
    let ((a_place, a), (b_place, b), (place, by)) =
        tokio::join!(flood(&floods[0]), flood(&floods[1]), bystander);
    assert_eq!(by.text, "1\n", "the bystander's run-code: {}", by.text);
    assert_eq!(
        place, 0,
        "the bystander answered after a flood ({a_place}, {b_place})"
    );
    for (o, what) in [(&a, "flood a"), (&b, "flood b")] {
        assert_bounded(o, what);
        assert!(
            output(o).ends_with("released\n"),
            "{what} ended before the bystander answered: {}",
            output(o)
        );
    }
    s.stop().await;
}

/// The server's peak resident memory, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn finding_4_hostile_sequences_stay_bounded() {
    if !require("python", "python3") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("python").await;
    let w = |payload: &str| format!("import sys\nsys.stdout.write({payload})\nprint('end')");
    let backspaced = format!("b{}\nend\n", "a".repeat(999));
    let cases: Vec<(&str, String, &str)> = vec![
        // (what, code, what the output ends with)
        (
            "a CSI with 500,000 parameters",
            w("'\\x1b[' + '9;' * 500000 + 'H' + 'x\\n'"),
            "x\nend\n",
        ),
        (
            "parameters beyond any screen",
            w("'\\x1b[99999999999999999999;99999999999999999999Hx\\r\\n' * 1000"),
            "x\nend\n",
        ),
        (
            "a megabyte of backspaces",
            w("'a' * 1000 + '\\b' * 1000000 + 'b\\n'"),
            &backspaced,
        ),
        (
            "alternate screen switches",
            w("('\\x1b[?1049hframe\\n\\x1b[?1049l') * 200000"),
            "frame\nend\n",
        ),
        (
            "scroll regions",
            w(
                "('\\x1b[2;40r' + 'line\\n' * 60 + '\\x1b[L\\x1bM\\x1b[3S\\x1b[2T') * 20000 + '\\x1b[r\\x1b[2J'",
            ),
            "end\n",
        ),
        (
            "far cursor jumps that print",
            w("'\\x1b[999;999Hx\\x1b[2J\\x1b[999;1H\\x1b[999@\\x1b[1;1H\\x1b[999L' * 300000"),
            "end\n",
        ),
    ];
    for (what, code, tail) in &cases {
        let o = s.eval_t(&id, code, TIMEOUT_MS).await;
        assert_bounded(&o, what);
        assert!(output(&o).ends_with(tail), "{what}: {}", output(&o));
    }
    // Strings without a terminator: 16 MB each, the end marker still found, the server's
    // memory not holding them, and the next evaluation rendered from a clean state.
    let before = peak_rss_kib(s.pid);
    for (what, opener) in [
        ("an endless OSC string", "\\x1b]0;"),
        ("an endless APC string", "\\x1b_"),
        ("an endless DCS string", "\\x1bP"),
    ] {
        let code = format!("import sys\nsys.stdout.write('{opener}' + 'x' * (16 << 20))");
        let o = s.eval_t(&id, &code, TIMEOUT_MS).await;
        assert_bounded(&o, what);
        assert!(!output(&o).contains("xxxx"), "{what}: {}", output(&o));
        let o = s.eval(&id, "print('after')").await;
        assert_eq!((status(&o), output(&o)), ("ok", "after\n"), "after {what}");
    }
    let grew = peak_rss_kib(s.pid).saturating_sub(before);
    assert!(
        grew < 8 * 1024,
        "the server's peak memory grew by {grew} KiB"
    );
    s.stop().await;
}
