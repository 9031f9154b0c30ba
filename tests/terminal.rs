//! Sessions behave like a careful person at a terminal in the cases agents hit: input the
//! program did not read, reads of /dev/tty, reads with their own timeout, a prompt the
//! user changed, a forced restart, CRLF code, keys sent alone, and each REPL's own corner
//! (ghci's stdin, node's dot-commands, R's interrupts and workers). Every check runs
//! through the MCP client, one test per language, from a table (`per_row!`).

use crate::common;

use common::*;
use serde_json::json;

/// Whether `language` can run here (a missing one is skipped, saying so, and fails under
/// REPLBOX_REQUIRE_ALL=1).
fn here(language: &str) -> bool {
    require_language(language)
}

async fn input(s: &TestServer, id: &str, text: &str) -> Out {
    s.call("session_input", json!({"session_id": id, "text": text}))
        .await
}

/// Type `text` exactly, with no Enter.
async fn keys(s: &TestServer, id: &str, text: &str) -> Out {
    s.call(
        "session_input",
        json!({"session_id": id, "text": text, "enter": false}),
    )
    .await
}

fn discarded(o: &Out) -> Option<&str> {
    o.structured["discarded_input"].as_str()
}

fn error_type(o: &Out) -> &str {
    o.structured["error"]["type"].as_str().unwrap_or("")
}

/// Evaluate `code`, which must wait for input, and say so.
async fn awaits(s: &TestServer, id: &str, lang: &str, code: &str) -> Out {
    let o = s.eval(id, code).await;
    assert_eq!(status(&o), "awaiting_input", "{lang}: {code}: {}", o.text);
    o
}

/// Evaluate `code` and require `ok` with exactly `expected` as output.
async fn prints(s: &TestServer, id: &str, lang: &str, code: &str, expected: &str) {
    let o = s.eval(id, code).await;
    assert_eq!(
        (status(&o), output(&o)),
        ("ok", expected),
        "{lang}: {code}: {}",
        o.text
    );
}

// ---- 1. Input the program did not read never runs as code -------------------------------

/// (language, code that reads one line and prints `got LINE`, code that prints INJECTED,
/// code that prints `after`)
const READ_ONE: &[(&str, &str, &str, &str)] = &[
    (
        "python",
        "v = input('one? ')\nprint('got', v)",
        "print('INJECTED')",
        "print('after')",
    ),
    (
        "javascript",
        "const b = Buffer.alloc(100)\nconst k = require('fs').readSync(0, b)\nconsole.log('got', b.subarray(0, k).toString().trim())",
        "console.log('INJECTED')",
        "console.log('after')",
    ),
    (
        "ruby",
        "v = gets\nputs \"got #{v.chomp}\"",
        "puts 'INJECTED'",
        "puts 'after'",
    ),
    (
        "haskell",
        "v <- getLine\nputStrLn (\"got \" ++ v)",
        "putStrLn \"INJECTED\"",
        "putStrLn \"after\"",
    ),
    (
        "shellscript",
        "read v\necho got $v",
        "echo INJECTED",
        "echo after",
    ),
    (
        "r",
        "v <- readline('one? ')\ncat('got ', v, '\\n', sep = '')",
        "cat('INJECTED\\n')",
        "cat('after\\n')",
    ),
];

per_row!(
    input_the_program_did_not_read_is_discarded_not_run,
    READ_ONE,
    [python, javascript, ruby, haskell, shellscript, r],
    |&(lang, ask, inject, after)| {
        let s = Server::stdio().start().await;
        let id = s.start_session(lang).await;
        awaits(&s, &id, lang, ask).await;
        let o = input(&s, &id, &format!("first\n{inject}\n")).await;
        assert_eq!(
            (status(&o), output(&o)),
            ("ok", "got first\n"),
            "{lang}: {}",
            o.text
        );
        let unread = format!("{inject}\n");
        assert_eq!(discarded(&o), Some(unread.as_str()), "{lang}: {}", o.text);
        assert!(o.text.contains("discarded, not run"), "{lang}: {}", o.text);
        // Nothing of it ran, now or later.
        prints(&s, &id, lang, after, "after\n").await;
        s.stop().await;
    }
);

/// (language, code that reads three lines and prints them on one line)
const READ_THREE: &[(&str, &str)] = &[
    (
        "python",
        "a = input()\nb = input()\nc = input()\nprint(a, b, c)",
    ),
    (
        "javascript",
        "const rl = require('readline').createInterface({input: process.stdin})\nconst it = rl[Symbol.asyncIterator]()\nconst a = (await it.next()).value\nconst b = (await it.next()).value\nconst c = (await it.next()).value\nrl.close()\nconsole.log(a, b, c)",
    ),
    (
        "ruby",
        "a = gets.chomp\nb = gets.chomp\nc = gets.chomp\nputs [a, b, c].join(' ')",
    ),
    (
        "haskell",
        "a <- getLine\nb <- getLine\nc <- getLine\nputStrLn (unwords [a, b, c])",
    ),
    ("shellscript", "read a; read b; read c; echo $a $b $c"),
    (
        "r",
        "a <- readline()\nb <- readline()\nc <- readline()\ncat(paste(a, b, c), '\\n', sep = '')",
    ),
];

per_row!(
    several_lines_answer_several_reads,
    READ_THREE,
    [python, javascript, ruby, haskell, shellscript, r],
    |&(lang, code)| {
        let s = Server::stdio().start().await;
        let id = s.start_session(lang).await;
        awaits(&s, &id, lang, code).await;
        let o = input(&s, &id, "1\n2\n3").await;
        assert_eq!(
            (status(&o), output(&o)),
            ("ok", "1 2 3\n"),
            "{lang}: {}",
            o.text
        );
        assert_eq!(discarded(&o), None, "{lang}: {}", o.text);
        s.stop().await;
    }
);

/// `read -n 1` answered with a word reads its first letter; the rest is not a command.
#[tokio::test(flavor = "multi_thread")]
async fn a_key_read_answered_with_a_word_runs_none_of_it() {
    if !here("shellscript") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("shellscript").await;
    let o = awaits(
        &s,
        &id,
        "bash",
        "read -n 1 -p '[y/n] ' a; echo; echo \"got $a\"",
    )
    .await;
    assert_eq!(output(&o), "[y/n] ");
    let o = input(&s, &id, "yes").await;
    assert_eq!((status(&o), output(&o)), ("ok", "\ngot y\n"), "{}", o.text);
    assert_eq!(discarded(&o), Some("es\n"), "{}", o.text);
    prints(&s, &id, "bash", "echo next", "next\n").await;
    s.stop().await;
}

// ---- 2. Reads of /dev/tty wait for input ----------------------------------------------------

/// (language, code that reads a line from /dev/tty and prints its length)
const DEV_TTY: &[(&str, &str)] = &[
    (
        "python",
        "import getpass\npw = getpass.getpass('pw: ')\nprint(len(pw))",
    ),
    (
        "javascript",
        "const fs = require('fs')\nconst fd = fs.openSync('/dev/tty', 'r')\nconst buf = Buffer.alloc(64)\nconst k = fs.readSync(fd, buf)\nfs.closeSync(fd)\nconsole.log(k - 1)",
    ),
    (
        "ruby",
        "pw = File.open('/dev/tty') { |f| f.gets }\nputs pw.chomp.size",
    ),
    (
        "haskell",
        "h <- System.IO.openFile \"/dev/tty\" System.IO.ReadMode\npw <- System.IO.hGetLine h\nprint (length pw)",
    ),
    (
        "shellscript",
        "read -s -p 'pw: ' pw < /dev/tty; echo; echo ${#pw}",
    ),
    (
        "r",
        "con <- file('/dev/tty', 'r', raw = TRUE)\npw <- readLines(con, n = 1)\nclose(con)\ncat(nchar(pw), '\\n', sep = '')",
    ),
];

