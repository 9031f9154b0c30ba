//! Interrupts never cost a session its state: a deadline that fires at any moment of a cell
//! (before the user's code, inside it, while the bootstrap writes the end marker, after the
//! cell is over) leaves the interpreter running with its variables, and no output ever shows
//! the bootstrap's own code. A cell that catches the interrupt and finishes is an ordinary
//! finished cell. Every check runs through the MCP client, one test per language.

use crate::common;

use common::*;

/// (language, code that sets state, a quick cell, what it prints, a cell that reads the state
/// back, what that prints, what an interrupted quick cell may print: one of these)
type Race = (
    &'static str,
    (&'static str, &'static str, &'static str),
    (&'static str, &'static str),
    &'static [&'static str],
);

const RACE: &[Race] = &[
    (
        "python",
        ("x = 41", "x + 1", "42\n"),
        ("print(x)", "41\n"),
        &["KeyboardInterrupt\n"],
    ),
    (
        "javascript",
        ("let x = await Promise.resolve(41)", "x + 1", "42\n"),
        ("console.log(x)", "41\n"),
        // The REPL shows the error by its stack, or (when it has no frames) as inspected.
        &[
            "Uncaught Error: Script execution was interrupted by `SIGINT`\n",
            "Uncaught [Error: Script execution was interrupted by `SIGINT`] {\n  code: 'ERR_SCRIPT_EXECUTION_INTERRUPTED'\n}\n",
        ],
    ),
    (
        "shellscript",
        ("x=41; cd /", "echo $((x + 1))", "42\n"),
        ("echo $x $PWD", "41 /\n"),
        &["\n"],
    ),
    (
        "ruby",
        ("x = 41", "x + 1", "=> 42\n"),
        ("puts x", "41\n"),
        &["Interrupt\n"],
    ),
    (
        "haskell",
        ("let x = 41 :: Int", "x + 1", "42\n"),
        ("print x", "41\n"),
        // ghci's statement thread, interrupted as it ends, says so itself first.
        &["Interrupted.\n", "ghc: user interrupt\nInterrupted.\n"],
    ),
    (
        "r",
        ("x <- 41", "x + 1", "[1] 42\n"),
        ("print(x)", "[1] 41\n"),
        &["\n"],
    ),
];

/// Evaluations per language: deadlines of 1, 2 and 3 ms in turn, each landing somewhere in
/// a cell that takes about as long (enough to cover the start, the code and the end marker
/// on a loaded machine, few enough for the suite's time).
const ROUNDS: u64 = 30;

/// What must never appear in a cell's output: the bootstrap's files, functions and markers.
const MACHINERY: &[&str] = &[
    "bootstrap",
    "__rbx",
    "rbx;",
    "/ctl/",
    "(To exit, press",
    "replbox",
];

