//! The flags of code mode (a leaf: `config` flattens them into the server's settings).

use std::ffi::OsString;
use std::path::PathBuf;

/// Code mode: MCP servers whose tools session and `run-code` code may call.
#[derive(clap::Args, Debug, Clone)]
pub struct Flags {
    /// MCP servers code may call (`from replbox import tools`): a JSON file in the
    /// `mcpServers` format MCP clients use, each server with `command`/`args`/`env`/`cwd`
    /// (stdio) or `url`/`headers` (streamable HTTP). See docs/code-mode.md.
    #[arg(long = "mcp-servers", env = "REPLBOX_MCP_SERVERS", value_name = "FILE")]
    pub servers: Option<PathBuf>,

    /// Which principals (token names) may call which servers and tools: a JSON file
    /// `{"PRINCIPAL": ["server", ...] | {"server": "*" | ["tool", ...]}}`, `*` for every
    /// token not named. Default: the local client every server, tokens none.
    #[arg(long = "mcp-grants", env = "REPLBOX_MCP_GRANTS", value_name = "FILE")]
    pub grants: Option<PathBuf>,

    /// Tool calls one evaluation (or one run) may make; past it a call fails with an error.
    #[arg(long = "mcp-max-calls", env = "REPLBOX_MCP_MAX_CALLS", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_calls: u32,

    /// Tool calls of one session (or run) in flight at once; more wait for a place.
    #[arg(long = "mcp-max-concurrent", env = "REPLBOX_MCP_MAX_CONCURRENT", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_concurrent: u32,

    /// Longest one tool call may take, in ms (never past the evaluation's own deadline).
    #[arg(long = "mcp-call-timeout-ms", env = "REPLBOX_MCP_CALL_TIMEOUT_MS",
          default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub call_timeout_ms: u64,

    /// Largest tool result handed to code, in bytes of JSON; a larger one is an error.
    #[arg(long = "mcp-max-result-bytes", env = "REPLBOX_MCP_MAX_RESULT_BYTES",
          default_value_t = 1024 * 1024)]
    pub max_result_bytes: usize,
}

impl Default for Flags {
    fn default() -> Self {
        Self {
            servers: None,
            grants: None,
            max_calls: 1000,
            max_concurrent: 8,
            call_timeout_ms: 60_000,
            max_result_bytes: 1024 * 1024,
        }
    }
}

impl Flags {
    /// The same flags on a command line (for `bench`, which starts `serve` with them).
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        if let Some(f) = &self.servers {
            args.push("--mcp-servers".into());
            args.push(f.into());
        }
        if let Some(f) = &self.grants {
            args.push("--mcp-grants".into());
            args.push(f.into());
        }
        for (flag, v) in [
            ("--mcp-max-calls", self.max_calls.to_string()),
            ("--mcp-max-concurrent", self.max_concurrent.to_string()),
            ("--mcp-call-timeout-ms", self.call_timeout_ms.to_string()),
            ("--mcp-max-result-bytes", self.max_result_bytes.to_string()),
        ] {
            args.push(flag.into());
            args.push(v.into());
        }
        args
    }
}