per_row!(
    a_read_of_dev_tty_waits_for_input,
    DEV_TTY,
    [python, javascript, ruby, haskell, shellscript, r],
    |&(lang, code)| {
        let s = Server::stdio().start().await;
        let id = s.start_session(lang).await;
        awaits(&s, &id, lang, code).await;
        let o = input(&s, &id, "secret").await;
        assert_eq!(status(&o), "ok", "{lang}: {}", o.text);
        assert!(output(&o).ends_with("6\n"), "{lang}: {}", o.text);
        s.stop().await;
    }
);

/// The program a child process runs asks for a password on /dev/tty.
const CHILD_ASKS: &str = "read -p 'pw: ' p < /dev/tty; echo ${#p}";

/// (language, code that runs `bash -c CHILD_ASKS` in the foreground)
const CHILD_TTY: &[(&str, &str)] = &[
    (
        "python",
        "import subprocess\n_ = subprocess.run(['bash', '-c', CMD])",
    ),
    (
        "javascript",
        "void require('child_process').spawnSync('bash', ['-c', CMD], {stdio: 'inherit'})",
    ),
    ("ruby", "system('bash', '-c', CMD)\nnil"),
    (
        "haskell",
        "System.Process.callProcess \"bash\" [\"-c\", CMD]",
    ),
    ("shellscript", "bash -c CMD"),
    ("r", "invisible(system(paste('bash -c', shQuote(CMD))))"),
];

per_row!(
    a_child_asking_on_dev_tty_waits_for_input,
    CHILD_TTY,
    [python, javascript, ruby, haskell, shellscript, r],
    |&(lang, template)| {
        let s = Server::stdio().start().await;
        let quoted = match lang {
            "haskell" => replbox::api::Format::Haskell.quote(CHILD_ASKS),
            "ruby" => replbox::api::Format::Ruby.quote(CHILD_ASKS),
            "shellscript" => replbox::api::Format::Shell.quote(CHILD_ASKS),
            _ => replbox::api::Format::Json.quote(CHILD_ASKS),
        };
        let code = template.replace("CMD", &quoted);
        let id = s.start_session(lang).await;
        let o = awaits(&s, &id, lang, &code).await;
        assert!(output(&o).ends_with("pw: "), "{lang}: {}", o.text);
        let o = input(&s, &id, "abcd").await;
        assert_eq!(
            (status(&o), output(&o)),
            ("ok", "4\n"),
            "{lang}: {}",
            o.text
        );
        s.stop().await;
    }
);

// ---- 3. A read with its own timeout goes on by itself ---------------------------------------

/// (language, code that waits 1.5 s for a line and then prints `went on ...`, what it prints)
const TIMED_READ: &[(&str, &str, &str)] = &[
    (
        "python",
        "import select, sys\nr, _, _ = select.select([sys.stdin], [], [], 1.5)\nprint('went on', len(r))",
        "went on 0\n",
    ),
    (
        "javascript",
        "const rl = require('readline').createInterface({input: process.stdin})\nconst got = await new Promise((r) => { rl.once('line', r); setTimeout(() => r('nothing'), 1500) })\nrl.close()\nconsole.log('went on', got)",
        "went on nothing\n",
    ),
    (
        "ruby",
        "r = IO.select([$stdin], nil, nil, 1.5)\nputs \"went on #{r.inspect}\"",
        "went on nil\n",
    ),
    (
        "haskell",
        "r <- System.Timeout.timeout 1500000 getLine\nputStrLn (\"went on \" ++ show r)",
        "went on Nothing\n",
    ),
    (
        "shellscript",
        "read -t 1.5 x; echo went on $?",
        "went on 142\n",
    ),
    // Base R has no timed read of its own: a child's.
    (
        "r",
        "invisible(system(\"bash -c 'read -t 1.5 x; echo went on $?'\"))",
        "went on 142\n",
    ),
];

per_row!(
    a_read_with_its_own_timeout_goes_on_by_itself,
    TIMED_READ,
    [python, javascript, ruby, haskell, shellscript, r],
    |&(lang, code, expected)| {
        let s = Server::stdio().start().await;
        let id = s.start_session(lang).await;
        prints(&s, &id, lang, code, expected).await;
        s.stop().await;
    }
);

/// A timed wait long enough to be meant for an answer is a prompt.
/// (language, code that reads with a long timeout, its output once answered)
const LONG_TIMED_READ: &[(&str, &str, &str)] = &[
    (
        "shellscript",
        "read -t 60 -p 'Continue? ' x; echo got $x",
        "got y\n",
    ),
    (
        "python",
        "import select, sys\nr, _, _ = select.select([sys.stdin], [], [], 60)\nprint('got', sys.stdin.readline().strip())",
        "got y\n",
    ),
];

per_row!(
    a_long_timed_read_is_a_prompt,
    LONG_TIMED_READ,
    [python, shellscript],
    |&(lang, code, expected)| {
        let s = Server::stdio().start().await;
        let id = s.start_session(lang).await;
        awaits(&s, &id, lang, code).await;
        let o = input(&s, &id, "y").await;
        assert_eq!(
            (status(&o), output(&o)),
            ("ok", expected),
            "{lang}: {}",
            o.text
        );
        s.stop().await;
    }
);

// ---- 4. A prompt the user changes -----------------------------------------------------------

struct PromptRow {
    language: &'static str,
    /// Change the REPL's prompts.
    set: &'static str,
    /// Print `ok`.
    ok: &'static str,
    /// Set x to 41 and loop for ever.
    forever: &'static str,
    /// Print x + 1 and what the code sees as its prompt, and what that shows.
    read_back: (&'static str, &'static str),
}

impl Row for PromptRow {
    fn language(&self) -> &str {
        self.language
    }
}

const PROMPTS: &[PromptRow] = &[
    PromptRow {
        language: "python",
        set: "import sys\nsys.ps1, sys.ps2 = 'In: ', '..: '",
        ok: "print('ok')",
        forever: "x = 41\nwhile True: pass",
        read_back: ("print(x + 1, sys.ps1)", "42 In: \n"),
    },
    PromptRow {
        language: "javascript",
        set: "require('repl').repl.setPrompt('$ ')",
        ok: "console.log('ok')",
        forever: "var x = 41\nwhile (true) {}",
        read_back: (
            "console.log(x + 1, require('repl').repl.getPrompt())",
            "42 $ \n",
        ),
    },
    PromptRow {
        language: "ruby",
        set: "conf.prompt_mode = :SIMPLE\nnil",
        ok: "puts 'ok'",
        forever: "x = 41\nloop {}",
        read_back: ("puts x + 1, conf.prompt_mode", "42\nSIMPLE\n"),
    },
    PromptRow {
        language: "haskell",
        set: ":set prompt \"XX> \"\n:set prompt-cont \"XX| \"",
        ok: "putStrLn \"ok\"",
        forever: "x = 41\nlength [1..]",
        read_back: ("print (x + 1)", "42\n"),
    },
    PromptRow {
        language: "shellscript",
        set: "PS1='>>> '; PS2='... '",
        ok: "echo ok",
        forever: "x=41; while :; do :; done",
        read_back: ("echo $((x + 1)) \"$PS1\"", "42 >>> \n"),
    },
    PromptRow {
        language: "r",
        set: "options(prompt = 'R> ', continue = 'R+ ')",
        ok: "cat('ok\\n')",
        forever: "x <- 41\nrepeat {}",
        read_back: (
            "cat(x + 1, ' ', getOption('prompt'), '\\n', sep = '')",
            "42 R> \n",
        ),
    },
];

