//! Sessions of every session language (Python, Node, Ruby, Haskell, Bash) through a real MCP
//! client.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

/// Per-language snippets for the shared behaviours, and what they should print.
struct Snippets {
    set_x: &'static str,
    read_x: &'static str,
    /// Output of `read_x` (x + 1 with x = 41).
    x_plus_one: &'static str,
    raise: &'static str,
    /// error.type and error.message of `raise` (its output contains "bad value").
    raised: (&'static str, &'static str),
    two_plus_two: &'static str,
    /// Output of `two_plus_two`.
    four: &'static str,
    busy_loop: &'static str,
    many_lines: &'static str,
    progress: &'static str,
    colours: &'static str,
    unicode: &'static str,
    exit3: &'static str,
    /// Wait until a file `gate` appears in the working directory, then print "slept".
    wait_for_gate: &'static str,
    no_newline_then_more: &'static str,
    /// Output of `no_newline_then_more`.
    partial_then_rest: &'static str,
    fake_prompts: &'static str,
    /// How the output of `fake_prompts` starts and ends.
    fake_prompts_out: (&'static str, &'static str),
    /// Start `sleep 300` in the background and print its pid (alone on the last line).
    spawn_sleep: &'static str,
    /// Print the working directory.
    print_cwd: &'static str,
    /// Write "hi" to made-here.txt in the working directory.
    write_file: &'static str,
}

