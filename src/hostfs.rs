//! Caller paths on the host: the only way the server touches a path a caller named (`cwd`,
//! `files`, resources) or a file session code can write (`out/` figures, a session's files).
//!
//! The server usually runs as root, so it never uses its own rights for them:
//! * [`as_uid`] runs the work on a thread of that uid's own, whose filesystem credentials are
//!   the session's uid (no supplementary groups, no capabilities at all), so the kernel
//!   decides with the session's rights. Without a lease (server not root) the session runs as the
//!   server's uid and nothing changes.
//! * [`open_beneath`] / [`create_beneath`] open one component at a time beneath a directory
//!   handle with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`
//!   (`O_NOFOLLOW` and a device check where openat2 is missing), so no link planted by user
//!   code is ever followed and a swapped directory is refused.
//! * Whatever is opened is refused on a kernel pseudo-filesystem ([`check_fs`]): a process of
//!   the server's own thread group may read the server's `/proc` files whatever its uid.
//! * [`check_caller_path`] is the one policy for every host path a caller names (system
//!   directories, workspaces, masked trees unless allowed, reachability by the session's
//!   uid), by name and by where it really leads: a `cwd` or `venv` ([`check_caller_dir`]), a
//!   file to copy in ([`open_caller_file`]).

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};

use crate::workspace::WORKSPACE_MARKER;

/// Directories never used as a `cwd`, whatever the operator allows: kernel interfaces and
/// the runtime state of system services (sockets, other servers' uid locks).
const SYSTEM_DIRS: &[&str] = &["/proc", "/sys", "/dev", "/run"];

// ----- credentials -----

/// Run `f` with the filesystem rights of `uid` (None: the server's own) off the async
/// workers, and return what it returned.
pub async fn as_uid<T, F>(uid: Option<u32>, f: F) -> Result<T, String>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    match uid {
        None => tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| format!("the file work failed: {e}")),
        Some(uid) => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            spawn_as(
                uid,
                move |r| {
                    let _ = tx.send(r);
                },
                f,
            )?;
            rx.await
                .map_err(|_| "the file work failed".to_string())
                .and_then(|r| r)
        }
    }
}

/// [`as_uid`] for callers that may block (already off the async workers).
pub fn as_uid_blocking<T, F>(uid: Option<u32>, f: F) -> Result<T, String>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    match uid {
        None => Ok(f()),
        Some(uid) => {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            spawn_as(
                uid,
                move |r| {
                    let _ = tx.send(r);
                },
                f,
            )?;
            rx.recv()
                .map_err(|_| "the file work failed".to_string())
                .and_then(|r| r)
        }
    }
}

/// Work for a uid's thread; told whether the thread took the uid's credentials.
type Job = Box<dyn FnOnce(Result<(), String>) + Send>;

/// One thread per uid in use, whose credentials are that uid's for its whole life: the
/// credentials of a thread are changed with per-thread system calls (glibc's setuid and
/// setgroups would change every thread of the server), and a thread never serves another
/// uid, so nothing it became leaks into the server's other work. A thread idle for
/// [`WORKER_IDLE`] ends. Reusing it saves a thread start per evaluation (about 0.1 ms).
struct Worker {
    /// Tells this worker from a later one for the same uid.
    id: u64,
    jobs: std::sync::mpsc::Sender<Job>,
}

static WORKERS: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<u32, Worker>>> =
    std::sync::LazyLock::new(Default::default);
static NEXT_WORKER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
const WORKER_IDLE: std::time::Duration = std::time::Duration::from_secs(10);

fn workers() -> std::sync::MutexGuard<'static, std::collections::HashMap<u32, Worker>> {
    WORKERS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Run `f` on `uid`'s thread and hand its result (or why it could not run) to `reply`.
fn spawn_as<T, F, R>(uid: u32, reply: R, f: F) -> Result<(), String>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
    R: FnOnce(Result<T, String>) + Send + 'static,
{
    let mut job: Job = Box::new(move |creds: Result<(), String>| reply(creds.map(|()| f())));
    // Jobs are sent under the lock, so a worker that removed itself gets no more.
    let mut map = workers();
    if let Some(w) = map.get(&uid) {
        match w.jobs.send(job) {
            Ok(()) => return Ok(()),
            Err(std::sync::mpsc::SendError(back)) => {
                map.remove(&uid);
                job = back;
            }
        }
    }
    let (tx, rx) = std::sync::mpsc::channel::<Job>();
    let id = NEXT_WORKER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::thread::Builder::new()
        .name(format!("replbox-uid-{uid}"))
        .spawn(move || worker(uid, id, rx))
        .map_err(|e| format!("cannot start a thread for file work: {e}"))?;
    tx.send(job)
        .map_err(|_| "the file work thread ended at once".to_string())?;
    map.insert(uid, Worker { id, jobs: tx });
    Ok(())
}

