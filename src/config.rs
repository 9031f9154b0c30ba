//! Every limit and default in one place, from flags (and their environment variables).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

// A switch's variable (REPLBOX_EVICT_IDLE=1) takes what an operator writes: 1/0, yes/no,
// on/off as well as true/false (clap's own parser for a bool takes only true/false).
use clap::builder::BoolishValueParser;

use crate::egress::Policy;
use crate::sandbox::level::{Level, Mode};
use crate::sandbox::{Limits, Settings};

/// Server settings shared by `serve`, `run` and `bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct Config {
    /// Directory of extra or overriding `<language>.toml` files.
    #[arg(long, env = "REPLBOX_PROMPTS", value_name = "DIR")]
    pub prompts: Option<PathBuf>,

    /// The Python that runs python code and sessions (for example a virtual environment's
    /// `bin/python`), instead of the first `python3` on PATH. The server refuses to start
    /// when the sandbox level cannot run it.
    #[arg(long, env = "REPLBOX_PYTHON", value_name = "PATH")]
    pub python: Option<PathBuf>,

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

    /// Ended sessions the server remembers, so that a call on one says how it ended rather
    /// than "no session"; past this the oldest is forgotten first (a small record each).
    #[arg(long, env = "REPLBOX_MAX_ENDED_SESSIONS", default_value_t = 4096)]
    pub max_ended_sessions: usize,

    /// At the session limit, close the idlest session to make room instead of refusing.
    #[arg(long, env = "REPLBOX_EVICT_IDLE", value_parser = BoolishValueParser::new())]
    pub evict_idle: bool,

    /// Open REPL sessions one principal (an HTTP token, or the stdio client) may hold at
    /// once; 0 means no limit.
    #[arg(long, env = "REPLBOX_MAX_SESSIONS_PER_PRINCIPAL", default_value_t = 16)]
    pub max_sessions_per_principal: usize,

    /// Sessions (open or starting) and `run-code` calls (running) one principal may hold at
    /// once, together: each holds a sandbox uid, so no principal takes them all; 0 means no
    /// limit.
    #[arg(long, env = "REPLBOX_MAX_ACTIVE_PER_PRINCIPAL", default_value_t = 32)]
    pub max_active_per_principal: usize,

    /// The most interpreters kept started ahead of time for `run-code`, per language that
    /// has a warm pool (python, javascript, ruby, bash); each runs one program. A pool starts
    /// at 2, doubles up to this when runs empty it, and halves down to 1 for every minute
    /// without a run. 0 disables the pools.
    #[arg(long, env = "REPLBOX_POOL", default_value_t = 8)]
    pub pool: usize,
    /// The most warm sessions kept started ahead of time per session language, each given
    /// whole to one `session_start` that needs nothing a pooled one lacks. Python's starts
    /// at 1, the others' at 0 until a session of theirs is asked for; they follow demand
    /// like `--pool`'s. 0 disables them.
    #[arg(long, env = "REPLBOX_SESSION_POOL", default_value_t = 4)]
    pub session_pool: usize,
    /// Python modules a warm Python session imports ahead of time (into `sys.modules` only),
    /// comma-separated; `matplotlib` brings `matplotlib.pyplot` too. Default: pandas, numpy
    /// and matplotlib, those that import. Empty: none.
    #[arg(long, env = "REPLBOX_PRELOAD", value_name = "MODULES")]
    pub preload: Option<String>,
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

    /// Let user code reach any public host through the egress proxy (HTTP(S) only; never
    /// the host's loopback, link-local or private ranges). Off by default.
    #[arg(long, env = "REPLBOX_ALLOW_NETWORK", value_parser = BoolishValueParser::new())]
    pub allow_network: bool,

    /// A domain user code may reach through the egress proxy (`*.example.org`: the names
    /// beneath); repeatable, comma-separated. Never at a loopback or private address.
    #[arg(
        long = "allow-domain",
        env = "REPLBOX_ALLOW_DOMAINS",
        value_name = "DOMAIN",
        value_delimiter = ','
    )]
    pub allow_domain: Vec<String>,

    /// A host and port reached through the egress proxy whatever it resolves to (an
    /// internal index); repeatable, comma-separated.
    #[arg(
        long = "allow-host",
        env = "REPLBOX_ALLOW_HOSTS",
        value_name = "HOST:PORT",
        value_delimiter = ','
    )]
    pub allow_host: Vec<String>,

    /// Domains a caller may add for its session or run (`allow_domains`; refused without
    /// this flag); `*.example.org` covers the names beneath. Repeatable, comma-separated.
    #[arg(
        long = "caller-domains",
        env = "REPLBOX_CALLER_DOMAINS",
        value_name = "DOMAIN",
        value_delimiter = ','
    )]
    pub caller_domains: Vec<String>,

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

    /// CPU seconds per process of a `run-code` call (RLIMIT_CPU); 0 means the call's timeout
    /// plus a second. Sessions have none: CPU time is cumulative, and a session lives long.
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

    /// A host tree (or file) user code may read, read-only, besides what the sandbox shows
    /// of the host (the system, each language's installation, the session's own
    /// directories); repeatable, colon-separated in the variable. At levels bwrap and
    /// landlock nothing else of the host is visible.
    #[arg(
        long = "expose",
        env = "REPLBOX_EXPOSE",
        value_name = "PATH",
        value_delimiter = ':'
    )]
    pub expose: Vec<PathBuf>,

    /// A tree a caller's host paths (a session's `cwd`, a `venv`, a file to copy in with
    /// `files[].path`) may lie in although the sandbox masks it (say, a projects folder under
    /// /home); repeatable, colon-separated in the variable. The session's user must still be
    /// able to reach it.
    #[arg(
        long = "allow-cwd",
        env = "REPLBOX_ALLOW_CWD",
        value_name = "DIR",
        value_delimiter = ':'
    )]
    pub allow_cwd: Vec<PathBuf>,

    /// Figures returned as images by one evaluation (1 to 100); more are left out and the
    /// result says how many.
    #[arg(long, env = "REPLBOX_MAX_IMAGES", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub max_images: u32,

    /// Largest image returned, in bytes of PNG; a larger figure is left out and the result
    /// says so.
    #[arg(long, env = "REPLBOX_MAX_IMAGE_BYTES", default_value_t = 1024 * 1024)]
    pub max_image_bytes: u64,

    /// Entries (files and directories) of a session's directory looked at to find the files
    /// an evaluation created or changed; past this, change tracking is turned off for that
    /// session and resources/list stops there.
    #[arg(long, env = "REPLBOX_MAX_TRACKED_FILES", default_value_t = 5000)]
    pub max_tracked_files: usize,

    /// Largest session file `resources/read` returns, in bytes.
    #[arg(long, env = "REPLBOX_MAX_RESOURCE_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_resource_bytes: u64,

    /// Longest line (one JSON-RPC message) read on stdin, in bytes; a longer one is answered
    /// with an error and skipped.
    #[arg(long, env = "REPLBOX_MAX_LINE_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_line_bytes: usize,
    /// Cells a session's history keeps (session_history, session_export): the newest.
    #[arg(long, env = "REPLBOX_HISTORY_CELLS", default_value_t = 1000)]
    pub history_cells: usize,

    /// MiB of code, output and figures a session's history keeps: the newest cells.
    #[arg(long, env = "REPLBOX_HISTORY_MB", default_value_t = 16)]
    pub history_mb: u64,

    /// MiB of output a session keeps whole, as resources its results link to, for
    /// evaluations whose output is longer than --output-cap: the newest (one evaluation's
    /// longer than this: its head and tail); 0 keeps none.
    #[arg(long, env = "REPLBOX_WHOLE_OUTPUT_MB", default_value_t = 8)]
    pub whole_output_mb: u64,

    /// Seconds an ended session's files (read-only, as resources) and history are kept
    /// after it ends; 0 removes them at once. A caller's `cwd` is never removed.
    #[arg(long, env = "REPLBOX_KEEP_FILES_S", default_value_t = 600)]
    pub keep_files_s: u64,

    /// Journal sessions here so they survive a restart of the server: each session's start
    /// request and the code of its cells (a directory of the server's own, mode 0700; off
    /// when not given, and nothing is written).
    #[arg(long, env = "REPLBOX_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Largest journal of one session, in MiB: cells past it are not journaled (and not
    /// replayed by a restore, which says so).
    #[arg(long, env = "REPLBOX_JOURNAL_MAX_MB", default_value_t = 16)]
    pub journal_max_mb: u64,

    /// Seconds the journal of a session that ended without session_close (reaped, exited,
    /// evicted, or suspended by a stop of the server) is kept, restorable.
    #[arg(long, env = "REPLBOX_KEEP_JOURNALS_S", default_value_t = 7 * 86_400)]
    pub keep_journals_s: u64,

    /// Seconds the result of a tool call run as an MCP task is kept after it ended, for
    /// `tasks/get` from any connection of its caller (and for a retry with the same
    /// `idempotency_key`).
    #[arg(long, env = "REPLBOX_TASK_KEEP_S", default_value_t = 3600)]
    pub task_keep_s: u64,

    /// When the server stops, how long it waits for running tasks to end before it
    /// interrupts them (and as long again for them to record it).
    #[arg(long, env = "REPLBOX_TASK_STOP_GRACE_MS", default_value_t = 5000)]
    pub task_stop_grace_ms: u64,

    /// Do not restore a suspended session by itself at its first session_eval; only
    /// session_restore does.
    #[arg(long, env = "REPLBOX_NO_AUTO_RESTORE", value_parser = BoolishValueParser::new())]
    pub no_auto_restore: bool,

    /// Code mode: the MCP servers code may call, who may call them, and the bounds.
    #[command(flatten)]
    pub mcp: crate::upstream::Flags,

    /// Several servers as one: the etcd registry and this node's id.
    #[command(flatten)]
    pub cluster: crate::cluster::ClusterFlags,
    /// Packages on demand: `packages` and `%pip install`, the installer and its cache.
    #[command(flatten)]
    pub packages: crate::packages::Flags,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            prompts: None,
            python: None,
            default_timeout_ms: 30_000,
            max_timeout_ms: 600_000,
            output_cap: 64 * 1024,
            work_dir: None,
            idle_timeout_s: 1800,
            max_idle_timeout_s: 86_400,
            max_sessions: 32,
            max_ended_sessions: 4096,
            evict_idle: false,
            max_sessions_per_principal: 16,
            max_active_per_principal: 32,
            pool: 8,
            session_pool: 4,
            preload: None,
            sandbox: Mode::Auto,
            require_sandbox: None,
            allow_network: false,
            allow_domain: Vec::new(),
            allow_host: Vec::new(),
            caller_domains: Vec::new(),
            memory_mb: 4096,
            processes: 256,
            file_size_mb: 1024,
            open_files: 1024,
            cpu_s: 0,
            tmpfs_mb: 256,
            uid_base: 100_000,
            uids: 256,
            mask: Vec::new(),
            expose: Vec::new(),
            allow_cwd: Vec::new(),

            max_images: 8,
            max_image_bytes: 1024 * 1024,
            max_tracked_files: 5000,
            max_resource_bytes: 4 * 1024 * 1024,
            max_line_bytes: 4 * 1024 * 1024,
            history_cells: 1000,
            history_mb: 16,
            whole_output_mb: 8,
            keep_files_s: 600,
            state_dir: None,
            journal_max_mb: 16,
            keep_journals_s: 7 * 86_400,
            task_keep_s: 3600,
            task_stop_grace_ms: 5000,
            no_auto_restore: false,
            mcp: crate::upstream::Flags::default(),
            cluster: crate::cluster::ClusterFlags::default(),
            packages: crate::packages::Flags::default(),
        }
    }
}

