//! The shape of one `prompts/<language>/language.toml` file.
//!
//! A language is data: how to find its interpreter, how `run-code` runs a program of it, and
//! (for session languages) how its REPL is started, bootstrapped, typed to and split.
//! Source code (a bootstrap, the pool's loader) lives in files of the language's folder,
//! named with `{ file = "…" }`. Placeholders in command templates are expanded by
//! [`expand`]; those in source text by [`super::protocol`], which writes values as literals.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::protocol::{self, SessionValues, Value};

/// Source code kept in a file of the language's folder: `loader = { file = "pool_loader.py" }`.
/// `text` is filled in when the language is loaded.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "SourceField")]
pub struct Source {
    /// File name inside the language's folder (and, for a bootstrap, the name it is
    /// written under in the session's control directory).
    pub file: String,
    pub text: String,
}

/// What the TOML may hold where a [`Source`] goes: only the file form is accepted; source
/// inline in the TOML (how languages were written before they were folders) is refused
/// with the way to convert it.
#[derive(Deserialize)]
#[serde(untagged)]
enum SourceField {
    File {
        file: String,
    },
    /// Only recognised, to be refused with advice.
    Inline(#[allow(dead_code)] String),
}

/// Source inline in the TOML, refused with the way to convert it.
#[derive(Debug, thiserror::Error)]
#[error(
    "source inline in the TOML is no longer read: put it in a file of the language's folder \
     (`<id>/language.toml` beside it) and name that file, e.g. `bootstrap = {{ file = \
     \"bootstrap.py\" }}` (placeholders in it: docs/bootstrap-protocol.md)"
)]
pub struct InlineSource;

