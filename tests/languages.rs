//! The conformance test of session languages: every session language runs the same checks
//! through the MCP client, from a row of code per language. A new session language is a
//! folder in prompts/ (see docs/bootstrap-protocol.md) and a row here.

use crate::common;

use common::*;
use replbox::api::Format;
use serde_json::{Value, json};

/// The code one language runs for each check, and what it must show.
struct Row {
    language: &'static str,
    /// The program that must be installed (the row is skipped, saying so, without it).
    program: &'static str,
    /// A trailing expression, and its value as the REPL shows it.
    value: (&'static str, &'static str),
    /// Code that fails, the error's type, and a part of its message.
    error: (&'static str, &'static str, &'static str),
    /// Set x to 41.
    set_x: &'static str,
    /// A loop that never ends.
    forever: &'static str,
    /// Read x back, and what that shows.
    read_x: (&'static str, &'static str),
    /// Code that prints the prompt `Name? `, reads a line and greets it: `hello Ada`.
    ask: &'static str,
    /// Code that ends the interpreter with exit code 3.
    exit3: &'static str,
    /// Print `héllo ✓ 日本` on a line.
    unicode: &'static str,
    /// Print `line 0` to `line 199999`, a line each.
    many_lines: &'static str,
    /// Print the working directory on a line.
    print_cwd: &'static str,
    /// Print `LIT` on a line, and the literal format (of placeholders) LIT is written in.
    print_literal: (&'static str, Format),
    /// A command that checks the syntax of the source file given after it (none: no check).
    syntax_check: &'static [&'static str],
}

const ROWS: &[Row] = &[
    Row {
        language: "python",
        program: "python3",
        value: ("6 * 7", "42\n"),
        error: ("1 / 0", "ZeroDivisionError", "division by zero"),
        set_x: "x = 41",
        forever: "while True: pass",
        read_x: ("x + 1", "42\n"),
        ask: "name = input('Name? ')\nprint('hello', name)",
        exit3: "import sys; sys.exit(3)",
        unicode: "print('héllo ✓ 日本')",
        many_lines: "for i in range(200000): print('line', i)",
        print_cwd: "import os; print(os.getcwd())",
        print_literal: ("print(LIT)", Format::Json),
        syntax_check: &[
            "python3",
            "-c",
            "import ast, sys; ast.parse(open(sys.argv[1]).read())",
        ],
    },
    Row {
        language: "javascript",
        program: "node",
        value: ("6 * 7", "42\n"),
        error: ("null.x", "TypeError", "Cannot read properties of null"),
        set_x: "let x = 41",
        forever: "while (true) {}",
        read_x: ("x + 1", "42\n"),
        ask: "const rl = require('readline').createInterface({input: process.stdin, output: process.stdout})\nconst name = await new Promise(r => rl.question('Name? ', r))\nrl.close()\nconsole.log('hello', name)",
        exit3: "process.exit(3)",
        unicode: "console.log('héllo ✓ 日本')",
        many_lines: "for (let i = 0; i < 200000; i++) console.log('line', i)",
        print_cwd: "console.log(process.cwd())",
        print_literal: ("console.log(LIT)", Format::Json),
        syntax_check: &["node", "--check"],
    },
    Row {
        language: "ruby",
        program: "ruby",
        value: ("6 * 7", "=> 42\n"),
        error: ("1 / 0", "ZeroDivisionError", "divided by 0"),
        set_x: "x = 41",
        forever: "loop {}",
        read_x: ("x + 1", "=> 42\n"),
        ask: "print 'Name? '\nname = gets.chomp\nputs \"hello #{name}\"",
        exit3: "exit 3",
        unicode: "puts 'héllo ✓ 日本'",
        many_lines: "200000.times { |i| puts \"line #{i}\" }\nnil",
        print_cwd: "puts Dir.pwd",
        print_literal: ("puts LIT", Format::Ruby),
        syntax_check: &["ruby", "-c"],
    },
    Row {
        language: "haskell",
        program: "ghci",
        value: ("6 * 7", "42\n"),
        error: ("error \"bad value\" :: Int", "Exception", "bad value"),
        set_x: "x = 41",
        forever: "length [1..]",
        read_x: ("x + 1", "42\n"),
        ask: "putStr \"Name? \"\nname <- getLine\nputStrLn (\"hello \" ++ name)",
        exit3: "System.Posix.Process.exitImmediately (System.Exit.ExitFailure 3)",
        unicode: "putStrLn \"héllo ✓ 日本\"",
        many_lines: "mapM_ (\\i -> putStrLn (\"line \" ++ show i)) [0 .. 199999 :: Int]",
        print_cwd: "System.Directory.getCurrentDirectory >>= putStrLn",
        print_literal: ("putStrLn LIT", Format::Haskell),
        syntax_check: &[],
    },
    Row {
        language: "shellscript",
        program: "bash",
        value: ("echo $((6 * 7))", "42\n"),
        error: ("false", "exit_status", "1"),
        set_x: "x=41",
        forever: "while :; do :; done",
        read_x: ("echo $((x + 1))", "42\n"),
        ask: "read -p 'Name? ' name\necho \"hello $name\"",
        exit3: "exit 3",
        unicode: "echo 'héllo ✓ 日本'",
        many_lines: "seq -f 'line %g' 0 199999",
        print_cwd: "pwd",
        print_literal: ("printf '%s\\n' LIT", Format::Shell),
        syntax_check: &["bash", "-n"],
    },
    Row {
        language: "r",
        program: "R",
        value: ("6 * 7", "[1] 42\n"),
        error: ("stop(\"bad value\")", "simpleError", "bad value"),
        set_x: "x <- 41",
        forever: "repeat {}",
        read_x: ("x + 1", "[1] 42\n"),
        ask: "name <- readline('Name? ')\ncat('hello ', name, '\\n', sep = '')",
        exit3: "q(status = 3)",
        unicode: "cat('héllo ✓ 日本\\n')",
        many_lines: "writeLines(paste('line', 0:199999))",
        print_cwd: "cat(getwd(), '\\n', sep = '')",
        // A JSON string is an R string literal.
        print_literal: ("cat(LIT, '\\n', sep = '')", Format::Json),
        syntax_check: &[
            "Rscript",
            "-e",
            "invisible(parse(file = commandArgs(TRUE)[1]))",
        ],
    },
];

impl common::Row for Row {
    fn language(&self) -> &str {
        self.language
    }
}

/// The rows whose interpreter is installed (a missing one is skipped with a printed reason,
/// and fails under REPLBOX_REQUIRE_ALL=1).
fn installed() -> Vec<&'static Row> {
    ROWS.iter()
        .filter(|r| require(r.language, r.program))
        .collect()
}

