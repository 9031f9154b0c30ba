//! Isolation of user code: the level in force (probed at start), the uid pool user code runs
//! as when the server is root, and how one spawn is confined ([`Jail`]) — turned into the
//! command line of `bwrap` and of the `__exec` helper, which applies the child-side layers.
//!
//! Levels, strongest first:
//! * `bwrap`: bubblewrap puts the helper in new mount, pid, ipc, uts, cgroup and network
//!   namespaces with a read-only root, masked secret-bearing directories, a private bounded
//!   /tmp and /dev/shm, and only the run's own directories writable; the helper then applies
//!   rlimits, the uid drop, Landlock and seccomp as below.
//! * `landlock`: no namespaces; the helper applies rlimits, the uid drop, a Landlock ruleset
//!   (reads: everything but the masked directories; writes: the run's own directories; no TCP;
//!   no signals or abstract sockets outside) and a seccomp filter.
//! * `none`: rlimits and the uid drop only.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use schemars::JsonSchema;
use serde::Serialize;

use crate::config::Config;
use crate::exec::helper;

/// The isolation level in force (reported in every result).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    None,
    Landlock,
    Bwrap,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::None => "none",
            Level::Landlock => "landlock",
            Level::Bwrap => "bwrap",
        }
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the operator asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Auto,
    Bwrap,
    Landlock,
    None,
}

/// Directories hidden from user code at every level that can hide anything: they hold other
/// users' files, credentials, sockets of system services and other programs' temp files.
pub const DEFAULT_MASKS: &[&str] = &[
    "/home", "/root", "/run", "/tmp", "/var/tmp", "/mnt", "/media", "/srv",
];

/// Where the helper binary appears inside a bwrap sandbox (on the tmpfs that masks /run, or
/// on the private /tmp when there is no /run).
const HELPER_IN_RUN: &str = "/run/replbox-helper";
const HELPER_IN_TMP: &str = "/tmp/.replbox-helper";

/// The status descriptor the helper reports the program's exact end on (see `spawn`).
pub const STATUS_FD: i32 = 3;

/// Device files every sandbox may open for writing (terminals, sinks, randomness).
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
    "/dev/shm",
];

/// Per-process resource limits, from the configuration.
#[derive(Debug, Clone)]
pub struct Limits {
    pub memory_mb: u64,
    pub processes: u64,
    pub file_size_mb: u64,
    pub open_files: u64,
    /// CPU seconds for one-shot runs; 0 means "the run's timeout".
    pub cpu_s: u64,
    pub tmpfs_mb: u64,
}

impl Limits {
    fn from_config(c: &Config) -> Self {
        Self {
            memory_mb: c.memory_mb,
            processes: c.processes,
            file_size_mb: c.file_size_mb,
            open_files: c.open_files.max(16),
            cpu_s: c.cpu_s,
            tmpfs_mb: c.tmpfs_mb.max(1),
        }
    }
}

/// How one spawn is confined, beyond what the level does for every spawn.
#[derive(Debug, Clone, Default)]
pub struct Jail {
    /// Run as this uid (and gid) — the lease of a session or run when the server is root.
    pub uid: Option<u32>,
    /// Directories the program may write (its working directory, a caller's cwd, a cache).
    pub rw: Vec<PathBuf>,
    /// Directories it may read that the level would otherwise hide (the session's control
    /// directory, the interpreter's installation prefix).
    pub ro: Vec<PathBuf>,
    /// CPU seconds (one-shot runs only).
    pub cpu_s: Option<u64>,
    /// Set by a process that ended without the helper confirming its whole tree gone: the
    /// lease's uid is then swept before reuse.
    pub dirty: Option<Arc<AtomicBool>>,
}

/// A program and its arguments, ready for `Command`.
#[derive(Debug, Clone)]
pub struct CommandLine {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// True when the program is bwrap: its child is the helper.
    pub wrapped: bool,
}

/// The decided sandbox, shared by every spawn.
#[derive(Debug)]
pub struct Sandbox {
    pub level: Level,
    /// The server runs as root: user code runs as a uid of the pool.
    pub root: bool,
    pub network: bool,
    pub limits: Limits,
    /// Landlock ABI of the running kernel (0: none).
    pub landlock_abi: i32,
    helper: PathBuf,
    bwrap: Option<PathBuf>,
    /// Existing directories hidden from user code.
    masked: Vec<PathBuf>,
    /// Landlock-level read allowlist: everything but the masked directories and the
    /// server's workspace.
    read_roots: Vec<PathBuf>,
    pool: Option<Arc<UidPool>>,
    /// A remembered bwrap success still to confirm (see [`ProbeCache`]).
    unverified: Mutex<Option<ProbeCache>>,
}