per_row!(
    a_prompt_the_user_sets_never_shows_and_timeouts_keep_the_state,
    PROMPTS,
    [python, javascript, ruby, haskell, shellscript, r],
    |row| {
        let lang = row.language;
        let s = Server::stdio().start().await;
        let id = s.start_session(lang).await;
        prints(&s, &id, lang, row.set, "").await;
        prints(&s, &id, lang, row.ok, "ok\n").await;
        let o = s.eval_t(&id, row.forever, 1000).await;
        assert_eq!(status(&o), "timeout", "{lang}: {}", o.text);
        assert_eq!(o.structured.get("restarted"), None, "{lang}: {}", o.text);
        prints(&s, &id, lang, row.read_back.0, row.read_back.1).await;
        prints(&s, &id, lang, row.ok, "ok\n").await;
        s.stop().await;
    }
);

/// A virtual environment's activate script prefixes PS1; nothing of it shows.
#[tokio::test(flavor = "multi_thread")]
async fn an_activated_virtual_environment_changes_no_output() {
    if !here("shellscript") || !require("python", "python3") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("shellscript").await;
    let o = s
        .eval_t(&id, "python3 -m venv --without-pip venv", 120_000)
        .await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    prints(
        &s,
        &id,
        "bash",
        "source venv/bin/activate\necho hello",
        "hello\n",
    )
    .await;
    prints(
        &s,
        &id,
        "bash",
        "echo \"$VIRTUAL_ENV_PROMPT\" | tr -d '() '",
        "venv\n",
    )
    .await;
    let o = s.eval_t(&id, "x=1; sleep 60", 1000).await;
    assert_eq!(status(&o), "timeout", "{}", o.text);
    assert_eq!(o.structured.get("restarted"), None, "{}", o.text);
    prints(&s, &id, "bash", "deactivate; echo $x", "1\n").await;
    s.stop().await;
}

// ---- 5. Output printed before a forced restart is kept --------------------------------------

/// (language, code that ignores Ctrl-C, then prints `important result 42` and loops for ever,
/// code that prints `ok`). Ignoring comes first: were the print first, a deadline reached
/// between the two (a loaded machine) would find the cell still interruptible.
const STUBBORN: &[(&str, &str, &str)] = &[
    (
        "python",
        "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('important result 42', flush=True)\nwhile True: pass",
        "print('ok')",
    ),
    (
        "javascript",
        "require('child_process').spawnSync('bash', ['-c', \"trap '' INT; echo 'important result 42'; while :; do :; done\"], {stdio: 'inherit'})",
        "console.log('ok')",
    ),
    (
        "ruby",
        "trap('INT', 'IGNORE')\nputs 'important result 42'\nloop {}",
        "puts 'ok'",
    ),
    (
        "haskell",
        "_ <- System.Posix.Signals.installHandler System.Posix.Signals.sigINT System.Posix.Signals.Ignore Nothing\nputStrLn \"important result 42\"\nlength [1..]",
        // Names the signals' module, so the first cell loads its package (ghci links it on
        // first use: seconds on a loaded machine) before the cell with the deadline.
        "System.Posix.Signals.sigINT `seq` putStrLn \"ok\"",
    ),
    (
        "shellscript",
        "trap '' INT; echo 'important result 42'; while :; do :; done",
        "echo ok",
    ),
    (
        "r",
        "suspendInterrupts({\n  cat('important result 42\\n')\n  repeat {}\n})",
        "cat('ok\\n')",
    ),
];

per_row!(
    output_before_a_forced_restart_is_kept,
    STUBBORN,
    [python, javascript, ruby, haskell, shellscript, r],
    |&(lang, code, ok)| {
        let s = Server::stdio().start().await;
        let id = s.start_session(lang).await;
        // A first cell pays the interpreter's one-time costs (R compiles its evaluator on
        // first use) outside the 1 s deadline below.
        prints(&s, &id, lang, ok, "ok\n").await;
        let o = s.eval_t(&id, code, 1000).await;
        assert_eq!(status(&o), "timeout", "{lang}: {}", o.text);
        assert_eq!(o.structured["restarted"], true, "{lang}: {}", o.text);
        assert!(
            output(&o).starts_with("important result 42\n"),
            "{lang}: {}",
            o.text
        );
        assert!(
            o.text.contains("restarted: state lost"),
            "{lang}: {}",
            o.text
        );
        // The fresh interpreter answers.
        prints(&s, &id, lang, ok, "ok\n").await;
        s.stop().await;
    }
);

// ---- 6. CRLF line endings -------------------------------------------------------------------

/// (language, code with CRLF line endings, what it prints)
const CRLF: &[(&str, &str, &str)] = &[
    ("python", "z = 1\r\nprint(f'[{z}]')\r\n", "[1]\n"),
    (
        "javascript",
        "let z = 1\r\nconsole.log(`[${z}]`)\r\n",
        "[1]\n",
    ),
    ("ruby", "z = 1\r\nputs \"[#{z}]\"\r\n", "[1]\n"),
    (
        "haskell",
        "let z = 1\r\nputStrLn (\"[\" ++ show z ++ \"]\")\r\n",
        "[1]\n",
    ),
    (
        "shellscript",
        "Z=1\r\necho \"[$Z]\"\r\nmkdir -p d1\r\ncd d1\r\n[[ $PWD == */d1 ]] && echo in d1\r\n",
        "[1]\nin d1\n",
    ),
    ("r", "z <- 1\r\ncat('[', z, ']\\n', sep = '')\r\n", "[1]\n"),
];

per_row!(
    crlf_line_endings_are_unix_ones,
    CRLF,
    [python, javascript, ruby, haskell, shellscript, r],
    |&(lang, code, expected)| {
        let s = Server::stdio().start().await;
        let id = s.start_session(lang).await;
        prints(&s, &id, lang, code, expected).await;
        s.stop().await;
    }
);

// ---- 7. ghci's stdin and comments -----------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn ghci_reports_an_unclosed_comment() {
    if !here("haskell") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("haskell").await;
    let o = s.eval(&id, "{- unterminated\nputStrLn \"ran\"").await;
    assert_eq!(status(&o), "error", "{}", o.text);
    assert_eq!(error_type(&o), "error", "{}", o.text);
    assert!(
        output(&o).contains("<cell 1>:1:1: error: unterminated `{-'"),
        "{}",
        o.text
    );
    assert!(!output(&o).contains("ran"), "{}", o.text);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ghci_reads_to_the_end_leave_the_session_alive() {
    if !here("haskell") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("haskell").await;
    // interact reads until Ctrl-D.
    awaits(
        &s,
        &id,
        "haskell",
        "import Data.Char\ninteract (map toUpper)",
    )
    .await;
    let o = input(&s, &id, "abc\n\u{4}").await;
    assert_eq!((status(&o), output(&o)), ("ok", "ABC\n"), "{}", o.text);
    prints(&s, &id, "haskell", "1 + 1", "2\n").await;
    // getContents, read lazily within the cell.
    awaits(&s, &id, "haskell", "s <- getContents\nputStrLn (take 5 s)").await;
    let o = input(&s, &id, "abcdefg").await;
    assert_eq!((status(&o), output(&o)), ("ok", "abcde\n"), "{}", o.text);
    prints(&s, &id, "haskell", "2 + 2", "4\n").await;
    // getContents in one cell, used in another: the string ends with its cell.
    prints(&s, &id, "haskell", "t <- getContents", "").await;
    let o = s.eval(&id, "length t").await;
    assert_eq!(
        (status(&o), error_type(&o)),
        ("error", "Exception"),
        "{}",
        o.text
    );
    prints(&s, &id, "haskell", "3 + 3", "6\n").await;
    s.stop().await;
}