per_row!(
    /// Deadlines of 1–3 ms, again and again: every result is the cell's value (`ok`) or an
    /// interrupt of the cell itself (`timeout`), never a restart, never the bootstrap's own
    /// output; the state set before is still there afterwards. A deadline of 0 is refused.
    deadlines_race_the_cell_end,
    RACE,
    [python, javascript, ruby, shellscript, r, haskell],
    |&(lang, (set, quick, value), (read, state), interrupted)| {
        let s = Server::stdio().start().await;
        let id = s.start_session(lang).await;
        let o = s.eval(&id, set).await;
        assert_eq!(status(&o), "ok", "{lang}: {set}: {}", o.text);
        let zero = s.eval_t(&id, quick, 0).await;
        assert!(
            zero.is_error && zero.text.contains("timeout_ms") && zero.text.contains("at least 1"),
            "{lang}: a deadline of 0 is refused, saying what to do: {}",
            zero.text
        );
        let (mut oks, mut timeouts) = (0, 0);
        for i in 0..ROUNDS {
            let ms = 1 + i % 3;
            let o = s.eval_t(&id, quick, ms).await;
            let out = output(&o);
            assert!(
                o.structured.get("restarted").is_none(),
                "{lang}: round {i} ({ms} ms) restarted the interpreter: {}",
                o.text
            );
            for m in MACHINERY {
                assert!(
                    !out.contains(m),
                    "{lang}: round {i} ({ms} ms) shows the bootstrap ({m}): {}",
                    o.text
                );
            }
            match status(&o) {
                "ok" => {
                    oks += 1;
                    // ghci prints its own notice of an interrupt that lands after the cell's
                    // last statement, between two commands of the bootstrap's queue (no
                    // handler of ours runs there); the cell's value and status stand. Only
                    // ghci: every other REPL's late interrupt is held by its bootstrap.
                    let late = lang == "haskell"
                        && out
                            .strip_prefix(value)
                            .is_some_and(|rest| interrupted.contains(&rest));
                    assert!(
                        out == value || late,
                        "{lang}: round {i} ({ms} ms): {out:?}: {}",
                        o.text
                    );
                }
                "timeout" => {
                    timeouts += 1;
                    // Interrupted at its start, within, or once it had printed its value;
                    // or (ghci) as it read the cell's line, which then still runs.
                    let rest = out.strip_prefix(value).unwrap_or(out);
                    let rest = rest.strip_suffix(value).unwrap_or(rest);
                    assert!(
                        rest.is_empty() || interrupted.contains(&rest),
                        "{lang}: round {i} ({ms} ms): a timeout shows only the cell's own \
                         interrupt: {out:?}"
                    );
                }
                other => panic!("{lang}: round {i} ({ms} ms): status {other}: {}", o.text),
            }
        }
        eprintln!("{lang}: {ROUNDS} deadlines of 1-3 ms: {oks} ok, {timeouts} timeout, 0 restarts");
        let o = s.eval(&id, read).await;
        assert_eq!(
            (status(&o), output(&o)),
            ("ok", state),
            "{lang}: the state survives: {}",
            o.text
        );
        s.stop().await;
    }
);

/// (language, a cell that catches the interrupt its deadline sends and finishes, its output,
/// a cell whose own handler counts the interrupts while it runs on for a while after the
/// first, then prints `interrupts: N`)
type Caught = (
    &'static str,
    &'static str,
    &'static str,
    Option<&'static str>,
);

const CAUGHT: &[Caught] = &[
    (
        "python",
        "import time\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    print('caught')\n'after'",
        "caught\n'after'\n",
        Some(
            "import signal\nn = 0\ndef count(sig, frame):\n    global n\n    n += 1\n\
             signal.signal(signal.SIGINT, count)\nwhile not n:\n    time.sleep(0.02)\n\
             time.sleep(2.5)\nprint('interrupts:', n)",
        ),
    ),
    (
        "ruby",
        "begin\n  sleep 60\nrescue Interrupt\n  puts 'caught'\nend\n:after",
        "caught\n=> :after\n",
        Some(
            "n = 0\ntrap('INT') { n += 1 }\nsleep 0.02 while n == 0\nsleep 2.5\nputs \"interrupts: #{n}\"",
        ),
    ),
    (
        "javascript",
        "await new Promise(r => process.once('SIGINT', () => { console.log('caught'); r(); })); 'after'",
        "caught\n'after'\n",
        Some(
            "let n = 0; const count = () => { n++; }; process.on('SIGINT', count);\n\
             await new Promise(r => { const t = setInterval(() => { if (n) { clearInterval(t); setTimeout(r, 2500); } }, 20); });\n\
             process.removeListener('SIGINT', count); console.log(`interrupts: ${n}`)",
        ),
    ),
    (
        // bash takes Ctrl-C itself while it waits (a foreground program gets it alone).
        "shellscript",
        "trap 'echo caught' INT\n{ sleep 60 & } 2> /dev/null\nwait $!\nkill $!\ntrap - INT\necho after",
        "caught\nafter\n",
        Some(
            "n=0; trap 'n=$((n + 1))' INT\n\
             { sleep 3 & until ((n)); do wait $!; done; wait $!; wait $!; } 2> /dev/null\n\
             trap - INT\necho interrupts: $n",
        ),
    ),
    (
        "r",
        "tryCatch(Sys.sleep(60), interrupt = function(e) cat('caught\\n'))\n'after'",
        "caught\n[1] \"after\"\n",
        None,
    ),
];