/// The start-up probe in flight, so that it overlaps the rest of start-up.
pub struct Probe {
    plan: Plan,
    bwrap_probe: Option<(std::process::Child, Instant)>,
    cache: Option<ProbeCache>,
    /// The cache remembers bwrap working here: no probe was started.
    cached: bool,
}

/// Everything decided before the probe's answer.
struct Plan {
    mode: Mode,
    require: Option<Level>,
    root: bool,
    network: bool,
    limits: Limits,
    helper: PathBuf,
    bwrap: Option<PathBuf>,
    masked: Vec<PathBuf>,
    pool: Result<Option<Arc<UidPool>>, String>,
}

impl Sandbox {
    /// Start probing (spawns `bwrap` when it may be used). Cheap: returns at once.
    pub fn probe(config: &Config) -> Probe {
        let root = nix::unistd::geteuid().is_root();
        let mut masked: Vec<PathBuf> = DEFAULT_MASKS
            .iter()
            .map(PathBuf::from)
            .chain(config.mask.iter().cloned())
            .filter_map(|p| std::fs::canonicalize(p).ok())
            .filter(|p| p.is_dir() && p != Path::new("/"))
            .collect();
        masked.sort();
        masked.dedup();
        let bwrap = match config.sandbox {
            Mode::Auto | Mode::Bwrap => find_on_path("bwrap"),
            _ => None,
        };
        let plan = Plan {
            mode: config.sandbox,
            require: config.require_sandbox,
            root,
            network: config.allow_network,
            limits: Limits::from_config(config),
            helper: crate::exec::spawn::helper_exe().to_path_buf(),
            bwrap,
            masked,
            pool: if root {
                state_dir()
                    .map(|dir| {
                        Some(Arc::new(UidPool::new(
                            config.uid_base,
                            config.uids.max(1),
                            dir,
                        )))
                    })
                    .map_err(|e| e.to_string())
            } else {
                Ok(None)
            },
        };
        // A remembered success answers at once and is confirmed after the handshake
        // (`verify_in_background`); otherwise bwrap is probed now, overlapping start-up.
        let cache = plan.bwrap.as_ref().and_then(|_| ProbeCache::new(&plan));
        let cached = cache.as_ref().is_some_and(ProbeCache::hit);
        let bwrap_probe = match &plan.bwrap {
            Some(_) if !cached => match probe_command(&plan.provisional(Level::Bwrap)).spawn() {
                Ok(child) => Some((child, Instant::now())),
                Err(e) => {
                    tracing::warn!("cannot run bwrap: {e}");
                    None
                }
            },
            _ => None,
        };
        Probe {
            plan,
            bwrap_probe,
            cache,
            cached,
        }
    }