/// A `--preload` entry that is not a module name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--preload: {0:?} is not a module name (comma-separated dotted names, e.g. \
     pandas,numpy,matplotlib)"
)]
pub struct PreloadError(String);

impl Config {
    /// With --cluster, the directory of every node's state directory (`SHARED`).
    pub fn shared_journals(&self) -> Option<PathBuf> {
        if self.cluster.cluster.is_empty() {
            return None;
        }
        self.state_dir
            .as_deref()
            .and_then(std::path::Path::parent)
            .map(std::path::Path::to_path_buf)
    }

    /// The egress policy of the flags (`App::new` reports a bad entry).
    pub fn egress_policy(&self) -> Result<Policy, crate::egress::EgressError> {
        Policy::new(
            self.allow_network,
            &self.allow_domain,
            &self.allow_host,
            &self.caller_domains,
        )
    }

    /// The modules a warm Python session imports ahead of time (`--preload`), each a
    /// dotted name (`App::new` reports a bad one).
    pub fn preload_modules(&self) -> Result<Vec<String>, PreloadError> {
        let Some(list) = &self.preload else {
            return Ok(DEFAULT_PRELOAD.iter().map(|m| m.to_string()).collect());
        };
        let mut modules = Vec::new();
        for m in list.split(',').map(str::trim).filter(|m| !m.is_empty()) {
            let word = |w: &str| {
                w.chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            };
            if !m.split('.').all(word) {
                return Err(PreloadError(m.to_string()));
            }
            modules.push(m.to_string());
        }
        Ok(modules)
    }