impl TryFrom<SourceField> for Source {
    type Error = InlineSource;
    fn try_from(f: SourceField) -> Result<Self, InlineSource> {
        match f {
            SourceField::File { file } => Ok(Source {
                file,
                text: String::new(),
            }),
            SourceField::Inline(_) => Err(InlineSource),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LangSpec {
    /// Canonical id, as `run-code`'s `languageId` and `session_start`'s `language` take it.
    pub id: String,
    /// Human name for tables.
    pub name: String,
    #[serde(default)]
    pub aliases: Vec<String>,
    /// Candidate executables; the first found on PATH is the language's `{exe}`.
    pub programs: Vec<String>,
    /// How to read the installed version.
    #[serde(default)]
    pub version: Option<VersionSpec>,
    /// Optional: ask the program for the real executable (resolves shims and proxies such as
    /// pyenv or rustup, which misbehave or are slow in the clean environment children get).
    #[serde(default)]
    pub resolve: Option<ResolveSpec>,
    /// Environment for every child of this language (run and session). Values may use
    /// `{cache}` (a per-language cache directory that lives as long as the server).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Executables that must also be on PATH for the language to count as installed
    /// (for example the linker a compiler needs).
    #[serde(default)]
    pub requires: Vec<String>,
    /// The language takes Python virtual environments: `venv` of `run-code` and
    /// `session_start`, and a `.venv` in a session's `cwd` (a directory with `pyvenv.cfg`
    /// whose `bin/python` replaces `{exe}`).
    #[serde(default)]
    pub venv: bool,
    /// Host paths its programs read besides their own installation and the system the
    /// sandbox shows (`/usr`, parts of `/etc`): shown read-only to its runs and sessions at
    /// levels bwrap and landlock where they exist. Absolute; the last component may end in
    /// `*` for every entry it begins (`/etc/java-*`).
    #[serde(default)]
    pub reads: Vec<String>,
    pub run: RunSpec,
    #[serde(default)]
    pub session: Option<SessionSpec>,
    /// What a notebook of this language says about it (`session_export`): the Jupyter
    /// kernel people run it with and the `language_info` of nbformat.
    #[serde(default)]
    pub notebook: Option<NotebookSpec>,
}

/// The Jupyter facts of a language: its usual kernel and how its source files look.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotebookSpec {
    /// The kernel's name (`kernelspec.name`): python3, javascript, ruby, haskell, bash, ir.
    pub kernel: String,
    /// `kernelspec.display_name`.
    pub display_name: String,
    /// `kernelspec.language` and `language_info.name`.
    pub language: String,
    /// Extension of a source file, with its dot (`.py`); also the script export's.
    pub file_extension: String,
    #[serde(default)]
    pub mimetype: Option<String>,
    #[serde(default)]
    pub pygments_lexer: Option<String>,
    #[serde(default)]
    pub codemirror_mode: Option<String>,
    /// What starts a line comment (`#`, `//`, `--`): the script export's cell separators
    /// (`# %%`) and the commented-out cells that failed.
    pub comment: String,
    /// Code an export runs before the session's cells (a notebook's first cell, tagged
    /// `replbox-setup`; a script's first part) so that they run again as they ran in the
    /// session: the answers typed at its prompts, which `{answers:json}` is replaced by (a
    /// string literal of the language), and its display settings.
    #[serde(default)]
    pub setup: Option<Source>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VersionSpec {
    /// Arguments to `{exe}`; stdout and stderr are both searched.
    pub args: Vec<String>,
    /// First capture group is the version.
    pub regex: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolveSpec {
    pub args: Vec<String>,
    /// Turns the program's first output line into a path; `{out}` is that line.
    #[serde(default = "default_resolve_template")]
    pub path: String,
}

fn default_resolve_template() -> String {
    "{out}".to_string()
}

/// How `run-code` runs one program.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSpec {
    /// File name the code is written to, inside the run's private directory.
    pub file: String,
    /// Optional compile step, run in the same directory; its failure is a compile error.
    #[serde(default)]
    pub compile: Option<Vec<String>>,
    /// For a language that compiles and runs in one step (`java Main.java`): the last line
    /// of stderr when it could not compile. A run that fails with it is a compile error.
    #[serde(default)]
    pub compile_failure: Option<String>,
    /// The program's command line. `{args}` as a whole element expands to the caller's args.
    pub command: Vec<String>,
    /// Write the program with CRLF and lone CR line endings made LF, as sessions type code:
    /// for an interpreter that reads a carriage return as part of the line (bash would run
    /// `echo a\r`). Off where CR may be meaningful to the program as written.
    #[serde(default)]
    pub unix_newlines: bool,
    /// Extra environment for the run.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Optional warm pool: interpreters started ahead of time that each run one program
    /// exactly as `command` would (see `pool::request` for what the loader reads).
    #[serde(default)]
    pub pool: Option<PoolSpec>,
}

/// How to start a pooled interpreter for `run-code`. It is started in its own private
/// directory with the environment of a run (without the caller's variables), runs
/// `loader`, reads one request on stdin, and must then behave exactly as a cold
/// `run.command` of the same program would: same arguments, globals, stdin, environment,
/// exit status and error output.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSpec {
    /// Command line; the same placeholders as `run.command` (not `{args}`), plus
    /// `{loader}`, the loader's source, or `{loader_file}`, the absolute path of a copy of
    /// it written into the interpreter's directory as `.replbox-pool.EXT` (EXT being the
    /// loader's), for interpreters that take code only from files (`node -r FILE`). The
    /// loader must remove that copy before it reads its request, so the program never sees
    /// it.
    pub command: Vec<String>,
    /// The loader's source file, passed whole as `{loader}` (or as `{loader_file}`).
    pub loader: Source,
    /// Caller variables that change how the interpreter starts (read before the loader
    /// runs): a run that sets one starts cold. A trailing `*` matches a prefix. Variables
    /// every interpreter reads at start (LD_*, LC_*, LANG, TZ, HOME, PATH, ...) are always
    /// cold.
    #[serde(default)]
    pub cold_env: Vec<String>,
    /// The loader sets the run's CPU limit from its request (the interpreter starts with the
    /// largest a run can have). When false (an interpreter that cannot: node), it starts with
    /// the limit of a run with the default timeout, and only runs with that limit are pooled.
    #[serde(default = "yes")]
    pub sets_cpu_limit: bool,
}

fn yes() -> bool {
    true
}

/// How a persistent REPL of this language is driven behind a PTY.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSpec {
    /// Command line. `{bootstrap}` is the path of the written bootstrap file; `{exe}` is the
    /// language's executable, or the session program when `programs` is given.
    pub command: Vec<String>,
    /// Optional: the REPL is another program than the language's own (`ghci` for a language
    /// whose `run` uses `runghc`). The first of these found next to the language's
    /// executable (the same installation), else on PATH, is the session's `{exe}`; without
    /// one the language still runs code but cannot hold a session. Empty: the language's
    /// own `{exe}`.
    #[serde(default)]
    pub programs: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The bootstrap's source file, written under the same name into the session's control
    /// directory. Its placeholders (see [`protocol::SESSION_VARS`]) are written as literals
    /// of the language: `{ctl:json}`, `{nonce:shell}`, `{max_images}`.
    pub bootstrap: Source,
    /// Optional: the bootstrap's logic as a module the server compiles once to object code
    /// (ghc only; see docs/bootstrap-protocol.md, "Compiled bootstrap modules"). When it is
    /// built, sessions run [`Compiled::bootstrap`] instead, and `{compiled_args}` in the
    /// command stands for the arguments that load the module; otherwise for nothing.
    #[serde(default)]
    pub compiled: Option<Compiled>,
    /// Before languages were folders: the bootstrap's name in the control directory. Only
    /// read to say how to convert such a file.
    #[serde(default)]
    pub bootstrap_file: Option<toml::Value>,
    /// Lines typed once after start, before the first evaluation (each gets a newline);
    /// the bootstrap's placeholders.
    #[serde(default)]
    pub init: Vec<String>,
    /// The prompt the bootstrap installs; must contain `{nonce}`. Removed from output.
    pub prompt: String,
    /// Continuation prompt, if the REPL has one; must contain `{nonce}`. Seeing it means
    /// the typed line was incomplete.
    #[serde(default)]
    pub continuation: Option<String>,
    /// File the code of evaluation `{n}` is written to, in the control directory.
    pub cell_file: String,
    /// Optional transformation of the code before it is written (`{code}` is the code).
    /// Used by REPLs whose loader wants a wrapper around the code.
    #[serde(default)]
    pub cell_template: Option<String>,
    /// The one short line typed per evaluation. Placeholders: `{n}`, `{cell:FORMAT}` (the
    /// cell file's path as a literal).
    pub eval: String,
    /// Bytes written to interrupt (default Ctrl-C). Just before they are written, the empty
    /// file `interrupted-N` is created in the control directory (N: the evaluation's
    /// number), for bootstraps whose REPL would otherwise go on with queued input.
    #[serde(default = "default_interrupt")]
    pub interrupt: String,
    /// Fallback when the end marker carries no status (`?`): output matching this regex
    /// is an error. The first capture group, if any, is the error type.
    #[serde(default)]
    pub error_pattern: Option<String>,
    /// Milliseconds to wait for the REPL to come back after an interrupt before it is
    /// killed and restarted.
    #[serde(default = "default_interrupt_grace_ms")]
    pub interrupt_grace_ms: u64,
    /// Whether an interrupt the REPL has not answered is sent again every second within
    /// `interrupt_grace_ms` (default true), for REPLs that can drop one that lands in their
    /// own code. A bootstrap that defers interrupts to the user's code says false: the one
    /// interrupt reaches the code, and a handler of the code's own runs once per interrupt.
    #[serde(default = "default_true")]
    pub repeat_interrupt: bool,
    /// Milliseconds the REPL may take to start and answer its first (empty) evaluation.
    #[serde(default = "default_start_timeout_ms")]
    pub start_timeout_ms: u64,
    /// Which process states under /proc mean "blocked reading the terminal" for this REPL:
    /// `read` (read(2) on the terminal), `poll` and `select` (the terminal in the descriptor
    /// set), `epoll` (the terminal registered for input), `raw` (the terminal switched out of
    /// canonical mode, as line editors do while they read). Default: all of them.
    #[serde(default = "default_input_wait")]
    pub input_wait: Vec<InputWait>,
    /// The bootstrap writes `ESC _ rbx;{nonce};s;N ESC \` when it starts running cell N.
    /// Waiting for input is then only judged after it (before it, the REPL itself is
    /// reading the eval line).
    #[serde(default)]
    pub announces_start: bool,
    /// `session_vars`: the code of an internal evaluation that lists the names the user
    /// defined. The bootstrap answers in the end marker's payload (`vars`), or, with
    /// `vars_pattern`, in its output, one match per name.
    #[serde(default)]
    pub vars: Option<String>,
    /// A regex over that evaluation's output with the groups `name`, `type` and, optionally,
    /// `value` and `size`, for REPLs that can only print their bindings (ghci).
    #[serde(default)]
    pub vars_pattern: Option<String>,
    /// `session_inspect`: the code of an internal evaluation that looks at `{name}` (the
    /// hex of its UTF-8, so no name changes the code) within `{budget}` bytes; the bootstrap
    /// answers in the end marker's payload (`inspect`).
    #[serde(default)]
    pub inspect: Option<String>,
    /// Warm sessions (`--preload`): the code of an internal evaluation that imports
    /// `{modules}` (a JSON array of module names) before any user code, defining no name;
    /// it prints `replbox-preload-failed: NAME...` for those that did not import.
    #[serde(default)]
    pub preload: Option<String>,
}

/// A bootstrap module compiled once by the server (`[session.compiled]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Compiled {
    /// The module's source (a Haskell module named as the file's stem). Not a template:
    /// one build serves every session.
    pub module: Source,
    /// The bootstrap sessions run when the module is built, written under the name of
    /// [`SessionSpec::bootstrap`]'s file; the same placeholders.
    pub bootstrap: Source,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InputWait {
    Read,
    Poll,
    Select,
    Epoll,
    Raw,
}

fn default_input_wait() -> Vec<InputWait> {
    vec![
        InputWait::Read,
        InputWait::Poll,
        InputWait::Select,
        InputWait::Epoll,
        InputWait::Raw,
    ]
}

impl SessionSpec {
    /// The prompt of a session with this nonce.
    pub fn prompt_for(&self, nonce: &str) -> String {
        expand(&self.prompt, &[("nonce", nonce)])
    }

