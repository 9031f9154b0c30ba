//! Which interpreter a run or session uses, and why: what results and `replbox languages`
//! report.

use schemars::JsonSchema;
use serde::Serialize;

/// Why this interpreter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Why {
    /// The first of the language's programs on the server's PATH that the sandbox can run.
    Path,
    /// The operator's `--python`.
    PythonFlag,
    /// The caller's `venv` argument.
    Venv,
    /// A `.venv` directory in the session's `cwd`.
    CwdVenv,
}

impl Why {
    /// For text: why this interpreter, in a few words.
    pub fn describe(self) -> &'static str {
        match self {
            Why::Path => "first on the server's PATH",
            Why::PythonFlag => "the server's --python",
            Why::Venv => "the venv argument",
            Why::CwdVenv => ".venv in cwd",
        }
    }
}

/// The interpreter a run or session uses.
#[derive(Debug, Clone, Serialize, JsonSchema, PartialEq, Eq)]
pub struct InterpreterInfo {
    /// The executable started (for a virtual environment, its `bin/python`).
    pub path: String,
    /// Why this one: `path` (the server's default, first on its PATH), `python_flag` (the
    /// server's `--python`), `venv` (the `venv` argument), `cwd_venv` (`.venv` in `cwd`).
    pub why: Why,
    /// The virtual environment's directory, when one is used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub venv: Option<String>,
    /// Something to know about the choice (an interpreter earlier on PATH that the sandbox
    /// cannot run, a `.venv` that was not used).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl InterpreterInfo {
    /// One line for a result's text: `/x/venv/bin/python (the venv argument)`.
    pub fn line(&self) -> String {
        format!("{} ({})", self.path, self.why.describe())
    }
}
