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
}