/// Text that breaks out of string literals and runs commands if it is ever spliced into
/// code as it is: quotes of every kind, a newline, shell command substitution, Ruby
/// interpolation, JavaScript and Python calls, and a placeholder. Short enough to be a
/// file name. Anything it would create is named `canary*`.
const HOSTILE: &str = concat!(
    "q'uo\"te\nline'''x\"\"\"y`touch canary1`$(touch canary2){nonce}",
    "#{`touch canary3`}\"+require('fs').writeFileSync('canary4','')+\"",
    "'+__import__('os').system('touch canary5')+'%s\\z é✓",
);

/// Files named `canary*` anywhere under `dir`.
fn canaries(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_name().to_string_lossy().starts_with("canary") {
                found.push(p.clone());
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(p);
            }
        }
    }
    found
}

fn error_of(o: &Out) -> (&str, &str) {
    (
        o.structured["error"]["type"].as_str().unwrap_or("?"),
        o.structured["error"]["message"].as_str().unwrap_or("?"),
    )
}

#[test]
fn every_session_language_has_a_row() {
    let registry = replbox::api::Registry::load(None).expect("the built-in languages load");
    let mut sessions: Vec<&str> = registry
        .all()
        .iter()
        .filter(|l| l.has_session())
        .map(|l| l.id())
        .collect();
    let mut rows: Vec<&str> = ROWS.iter().map(|r| r.language).collect();
    sessions.sort();
    rows.sort();
    assert_eq!(sessions, rows, "a row per session language");
}

per_row!(
    a_value_is_shown_as_the_repl_shows_it,
    ROWS,
    [python, javascript, ruby, haskell, shellscript, r],
    |row| {
        let s = Server::stdio().start().await;
        let id = s.start_session(row.language).await;
        let o = s.eval(&id, row.value.0).await;
        assert_eq!(
            (status(&o), output(&o)),
            ("ok", row.value.1),
            "{}: {}",
            row.language,
            o.text
        );
        assert!(!o.is_error, "{}", row.language);
        s.stop().await;
    }
);

