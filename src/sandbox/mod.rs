//! Isolation of user code: the level in force (probed at start, [`probe`]), the uid pool user
//! code runs as when the server is root ([`uid_pool`]), and how one spawn is confined
//! ([`Jail`]) — turned into the command line of `bwrap` ([`bwrap`]) and of the helper
//! (`replbox-exec`), which applies the child-side layers ([`landlock`] decides its rules).
//!
//! Levels, strongest first:
//! * `bwrap`: bubblewrap puts the helper in new mount, pid, ipc, uts, cgroup and network
//!   namespaces (the network one holding only loopback, and the bridge to the egress proxy
//!   when the operator allows one) with a read-only root, masked secret-bearing directories, a private bounded
//!   /tmp and /dev/shm, and only the run's own directories writable; the helper then applies
//!   rlimits, the uid drop, Landlock and seccomp as below.
//! * `landlock`: no namespaces (but a private /dev/shm where the helper can make one); the
//!   helper applies rlimits, the uid drop, a Landlock ruleset (reads: everything but the
//!   masked directories; writes: the run's own directories; no TCP but to the egress
//!   proxy's port; no signals or abstract sockets outside) and a seccomp filter.
//! * `none`: rlimits and the uid drop only.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};

use replbox_exec::{ExecArgs, LandlockMode, PROGRAM_FD, Rlimit, STATUS_FD};

use crate::egress::{Egress, Endpoint};

pub mod bwrap;
pub mod landlock;
pub mod level;
pub mod probe;
pub mod uid_pool;
pub mod view;

pub use bwrap::BindError;
pub use level::{Level, Mode};
pub use uid_pool::{Holder, Lease, Refused, UidPool, bound_per_principal};

/// Directories hidden from user code at every level that can hide anything: they hold other
/// users' files, credentials, sockets of system services and other programs' temp files.
pub const DEFAULT_MASKS: &[&str] = &[
    "/home", "/root", "/run", "/tmp", "/var/tmp", "/mnt", "/media", "/srv",
];

/// File name of the helper binary, installed beside the server's.
pub const HELPER_BIN: &str = "replbox-exec";

static HELPER_EXE: OnceLock<PathBuf> = OnceLock::new();

/// Where the helper is: `REPLBOX_HELPER` if set, else `replbox-exec` beside the server's
/// own executable. (Whether it is there is checked when the sandbox is probed.)
pub fn helper_exe() -> &'static Path {
    HELPER_EXE.get_or_init(|| {
        if let Some(p) = std::env::var_os("REPLBOX_HELPER") {
            return PathBuf::from(p);
        }
        let me = std::env::current_exe().unwrap_or_default();
        me.parent()
            .map(|dir| dir.join(HELPER_BIN))
            .unwrap_or_else(|| PathBuf::from(HELPER_BIN))
    })
}

/// Set the helper executable explicitly (before the sandbox is probed).
pub fn set_helper_exe(path: PathBuf) {
    let _ = HELPER_EXE.set(path);
}

/// Per-process resource limits, from the configuration.
#[derive(Debug, Clone)]
pub struct Limits {
    pub memory_mb: u64,
    pub processes: u64,
    pub file_size_mb: u64,
    pub open_files: u64,
    /// CPU seconds for one-shot runs; 0 means "the run's timeout".
    pub cpu_s: u64,
    /// Size of the private /tmp and /dev/shm.
    pub tmpfs_mb: u64,
}