fn worker(uid: u32, id: u64, rx: std::sync::mpsc::Receiver<Job>) {
    let creds = become_uid(uid)
        .map_err(|e| format!("cannot take the session's user id {uid} for file work: {e}"));
    let run = |job: Job| {
        // A panicking job drops its reply (its caller sees an error); the thread goes on.
        let c = creds.clone();
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || job(c)));
    };
    loop {
        match rx.recv_timeout(WORKER_IDLE) {
            Ok(job) => run(job),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                {
                    let mut map = workers();
                    if map.get(&uid).is_some_and(|w| w.id == id) {
                        map.remove(&uid);
                    }
                }
                // Jobs sent before the removal still run.
                while let Ok(job) = rx.try_recv() {
                    run(job);
                }
                return;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Make this thread's filesystem credentials `uid`/`uid` (the pool's gid is its uid), with no
/// supplementary group and no capability; checked before returning.
fn become_uid(uid: u32) -> io::Result<()> {
    rustix::thread::set_thread_groups(&[])?;
    // SAFETY: setfsgid/setfsuid take an integer and change only this thread's credentials.
    // They return the previous value, never an error, hence the checks below.
    unsafe {
        libc::syscall(libc::SYS_setfsgid, uid as libc::c_long);
        libc::syscall(libc::SYS_setfsuid, uid as libc::c_long);
    }
    // A fsuid change drops the DAC capabilities only; CAP_SYS_PTRACE (which /proc checks),
    // CAP_SYS_ADMIN and the rest would stay.
    let none = rustix::thread::CapabilitySet::empty();
    rustix::thread::set_capabilities(
        None,
        rustix::thread::CapabilitySets {
            effective: none,
            permitted: none,
            inheritable: none,
        },
    )?;
    // SAFETY: an invalid id (-1) changes nothing and returns the current one.
    let (fsuid, fsgid) = unsafe {
        (
            libc::syscall(libc::SYS_setfsuid, -1 as libc::c_long),
            libc::syscall(libc::SYS_setfsgid, -1 as libc::c_long),
        )
    };
    // SAFETY: with a size of 0, getgroups only returns the count.
    let groups = unsafe { libc::syscall(libc::SYS_getgroups, 0, std::ptr::null_mut::<u32>()) };
    let caps = rustix::thread::capabilities(None)?;
    if fsuid != uid as libc::c_long
        || fsgid != uid as libc::c_long
        || groups != 0
        || !caps.effective.is_empty()
        || !caps.permitted.is_empty()
    {
        return Err(io::Error::other(format!(
            "the credentials did not take (fsuid {fsuid}, fsgid {fsgid}, {groups} groups)"
        )));
    }
    Ok(())
}

// ----- opening beneath a handle -----

/// Kernel pseudo-filesystems: nothing on them is a session's file (`/proc/<server>/environ`
/// is readable by any thread of the server, whatever its uid).
const PSEUDO_FS: &[(i64, &str)] = &[
    (0x9fa0, "proc"),
    (0x6265_6572, "sysfs"),
    (0x1cd1, "devpts"),
    (0x0027_e0eb, "cgroup"),
    (0x6367_7270, "cgroup2"),
    (0x6462_6720, "debugfs"),
    (0x7363_6673, "securityfs"),
    (0x7472_6163, "tracefs"),
    (0xcafe_4a11, "bpf"),
    (0x6265_6570, "configfs"),
    (0x6165_676c, "pstore"),
    (0xde5e_81e4, "efivarfs"),
    (0xf97c_ff8c, "selinuxfs"),
    (0x4341_5d53, "smackfs"),
    (0x4249_4e4d, "binfmt_misc"),
    (0x6e73_6673, "nsfs"),
    (0x6573_5543, "fusectl"),
    (0x1980_0202, "mqueue"),
];

/// The pseudo-filesystem `fd` lies on, if any.
pub fn pseudo_fs(fd: BorrowedFd<'_>) -> io::Result<Option<&'static str>> {
    let st = rustix::fs::fstatfs(fd)?;
    let kind = st.f_type as i64;
    Ok(PSEUDO_FS.iter().find(|(m, _)| *m == kind).map(|(_, n)| *n))
}

/// Refuse what lies on a kernel pseudo-filesystem.
pub fn check_fs(fd: BorrowedFd<'_>) -> io::Result<()> {
    match pseudo_fs(fd)? {
        Some(name) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("it is on the kernel's {name} filesystem, which is never served"),
        )),
        None => Ok(()),
    }
}