fn snippets(lang: &str) -> Snippets {
    match lang {
        "python" => Snippets {
            set_x: "x = 41",
            read_x: "x + 1",
            x_plus_one: "42\n",
            raise: "raise ValueError('bad value')",
            raised: ("ValueError", "bad value"),
            two_plus_two: "2+2",
            four: "4\n",
            busy_loop: "while True: pass",
            many_lines: "for i in range(200000): print('line', i)",
            progress: "import sys\nfor i in range(101):\n    sys.stdout.write(f'\\rprogress {i}%')\n    sys.stdout.flush()\nprint()",
            colours: "print('\\x1b[1;31mred\\x1b[0m and \\x1b[32mgreen\\x1b[0m')",
            unicode: "print('héllo 世界 🎉')",
            exit3: "import os; os._exit(3)",
            wait_for_gate: "import os, time\nwhile not os.path.exists('gate'): time.sleep(0.01)\nprint('slept')",
            no_newline_then_more: "import sys, time\nsys.stdout.write('partial >>> '); sys.stdout.flush(); time.sleep(0.2)\nprint('rest')",
            partial_then_rest: "partial >>> rest\n",
            fake_prompts: "import sys\nprint('>>> ')\nprint('... ')\nprint(sys.ps1 + 'after-prompt')\nprint('In [1]: ')\n'done'",
            fake_prompts_out: (">>> \n... \n", "'done'\n"),
            spawn_sleep: "import subprocess\np = subprocess.Popen(['sleep', 'SECS'])",
            print_cwd: "import os; os.getcwd()",
            write_file: "open('made-here.txt', 'w').write('hi')",
        },
        "javascript" => Snippets {
            set_x: "let x = 41",
            read_x: "x + 1",
            x_plus_one: "42\n",
            raise: "throw new RangeError('bad value')",
            raised: ("RangeError", "bad value"),
            two_plus_two: "2+2",
            four: "4\n",
            busy_loop: "while (true) {}",
            many_lines: "for (let i = 0; i < 200000; i++) console.log('line', i)",
            progress: "for (let i = 0; i <= 100; i++) process.stdout.write(`\\rprogress ${i}%`)\nconsole.log()",
            colours: "console.log('\\x1b[1;31mred\\x1b[0m and \\x1b[32mgreen\\x1b[0m')",
            unicode: "console.log('héllo 世界 🎉')",
            exit3: "process.exit(3)",
            wait_for_gate: "while (!require('fs').existsSync('gate')) await new Promise(r => setTimeout(r, 10))\nconsole.log('slept')",
            no_newline_then_more: "process.stdout.write('partial > ')\nawait new Promise(r => setTimeout(r, 200))\nconsole.log('rest')",
            partial_then_rest: "partial > rest\n",
            fake_prompts: "console.log('> ')\nconsole.log('... ')\nconsole.log('> after-prompt')\n'done'",
            fake_prompts_out: ("> \n... \n", "'done'\n"),
            spawn_sleep: "const cp = require('child_process').spawn('sleep', ['SECS']); 0",
            print_cwd: "process.cwd()",
            write_file: "require('fs').writeFileSync('made-here.txt', 'hi')",
        },
        "ruby" => Snippets {
            set_x: "x = 41",
            read_x: "x + 1",
            x_plus_one: "=> 42\n",
            raise: "raise ArgumentError, 'bad value'",
            raised: ("ArgumentError", "bad value"),
            two_plus_two: "2+2",
            four: "=> 4\n",
            busy_loop: "loop {}",
            many_lines: "200000.times { |i| puts \"line #{i}\" }\nnil",
            progress: "101.times { |i| print \"\\rprogress #{i}%\"; $stdout.flush }\nputs",
            colours: "puts \"\\e[1;31mred\\e[0m and \\e[32mgreen\\e[0m\"",
            unicode: "puts 'héllo 世界 🎉'",
            exit3: "exit 3",
            wait_for_gate: "sleep 0.01 until File.exist?('gate')\nputs 'slept'",
            no_newline_then_more: "print 'partial irb> '\n$stdout.flush\nsleep 0.2\nputs 'rest'",
            partial_then_rest: "partial irb> rest\n",
            fake_prompts: "puts 'irb(main):001:0> '\nputs 'irb(main):002:0* '\nputs conf.prompt_i + 'after-prompt'\n'done'",
            fake_prompts_out: ("irb(main):001:0> \nirb(main):002:0* \n", "=> \"done\"\n"),
            spawn_sleep: "spawn('sleep', 'SECS'); nil",
            print_cwd: "puts Dir.pwd",
            write_file: "File.write('made-here.txt', 'hi')",
        },
        "haskell" => Snippets {
            set_x: "x = 41",
            read_x: "x + 1",
            x_plus_one: "42\n",
            raise: "error \"bad value\" :: Int",
            raised: ("Exception", "bad value"),
            two_plus_two: "2+2",
            four: "4\n",
            busy_loop: "length [1..]",
            many_lines: "mapM_ (\\i -> putStrLn (\"line \" ++ show i)) [0 .. 199999 :: Int]",
            progress: "mapM_ (\\i -> putStr (\"\\rprogress \" ++ show i ++ \"%\")) [0 .. 100 :: Int]\nputStrLn \"\"",
            colours: "putStrLn \"\\ESC[1;31mred\\ESC[0m and \\ESC[32mgreen\\ESC[0m\"",
            unicode: "putStrLn \"héllo 世界 🎉\"",
            exit3: "System.Posix.Process.exitImmediately (System.Exit.ExitFailure 3)",
            wait_for_gate: "let waitGate = System.Directory.doesFileExist \"gate\" >>= \\e -> if e then pure () else Control.Concurrent.threadDelay 10000 >> waitGate\nwaitGate\nputStrLn \"slept\"",
            no_newline_then_more: "putStr \"partial ghci> \"\nSystem.IO.hFlush System.IO.stdout\nControl.Concurrent.threadDelay 200000\nputStrLn \"rest\"",
            partial_then_rest: "partial ghci> rest\n",
            fake_prompts: "putStrLn \"ghci> \"\nputStrLn \"Prelude> \"\nputStrLn \"ghci| after-prompt\"\n\"done\"",
            fake_prompts_out: ("ghci> \nPrelude> \n", "\"done\"\n"),
            spawn_sleep: ":! sleep SECS &",
            print_cwd: "System.Directory.getCurrentDirectory >>= putStrLn",
            write_file: "writeFile \"made-here.txt\" \"hi\"",
        },
        "shellscript" => Snippets {
            set_x: "x=41",
            read_x: "echo $((x + 1))",
            x_plus_one: "42\n",
            raise: "echo 'bad value' >&2\nfalse",
            raised: ("exit_status", "1"),
            two_plus_two: "echo $((2+2))",
            four: "4\n",
            busy_loop: "while :; do :; done",
            many_lines: "seq -f 'line %g' 0 199999",
            progress: "for i in $(seq 0 100); do printf '\\rprogress %d%%' \"$i\"; done\necho",
            colours: "printf '\\e[1;31mred\\e[0m and \\e[32mgreen\\e[0m\\n'",
            unicode: "echo 'héllo 世界 🎉'",
            exit3: "exit 3",
            wait_for_gate: "until [ -e gate ]; do sleep 0.01; done\necho slept",
            no_newline_then_more: "printf 'partial $ '\nsleep 0.2\necho rest",
            partial_then_rest: "partial $ rest\n",
            fake_prompts: "echo '$ '\necho '> '\necho \"${PS1}after-prompt\"\necho done",
            fake_prompts_out: ("$ \n> \n", "done\n"),
            // In a subshell, so that the interactive shell prints no `[1] PID` job line.
            spawn_sleep: "(sleep SECS &)",
            print_cwd: "pwd",
            write_file: "echo hi > made-here.txt",
        },
        other => panic!("no snippets for {other}"),
    }
}

per_lang!(
    state_persists_and_errors_do_not_break_the_session,
    [python, javascript, ruby, haskell, shellscript],
    |lang| {
        let s = Server::stdio().start().await;
        let sn = snippets(lang);
        let id = s.start_session(lang).await;
        let o = s.eval(&id, sn.set_x).await;
        assert_eq!(status(&o), "ok", "{lang}: {}", o.text);
        assert_eq!(o.structured["eval_id"], 1);
        let o = s.eval(&id, sn.read_x).await;
        assert_eq!(output(&o), sn.x_plus_one, "{lang}");
        assert_eq!(o.text, sn.x_plus_one, "{lang}: text is the output");
        let o = s.eval(&id, sn.raise).await;
        assert_eq!(status(&o), "error", "{lang}: {}", o.text);
        assert!(o.is_error);
        assert!(output(&o).contains("bad value"), "{lang}: {}", output(&o));
        assert_eq!(o.structured["error"]["type"], sn.raised.0, "{lang}");
        assert_eq!(o.structured["error"]["message"], sn.raised.1, "{lang}");
        let o = s.eval(&id, sn.two_plus_two).await;
        assert_eq!((status(&o), output(&o)), ("ok", sn.four), "{lang}");
        assert_eq!(o.structured["eval_id"], 4);
        s.call("session_close", json!({"session_id": id})).await;
        s.stop().await;
    }
);