/// What the operator decided about isolation (from the configuration).
#[derive(Debug, Clone)]
pub struct Settings {
    pub mode: Mode,
    /// Refuse to start below this level.
    pub require: Option<Level>,
    /// What user code may reach through the egress proxy (nothing by default).
    pub egress: crate::egress::Policy,
    pub limits: Limits,
    /// Directories to hide besides [`DEFAULT_MASKS`].
    pub masks: Vec<PathBuf>,
    /// Trees (or files) user code may read besides the system's view (`--expose`).
    pub expose: Vec<PathBuf>,
    pub uid_base: u32,
    pub uids: u32,
    /// Most uids bound to one principal (0: no limit; see [`bound_per_principal`]).
    pub uids_per_principal: u32,
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
    /// Directories of `rw` and `ro` opened as the lease's uid when they were decided (a
    /// caller's `cwd` and `venv`): bound, and given Landlock rules, from these handles, never
    /// by their paths, so what the sandbox shows is what was checked.
    pub opened: Vec<(PathBuf, Arc<OwnedFd>)>,
    /// CPU seconds (one-shot runs only).
    pub cpu_s: Option<u64>,
    /// Its way to the egress proxy (the only network it has), when the operator allows one.
    pub egress: Option<Arc<Endpoint>>,
    /// Set by a process that ended without the helper confirming its whole tree gone: the
    /// lease's uid is then swept before reuse.
    pub dirty: Option<Arc<AtomicBool>>,
}

impl Jail {
    /// The handle `p` was opened as when it was decided, if it is a caller's directory.
    pub fn opened(&self, p: &Path) -> Option<&OwnedFd> {
        self.opened
            .iter()
            .find(|(q, _)| q == p)
            .map(|(_, fd)| fd.as_ref())
    }
}

/// A program and its arguments, ready for `Command`.
#[derive(Debug)]
pub struct CommandLine {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// True when the program is bwrap: its child is the helper.
    pub wrapped: bool,
    /// Descriptors the program must find at the given numbers (bwrap's `--bind-fd`).
    pub fds: Vec<(OwnedFd, i32)>,
}

/// The decided sandbox, shared by every spawn.
#[derive(Debug)]
pub struct Sandbox {
    pub level: Level,
    /// The server runs as root: user code runs as a uid of the pool.
    pub root: bool,
    /// The egress proxy, when the operator allows any network: the only way out.
    pub egress: Option<Arc<Egress>>,
    pub limits: Limits,
    /// Landlock ABI of the running kernel (0: none).
    pub landlock_abi: i32,
    helper: PathBuf,
    bwrap: Option<PathBuf>,
    /// Existing directories hidden from user code.
    masked: Vec<PathBuf>,
    /// What user code sees of the host at `bwrap` and `landlock` (see [`view`]).
    view: view::View,
    /// Landlock-level read allowlist: the view, split around hidden trees (see
    /// [`landlock::read_roots`]).
    read_roots: Vec<PathBuf>,
    pool: Option<Arc<UidPool>>,
    /// A remembered bwrap success still to confirm (see [`probe`]).
    unverified: Mutex<Option<probe::ProbeCache>>,
    /// What can give a uid back when every one is in use, asked in order (the warm pool's
    /// interpreters, the kept files of ended sessions).
    reclaimers: Mutex<Vec<std::sync::Weak<dyn Reclaim>>>,
}

/// Something that holds uids it can let go of when the pool runs dry: the warm pool's
/// interpreters, the files of ended sessions kept readable as their uid for a while.
pub trait Reclaim: Send + Sync {
    /// Give back one uid `principal` may use (awaiting its release); false when there is
    /// none to give. A kept session's uid is bound to its owner unless the session was
    /// warm, so only the principal's own kept sessions and warm ones can give one; `own`:
    /// only one bound to `principal` helps (it has its most bound uids).
    fn reclaim<'a>(
        &'a self,
        principal: &'a str,
        own: bool,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + 'a>>;

    /// Whether what it gives back is a uid bound to the principal that asks (so it helps a
    /// principal that has its most bound uids).
    fn gives_own(&self) -> bool {
        false
    }
}

/// The egress proxy could not open a spawn's way out (the server's own failure).
#[derive(Debug, thiserror::Error)]
#[error("cannot open the egress proxy: {0}")]
pub struct ProxyError(std::io::Error);

impl From<ProxyError> for crate::error::ToolError {
    fn from(e: ProxyError) -> Self {
        Self::internal(e.to_string())
    }
}

