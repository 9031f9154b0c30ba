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
use std::sync::Arc;

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};

mod error;
mod open;
mod policy;

pub use error::HostfsError;
pub use open::*;
pub use policy::*;

// ----- credentials -----

/// Run `f` with the filesystem rights of `uid` (None: the server's own) off the async
/// workers, and return what it returned.
pub async fn as_uid<T, F>(uid: Option<u32>, f: F) -> Result<T, HostfsError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    match uid {
        None => tokio::task::spawn_blocking(f)
            .await
            .map_err(HostfsError::Join),
        Some(uid) => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            spawn_as(
                uid,
                move |r| {
                    let _ = tx.send(r);
                },
                f,
            )?;
            rx.await.map_err(|_| HostfsError::Lost).and_then(|r| r)
        }
    }
}

/// Work for a uid's thread; told whether the thread took the uid's credentials.
type Job = Box<dyn FnOnce(Result<(), Arc<io::Error>>) + Send>;

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
fn spawn_as<T, F, R>(uid: u32, reply: R, f: F) -> Result<(), HostfsError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
    R: FnOnce(Result<T, HostfsError>) + Send + 'static,
{
    let mut job: Job = Box::new(move |creds: Result<(), Arc<io::Error>>| {
        reply(
            creds
                .map(|()| f())
                .map_err(|source| HostfsError::Credentials { uid, source }),
        )
    });
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
        .map_err(HostfsError::Thread)?;
    tx.send(job).map_err(|_| HostfsError::ThreadEnded)?;
    map.insert(uid, Worker { id, jobs: tx });
    Ok(())
}

fn worker(uid: u32, id: u64, rx: std::sync::mpsc::Receiver<Job>) {
    let creds = become_uid(uid).map_err(Arc::new);
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
    // This thread's only (glibc does not pass these on to the other threads). They return
    // the previous value, never an error, hence the checks below.
    nix::unistd::setfsgid(nix::unistd::Gid::from_raw(uid));
    nix::unistd::setfsuid(nix::unistd::Uid::from_raw(uid));
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
    let (fsuid, fsgid) = fs_ids();
    let groups = rustix::process::getgroups()?.len();
    let caps = rustix::thread::capabilities(None)?;
    if fsuid != uid
        || fsgid != uid
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

/// This thread's filesystem uid and gid (an invalid id, -1, changes nothing and returns the
/// current one).
fn fs_ids() -> (u32, u32) {
    let none = u32::MAX;
    (
        nix::unistd::setfsuid(nix::unistd::Uid::from_raw(none)).as_raw(),
        nix::unistd::setfsgid(nix::unistd::Gid::from_raw(none)).as_raw(),
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

    /// [`as_uid`] from a test's own thread, which may block.
    fn as_uid_blocking<T, F>(uid: Option<u32>, f: F) -> Result<T, HostfsError>
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
                rx.recv().map_err(|_| HostfsError::Lost).and_then(|r| r)
            }
        }
    }

    /// Whether a walk stopped at a link, a non-directory or a mount point.
    fn is_link_error(e: &io::Error) -> bool {
        matches!(
            e.raw_os_error(),
            Some(libc::ELOOP) | Some(libc::ENOTDIR) | Some(libc::EXDEV)
        )
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
        // The server's own threads kept their rights.
        assert_eq!(std::fs::read(&secret).unwrap(), b"s");
        let (fsuid, caps) = as_uid_blocking(Some(65_534), || {
            (
                fs_ids().0,
                rustix::thread::capabilities(None).unwrap().effective,
            )
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
                .to_string()
        };
        assert!(no("/proc/1").contains("never"));
        assert!(no("/run/user").contains("never"));
        assert!(no("/tmp/replbox-abc/sessions").contains("overlaps"));
        assert!(no("/").contains("contains"));
        // The exact line to add, with the path asked for.
        assert!(no("/root/.cargo").contains("`--allow-cwd /root/.cargo`"));
        assert!(no("/tmp/other").contains("--allow-cwd"));
        assert_eq!(
            no("/root/.cargo"),
            "cwd /root/.cargo is inside /root, which the sandbox hides from sessions (it holds \
other users' files, credentials or service sockets). The server's operator can allow it by adding \
`--allow-cwd /root/.cargo` to the server's arguments after `serve` (or REPLBOX_ALLOW_CWD; `replbox \
install --client NAME --project /root/.cargo` writes it into a client's configuration), for a cwd \
and for files to copy alike; otherwise use a path outside it"
        );
        assert_eq!(
            no("/proc/1"),
            "cwd /proc/1: /proc is never a session's directory (kernel and system runtime \
files); choose a directory of your data"
        );
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