    /// Confirm a remembered bwrap probe (see [`ProbeCache`]), off the critical path: call
    /// after the first reply.
    pub fn verify_in_background(&self) {
        let Some(cache) = self
            .unverified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return;
        };
        let mut cmd = probe_command(self);
        let _ = std::thread::Builder::new()
            .name("bwrap-probe".into())
            .spawn(move || {
                let outcome = cmd
                    .spawn()
                    .map_err(|e| e.to_string())
                    .and_then(|child| wait_probe(child, Instant::now()));
                if let Err(e) = outcome {
                    tracing::error!(
                        "bwrap no longer works here ({e}); runs will fail until the server is \
                         restarted"
                    );
                    cache.forget();
                }
            });
    }

    /// Which interpreter executables user code can run at this level. When the server is root
    /// and there is no mount namespace to re-bind them (levels `landlock` and `none`), a
    /// program is usable only if an unprivileged user can reach it (pyenv under a 0700 /root
    /// is not).
    pub fn can_run(&self, exe: &Path) -> bool {
        if !self.root || self.level == Level::Bwrap {
            return true;
        }
        reachable_by_others(exe)
    }

    /// Why [`can_run`](Self::can_run) said no, for messages.
    pub fn cannot_run_reason(&self, exe: &Path) -> String {
        format!(
            "{} is not reachable by the unprivileged user code runs as at sandbox level {} \
             (install it where other users can run it, or use --sandbox bwrap)",
            exe.display(),
            self.level
        )
    }

    /// The installation prefix of an interpreter to make visible when it lies in a hidden
    /// directory (pyenv, rustup, nvm under /root or /home): `<prefix>/bin/<exe>` gives
    /// `<prefix>`, anything else its directory.
    pub fn interpreter_dirs(&self, exe: &Path) -> Vec<PathBuf> {
        if self.level == Level::None {
            return Vec::new();
        }
        let exe = std::fs::canonicalize(exe).unwrap_or_else(|_| exe.to_path_buf());
        if !self.masked.iter().any(|m| exe.starts_with(m)) {
            return Vec::new();
        }
        let Some(dir) = exe.parent() else {
            return Vec::new();
        };
        let prefix = if dir.file_name().is_some_and(|n| n == "bin") {
            dir.parent().unwrap_or(dir)
        } else {
            dir
        };
        if self.masked.iter().any(|m| m == prefix) {
            // Never re-expose a whole masked directory (an exe directly in /root/bin).
            return vec![dir.to_path_buf()];
        }
        vec![prefix.to_path_buf()]
    }

    /// Take a uid for one session or run (None when the server is not root).
    pub fn lease(&self) -> Result<Option<Lease>, String> {
        match &self.pool {
            None => Ok(None),
            Some(pool) => pool.clone().acquire(self.level != Level::Bwrap).map(Some),
        }
    }

    /// The existing directories hidden from user code (canonical): a caller's `cwd` may not
    /// lie in one unless the operator allows it (see `hostfs::check_cwd`).
    pub fn masked(&self) -> &[PathBuf] {
        &self.masked
    }

    /// One line for the server's instructions.
    pub fn describe(&self) -> String {
        let what = match self.level {
            Level::Bwrap => {
                "bubblewrap namespaces: read-only system, private /tmp and working directory, \
                 home and other secret-bearing directories hidden"
            }
            Level::Landlock => {
                "Landlock and seccomp: writes only in the working directory, home and other \
                 secret-bearing directories unreadable"
            }
            Level::None => "no isolation beyond resource limits",
        };
        let user = if self.root {
            ", as an unprivileged user"
        } else {
            ""
        };
        let net = if self.network {
            "network allowed"
        } else if self.level == Level::None {
            "network not restricted"
        } else {
            "no network"
        };
        let l = &self.limits;
        let mb = |v: u64| {
            if v == 0 {
                "unlimited".to_string()
            } else {
                format!("{v} MiB")
            }
        };
        format!(
            "Sandbox: {} ({what}{user}; {net}). Limits per process: memory {}, files up to {}, \
             {} open files; {} processes per session or run.",
            self.level,
            mb(l.memory_mb),
            mb(l.file_size_mb),
            l.open_files,
            if l.processes == 0 {
                "unlimited".to_string()
            } else {
                l.processes.to_string()
            }
        )
    }

    /// The command that runs `argv` confined by this sandbox and `jail`, under the helper.
    pub fn command(
        &self,
        jail: &Jail,
        cwd: &Path,
        pty: bool,
        status_fd: Option<i32>,
        argv: &[String],
    ) -> CommandLine {
        let wrapped = self.level == Level::Bwrap && self.bwrap.is_some();
        let helper_path = if wrapped {
            if self.masked.iter().any(|m| m == Path::new("/run")) {
                PathBuf::from(HELPER_IN_RUN)
            } else {
                PathBuf::from(HELPER_IN_TMP)
            }
        } else {
            self.helper.clone()
        };
        let mut h: Vec<OsString> = vec![helper::SUBCOMMAND.into()];
        let mut flag = |k: &str, v: OsString| {
            h.push(k.into());
            h.push(v);
        };
        if let Some(fd) = status_fd {
            flag("--status-fd", fd.to_string().into());
        }
        flag("--chdir", cwd.as_os_str().to_owned());
        if let Some(uid) = jail.uid {
            flag("--uid", uid.to_string().into());
            flag("--gid", uid.to_string().into());
        }
        let l = &self.limits;
        let mib = |v: u64| v.saturating_mul(1024 * 1024);
        if l.memory_mb > 0 {
            flag("--rlimit", format!("data={}", mib(l.memory_mb)).into());
        }
        if l.file_size_mb > 0 {
            flag("--rlimit", format!("fsize={}", mib(l.file_size_mb)).into());
        }
        flag("--rlimit", format!("nofile={}", l.open_files).into());
        if l.processes > 0 {
            // The kernel counts a uid's tasks per user namespace. A pool uid starts with
            // nothing running, and so does the uid in the user namespace bwrap makes when not
            // root. Otherwise the server's own uid already runs the server's threads and
            // whatever else its user runs, all counted against the limit.
            let nproc = if jail.uid.is_some() || wrapped {
                l.processes
            } else {
                l.processes + tasks_of_uid(nix::unistd::getuid().as_raw())
            };
            flag("--rlimit", format!("nproc={nproc}").into());
        }
        if let Some(cpu) = jail.cpu_s {
            flag("--rlimit", format!("cpu={cpu}").into());
        }
        if self.level >= Level::Landlock {
            let required = if self.level == Level::Landlock {
                "required"
            } else {
                "best-effort"
            };
            flag("--landlock", required.into());
            let mut reads: Vec<&Path> = Vec::new();
            let mut writes: Vec<&Path> = jail.rw.iter().map(PathBuf::as_path).collect();
            writes.extend(DEVICES.iter().map(Path::new));
            if wrapped {
                reads.push(Path::new("/"));
                writes.push(Path::new("/tmp"));
            } else {
                reads.extend(self.read_roots.iter().map(PathBuf::as_path));
                reads.extend(jail.ro.iter().map(PathBuf::as_path));
            }
            for p in reads {
                flag("--read", p.as_os_str().to_owned());
            }
            for p in writes {
                flag("--write", p.as_os_str().to_owned());
            }
            if self.network {
                h.push("--net".into());
            }
            h.push("--seccomp".into());
        }
        if pty {
            h.push("--pty".into());
        }
        h.push("--".into());
        h.extend(argv.iter().map(OsString::from));

        if !wrapped {
            return CommandLine {
                program: self.helper.clone(),
                args: h,
                wrapped: false,
            };
        }
        let mut b: Vec<OsString> = Vec::new();
        fn arg(b: &mut Vec<OsString>, a: &str) {
            b.push(a.into());
        }
        // The helper is the sandbox's pid 1: when it exits, the kernel kills whatever is left
        // in the namespace. bwrap dies with the server; the helper dies with bwrap.
        for a in ["--die-with-parent", "--new-session", "--as-pid-1"] {
            arg(&mut b, a);
        }
        if self.root {
            // No user namespace: the helper starts as real root with only the capabilities it
            // needs to drop to the pool uid (and to kill that uid's processes), and the
            // program ends up with none. In a user namespace owned by root the pool uid could
            // not be mapped, and without the drop the program would be kernel uid 0.
            for a in [
                "--unshare-ipc",
                "--unshare-pid",
                "--unshare-uts",
                "--unshare-cgroup-try",
                "--cap-drop",
                "ALL",
                "--cap-add",
                "CAP_SETUID",
                "--cap-add",
                "CAP_SETGID",
                "--cap-add",
                "CAP_SETPCAP",
                "--cap-add",
                "CAP_KILL",
            ] {
                arg(&mut b, a);
            }
        } else {
            for a in [
                "--unshare-user",
                "--disable-userns",
                "--unshare-ipc",
                "--unshare-pid",
                "--unshare-uts",
                "--unshare-cgroup-try",
                "--cap-drop",
                "ALL",
            ] {
                arg(&mut b, a);
            }
        }
        if !self.network {
            arg(&mut b, "--unshare-net");
        }
        // Order matters: the read-only root, then the masks, then what is bound back in.
        for a in ["--ro-bind", "/", "/"] {
            arg(&mut b, a);
        }
        let tmpfs_bytes = mib(l.tmpfs_mb).to_string();
        for m in &self.masked {
            if m != Path::new("/tmp") {
                b.push("--tmpfs".into());
                b.push(m.as_os_str().to_owned());
            }
        }
        for a in [
            "--perms",
            "01777",
            "--size",
            &tmpfs_bytes,
            "--tmpfs",
            "/tmp",
        ] {
            arg(&mut b, a);
        }
        for a in ["--dev", "/dev", "--perms", "01777", "--size", &tmpfs_bytes] {
            arg(&mut b, a);
        }
        for a in [
            "--tmpfs",
            "/dev/shm",
            "--proc",
            "/proc",
            "--hostname",
            "replbox",
        ] {
            arg(&mut b, a);
        }
        b.push("--ro-bind".into());
        b.push(self.helper.as_os_str().to_owned());
        b.push(helper_path.as_os_str().to_owned());
        // Directories bwrap would create on the way to a bind inside a mask are 0700 root:
        // create them 0711 first, so the pool uid can pass through (and still not list).
        let mut parents = BTreeSet::new();
        for p in jail.ro.iter().chain(&jail.rw) {
            for a in p.ancestors().skip(1) {
                if self.masked.iter().any(|m| a.starts_with(m) && a != m) {
                    parents.insert(a.to_path_buf());
                }
            }
        }
        for a in parents {
            arg(&mut b, "--perms");
            arg(&mut b, "0711");
            arg(&mut b, "--dir");
            b.push(a.into_os_string());
        }
        for p in &jail.ro {
            b.push("--ro-bind".into());
            b.push(p.as_os_str().to_owned());
            b.push(p.as_os_str().to_owned());
        }
        // Writable directories after the read-only ones, so a session's control directory
        // (read-only) and its working directory (writable) are each what they should be.
        for p in &jail.rw {
            b.push("--bind".into());
            b.push(p.as_os_str().to_owned());
            b.push(p.as_os_str().to_owned());
        }
        // bwrap enters "/": the working directory belongs to the pool uid, which root without
        // CAP_DAC_OVERRIDE may not enter. The helper's child enters it after the uid drop.
        for a in ["--chdir", "/", "--"] {
            arg(&mut b, a);
        }
        b.push(helper_path.into_os_string());
        b.extend(h);
        CommandLine {
            program: self.bwrap.clone().unwrap_or_else(|| PathBuf::from("bwrap")),
            args: b,
            wrapped: true,
        }
    }
}