impl Sandbox {
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
    /// `<prefix>`, anything else its directory. For the operator's Python virtual
    /// environment (`<venv>/bin/python` first on PATH, or `--python`), the environment as
    /// well as the interpreter it links to. Only for the operator's executables: this
    /// looks at the files with the server's rights (a caller's venv goes through
    /// `venv::inspect`, as the session's uid).
    pub fn interpreter_dirs(&self, exe: &Path) -> Vec<PathBuf> {
        if self.level == Level::None {
            return Vec::new();
        }
        let mut dirs = Vec::new();
        if let Some(root) = venv_root(exe) {
            dirs.extend(self.visible_prefix(&root, &root));
        }
        let exe = std::fs::canonicalize(exe).unwrap_or_else(|_| exe.to_path_buf());
        if let Some(dir) = exe.parent() {
            let prefix = if dir.file_name().is_some_and(|n| n == "bin") {
                dir.parent().unwrap_or(dir)
            } else {
                dir
            };
            if let Some(d) = self.visible_prefix(prefix, dir)
                && !dirs.contains(&d)
            {
                dirs.push(d);
            }
        }
        dirs
    }

    /// `prefix` to show when the view does not; `dir` (inside it) instead when `prefix` is
    /// a whole masked directory, which is never shown (an exe directly in /root/bin) or the
    /// root; nothing the view shows.
    fn visible_prefix(&self, prefix: &Path, dir: &Path) -> Option<PathBuf> {
        if self.view.shows(prefix) {
            return None;
        }
        if prefix == Path::new("/") || self.masked.iter().any(|m| m == prefix) {
            return (dir != prefix && !self.view.shows(dir)).then(|| dir.to_path_buf());
        }
        Some(prefix.to_path_buf())
    }

    /// The view of the host user code sees (empty at level none, which shows everything).
    pub fn view(&self) -> &view::View {
        &self.view
    }

    /// What the language's `reads` (host trees it reads besides its installation) stand for
    /// here that the view does not show.
    pub fn language_reads(&self, reads: &[String]) -> Vec<PathBuf> {
        if self.level == Level::None || reads.is_empty() {
            return Vec::new();
        }
        view::resolve_reads(reads)
            .into_iter()
            .filter(|p| !self.view.shows(p))
            .collect()
    }

    /// Why the `.venv` whose writers are `w` could be the doing of code of another
    /// principal than `principal` (`local`: the stdio principal, or HTTP without tokens):
    /// None when only the host's accounts (root, the operator, a project's owner) and
    /// sandbox uids bound to `principal` own it or may change it. As root, user code runs as
    /// the pool's uids, so one bound to another principal, or to none yet (any principal's
    /// run may hold it), could have planted it. Not root, every principal's code runs as the
    /// server's own uid and groups, so only the local principal, who is the server's user,
    /// may trust them.
    pub fn foreign_writer(
        &self,
        w: &crate::venv::Writers,
        principal: &str,
        local: bool,
    ) -> Option<String> {
        if let Some(what) = &w.anyone {
            return Some(what.clone());
        }
        let ids = w.uids.iter().map(|u| ("uid", *u));
        let ids = ids.chain(w.gids.iter().map(|g| ("group", *g)));
        match &self.pool {
            Some(pool) => {
                for (kind, id) in ids {
                    match pool.principal_of(id) {
                        None => {}
                        Some(Some(p)) if p == principal => {}
                        Some(Some(_)) => {
                            return Some(format!(
                                "{kind} {id}, a sandbox user bound to another principal, owns \
it or may change it"
                            ));
                        }
                        Some(None) => {
                            return Some(format!(
                                "{kind} {id}, a sandbox user any principal's code may run as, \
owns it or may change it"
                            ));
                        }
                    }
                }
                None
            }
            None if local => None,
            None => {
                let uid = rustix::process::geteuid().as_raw();
                let mut groups: Vec<u32> = rustix::process::getgroups()
                    .unwrap_or_default()
                    .iter()
                    .map(|g| g.as_raw())
                    .collect();
                groups.push(rustix::process::getegid().as_raw());
                ids.filter(|(kind, id)| {
                    if *kind == "uid" {
                        *id == uid
                    } else {
                        groups.contains(id)
                    }
                })
                .map(|(kind, id)| {
                    format!(
                        "{kind} {id}, the server's own, as which every principal's code runs, \
owns it or may change it"
                    )
                })
                .next()
            }
        }
    }

