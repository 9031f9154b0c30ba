//! What the bench itself knows about each language it drives, in one table ([`LANGS`]): the
//! program it runs through `run-code` and how the same runs when spawned directly, the
//! evaluation it times in a session, and how to drive the language's own REPL by hand for
//! the raw round-trip floor (arguments, environment, prompt).
//!
//! Nothing else here is per language: which interpreter runs, its real executable and the
//! environment the server gives it come from the language files, as the server reads them.

/// One language the bench drives (every session language of the built-in set).
pub struct Lang {
    /// The language id, as `run-code` and `session_start` take it.
    pub id: &'static str,
    /// A program printing 2, for `run-code`.
    pub program: &'static str,
    /// The same program run by the interpreter spawned directly (in a directory holding
    /// `floor_file` when there is one).
    pub floor_args: &'static [&'static str],
    pub floor_file: Option<(&'static str, &'static str)>,
    /// A trivial evaluation for `session_eval`, and the text replbox returns for it.
    pub expr: &'static str,
    pub answer: &'static str,
    /// The language's own REPL, driven by hand behind a PTY.
    pub raw: RawReplSpec,
}

/// How to start a language's REPL by hand and recognise its answers.
pub struct RawReplSpec {
    /// Arguments of the session's program (the language's `session` executable).
    pub args: &'static [&'static str],
    /// Variables set on top of the environment the server gives the language's children.
    pub env: &'static [(&'static str, &'static str)],
    /// The REPL's prompt, which ends every answer.
    pub prompt: &'static str,
    /// What the REPL prints for [`Lang::expr`].
    pub answer: &'static str,
}

pub const LANGS: &[Lang] = &[
    Lang {
        id: "python",
        program: "print(1+1)",
        floor_args: &["-c", "print(1+1)"],
        floor_file: None,
        expr: "1+1",
        answer: "2\n",
        raw: RawReplSpec {
            args: &["-q", "-u", "-i"],
            env: &[
                ("PYTHON_BASIC_REPL", "1"),
                ("PYTHON_COLORS", "0"),
                ("NO_COLOR", "1"),
            ],
            prompt: ">>> ",
            answer: "2",
        },
    },
    Lang {
        id: "javascript",
        program: "console.log(1+1)",
        floor_args: &["-e", "console.log(1+1)"],
        floor_file: None,
        expr: "1+1",
        answer: "2\n",
        raw: RawReplSpec {
            args: &["-i"],
            env: &[
                ("NODE_NO_READLINE", "1"),
                ("NODE_REPL_HISTORY", ""),
                ("NO_COLOR", "1"),
            ],
            prompt: "> ",
            answer: "2",
        },
    },
    Lang {
        id: "ruby",
        program: "puts 1+1",
        floor_args: &["-e", "puts 1+1"],
        floor_file: None,
        expr: "1+1",
        answer: "=> 2\n",
        // irb reading the terminal line by line (no Reline), with its simple prompt.
        raw: RawReplSpec {
            args: &[
                "-e",
                "require 'irb'; IRB.start('irb')",
                "--",
                "-f",
                "--nomultiline",
                "--nosingleline",
                "--nocolorize",
                "--noautocomplete",
                "--prompt",
                "simple",
            ],
            env: &[("NO_COLOR", "1"), ("PAGER", "cat")],
            prompt: ">> ",
            answer: "=> 2",
        },
    },
    Lang {
        id: "haskell",
        program: "main = print (1+1)",
        floor_args: &["Main.hs"],
        floor_file: Some(("Main.hs", "main = print (1+1)\n")),
        expr: "1+1",
        answer: "2\n",
        // ghci's own prompt (`ghci> `) ends like this.
        raw: RawReplSpec {
            args: &["-ignore-dot-ghci", "-fno-ghci-history", "-v0"],
            env: &[("NO_COLOR", "1")],
            prompt: "> ",
            answer: "2",
        },
    },
    Lang {
        id: "shellscript",
        program: "echo $((1+1))",
        floor_args: &["-c", "echo $((1+1))"],
        floor_file: None,
        expr: "echo $((1+1))",
        answer: "2\n",
        raw: RawReplSpec {
            args: &["--noprofile", "--norc", "--noediting", "-i"],
            env: &[("PS1", "$ ")],
            prompt: "$ ",
            answer: "2",
        },
    },
];