impl Plan {
    /// A sandbox at `level` without the workspace-dependent parts (for probing).
    fn provisional(&self, level: Level) -> Sandbox {
        Sandbox {
            level,
            root: self.root,
            network: self.network,
            limits: self.limits.clone(),
            landlock_abi: landlock_abi(),
            helper: self.helper.clone(),
            bwrap: self.bwrap.clone(),
            masked: self.masked.clone(),
            read_roots: Vec::new(),
            pool: self.pool.clone().ok().flatten(),
            unverified: Mutex::new(None),
        }
    }
}

impl Probe {
    /// Wait for the probe and decide the level. `workspace` is hidden from Landlock-level
    /// reads (other sessions' directories live there). Errors when a named level does not
    /// work, or the level is below `--require-sandbox`.
    pub fn finish(self, workspace: &Path) -> anyhow::Result<Sandbox> {
        let plan = self.plan;
        if let Err(e) = &plan.pool {
            // Running as root without a safe way to hand out uids: user code would share
            // uids with another server's, so refuse rather than weaken the guarantee.
            anyhow::bail!("{e}");
        }
        let mut unverified = None;
        let bwrap_ok = match self.bwrap_probe {
            None if self.cached => {
                unverified = self.cache;
                true
            }
            Some((child, started)) => match wait_probe(child, started) {
                Ok(()) => {
                    if let Some(c) = &self.cache {
                        c.store();
                    }
                    true
                }
                Err(e) => {
                    if plan.mode == Mode::Bwrap {
                        anyhow::bail!("--sandbox bwrap does not work here: {e}");
                    }
                    tracing::warn!("sandbox level bwrap unavailable: {e}");
                    false
                }
            },
            None => {
                if plan.mode == Mode::Bwrap {
                    anyhow::bail!("--sandbox bwrap does not work here: bwrap is not on PATH");
                }
                false
            }
        };
        let landlock_ok = || -> Result<(), String> {
            let abi = landlock_abi();
            if abi < 1 {
                return Err("the kernel has no Landlock".into());
            }
            // SAFETY: PR_GET_SECCOMP takes no pointer; it fails with EINVAL without seccomp.
            if unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) } < 0 {
                return Err("the kernel has no seccomp".into());
            }
            Ok(())
        };
        let level = match plan.mode {
            Mode::Bwrap => Level::Bwrap,
            Mode::None => Level::None,
            Mode::Landlock => {
                landlock_ok()
                    .map_err(|e| anyhow::anyhow!("--sandbox landlock does not work here: {e}"))?;
                Level::Landlock
            }
            Mode::Auto if bwrap_ok => Level::Bwrap,
            Mode::Auto => match landlock_ok() {
                Ok(()) => Level::Landlock,
                Err(e) => {
                    tracing::warn!("sandbox level landlock unavailable: {e}");
                    Level::None
                }
            },
        };
        if let Some(required) = plan.require
            && level < required
        {
            anyhow::bail!(
                "the sandbox level in force here is {level}, below the required {required} \
                 (--require-sandbox); refusing to start"
            );
        }
        let mut sandbox = plan.provisional(level);
        if level != Level::Bwrap {
            sandbox.bwrap = None;
        } else {
            sandbox.unverified = Mutex::new(unverified);
        }
        if level == Level::Landlock {
            let mut hidden = sandbox.masked.clone();
            hidden.push(std::fs::canonicalize(workspace).unwrap_or_else(|_| workspace.into()));
            sandbox.read_roots = all_except(Path::new("/"), &hidden);
        }
        Ok(sandbox)
    }
}

