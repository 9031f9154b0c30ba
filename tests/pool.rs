//! The warm pool for `run-code`: a pooled run gives exactly the result of a cold one, the
//! pool falls back to a cold start for what it cannot honour, refills, cleans up, and
//! `--pool 0` turns it off. Everything goes through the MCP client; nothing here measures
//! speed (the bench does).

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

/// The pooled languages: (language id, program that must be on PATH, what its pooled
/// interpreters carry on their command line: the loader's first line, or for node the
/// loader's file). Their helpers do not: the helper gets its program as data.
const POOLED: &[(&str, &str, &str)] = &[
    ("python", "python3", "replbox warm pool: python"),
    ("javascript", "node", "/.replbox-pool.js"),
    ("ruby", "ruby", "replbox warm pool: ruby"),
    ("shellscript", "bash", "replbox warm pool: bash"),
];

fn mark(lang: &str) -> &'static str {
    POOLED
        .iter()
        .find(|(l, _, _)| *l == lang)
        .map(|(_, _, m)| *m)
        .unwrap_or_else(|| panic!("{lang} is not pooled"))
}

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

/// The pooled interpreters of `lang` (every language's when None), by the pid of the
/// server's child that carries each (the helper, or bwrap around it).
fn pool_helpers_of(server: i32, lang: Option<&str>) -> BTreeSet<i32> {
    let marks: Vec<&str> = match lang {
        Some(l) => vec![mark(l)],
        None => POOLED.iter().map(|(_, _, m)| *m).collect(),
    };
    children(server)
        .into_iter()
        .filter(|&h| {
            descendants(h).into_iter().any(|p| {
                let c = cmdline(p);
                marks.iter().any(|m| c.contains(m))
            })
        })
        .collect()
}

fn pool_helpers(server: i32, lang: &str) -> BTreeSet<i32> {
    pool_helpers_of(server, Some(lang))
}

/// The pooled interpreters of `lang` waiting for a request: those whose tree is a chain
/// ending in one interpreter blocked reading its stdin. Returns the server's children that
/// carry them.
fn ready_pool(server: i32, lang: Option<&str>) -> BTreeSet<i32> {
    pool_helpers_of(server, lang)
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

async fn wait_ready(s: &TestServer, lang: &str, n: usize) -> BTreeSet<i32> {
    let t = Instant::now();
    loop {
        let ready = ready_pool(s.pid as i32, Some(lang));
        if ready.len() >= n {
            return ready;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the {lang} pool never had {n} interpreters ready (has {ready:?}; tree {:?})",
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

/// Arguments of run-code: `code` in `lang`, with `extra` fields.
fn args(lang: &str, code: &str, extra: Value) -> Value {
    let mut v = json!({"languageId": lang, "code": code});
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        for (k, x) in e {
            o.insert(k.clone(), x.clone());
        }
    }
    v
}

/// (what it checks, arguments of run-code) for programs whose cold and warm results must be
/// identical, in `lang`.
fn programs(lang: &str) -> Vec<(&'static str, Value)> {
    match lang {
        "python" => python_programs(),
        "javascript" => node_programs(),
        "ruby" => ruby_programs(),
        "shellscript" => bash_programs(),
        _ => panic!("no programs for {lang}"),
    }
}

fn python_programs() -> Vec<(&'static str, Value)> {
    let py = |code: &str| args("python", code, json!({}));
    let with = |code: &str, extra: Value| args("python", code, extra);
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
                "print('started', flush=True)\nimport time\nwhile True: time.sleep(1)",
                json!({"timeout_ms": 1500}),
            ),
        ),
    ]
}