/// (language, code that reads its input to the end and prints how many lines it got, and
/// code printing `alive`)
const READ_TO_END: &[(&str, &str, &str)] = &[
    (
        "python",
        "import sys\nprint(len(sys.stdin.readlines()))",
        "print('alive')",
    ),
    (
        "javascript",
        "console.log(require('fs').readFileSync(0, 'utf8').split('\\n').length - 1)",
        "console.log('alive')",
    ),
    ("ruby", "puts $stdin.readlines.size", "puts 'alive'"),
    ("shellscript", "wc -l", "echo alive"),
    (
        "r",
        "cat(length(readLines('stdin')), '\\n', sep = '')",
        "cat('alive\\n')",
    ),
];

per_row!(
    /// Ctrl-D ends what a program reads, in every language, and the session goes on (ghci's
    /// own cases are above).
    a_read_to_the_end_of_input_leaves_the_session_alive,
    READ_TO_END,
    [python, javascript, ruby, shellscript, r],
    |&(lang, code, alive)| {
        let s = Server::stdio().start().await;
        let id = s.start_session(lang).await;
        awaits(&s, &id, lang, code).await;
        let o = input(&s, &id, "a\nb\n\u{4}").await;
        assert_eq!(
            (status(&o), output(&o).trim_start()),
            ("ok", "2\n"),
            "{lang}: {}",
            o.text
        );
        prints(&s, &id, lang, alive, "alive\n").await;
        prints(&s, &id, lang, alive, "alive\n").await;
        s.stop().await;
    }
);

// ---- 8. Nothing of replbox's machinery in any output ----------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn node_directives_errors_and_dot_commands_are_nodes() {
    if !here("javascript") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("javascript").await;
    let o = s.eval(&id, "'use strict'; undeclaredY = 1").await;
    assert_eq!(
        (status(&o), error_type(&o)),
        ("error", "ReferenceError"),
        "{}",
        o.text
    );
    let o = s.eval(&id, "foo bar").await;
    assert_eq!(
        output(&o),
        "<cell 2>:1\nfoo bar\n    ^^^\n\nUncaught SyntaxError: Unexpected identifier 'bar'\n"
    );
    let o = s.eval(&id, ".help").await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    assert!(
        output(&o).starts_with(".break") && output(&o).contains("\n.exit "),
        "{}",
        o.text
    );
    assert!(output(&o).ends_with("REPL\n"), "{}", o.text);
    let o = s.eval(&id, ".nonsense").await;
    assert_eq!(output(&o), "Invalid REPL keyword\n", "{}", o.text);
    // Commands first, then code, whose lines keep their numbers.
    prints(&s, &id, "javascript", ".break\nconsole.log(6 * 7)", "42\n").await;
    let o = s.eval(&id, ".break\n\nfoo bar").await;
    assert!(
        output(&o).starts_with("<cell 6>:3\nfoo bar\n"),
        "{}",
        o.text
    );
    let o = s.eval(&id, "process.abort()").await;
    assert_eq!(status(&o), "exited", "{}", o.text);
    for leak in ["rbx", "bootstrap", "replbox", "/ctl/"] {
        assert!(!output(&o).contains(leak), "{leak}: {}", o.text);
    }
    let id = s.start_session("javascript").await;
    let o = s.eval(&id, ".exit").await;
    assert_eq!(
        (status(&o), o.structured["exit_code"].as_i64()),
        ("exited", Some(0)),
        "{}",
        o.text
    );
    s.stop().await;
}

/// (language, code that fails on its first line)
const FAILS: &[(&str, &str)] = &[
    ("python", "def f(:\n  pass"),
    ("python", "1 / 0"),
    ("javascript", "foo bar"),
    ("javascript", "null.x"),
    ("ruby", "def f(\n"),
    ("ruby", "1 / 0"),
    ("haskell", "1 +"),
    ("haskell", "error \"boom\" :: Int"),
    ("shellscript", "set -x\necho traced\nfalse"),
    ("shellscript", "set -u; echo $undefined_here"),
    ("r", "f <- function() stop('boom')\nf()"),
    ("r", "1 +"),
    ("r", "x <- )"),
];

per_row!(
    no_output_shows_replbox_machinery,
    FAILS,
    [python, javascript, ruby, haskell, shellscript, r],
    |&(lang, code)| {
        let s = Server::stdio().start().await;
        let id = s.start_session(lang).await;
        let o = s.eval(&id, code).await;
        assert_eq!(status(&o), "error", "{lang}: {code}: {}", o.text);
        for leak in ["rbx", "bootstrap", "replbox", "/ctl/"] {
            assert!(!o.text.contains(leak), "{lang}: {code}: {leak}: {}", o.text);
        }
        s.stop().await;
    }
);

#[tokio::test(flavor = "multi_thread")]
async fn bash_traces_show_the_cells_commands_only() {
    if !here("shellscript") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("shellscript").await;
    prints(&s, &id, "bash", "set -x", "").await;
    prints(&s, &id, "bash", "echo traced", "++ echo traced\ntraced\n").await;
    prints(&s, &id, "bash", "set +x", "++ set +x\n").await;
    prints(&s, &id, "bash", "echo plain", "plain\n").await;
    s.stop().await;
}

// ---- 9. Closing stdout ----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn python_closing_stdout_is_the_users_error() {
    if !here("python") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("python").await;
    prints(&s, &id, "python", "import os, sys\nos.close(1)", "").await;
    let o = s.eval(&id, "print('lost')").await;
    assert_eq!(
        (status(&o), error_type(&o)),
        ("error", "OSError"),
        "{}",
        o.text
    );
    assert!(output(&o).contains("Bad file descriptor"), "{}", o.text);
    assert!(!output(&o).contains("bootstrap"), "{}", o.text);
    prints(
        &s,
        &id,
        "python",
        "print('still here', file=sys.stderr)",
        "still here\n",
    )
    .await;
    s.stop().await;
}

/// In bash, as at a terminal, a closed stdout makes writes fail; stderr still shows.
#[tokio::test(flavor = "multi_thread")]
async fn bash_closing_stdout_is_the_users_error() {
    if !here("shellscript") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("shellscript").await;
    prints(&s, &id, "bash", "exec 1>&-", "").await;
    let o = s.eval(&id, "echo lost").await;
    assert_eq!(status(&o), "error", "{}", o.text);
    assert!(output(&o).contains("Bad file descriptor"), "{}", o.text);
    prints(&s, &id, "bash", "echo still here >&2", "still here\n").await;
    s.stop().await;
}

