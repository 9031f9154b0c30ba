//! Python and Node sessions through a real MCP client.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

/// Test languages: (session language, program that must be installed).
const LANGS: &[(&str, &str)] = &[("python", "python3"), ("javascript", "node")];

impl TestServer {
    async fn start_session(&self, lang: &str) -> String {
        let out = self.call("session_start", json!({"language": lang})).await;
        assert!(!out.is_error, "session_start {lang}: {}", out.text);
        out.s("session_id").to_string()
    }

    async fn eval(&self, id: &str, code: &str) -> Out {
        self.call("session_eval", json!({"session_id": id, "code": code}))
            .await
    }

    async fn eval_t(&self, id: &str, code: &str, timeout_ms: u64) -> Out {
        self.call(
            "session_eval",
            json!({"session_id": id, "code": code, "timeout_ms": timeout_ms}),
        )
        .await
    }
}

fn status(o: &Out) -> &str {
    o.structured["status"].as_str().unwrap_or("?")
}

fn output(o: &Out) -> &str {
    o.structured["output"].as_str().unwrap_or("")
}

/// Per-language snippets for the shared behaviours.
struct Snippets {
    set_x: &'static str,
    read_x: &'static str,
    raise: &'static str,
    two_plus_two: &'static str,
    busy_loop: &'static str,
    many_lines: &'static str,
    progress: &'static str,
    colours: &'static str,
    unicode: &'static str,
    exit3: &'static str,
    sleep1: &'static str,
    no_newline_then_more: &'static str,
    fake_prompts: &'static str,
}

fn snippets(lang: &str) -> Snippets {
    match lang {
        "python" => Snippets {
            set_x: "x = 41",
            read_x: "x + 1",
            raise: "raise ValueError('bad value')",
            two_plus_two: "2+2",
            busy_loop: "while True: pass",
            many_lines: "for i in range(200000): print('line', i)",
            progress: "import sys\nfor i in range(101):\n    sys.stdout.write(f'\\rprogress {i}%')\n    sys.stdout.flush()\nprint()",
            colours: "print('\\x1b[1;31mred\\x1b[0m and \\x1b[32mgreen\\x1b[0m')",
            unicode: "print('héllo 世界 🎉')",
            exit3: "import os; os._exit(3)",
            sleep1: "import time; time.sleep(1); print('slept')",
            no_newline_then_more: "import sys, time\nsys.stdout.write('partial >>> '); sys.stdout.flush(); time.sleep(0.2)\nprint('rest')",
            fake_prompts: "import sys\nprint('>>> ')\nprint('... ')\nprint(sys.ps1 + 'after-prompt')\nprint('In [1]: ')\n'done'",
        },
        "javascript" => Snippets {
            set_x: "let x = 41",
            read_x: "x + 1",
            raise: "throw new RangeError('bad value')",
            two_plus_two: "2+2",
            busy_loop: "while (true) {}",
            many_lines: "for (let i = 0; i < 200000; i++) console.log('line', i)",
            progress: "for (let i = 0; i <= 100; i++) process.stdout.write(`\\rprogress ${i}%`)\nconsole.log()",
            colours: "console.log('\\x1b[1;31mred\\x1b[0m and \\x1b[32mgreen\\x1b[0m')",
            unicode: "console.log('héllo 世界 🎉')",
            exit3: "process.exit(3)",
            sleep1: "await new Promise(r => setTimeout(r, 1000)); console.log('slept')",
            no_newline_then_more: "process.stdout.write('partial > ')\nawait new Promise(r => setTimeout(r, 200))\nconsole.log('rest')",
            fake_prompts: "console.log('> ')\nconsole.log('... ')\nconsole.log('> after-prompt')\n'done'",
        },
        other => panic!("no snippets for {other}"),
    }
}

/// Run `f` for every installed session language.
macro_rules! each_lang {
    ($s:ident, $lang:ident, $body:block) => {
        for (lang, program) in LANGS {
            if !require(lang, program) {
                continue;
            }
            let $lang: &str = lang;
            $body
        }
    };
}