per_row!(
    an_error_has_its_type_and_message,
    ROWS,
    [python, javascript, ruby, haskell, shellscript, r],
    |row| {
        let s = Server::stdio().start().await;
        let id = s.start_session(row.language).await;
        let (code, kind, message) = row.error;
        let o = s.eval(&id, code).await;
        assert_eq!(status(&o), "error", "{}: {}", row.language, o.text);
        assert!(o.is_error, "{}", row.language);
        let (got_kind, got_message) = error_of(&o);
        assert_eq!(got_kind, kind, "{}: {}", row.language, o.structured);
        assert!(
            got_message.contains(message),
            "{}: {got_message:?}",
            row.language
        );
        // The session goes on.
        let o = s.eval(&id, row.value.0).await;
        assert_eq!(output(&o), row.value.1, "{}", row.language);
        s.stop().await;
    }
);

per_row!(
    an_interrupt_at_the_deadline_keeps_the_state,
    ROWS,
    [python, javascript, ruby, haskell, shellscript, r],
    |row| {
        let s = Server::stdio().start().await;
        let id = s.start_session(row.language).await;
        let o = s.eval(&id, row.set_x).await;
        assert_eq!(status(&o), "ok", "{}: {}", row.language, o.text);
        let o = s.eval_t(&id, row.forever, 1000).await;
        assert_eq!(status(&o), "timeout", "{}: {}", row.language, o.text);
        assert_eq!(
            o.structured.get("restarted"),
            None,
            "{}: {}",
            row.language,
            o.text
        );
        let o = s.eval(&id, row.read_x.0).await;
        assert_eq!(
            (status(&o), output(&o)),
            ("ok", row.read_x.1),
            "{}: x survived",
            row.language
        );
        s.stop().await;
    }
);

per_row!(
    an_input_wait_is_reported_and_answered,
    ROWS,
    [python, javascript, ruby, haskell, shellscript, r],
    |row| {
        let s = Server::stdio().start().await;
        let id = s.start_session(row.language).await;
        let o = s.eval(&id, row.ask).await;
        assert_eq!(status(&o), "awaiting_input", "{}: {}", row.language, o.text);
        assert!(
            output(&o).ends_with("Name? "),
            "{}: {:?}",
            row.language,
            output(&o)
        );
        let eval_id = o.structured["eval_id"].clone();
        let o = s
            .call("session_input", json!({"session_id": id, "text": "Ada"}))
            .await;
        assert_eq!(status(&o), "ok", "{}: {}", row.language, o.text);
        assert_eq!(o.structured["eval_id"], eval_id, "{}", row.language);
        assert!(
            output(&o).ends_with("hello Ada\n"),
            "{}: {:?}",
            row.language,
            output(&o)
        );
        s.stop().await;
    }
);

per_row!(
    exit_ends_the_session_with_its_code,
    ROWS,
    [python, javascript, ruby, haskell, shellscript, r],
    |row| {
        let s = Server::stdio().start().await;
        let id = s.start_session(row.language).await;
        let o = s.eval(&id, row.exit3).await;
        assert_eq!(status(&o), "exited", "{}: {}", row.language, o.text);
        assert_eq!(o.structured["exit_code"], 3, "{}: {}", row.language, o.text);
        let o = s.eval(&id, row.value.0).await;
        assert!(o.is_error, "{}: {}", row.language, o.text);
        s.stop().await;
    }
);

per_row!(
    unicode_round_trips,
    ROWS,
    [python, javascript, ruby, haskell, shellscript, r],
    |row| {
        let s = Server::stdio().start().await;
        let id = s.start_session(row.language).await;
        let o = s.eval(&id, row.unicode).await;
        assert_eq!(
            (status(&o), output(&o)),
            ("ok", "héllo ✓ 日本\n"),
            "{}",
            row.language
        );
        s.stop().await;
    }
);

