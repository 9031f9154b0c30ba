//! `run-code` through a real MCP client.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

/// (language id, program, expected stdout) for every language with a built-in runner.
const HELLOS: &[(&str, &str, &str)] = &[
    (
        "python",
        "print('hello from python')",
        "hello from python\n",
    ),
    (
        "javascript",
        "console.log('hello from js')",
        "hello from js\n",
    ),
    ("shellscript", "echo hello from bash", "hello from bash\n"),
    ("ruby", "puts 'hello from ruby'", "hello from ruby\n"),
    ("perl", "print \"hello from perl\\n\";", "hello from perl\n"),
    (
        "php",
        "<?php echo \"hello from php\\n\";",
        "hello from php\n",
    ),
    ("lua", "print('hello from lua')", "hello from lua\n"),
    (
        "haskell",
        "main = putStrLn \"hello from haskell\"",
        "hello from haskell\n",
    ),
    ("r", "cat('hello from r\\n')", "hello from r\n"),
    (
        "go",
        "package main\nimport \"fmt\"\nfunc main() { fmt.Println(\"hello from go\") }",
        "hello from go\n",
    ),
    (
        "typescript",
        "const s: string = 'hello from ts'; console.log(s)",
        "hello from ts\n",
    ),
    (
        "c",
        "#include <stdio.h>\nint main(void) { puts(\"hello from c\"); return 0; }",
        "hello from c\n",
    ),
    (
        "cpp",
        "#include <iostream>\nint main() { std::cout << \"hello from cpp\\n\"; }",
        "hello from cpp\n",
    ),
    (
        "rust",
        "fn main() { println!(\"hello from rust\"); }",
        "hello from rust\n",
    ),
    (
        "java",
        "public class Main { public static void main(String[] a) { System.out.println(\"hello from java\"); } }",
        "hello from java\n",
    ),
    (
        "awk",
        "BEGIN { print \"hello from awk\" }",
        "hello from awk\n",
    ),
];

