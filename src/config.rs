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