    /// Check the domains a caller asks for (`allow_domains`) against the operator's
    /// `--caller-domains`; a message for the agent when refused.
    pub fn check_caller_domains(
        &self,
        asked: &[String],
    ) -> Result<Vec<String>, crate::egress::EgressError> {
        match &self.egress {
            Some(e) => e.policy().check_caller(asked),
            None => crate::egress::Policy::default().check_caller(asked),
        }
    }

    /// A way to the egress proxy for one session or run of `principal` (`who` names it in
    /// the log; the principal's connections are capped together),
    /// allowing the operator's list and `extra` (checked by
    /// [`check_caller_domains`](Self::check_caller_domains)); None when that allows
    /// nothing. Inside bwrap a Unix socket the helper's bridge reaches, elsewhere a
    /// loopback port.
    pub fn egress_endpoint(
        &self,
        who: &str,
        principal: &str,
        extra: &[String],
    ) -> Result<Option<Arc<Endpoint>>, ProxyError> {
        let Some(e) = &self.egress else {
            return Ok(None);
        };
        if extra.is_empty() && !e.policy().grants_anything() {
            return Ok(None);
        }
        let ep = if self.wrapped() {
            e.unix(who, principal, extra)
        } else {
            e.tcp(who, principal, extra)
        };
        ep.map(|ep| Some(Arc::new(ep))).map_err(ProxyError)
    }

    /// Take a uid for one session or run of `holder` (None when the server is not root).
    /// At level none a run can write where its uid is reached afterwards (the host's /tmp,
    /// /dev/shm, any directory open to it): it binds its uid like a session, and work of no
    /// principal gets none.
    pub fn lease(&self, holder: Holder<'_>) -> Result<Option<Lease>, Refused> {
        let Some(pool) = &self.pool else {
            return Ok(None);
        };
        let holder = match holder {
            Holder::Visits(p) if self.level == Level::None => Holder::Binds(p),
            Holder::Nobody if self.level == Level::None => {
                return Err(Refused::Exhausted(
                    "at sandbox level none a uid goes to a principal's work only".into(),
                ));
            }
            h => h,
        };
        pool.clone()
            .acquire(self.level != Level::Bwrap, holder)
            .map(Some)
    }

    /// Whether interpreters may be started ahead of any principal (the warm pool): not when
    /// the server is root at level none, where each uid must be bound to the principal whose
    /// code runs as it before it runs (see [`lease`](Self::lease)).
    pub fn can_prestart(&self) -> bool {
        self.pool.is_none() || self.level != Level::None
    }

    /// Uids of the pool this server holds (0 when it does not run as root).
    pub fn uids_in_use(&self) -> usize {
        self.pool.as_ref().map_or(0, |p| p.in_use())
    }

