//! Session output is what a terminal would have shown, with its scrollback: clearing the
//! screen (`ESC[2J`), erasing the scrollback (`ESC[3J`) or resetting the terminal (`ESC c`)
//! inside a cell does not hide what the cell printed before, while progress bars (`\r`,
//! several lines redrawn with cursor-up) still collapse to their final state. In every
//! session language that can print escape sequences. `run-code` returns program output as
//! it was written.

use crate::common;

use common::*;

const ESC: char = '\u{1b}';

/// How each language writes a string as it is (no newline added): the code for it.
struct Lang {
    language: &'static str,
    write: fn(&str) -> String,
}

/// `s` with ESC, newline and carriage return spelled as `esc`, `\n` and `\r` (quotes are
/// not expected in `s`).
fn spell(s: &str, esc: &str) -> String {
    s.replace(ESC, esc)
        .replace('\n', "\\n")
        .replace('\r', "\\r")
}

impl Row for Lang {
    fn language(&self) -> &str {
        self.language
    }
}

const LANGS: &[Lang] = &[
    Lang {
        language: "python",
        write: |s| format!("print('{}', end='')", spell(s, "\\x1b")),
    },
    Lang {
        language: "javascript",
        // `void`: the REPL would print write's `true`.
        write: |s| format!("void process.stdout.write('{}');", spell(s, "\\x1b")),
    },
    Lang {
        language: "ruby",
        write: |s| format!("print \"{}\"", spell(s, "\\e")),
    },
    Lang {
        language: "shellscript",
        write: |s| format!("printf '{}'", spell(s, "\\033").replace('%', "%%")),
    },
    Lang {
        language: "haskell",
        write: |s| format!("putStr \"{}\"", spell(s, "\\ESC")),
    },
];

/// A cell that writes each part in turn, as separate statements.
fn cell(lang: &Lang, parts: &[&str]) -> String {
    parts
        .iter()
        .map(|p| (lang.write)(p))
        .collect::<Vec<_>>()
        .join("\n")
}

per_row!(
    clearing_the_screen_keeps_what_the_cell_printed,
    LANGS,
    [python, javascript, ruby, haskell, shellscript],
    |lang| {
        let s = Server::stdio().start().await;
        let id = s.start_session(lang.language).await;
        for clear in ["\x1b[2J\x1b[H", "\x1b[H\x1b[2J\x1b[3J", "\x1b[3J", "\x1bc"] {
            let code = cell(lang, &["before\n", clear, "after\n"]);
            let o = s.eval(&id, &code).await;
            assert_eq!(
                (status(&o), output(&o)),
                ("ok", "before\nafter\n"),
                "{}: {clear:?}: {}",
                lang.language,
                o.text
            );
        }
        // A redraw loop: each picture it cleared away is kept, in order.
        let frames: Vec<String> = (1..=3)
            .map(|i| format!("\x1b[H\x1b[2Jframe {i}\n"))
            .collect();
        let parts: Vec<&str> = frames.iter().map(String::as_str).collect();
        let o = s.eval(&id, &cell(lang, &parts)).await;
        assert_eq!(
            output(&o),
            "frame 1\nframe 2\nframe 3\n",
            "{}: {}",
            lang.language,
            o.text
        );
        // Cursor home overwrites the screen, not what scrolled off it (the screen is the
        // session terminal's 50 rows).
        let lines: String = (0..60).map(|i| format!("line {i}\n")).collect();
        let o = s.eval(&id, &cell(lang, &[&lines, "\x1b[HX"])).await;
        let out = output(&o);
        let got: Vec<&str> = out.lines().collect();
        assert_eq!(got.len(), 60, "{}: {out}", lang.language);
        assert_eq!(
            (got[0], got[10], got[11], got[59]),
            ("line 0", "line 10", "Xine 11", "line 59"),
            "{}: {out}",
            lang.language
        );
        s.stop().await;
    }
);

per_row!(
    progress_bars_still_collapse,
    LANGS,
    [python, javascript, ruby, haskell, shellscript],
    |lang| {
        let s = Server::stdio().start().await;
        let id = s.start_session(lang.language).await;
        // Two bars redrawn in place: cursor up two rows, erase below, draw again.
        let mut parts = vec!["a 0%\nb 0%\n".to_string()];
        for p in [30, 60, 100] {
            parts.push(format!("\x1b[2A\x1b[Ja {p}%\nb {p}%\n"));
        }
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        let o = s.eval(&id, &cell(lang, &parts)).await;
        assert_eq!(
            (status(&o), output(&o)),
            ("ok", "a 100%\nb 100%\n"),
            "{}: {}",
            lang.language,
            o.text
        );
        // One bar redrawn with a carriage return and erase-line, in colour.
        let o = s
            .eval(
                &id,
                &cell(
                    lang,
                    &[
                        "\r\x1b[K\x1b[32m10%\x1b[0m",
                        "\r\x1b[K\x1b[32m55%\x1b[0m",
                        "\r\x1b[Kdone\n",
                    ],
                ),
            )
            .await;
        assert_eq!(output(&o), "done\n", "{}: {}", lang.language, o.text);
        s.stop().await;
    }
);

/// `run-code`'s stdout and stderr are program output (a pipe, not a terminal), returned as
/// the program wrote them, as mcp-server-code-runner returns them: escape sequences and
/// carriage returns included, and the text content is exactly stdout on success.
#[tokio::test(flavor = "multi_thread")]
async fn run_code_returns_output_as_written() {
    if !require("python", "python3") {
        return;
    }
    let s = Server::stdio().start().await;
    let o = s
        .run(
            "python",
            "import sys\nprint('\\x1b[31mred\\x1b[0m\\r\\n10%\\r100%')\nsys.stderr.write('\\x1b[2Jerr\\n')",
        )
        .await;
    assert_eq!(o.s("stdout"), "\x1b[31mred\x1b[0m\r\n10%\r100%\n");
    assert_eq!(o.s("stderr"), "\x1b[2Jerr\n");
    let o = s.run("python", "print('a\\rb\\x1b[1m')").await;
    assert_eq!(o.text, "a\rb\x1b[1m\n");
    s.stop().await;
}
