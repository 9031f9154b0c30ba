//! Tool parameters. Unknown fields are rejected so a misspelt option is an error the agent
//! sees, not a silently ignored setting.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCodeParams {
    /// The program's source code.
    pub code: String,
    /// Language id or alias (python, javascript, shellscript, ruby, go, c, …).
    #[serde(rename = "languageId")]
    pub language_id: String,
    /// Deadline in milliseconds; the whole process tree is killed when it passes.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Text given to the program on standard input (default: none, stdin is empty).
    #[serde(default)]
    pub stdin: Option<String>,
    /// Command-line arguments for the program.
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment variables (the server's own environment is never passed on).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Python only: run with this virtual environment (absolute path of the directory made
    /// by `python3 -m venv`, holding pyvenv.cfg and bin/python), so its packages import.
    #[serde(default)]
    pub venv: Option<String>,
    /// Domains the code may reach through the server's HTTP(S) proxy for this call only
    /// (e.g. ["pypi.org", "files.pythonhosted.org"] for pip), when the server's operator
    /// lets callers ask for them; refused otherwise, with the reason.
    #[serde(default)]
    pub allow_domains: Vec<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionStartParams {
    /// Session language, by id or alias (the server's schema lists those installed on its
    /// host).
    pub language: String,
    /// Run in this existing directory instead of a fresh private one (it is kept at close).
    /// For python, a `.venv` directory in it is used as the virtual environment unless
    /// `venv` is given.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Python only: the virtual environment to run in (absolute path of the directory made
    /// by `python3 -m venv`, holding pyvenv.cfg and bin/python), so its packages import.
    #[serde(default)]
    pub venv: Option<String>,
    /// Extra environment variables for the interpreter.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Close the session after this many seconds without use (default 1800; at least 1, up
    /// to the server's maximum).
    #[serde(default)]
    pub idle_timeout_s: Option<u64>,
    /// Files to put into the session's directory before it starts, so data reaches the
    /// code without pasting it into an evaluation. Each entry copies a file of the server's
    /// machine (`path`; local clients only) or writes text (`content` with `name`). Nothing
    /// is overwritten. For a whole folder, pass it as `cwd` instead.
    #[serde(default)]
    pub files: Vec<SessionFile>,
    /// Domains the code may reach through the server's HTTP(S) proxy for this session
    /// (e.g. ["pypi.org", "files.pythonhosted.org"] for pip), when the server's operator
    /// lets callers ask for them; refused otherwise, with the reason.
    #[serde(default)]
    pub allow_domains: Vec<String>,
}

/// One file `session_start` brings in.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionFile {
    /// Absolute path of a file on the server's machine to copy in (allowed to the local
    /// client: stdio, or HTTP without tokens).
    #[serde(default)]
    pub path: Option<String>,
    /// Text to write into the file (instead of `path`).
    #[serde(default)]
    pub content: Option<String>,
    /// Where to put it, relative to the session's directory (e.g. "data/sales.csv").
    /// Default: the name of `path`. Required with `content`.
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionEvalParams {
    pub session_id: String,
    /// Code to evaluate; any length, any number of lines. The value of a trailing
    /// expression is shown as the REPL shows it.
    pub code: String,
    /// Deadline in milliseconds: the code is interrupted (Ctrl-C) and the session keeps its
    /// state.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionIdParams {
    pub session_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionInputParams {
    pub session_id: String,
    /// The answer typed to the program (Enter is added when missing, unless `enter` is
    /// false or the text ends with Ctrl-D; several lines answer several reads). Control keys
    /// are characters: Ctrl-C \u0003, Ctrl-D \u0004, Escape \u001b, arrows \u001b[A to
    /// \u001b[D, Backspace \u007f.
    pub text: String,
    /// Add Enter after the text when it does not end a line (default true). false types the
    /// text exactly as given: a single key for a program that reads keys.
    #[serde(default)]
    pub enter: Option<bool>,
    /// Deadline in milliseconds for the continued evaluation.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// What `session_export` writes.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExportFormat {
    /// A Jupyter notebook (nbformat 4): one code cell per evaluation, with its outputs.
    Ipynb,
    /// A source file of the language, cells separated by `# %%` (failed cells commented
    /// out).
    Script,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionExportParams {
    pub session_id: String,
    /// `ipynb` or `script`.
    pub format: ExportFormat,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionVarsParams {
    pub session_id: String,
    /// Deadline in milliseconds for listing them (default 10000).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}