/// How [`open_beneath`] walks.
#[derive(Debug, Clone, Default)]
pub struct Walk {
    /// Stay on the handle's filesystem (no mount point crossed).
    pub same_mount: bool,
    /// Directories (device, inode) never entered.
    pub forbidden: Vec<crate::workspace::DirId>,
    /// Enter replbox workspaces (only on the way to the server's own directories).
    pub into_workspaces: bool,
}

/// Whether a walk stopped at a link, a non-directory or a mount point (for messages).
pub fn is_link_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ELOOP) | Some(libc::ENOTDIR) | Some(libc::EXDEV)
    )
}

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// openat2 is missing (older kernels, some seccomp profiles): fall back to `O_NOFOLLOW`.
static NO_OPENAT2: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Open one path component `name` beneath `dir`, following no link.
fn open_one(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    flags: OFlags,
    mode: Mode,
    walk: &Walk,
) -> io::Result<OwnedFd> {
    if name.is_empty() || name == ".." || name.as_bytes().contains(&b'/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a plain name",
        ));
    }
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    if !NO_OPENAT2.load(std::sync::atomic::Ordering::Relaxed) {
        let mut resolve = RESOLVE;
        if walk.same_mount {
            resolve |= ResolveFlags::NO_XDEV;
        }
        match rustix::fs::openat2(dir, name, flags, mode, resolve) {
            Err(rustix::io::Errno::NOSYS) => {
                NO_OPENAT2.store(true, std::sync::atomic::Ordering::Relaxed)
            }
            Err(e) => return Err(e.into()),
            Ok(fd) => return Ok(fd),
        }
    }
    let fd = rustix::fs::openat(dir, name, flags, mode)?;
    if walk.same_mount && rustix::fs::fstat(&fd)?.st_dev != rustix::fs::fstat(dir)?.st_dev {
        return Err(io::Error::from_raw_os_error(libc::EXDEV));
    }
    Ok(fd)
}

/// Open the directory `name` beneath `dir` (`O_PATH` when `path_only`), refusing links,
/// forbidden directories, other servers' workspaces and pseudo-filesystems.
fn open_dir(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    path_only: bool,
    walk: &Walk,
) -> io::Result<OwnedFd> {
    let flags = OFlags::DIRECTORY
        | if path_only {
            OFlags::PATH
        } else {
            OFlags::RDONLY
        };
    let fd = open_one(dir, name, flags, Mode::empty(), walk)?;
    check_dir(fd.as_fd(), walk)?;
    Ok(fd)
}

/// The directory `root` itself, opened for reading its entries (after the same checks).
pub fn open_dir_beneath(root: BorrowedFd<'_>, walk: &Walk) -> io::Result<OwnedFd> {
    open_dir(root, OsStr::new("."), false, walk)
}

/// The subdirectory `name` of `dir`, opened for reading its entries (no link, no forbidden
/// directory, no workspace, no pseudo-filesystem; on the same mount with `walk.same_mount`).
pub fn open_subdir(dir: BorrowedFd<'_>, name: &str, walk: &Walk) -> io::Result<OwnedFd> {
    open_dir(dir, OsStr::new(name), false, walk)
}

fn check_dir(fd: BorrowedFd<'_>, walk: &Walk) -> io::Result<()> {
    check_fs(fd)?;
    if !walk.forbidden.is_empty() {
        let st = rustix::fs::fstat(fd)?;
        if walk
            .forbidden
            .contains(&crate::workspace::DirId::from_stat(&st))
        {
            return Err(refused("the server's own directories are not served"));
        }
    }
    if !walk.into_workspaces && is_workspace(fd) {
        return Err(refused("a replbox server's working area is not served"));
    }
    Ok(())
}

fn refused(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, msg.to_string())
}