    /// The continuation prompt of a session with this nonce, if the REPL has one.
    pub fn continuation_for(&self, nonce: &str) -> Option<String> {
        self.continuation
            .as_deref()
            .map(|c| expand(c, &[("nonce", nonce)]))
    }

    /// The name of evaluation `n`'s cell file in the control directory.
    pub fn cell_name(&self, n: u64) -> String {
        expand(&self.cell_file, &[("n", &n.to_string())])
    }

    /// The values of a session's source placeholders.
    pub fn values(
        &self,
        nonce: &str,
        ctl: &Path,
        work: &Path,
        out: &Path,
        cwd: &Path,
        max_images: u64,
    ) -> SessionValues {
        let s = |p: &Path| p.display().to_string();
        SessionValues {
            nonce: nonce.to_string(),
            prompt: self.prompt_for(nonce),
            continuation: self.continuation_for(nonce).unwrap_or_default(),
            ctl: s(ctl),
            work: s(work),
            out: s(out),
            cwd: s(cwd),
            cell_file: self.cell_file.clone(),
            max_images,
        }
    }

    /// The line typed to run evaluation `n`, whose code is in `cell`.
    pub fn eval_line(&self, n: u64, cell: &Path) -> String {
        let cell = cell.display().to_string();
        protocol::expand_source(
            &self.eval,
            &[("n", Value::Number(n)), ("cell", Value::Text(&cell))],
        )
    }
}

fn default_interrupt() -> String {
    "\u{3}".to_string()
}
/// Long enough for a loaded machine: only an interpreter that is really stuck waits it out.
fn default_interrupt_grace_ms() -> u64 {
    5000
}
fn default_true() -> bool {
    true
}
fn default_start_timeout_ms() -> u64 {
    30_000
}

/// Expand `{name}` placeholders from `vars`. Unknown placeholders are left as they are, so
/// languages whose syntax uses braces (`{}` in C, `${x}` in shell) need no escaping.
pub fn expand(template: &str, vars: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len() + 32);
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let matched = after.find('}').and_then(|end| {
            let key = &after[..end];
            vars.iter().find(|(k, _)| *k == key).map(|(_, v)| (end, *v))
        });
        match matched {
            Some((end, value)) => {
                out.push_str(value);
                rest = &after[end + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Expand a command template; an element that is exactly `{args}` becomes the caller's args.
pub fn expand_command(template: &[String], vars: &[(&str, &str)], args: &[String]) -> Vec<String> {
    expand_command_lists(template, vars, &[("args", args)])
}

/// [`expand_command`] with any list placeholders: an element that is exactly `{NAME}` for
/// one of `lists` becomes that list's elements (none for an empty list).
pub fn expand_command_lists(
    template: &[String],
    vars: &[(&str, &str)],
    lists: &[(&str, &[String])],
) -> Vec<String> {
    let mut out = Vec::with_capacity(template.len());
    for part in template {
        let list = part
            .strip_prefix('{')
            .and_then(|p| p.strip_suffix('}'))
            .and_then(|name| lists.iter().find(|(n, _)| *n == name));
        match list {
            Some((_, items)) => out.extend(items.iter().cloned()),
            None => out.push(expand(part, vars)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expand_known_and_unknown() {
        let v = [("exe", "/usr/bin/python3"), ("file", "main.py")];
        assert_eq!(expand("{exe} -u {file}", &v), "/usr/bin/python3 -u main.py");
        assert_eq!(
            expand("int main(){ return 0; }", &v),
            "int main(){ return 0; }"
        );
        assert_eq!(
            expand("${x} {nope} {exe}", &v),
            "${x} {nope} /usr/bin/python3"
        );
        assert_eq!(expand("{", &v), "{");
        assert_eq!(expand("}{exe", &v), "}{exe");
    }

    #[test]
    fn expand_args_element() {
        let t: Vec<String> = ["{exe}", "{file}", "{args}"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let out = expand_command(
            &t,
            &[("exe", "x"), ("file", "f")],
            &["a b".into(), "c".into()],
        );
        assert_eq!(out, vec!["x", "f", "a b", "c"]);
    }
}