/// bwrap with every namespace, mount and capability of a real spawn and the helper bound in,
/// running `true` directly: the helper's own start-up (a few ms) would only delay the first
/// reply, and a helper layer that fails later fails closed with a message.
fn probe_command(sb: &Sandbox) -> std::process::Command {
    let mut line = sb.command(&Jail::default(), Path::new("/"), false, None, &[]);
    if let Some(i) = line.args.iter().position(|a| a == "--") {
        line.args.truncate(i + 1);
        line.args.push("/bin/true".into());
    }
    let mut c = std::process::Command::new(&line.program);
    c.args(&line.args)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    c
}

fn wait_probe(mut child: std::process::Child, started: Instant) -> Result<(), String> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    use std::io::Read;
                    let _ = e.read_to_string(&mut err);
                }
                return Err(format!("the probe failed ({status}): {}", err.trim()));
            }
            Ok(None) if started.elapsed() > Duration::from_secs(5) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("the probe did not finish within 5 s".into());
            }
            Ok(None) => std::thread::sleep(Duration::from_micros(200)),
            Err(e) => return Err(format!("the probe could not be waited for: {e}")),
        }
    }
}

/// The kernel's Landlock ABI version (0 when unavailable).
pub fn landlock_abi() -> i32 {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) only returns
    // the ABI version; no memory is passed.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    if v < 0 { 0 } else { v as i32 }
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    crate::lang::which(program, &path)
}