/// Whether the directory `fd` is the root of a replbox workspace.
pub fn is_workspace(fd: BorrowedFd<'_>) -> bool {
    rustix::fs::statat(fd, WORKSPACE_MARKER, AtFlags::SYMLINK_NOFOLLOW).is_ok()
}

/// Open the regular file `parts` (checked by [`check_relative`](crate::workspace::check_relative))
/// beneath the directory `root`, read-only and non-blocking (a FIFO planted under the name
/// must not hang the server), following no link.
pub fn open_beneath(root: BorrowedFd<'_>, parts: &[&str], walk: &Walk) -> io::Result<File> {
    let Some((last, dirs)) = parts.split_last() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no file named"));
    };
    check_dir(root, walk)?;
    let mut held: Option<OwnedFd> = None;
    for d in dirs {
        let next = open_dir(
            held.as_ref().map_or(root, |f| f.as_fd()),
            OsStr::new(d),
            true,
            walk,
        )?;
        held = Some(next);
    }
    let parent = held.as_ref().map_or(root, |f| f.as_fd());
    let fd = open_one(
        parent,
        OsStr::new(last),
        OFlags::RDONLY | OFlags::NONBLOCK,
        Mode::empty(),
        walk,
    )?;
    check_fs(fd.as_fd())?;
    let file = File::from(fd);
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(file)
}

/// Create the new regular file `parts` beneath `root` (mode 0644, directories on the way
/// 0755 as needed), following no link and overwriting nothing: `O_CREAT | O_EXCL` fails on
/// any existing name, a dangling link included. Returns the file and the directories made.
pub fn create_beneath(root: BorrowedFd<'_>, parts: &[&str]) -> io::Result<(File, Vec<String>)> {
    let Some((last, dirs)) = parts.split_last() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no file named"));
    };
    let walk = Walk::default();
    check_dir(root, &walk)?;
    let mut made = Vec::new();
    let mut held: Option<OwnedFd> = None;
    for (i, d) in dirs.iter().enumerate() {
        let parent = held.as_ref().map_or(root, |f| f.as_fd());
        match rustix::fs::mkdirat(parent, *d, Mode::from_raw_mode(0o755)) {
            Ok(()) => made.push(dirs[..=i].join("/")),
            Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        let next = open_dir(parent, OsStr::new(d), true, &walk)?;
        held = Some(next);
    }
    let parent = held.as_ref().map_or(root, |f| f.as_fd());
    let fd = open_one(
        parent,
        OsStr::new(last),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
        Mode::from_raw_mode(0o644),
        &walk,
    )?;
    Ok((File::from(fd), made))
}

/// Remove the file (or, with `dir`, the empty directory) `parts` beneath `root`, following
/// no link on the way.
pub fn remove_beneath(root: BorrowedFd<'_>, parts: &[&str], dir: bool) -> io::Result<()> {
    let Some((last, dirs)) = parts.split_last() else {
        return Ok(());
    };
    let walk = Walk::default();
    let mut held: Option<OwnedFd> = None;
    for d in dirs {
        let next = open_dir(
            held.as_ref().map_or(root, |f| f.as_fd()),
            OsStr::new(d),
            true,
            &walk,
        )?;
        held = Some(next);
    }
    let parent = held.as_ref().map_or(root, |f| f.as_fd());
    let flags = if dir {
        AtFlags::REMOVEDIR
    } else {
        AtFlags::empty()
    };
    Ok(rustix::fs::unlinkat(parent, *last, flags)?)
}

/// A directory handle (`O_PATH`) on `path`, opened as the calling thread's user, following no
/// link anywhere on the way and refusing pseudo-filesystems: for the server's own directories
/// that user code can write (`work/`, `out/`).
pub fn open_dir_path(path: &Path) -> io::Result<OwnedFd> {
    let walk = Walk {
        into_workspaces: true,
        ..Walk::default()
    };
    let (fd, _) = walk_path(path, &walk).map_err(|(e, _)| e)?;
    Ok(fd)
}

/// Open the absolute, canonical `path` component by component from `/` (`O_PATH`), following
/// no link; on failure, also the deepest directory reached (for messages).
fn walk_path(path: &Path, walk: &Walk) -> Result<(OwnedFd, PathBuf), (io::Error, PathBuf)> {
    let mut at = PathBuf::from("/");
    let root = rustix::fs::open(
        "/",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| (e.into(), at.clone()))?;
    let mut fd = root;
    for c in path.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(name) => {
                let next = open_dir(fd.as_fd(), name, true, walk).map_err(|e| (e, at.clone()))?;
                fd = next;
                at.push(name);
            }
            _ => {
                return Err((
                    io::Error::new(io::ErrorKind::InvalidInput, "not a canonical path"),
                    at,
                ));
            }
        }
    }
    Ok((fd, at))
}

