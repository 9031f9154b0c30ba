//! Every limit and default in one place, from flags (and their environment variables).

use std::path::PathBuf;
use std::time::Duration;

/// Server settings shared by `serve`, `run` and `bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct Config {
    /// Directory of extra or overriding `<language>.toml` files.
    #[arg(long, env = "REPLBOX_PROMPTS", value_name = "DIR")]
    pub prompts: Option<PathBuf>,

    /// Timeout for `run-code` and `session_eval` when the caller gives none, in ms.
    #[arg(long, env = "REPLBOX_DEFAULT_TIMEOUT_MS", default_value_t = 30_000)]
    pub default_timeout_ms: u64,

    /// Largest `timeout_ms` a caller may ask for; larger values are clamped to it.
    #[arg(long, env = "REPLBOX_MAX_TIMEOUT_MS", default_value_t = 600_000)]
    pub max_timeout_ms: u64,

    /// Bytes of output kept per stream of a run, and per evaluation (head + tail).
    #[arg(long, env = "REPLBOX_OUTPUT_CAP", default_value_t = 64 * 1024)]
    pub output_cap: usize,

    /// Where private working directories are created (default: the system temp dir).
    #[arg(long, env = "REPLBOX_WORK_DIR", value_name = "DIR")]
    pub work_dir: Option<PathBuf>,

    /// Open REPL sessions one principal (an HTTP token, or the stdio client) may hold at
    /// once; 0 means no limit.
    #[arg(long, env = "REPLBOX_MAX_SESSIONS_PER_PRINCIPAL", default_value_t = 16)]
    pub max_sessions_per_principal: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            prompts: None,
            default_timeout_ms: 30_000,
            max_timeout_ms: 600_000,
            output_cap: 64 * 1024,
            work_dir: None,
            max_sessions_per_principal: 16,
        }
    }
}

impl Config {
    /// The timeout to use for a call that asked for `requested` ms (clamped, never zero).
    pub fn timeout(&self, requested: Option<u64>) -> Duration {
        let ms = requested
            .unwrap_or(self.default_timeout_ms)
            .clamp(1, self.max_timeout_ms.max(1));
        Duration::from_millis(ms)
    }
}

/// Settings of `serve` that only the streamable HTTP transport uses.
#[derive(clap::Args, Debug, Clone)]
pub struct HttpConfig {
    /// Serve MCP over streamable HTTP at `http://ADDR/mcp` instead of stdio (e.g.
    /// 127.0.0.1:8765; port 0 picks a free one, logged at start).
    #[arg(long = "http", env = "REPLBOX_HTTP", value_name = "ADDR")]
    pub addr: Option<String>,

    /// A bearer token clients must send (repeatable; each token is its own principal,
    /// named token-1, token-2, ... in order). REPLBOX_TOKENS takes a comma-separated list.
    /// Prefer the environment or --tokens-file: arguments are visible to other users.
    #[arg(
        long = "token",
        env = "REPLBOX_TOKENS",
        value_name = "TOKEN",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub tokens: Vec<String>,

    /// A file of tokens, one a line: `NAME:TOKEN` (NAME is the principal's name in logs)
    /// or just `TOKEN`; blank lines and lines starting with # are ignored.
    #[arg(long, env = "REPLBOX_TOKENS_FILE", value_name = "FILE")]
    pub tokens_file: Option<PathBuf>,

    /// A Host header value to accept, `host` or `host:port` (repeatable). Default: the
    /// loopback names (localhost, 127.0.0.1, ::1) and the bound IP; `*` accepts any.
    #[arg(
        long = "allowed-host",
        env = "REPLBOX_ALLOWED_HOSTS",
        value_name = "HOST",
        value_delimiter = ','
    )]
    pub allowed_hosts: Vec<String>,

    /// A browser Origin to accept, e.g. `https://app.example:443` or
    /// `http://localhost:*` (repeatable). Default: none, so a request carrying any
    /// Origin header (a browser page) is refused; requests without Origin pass.
    #[arg(
        long = "allowed-origin",
        env = "REPLBOX_ALLOWED_ORIGINS",
        value_name = "ORIGIN",
        value_delimiter = ','
    )]
    pub allowed_origins: Vec<String>,

    /// On SIGTERM, how long in-flight calls may run before they are cancelled, in ms.
    #[arg(long, env = "REPLBOX_DRAIN_TIMEOUT_MS", default_value_t = 10_000)]
    pub drain_timeout_ms: u64,

    /// An MCP HTTP session with no traffic for this long is dropped (its REPL sessions are
    /// not: they belong to the principal), in seconds. Never less than the longest
    /// evaluation (max_timeout_ms) plus a minute.
    #[arg(long, env = "REPLBOX_HTTP_SESSION_IDLE_S", default_value_t = 1800)]
    pub http_session_idle_s: u64,

    /// Largest request body accepted on /mcp, in bytes.
    #[arg(long, env = "REPLBOX_HTTP_MAX_BODY", default_value_t = 4 * 1024 * 1024)]
    pub http_max_body: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            addr: None,
            tokens: Vec::new(),
            tokens_file: None,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            drain_timeout_ms: 10_000,
            http_session_idle_s: 1800,
            http_max_body: 4 * 1024 * 1024,
        }
    }
}
