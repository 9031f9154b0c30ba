//! Tool parameters. Unknown fields are rejected so a misspelt option is an error the agent
//! sees, not a silently ignored setting.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCodeParams {
    pub code: String,
    /// Language id or alias (`language` is accepted too).
    #[serde(rename = "languageId", alias = "language")]
    pub language_id: String,
    /// Deadline in milliseconds; then the process tree is killed.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Standard input (default: empty).
    #[serde(default)]
    pub stdin: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// As in session_start.
    #[serde(default)]
    pub venv: Option<String>,
    /// As in session_start.
    #[serde(default)]
    pub allow_domains: Vec<String>,
    /// As in session_start.
    #[serde(default)]
    pub mcp_servers: Vec<String>,
    /// Retries with this key get the first call's result.
    #[serde(default, rename = "idempotency_key")]
    pub _idempotency_key: Option<String>,
    /// As in session_start.
    #[serde(default)]
    pub packages: Vec<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionStartParams {
    /// Session language, id or alias (see the description).
    pub language: String,
    /// An existing directory to run in (kept at close); for python its `.venv` is used
    /// unless `venv` is given.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Python only: a virtual environment's directory (absolute path).
    #[serde(default)]
    pub venv: Option<String>,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Seconds without use before the session is closed (default 1800).
    #[serde(default)]
    pub idle_timeout_s: Option<u64>,
    /// Files put into the directory first, never overwriting.
    #[serde(default)]
    pub files: Vec<SessionFile>,
    /// Domains the code may reach through the server's proxy (e.g. pypi.org), if allowed.
    #[serde(default)]
    pub allow_domains: Vec<String>,
    /// Configured MCP servers whose tools the code may call (`from replbox import tools`).
    #[serde(default)]
    pub mcp_servers: Vec<String>,
    /// Python: packages to install first, as pip takes them ("six", "polars==1.*").
    #[serde(default)]
    pub packages: Vec<String>,
}

// One file `session_start` brings in (a plain comment: the field says it).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionFile {
    /// Absolute path of a server file to copy (local clients only).
    #[serde(default)]
    pub path: Option<String>,
    /// Text to write (instead of `path`).
    #[serde(default)]
    pub content: Option<String>,
    /// Where, relative to the session's directory (default: `path`'s name).
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionEvalParams {
    pub session_id: String,
    /// Code to evaluate, any number of lines.
    pub code: String,
    /// Deadline in milliseconds: then the code is interrupted (Ctrl-C), state kept.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    // As in run-code (no description: tools/list is bounded).
    #[serde(default, rename = "idempotency_key")]
    pub _idempotency_key: Option<String>,
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
    /// The answer; several lines answer several reads. Keys as characters: Ctrl-C \u0003,
    /// Ctrl-D \u0004 (EOF), Esc \u001b, arrows \u001b[A..D, Tab \t, Enter \r.
    pub text: String,
    /// Add Enter unless the text ends a line or with Ctrl-D (default true); false types
    /// it exactly, e.g. a single key.
    #[serde(default)]
    pub enter: Option<bool>,
    /// Deadline in milliseconds for the continued evaluation.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    // As in run-code (no description: tools/list is bounded).
    #[serde(default, rename = "idempotency_key")]
    pub _idempotency_key: Option<String>,
}

// What `session_export` writes (the tool's description says what each holds; plain
// comments keep the schema a plain `enum`, without a description).
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExportFormat {
    // A Jupyter notebook (nbformat 4): one code cell per evaluation, with its outputs.
    Ipynb,
    // A source file of the language, cells separated by `# %%` (failed cells commented out).
    Script,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionExportParams {
    pub session_id: String,
    pub format: ExportFormat,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionVarsParams {
    pub session_id: String,
    /// Deadline in milliseconds (default 10000).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionInspectParams {
    pub session_id: String,
    /// e.g. df or m.coef_
    pub name: String,
    /// 200-8000, default 2000.
    #[serde(default)]
    pub budget_bytes: Option<u64>,
}