    /// Like [`lease`](Self::lease), but when every uid is in use, first ask the reclaimers
    /// to give one back; when the principal has its most bound uids, only those that give
    /// back one of its own (its ended sessions').
    pub async fn lease_or_reclaim(&self, holder: Holder<'_>) -> Result<Option<Lease>, Refused> {
        let (Holder::Binds(principal) | Holder::Visits(principal)) = holder else {
            return self.lease(holder);
        };
        'lease: loop {
            match self.lease(holder) {
                Ok(l) => return Ok(l),
                Err(e) => {
                    let own = matches!(e, Refused::Bound(_));
                    let reclaimers: Vec<Arc<dyn Reclaim>> = self
                        .reclaimers
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .iter()
                        .filter_map(std::sync::Weak::upgrade)
                        .filter(|r| !own || r.gives_own())
                        .collect();
                    for r in reclaimers {
                        if r.reclaim(principal, own).await {
                            continue 'lease;
                        }
                    }
                    return Err(e);
                }
            }
        }
    }

    /// Add what gives uids back when the pool is dry (asked after those added before).
    pub fn add_reclaimer(&self, r: std::sync::Weak<dyn Reclaim>) {
        self.reclaimers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(r);
    }

    /// Whether uids run short: at most a quarter of them (at least 2) are free. Work done
    /// ahead of time (the warm pool) takes none then. Never short when not root.
    pub fn uids_short(&self) -> bool {
        self.pool.as_ref().is_some_and(|p| p.runs_short())
    }

    /// The existing directories hidden from user code (canonical): a caller's `cwd` may not
    /// lie in one unless the operator allows it (see `hostfs::check_cwd`).
    pub fn masked(&self) -> &[PathBuf] {
        &self.masked
    }

    /// Why the directory `dir` (canonical: a caller's cwd) may not be bound into the sandbox:
    /// at level bwrap it is mounted onto its path, and when that lies inside a tree the view
    /// shows, users other than root must not be able to change the way from there (see
    /// [`bwrap::check_dest`]). Elsewhere the way is bwrap's own; nothing is mounted at the
    /// other levels.
    pub(crate) fn check_bind(&self, dir: &Path) -> Result<(), BindError> {
        if !self.wrapped() {
            return Ok(());
        }
        bwrap::check_dest(dir, &bwrap::base_mounts(self), &bwrap::trusted_uids())
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
        let net = match (&self.egress, self.level) {
            (None, Level::None) => "network not restricted".to_string(),
            (None, _) => "no network".to_string(),
            (Some(e), _) if !e.policy().grants_anything() => format!(
                "no network unless a call asks for allow_domains among: {}",
                e.policy().callers.join(", ")
            ),
            (Some(e), level) => {
                format!(
                    "network only through the HTTP(S) proxy in HTTPS_PROXY, to {}{}",
                    e.policy().describe(),
                    if level == Level::None {
                        ", advisory at this level"
                    } else {
                        ""
                    }
                ) + &if e.policy().callers.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; a call may add allow_domains among: {}",
                        e.policy().callers.join(", ")
                    )
                }
            }
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

    /// Whether spawns go through bwrap.
    pub(crate) fn wrapped(&self) -> bool {
        self.level == Level::Bwrap && self.bwrap.is_some()
    }

    /// The command that runs the helper confined by this sandbox and `jail`, in `cwd`. The
    /// helper reads its program from [`PROGRAM_FD`] and reports on [`STATUS_FD`]; the
    /// command line holds nothing a caller chose but `cwd` (which the helper enters only
    /// after the uid drop, and bwrap binds by descriptor).
    pub fn command(&self, jail: &Jail, cwd: &Path, pty: bool) -> std::io::Result<CommandLine> {
        let mut args = self.exec_args(jail, cwd, pty);
        if !self.wrapped() {
            // A caller's directories get their Landlock rules from the handles opened when
            // they were decided, passed down to the helper.
            let mut fds = Vec::new();
            if args.landlock.is_some() {
                for (p, fd) in &jail.opened {
                    let n = bwrap::FIRST_BIND_FD + fds.len() as i32;
                    fds.push((fd.try_clone()?, n));
                    if jail.rw.contains(p) {
                        args.write_fds.push(n);
                        if p == cwd {
                            args.chdir_fd = Some(n);
                        }
                    } else {
                        args.read_fds.push(n);
                    }
                }
            }
            return Ok(CommandLine {
                program: self.helper.clone(),
                args: args.to_args(),
                wrapped: false,
                fds,
            });
        }
        bwrap::command(self, jail, &args)
    }

    /// The helper's arguments for one spawn.
    fn exec_args(&self, jail: &Jail, cwd: &Path, pty: bool) -> ExecArgs {
        let l = &self.limits;
        let mib = |v: u64| v.saturating_mul(1024 * 1024);
        let mut rlimits = Vec::new();
        if l.memory_mb > 0 {
            rlimits.push((Rlimit::Data, mib(l.memory_mb)));
        }
        if l.file_size_mb > 0 {
            rlimits.push((Rlimit::Fsize, mib(l.file_size_mb)));
        }
        rlimits.push((Rlimit::Nofile, l.open_files));
        if l.processes > 0 {
            // The kernel counts a uid's tasks per user namespace. A pool uid starts with
            // nothing running, and so does the uid in the user namespace bwrap makes when not
            // root. Otherwise the server's own uid already runs the server's threads and
            // whatever else its user runs, all counted against the limit.
            let nproc = if jail.uid.is_some() || self.wrapped() {
                l.processes
            } else {
                l.processes + crate::proc::tasks_of_uid(rustix::process::getuid().as_raw())
            };
            rlimits.push((Rlimit::Nproc, nproc));
        }
        if let Some(cpu) = jail.cpu_s {
            rlimits.push((Rlimit::Cpu, cpu));
        }
        // No POSIX message queue can be created, at any level (seccomp refuses the calls
        // too where it applies): a queue outlives its program in the host's IPC namespace
        // and counts against the host's `queues_max`, which one run could fill.
        rlimits.push((Rlimit::Msgqueue, 0));
        let mut args = ExecArgs {
            pty,
            status_fd: Some(STATUS_FD),
            program_fd: Some(PROGRAM_FD),
            chdir: Some(cwd.to_path_buf()),
            ids: jail.uid.map(|u| (u, u)),
            rlimits,
            ..ExecArgs::default()
        };
        if self.level >= Level::Landlock {
            args.landlock = Some(if self.level == Level::Landlock {
                LandlockMode::Required
            } else {
                LandlockMode::BestEffort
            });
            let (read, write) = landlock::rules(self.wrapped(), &self.read_roots, jail);
            args.read = read;
            args.write = write;
            args.proxy_port = jail.egress.as_ref().map(|e| e.port);
            args.proxy_socket = jail
                .egress
                .as_ref()
                .filter(|e| e.socket.is_some() && self.wrapped())
                .map(|_| PathBuf::from(bwrap::proxy_socket_inside(self)));
            args.seccomp = true;
            args.private_shm = (!self.wrapped()).then(|| mib(l.tmpfs_mb));
            // Without a pid namespace, /proc would show other users' command lines (a run's
            // arguments among them); bwrap gives the program a /proc of its own already.
            args.private_proc = !self.wrapped();
        }
        args
    }
}