async fn advertised_languages(s: &TestServer) -> Vec<String> {
    let tools = s.client.list_all_tools().await.expect("tools/list");
    let run = tools
        .iter()
        .find(|t| t.name == "run-code")
        .expect("run-code is listed");
    run.input_schema["properties"]["languageId"]["enum"]
        .as_array()
        .expect("languageId has an enum of installed ids")
        .iter()
        .filter_map(|v| v.as_str().map(String::from))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn hello_in_every_installed_language() {
    let s = Server::stdio().start().await;
    let advertised = advertised_languages(&s).await;
    // The languages the README lists as supported must run wherever CI requires them.
    for (lang, program) in [
        ("python", "python3"),
        ("javascript", "node"),
        ("shellscript", "bash"),
        ("ruby", "ruby"),
        ("haskell", "runghc"),
    ] {
        if require(lang, program) {
            assert!(
                advertised.iter().any(|a| a == lang),
                "{lang} not advertised"
            );
        }
    }
    let mut ran = 0;
    for (lang, code, expected) in HELLOS {
        if !advertised.iter().any(|a| a == lang) {
            skip_optional(format!("hello in {lang}: not installed on this host"));
            continue;
        }
        let out = s.run(lang, code).await;
        assert!(!out.is_error, "{lang}: {}", out.text);
        assert_eq!(out.text, *expected, "{lang}");
        assert_eq!(out.s("stdout"), *expected, "{lang}");
        assert_eq!(out.structured["exit_code"], 0, "{lang}");
        assert_eq!(out.s("language"), *lang);
        ran += 1;
    }
    assert!(ran >= 3, "only {ran} languages ran");
    // Aliases resolve to the canonical language.
    let out = s.run("py", "print('alias')").await;
    assert_eq!(
        (out.text.as_str(), out.s("language")),
        ("alias\n", "python")
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stderr_with_exit_zero_is_not_an_error_and_is_kept() {
    let s = Server::stdio().start().await;
    let out = s
        .run(
            "python",
            "import sys\nprint('out')\nprint('warning: careful', file=sys.stderr)",
        )
        .await;
    assert!(!out.is_error, "{}", out.text);
    assert_eq!(out.s("stdout"), "out\n");
    assert_eq!(out.s("stderr"), "warning: careful\n");
    assert_eq!(out.structured["exit_code"], 0);
    assert_eq!(out.text, "out\n[stderr]\nwarning: careful\n[exit code 0]");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nonzero_exit_keeps_stdout_and_code() {
    let s = Server::stdio().start().await;
    let out = s
        .run("python", "import sys\nprint('partial')\nsys.exit(3)")
        .await;
    assert!(out.is_error);
    assert_eq!(out.s("stdout"), "partial\n");
    assert_eq!(out.structured["exit_code"], 3);
    assert_eq!(out.structured["signal"], Value::Null);
    assert_eq!(out.text, "partial\n[exit code 3]");
    // A signal is reported by name.
    let out = s.run("shellscript", "echo before; kill -SEGV $$").await;
    assert!(out.is_error);
    assert_eq!(out.s("stdout"), "before\n");
    assert_eq!(out.structured["signal"], "SIGSEGV");
    assert_eq!(out.structured["exit_code"], Value::Null);
    assert!(out.text.ends_with("[killed by SIGSEGV]"), "{}", out.text);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn infinite_loop_times_out_and_leaves_no_process() {
    let s = Server::stdio().start().await;
    // 5 s: python starts well within it even on a loaded host, so `started` is printed.
    let out = s
        .call(
            "run-code",
            json!({"languageId": "python", "code": "print('started', flush=True)\nwhile True: pass", "timeout_ms": 5000}),
        )
        .await;
    assert!(out.is_error);
    assert_eq!(out.structured["timed_out"], true);
    assert_eq!(out.s("stdout"), "started\n");
    assert!(out.structured["duration_ms"].as_u64().unwrap() >= 5000);
    assert!(out.text.contains("[timed out after"), "{}", out.text);
    let left = s.wait_no_descendants(Duration::from_secs(2)).await;
    assert!(left.is_empty(), "processes left: {left:?}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn daemons_die_with_the_run() {
    let s = Server::stdio().start().await;
    // A double-forked, setsid daemon heartbeats into the run's own directory (the only place
    // a sandboxed run may write) and carries a unique token in its command line, so that a
    // survivor is found anywhere on the host, even outside the server's tree.
    let tok = token();
    let code = format!(
        r#"
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sh", ["sh", "-c", "while :; do echo x >> hb; sleep 0.05; done", "{tok}"])
    os._exit(0)
t = time.time()
while not (os.path.exists("hb") and os.path.getsize("hb") > 0):
    if time.time() - t > 5:
        print("the daemon never ran")
        break
    time.sleep(0.01)
time.sleep(0.3)
print("parent done")
"#
    );
    let out = s.run("python", &code).await;
    assert_eq!(out.text, "parent done\n");
    let left = s.wait_no_descendants(Duration::from_secs(2)).await;
    assert!(left.is_empty(), "daemon survived: {left:?}");
    let left = wait_none_with(&tok, Duration::from_secs(2)).await;
    assert!(
        left.is_empty(),
        "daemon survived outside the tree: {left:?}"
    );
    // And on timeout too.
    let code2 = code.replace(
        "time.sleep(0.3)\nprint(\"parent done\")",
        "while True: pass",
    );
    let out = s
        .call(
            "run-code",
            json!({"languageId": "python", "code": code2, "timeout_ms": 1000}),
        )
        .await;
    assert_eq!(out.structured["timed_out"], true);
    let left = s.wait_no_descendants(Duration::from_secs(2)).await;
    assert!(left.is_empty(), "daemon survived a timeout: {left:?}");
    let left = wait_none_with(&tok, Duration::from_secs(2)).await;
    assert!(
        left.is_empty(),
        "daemon survived a timeout outside the tree: {left:?}"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_calls_are_independent() {
    let s = std::sync::Arc::new(Server::stdio().start().await);
    let mut tasks = Vec::new();
    for i in 0..8 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let code = format!(
                "import os, time\nopen('mine.txt','w').write('{i}')\ntime.sleep(0.3)\nprint('{i}', open('mine.txt').read(), sorted(os.listdir('.')))"
            );
            (i, s.run("python", &code).await)
        }));
    }
    for t in tasks {
        let (i, out) = t.await.unwrap();
        assert!(!out.is_error, "{i}: {}", out.text);
        assert_eq!(out.text, format!("{i} {i} ['main.py', 'mine.txt']\n"));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn huge_output_is_bounded_and_flagged() {
    let s = Server::stdio().start().await;
    let out = s
        .run(
            "python",
            "import sys\nsys.stdout.write('HEAD\\n' + 'x' * (10 * 1024 * 1024) + '\\nTAIL\\n')",
        )
        .await;
    assert!(!out.is_error, "exit 0 even when cut");
    assert_eq!(out.structured["truncated"], true);
    let stdout = out.s("stdout");
    assert!(stdout.len() <= 64 * 1024 + 100, "{} bytes", stdout.len());
    assert!(stdout.starts_with("HEAD\n"));
    assert!(stdout.ends_with("\nTAIL\n"));
    assert!(stdout.contains("bytes omitted"), "no omission note");
    let omitted: String = stdout
        .split("… ")
        .nth(1)
        .unwrap()
        .split(" bytes omitted")
        .next()
        .unwrap()
        .replace(',', "");
    assert_eq!(
        omitted.parse::<u64>().unwrap(),
        10 * 1024 * 1024 + 11 - 64 * 1024
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stdin_args_and_env_arrive() {
    let s = Server::stdio().start().await;
    let out = s
        .call(
            "run-code",
            json!({
                "languageId": "python",
                "code": "import sys, os\nprint(sys.stdin.read().upper(), sys.argv[1:], os.environ['GREETING'])",
                "stdin": "some input",
                "args": ["a b", "--flag"],
                "env": {"GREETING": "héllo"}
            }),
        )
        .await;
    assert!(!out.is_error, "{}", out.text);
    assert_eq!(out.text, "SOME INPUT ['a b', '--flag'] héllo\n");
    // Without stdin the program sees end of file at once instead of hanging.
    let out = s
        .run("python", "import sys\nprint(repr(sys.stdin.read()))")
        .await;
    assert_eq!(out.text, "''\n");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn server_environment_never_reaches_the_program() {
    let canary = token();
    let s = TestServer::start_with(
        &[],
        &[
            ("CANARY_SECRET", &canary),
            ("AWS_SECRET_ACCESS_KEY", &canary),
        ],
    )
    .await;
    let out = s
        .run(
            "shellscript",
            "env; cat /proc/self/environ | tr '\\0' '\\n'",
        )
        .await;
    assert!(!out.is_error, "{}", out.text);
    assert!(out.text.contains("HOME="), "{}", out.text);
    assert!(!out.text.contains(&canary), "canary leaked: {}", out.text);
    let out = s
        .run(
            "python",
            "import os\nprint(os.environ.get('CANARY_SECRET'))",
        )
        .await;
    assert_eq!(out.text, "None\n");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_language_lists_the_available_ones() {
    let s = Server::stdio().start().await;
    let out = s.run("cobol-77", "DISPLAY 'X'.").await;
    assert_eq!(out.error_kind(), "unsupported_language", "{}", out.text);
    assert!(
        out.text.contains("unknown language \"cobol-77\""),
        "{}",
        out.text
    );
    assert!(
        out.text.contains("python") && out.text.contains("javascript"),
        "{}",
        out.text
    );
    // A known language that is not installed says so.
    let advertised = advertised_languages(&s).await;
    if !advertised.iter().any(|a| a == "julia") {
        let out = s.run("julia", "println(1)").await;
        assert_eq!(out.error_kind(), "not_installed", "{}", out.text);
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_arguments_are_errors_and_the_server_keeps_serving() {
    let s = Server::stdio().start().await;
    for bad in [
        json!({"languageId": "python"}),
        json!({"code": "print(1)"}),
        json!({"languageId": "python", "code": 42}),
        json!({"languageId": "python", "code": "print(1)", "timeout": 5}),
        json!({"languageId": "python", "code": "print(1)", "args": "not-a-list"}),
        json!({"languageId": "python", "code": "print(1)", "env": {"A=B": "x"}}),
    ] {
        let out = s.call("run-code", bad.clone()).await;
        assert!(out.is_error, "{bad} was accepted: {}", out.text);
        assert!(!out.text.is_empty());
    }
    let out = s.run("python", "print('still here')").await;
    assert_eq!(out.text, "still here\n");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unicode_and_invalid_utf8_survive() {
    let s = Server::stdio().start().await;
    let out = s.run("python", "print('héllo 世界 🎉')").await;
    assert_eq!(out.text, "héllo 世界 🎉\n");
    let out = s
        .run(
            "python",
            "import sys\nsys.stdout.buffer.write(b'ok \\xff\\xfe end \\xc3\\xa9\\n')",
        )
        .await;
    assert!(!out.is_error);
    assert_eq!(out.s("stdout"), "ok \u{FFFD}\u{FFFD} end é\n");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn compile_errors_are_reported_as_such() {
    if !on_path("cc") {
        skip_optional("compile error test: no C compiler");
        return;
    }
    let s = Server::stdio().start().await;
    let out = s
        .run("c", "int main(void) { return undefined_thing; }")
        .await;
    assert!(out.is_error);
    assert_eq!(out.s("phase"), "compile");
    assert_eq!(out.structured["exit_code"], 1);
    assert!(out.s("stderr").contains("undefined_thing"));
    assert!(
        out.text.ends_with("[compile error: exit code 1]"),
        "{}",
        out.text
    );
    // A program that compiles and fails is a run failure.
    let out = s.run("c", "int main(void) { return 4; }").await;
    assert_eq!(
        (out.s("phase"), out.structured["exit_code"].as_i64()),
        ("run", Some(4))
    );
    s.stop().await;
}

/// Java's source launcher compiles in memory: its compile errors are compile errors too.
#[tokio::test(flavor = "multi_thread")]
async fn java_compile_errors_are_reported_as_such() {
    if !require("java", "javac") {
        return;
    }
    let s = Server::stdio().start().await;
    let out = s
        .run(
            "java",
            "class Main { public static void main(String[] a) { int x = ; } }",
        )
        .await;
    assert!(out.is_error);
    assert_eq!(out.s("phase"), "compile", "{}", out.text);
    assert_eq!(out.structured["exit_code"], 1);
    assert!(
        out.s("stderr").contains("Main.java:1: error"),
        "{}",
        out.text
    );
    assert!(
        out.text.ends_with("[compile error: exit code 1]"),
        "{}",
        out.text
    );
    // A program that compiles and fails is a run failure, whatever it prints.
    let out = s
        .run(
            "java",
            "class Main { public static void main(String[] a) { System.err.println(\"error: compilation failed!\"); System.exit(3); } }",
        )
        .await;
    assert_eq!(
        (out.s("phase"), out.structured["exit_code"].as_i64()),
        ("run", Some(3)),
        "{}",
        out.text
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn compile_time_counts_against_the_timeout() {
    if !on_path("cc") {
        skip_optional("compile timeout test: no C compiler");
        return;
    }
    let s = Server::stdio().start().await;
    let t = Instant::now();
    let out = s
        .call(
            "run-code",
            json!({"languageId": "c", "code": "int main(void){for(;;);}", "timeout_ms": 30}),
        )
        .await;
    assert!(out.is_error);
    assert_eq!(out.structured["timed_out"], true);
    assert_eq!(out.s("phase"), "compile");
    assert!(t.elapsed() < Duration::from_secs(5));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shellscript_crlf_and_cr_line_endings_run_as_lf() {
    let s = Server::stdio().start().await;
    // Bash would run `echo a\r` (printing the CR) and `cd d\r` (no such directory).
    let out = s.run("shellscript", "echo a\r\necho b\r\n").await;
    assert!(!out.is_error, "{}", out.text);
    assert_eq!(out.s("stdout"), "a\nb\n");
    assert_eq!(out.structured["exit_code"], 0);
    let out = s
        .run("shellscript", "mkdir d\rcd d\recho \"${PWD##*/}\"\r")
        .await;
    assert!(!out.is_error, "{}", out.text);
    assert_eq!(out.s("stdout"), "d\n");
    assert_eq!(out.s("stderr"), "");
    s.stop().await;
}