per_row!(
    large_output_keeps_head_and_tail,
    ROWS,
    [python, javascript, ruby, haskell, shellscript, r],
    |row| {
        let s = Server::stdio().start().await;
        let id = s.start_session(row.language).await;
        let o = s.eval_t(&id, row.many_lines, 120_000).await;
        assert_eq!(status(&o), "ok", "{}: {}", row.language, o.text);
        assert_eq!(o.structured["truncated"], true, "{}", row.language);
        let out = output(&o);
        // The default cap: 64 KiB of head and tail, and the line that says what was left out.
        assert!(
            out.len() <= 64 * 1024 + 200,
            "{}: {} bytes",
            row.language,
            out.len()
        );
        assert!(out.starts_with("line 0\nline 1\n"), "{}", row.language);
        assert!(
            out.ends_with("line 199998\nline 199999\n"),
            "{}",
            row.language
        );
        assert!(out.contains("bytes omitted"), "{}", row.language);
        let o = s.eval(&id, row.value.0).await;
        assert_eq!(output(&o), row.value.1, "{}: in step", row.language);
        s.stop().await;
    }
);

per_row!(
    /// What a bootstrap's placeholders become is read back as the same text by the language
    /// itself: each format is a literal of the languages that use it.
    placeholder_literals_read_back_as_the_same_text,
    ROWS,
    [python, javascript, ruby, haskell, shellscript, r],
    |row| {
        let s = Server::stdio().start().await;
        let id = s.start_session(row.language).await;
        let (template, format) = row.print_literal;
        let code = template.replace("LIT", &format.quote(HOSTILE));
        let o = s.eval(&id, &code).await;
        assert_eq!(
            (status(&o), output(&o)),
            ("ok", format!("{HOSTILE}\n").as_str()),
            "{}: {code}",
            row.language
        );
        let cwd = std::path::PathBuf::from(
            s.call("session_list", json!({})).await.structured["sessions"]
                .as_array()
                .and_then(|l| l.iter().find(|r| r["session_id"] == id.as_str()))
                .and_then(|r| r["cwd"].as_str())
                .expect("the session is listed"),
        );
        assert_eq!(
            canaries(&cwd),
            Vec::<std::path::PathBuf>::new(),
            "{}",
            row.language
        );
        s.stop().await;
    }
);