/// Every entry under `root` except the `hidden` paths, descending only where a hidden path
/// lies beneath (so `/var` becomes `/var/*` but `/var/tmp`). Landlock can only allow, never
/// deny inside an allowed directory, hence the split.
pub fn all_except(root: &Path, hidden: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir(root) else {
        return out;
    };
    for entry in dir.flatten() {
        let p = entry.path();
        if hidden.iter().any(|h| h == &p) {
            continue;
        }
        let is_real_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
        if is_real_dir && hidden.iter().any(|h| h.starts_with(&p)) {
            out.extend(all_except(&p, hidden));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// Whether a user that is neither the owner nor in the group can execute `exe`: every
/// directory on the way must be searchable by others, and the file executable by others.
pub fn reachable_by_others(exe: &Path) -> bool {
    let Ok(real) = std::fs::canonicalize(exe) else {
        return false;
    };
    let Ok(meta) = std::fs::metadata(&real) else {
        return false;
    };
    if meta.permissions().mode() & 0o001 == 0 {
        return false;
    }
    real.ancestors().skip(1).all(|dir| {
        std::fs::metadata(dir)
            .map(|m| m.permissions().mode() & 0o001 != 0)
            .unwrap_or(false)
    })
}

/// Tasks (processes and threads) whose real uid is `uid`: what RLIMIT_NPROC counts.
fn tasks_of_uid(uid: u32) -> u64 {
    let mut n = 0;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        if !name
            .to_str()
            .is_some_and(|s| s.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        if e.metadata().ok().map(|m| m.uid()) != Some(uid) {
            continue;
        }
        if let Ok(status) = std::fs::read_to_string(e.path().join("status"))
            && let Some(t) = status
                .lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        {
            n += t;
        }
    }
    n
}

/// The uids user code runs as when the server is root: one per session or run, so that
/// RLIMIT_NPROC (counted per uid) is a per-session budget and sessions cannot signal or read
/// each other. Several servers on one host share the uid range, so a uid is taken with an
/// exclusive `flock` on a file in a root-only directory (released by the kernel if the server
/// dies), besides this server's own free list.
#[derive(Debug)]
pub struct UidPool {
    base: u32,
    size: u32,
    lock_dir: PathBuf,
    free: Mutex<BTreeSet<u32>>,
}

impl UidPool {
    fn new(base: u32, size: u32, lock_dir: PathBuf) -> Self {
        Self {
            base,
            size,
            lock_dir,
            free: Mutex::new((0..size).collect()),
        }
    }

    fn acquire(self: Arc<Self>, sweep: bool) -> Result<Lease, String> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        // The lowest free slot, so that a lone caller keeps finding its warm build caches;
        // skip those another server holds.
        let mut taken = None;
        for &slot in free.iter() {
            if let Some(lock) = self.try_lock(self.base + slot) {
                taken = Some((slot, lock));
                break;
            }
        }
        let Some((slot, lock)) = taken else {
            return Err(format!(
                "all {} sandbox user ids ({}..{}) are in use by open sessions and running \
                 programs; close a session, or start the server with a larger --uids",
                self.size,
                self.base,
                self.base + self.size
            ));
        };
        free.remove(&slot);
        drop(free);
        Ok(Lease {
            uid: self.base + slot,
            slot,
            sweep,
            dirty: Arc::new(AtomicBool::new(false)),
            lock: Some(lock),
            pool: self.clone(),
        })
    }

    fn try_lock(&self, uid: u32) -> Option<std::fs::File> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(self.lock_dir.join(uid.to_string()))
            .ok()?;
        // SAFETY: flock on a descriptor we own.
        let rc = unsafe {
            libc::flock(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                libc::LOCK_EX | libc::LOCK_NB,
            )
        };
        (rc == 0).then_some(f)
    }

    fn release(&self, slot: u32) {
        self.free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(slot);
    }
}

/// The server's state directory (uid locks, the probe cache): root's alone (checked, so
/// nobody can pre-create it to steal or block uids, or to forge a probe result).
fn state_dir() -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = if Path::new("/run").is_dir() {
        PathBuf::from("/run/replbox")
    } else {
        std::env::temp_dir().join("replbox-state")
    };
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    let meta = std::fs::symlink_metadata(&dir)
        .map_err(|e| anyhow::anyhow!("state directory {}: {e}", dir.display()))?;
    if !meta.is_dir() || meta.uid() != 0 || meta.permissions().mode() & 0o077 != 0 {
        anyhow::bail!(
            "state directory {} must be a directory owned by root with mode 0700",
            dir.display()
        );
    }
    Ok(dir)
}