/// Open a file of the host (an absolute path) as the calling thread's user: ordinary links
/// are followed with that user's rights, magic links (`/proc/self/fd/...`) are not, and
/// nothing on a pseudo-filesystem is read. No policy: a caller's path goes through
/// [`open_caller_file`].
pub fn open_host_file(path: &Path) -> io::Result<File> {
    if !path.is_absolute() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "give an absolute path",
        ));
    }
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = match rustix::fs::openat2(
        rustix::fs::CWD,
        path,
        flags,
        Mode::empty(),
        ResolveFlags::NO_MAGICLINKS,
    ) {
        Err(rustix::io::Errno::NOSYS) => {
            // Without openat2, the canonical path is opened from `/` following nothing.
            let real = std::fs::canonicalize(path)?;
            let parent = real.parent().unwrap_or(Path::new("/"));
            let (dir, _) = walk_path(parent, &Walk::default()).map_err(|(e, _)| e)?;
            let name = real.file_name().unwrap_or_default();
            open_one(dir.as_fd(), name, flags, Mode::empty(), &Walk::default())?
        }
        r => r?,
    };
    regular_file(fd)
}

/// `fd` as a file, when it is a regular one and not on a pseudo-filesystem.
fn regular_file(fd: OwnedFd) -> io::Result<File> {
    check_fs(fd.as_fd())?;
    let file = File::from(fd);
    let meta = file.metadata()?;
    if meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "is a directory; to work in a folder pass it as cwd",
        ));
    }
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(file)
}

/// Whether the calling thread's user may `access` (`R_OK`, `W_OK`, `X_OK` bits) the directory
/// `fd`, with its effective (filesystem) rights.
pub fn may(fd: BorrowedFd<'_>, access: rustix::fs::Access) -> bool {
    rustix::fs::accessat(fd, ".", access, AtFlags::EACCESS).is_ok()
}

// ----- the cwd policy -----

/// How messages name the user a session's file work runs as.
pub fn user_name(uid: Option<u32>) -> String {
    match uid {
        Some(u) => format!("the session's user (uid {u})"),
        None => "the server's user".to_string(),
    }
}

/// What decides whether a caller's `cwd` is acceptable: trusted operator settings.
#[derive(Debug, Clone, Default)]
pub struct CwdPolicy {
    /// This server's workspace (canonical).
    pub workspace: PathBuf,
    /// Trees hidden from user code (canonical): the defaults and `--mask`.
    pub masked: Vec<PathBuf>,
    /// Trees the operator allows as a `cwd` although masked (`--allow-cwd`, canonical).
    pub allowed: Vec<PathBuf>,
}

/// An accepted `cwd`.
#[derive(Debug)]
pub struct Cwd {
    /// Canonical.
    pub path: PathBuf,
    /// Its handle (`O_PATH`), opened as the session's user.
    pub dir: OwnedFd,
    /// Whether the session's user may create files there.
    pub writable: bool,
}