/// Whether a user that is neither the owner nor in the group can execute `exe`: every
/// directory on the way must be searchable by others (on the way to `exe` as named, which
/// for a virtual environment's `bin/python` is the environment, and to the file it
/// resolves to), and the file executable by others.
pub fn reachable_by_others(exe: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let Ok(real) = std::fs::canonicalize(exe) else {
        return false;
    };
    let Ok(meta) = std::fs::metadata(&real) else {
        return false;
    };
    if meta.permissions().mode() & 0o001 == 0 {
        return false;
    }
    let searchable = |dir: &Path| {
        std::fs::metadata(dir)
            .map(|m| m.permissions().mode() & 0o001 != 0)
            .unwrap_or(false)
    };
    real.ancestors().skip(1).all(searchable)
        && (!exe.is_absolute() || exe.ancestors().skip(1).all(searchable))
}

/// The virtual environment `exe` belongs to, when it is `<venv>/bin/<name>` beside a
/// `<venv>/pyvenv.cfg` (canonical).
pub fn venv_root(exe: &Path) -> Option<PathBuf> {
    let bin = exe.parent()?;
    if bin.file_name()? != "bin" {
        return None;
    }
    let root = bin.parent()?;
    if !root.join("pyvenv.cfg").is_file() {
        return None;
    }
    std::fs::canonicalize(root).ok()
}
