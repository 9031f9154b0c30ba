//! The warm pool for `run-code`: a pooled run gives exactly the result of a cold one, the
//! pool falls back to a cold start for what it cannot honour, refills, cleans up, and
//! `--pool 0` turns it off. Everything goes through the MCP client; nothing here measures
//! speed (the bench does).

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

/// What the pool's interpreters carry on their command line (the loader's first line,
/// prompts/python/pool_loader.py). Their helpers do not: the helper gets its program as data.
const MARK: &str = "replbox warm pool";

fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// Children of every thread of `pid`.
fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        out.extend(
            list.split_whitespace()
                .filter_map(|s| s.parse::<i32>().ok()),
        );
    }
    out
}

/// Every pooled interpreter of the server, by the pid of the server's child that carries it
/// (the helper, or bwrap around it): those with the pool loader in their tree.
fn pool_helpers(server: i32) -> BTreeSet<i32> {
    children(server)
        .into_iter()
        .filter(|&h| {
            descendants(h)
                .into_iter()
                .any(|p| cmdline(p).contains(MARK))
        })
        .collect()
}

/// The pooled interpreters waiting for a request: those whose tree is a chain ending in one
/// interpreter blocked reading its stdin. Returns the server's children that carry them.
fn ready_pool(server: i32) -> BTreeSet<i32> {
    pool_helpers(server)
        .into_iter()
        .filter(|&h| {
            let tree = descendants(h);
            let leaves: Vec<i32> = tree
                .iter()
                .copied()
                .filter(|&p| children(p).is_empty())
                .collect();
            leaves.len() == 1 && waits_on_stdin(leaves[0])
        })
        .collect()
}

/// Whether a process is blocked in read(0, …).
fn waits_on_stdin(pid: i32) -> bool {
    let sys = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
    let mut it = sys.split_whitespace();
    it.next() == Some("0") && it.next() == Some("0x0")
}