impl CwdPolicy {
    /// The policy for a server with this workspace, masked trees and `--allow-cwd` trees
    /// (made canonical here, as the operator's paths may go through links).
    pub fn new(workspace: &Path, masked: &[PathBuf], allowed: &[PathBuf]) -> Self {
        let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| lexical(p));
        Self {
            workspace: canonical(workspace),
            masked: masked.iter().map(|p| canonical(p)).collect(),
            allowed: allowed.iter().map(|p| canonical(p)).collect(),
        }
    }

    /// Why `path` (absolute, free of `.`/`..`) may not be a caller's directory (`what`:
    /// `cwd`, `venv`), by its name alone.
    pub fn refuse(&self, path: &Path, shown: &Path, what: &str) -> Result<(), String> {
        let p = format!("{what} {}", shown.display());
        for sys in SYSTEM_DIRS {
            if path.starts_with(sys) {
                return Err(format!(
                    "{p}: {sys} is never a session's directory (kernel and system runtime \
files); choose a directory of your data"
                ));
            }
            if Path::new(sys).starts_with(path) {
                return Err(format!(
                    "{p} contains {sys} (kernel and system runtime files), which is never \
part of a session's directory; choose a directory of your data"
                ));
            }
        }
        if path.starts_with(&self.workspace) || self.workspace.starts_with(path) {
            return Err(format!(
                "{p} overlaps the server's own working area {}: give a directory outside it",
                self.workspace.display()
            ));
        }
        if let Some(ws) = path.ancestors().find(|a| looks_like_workspace(a)) {
            return Err(format!(
                "{p} is inside another replbox server's working area {}: give a directory \
outside it",
                ws.display()
            ));
        }
        for m in &self.masked {
            if m.starts_with(path) && m != path {
                return Err(format!(
                    "{p} contains {}, which the sandbox hides from sessions; give a \
directory that does not contain it",
                    m.display()
                ));
            }
            if path.starts_with(m) && !self.allowed.iter().any(|a| path.starts_with(a)) {
                return Err(format!(
                    "{p} is inside {}, which the sandbox hides from sessions (it holds other \
users' files, credentials or service sockets). The server's operator can allow a tree there with \
--allow-cwd DIR (or REPLBOX_ALLOW_CWD), for a cwd and for files to copy alike; otherwise use a \
path outside it",
                    m.display()
                ));
            }
        }
        Ok(())
    }
}

/// A directory named like a workspace root (`replbox-*`) with its `sessions` and `runs`.
fn looks_like_workspace(dir: &Path) -> bool {
    dir.file_name()
        .is_some_and(|n| n.as_bytes().starts_with(b"replbox-"))
        && dir.join("sessions").is_dir()
        && dir.join("runs").is_dir()
        || std::fs::symlink_metadata(dir.join(WORKSPACE_MARKER)).is_ok()
}

/// `path` made absolute lexically, without `.` and `..` (which are resolved as names: the
/// canonical form is checked again after resolving links).
pub fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

/// Decide a caller's `cwd`, run as the session's user (through [`as_uid`]): refused when it is
/// a system directory, overlaps a replbox workspace, lies in or contains a masked tree (unless
/// the operator allowed it) or is not reachable by that user on the host; otherwise its
/// canonical path, a handle, and whether the session may write there. `uid` only names the
/// user in messages.
pub fn check_cwd(policy: &CwdPolicy, requested: &Path, uid: Option<u32>) -> Result<Cwd, String> {
    check_caller_dir(policy, requested, uid, "cwd")
}

/// The one policy for every host path a caller names (`what` names it in messages: `cwd`,
/// `venv`, `path`), run as the session's user (`user` names it): an absolute path, refused
/// by its name (system directories, replbox workspaces, masked trees unless `--allow-cwd`
/// allows them), then by where it really leads once links are resolved with that user's
/// rights. Returns the canonical path, which the caller then opens following no link, so
/// that a link swapped in afterwards is refused rather than followed.
pub fn check_caller_path(
    policy: &CwdPolicy,
    requested: &Path,
    user: &str,
    what: &str,
) -> Result<PathBuf, String> {
    let shown = format!("{what} {}", requested.display());
    if !requested.is_absolute() {
        return Err(format!("{shown}: give an absolute path"));
    }
    if requested.as_os_str().as_bytes().contains(&0) {
        return Err(format!("{what} contains a NUL byte"));
    }
    let lex = lexical(requested);
    policy.refuse(&lex, requested, what)?;
    let real = std::fs::canonicalize(requested).map_err(|e| match e.raw_os_error() {
        Some(libc::EACCES) => unreachable_message(&shown, &lex, user),
        _ if what == "path" => cannot_read(requested, user, e),
        _ => format!("{shown}: {e}"),
    })?;
    policy.refuse(&real, requested, what)?;
    Ok(real)
}

/// Open the host file a caller named (`files[].path`) as the calling thread's user (run it
/// through [`as_uid`]), after [`check_caller_path`]: the canonical path that passed is opened
/// from `/` following no link, so what is read is what was checked.
pub fn open_caller_file(policy: &CwdPolicy, requested: &Path, user: &str) -> Result<File, String> {
    let shown = format!("path {}", requested.display());
    let real = check_caller_path(policy, requested, user, "path")?;
    let (Some(parent), Some(name)) = (real.parent(), real.file_name()) else {
        return Err(format!("{shown}: not a file"));
    };
    let (dir, _) =
        walk_path(parent, &Walk::default()).map_err(|(e, at)| match e.raw_os_error() {
            Some(libc::EACCES) => cannot_enter(&shown, &at, user),
            Some(libc::ELOOP) | Some(libc::ENOTDIR) => {
                format!("{shown} changed while it was checked (a link appeared); try again")
            }
            _ => cannot_read(requested, user, e),
        })?;
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd =
        open_one(dir.as_fd(), name, flags, Mode::empty(), &Walk::default()).map_err(|e| match e
            .raw_os_error()
        {
            Some(libc::ELOOP) => {
                format!("{shown} changed while it was checked (a link appeared); try again")
            }
            _ => cannot_read(requested, user, e),
        })?;
    regular_file(fd).map_err(|e| cannot_read(requested, user, e))
}