/// A successful bwrap probe, remembered so that later starts answer `initialize` without
/// waiting ~10 ms for bwrap. Only successes are kept (a failure is always re-checked), and the
/// key covers what decides the outcome: bwrap's and the helper's binaries, the kernel and
/// this boot, the uid, the network setting and the masks. A start that uses the cache still
/// probes in the background and forgets the entry if bwrap stopped working; spawns then fail
/// with bwrap's error (closed, not downgraded) until the server is restarted.
#[derive(Debug)]
struct ProbeCache {
    file: PathBuf,
    key: String,
}

impl ProbeCache {
    fn new(plan: &Plan) -> Option<Self> {
        let dir = if plan.root {
            state_dir().ok()?
        } else {
            // Not root: only a runtime directory that is the user's own and private.
            let d = PathBuf::from(std::env::var_os("XDG_RUNTIME_DIR")?);
            let m = std::fs::symlink_metadata(&d).ok()?;
            if !m.is_dir()
                || m.uid() != nix::unistd::geteuid().as_raw()
                || m.permissions().mode() & 0o077 != 0
            {
                return None;
            }
            d
        };
        let stamp = |p: &Path| {
            std::fs::metadata(p)
                .map(|m| {
                    format!(
                        "{}:{}:{}",
                        p.display(),
                        m.len(),
                        m.mtime_nsec() + m.mtime() * 1_000_000_000
                    )
                })
                .unwrap_or_default()
        };
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let key = format!(
            "v1 euid={} bwrap={} helper={} kernel={} boot={} net={} masks={:?}\n",
            nix::unistd::geteuid(),
            stamp(plan.bwrap.as_deref()?),
            stamp(&plan.helper),
            kernel.trim(),
            boot.trim(),
            plan.network,
            plan.masked
        );
        Some(Self {
            file: dir.join(format!("bwrap-probe-{}", nix::unistd::geteuid())),
            key,
        })
    }

