//! Every limit and default in one place, from flags (and their environment variables).

use std::ffi::OsString;
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

    /// Close a session after this many seconds without use (a session may ask for a
    /// different value with `idle_timeout_s`, up to --max-idle-timeout-s).
    #[arg(long, env = "REPLBOX_IDLE_TIMEOUT_S", default_value_t = 1800)]
    pub idle_timeout_s: u64,

    /// Largest `idle_timeout_s` a session may ask for.
    #[arg(long, env = "REPLBOX_MAX_IDLE_TIMEOUT_S", default_value_t = 86_400)]
    pub max_idle_timeout_s: u64,

    /// Most sessions open at once (all callers together).
    #[arg(long, env = "REPLBOX_MAX_SESSIONS", default_value_t = 32)]
    pub max_sessions: usize,

    /// At the session limit, close the idlest session to make room instead of refusing.
    #[arg(long, env = "REPLBOX_EVICT_IDLE")]
    pub evict_idle: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            prompts: None,
            default_timeout_ms: 30_000,
            max_timeout_ms: 600_000,
            output_cap: 64 * 1024,
            work_dir: None,
            idle_timeout_s: 1800,
            max_idle_timeout_s: 86_400,
            max_sessions: 32,
            evict_idle: false,
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

    /// The flags that give another replbox process this same configuration (`bench` starts
    /// `serve` with them, so the server it measures runs with the settings it was given).
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        if let Some(dir) = &self.prompts {
            args.push("--prompts".into());
            args.push(dir.into());
        }
        for (flag, value) in [
            ("--default-timeout-ms", self.default_timeout_ms.to_string()),
            ("--max-timeout-ms", self.max_timeout_ms.to_string()),
            ("--output-cap", self.output_cap.to_string()),
        ] {
            args.push(flag.into());
            args.push(value.into());
        }
        if let Some(dir) = &self.work_dir {
            args.push("--work-dir".into());
            args.push(dir.into());
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        config: Config,
    }

    #[test]
    fn to_args_round_trips() {
        // Every field set away from its default, so a flag to_args forgets shows up here.
        let config = Config {
            prompts: Some("/p/rompts".into()),
            default_timeout_ms: 1234,
            max_timeout_ms: 5678,
            output_cap: 99,
            work_dir: Some("/w/ork dir".into()),
        };
        let argv = std::iter::once(OsString::from("x")).chain(config.to_args());
        let parsed = Wrapper::try_parse_from(argv).expect("to_args output parses");
        assert_eq!(format!("{:?}", parsed.config), format!("{config:?}"));
        let defaults = Wrapper::try_parse_from(
            std::iter::once(OsString::from("x")).chain(Config::default().to_args()),
        )
        .expect("parses");
        assert_eq!(
            format!("{:?}", defaults.config),
            format!("{:?}", Config::default())
        );
    }
}

impl Config {
    /// The idle timeout for a session that asked for `requested` seconds.
    pub fn idle_timeout(&self, requested: Option<u64>) -> Duration {
        let s = requested
            .unwrap_or(self.idle_timeout_s)
            .clamp(1, self.max_idle_timeout_s.max(1));
        Duration::from_secs(s)
    }
}