/// R's output diverted with sink() is the user's: the cell still ends, and sink() brings
/// the output back.
#[tokio::test(flavor = "multi_thread")]
async fn r_diverted_output_is_the_users() {
    if !here("r") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("r").await;
    prints(&s, &id, "r", "sink('/dev/null')", "").await;
    prints(&s, &id, "r", "cat('lost\\n')", "").await;
    prints(&s, &id, "r", "sink()\ncat('back\\n')", "back\n").await;
    s.stop().await;
}

// ---- 10. Keys sent alone --------------------------------------------------------------------

/// (language, code that reads one key in raw mode and prints it, what it prints for `q`)
const ONE_KEY: &[(&str, &str, &str)] = &[
    (
        "python",
        "import sys, termios, tty\nfd = sys.stdin.fileno()\nold = termios.tcgetattr(fd)\ntty.setraw(fd)\ntry:\n    k = sys.stdin.read(1)\nfinally:\n    termios.tcsetattr(fd, termios.TCSADRAIN, old)\nprint(repr(k))",
        "'q'\n",
    ),
    (
        "javascript",
        "process.stdin.setRawMode(true)\nconst k = await new Promise((r) => process.stdin.once('data', r))\nprocess.stdin.setRawMode(false)\nconsole.log(JSON.stringify(k.toString()))",
        "\"q\"\n",
    ),
    (
        "ruby",
        "require 'io/console'\nk = STDIN.getch\nputs k.inspect",
        "\"q\"\n",
    ),
    (
        "haskell",
        "System.IO.hSetBuffering System.IO.stdin System.IO.NoBuffering\nk <- getChar\nSystem.IO.hSetBuffering System.IO.stdin System.IO.LineBuffering\nprint k",
        "'q'\n",
    ),
    ("shellscript", "read -rsn1 k; echo \"[$k]\"", "[q]\n"),
];

per_row!(
    a_key_is_sent_alone_without_enter,
    ONE_KEY,
    [python, javascript, ruby, haskell, shellscript],
    |&(lang, code, expected)| {
        let s = Server::stdio().start().await;
        let id = s.start_session(lang).await;
        awaits(&s, &id, lang, code).await;
        let o = keys(&s, &id, "q").await;
        assert_eq!(
            (status(&o), output(&o)),
            ("ok", expected),
            "{lang}: {}",
            o.text
        );
        assert_eq!(discarded(&o), None, "{lang}: {}", o.text);
        s.stop().await;
    }
);

#[tokio::test(flavor = "multi_thread")]
async fn control_keys_do_what_they_do_at_a_terminal() {
    if !here("python") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("python").await;
    // An arrow key, read raw: its escape sequence.
    awaits(
        &s,
        &id,
        "python",
        "import os, termios, tty\nold = termios.tcgetattr(0)\ntty.setraw(0)\ntry:\n    k = os.read(0, 3)\nfinally:\n    termios.tcsetattr(0, termios.TCSADRAIN, old)\nprint(k)",
    )
    .await;
    let o = keys(&s, &id, "\u{1b}[A").await;
    assert_eq!(output(&o), "b'\\x1b[A'\n", "{}", o.text);
    // Ctrl-D ends the input of a program reading to the end; no Enter follows it.
    awaits(
        &s,
        &id,
        "python",
        "import sys\nprint(repr(sys.stdin.read()))",
    )
    .await;
    let o = input(&s, &id, "abc\n\u{4}").await;
    assert_eq!((status(&o), output(&o)), ("ok", "'abc\\n'\n"), "{}", o.text);
    // Ctrl-C interrupts, and the session keeps its state.
    prints(&s, &id, "python", "kept = 7", "").await;
    awaits(&s, &id, "python", "input('name? ')").await;
    let o = keys(&s, &id, "\u{3}").await;
    assert_eq!(
        (status(&o), error_type(&o)),
        ("error", "KeyboardInterrupt"),
        "{}",
        o.text
    );
    prints(&s, &id, "python", "print(kept)", "7\n").await;
    s.stop().await;
}

/// A program that stops waiting by itself before the answer comes gets nothing typed.
#[tokio::test(flavor = "multi_thread")]
async fn an_answer_to_a_program_that_stopped_waiting_is_not_typed() {
    if !here("shellscript") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("shellscript").await;
    // A wait of 3 s counts as a prompt; it is over before the answer is typed.
    let o = awaits(
        &s,
        &id,
        "bash",
        "read -t 3 -p 'quick? ' x; echo \"status $?\"",
    )
    .await;
    assert_eq!(output(&o), "quick? ");
    // Wait (bounded) until the read has timed out and the shell reads its next line.
    let sessions = s.call("session_list", json!({})).await;
    let pid = sessions.structured["sessions"][0]["pid"]
        .as_i64()
        .unwrap_or(0);
    let read_nr = if cfg!(target_arch = "aarch64") { 63 } else { 0 };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !std::fs::read_to_string(format!("/proc/{pid}/syscall"))
        .is_ok_and(|l| l.starts_with(&format!("{read_nr} 0x0 ")))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the read never timed out"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let o = input(&s, &id, "echo TYPED").await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    assert!(output(&o).contains("status 142"), "{}", o.text);
    assert!(o.text.contains("was not typed"), "{}", o.text);
    prints(&s, &id, "bash", "echo after", "after\n").await;
    s.stop().await;
}

// ---- 12. Small ones -------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_timeout_of_zero_is_refused() {
    let s = Server::stdio().start().await;
    let o = s
        .call(
            "session_start",
            json!({"language": "shellscript", "idle_timeout_s": 0}),
        )
        .await;
    assert_eq!(o.error_kind(), "invalid_argument", "{}", o.text);
    assert!(o.text.contains("at least 1"), "{}", o.text);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ruby_rescue_interrupt_catches_a_timeout() {
    if !here("ruby") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("ruby").await;
    let o = s
        .eval_t(
            &id,
            "begin\n  sleep 30\nrescue Interrupt => e\n  puts \"rescued #{e.class}\"\nend",
            1000,
        )
        .await;
    // Caught, the interrupt ends in an ordinary finished cell that says it was interrupted.
    assert_eq!(
        (status(&o), output(&o), &o.structured["interrupted"]),
        ("ok", "rescued Interrupt\n", &json!(true)),
        "{}",
        o.text
    );
    // Uncaught, the interrupt is an Interrupt too, and irb goes on.
    let o = s.eval_t(&id, "x = 5\nsleep 30", 1000).await;
    assert_eq!(status(&o), "timeout", "{}", o.text);
    prints(&s, &id, "ruby", "puts x", "5\n").await;
    s.stop().await;
}