fn cannot_read(requested: &Path, user: &str, e: io::Error) -> String {
    format!("path: cannot read {} as {user}: {e}", requested.display())
}

/// [`check_cwd`] for any directory a caller names (`what` names it in messages: `cwd`,
/// `venv`): the one policy for a caller's directories.
pub fn check_caller_dir(
    policy: &CwdPolicy,
    requested: &Path,
    uid: Option<u32>,
    what: &str,
) -> Result<Cwd, String> {
    let shown = format!("{what} {}", requested.display());
    let user = user_name(uid);
    let real = check_caller_path(policy, requested, &user, what)?;
    let (dir, _) =
        walk_path(&real, &Walk::default()).map_err(|(e, at)| match e.raw_os_error() {
            Some(libc::EACCES) => cannot_enter(&shown, &at, &user),
            Some(libc::ELOOP) | Some(libc::ENOTDIR) => {
                format!("{shown} changed while it was checked (a link appeared); try again")
            }
            _ => format!("{shown}: {e}"),
        })?;
    if !rustix::fs::fstat(&dir)
        .map(|st| {
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory
        })
        .unwrap_or(false)
    {
        return Err(format!("{shown} is not a directory"));
    }
    if !may(dir.as_fd(), rustix::fs::Access::EXEC_OK) {
        return Err(cannot_enter(&shown, &real, &user));
    }
    let writable = may(
        dir.as_fd(),
        rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK,
    );
    Ok(Cwd {
        path: real,
        dir,
        writable,
    })
}

/// The message for a path the session's user cannot resolve (`shown`: what and which): names
/// the first directory on the way it may not search.
fn unreachable_message(shown: &str, lex: &Path, user: &str) -> String {
    cannot_enter(shown, &first_unsearchable(lex), user)
}

/// The first directory on the way to `lex` that the calling thread's user may not search
/// (`lex` itself when there is none).
pub fn first_unsearchable(lex: &Path) -> PathBuf {
    let mut at = PathBuf::from("/");
    let mut blocked = PathBuf::from("/");
    for c in lex.components() {
        if let Component::Normal(n) = c {
            let ok = rustix::fs::accessat(
                rustix::fs::CWD,
                &at,
                rustix::fs::Access::EXEC_OK,
                AtFlags::EACCESS,
            )
            .is_ok();
            if !ok {
                blocked = at.clone();
                break;
            }
            at.push(n);
            blocked = at.clone();
        }
    }
    blocked
}