fn node_programs() -> Vec<(&'static str, Value)> {
    let js = |code: &str| args("javascript", code, json!({}));
    let with = |code: &str, extra: Value| args("javascript", code, extra);
    vec![
        ("output", js("console.log(1+1)")),
        (
            "argv, main module, file names, execArgv, module cache",
            with(
                "console.log(process.argv.slice(1), process.argv[1] === __filename, require.main === module, module.id, module.parent, __dirname === process.cwd(), process.execArgv, Object.keys(require.cache), process.argv0 === process.argv[0] || process.argv0)",
                json!({"args": ["a b", "", "--flag", "é"]}),
            ),
        ),
        (
            "stdin given",
            with(
                "let d = ''\nprocess.stdin.setEncoding('utf8')\nprocess.stdin.on('data', c => d += c).on('end', () => console.log(JSON.stringify(d)))",
                json!({"stdin": "line one\nline two é"}),
            ),
        ),
        (
            "no stdin",
            js(
                "const fs = require('fs')\nconsole.log(JSON.stringify(fs.readFileSync(0, 'utf8')), fs.fstatSync(0).isFIFO())",
            ),
        ),
        (
            "environment: same variables, same order",
            with(
                "console.log(Object.keys(process.env).join(','))\nconsole.log(process.env.GREETING, process.env.HOME === process.cwd())",
                json!({"env": {"GREETING": "héllo wörld", "AAA_FIRST": "1", "ZZZ": "a=b"}}),
            ),
        ),
        (
            "environment reaches subprocesses",
            with(
                "console.log(require('child_process').execSync('echo $GREETING; cat', {input: 'piped'}).toString())",
                json!({"env": {"GREETING": "to the child"}}),
            ),
        ),
        (
            "a forked child starts as a cold one",
            js(
                "const { fork } = require('child_process')\nif (process.argv[2] === 'child') console.log('child', process.execArgv, process.argv.length)\nelse fork(__filename, ['child']).on('exit', c => console.log('parent saw', c))",
            ),
        ),
        (
            "CPU limit",
            js(
                "console.log(require('child_process').execSync('ulimit -St; ulimit -Ht').toString())",
            ),
        ),
        ("exit code", js("console.log('partial')\nprocess.exit(3)")),
        (
            "exitCode and exit handlers",
            js(
                "process.on('exit', c => console.log('exit', c))\nsetTimeout(() => { console.log('timer'); process.exitCode = 4 }, 10)",
            ),
        ),
        (
            "uncaught error: node's report and stack",
            js(
                "function inner() {\n  throw new Error('boom')\n}\nfunction outer() { inner() }\nouter()",
            ),
        ),
        ("syntax error", js("console.log('unclosed'\n")),
        (
            "import in a CommonJS file",
            js("import fs from 'fs'\nconsole.log(fs)"),
        ),
        ("missing module", js("require('no_such_module_here')")),
        (
            "unhandled rejection",
            js(
                "Promise.reject(new TypeError('rejected'))\nsetTimeout(() => console.log('never'), 100)",
            ),
        ),
        (
            "killed by a signal",
            js("console.log('x')\nprocess.kill(process.pid, 'SIGKILL')"),
        ),
        (
            "SIGINT",
            js("process.kill(process.pid, 'SIGINT')\nsetTimeout(() => {}, 1000)"),
        ),
        (
            "files in the run directory",
            js(
                "const fs = require('fs')\nfs.writeFileSync('out.txt', 'x')\nconsole.log(fs.readdirSync('.').sort())",
            ),
        ),
        (
            "require of a sibling file",
            js(
                "require('fs').writeFileSync('lib.js', 'module.exports = module.parent === require.main')\nconsole.log(require('./lib'))",
            ),
        ),
        (
            "stderr with exit 0",
            js("console.log('out')\nconsole.error('err')"),
        ),
        // node keeps the CPU limit it started with (the default timeout's), so a shorter
        // timeout runs cold: the servers of this test have a short default timeout for node,
        // and this program takes it (waiting, not spinning: the deadline is what is tested).
        (
            "timeout",
            js("console.log('started')\nsetInterval(() => {}, 1000)"),
        ),
    ]
}