per_row!(
    /// A cell that catches the interrupt its deadline sends and finishes is an ordinary
    /// finished cell: `ok`, `interrupted: true`, with its whole output, nothing restarted.
    /// A handler of the cell's own runs once per interrupt: the interrupt is sent once.
    a_caught_interrupt_is_a_finished_cell,
    CAUGHT,
    [python, ruby, javascript, shellscript, r],
    |&(lang, code, shown, handler)| {
        let s = Server::stdio().start().await;
        let id = s.start_session(lang).await;
        let o = s.eval_t(&id, code, 1000).await;
        assert_eq!(
            (status(&o), &o.structured["interrupted"], output(&o)),
            ("ok", &serde_json::json!(true), shown),
            "{lang}: {}",
            o.text
        );
        assert!(!o.is_error, "{lang}: {}", o.text);
        assert_eq!(o.structured.get("restarted"), None, "{lang}: {}", o.text);
        if let Some(handler) = handler {
            let o = s.eval_t(&id, handler, 1000).await;
            assert_eq!(
                (status(&o), &o.structured["interrupted"], output(&o)),
                ("ok", &serde_json::json!(true), "interrupts: 1\n"),
                "{lang}: {}",
                o.text
            );
        }
        s.stop().await;
    }
);

/// Ruby: an interrupt that lands inside rubygems' `require` (a value's `inspect` that
/// requires, as `pp` does on every call) is taken once rubygems' bookkeeping is done, so
/// rubygems never sees its lock left held: no dump of rubygems' own check, no error, and
/// `require` still works afterwards from another thread (a lock left held by the main
/// thread would hang it). Forced: one cell takes 60 interrupts, each at a random moment of
/// a loop of `require`s of features already loaded (without the hold, a few percent of them
/// land in rubygems' own code; one that lands while a file loads is the code's, and would
/// load it again). The user's slow `inspect` is still interrupted by a deadline, and an interrupt
/// the cell catches starts at the cell's frame, not the bootstrap's.
#[tokio::test]
async fn a_ruby_interrupt_inside_require_is_taken_after_it() {
    if !require_language("ruby") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("ruby").await;
    let o = s
        .eval(
            &id,
            "require 'set'\nbad = []\n\
             60.times do\n\
             \x20 kid = nil\n\
             \x20 begin\n\
             \x20   kid = fork { sleep 0.01 + rand * 0.02; Process.kill('INT', Process.ppid); exit! }\n\
             \x20   loop { require 'io/console'; require 'set' }\n\
             \x20 rescue Interrupt\n\
             \x20 rescue Exception => e\n\
             \x20   bad << e.class\n\
             \x20 ensure\n\
             \x20   Process.wait(kid) if kid\n\
             \x20 end\n\
             end\n\
             Process.waitall\n\
             t = Thread.new { require 'json'; :free }\n\
             [bad, t.join(20) ? t.value : :held]",
        )
        .await;
    assert_eq!(
        (status(&o), output(&o)),
        ("ok", "=> [[], :free]\n"),
        "every interrupt is the cell's, rubygems' lock is free: {}",
        o.text
    );
    let o = s
        .eval(
            &id,
            "class Slow\n  def inspect\n    loop { require 'io/console' }\n  end\nend\nnil",
        )
        .await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    let o = s.eval_t(&id, "Slow.new", 300).await;
    assert_eq!(
        (status(&o), output(&o)),
        ("timeout", "Interrupt\n"),
        "the slow inspect is interrupted, nothing else shows: {}",
        o.text
    );
    assert_eq!(o.structured.get("restarted"), None, "{}", o.text);
    let o = s
        .eval_t(
            &id,
            "begin\n  sleep 60\nrescue Interrupt => e\n  puts e.backtrace.first\nend",
            300,
        )
        .await;
    assert!(
        status(&o) == "ok" && output(&o).starts_with("<cell "),
        "{}",
        o.text
    );
    s.stop().await;
}