#[tokio::test(flavor = "multi_thread")]
async fn python_semantics() {
    if !require("python", "python3") {
        return;
    }
    let s = Server::stdio().start().await;
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
    let s = Server::stdio().start().await;
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
    // The interrupt stops a printing loop, often inside a write to the terminal: the session
    // still answers and keeps its state.
    for _ in 0..3 {
        let o = s
            .eval_t(&id, "for (let i = 0; ; i++) console.log(i)", 300)
            .await;
        assert_eq!(status(&o), "timeout", "{}", o.text);
        assert_eq!(o.structured.get("restarted"), None, "{}", o.text);
    }
    let o = s.eval(&id, "a + b").await;
    assert_eq!((status(&o), output(&o)), ("ok", "3\n"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ruby_semantics() {
    if !require("ruby", "ruby") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("irb").await;
    // A multi-line cell with a class, a method and blank lines; locals persist.
    let code = r##"
class Shape
  attr_reader :sides

  def initialize(sides)
    @sides = sides
  end

  def describe
    "#{sides} sides"
  end
end

square = Shape.new(4)
square.describe
"##;
    let o = s.eval(&id, code).await;
    assert_eq!(
        (status(&o), output(&o)),
        ("ok", "=> \"4 sides\"\n"),
        "{}",
        o.text
    );
    let o = s.eval(&id, "square.sides * 10").await;
    assert_eq!(output(&o), "=> 40\n", "a local of an earlier cell");
    // The last value is `_`, as in irb; nil is not shown; output comes before the value.
    let o = s.eval(&id, "_ + 2").await;
    assert_eq!(output(&o), "=> 42\n", "{}", o.text);
    let o = s.eval(&id, "puts 'printed'").await;
    assert_eq!(output(&o), "printed\n");
    let o = s.eval(&id, "puts 'a'\n[1, {b: 'c'}]").await;
    assert_eq!(output(&o), "a\n=> [1, {:b=>\"c\"}]\n");
    // An assignment shows its value, as irb shows it.
    let o = s.eval(&id, "y = 'why'").await;
    assert_eq!(output(&o), "=> \"why\"\n");
    // A Ruby exception carries its class, also a user-defined one, and its message.
    let o = s
        .eval(
            &id,
            "class AppError < StandardError; end\nraise AppError, 'it broke'",
        )
        .await;
    assert_eq!(status(&o), "error", "{}", o.text);
    assert_eq!(o.structured["error"]["type"], "AppError");
    assert_eq!(o.structured["error"]["message"], "it broke");
    assert!(output(&o).contains("<cell 7>:2:in"), "{}", output(&o));
    assert!(!output(&o).contains("bootstrap"), "{}", output(&o));
    let o = s.eval(&id, "nil.upcase").await;
    assert_eq!(o.structured["error"]["type"], "NoMethodError");
    let o = s.eval(&id, "def broken(\n  1").await;
    assert_eq!(status(&o), "error", "{}", o.text);
    assert_eq!(o.structured["error"]["type"], "SyntaxError");
    // An Interrupt raised by the code itself is an error of that class.
    let o = s.eval(&id, "raise Interrupt").await;
    assert_eq!(status(&o), "error", "{}", o.text);
    assert_eq!(o.structured["error"]["type"], "Interrupt");
    let o = s.eval(&id, "square.sides").await;
    assert_eq!((status(&o), output(&o)), ("ok", "=> 4\n"), "state kept");
    // Kernel#exit ends the interpreter with its status.
    let o = s.eval(&id, "Kernel.exit(5)").await;
    assert_eq!(status(&o), "exited", "{}", o.text);
    assert_eq!(o.structured["exit_code"], 5);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn haskell_semantics() {
    if !require("haskell", "ghci") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("ghci").await;
    // A multi-line function with its type signature, guards and a where clause.
    let code = r#"
-- | Factorial, the long way.
fact :: Integer -> Integer
fact n
  | n <= 1 = 1
  | otherwise = n * rest
  where
    rest = fact (n - 1)

fact 20
"#;
    let o = s.eval(&id, code).await;
    assert_eq!(
        (status(&o), output(&o)),
        ("ok", "2432902008176640000\n"),
        "{}",
        o.text
    );
    // A data declaration, a class, an instance and expressions in one cell.
    let code = r#"data Colour = Red | Green | Blue deriving (Show, Eq, Enum, Bounded)

class Describe a where
  describe :: a -> String

instance Describe Colour where
  describe c = "colour " ++ show c

[minBound .. maxBound :: Colour]
map describe [Red, Blue]"#;
    let o = s.eval(&id, code).await;
    assert_eq!(
        (status(&o), output(&o)),
        ("ok", "[Red,Green,Blue]\n[\"colour Red\",\"colour Blue\"]\n"),
        "{}",
        o.text
    );
    // Mutually recursive functions in one cell are one group of declarations.
    let o = s
        .eval(
            &id,
            "isEven :: Int -> Bool\nisEven 0 = True\nisEven n = isOdd (n - 1)\nisOdd :: Int -> Bool\nisOdd 0 = False\nisOdd n = isEven (n - 1)\n(isEven 10, isOdd 7)",
        )
        .await;
    assert_eq!(output(&o), "(True,True)\n", "{}", o.text);
    // Definitions persist; `it` is the last value; binds and lets work; ghci commands too.
    let o = s.eval(&id, "describe Green").await;
    assert_eq!(output(&o), "\"colour Green\"\n");
    let o = s.eval(&id, "length it").await;
    assert_eq!(output(&o), "12\n", "it is the last value");
    let o = s
        .eval(&id, "n <- return (6 :: Int)\nlet m = n * 7\nm")
        .await;
    assert_eq!(output(&o), "42\n", "{}", o.text);
    let o = s.eval(&id, ":t fact").await;
    assert_eq!(output(&o), "fact :: Integer -> Integer\n");
    let o = s
        .eval(&id, "import Data.List (sortOn)\nsortOn negate [3, 1, 2]")
        .await;
    assert_eq!(output(&o), "[3,2,1]\n", "{}", o.text);
    // A type error is an error, pointing at the cell's line.
    let o = s.eval(&id, "ok = 1\nbad = 1 + True").await;
    assert_eq!(status(&o), "error", "{}", o.text);
    assert_eq!(o.structured["error"]["type"], "error");
    let msg = o.structured["error"]["message"].as_str().unwrap_or("");
    assert!(msg.contains("No instance for (Num Bool)"), "{msg}");
    assert!(output(&o).contains("<cell 9>:2:"), "{}", output(&o));
    // So is a parse error, and a name not in scope.
    let o = s.eval(&id, "f x = = x").await;
    assert_eq!(status(&o), "error", "{}", o.text);
    let msg = o.structured["error"]["message"].as_str().unwrap_or("");
    assert!(msg.contains("parse error"), "{msg}");
    let o = s.eval(&id, "notDefinedAnywhere 1").await;
    assert_eq!(status(&o), "error", "{}", o.text);
    // An uncaught exception is an error of type Exception.
    let o = s.eval(&id, "head ([] :: [Int])").await;
    assert_eq!(status(&o), "error", "{}", o.text);
    assert_eq!(o.structured["error"]["type"], "Exception");
    // exitWith is an exception in ghci, which keeps running.
    let o = s
        .eval(&id, "System.Exit.exitWith (System.Exit.ExitFailure 3)")
        .await;
    assert_eq!(status(&o), "error", "{}", o.text);
    assert_eq!(o.structured["error"]["message"], "ExitFailure 3");
    let o = s.eval(&id, "fact 5").await;
    assert_eq!((status(&o), output(&o)), ("ok", "120\n"), "state kept");
    // A timeout interrupts the item running and the rest of the cell does not run.
    let o = s
        .eval_t(&id, "length [1 ..]\nputStrLn \"not reached\"", 1000)
        .await;
    assert_eq!(status(&o), "timeout", "{}", o.text);
    assert_eq!(o.structured.get("restarted"), None);
    assert!(output(&o).contains("Interrupted."), "{}", output(&o));
    assert!(!output(&o).contains("not reached"), "{}", output(&o));
    let o = s.eval(&id, "fact 3").await;
    assert_eq!(
        (status(&o), output(&o)),
        ("ok", "6\n"),
        "in sync, state kept"
    );
    // The macros are the compiled module's (a package, which the server, as root, builds
    // into its cache at the first session); neither a `:load` of the user's nor a reset of
    // the package flags (which unloads what was loaded) takes them away.
    let o = s.eval(&id, ":show packages").await;
    if nix::unistd::geteuid().is_root() {
        assert!(output(&o).contains("replbox-ghci"), "{}", o.text);
    }
    let o = s
        .eval(
            &id,
            "writeFile \"M.hs\" \"module M where\\nm = 7 :: Int\\n\"\n:load M.hs\nm * 6",
        )
        .await;
    assert!(output(&o).ends_with("42\n"), "{}", o.text);
    let o = s
        .eval(&id, ":set -package containers\nSystem.Mem.performGC\n6 * 7")
        .await;
    assert_eq!(
        (status(&o), output(&o).ends_with("42\n")),
        ("ok", true),
        "{}",
        o.text
    );
    // Unicode goes through putStrLn unchanged (show escapes it, as in ghci).
    let o = s.eval(&id, "putStrLn \"λ → ü\"\n\"λ\"").await;
    assert_eq!(output(&o), "λ → ü\n\"\\955\"\n");
    // :quit ends the session.
    let o = s.eval(&id, ":quit").await;
    assert_eq!(status(&o), "exited", "{}", o.text);
    assert_eq!(o.structured["exit_code"], 0);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bash_semantics() {
    if !require("shellscript", "bash") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("bash").await;
    // cd persists (into a directory of the session's own: a sandbox hides the host's /tmp).
    let o = s.eval(&id, "mkdir -p 'sub dir' && cd 'sub dir'").await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    let o = s.eval(&id, "pwd").await;
    assert!(output(&o).ends_with("/work/sub dir\n"), "{}", output(&o));
    // Functions persist; a multi-line cell with a here-document and a loop.
    let code = r#"greet() {
  local who=$1
  echo "hello, $who"
}

cat <<END
multi
  line
END
for i in 1 2; do
  greet "n$i"
done"#;
    let o = s.eval(&id, code).await;
    assert_eq!(
        (status(&o), output(&o)),
        ("ok", "multi\n  line\nhello, n1\nhello, n2\n"),
        "{}",
        o.text
    );
    let o = s.eval(&id, "greet again; echo \"who=${who-unset}\"").await;
    assert_eq!(
        output(&o),
        "hello, again\nwho=unset\n",
        "local stayed local"
    );
    // The cell runs at the top level: declare makes globals, local is refused.
    let o = s.eval(&id, "declare -i count=40\ncount+=2").await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    let o = s.eval(&id, "echo $count").await;
    assert_eq!(output(&o), "42\n");
    let o = s.eval(&id, "local nope=1").await;
    assert_eq!(status(&o), "error", "{}", o.text);
    // A non-zero $? of the last command is an error carrying the status...
    let o = s.eval(&id, "false").await;
    assert_eq!(status(&o), "error", "{}", o.text);
    assert_eq!(o.structured["error"]["type"], "exit_status");
    assert_eq!(o.structured["error"]["message"], "1");
    assert!(o.text.contains("[error: exit_status: 1]"), "{}", o.text);
    // ...which the next cell still sees as $?.
    let o = s.eval(&id, "echo \"previous: $?\"").await;
    assert_eq!((status(&o), output(&o)), ("ok", "previous: 1\n"));
    // Only the last command counts.
    let o = s.eval(&id, "false\ntrue").await;
    assert_eq!(status(&o), "ok");
    let o = s.eval(&id, "no-such-command-here").await;
    assert_eq!(o.structured["error"]["message"], "127");
    assert!(output(&o).contains("command not found"), "{}", output(&o));
    let o = s.eval(&id, "(exit 4)").await;
    assert_eq!(
        o.structured["error"]["message"], "4",
        "a subshell's exit is a status"
    );
    let o = s.eval(&id, "if then").await;
    assert_eq!(status(&o), "error", "syntax error: {}", o.text);
    // The end marker still arrives when the code redirects its stdout.
    let o = s.eval(&id, "exec 3>&1 >/dev/null\necho hidden").await;
    assert_eq!((status(&o), output(&o)), ("ok", ""), "{}", o.text);
    let o = s.eval(&id, "exec >&3 3>&-\necho visible").await;
    assert_eq!(output(&o), "visible\n");
    // Ctrl-C stops a foreground command; variables and cwd survive.
    let o = s.eval_t(&id, "sleep 30", 500).await;
    assert_eq!(status(&o), "timeout", "{}", o.text);
    assert_eq!(o.structured.get("restarted"), None);
    let o = s.eval(&id, "echo \"$count $(pwd)\"").await;
    assert!(output(&o).starts_with("42 /"), "{}", output(&o));
    assert!(output(&o).ends_with("/work/sub dir\n"), "{}", output(&o));
    s.stop().await;
}

per_lang!(
    timeout_interrupts_and_keeps_state,
    [python, javascript, ruby, haskell, shellscript],
    |lang| {
        let s = Server::stdio().start().await;
        let sn = snippets(lang);
        let id = s.start_session(lang).await;
        s.eval(&id, sn.set_x).await;
        let o = s.eval_t(&id, sn.busy_loop, 2000).await;
        assert_eq!(status(&o), "timeout", "{lang}: {}", o.text);
        assert!(o.is_error);
        assert_eq!(o.structured.get("restarted"), None, "{lang}: state kept");
        assert!(o.text.contains("state"), "{lang}: {}", o.text);
        let o = s.eval(&id, sn.read_x).await;
        assert_eq!(
            (status(&o), output(&o)),
            ("ok", sn.x_plus_one),
            "{lang}: x survived"
        );
        s.stop().await;
    }
);

#[tokio::test(flavor = "multi_thread")]
async fn the_bootstrap_is_told_before_the_interrupt() {
    if !require("shellscript", "bash") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("bash").await;
    // The code ignores Ctrl-C and ends when the flag file of its evaluation appears.
    let code = "trap '' INT\nuntil [ -e \"$__rbx_c/interrupted-1\" ]; do sleep 0.02; done\necho saw-the-flag";
    // It finishes: an ordinary cell, which says it was interrupted.
    let o = s.eval_t(&id, code, 500).await;
    assert_eq!(
        (status(&o), &o.structured["interrupted"]),
        ("ok", &json!(true)),
        "{}",
        o.text
    );
    assert_eq!(o.structured.get("restarted"), None, "{}", o.text);
    assert!(output(&o).contains("saw-the-flag"), "{}", o.text);
    // It is gone once the evaluation has ended.
    let o = s.eval(&id, "ls \"$__rbx_c\"").await;
    assert!(!output(&o).contains("interrupted-"), "{}", output(&o));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interpreter_that_ignores_the_interrupt_is_restarted() {
    if !require("python", "python3") {
        return;
    }
    let s = Server::stdio().start().await;
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

per_lang!(
    big_output_is_bounded_and_the_next_eval_is_in_sync,
    [python, javascript, ruby, haskell, shellscript],
    |lang| {
        let s = Server::stdio().start().await;
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
        assert_eq!((status(&o), output(&o)), ("ok", sn.four), "{lang}: in sync");
        s.stop().await;
    }
);

per_lang!(
    prompt_lookalikes_neither_cut_nor_shift_output,
    [python, javascript, ruby, haskell, shellscript],
    |lang| {
        let s = Server::stdio().start().await;
        let sn = snippets(lang);
        let id = s.start_session(lang).await;
        let o = s.eval(&id, sn.fake_prompts).await;
        assert_eq!(status(&o), "ok", "{lang}: {}", o.text);
        let out = output(&o);
        assert!(out.contains("after-prompt"), "{lang}: {out}");
        assert!(out.starts_with(sn.fake_prompts_out.0), "{lang}: {out}");
        assert!(out.ends_with(sn.fake_prompts_out.1), "{lang}: {out}");
        let o = s.eval(&id, sn.no_newline_then_more).await;
        assert_eq!(status(&o), "ok", "{lang}");
        assert_eq!(output(&o), sn.partial_then_rest, "{lang}");
        let o = s.eval(&id, sn.two_plus_two).await;
        assert_eq!(
            output(&o),
            sn.four,
            "{lang}: nothing shifted into the next evaluation"
        );
        s.stop().await;
    }
);

per_lang!(
    terminal_output_is_cleaned,
    [python, javascript, ruby, haskell, shellscript],
    |lang| {
        let s = Server::stdio().start().await;
        let sn = snippets(lang);
        let id = s.start_session(lang).await;
        let o = s.eval(&id, sn.progress).await;
        assert_eq!(output(&o), "progress 100%\n", "{lang}: progress collapses");
        let o = s.eval(&id, sn.colours).await;
        assert_eq!(output(&o), "red and green\n", "{lang}: colours vanish");
        assert!(!o.text.contains('\x1b'));
        let o = s.eval(&id, sn.unicode).await;
        assert_eq!(output(&o), "héllo 世界 🎉\n", "{lang}: unicode exact");
        s.stop().await;
    }
);

per_lang!(
    exit_is_noticed_at_once,
    [python, javascript, ruby, haskell, shellscript],
    |lang| {
        let s = Server::stdio().start().await;
        let sn = snippets(lang);
        let id = s.start_session(lang).await;
        // Noticed as the interpreter ends, not at the deadline: an exit found only by the
        // deadline's interrupt (the terminal gone) says `exited` too, once the deadline has
        // passed. Not a bound on the time itself: under load (average 25) this cell has
        // taken 4.9 s.
        let t = Instant::now();
        let o = s.eval_t(&id, sn.exit3, 60_000).await;
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{lang}: noticed only at the deadline, after {:?}",
            t.elapsed()
        );
        assert_eq!(status(&o), "exited", "{lang}: {}", o.text);
        assert_eq!(o.structured["exit_code"], 3, "{lang}");
        assert!(o.is_error);
        let o = s.eval(&id, "1").await;
        assert_eq!(o.error_kind(), "ended_session", "{lang}: {}", o.text);
        assert!(
            o.text.contains("exit code 3") && o.text.contains("session_start"),
            "{lang}: {}",
            o.text
        );
        let id2 = s.start_session(lang).await;
        let o = s.eval(&id2, sn.two_plus_two).await;
        assert_eq!(output(&o), sn.four, "{lang}: a new session works");
        s.call("session_close", json!({"session_id": id2})).await;
        // Nothing of the exited interpreters is left behind.
        let left = s.wait_no_descendants(Duration::from_secs(5)).await;
        s.stop().await;
        assert!(left.is_empty(), "{lang}: {left:?}");
    }
);

// Four evaluations of one language overlap: each waits for a file that the test writes
// only once all four are running at the same time, so run one after another they never
// end (each would wait for the gate until its timeout).
per_lang!(
    sessions_run_in_parallel,
    [python, javascript, ruby, haskell, shellscript],
    |lang| {
        let s = std::sync::Arc::new(Server::stdio().start().await);
        let sn = snippets(lang);
        let mut sessions = Vec::new();
        for _ in 0..4 {
            let o = s.call("session_start", json!({"language": lang})).await;
            assert!(!o.is_error, "{lang}: {}", o.text);
            sessions.push((o.s("session_id").to_string(), o.s("cwd").to_string()));
        }
        let mut tasks = Vec::new();
        for (id, _) in sessions.clone() {
            let s = s.clone();
            let code = sn.wait_for_gate;
            tasks.push(tokio::spawn(async move { s.eval(&id, code).await }));
        }
        let ids: Vec<&str> = sessions.iter().map(|(id, _)| id.as_str()).collect();
        wait_busy(&s, &ids).await;
        for (_, cwd) in &sessions {
            std::fs::write(std::path::Path::new(cwd).join("gate"), "").expect("write the gate");
        }
        for task in tasks {
            let o = task.await.unwrap();
            assert_eq!(output(&o), "slept\n", "{lang}: {}", o.text);
        }
        for (id, _) in sessions {
            s.call("session_close", json!({"session_id": id})).await;
        }
    }
);

/// Wait until every session of `ids` is busy at the same time (bounded: a failure, not a
/// hang, when they never are).
async fn wait_busy(s: &TestServer, ids: &[&str]) {
    let t = Instant::now();
    loop {
        let l = s.call("session_list", json!({})).await;
        let busy = l.structured["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["busy"] == true && ids.contains(&x["session_id"].as_str().unwrap_or("")))
            .count();
        if busy == ids.len() {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{busy} of {} sessions busy at once: {}",
            ids.len(),
            l.structured
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// The busy answer does not wait for the evaluation that is running: that one waits for a
// file the test writes only after the answer has come.
per_lang!(
    a_busy_session_says_so_at_once,
    [python, javascript, ruby, haskell, shellscript],
    |lang| {
        let s = std::sync::Arc::new(Server::stdio().start().await);
        let sn = snippets(lang);
        let o = s.call("session_start", json!({"language": lang})).await;
        assert!(!o.is_error, "{lang}: {}", o.text);
        let (id, cwd) = (o.s("session_id").to_string(), o.s("cwd").to_string());
        let s2 = s.clone();
        let id2 = id.clone();
        let slow = tokio::spawn(async move { s2.eval(&id2, sn.wait_for_gate).await });
        // Wait until the first evaluation is running.
        wait_busy(&s, &[&id]).await;
        let o = s.eval(&id, sn.two_plus_two).await;
        assert!(
            !slow.is_finished(),
            "{lang}: the busy answer waited for the evaluation"
        );
        assert_eq!(o.error_kind(), "busy", "{lang}: {}", o.text);
        assert_eq!(o.structured["error"]["eval_id"], 1, "{lang}: {}", o.text);
        std::fs::write(std::path::Path::new(&cwd).join("gate"), "").expect("write the gate");
        let first = slow.await.unwrap();
        assert_eq!(output(&first), "slept\n", "{lang}: no interleaving");
        let o = s.eval(&id, sn.two_plus_two).await;
        assert_eq!(output(&o), sn.four, "{lang}");
    }
);

per_lang!(
    directories_and_cleanup,
    [python, javascript, ruby, haskell, shellscript],
    |lang| {
        // Callers' directories live under /tmp here, which the sandbox masks: the operator
        // allows this one tree (searchable by the sessions' users).
        let allowed = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            allowed.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        // Ended sessions' files are not kept here: the directory goes with the session.
        let s = Server::stdio()
            .arg("--allow-cwd")
            .arg(allowed.path())
            .args(["--keep-files-s", "0"])
            .start()
            .await;
        // A private directory, removed at close, with the process tree.
        let start = s.call("session_start", json!({"language": lang})).await;
        let id = start.s("session_id").to_string();
        let cwd = std::path::PathBuf::from(start.s("cwd"));
        assert!(cwd.is_dir());
        let pid = start.structured["pid"].as_i64().unwrap() as i32;
        let sn = snippets(lang);
        // A background child, found by a unique argument: inside a sandbox's pid namespace the
        // pid the program sees is not the host's.
        let secs = format!(
            "300.{}",
            std::process::id() + cwd.to_str().unwrap().len() as u32
        );
        let o = s.eval(&id, &sn.spawn_sleep.replace("SECS", &secs)).await;
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
        let o = s.eval(&id, sn.print_cwd).await;
        assert!(
            output(&o).contains(cwd.to_str().unwrap()),
            "{lang}: {}",
            output(&o)
        );
        let c = s.call("session_close", json!({"session_id": id})).await;
        assert_eq!(c.structured["closed"], true);
        let t = Instant::now();
        while alive(child) || alive(pid) {
            assert!(
                t.elapsed() < Duration::from_secs(3),
                "{lang}: processes survived close"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!cwd.exists(), "{lang}: private directory removed");
        let o = s.eval(&id, "1").await;
        assert_eq!(o.error_kind(), "ended_session", "{}", o.text);
        assert!(
            o.text.contains("closed") && o.text.contains("session_start"),
            "{}",
            o.text
        );

        // An existing directory is used and kept. User code runs as an unprivileged user, so
        // the directory must let it write (a caller's cwd grants visibility, not privilege).
        let dir = tempfile::tempdir_in(allowed.path()).unwrap();
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
        let o = s.eval(&id, sn.write_file).await;
        assert_eq!(status(&o), "ok", "{lang}: {}", o.text);
        s.call("session_close", json!({"session_id": id})).await;
        assert!(
            dir.path().join("made-here.txt").is_file(),
            "{lang}: cwd kept"
        );
        s.stop().await;
    }
);

per_lang!(
    shutdown_kills_every_session,
    [python, javascript, ruby, haskell, shellscript],
    |lang| {
        let s = Server::stdio().start().await;
        let o = s.call("session_start", json!({"language": lang})).await;
        assert!(o.structured["pid"].as_i64().is_some(), "{lang}: {}", o.text);
        let all = s.descendants();
        assert!(!all.is_empty());
        s.stop().await;
        let left = wait_gone(&all, Duration::from_secs(5)).await;
        assert!(left.is_empty(), "{lang}: left behind: {left:?}");
    }
);

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_are_clear_errors() {
    let s = Server::stdio().start().await;
    let o = s
        .call("session_eval", json!({"session_id": "nope", "code": "1"}))
        .await;
    assert_eq!(o.error_kind(), "unknown_session", "{}", o.text);
    assert!(o.text.contains("session_start"), "{}", o.text);
    let o = s.call("session_start", json!({"language": "cobol"})).await;
    assert_eq!(o.error_kind(), "unsupported_language", "{}", o.text);
    let o = s.call("session_start", json!({"language": "c"})).await;
    if o.error_kind() != "not_installed" {
        assert_eq!(o.error_kind(), "unsupported_language", "{}", o.text);
        assert!(o.text.contains("run-code"), "{}", o.text);
    }
    let o = s
        .call(
            "session_start",
            json!({"language": "python", "cwd": "/no/such/dir"}),
        )
        .await;
    assert_eq!(o.error_kind(), "invalid_argument", "{}", o.text);
    assert!(o.text.contains("/no/such/dir"), "{}", o.text);
    let o = s.call("session_close", json!({"session_id": "nope"})).await;
    assert!(o.is_error);
    let o = s.call("session_eval", json!({"session_id": "x"})).await;
    assert!(o.is_error, "missing code");
    let l = s.call("session_list", json!({})).await;
    assert_eq!(l.structured["sessions"], Value::Array(vec![]));
    s.stop().await;
}

/// A ghci cell of 1,000 lines (the bootstrap splits it once, then types it chunk by chunk):
/// every binding is made, in order, output comes in order, and the session goes on.
#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_line_ghci_cell() {
    if !require("haskell", "ghci") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("ghci").await;
    let mut code = String::new();
    let mut expected = String::new();
    // Line i binds x<i> to the number of lets so far, each from the previous one.
    let (mut last, mut lets) = ("0".to_string(), 0);
    for i in 0..1000 {
        if i % 250 == 249 {
            // An expression among the lets: its value shows where it stands.
            code.push_str(&format!("{last} * 2\n"));
            expected.push_str(&format!("{}\n", lets * 2));
        } else {
            code.push_str(&format!("let x{i} = {last} + 1 :: Int\n"));
            last = format!("x{i}");
            lets += 1;
        }
    }
    // A generous deadline: the machine may be shared; the answer is what is checked.
    let o = s.eval_t(&id, &code, 600_000).await;
    assert_eq!(
        (status(&o), output(&o)),
        ("ok", expected.as_str()),
        "{}",
        o.text
    );
    // 996 lets (four of the lines were expressions); line 248 was the 249th.
    assert_eq!(lets, 996);
    let o = s.eval(&id, "(x998, x248)").await;
    assert_eq!(
        (status(&o), output(&o)),
        ("ok", "(996,249)\n"),
        "{}",
        o.text
    );
    // A next cell is split afresh, not taken from the previous one's queue.
    let o = s.eval(&id, "let y = x998 + 4\ny").await;
    assert_eq!((status(&o), output(&o)), ("ok", "1000\n"), "{}", o.text);
    s.stop().await;
}

/// A Ruby traceback names a cell's own top level `<main>`, as irb does, also for a block in
/// it; a method keeps its name.
#[tokio::test(flavor = "multi_thread")]
async fn ruby_tracebacks_say_main_as_irb_does() {
    if !require("ruby", "ruby") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("ruby").await;
    let o = s.eval(&id, "def h = raise('boom')\nh").await;
    assert_eq!(status(&o), "error", "{}", o.text);
    let out = output(&o);
    let line = |prefix: &str| -> String {
        out.lines()
            .find(|l| l.contains(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in {out}"))
            .to_string()
    };
    assert!(line("<cell 1>:1:in ").contains("h'"), "{out}");
    let top = line("<cell 1>:2:in ");
    assert!(top.starts_with("\tfrom <cell 1>:2:in "), "{out}");
    assert!(top.ends_with("<main>'"), "{out}");
    assert!(!out.contains("top (required)"), "{out}");
    let o = s.eval(&id, "[1].each { raise 'again' }").await;
    let out = output(&o);
    assert!(
        out.lines()
            .any(|l| l.contains("<cell 2>:1:in ") && l.contains("block in <main>'")),
        "{out}"
    );
    assert!(!out.contains("top (required)"), "{out}");
    s.stop().await;
}