    /// What the sandbox needs to know of the configuration.
    pub fn sandbox_settings(&self) -> Settings {
        Settings {
            mode: self.sandbox,
            require: self.require_sandbox,
            egress: self.egress_policy().unwrap_or_default(),
            limits: Limits {
                memory_mb: self.memory_mb,
                processes: self.processes,
                file_size_mb: self.file_size_mb,
                open_files: self.open_files.max(16),
                cpu_s: self.cpu_s,
                tmpfs_mb: self.tmpfs_mb.max(1),
            },
            // The journals are the server's: hidden like the masked trees.
            // In a cluster every node's journals are beside this one's: all hidden.
            masks: self
                .mask
                .iter()
                .chain(&self.state_dir)
                .cloned()
                .chain(self.shared_journals())
                .collect(),
            expose: self.expose.clone(),
            uid_base: self.uid_base,
            uids: self.uids,
            uids_per_principal: crate::sandbox::bound_per_principal(self.max_active_per_principal),
        }
    }

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
        if let Some(python) = &self.python {
            args.push("--python".into());
            args.push(python.into());
        }
        for (flag, value) in self.valued_args() {
            args.push(flag.into());
            args.push(value.into());
        }
        self.push_choices(&mut args);
        for (flag, value) in self.list_args() {
            args.push(flag.into());
            args.push(value);
        }
        args.extend(self.mcp.to_args());
        args.extend(self.cluster.to_args());
        args.extend(self.packages.to_args());
        args
    }

    /// The flags that always carry a value: timeouts, limits, pools and the sandbox.
    fn valued_args(&self) -> Vec<(&'static str, String)> {
        vec![
            ("--default-timeout-ms", self.default_timeout_ms.to_string()),
            ("--max-timeout-ms", self.max_timeout_ms.to_string()),
            ("--output-cap", self.output_cap.to_string()),
            ("--idle-timeout-s", self.idle_timeout_s.to_string()),
            ("--max-idle-timeout-s", self.max_idle_timeout_s.to_string()),
            ("--max-sessions", self.max_sessions.to_string()),
            ("--max-ended-sessions", self.max_ended_sessions.to_string()),
            (
                "--max-sessions-per-principal",
                self.max_sessions_per_principal.to_string(),
            ),
            (
                "--max-active-per-principal",
                self.max_active_per_principal.to_string(),
            ),
            ("--pool", self.pool.to_string()),
            ("--session-pool", self.session_pool.to_string()),
            ("--sandbox", value_name(&self.sandbox)),
            ("--memory-mb", self.memory_mb.to_string()),
            ("--processes", self.processes.to_string()),
            ("--file-size-mb", self.file_size_mb.to_string()),
            ("--open-files", self.open_files.to_string()),
            ("--cpu-s", self.cpu_s.to_string()),
            ("--tmpfs-mb", self.tmpfs_mb.to_string()),
            ("--uid-base", self.uid_base.to_string()),
            ("--uids", self.uids.to_string()),
            ("--max-images", self.max_images.to_string()),
            ("--max-image-bytes", self.max_image_bytes.to_string()),
            ("--max-tracked-files", self.max_tracked_files.to_string()),
            ("--max-resource-bytes", self.max_resource_bytes.to_string()),
            ("--max-line-bytes", self.max_line_bytes.to_string()),
            ("--history-cells", self.history_cells.to_string()),
            ("--history-mb", self.history_mb.to_string()),
            ("--whole-output-mb", self.whole_output_mb.to_string()),
            ("--keep-files-s", self.keep_files_s.to_string()),
            ("--journal-max-mb", self.journal_max_mb.to_string()),
            ("--keep-journals-s", self.keep_journals_s.to_string()),
            ("--task-keep-s", self.task_keep_s.to_string()),
            ("--task-stop-grace-ms", self.task_stop_grace_ms.to_string()),
        ]
    }

    /// The work and state dirs, switches and the required sandbox level, each given only
    /// when set.
    fn push_choices(&self, args: &mut Vec<OsString>) {
        if let Some(dir) = &self.work_dir {
            args.push("--work-dir".into());
            args.push(dir.into());
        }
        if self.evict_idle {
            args.push("--evict-idle".into());
        }
        if let Some(dir) = &self.state_dir {
            args.push("--state-dir".into());
            args.push(dir.into());
        }
        if self.no_auto_restore {
            args.push("--no-auto-restore".into());
        }
        if let Some(level) = &self.require_sandbox {
            args.push("--require-sandbox".into());
            args.push(value_name(level).into());
        }
        if self.allow_network {
            args.push("--allow-network".into());
        }
    }

    /// The repeatable flags, one (flag, value) pair per value, and `--preload`.
    fn list_args(&self) -> Vec<(&'static str, OsString)> {
        let lists = [
            ("--allow-domain", &self.allow_domain),
            ("--allow-host", &self.allow_host),
            ("--caller-domains", &self.caller_domains),
        ];
        // At most one: an empty --preload (none) is a value too.
        let preload = self
            .preload
            .iter()
            .map(|m| ("--preload", OsString::from(m)));
        let lists = lists
            .into_iter()
            .flat_map(|(f, l)| l.iter().map(move |v| (f, OsString::from(v))));
        let dirs = [
            ("--mask", &self.mask),
            ("--expose", &self.expose),
            ("--allow-cwd", &self.allow_cwd),
        ];
        let dirs = dirs
            .into_iter()
            .flat_map(|(f, l)| l.iter().map(move |v| (f, OsString::from(v))));
        lists.chain(dirs).chain(preload).collect()
    }
}