/// A bootstrap is real source: as it is in prompts/ (its placeholders happen to read as
/// dict, object or hash literals, so editors and linters take it) and once expanded with
/// hostile directory names, it parses in its language.
#[test]
fn bootstrap_sources_parse_as_they_are_and_expanded() {
    let registry = replbox::api::Registry::load(None).expect("the built-in languages load");
    let tmp = tempfile::tempdir().expect("tempdir");
    let hostile = tmp.path().join(HOSTILE);
    for row in installed() {
        let Some((program, args)) = row.syntax_check.split_first() else {
            continue;
        };
        let lang = registry
            .all()
            .iter()
            .find(|l| l.id() == row.language)
            .expect("a registered language");
        let session = lang.spec.session.as_ref().expect("a session language");
        let values = session.values(
            "0123456789abcdef",
            &hostile,
            &hostile,
            &hostile,
            &hostile,
            8,
        );
        for (what, text) in [
            ("as it is", session.bootstrap.text.clone()),
            ("expanded", values.expand(&session.bootstrap.text)),
        ] {
            let file = tmp.path().join(&session.bootstrap.file);
            std::fs::write(&file, &text).expect("write");
            let out = std::process::Command::new(program)
                .args(args)
                .arg(&file)
                .output()
                .expect("run the syntax check");
            assert!(
                out.status.success(),
                "{} {what}: {}",
                row.language,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

per_row!(
    /// The caller's `cwd` and the operator's work directory end up in paths the bootstrap is
    /// given (the control and output directories); with hostile names every language still
    /// starts, evaluates and reports errors, and nothing in the names runs.
    hostile_directory_names_stay_data,
    ROWS,
    [python, javascript, ruby, haskell, shellscript, r],
    |row| {
        let parent = tempfile::tempdir().expect("tempdir");
        let work_dir = parent.path().join(format!("work-{HOSTILE}"));
        let cwd = parent.path().join(format!("cwd-{HOSTILE}"));
        // The work dir sticky, as /tmp is: the server refuses one in which others could
        // rename its working area.
        for (d, mode) in [(&work_dir, 0o1777), (&cwd, 0o777)] {
            std::fs::create_dir(d).expect("mkdir");
            std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .expect("chmod");
        }
        // The session's uid must reach the cwd, which lies in a tree the sandbox hides unless the
        // operator allows it.
        std::fs::set_permissions(
            parent.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("chmod");
        let work_arg = work_dir.to_str().expect("UTF-8");
        let allow = parent.path().to_str().expect("UTF-8");
        let s = Server::stdio()
            .args(["--work-dir", work_arg, "--allow-cwd", allow])
            .start()
            .await;
        let lang = row.language;
        for start in [
            json!({"language": lang}),
            json!({"language": lang, "cwd": cwd}),
        ] {
            let o = s.call("session_start", start.clone()).await;
            assert!(!o.is_error, "{lang} {start}: {}", o.text);
            let id = o.s("session_id").to_string();
            let here = o.s("cwd").to_string();
            let o = s.eval(&id, row.value.0).await;
            assert_eq!(
                (status(&o), output(&o)),
                ("ok", row.value.1),
                "{lang} {start}: {}",
                o.text
            );
            let o = s.eval(&id, row.error.0).await;
            assert_eq!(error_of(&o).0, row.error.1, "{lang} {start}: {}", o.text);
            let o = s.eval(&id, row.print_cwd).await;
            assert_eq!(output(&o), format!("{here}\n"), "{lang} {start}");
            assert!(here.contains(HOSTILE), "{lang}: {here}");
            let o = s.eval_t(&id, row.forever, 1000).await;
            assert_eq!(status(&o), "timeout", "{lang} {start}: {}", o.text);
            assert_eq!(o.structured.get("restarted"), None, "{lang} {start}");
            let found = canaries(parent.path());
            assert!(found.is_empty(), "{lang} {start}: {found:?}");
            s.call("session_close", json!({"session_id": id})).await;
        }
        s.stop().await;
    }
);

/// session_start's description names the session languages installed here, with their
/// aliases, and nothing else (its `language` field points there).
#[tokio::test(flavor = "multi_thread")]
async fn session_start_names_the_installed_session_languages() {
    let s = Server::stdio().start().await;
    let tools = s.client.list_all_tools().await.expect("tools/list");
    let start = tools
        .iter()
        .find(|t| t.name == "session_start")
        .expect("session_start");
    let description = start.description.as_deref().unwrap_or_default().to_string();
    let field =
        Value::Object((*start.input_schema).clone())["properties"]["language"]["description"]
            .as_str()
            .unwrap_or_default()
            .to_string();
    for row in ROWS {
        let here = on_path(row.program);
        assert_eq!(
            description.contains(&format!("{} (", row.language)),
            here,
            "{}: {description}",
            row.language
        );
    }
    assert!(
        description.contains("python (py, python3)") || !on_path("python3"),
        "{description}"
    );
    assert!(field.contains("id or alias"), "{field}");
    // Languages without a REPL driver are not offered.
    assert!(!description.contains("perl"), "{description}");
    s.stop().await;
}

/// A session language added without a rebuild: a folder given with `--prompts`.
#[tokio::test(flavor = "multi_thread")]
async fn a_new_session_language_is_a_folder() {
    if !require("python", "python3") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let folder = dir.path().join("pyclone");
    std::fs::create_dir(&folder).expect("mkdir");
    let builtin = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("prompts/python");
    for entry in std::fs::read_dir(&builtin).expect("prompts/python") {
        let path = entry.expect("entry").path();
        let name = path.file_name().expect("name").to_owned();
        std::fs::copy(&path, folder.join(name)).expect("copy");
    }
    let toml = std::fs::read_to_string(folder.join("language.toml")).expect("read");
    let toml = toml
        .replace("id = \"python\"", "id = \"pyclone\"")
        .replace("aliases = [\"py\", \"python3\"]", "aliases = []");
    std::fs::write(folder.join("language.toml"), toml).expect("write");
    let s = TestServer::start_with(&["--prompts", dir.path().to_str().expect("UTF-8")], &[]).await;
    let tools = s.client.list_all_tools().await.expect("tools/list");
    let start = tools
        .iter()
        .find(|t| t.name == "session_start")
        .expect("session_start");
    assert!(
        start
            .description
            .as_deref()
            .is_some_and(|d| d.contains("pyclone")),
        "{:?}",
        start.description
    );
    let id = s.start_session("pyclone").await;
    let o = s.eval(&id, "6 * 7").await;
    assert_eq!((status(&o), output(&o)), ("ok", "42\n"), "{}", o.text);
    s.stop().await;
}