fn ruby_programs() -> Vec<(&'static str, Value)> {
    let rb = |code: &str| args("ruby", code, json!({}));
    let with = |code: &str, extra: Value| args("ruby", code, extra);
    vec![
        ("output", rb("puts 1+1")),
        (
            "$0, __FILE__, __dir__, ARGV, self, locals, DATA",
            with(
                "p [$0, __FILE__, $PROGRAM_NAME, __dir__ == Dir.pwd, ARGV, ARGV.map(&:encoding), self, local_variables, defined?(DATA), __method__]",
                json!({"args": ["a b", "", "--flag", "é"]}),
            ),
        ),
        (
            "stdin given",
            with(
                "p $stdin.read, $stdin.tty?",
                json!({"stdin": "line one\nline two é"}),
            ),
        ),
        ("no stdin", rb("p $stdin.read, File.pipe?('/dev/stdin')")),
        (
            "environment: same variables, same order",
            with(
                "p ENV.keys\np ENV['GREETING'], ENV['GREETING'].encoding, ENV['HOME'] == Dir.pwd",
                json!({"env": {"GREETING": "héllo wörld", "AAA_FIRST": "1", "ZZZ": "a=b"}}),
            ),
        ),
        (
            "environment reaches subprocesses",
            with(
                "puts `echo $GREETING`",
                json!({"env": {"GREETING": "to the child"}}),
            ),
        ),
        ("CPU limit", rb("p Process.getrlimit(:CPU)")),
        ("exit code", rb("puts 'partial'\nexit 3")),
        ("exit!", rb("at_exit { puts 'not run' }\nexit!(4)")),
        ("abort", rb("abort 'bye'")),
        (
            "uncaught exception",
            rb("def inner\n  raise 'boom'\nend\n\ndef outer\n  inner\nend\n\nouter"),
        ),
        ("NameError with its highlight", rb("x = 1\nfoo_bar + x")),
        ("syntax error", rb("puts(\"x\"\n")),
        ("load error", rb("require 'no_such_gem_here'")),
        (
            "at_exit runs after an error",
            rb("at_exit { puts 'at_exit ran' }\nraise ArgumentError, 'x'"),
        ),
        ("Interrupt", rb("raise Interrupt")),
        (
            "killed by a signal",
            rb("puts 'x'\n$stdout.flush\nProcess.kill(:KILL, $$)"),
        ),
        ("top-level return", rb("puts 1\nreturn\nputs 2")),
        (
            "DATA after __END__",
            rb("puts DATA.read\n__END__\ndata here\n"),
        ),
        (
            "require_relative",
            rb(
                "File.write('lib.rb', 'X = __FILE__')\nrequire_relative 'lib'\np File.basename(X), $LOADED_FEATURES.grep(/lib.rb/).map { |f| File.basename(f) }",
            ),
        ),
        (
            "magic comments",
            rb("# frozen_string_literal: true\ns = 'a'\np s.frozen?, __ENCODING__"),
        ),
        ("warnings", rb("warn 'careful'\nx = 1 if (y = 2)\np x")),
        (
            "threads die with the main thread",
            rb("Thread.new { sleep 0.2; puts 'thread' }\nputs 'main'"),
        ),
        (
            "files in the run directory",
            rb("File.write('out.txt', 'x')\np Dir.children('.').sort"),
        ),
        ("stderr with exit 0", rb("puts 'out'\n$stderr.puts 'err'")),
        (
            "timeout",
            with(
                "puts 'started'\n$stdout.flush\nloop { sleep 1 }",
                json!({"timeout_ms": 1500}),
            ),
        ),
    ]
}

fn bash_programs() -> Vec<(&'static str, Value)> {
    let sh = |code: &str| args("shellscript", code, json!({}));
    let with = |code: &str, extra: Value| args("shellscript", code, extra);
    vec![
        ("output", sh("echo $((1+1))")),
        (
            "$0, arguments, BASH_SOURCE, SHLVL, $_",
            with(
                "echo \"$_|$0|$#|$*|${BASH_SOURCE[*]}|$LINENO|$SHLVL|${FUNCNAME[*]}|$BASH_ARGV0|${BASH_ARGV[*]}|$-\"\nf() { echo \"${FUNCNAME[*]}|${BASH_SOURCE[*]}|$(caller)\"; }\nf",
                json!({"args": ["a b", "", "--flag", "é"]}),
            ),
        ),
        (
            "stdin given",
            with("cat; echo", json!({"stdin": "line one\nline two é"})),
        ),
        ("no stdin", sh("cat; [ -p /dev/stdin ] && echo pipe")),
        (
            "environment: same variables, same order",
            with(
                "env\necho ---\nexport -p\necho ---\ntr '\\0' '\\n' < /proc/$$/environ",
                json!({"env": {"GREETING": "héllo wörld", "AAA_FIRST": "1", "ZZZ": "a=b"}}),
            ),
        ),
        (
            "BASH_ENV from the caller",
            with(
                "echo main",
                json!({"env": {"BASH_ENV": "/dev/null", "SHELLOPTS": "xtrace"}}),
            ),
        ),
        ("CPU limit", sh("ulimit -St; ulimit -Ht")),
        ("exit code", sh("echo partial\nexit 3")),
        (
            "command not found",
            sh("nosuch_command_here\necho \"after $?\""),
        ),
        ("syntax error", sh("echo before\nif then fi")),
        ("set -e", sh("set -e\nfalse\necho no")),
        ("EXIT trap", sh("trap 'echo bye' EXIT\necho hi")),
        ("killed by a signal", sh("echo x\nkill -9 $$")),
        ("SIGINT", sh("kill -INT $$\necho after")),
        (
            "process group and session",
            sh("read -r -a st < /proc/$$/stat\necho $(( st[4] == $$ )) $(( st[5] == $$ ))"),
        ),
        ("files in the run directory", sh("echo x > out.txt\nls -A")),
        ("stderr with exit 0", sh("echo out\necho err >&2")),
        (
            "timeout",
            with(
                "echo started\nwhile :; do sleep 1; done",
                json!({"timeout_ms": 1500}),
            ),
        ),
    ]
}