#[tokio::test(flavor = "multi_thread")]
async fn state_persists_and_errors_do_not_break_the_session() {
    let s = TestServer::start().await;
    each_lang!(s, lang, {
        let sn = snippets(lang);
        let id = s.start_session(lang).await;
        let o = s.eval(&id, sn.set_x).await;
        assert_eq!(status(&o), "ok", "{lang}: {}", o.text);
        assert_eq!(o.structured["eval_id"], 1);
        let o = s.eval(&id, sn.read_x).await;
        assert_eq!(output(&o), "42\n", "{lang}");
        assert_eq!(o.text, "42\n", "{lang}: text is the output");
        let o = s.eval(&id, sn.raise).await;
        assert_eq!(status(&o), "error", "{lang}: {}", o.text);
        assert!(o.is_error);
        assert!(output(&o).contains("bad value"), "{lang}: {}", output(&o));
        let want_type = if lang == "python" {
            "ValueError"
        } else {
            "RangeError"
        };
        assert_eq!(o.structured["error"]["type"], want_type, "{lang}");
        assert_eq!(o.structured["error"]["message"], "bad value", "{lang}");
        let o = s.eval(&id, sn.two_plus_two).await;
        assert_eq!((status(&o), output(&o)), ("ok", "4\n"), "{lang}");
        assert_eq!(o.structured["eval_id"], 4);
        s.call("session_close", json!({"session_id": id})).await;
    });
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn python_semantics() {
    if !require("python", "python3") {
        return;
    }
    let s = TestServer::start().await;
    let id = s.start_session("python").await;
    // A block with blank lines inside, a decorator, a class and a __main__ block.
    let code = r#"
import functools

def twice(f):
    @functools.wraps(f)
    def inner(*a):

        return f(*a) * 2

    return inner

@twice
def area(w, h):

    return w * h

class Shape:

    sides = 4

    def describe(self):
        return f"{self.sides} sides"

if __name__ == "__main__":
    print("main block ran")

area(3, 4)
"#;
    let o = s.eval(&id, code).await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    assert_eq!(output(&o), "main block ran\n24\n");
    // The trailing expression is shown as the REPL shows it (repr), None is not shown.
    let o = s.eval(&id, "Shape().describe()").await;
    assert_eq!(output(&o), "'4 sides'\n");
    let o = s.eval(&id, "None").await;
    assert_eq!(output(&o), "");
    let o = s.eval(&id, "x = [1, 2]\nx.append(3)").await;
    assert_eq!(output(&o), "");
    let o = s.eval(&id, "x").await;
    assert_eq!(output(&o), "[1, 2, 3]\n");
    // print(..., end="") is kept as it is.
    let o = s.eval(&id, "print('a', end=''); print('b', end='')").await;
    assert_eq!(output(&o), "ab");
    // Tracebacks show the user's cell, not the bootstrap.
    let o = s.eval(&id, "def boom():\n    return 1 / 0\n\nboom()").await;
    let out = output(&o);
    assert_eq!(status(&o), "error");
    assert!(out.contains("File \"<cell 7>\", line 4"), "{out}");
    assert!(out.contains("return 1 / 0"), "source line shown: {out}");
    assert!(out.contains("ZeroDivisionError: division by zero"), "{out}");
    assert!(!out.contains("bootstrap"), "{out}");
    assert!(!out.contains("__rbx"), "{out}");
    // A syntax error is an error with its type.
    let o = s.eval(&id, "def broken(:\n    pass").await;
    assert_eq!(status(&o), "error");
    assert_eq!(o.structured["error"]["type"], "SyntaxError");
    // Top-level await works.
    let o = s
        .eval(&id, "import asyncio\nawait asyncio.sleep(0.01)\n'awaited'")
        .await;
    assert_eq!(output(&o), "'awaited'\n", "{}", o.text);
    // sys.exit is the interpreter exiting.
    let o = s.eval(&id, "import sys; sys.exit(5)").await;
    assert_eq!(status(&o), "exited");
    assert_eq!(o.structured["exit_code"], 5);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn node_semantics() {
    if !require("javascript", "node") {
        return;
    }
    let s = TestServer::start().await;
    let id = s.start_session("node").await;
    let o = s
        .eval(
            &id,
            "let a = 1\nconst b = 2\n\nclass Point {\n  constructor(x, y) { this.x = x; this.y = y }\n}\nfunction add(p, q) { return p + q }",
        )
        .await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    let o = s.eval(&id, "add(a, b)").await;
    assert_eq!(output(&o), "3\n");
    let o = s.eval(&id, "new Point(1, [2, {z: 'w'}])").await;
    assert_eq!(output(&o), "Point { x: 1, y: [ 2, { z: 'w' } ] }\n");
    let o = s
        .eval(
            &id,
            "const v = await new Promise(r => setTimeout(() => r(21), 20))\nv * 2",
        )
        .await;
    assert_eq!(output(&o), "42\n", "{}", o.text);
    let o = s.eval(&id, "v").await;
    assert_eq!(output(&o), "21\n", "awaited const persists");
    let o = s.eval(&id, "'str'").await;
    assert_eq!(output(&o), "'str'\n");
    let o = s.eval(&id, "undefined").await;
    assert_eq!(output(&o), "");
    let o = s.eval(&id, "null.prop").await;
    assert_eq!(status(&o), "error");
    assert_eq!(o.structured["error"]["type"], "TypeError");
    let o = s
        .eval(&id, "Promise.reject(new Error('nobody catches me'))")
        .await;
    assert_eq!(status(&o), "error", "unhandled rejection: {}", o.text);
    assert_eq!(o.structured["error"]["message"], "nobody catches me");
    let o = s.eval(&id, "function (").await;
    assert_eq!(status(&o), "error", "{}", o.text);
    assert_eq!(o.structured["error"]["type"], "SyntaxError");
    let o = s.eval(&id, "a + b").await;
    assert_eq!((status(&o), output(&o)), ("ok", "3\n"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn timeout_interrupts_and_keeps_state() {
    let s = TestServer::start().await;
    each_lang!(s, lang, {
        let sn = snippets(lang);
        let id = s.start_session(lang).await;
        s.eval(&id, sn.set_x).await;
        let t = Instant::now();
        let o = s.eval_t(&id, sn.busy_loop, 2000).await;
        let took = t.elapsed();
        assert_eq!(status(&o), "timeout", "{lang}: {}", o.text);
        assert!(o.is_error);
        assert!(took < Duration::from_secs(4), "{lang}: took {took:?}");
        assert_eq!(o.structured.get("restarted"), None, "{lang}: state kept");
        assert!(o.text.contains("state"), "{lang}: {}", o.text);
        let o = s.eval(&id, sn.read_x).await;
        assert_eq!(
            (status(&o), output(&o)),
            ("ok", "42\n"),
            "{lang}: x survived"
        );
    });
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interpreter_that_ignores_the_interrupt_is_restarted() {
    if !require("python", "python3") {
        return;
    }
    let s = TestServer::start().await;
    let id = s.start_session("python").await;
    s.eval(&id, "x = 1").await;
    let o = s
        .eval_t(
            &id,
            "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass",
            1000,
        )
        .await;
    assert_eq!(status(&o), "timeout", "{}", o.text);
    assert_eq!(o.structured["restarted"], true);
    assert!(o.text.contains("state lost"), "{}", o.text);
    let o = s.eval(&id, "'x' in globals()").await;
    assert_eq!((status(&o), output(&o)), ("ok", "False\n"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn big_output_is_bounded_and_the_next_eval_is_in_sync() {
    let s = TestServer::start().await;
    each_lang!(s, lang, {
        let sn = snippets(lang);
        let id = s.start_session(lang).await;
        let o = s.eval_t(&id, sn.many_lines, 60_000).await;
        assert_eq!(status(&o), "ok", "{lang}");
        assert_eq!(o.structured["truncated"], true, "{lang}");
        let out = output(&o);
        assert!(out.len() <= 64 * 1024 + 200, "{lang}: {} bytes", out.len());
        assert!(out.starts_with("line 0\nline 1\n"), "{lang}");
        assert!(out.ends_with("line 199999\n"), "{lang}");
        assert!(out.contains("bytes omitted"), "{lang}");
        let o = s.eval(&id, sn.two_plus_two).await;
        assert_eq!((status(&o), output(&o)), ("ok", "4\n"), "{lang}: in sync");
    });
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn prompt_lookalikes_neither_cut_nor_shift_output() {
    let s = TestServer::start().await;
    each_lang!(s, lang, {
        let sn = snippets(lang);
        let id = s.start_session(lang).await;
        let o = s.eval(&id, sn.fake_prompts).await;
        assert_eq!(status(&o), "ok", "{lang}: {}", o.text);
        let out = output(&o);
        assert!(out.contains("after-prompt"), "{lang}: {out}");
        assert!(out.ends_with("'done'\n"), "{lang}: {out}");
        assert!(
            out.starts_with(if lang == "python" {
                ">>> \n... \n"
            } else {
                "> \n... \n"
            }),
            "{lang}: {out}"
        );
        let o = s.eval(&id, sn.no_newline_then_more).await;
        assert_eq!(status(&o), "ok", "{lang}");
        let want = if lang == "python" {
            "partial >>> rest\n"
        } else {
            "partial > rest\n"
        };
        assert_eq!(output(&o), want, "{lang}");
        let o = s.eval(&id, sn.two_plus_two).await;
        assert_eq!(
            output(&o),
            "4\n",
            "{lang}: nothing shifted into the next evaluation"
        );
    });
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn terminal_output_is_cleaned() {
    let s = TestServer::start().await;
    each_lang!(s, lang, {
        let sn = snippets(lang);
        let id = s.start_session(lang).await;
        let o = s.eval(&id, sn.progress).await;
        assert_eq!(output(&o), "progress 100%\n", "{lang}: progress collapses");
        let o = s.eval(&id, sn.colours).await;
        assert_eq!(output(&o), "red and green\n", "{lang}: colours vanish");
        assert!(!o.text.contains('\x1b'));
        let o = s.eval(&id, sn.unicode).await;
        assert_eq!(output(&o), "héllo 世界 🎉\n", "{lang}: unicode exact");
    });
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exit_is_noticed_at_once() {
    let s = TestServer::start().await;
    each_lang!(s, lang, {
        let sn = snippets(lang);
        let id = s.start_session(lang).await;
        let t = Instant::now();
        let o = s.eval_t(&id, sn.exit3, 30_000).await;
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "{lang}: took {:?}",
            t.elapsed()
        );
        assert_eq!(status(&o), "exited", "{lang}: {}", o.text);
        assert_eq!(o.structured["exit_code"], 3, "{lang}");
        assert!(o.is_error);
        let o = s.eval(&id, "1").await;
        assert!(o.is_error, "{lang}");
        assert!(
            o.text.contains("exit code 3") && o.text.contains("session_start"),
            "{lang}: {}",
            o.text
        );
        let id2 = s.start_session(lang).await;
        let o = s.eval(&id2, sn.two_plus_two).await;
        assert_eq!(output(&o), "4\n", "{lang}: a new session works");
    });
    // Nothing is left of the exited interpreters: every remaining process is a live
    // session's interpreter or one of the processes it runs under (helper, bwrap).
    let live: Vec<i32> = s.call("session_list", json!({})).await.structured["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["pid"].as_i64().unwrap() as i32)
        .collect();
    let allowed: Vec<i32> = live
        .iter()
        .flat_map(|p| chain_up(*p, s.pid as i32))
        .collect();
    let left = s.descendants();
    s.stop().await;
    assert_eq!(live.len(), LANGS.len().min(2), "{live:?}");
    assert!(
        left.iter().all(|p| allowed.contains(p)),
        "{left:?} vs {allowed:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_run_in_parallel() {
    let s = std::sync::Arc::new(TestServer::start().await);
    each_lang!(s, lang, {
        let sn = snippets(lang);
        let mut ids = Vec::new();
        for _ in 0..4 {
            ids.push(s.start_session(lang).await);
        }
        let t = Instant::now();
        let mut tasks = Vec::new();
        for id in ids {
            let s = s.clone();
            let code = sn.sleep1;
            tasks.push(tokio::spawn(async move { s.eval(&id, code).await }));
        }
        for task in tasks {
            let o = task.await.unwrap();
            assert_eq!(output(&o), "slept\n", "{lang}");
        }
        let took = t.elapsed();
        assert!(
            took < Duration::from_millis(2500),
            "{lang}: 4 × 1 s took {took:?}"
        );
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn a_busy_session_says_so_at_once() {
    let s = std::sync::Arc::new(TestServer::start().await);
    each_lang!(s, lang, {
        let sn = snippets(lang);
        let id = s.start_session(lang).await;
        let s2 = s.clone();
        let id2 = id.clone();
        let slow = tokio::spawn(async move { s2.eval(&id2, sn.sleep1).await });
        // Wait until the first evaluation is running.
        let t = Instant::now();
        loop {
            let l = s.call("session_list", json!({})).await;
            let busy = l.structured["sessions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x["session_id"] == id.as_str() && x["busy"] == true);
            if busy {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(5));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let t = Instant::now();
        let o = s.eval(&id, sn.two_plus_two).await;
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "{lang}: busy answer took {:?}",
            t.elapsed()
        );
        assert!(o.is_error, "{lang}");
        assert!(
            o.text.contains("busy") && o.text.contains("evaluation 1"),
            "{lang}: {}",
            o.text
        );
        let first = slow.await.unwrap();
        assert_eq!(output(&first), "slept\n", "{lang}: no interleaving");
        let o = s.eval(&id, sn.two_plus_two).await;
        assert_eq!(output(&o), "4\n");
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn directories_and_cleanup() {
    let s = TestServer::start().await;
    each_lang!(s, lang, {
        // A private directory, removed at close, with the process tree.
        let start = s.call("session_start", json!({"language": lang})).await;
        let id = start.s("session_id").to_string();
        let cwd = std::path::PathBuf::from(start.s("cwd"));
        assert!(cwd.is_dir());
        let pid = start.structured["pid"].as_i64().unwrap() as i32;
        // A background child, found by a unique argument: inside a sandbox's pid namespace the
        // pid the program sees is not the host's.
        let secs = format!(
            "300.{}",
            std::process::id() + cwd.to_str().unwrap().len() as u32
        );
        let bg = if lang == "python" {
            format!("import subprocess\np = subprocess.Popen(['sleep', '{secs}'])")
        } else {
            format!("const cp = require('child_process').spawn('sleep', ['{secs}']); 0")
        };
        let o = s.eval(&id, &bg).await;
        assert_eq!(status(&o), "ok", "{lang}: {}", o.text);
        let t = Instant::now();
        let child = loop {
            if let Some(p) = processes_with(&format!("sleep {secs}")).first() {
                break *p;
            }
            assert!(
                t.elapsed() < Duration::from_secs(3),
                "{lang}: sleep not found"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert!(
            s.descendants().contains(&child),
            "{lang}: child in the server's tree"
        );
        let o = s
            .eval(
                &id,
                if lang == "python" {
                    "import os; os.getcwd()"
                } else {
                    "process.cwd()"
                },
            )
            .await;
        assert!(
            output(&o).contains(cwd.to_str().unwrap()),
            "{lang}: {}",
            output(&o)
        );
        let c = s.call("session_close", json!({"session_id": id})).await;
        assert_eq!(c.structured["closed"], true);
        let t = Instant::now();
        while ppid_state(child).is_some_and(|(_, st)| st != 'Z')
            || ppid_state(pid).is_some_and(|(_, st)| st != 'Z')
        {
            assert!(
                t.elapsed() < Duration::from_secs(3),
                "{lang}: processes survived close"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!cwd.exists(), "{lang}: private directory removed");
        let o = s.eval(&id, "1").await;
        assert!(o.is_error);
        assert!(
            o.text.contains("closed") && o.text.contains("session_start"),
            "{}",
            o.text
        );

        // An existing directory is used and kept. User code runs as an unprivileged user, so
        // the directory must let it write (a caller's cwd grants visibility, not privilege).
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        let start = s
            .call(
                "session_start",
                json!({"language": lang, "cwd": dir.path()}),
            )
            .await;
        assert!(!start.is_error, "{}", start.text);
        let id = start.s("session_id").to_string();
        let write = if lang == "python" {
            "open('made-here.txt', 'w').write('hi')"
        } else {
            "require('fs').writeFileSync('made-here.txt', 'hi')"
        };
        s.eval(&id, write).await;
        s.call("session_close", json!({"session_id": id})).await;
        assert!(
            dir.path().join("made-here.txt").is_file(),
            "{lang}: cwd kept"
        );
    });
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_kills_every_session() {
    let s = TestServer::start().await;
    let mut pids = Vec::new();
    each_lang!(s, lang, {
        let o = s.call("session_start", json!({"language": lang})).await;
        pids.push(o.structured["pid"].as_i64().unwrap() as i32);
    });
    let all = s.descendants();
    assert!(!all.is_empty());
    s.stop().await;
    let t = Instant::now();
    loop {
        let alive: Vec<i32> = all
            .iter()
            .copied()
            .filter(|p| ppid_state(*p).is_some_and(|(_, st)| st != 'Z'))
            .collect();
        if alive.is_empty() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "left behind: {alive:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_are_clear_errors() {
    let s = TestServer::start().await;
    let o = s
        .call("session_eval", json!({"session_id": "nope", "code": "1"}))
        .await;
    assert!(o.is_error);
    assert!(
        o.text.contains("no session") && o.text.contains("session_start"),
        "{}",
        o.text
    );
    let o = s.call("session_start", json!({"language": "cobol"})).await;
    assert!(o.is_error);
    assert!(o.text.contains("unknown language"), "{}", o.text);
    let o = s.call("session_start", json!({"language": "c"})).await;
    if !o.text.contains("not installed") {
        assert!(o.is_error);
        assert!(o.text.contains("run-code"), "{}", o.text);
    }
    let o = s
        .call(
            "session_start",
            json!({"language": "python", "cwd": "/no/such/dir"}),
        )
        .await;
    assert!(o.is_error);
    assert!(o.text.contains("/no/such/dir"), "{}", o.text);
    let o = s.call("session_close", json!({"session_id": "nope"})).await;
    assert!(o.is_error);
    let o = s.call("session_eval", json!({"session_id": "x"})).await;
    assert!(o.is_error, "missing code");
    let l = s.call("session_list", json!({})).await;
    assert_eq!(l.structured["sessions"], Value::Array(vec![]));
    s.stop().await;
}