fn cannot_enter(shown: &str, blocked: &Path, user: &str) -> String {
    format!(
        "{shown}: {user} cannot enter it: {} is not searchable by that user on this host. Give \
the directories on the way search permission for others (chmod o+x {}) or choose another \
directory",
        blocked.display(),
        blocked.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;

    fn root() -> bool {
        let r = rustix::process::geteuid().is_root();
        if !r {
            eprintln!("SKIP: the credential tests need root");
        }
        r
    }

    #[test]
    fn as_uid_really_cannot_read_a_root_only_file() {
        if !root() {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let secret = d.path().join("secret");
        std::fs::write(&secret, "s").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let p = secret.clone();
        let r = as_uid_blocking(Some(65_534), move || {
            std::fs::read(&p).map_err(|e| e.kind())
        })
        .unwrap();
        assert_eq!(r, Err(io::ErrorKind::PermissionDenied));
        // Nor the server's own environment (CAP_SYS_PTRACE is gone too; the same thread group
        // may read it, which is why pseudo-filesystems are refused as well).
        let pid = std::process::id();
        let r = as_uid_blocking(Some(65_534), move || {
            open_host_file(Path::new(&format!("/proc/{pid}/environ"))).map(|_| ())
        })
        .unwrap();
        assert!(r.is_err());
        // The server's own threads kept their rights.
        assert_eq!(std::fs::read(&secret).unwrap(), b"s");
        let (fsuid, caps) = as_uid_blocking(Some(65_534), || {
            // SAFETY: -1 changes nothing and returns the current fsuid.
            let f = unsafe { libc::syscall(libc::SYS_setfsuid, -1 as libc::c_long) };
            (f, rustix::thread::capabilities(None).unwrap().effective)
        })
        .unwrap();
        assert_eq!(fsuid, 65_534);
        assert!(caps.is_empty());
        assert!(
            !rustix::thread::capabilities(None)
                .unwrap()
                .effective
                .is_empty()
        );
    }

    #[test]
    fn create_beneath_refuses_a_symlinked_component_and_existing_names() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("lnk")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("new"), root.path().join("dangling"))
            .unwrap();
        let fd = open_dir_path(&std::fs::canonicalize(root.path()).unwrap()).unwrap();
        let e = create_beneath(fd.as_fd(), &["lnk", "f"]).unwrap_err();
        assert!(is_link_error(&e), "{e}");
        assert!(create_beneath(fd.as_fd(), &["dangling"]).is_err());
        assert!(!outside.path().join("f").exists());
        assert!(!outside.path().join("new").exists());
        let (mut f, made) = create_beneath(fd.as_fd(), &["a", "b", "c.txt"]).unwrap();
        std::io::Write::write_all(&mut f, b"ok").unwrap();
        assert_eq!(made, vec!["a".to_string(), "a/b".to_string()]);
        assert!(
            create_beneath(fd.as_fd(), &["a", "b", "c.txt"]).is_err(),
            "no overwrite"
        );
        let mut s = String::new();
        open_beneath(fd.as_fd(), &["a", "b", "c.txt"], &Walk::default())
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        assert_eq!(s, "ok");
        assert!(open_beneath(fd.as_fd(), &["lnk", "x"], &Walk::default()).is_err());
        remove_beneath(fd.as_fd(), &["a", "b", "c.txt"], false).unwrap();
        remove_beneath(fd.as_fd(), &["a", "b"], true).unwrap();
        assert!(!root.path().join("a/b").exists());
    }

    #[test]
    fn pseudo_filesystems_are_refused() {
        let proc_fd =
            rustix::fs::open("/proc", OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
        assert_eq!(pseudo_fs(proc_fd.as_fd()).unwrap(), Some("proc"));
        assert!(check_fs(proc_fd.as_fd()).is_err());
        let e = open_beneath(proc_fd.as_fd(), &["self", "environ"], &Walk::default()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert!(open_host_file(Path::new("/proc/self/environ")).is_err());
        assert!(
            open_host_file(Path::new("/dev/fd/0")).is_err(),
            "magic link"
        );
        if Path::new("/sys/kernel").is_dir() {
            let sys =
                rustix::fs::open("/sys", OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
            assert_eq!(pseudo_fs(sys.as_fd()).unwrap(), Some("sysfs"));
        }
        let tmp = tempfile::tempdir().unwrap();
        let fd = open_dir_path(&std::fs::canonicalize(tmp.path()).unwrap()).unwrap();
        assert!(check_fs(fd.as_fd()).is_ok());
    }

    #[test]
    fn the_cwd_policy_refuses_by_name() {
        let policy = CwdPolicy {
            workspace: "/tmp/replbox-abc".into(),
            masked: vec!["/root".into(), "/tmp".into()],
            allowed: vec!["/tmp/allowed".into()],
        };
        let no = |p: &str| {
            policy
                .refuse(Path::new(p), Path::new(p), "cwd")
                .unwrap_err()
        };
        assert!(no("/proc/1").contains("never"));
        assert!(no("/run/user").contains("never"));
        assert!(no("/tmp/replbox-abc/sessions").contains("overlaps"));
        assert!(no("/").contains("contains"));
        assert!(no("/root/.cargo").contains("--allow-cwd"));
        assert!(no("/tmp/other").contains("--allow-cwd"));
        assert!(
            policy
                .refuse(Path::new("/tmp/allowed/x"), Path::new("/x"), "cwd")
                .is_ok()
        );
        assert!(
            policy
                .refuse(Path::new("/etc"), Path::new("/etc"), "cwd")
                .is_ok()
        );
        assert_eq!(lexical(Path::new("/a/./b/../c")), PathBuf::from("/a/c"));
    }
}