/// What a warm Python session imports when `--preload` is not given.
const DEFAULT_PRELOAD: &[&str] = &["pandas", "numpy", "matplotlib"];

/// The command-line spelling of a value-enum value.
fn value_name<T: clap::ValueEnum>(v: &T) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;

impl Config {
    /// The bounds of a session's history (cells, bytes, bytes of whole outputs).
    pub fn history_bounds(&self) -> (usize, usize, usize) {
        let mb = usize::try_from(self.history_mb).unwrap_or(usize::MAX / (1 << 20));
        (
            self.history_cells,
            mb.saturating_mul(1 << 20),
            self.whole_output_cap(),
        )
    }

    /// Bytes of whole outputs a session keeps (see --whole-output-mb).
    pub fn whole_output_cap(&self) -> usize {
        let mb = usize::try_from(self.whole_output_mb).unwrap_or(usize::MAX / (1 << 20));
        mb.saturating_mul(1 << 20)
    }

    /// The idle timeout for a session that asked for `requested` seconds.
    pub fn idle_timeout(&self, requested: Option<u64>) -> Duration {
        let s = requested
            .unwrap_or(self.idle_timeout_s)
            .clamp(1, self.max_idle_timeout_s.max(1));
        Duration::from_secs(s)
    }
}

/// How log lines on stderr are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line (tracing-subscriber's JSON formatter).
    Json,
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
    /// `http://localhost:*` (repeatable). Default: none but, on a loopback address, the
    /// server's own (`http://localhost:PORT`, 127.0.0.1, [::1]); a request carrying another
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

    /// An MCP HTTP session with no request being answered and no event stream open for
    /// this long is ended (its REPL sessions are not: they belong to the principal), in
    /// seconds. A call running keeps it, however long.
    #[arg(long, env = "REPLBOX_HTTP_SESSION_IDLE_S", default_value_t = 1800,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub http_session_idle_s: u64,

    /// An MCP HTTP session that made no call and opened no event stream since its
    /// `initialize` is ended after this long, in seconds.
    #[arg(long, env = "REPLBOX_HTTP_SESSION_UNUSED_S", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub http_session_unused_s: u64,

    /// MCP HTTP sessions one principal (token) may hold. At the limit its least recently
    /// used idle one (no request, no stream) is ended for a new one; when none is idle the
    /// new one is refused (429).
    #[arg(long, env = "REPLBOX_HTTP_MAX_MCP_SESSIONS_PER_PRINCIPAL", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub http_max_mcp_sessions_per_principal: u64,

    /// MCP HTTP sessions the server holds, all principals together. At the limit the least
    /// recently used idle one is ended for a new one; when none is idle, refused (503).
    #[arg(long, env = "REPLBOX_HTTP_MAX_MCP_SESSIONS", default_value_t = 1024,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub http_max_mcp_sessions: u64,

    /// Standalone event streams (GET /mcp) one principal may hold open across its MCP
    /// sessions (each session at most 2); past it, refused (429).
    #[arg(long, env = "REPLBOX_HTTP_MAX_STREAMS_PER_PRINCIPAL", default_value_t = 8,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub http_max_streams_per_principal: u64,

    /// Largest request body accepted on /mcp, in bytes.
    #[arg(long, env = "REPLBOX_HTTP_MAX_BODY", default_value_t = 4 * 1024 * 1024)]
    pub http_max_body: usize,

    /// How long a client may take to send a request's headers, and then its body, in ms; a
    /// slower or half-sent request is dropped. Also how long an idle kept-alive connection
    /// stays open.
    #[arg(long, env = "REPLBOX_HTTP_READ_TIMEOUT_MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub http_read_timeout_ms: u64,

    /// Connections served at once; more wait, unaccepted, until one closes. Keep it well
    /// below the open-files limit (`ulimit -n`): sessions need descriptors too.
    #[arg(long, env = "REPLBOX_HTTP_MAX_CONNECTIONS", default_value_t = 512,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub http_max_connections: u64,

    /// Connections one principal may hold open (a connection counts for the principal
    /// whose request it last carried, until it closes); past it, its request on another
    /// connection is refused (429). Default: a quarter of --http-max-connections, or all of
    /// them with a single principal.
    #[arg(long, env = "REPLBOX_HTTP_MAX_CONNECTIONS_PER_PRINCIPAL", value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub http_max_connections_per_principal: Option<u64>,
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
            http_session_unused_s: 60,
            http_max_mcp_sessions_per_principal: 64,
            http_max_mcp_sessions: 1024,
            http_max_streams_per_principal: 8,
            http_max_body: 4 * 1024 * 1024,
            http_read_timeout_ms: 10_000,
            http_max_connections: 512,
            http_max_connections_per_principal: None,
        }
    }
}
