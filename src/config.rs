//! Every limit and default in one place, from flags (and their environment variables).

use std::path::PathBuf;
use std::time::Duration;

use crate::sandbox::{Level, Mode};

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

    /// Isolation of user code: `auto` picks the strongest level that works here (probed at
    /// start), or name one; a named level that does not work stops the server.
    #[arg(long, env = "REPLBOX_SANDBOX", value_enum, default_value_t = Mode::Auto)]
    pub sandbox: Mode,

    /// Refuse to start when the level in force is below this one.
    #[arg(
        long,
        env = "REPLBOX_REQUIRE_SANDBOX",
        value_enum,
        value_name = "LEVEL"
    )]
    pub require_sandbox: Option<Level>,

    /// Let user code reach the network (off by default at every sandbox level).
    #[arg(long, env = "REPLBOX_ALLOW_NETWORK")]
    pub allow_network: bool,

    /// Memory per process of user code, in MiB (RLIMIT_DATA: heap and private mappings);
    /// 0 for no limit.
    #[arg(long, env = "REPLBOX_MEMORY_MB", default_value_t = 4096)]
    pub memory_mb: u64,

    /// Processes and threads per session or run (RLIMIT_NPROC of its own uid when the server
    /// runs as root; otherwise on top of what the server's uid already runs); 0 for no limit.
    #[arg(long, env = "REPLBOX_PROCESSES", default_value_t = 256)]
    pub processes: u64,

    /// Largest file user code may write, in MiB (RLIMIT_FSIZE); 0 for no limit.
    #[arg(long, env = "REPLBOX_FILE_SIZE_MB", default_value_t = 1024)]
    pub file_size_mb: u64,

    /// Open files per process (RLIMIT_NOFILE).
    #[arg(long, env = "REPLBOX_OPEN_FILES", default_value_t = 1024)]
    pub open_files: u64,

    /// CPU seconds per process of a `run-code` call (RLIMIT_CPU); 0 means the call's timeout.
    /// Sessions have none: CPU time is cumulative, and a session lives long.
    #[arg(long, env = "REPLBOX_CPU_S", default_value_t = 0)]
    pub cpu_s: u64,

    /// Size of the private /tmp and /dev/shm of each sandbox (bwrap level), in MiB.
    #[arg(long, env = "REPLBOX_TMPFS_MB", default_value_t = 256)]
    pub tmpfs_mb: u64,

    /// First uid (and gid) of the pool user code runs as when the server runs as root.
    #[arg(long, env = "REPLBOX_UID_BASE", default_value_t = 100_000)]
    pub uid_base: u32,

    /// Size of that pool: the most sessions and runs alive at once when running as root.
    #[arg(long, env = "REPLBOX_UIDS", default_value_t = 256)]
    pub uids: u32,

    /// More directories to hide from user code (besides /home, /root, /run, /tmp, /var/tmp,
    /// /mnt, /media and /srv); colon-separated in the variable.
    #[arg(
        long = "mask",
        env = "REPLBOX_MASK",
        value_name = "DIR",
        value_delimiter = ':'
    )]
    pub mask: Vec<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            prompts: None,
            default_timeout_ms: 30_000,
            max_timeout_ms: 600_000,
            output_cap: 64 * 1024,
            work_dir: None,
            sandbox: Mode::Auto,
            require_sandbox: None,
            allow_network: false,
            memory_mb: 4096,
            processes: 256,
            file_size_mb: 1024,
            open_files: 1024,
            cpu_s: 0,
            tmpfs_mb: 256,
            uid_base: 100_000,
            uids: 256,
            mask: Vec::new(),
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