    fn hit(&self) -> bool {
        std::fs::read_to_string(&self.file).is_ok_and(|k| k == self.key)
    }

    fn store(&self) {
        use std::os::unix::fs::OpenOptionsExt;
        let tmp = self
            .file
            .with_extension(format!("tmp{}", std::process::id()));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| std::io::Write::write_all(&mut f, self.key.as_bytes()));
        if written.is_ok() {
            let _ = std::fs::rename(&tmp, &self.file);
        } else {
            let _ = std::fs::remove_file(&tmp);
        }
    }

    fn forget(&self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

/// One uid of the pool, returned when dropped.
#[derive(Debug)]
pub struct Lease {
    pub uid: u32,
    slot: u32,
    /// Kill leftovers before the uid is reused. Not needed at the bwrap level, where the pid
    /// namespace dies with its first process.
    sweep: bool,
    dirty: Arc<AtomicBool>,
    lock: Option<std::fs::File>,
    pool: Arc<UidPool>,
}

impl Lease {
    /// The flag a process of this lease sets when it ends without a confirmed clean tree.
    pub fn dirty_flag(&self) -> Arc<AtomicBool> {
        self.dirty.clone()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let sweep = self.sweep && self.dirty.load(Ordering::Relaxed);
        let (uid, slot, pool) = (self.uid, self.slot, self.pool.clone());
        let lock = self.lock.take();
        if !sweep {
            // The helper saw every process of this lease gone: nothing to wait for.
            drop(lock);
            pool.release(slot);
            return;
        }
        let work = move || {
            kill_uid(uid);
            // Other servers may take the uid once its lock is closed.
            drop(lock);
            pool.release(slot);
        };
        // Reading /proc is blocking work: keep it off the async workers.
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(work);
            }
            Err(_) => work(),
        }
    }
}

/// SIGKILL every process whose real uid is `uid` (the helper already killed its tree; this
/// catches anything that got away, so a reused uid starts clean).
pub fn kill_uid(uid: u32) {
    for _ in 0..50 {
        let mut found = false;
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for e in dir.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                    continue;
                };
                let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
                    continue;
                };
                let real = status
                    .lines()
                    .find_map(|l| l.strip_prefix("Uid:"))
                    .and_then(|v| v.split_whitespace().next())
                    .and_then(|v| v.parse::<u32>().ok());
                if real == Some(uid) {
                    found = true;
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
        if !found {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_except_splits_around_hidden_paths() {
        let d = tempfile::tempdir().expect("tempdir");
        for p in ["a/x", "a/y", "b", "c/z"] {
            std::fs::create_dir_all(d.path().join(p)).expect("mkdir");
        }
        let hidden = vec![d.path().join("a/y"), d.path().join("c")];
        let got = all_except(d.path(), &hidden);
        assert_eq!(got, vec![d.path().join("a/x"), d.path().join("b")]);
    }

    #[test]
    fn levels_are_ordered() {
        assert!(Level::Bwrap > Level::Landlock && Level::Landlock > Level::None);
    }

    #[test]
    fn pool_hands_out_distinct_uids_and_takes_them_back() {
        let locks = tempfile::tempdir().expect("tempdir");
        let pool = Arc::new(UidPool::new(5000, 2, locks.path().to_path_buf()));
        let other = Arc::new(UidPool::new(5000, 2, locks.path().to_path_buf()));
        let a = pool.clone().acquire(false).expect("first");
        let b = pool.clone().acquire(false).expect("second");
        assert_ne!(a.uid, b.uid);
        assert!(pool.clone().acquire(false).is_err());
        assert!(
            other.clone().acquire(false).is_err(),
            "another server sees them taken"
        );
        drop(a);
        let c = pool.clone().acquire(false).expect("after release");
        assert_eq!(c.uid, 5000);
    }
}