/// A cold and a pooled server at sandbox `level`, or None (with the reason printed; a
/// failure in CI) when the level does not work here.
async fn pair(level: &str, default_timeout_ms: &str) -> Option<(TestServer, TestServer)> {
    let start = |pool: &'static str| async move {
        let args = [
            "--sandbox",
            level,
            "--pool",
            pool,
            "--default-timeout-ms",
            default_timeout_ms,
        ];
        TestServer::try_start(&args, &[], None).await
    };
    match (start("0").await, start("2").await) {
        (Ok(c), Ok(w)) => Some((c, w)),
        (Err(e), _) | (_, Err(e)) => {
            skip(format!("pooled runs at level {level}: {e}"));
            None
        }
    }
}

/// Every program of `lang` cold and pooled, at `level`.
async fn same_cold_and_warm(lang: &str, level: &str) {
    let Some((_, program, _)) = POOLED.iter().find(|(l, _, _)| *l == lang) else {
        panic!("{lang} is not pooled");
    };
    if !require(lang, program) {
        return;
    }
    // Each level starts a process differently (bwrap, the helper's Landlock, neither).
    // node's timeout program takes the default timeout (see node_programs).
    let default_timeout = if lang == "javascript" {
        "6000"
    } else {
        "30000"
    };
    let Some((cold, warm)) = pair(level, default_timeout).await else {
        return;
    };
    let wpid = warm.pid as i32;
    // As root at level none there is no warm pool: a run's uid is bound to its caller
    // before it runs (docs/security.md, Uids and principals). Its runs are cold ones.
    let no_pool = level == "none" && nix::unistd::geteuid().is_root();
    let mut failures = Vec::new();
    for (what, args) in programs(lang) {
        let c = cold.call("run-code", args.clone()).await;
        if no_pool {
            let idle = pool_helpers(wpid, lang);
            assert!(
                idle.is_empty(),
                "{level}: interpreters started ahead: {idle:?}"
            );
        }
        let ready = if no_pool {
            BTreeSet::new()
        } else {
            wait_ready(&warm, lang, 2).await
        };
        let w = warm.call("run-code", args.clone()).await;
        // The run used one of the interpreters that were ready (its helper is gone).
        let still = pool_helpers(wpid, lang);
        assert!(
            no_pool || ready.iter().any(|h| !still.contains(h)),
            "{lang} {level} {what}: the run did not use the pool (ready {ready:?}, now {still:?})"
        );
        assert_eq!(c.structured["sandbox"], level, "{}", c.text);
        let (nc, nw) = (normalized(&c), normalized(&w));
        if nc != nw {
            failures.push(format!(
                "{lang} {level} {what}:\n  cold {}\n  warm {}",
                serde_json::to_string(&nc).unwrap_or_default(),
                serde_json::to_string(&nw).unwrap_or_default()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    cold.stop().await;
    warm.stop().await;
}

/// `pooled_runs!(name, lang)`: a module `name` with one test per sandbox level (each starts
/// its processes differently: bwrap, the helper's Landlock, neither), side by side.
macro_rules! pooled_runs {
    ($name:ident, $lang:literal) => {
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread")]
            async fn bwrap() {
                same_cold_and_warm($lang, "bwrap").await;
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn landlock() {
                same_cold_and_warm($lang, "landlock").await;
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn none() {
                same_cold_and_warm($lang, "none").await;
            }
        }
    };
}

pooled_runs!(pooled_python_runs_give_exactly_the_cold_results, "python");
pooled_runs!(pooled_node_runs_give_exactly_the_cold_results, "javascript");
pooled_runs!(pooled_ruby_runs_give_exactly_the_cold_results, "ruby");
pooled_runs!(
    pooled_bash_runs_give_exactly_the_cold_results,
    "shellscript"
);

#[tokio::test(flavor = "multi_thread")]
async fn what_the_pool_cannot_honour_runs_cold() {
    if !require("python", "python3") {
        return;
    }
    let cold = Server::stdio().start().await;
    let warm = pooled_server(2).await;
    let wpid = warm.pid as i32;
    let mut cases = vec![
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
    if on_path("node") {
        cases.push((
            "NODE_OPTIONS is read at start",
            json!({"languageId": "javascript", "code": "console.log(process.execArgv, process.env.NODE_OPTIONS)", "env": {"NODE_OPTIONS": "--stack-size=500"}}),
        ));
        cases.push((
            "node cannot lower its CPU limit to a shorter timeout's",
            json!({"languageId": "javascript", "code": "console.log(require('child_process').execSync('ulimit -t').toString())", "timeout_ms": 5000}),
        ));
    }
    if on_path("ruby") {
        cases.push((
            "RUBYOPT is read at start",
            json!({"languageId": "ruby", "code": "p $VERBOSE", "env": {"RUBYOPT": "-W2"}}),
        ));
    }
    for (what, args) in cases {
        let lang = args["languageId"].as_str().unwrap_or_default().to_string();
        let c = cold.call("run-code", args.clone()).await;
        let ready = wait_ready(&warm, &lang, 2).await;
        let w = warm.call("run-code", args.clone()).await;
        assert_eq!(normalized(&c), normalized(&w), "{what}");
        let still = pool_helpers(wpid, &lang);
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
        let ready = wait_ready(&s, "python", 2).await;
        assert_eq!(ready.len(), 2, "never more than --pool: {ready:?}");
        seen.extend(ready.iter().copied());
        let out = s.run("python", &format!("print({i})")).await;
        assert_eq!(out.text, format!("{i}\n"));
    }
    let ready = wait_ready(&s, "python", 2).await;
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
    let ready = wait_ready(&s, "python", 2).await;
    let out = s.run("python", &code).await;
    assert_eq!(out.text, "parent done\n");
    assert!(
        ready
            .iter()
            .any(|h| !pool_helpers(pid, "python").contains(h))
    );
    let left = wait_none_with(&format!("sleep {tag}"), Duration::from_secs(5)).await;
    assert!(
        left.is_empty(),
        "the daemon outlived the pooled run: {left:?}"
    );
    // Only the pools themselves are left: each pooled interpreter (of every language) with
    // what carries it.
    let mut ready = BTreeSet::new();
    for (lang, program, _) in POOLED {
        if on_path(program) {
            ready.extend(wait_ready(&s, lang, 2).await);
        }
    }
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
    let helpers = pool_helpers_of(pid, None);
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

#[tokio::test(flavor = "multi_thread")]
async fn back_to_back_runs_grow_the_pool_up_to_the_cap() {
    if !require("python", "python3") {
        return;
    }
    let s = std::sync::Arc::new(pooled_server(4).await);
    wait_ready(&s, "python", 2).await;
    // Runs at once empty the pool: it grows (2 -> 4), never past --pool.
    let mut tasks = Vec::new();
    for i in 0..6 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            (i, s.run("python", &format!("print({i})")).await)
        }));
    }
    for t in tasks {
        let (i, out) = t.await.expect("task");
        assert_eq!(out.text, format!("{i}\n"));
    }
    let ready = wait_ready(&s, "python", 4).await;
    assert_eq!(ready.len(), 4, "{ready:?}");
    let all = pool_helpers(s.pid as i32, "python");
    assert_eq!(all.len(), 4, "never more than --pool: {all:?}");
    match std::sync::Arc::try_unwrap(s) {
        Ok(s) => s.stop().await,
        Err(_) => panic!("the server is still shared"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn pooled_interpreters_give_their_uids_to_callers() {
    if !require("python", "python3") {
        return;
    }
    if !is_root() {
        skip_optional("uids are handed out only when the server runs as root");
        return;
    }
    // 4 uids: the pools take at most 2 (they leave a quarter, at least 2, free), and give
    // theirs up when callers need them.
    unbind_test_uids(231_000, 4);
    let s =
        TestServer::start_with(&["--pool", "2", "--uids", "4", "--uid-base", "231000"], &[]).await;
    let t = Instant::now();
    while ready_pool(s.pid as i32, None).len() < 2 {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the pools never filled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut ids = Vec::new();
    for i in 0..4 {
        let out = s.call("session_start", json!({"language": "python"})).await;
        assert!(!out.is_error, "session {i}: {}", out.text);
        ids.push(
            out.structured["session_id"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
    }
    assert!(
        ready_pool(s.pid as i32, None).is_empty(),
        "every uid is a session's: no pooled interpreter is left"
    );
    let out = s.run("python", "print('no uid left')").await;
    assert!(
        out.is_error || out.structured["error"].is_string(),
        "{}",
        out.text
    );
    assert!(out.text.contains("sandbox user ids"), "{}", out.text);
    // A closed session's uid serves runs again.
    let out = s.call("session_close", json!({"session_id": ids[0]})).await;
    assert!(!out.is_error, "{}", out.text);
    let out = s.run("python", "print('ran')").await;
    assert_eq!(out.text, "ran\n");
    s.stop().await;
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}