async fn wait_ready(s: &TestServer, n: usize) -> BTreeSet<i32> {
    let t = Instant::now();
    loop {
        let ready = ready_pool(s.pid as i32);
        if ready.len() >= n {
            return ready;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the pool never had {n} interpreters ready (has {ready:?}; tree {:?})",
            s.descendants()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn pooled_server(size: usize) -> TestServer {
    let n = size.to_string();
    TestServer::start_with(&["--pool", &n], &[]).await
}

/// The result with what legitimately differs between two runs made uniform: the run's
/// private directory (and the server's root) and the duration.
fn normalized(out: &Out) -> Value {
    let dir = regex::Regex::new(r"/replbox-[A-Za-z0-9]+/runs/[0-9a-f-]{36}").expect("regex");
    let after = regex::Regex::new(r"timed out after \d+ ms").expect("regex");
    let fix = |v: &Value| match v.as_str() {
        Some(s) => {
            let s = dir.replace_all(s, "/ROOT/runs/RUN");
            Value::from(after.replace_all(&s, "timed out after N ms").into_owned())
        }
        None => v.clone(),
    };
    let mut s = out.structured.clone();
    if let Some(obj) = s.as_object_mut() {
        obj.remove("duration_ms");
        for key in ["stdout", "stderr", "error"] {
            if let Some(v) = obj.get(key) {
                let fixed = fix(v);
                obj.insert(key.into(), fixed);
            }
        }
        obj.insert("is_error".into(), Value::from(out.is_error));
        obj.insert("text".into(), fix(&Value::from(out.text.clone())));
    }
    s
}

/// (what it checks, arguments of run-code) for programs whose cold and warm results must be
/// identical.
fn programs() -> Vec<(&'static str, Value)> {
    let py = |code: &str| json!({"languageId": "python", "code": code});
    let with = |code: &str, extra: Value| {
        let mut v = py(code);
        if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
            for (k, x) in e {
                o.insert(k.clone(), x.clone());
            }
        }
        v
    };
    vec![
        ("output", py("print(1+1)")),
        (
            "fresh globals, __main__, __file__, loader",
            py(
                "import sys\nprint(list(globals()), __name__, __doc__, __package__, __spec__, __cached__)\n\
print(__file__, type(__loader__).__name__, __loader__.name, __loader__.path == __file__)\n\
print(sys.modules['__main__'].__dict__ is globals(), __annotations__, type(__builtins__).__name__)",
            ),
        ),
        (
            "argv, orig_argv, path[0], cwd",
            with(
                "import os, sys\nprint(sys.argv, sys.orig_argv[1:], sys.path[0] == os.getcwd(), os.getcwd() == os.path.dirname(__file__))",
                json!({"args": ["a b", "", "--flag", "é"]}),
            ),
        ),
        (
            "stdin given",
            with(
                "import sys\nprint(repr(sys.stdin.read()), sys.stdin.seekable(), sys.stdin.isatty(), sys.stdin.encoding)",
                json!({"stdin": "line one\nline two"}),
            ),
        ),
        (
            "no stdin",
            py(
                "import sys, os, stat\nprint(repr(sys.stdin.read()), stat.S_ISFIFO(os.fstat(0).st_mode))",
            ),
        ),
        (
            "environment: same variables, same order",
            with(
                "import os\nprint([k for k in os.environ])\nprint(os.environ['GREETING'], os.environ['HOME'] == os.getcwd())",
                json!({"env": {"GREETING": "héllo wörld", "AAA_FIRST": "1", "ZZZ": "a=b"}}),
            ),
        ),
        (
            "environment reaches subprocesses",
            with(
                "import subprocess\nprint(subprocess.run(['sh', '-c', 'echo $GREETING; cat'], input='piped', capture_output=True, text=True).stdout)",
                json!({"env": {"GREETING": "to the child"}}),
            ),
        ),
        ("exit code", py("import sys\nprint('partial')\nsys.exit(3)")),
        ("exit with a message", py("import sys\nsys.exit('bye')")),
        (
            "traceback",
            py("def inner():\n    return 1 / 0\n\ndef outer():\n    inner()\n\nouter()"),
        ),
        (
            "chained traceback",
            py("try:\n    {}['k']\nexcept KeyError as e:\n    raise ValueError('v') from e"),
        ),
        ("syntax error", py("print('unclosed'\n")),
        ("import error", py("import no_such_module_here")),
        (
            "atexit runs after an error",
            py(
                "import atexit\natexit.register(lambda: print('atexit ran'))\nraise RuntimeError('boom')",
            ),
        ),
        (
            "KeyboardInterrupt ends by SIGINT",
            py("raise KeyboardInterrupt"),
        ),
        (
            "killed by a signal",
            py("import os\nprint('x', flush=True)\nos.kill(os.getpid(), 9)"),
        ),
        (
            "a custom excepthook",
            py(
                "import sys\nsys.excepthook = lambda t, v, tb: print('hook', t.__name__, tb.tb_frame.f_code.co_filename.endswith('main.py'), tb.tb_next is None)\n1/0",
            ),
        ),
        (
            "threads finish before exit",
            py(
                "import threading, time\ndef w():\n    time.sleep(0.1)\n    print('thread done')\nthreading.Thread(target=w).start()\nprint('main done')",
            ),
        ),
        ("coding cookie", py("# -*- coding: utf-8 -*-\nprint('é')")),
        (
            "finalizers at exit",
            py(
                "import gc\nclass A:\n    def __del__(self):\n        print('del A')\na = A()\nb = [A()]\nb.append(b)\nprint(gc.isenabled(), 'end')",
            ),
        ),
        ("warnings", py("import warnings\nwarnings.warn('careful')")),
        (
            "buffered output flushed at exit",
            py("import os\nout = os.fdopen(1, 'w')\nout.write('buffered, never flushed')"),
        ),
        (
            "finalizers of objects kept in modules loaded at start",
            py(
                "import os, sys, weakref\nclass A:\n    def __del__(self):\n        print('del', self.where)\nos.keep = A(); os.keep.where = 'os'\nsys.keep = A(); sys.keep.where = 'sys'\nweakref.finalize(A, print, 'finalize ran')\nprint('end')",
            ),
        ),
        (
            "pickling what __main__ defines",
            py(
                "import pickle\nclass P:\n    pass\nprint(type(pickle.loads(pickle.dumps(P()))).__name__, P.__module__)",
            ),
        ),
        (
            "modules loaded at start",
            py(
                "import sys\nprint(len(sys.modules), 'json' in sys.modules, 'importlib.machinery' in sys.modules)",
            ),
        ),
        (
            "process group and session",
            py("import os\nprint(os.getpgrp() == os.getpid(), os.getsid(0) == os.getpid())"),
        ),
        (
            "files in the run directory",
            py("import os\nopen('out.txt', 'w').write('x')\nprint(sorted(os.listdir('.')))"),
        ),
        (
            "stderr with exit 0",
            py("import sys\nprint('out')\nprint('err', file=sys.stderr)"),
        ),
        (
            "timeout",
            with(
                "print('started', flush=True)\nwhile True: pass",
                json!({"timeout_ms": 1500}),
            ),
        ),
    ]
}

/// A cold and a pooled server at sandbox `level`, or None (with the reason printed; a
/// failure in CI) when the level does not work here.
async fn pair(level: &str) -> Option<(TestServer, TestServer)> {
    let start = |pool: &'static str| async move {
        TestServer::try_start(&["--sandbox", level, "--pool", pool], &[], None).await
    };
    match (start("0").await, start("2").await) {
        (Ok(c), Ok(w)) => Some((c, w)),
        (Err(e), _) | (_, Err(e)) => {
            if std::env::var("REPLBOX_REQUIRE_ALL").is_ok_and(|v| v == "1") {
                panic!("level {level} does not work here: {e}");
            }
            eprintln!("SKIP: pooled runs at level {level}: {e}");
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn pooled_runs_give_exactly_the_cold_results() {
    if !require("python", "python3") {
        return;
    }
    // Each level starts a process differently (bwrap, the helper's Landlock, neither).
    for level in ["bwrap", "landlock", "none"] {
        let Some((cold, warm)) = pair(level).await else {
            continue;
        };
        let wpid = warm.pid as i32;
        // As root at level none there is no warm pool: a run's uid is bound to its caller
        // before it runs (docs/security.md, Uids and principals). Its runs are cold ones.
        let no_pool = level == "none" && nix::unistd::geteuid().is_root();
        let mut failures = Vec::new();
        for (what, args) in programs() {
            let c = cold.call("run-code", args.clone()).await;
            if no_pool {
                let idle = pool_helpers(wpid);
                assert!(
                    idle.is_empty(),
                    "{level}: interpreters started ahead: {idle:?}"
                );
            }
            let ready = if no_pool {
                BTreeSet::new()
            } else {
                wait_ready(&warm, 2).await
            };
            let w = warm.call("run-code", args.clone()).await;
            // The run used one of the interpreters that were ready (its helper is gone).
            let still = pool_helpers(wpid);
            assert!(
                no_pool || ready.iter().any(|h| !still.contains(h)),
                "{level} {what}: the run did not use the pool (ready {ready:?}, now {still:?})"
            );
            assert_eq!(c.structured["sandbox"], level, "{}", c.text);
            let (nc, nw) = (normalized(&c), normalized(&w));
            if nc != nw {
                failures.push(format!(
                    "{level} {what}:\n  cold {}\n  warm {}",
                    serde_json::to_string(&nc).unwrap_or_default(),
                    serde_json::to_string(&nw).unwrap_or_default()
                ));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        cold.stop().await;
        warm.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn what_the_pool_cannot_honour_runs_cold() {
    if !require("python", "python3") {
        return;
    }
    let cold = TestServer::start().await;
    let warm = pooled_server(2).await;
    let wpid = warm.pid as i32;
    let cases = [
        (
            "PYTHONPATH changes sys.path at start",
            json!({"languageId": "python", "code": "import sys\nprint('/opt/extra' in sys.path)", "env": {"PYTHONPATH": "/opt/extra"}}),
        ),
        (
            "PYTHONHASHSEED fixes hashes at start",
            json!({"languageId": "python", "code": "print(hash('replbox'))", "env": {"PYTHONHASHSEED": "7"}}),
        ),
        (
            "the locale is read at start",
            json!({"languageId": "python", "code": "import sys\nprint(sys.getfilesystemencoding(), sys.flags.utf8_mode)", "env": {"LC_ALL": "C", "LANG": "C"}}),
        ),
        (
            "HOME decides the user site directory at start",
            json!({"languageId": "python", "code": "import site, os\nprint(site.USER_SITE.startswith('/home/else'), os.environ['HOME'])", "env": {"HOME": "/home/else"}}),
        ),
        (
            "code with a NUL byte",
            json!({"languageId": "python", "code": "print(1)\u{0}"}),
        ),
    ];
    for (what, args) in cases {
        let c = cold.call("run-code", args.clone()).await;
        let ready = wait_ready(&warm, 2).await;
        let w = warm.call("run-code", args.clone()).await;
        assert_eq!(normalized(&c), normalized(&w), "{what}");
        let still = pool_helpers(wpid);
        assert!(
            ready.is_subset(&still),
            "{what}: a pooled interpreter was used (ready {ready:?}, now {still:?})"
        );
    }
    // The start-up variables really were honoured (by the cold start).
    let out = warm
        .call(
            "run-code",
            json!({"languageId": "python", "code": "import sys\nprint('/opt/extra' in sys.path)", "env": {"PYTHONPATH": "/opt/extra"}}),
        )
        .await;
    assert_eq!(out.text, "True\n");
    cold.stop().await;
    warm.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_pool_refills_with_fresh_interpreters() {
    if !require("python", "python3") {
        return;
    }
    let s = pooled_server(2).await;
    let mut seen = BTreeSet::new();
    for i in 0..5 {
        let ready = wait_ready(&s, 2).await;
        assert_eq!(ready.len(), 2, "never more than --pool: {ready:?}");
        seen.extend(ready.iter().copied());
        let out = s.run("python", &format!("print({i})")).await;
        assert_eq!(out.text, format!("{i}\n"));
    }
    let ready = wait_ready(&s, 2).await;
    seen.extend(ready.iter().copied());
    // Each run used one interpreter and one new one replaced it.
    assert_eq!(seen.len(), 2 + 5, "{seen:?}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pool_zero_starts_nothing_ahead() {
    if !require("python", "python3") {
        return;
    }
    let s = pooled_server(0).await;
    let out = s.run("python", "print('cold')").await;
    assert_eq!(out.text, "cold\n");
    // Nothing is started ahead, before or after a run.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let left = s.wait_no_descendants(Duration::from_secs(5)).await;
    assert!(left.is_empty(), "{left:?}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pooled_runs_leave_nothing_behind() {
    if !require("python", "python3") {
        return;
    }
    let s = std::sync::Arc::new(pooled_server(2).await);
    let pid = s.pid as i32;
    // A daemon started by a pooled run dies with the run. The run ends only once the daemon
    // is running (`sleep` with a unique duration, found by its command line).
    let tag = format!("987.{}", std::process::id());
    let code = format!(
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.execv('/bin/sleep', ['sleep', '{tag}'])\n    os._exit(0)\ndef up():\n    for p in filter(str.isdigit, os.listdir('/proc')):\n        try:\n            if b'{tag}' in open('/proc/' + p + '/cmdline', 'rb').read(): return True\n        except OSError: pass\nwhile not up(): time.sleep(0.01)\nprint('parent done')\n"
    );
    let ready = wait_ready(&s, 2).await;
    let out = s.run("python", &code).await;
    assert_eq!(out.text, "parent done\n");
    assert!(ready.iter().any(|h| !pool_helpers(pid).contains(h)));
    let left = wait_none_with(&format!("sleep {tag}"), Duration::from_secs(5)).await;
    assert!(
        left.is_empty(),
        "the daemon outlived the pooled run: {left:?}"
    );
    // Only the pool itself is left: each pooled interpreter with what carries it.
    let ready = wait_ready(&s, 2).await;
    let mut expected: BTreeSet<i32> = ready.clone();
    for h in &ready {
        expected.extend(descendants(*h));
    }
    let all: BTreeSet<i32> = s.descendants().into_iter().collect();
    assert_eq!(all, expected, "processes beside the pool");

    // Concurrent runs (more than the pool holds) are all right and independent.
    let mut tasks = Vec::new();
    for i in 0..6 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let code = format!(
                "import os, time\nopen('mine.txt', 'w').write('{i}')\ntime.sleep(0.2)\nprint('{i}', open('mine.txt').read(), sorted(os.listdir('.')))"
            );
            (i, s.run("python", &code).await)
        }));
    }
    for t in tasks {
        let (i, out) = t.await.expect("task");
        assert_eq!(out.text, format!("{i} {i} ['main.py', 'mine.txt']\n"));
    }
    // Closing the server kills the pool.
    let helpers = pool_helpers(pid);
    let interpreters: Vec<i32> = helpers.iter().flat_map(|h| descendants(*h)).collect();
    assert!(!helpers.is_empty());
    match std::sync::Arc::try_unwrap(s) {
        Ok(s) => s.stop().await,
        Err(_) => panic!("the server is still shared"),
    }
    let t = Instant::now();
    loop {
        let alive: Vec<i32> = helpers
            .iter()
            .chain(interpreters.iter())
            .copied()
            .filter(|p| ppid_state(*p).is_some_and(|(_, st)| st != 'Z'))
            .collect();
        if alive.is_empty() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "pool processes outlived the server: {alive:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