/// R's timeout is the interrupt condition that `tryCatch(..., interrupt = )` catches; the
/// cell then finishes as an ordinary one.
#[tokio::test(flavor = "multi_thread")]
async fn r_try_catch_interrupt_catches_a_timeout() {
    if !here("r") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("r").await;
    let o = s
        .eval_t(
            &id,
            "tryCatch(Sys.sleep(30), interrupt = function(e) cat('caught', class(e)[1], '\\n'))",
            1000,
        )
        .await;
    assert_eq!(
        (status(&o), output(&o), &o.structured["interrupted"]),
        ("ok", "caught interrupt \n", &json!(true)),
        "{}",
        o.text
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn python_fork_leaves_one_repl() {
    if !here("python") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("python").await;
    prints(
        &s,
        &id,
        "python",
        "import os\npid = os.fork()\nif pid == 0:\n    print('child')\nelse:\n    os.waitpid(pid, 0)\n    print('parent')",
        "child\nparent\n",
    )
    .await;
    for _ in 0..3 {
        prints(&s, &id, "python", "print('once')", "once\n").await;
    }
    s.stop().await;
}

/// A bare `fork` in irb: the child ends with the cell; one REPL answers.
#[tokio::test(flavor = "multi_thread")]
async fn ruby_fork_leaves_one_repl() {
    if !here("ruby") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("ruby").await;
    prints(
        &s,
        &id,
        "ruby",
        "pid = fork\nif pid.nil?\n  puts 'child'\nelse\n  Process.wait(pid)\n  puts 'parent'\nend\nnil",
        "child\nparent\n",
    )
    .await;
    for _ in 0..3 {
        prints(&s, &id, "ruby", "puts 'once'", "once\n").await;
    }
    s.stop().await;
}

/// R's forked workers (parallel::mclapply) end in their own process; one REPL answers.
#[tokio::test(flavor = "multi_thread")]
async fn r_forked_workers_leave_one_repl() {
    if !here("r") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("r").await;
    prints(
        &s,
        &id,
        "r",
        "x <- parallel::mclapply(1:4, function(i) i * 2, mc.cores = 2)\ncat(unlist(x), '\\n')",
        "2 4 6 8 \n",
    )
    .await;
    for _ in 0..3 {
        prints(&s, &id, "r", "cat('once\\n')", "once\n").await;
    }
    s.stop().await;
}

// ---- A cell that ends inside a quote leaves the next one to run as at a prompt ----------

/// (language, a cell that ends inside a quote, what its error says)
const UNTERMINATED: &[(&str, &str, &str)] = &[
    (
        "shellscript",
        "echo 'unterminated",
        "unexpected EOF while looking for matching `''",
    ),
    (
        "shellscript",
        "echo \"unterminated",
        "unexpected EOF while looking for matching `\"'",
    ),
    (
        "shellscript",
        "echo `unterminated",
        "unexpected EOF while looking for matching ``'",
    ),
    (
        "shellscript",
        "echo $(unterminated",
        "unexpected EOF while looking for matching `)'",
    ),
];

per_row!(
    /// The cell is an error; the next runs at once (bash's parser, left inside the quote,
    /// once took the next line's `{` for a word and waited out its deadline).
    an_unterminated_quote_leaves_the_next_cell_alone,
    UNTERMINATED,
    [shellscript],
    |&(lang, code, says)| {
        let s = Server::stdio().start().await;
        let id = s.start_session(lang).await;
        let o = s.eval(&id, code).await;
        assert_eq!(status(&o), "error", "{lang}: {code}: {}", o.text);
        assert!(output(&o).contains(says), "{lang}: {code}: {}", o.text);
        prints(&s, &id, lang, "echo after", "after\n").await;
        prints(&s, &id, lang, "{ echo braces; }", "braces\n").await;
        s.stop().await;
    }
);

// ---- Warnings show in the cell that caused them ------------------------------------------

/// (language, a cell that causes a warning, what the warning says, a cell printing `after`)
const WARNS: &[(&str, &str, &str, &str)] = &[
    (
        "javascript",
        "process.emitWarning('careful')",
        "Warning: careful",
        "console.log('after')",
    ),
    (
        "javascript",
        "new Buffer(1).length",
        "DeprecationWarning: Buffer() is deprecated",
        "console.log('after')",
    ),
    (
        "python",
        "import warnings\nwarnings.warn('careful')",
        "UserWarning: careful",
        "print('after')",
    ),
    ("ruby", "warn 'careful'", "careful", "puts 'after'"),
    (
        "r",
        "f <- function() warning('careful')\nf()",
        "careful",
        "cat('after\\n')",
    ),
];

per_row!(
    /// A warning is shown as the REPL shows it, in the cell that caused it, and nothing of it
    /// reaches the next cell (node's were switched off altogether).
    a_warning_shows_in_its_own_cell,
    WARNS,
    [javascript, python, ruby, r],
    |&(lang, code, says, after)| {
        let s = Server::stdio().start().await;
        let id = s.start_session(lang).await;
        let o = s.eval(&id, code).await;
        assert_eq!(status(&o), "ok", "{lang}: {code}: {}", o.text);
        assert!(output(&o).contains(says), "{lang}: {code}: {}", o.text);
        prints(&s, &id, lang, after, "after\n").await;
        s.stop().await;
    }
);

// ---- A cell's asynchronous error and later output stay in that cell ----------------------

/// (language, a cell whose callback throws while the cell still awaits and which then
/// prints `after`, what the error says, a cell printing `next`)
const ASYNC_ERRORS: &[(&str, &str, &str, &str)] = &[
    (
        "javascript",
        "setTimeout(() => { throw new Error('boom') }, 20)\nawait new Promise((r) => setTimeout(r, 200))\nconsole.log('after')\n6 * 7",
        "Uncaught Error: boom",
        "console.log('next')",
    ),
    (
        "javascript",
        "Promise.reject(new Error('nobody waits'))\nawait new Promise((r) => setTimeout(r, 200))\nconsole.log('after')\n6 * 7",
        "Uncaught Error: nobody waits",
        "console.log('next')",
    ),
];

per_row!(
    /// The error is the cell's (`error`, shown in it); the cell still runs to its end, its
    /// later output and value in its own result; the next cell shows only its own output.
    an_async_error_stays_in_its_cell,
    ASYNC_ERRORS,
    [javascript],
    |&(lang, code, says, next)| {
        let s = Server::stdio().start().await;
        let id = s.start_session(lang).await;
        let o = s.eval(&id, code).await;
        let out = output(&o);
        assert_eq!(status(&o), "error", "{lang}: {}", o.text);
        let (err, after) = (out.find(says), out.find("after\n"));
        assert!(
            matches!((err, after), (Some(e), Some(a)) if e < a) && out.ends_with("42\n"),
            "{lang}: the error, then the rest of the cell: {out:?}"
        );
        prints(&s, &id, lang, next, "next\n").await;
        s.stop().await;
    }
);

/// (language, a cell with many warnings, what it says, the start of what `warnings()` shows
/// next, its last line)
const MANY_WARNINGS: &[(&str, &str, &str, &str, &str)] = &[
    (
        "r",
        "f <- function(i) warning(paste('w', i))\nfor (i in 1:12) f(i)",
        "There were 12 warnings (use warnings() to see them)\n",
        "Warning messages:\n1: In f(i) : w 1\n2: In f(i) : w 2\n",
        "12: In f(i) : w 12\n",
    ),
    (
        "r",
        "f <- function(i) warning(paste('w', i))\nfor (i in 1:60) f(i)",
        "There were 50 or more warnings (use warnings() to see the first 50)\n",
        "Warning messages:\n1: In f(i) : w 1\n",
        "50: In f(i) : w 50\n",
    ),
];

per_row!(
    /// `warnings()` at a fresh prompt shows nothing (not the bootstrap's own), and after
    /// "There were N warnings" it shows those, as R does.
    warnings_shows_the_last_cells_warnings,
    MANY_WARNINGS,
    [r],
    |&(lang, code, says, head, tail)| {
        let s = Server::stdio().start().await;
        let id = s.start_session(lang).await;
        prints(&s, &id, lang, "warnings()", "").await;
        prints(&s, &id, lang, code, says).await;
        let o = s.eval(&id, "warnings()").await;
        let out = output(&o);
        assert!(
            status(&o) == "ok" && out.starts_with(head) && out.ends_with(tail),
            "{lang}: {}",
            o.text
        );
        prints(&s, &id, lang, "cat('after\\n')", "after\n").await;
        s.stop().await;
    }
);

/// (language, a cell leaving something behind that, once the file `go` exists, prints
/// `late` and then creates the file `done`; a cell printing `next`; the background output
/// the next cell reports)
const LATE: &[(&str, &str, &str, &str)] = &[
    (
        "python",
        "import threading, os, time\ndef w():\n    while not os.path.exists('go'):\n        time.sleep(0.01)\n    print('late', flush=True)\n    open('done', 'w').close()\nthreading.Thread(target=w, daemon=True).start()",
        "print('next')",
        "late\n",
    ),
    (
        "javascript",
        "const fs = require('fs')\nconst iv = setInterval(() => { if (fs.existsSync('go')) { clearInterval(iv); console.log('late'); fs.writeFileSync('done', '') } }, 10)",
        "console.log('next')",
        "late\n",
    ),
    (
        "ruby",
        "Thread.new { sleep 0.01 until File.exist?('go'); puts 'late'; $stdout.flush; File.write('done', '') }\nnil",
        "puts 'next'",
        "late\n",
    ),
    (
        "r",
        "system(\"sh -c 'while [ ! -e go ]; do sleep 0.01; done; echo late; : > done'\", wait = FALSE)",
        "cat('next\\n')",
        "late\n",
    ),
    (
        "shellscript",
        "(while [ ! -e go ]; do sleep 0.01; done; echo late; : > done) &",
        "echo next",
        // bash's own notice of the job's end belongs there too.
        "late\n[1]+  Done                    ( while [ ! -e go ]; do\n    sleep 0.01;\ndone; echo late; : > done )\n",
    ),
];

per_row!(
    /// Output an earlier cell's thread, timer or child prints between evaluations is the
    /// next result's `background_output`, never part of its `output`.
    output_between_cells_is_background_output,
    LATE,
    [python, javascript, ruby, r, shellscript],
    |&(lang, start, next, background)| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        let s = Server::stdio().arg("--allow-cwd").arg(dir.path()).start().await;
        let o = s
            .call(
                "session_start",
                json!({"language": lang, "cwd": dir.path()}),
            )
            .await;
        assert!(!o.is_error, "{lang}: {}", o.text);
        let id = o.s("session_id").to_string();
        let o = s.eval(&id, start).await;
        assert_eq!(status(&o), "ok", "{lang}: {}", o.text);
        std::fs::write(dir.path().join("go"), "").unwrap();
        // The background's own signal that it has printed.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !dir.path().join("done").exists() {
            assert!(std::time::Instant::now() < until, "{lang}: `late` never printed");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let o = s.eval(&id, next).await;
        assert_eq!(
            (status(&o), output(&o), o.structured["background_output"].as_str()),
            ("ok", "next\n", Some(background)),
            "{lang}: {}",
            o.text
        );
        assert!(o.text.contains("late"), "{lang}: the text shows it too: {}", o.text);
        prints(&s, &id, lang, next, "next\n").await;
        s.stop().await;
    }
);

// ---- A deep recursion's traceback stays within the interpreter's bound -------------------

/// (language, a cell that recurses past a raised recursion limit, its error type, how the
/// repeated frames are collapsed, a cell printing `alive`)
const DEEP: &[(&str, &str, &str, &str, &str)] = &[(
    "python",
    "import sys\nsys.setrecursionlimit(10**5)\ndef f(n):\n    return f(n + 1)\nf(0)",
    "RecursionError",
    "  [Previous line repeated ",
    "print('alive')",
)];

per_row!(
    /// The traceback shows the last frames as the interpreter prints them (at most its
    /// traceback limit, 1,000, the repeated ones collapsed), not every one of 100,000; the
    /// session goes on.
    a_deep_recursion_shows_a_short_traceback,
    DEEP,
    [python],
    |&(lang, code, kind, repeated, alive)| {
        let s = Server::stdio().start().await;
        let id = s.start_session(lang).await;
        let o = s.eval_t(&id, code, 120_000).await;
        assert_eq!((status(&o), error_type(&o)), ("error", kind), "{lang}: {}", o.text);
        let out = output(&o);
        let times: u64 = out
            .split(repeated)
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{lang}: no collapsed frames: {out}"));
        assert!(times < 1000, "{lang}: {times} repeated frames: {out}");
        assert!(out.lines().count() < 20, "{lang}: {out}");
        prints(&s, &id, lang, alive, "alive\n").await;
        s.stop().await;
    }
);

// ---- Async Python as in a notebook: one event loop, the cell's own frames ---------------

/// (language, a cell whose awaited code fails, its error type, the traceback's first lines,
/// a cell awaiting for ever whose cleanup prints `cleaned up`, how its interrupt begins)
type Frames = (
    &'static str,
    (&'static str, &'static str, &'static str),
    (&'static str, &'static str),
);

const AWAIT_FRAMES: &[Frames] = &[(
    "python",
    (
        "import asyncio\nasync def f():\n    await asyncio.sleep(0)\n    raise ValueError('boom')\nawait f()",
        "ValueError",
        "Traceback (most recent call last):\n  File \"<cell 1>\", line 5, in <module>\n    await f()\n  File \"<cell 1>\", line 4, in f\n    raise ValueError('boom')\nValueError: boom\n",
    ),
    (
        "async def wait():\n    try:\n        await asyncio.sleep(60)\n    finally:\n        print('cleaned up')\nx = 1\nawait wait()",
        "cleaned up\nTraceback (most recent call last):\n  File \"<cell 2>\", line 7, in <module>\n    await wait()\n  File \"<cell 2>\", line 3, in wait\n    await asyncio.sleep(60)\n",
    ),
)];

/// asyncio's runner frames, which a cell's traceback never shows.
const RUNNER: &[&str] = &[
    "base_events",
    "run_until_complete",
    "selectors",
    "runners.py",
];

per_row!(
    /// A cell that awaits shows its own frames when it fails or is interrupted, as any cell
    /// does; the interrupt cancels the cell's task where it waits (its cleanup runs within
    /// the cell) and the session's loop goes on serving the next cell.
    an_await_cell_shows_its_own_frames,
    AWAIT_FRAMES,
    [python],
    |&(lang, (failing, kind, traceback), (forever, interrupted))| {
        let s = Server::stdio().start().await;
        let id = s.start_session(lang).await;
        let o = s.eval(&id, failing).await;
        assert_eq!(
            (status(&o), error_type(&o), output(&o)),
            ("error", kind, traceback),
            "{lang}: {}",
            o.text
        );
        let o = s.eval_t(&id, forever, 2000).await;
        let out = output(&o);
        assert!(
            status(&o) == "timeout"
                && out.starts_with(interrupted)
                && out.ends_with("KeyboardInterrupt\n"),
            "{lang}: {}",
            o.text
        );
        for m in RUNNER {
            assert!(!out.contains(m), "{lang}: asyncio's {m} shows: {out}");
        }
        assert!(o.structured.get("restarted").is_none(), "{lang}: {}", o.text);
        prints(&s, &id, lang, "await asyncio.sleep(0)\nprint(x)", "1\n").await;
        s.stop().await;
    }
);

/// (language, cells run in turn, each with what it prints)
const ONE_LOOP: &[(&str, &[(&str, &str)])] = &[(
    "python",
    &[
        // The same current loop in every cell, running while a cell awaits.
        (
            "import asyncio\nloop = asyncio.get_event_loop()\nprint(loop.is_closed())",
            "False\n",
        ),
        ("print(asyncio.get_event_loop() is loop)", "True\n"),
        (
            "await asyncio.sleep(0)\nprint(asyncio.get_running_loop() is loop)",
            "True\n",
        ),
        // create_task in a cell without await; the task is awaited in the next.
        (
            "async def double(v):\n    await asyncio.sleep(0)\n    return 2 * v\nt = asyncio.create_task(double(21))\nprint(type(t).__name__)",
            "Task\n",
        ),
        ("print(await t)", "42\n"),
        // A coroutine never awaited is not run, and Python's warning names its cell.
        (
            "async def noisy():\n    print('ran')\nc = noisy()\nprint(type(c).__name__)\nc.close()",
            "coroutine\n",
        ),
        (
            "noisy()\nprint('after')",
            "<cell 7>:1: RuntimeWarning: coroutine 'noisy' was never awaited\n  noisy()\nRuntimeWarning: Enable tracemalloc to get the object allocation traceback\nafter\n",
        ),
        // asyncio.run() runs its own loop, as in a script; the session's stays current.
        ("print(asyncio.run(double(4)))", "8\n"),
        (
            "print(asyncio.get_event_loop() is loop, loop.is_closed())",
            "True False\n",
        ),
    ],
)];

per_row!(
    /// One event loop for the session, as in IPython/ipykernel: `get_event_loop()` is the
    /// same in every cell, `create_task` works in any cell, a task started in one cell is
    /// awaited in the next and runs on between cells; `asyncio.run()` still works.
    one_event_loop_across_cells,
    ONE_LOOP,
    [python],
    |&(lang, cells)| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        let s = Server::stdio().arg("--allow-cwd").arg(dir.path()).start().await;
        let o = s
            .call(
                "session_start",
                json!({"language": lang, "cwd": dir.path()}),
            )
            .await;
        assert!(!o.is_error, "{lang}: {}", o.text);
        let id = o.s("session_id").to_string();
        for (code, expected) in cells.iter() {
            prints(&s, &id, lang, code, expected).await;
        }
        // One shown as a cell's value is shown, then warned of in that cell.
        let o = s.eval(&id, "x = 1\nnoisy()").await;
        let out = output(&o);
        assert!(
            status(&o) == "ok"
                && out.starts_with("<coroutine object noisy at 0x")
                && out.contains(">\n<cell 10>:2: RuntimeWarning: coroutine 'noisy' was never awaited\n")
                && !out.contains("ran"),
            "{lang}: {}",
            o.text
        );
        // A task left running: it goes on between cells, with no cell awaiting it.
        prints(
            &s,
            &id,
            lang,
            "import pathlib\nasync def later():\n    await asyncio.sleep(0.05)\n    pathlib.Path('ran').touch()\nt = asyncio.create_task(later())",
            "",
        )
        .await;
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !dir.path().join("ran").exists() {
            assert!(
                std::time::Instant::now() < until,
                "{lang}: the task never ran between cells"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        prints(&s, &id, lang, "print(t.done())", "True\n").await;
        s.stop().await;
    }
);

/// (language, a cell that replaces the interpreter with a program that waits at its own
/// prompt, that program's name)
const REPLACED: &[(&str, &str, &str)] = &[
    ("shellscript", "x=1\nexec bash --norc", "bash"),
    (
        "python",
        "import os\nos.execvp('python3', ['python3', '-q'])",
        "python3",
    ),
];

per_row!(
    /// `exec bash` (anything that replaces the REPL with a program waiting at its own
    /// prompt) is reported as the interpreter replaced, status `exited`, never as
    /// `awaiting_input` at a raw prompt; the program is stopped and the session has ended,
    /// which the next call says.
    a_replaced_interpreter_ends_the_session_saying_so,
    REPLACED,
    [shellscript, python],
    |&(lang, code, program)| {
        let s = Server::stdio().start().await;
        let o = s.call("session_start", json!({"language": lang})).await;
        assert!(!o.is_error, "{lang}: {}", o.text);
        let id = o.s("session_id").to_string();
        let pid = o.structured["pid"].as_i64().unwrap_or_default() as i32;
        let o = s.eval(&id, code).await;
        assert_eq!(status(&o), "exited", "{lang}: {}", o.text);
        assert_eq!(
            o.structured["error"]["type"], "InterpreterReplaced",
            "{lang}: {}",
            o.text
        );
        let message = o.structured["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("{program:?}")) && message.contains("session_start"),
            "{lang}: {message}"
        );
        let o = s.eval(&id, "1").await;
        assert_eq!(o.error_kind(), "ended_session", "{lang}: {}", o.text);
        assert!(
            o.text.contains("replaced its interpreter") && o.text.contains(program),
            "{lang}: {}",
            o.text
        );
        assert!(
            wait_gone(&[pid], std::time::Duration::from_secs(10))
                .await
                .is_empty(),
            "{lang}: the program that replaced the interpreter is stopped"
        );
        s.stop().await;
    }
);

/// A session reaped for idleness while a cell waits for input says so to the next call:
/// when, after how long, which evaluation was waiting and what it asked. One whose
/// interpreter is killed meanwhile says that it exited, and how.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_ended_while_waiting_for_input_says_so() {
    if !here("python") {
        return;
    }
    let s = Server::stdio().start().await;
    // The session to be reaped starts last and is given its cell at once: its idle time
    // runs from its start, and on a loaded machine another start in between can take
    // longer than its timeout.
    let o = s.call("session_start", json!({"language": "python"})).await;
    let killed = o.s("session_id").to_string();
    let pid = o.structured["pid"].as_i64().unwrap_or_default() as i32;
    let o = s
        .call(
            "session_start",
            json!({"language": "python", "idle_timeout_s": 2}),
        )
        .await;
    let reaped = o.s("session_id").to_string();
    for id in [&reaped, &killed] {
        let o = s.eval(id, "name = input('Name? ')").await;
        assert_eq!(status(&o), "awaiting_input", "{}", o.text);
    }
    // Reaped (the reaper runs twice a second): gone from the list, then the answer comes.
    let listed = |o: &Out, id: &str| {
        o.structured["sessions"]
            .as_array()
            .is_some_and(|l| l.iter().any(|r| r["session_id"] == id))
    };
    let t = std::time::Instant::now();
    while listed(&s.call("session_list", json!({})).await, &reaped) {
        assert!(t.elapsed().as_secs() < 30, "not reaped");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let o = input(&s, &reaped, "Ada").await;
    assert_eq!(o.error_kind(), "ended_session", "{}", o.text);
    assert!(
        o.text.contains("closed for idleness")
            && o.text.contains("while evaluation 1 was waiting for input")
            && o.text.contains("\"Name? \"")
            && o.text.contains("session_start"),
        "{}",
        o.text
    );
    // Killed while it waits: the answer is not typed, and the result says it exited.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the interpreter");
    let o = input(&s, &killed, "Ada").await;
    assert_eq!(status(&o), "exited", "{}", o.text);
    assert_eq!(o.structured["signal"], "SIGKILL", "{}", o.text);
    let o = input(&s, &killed, "Ada").await;
    assert_eq!(o.error_kind(), "ended_session", "{}", o.text);
    s.stop().await;
}
