//! The child-side layers, in the order they are applied just before `exec`: rlimits; the
//! private /dev/shm and /proc; the uid drop; `chdir`; Landlock; seccomp; closing inherited
//! descriptors. Prepared in the helper before it forks (so errors are reported with
//! context), applied in the child.

use std::path::{Path, PathBuf};

use ::landlock::{RulesetCreated, RulesetStatus};
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::unistd::{Gid, Uid};
use seccompiler::BpfProgram;

use crate::args::{ExecArgs, LandlockMode, Rlimit};
use crate::{landlock, seccomp};

pub struct Confinement {
    rlimits: Vec<(Rlimit, u64)>,
    private_shm: Option<u64>,
    private_proc: bool,
    ids: Option<(u32, u32)>,
    chdir: Option<PathBuf>,
    chdir_fd: Option<i32>,
    landlock: Option<(RulesetCreated, LandlockMode)>,
    seccomp: Vec<BpfProgram>,
}

impl Confinement {
    pub fn prepare(args: &ExecArgs) -> Result<Self, String> {
        let landlock = match args.landlock {
            Some(mode) => Some((
                landlock::ruleset(args).map_err(|e| format!("landlock: {e}"))?,
                mode,
            )),
            None => None,
        };
        // The ruleset holds what the directories' descriptors named: they go, so that
        // nothing of the server's reaches the program (the child closes the rest).
        for &fd in args
            .read_fds
            .iter()
            .chain(&args.write_fds)
            .filter(|&&fd| Some(fd) != args.chdir_fd)
        {
            // SAFETY: a descriptor number the server placed for the rules alone, closed once.
            unsafe {
                libc::close(fd);
            }
        }
        let seccomp = if args.seccomp {
            // Outside bwrap's network namespace a listening socket is on the host's.
            let host_net = args.proxy_socket.is_none();
            seccomp::programs(args.net, args.proxy_port.is_some(), host_net)?
        } else {
            Vec::new()
        };
        Ok(Self {
            rlimits: args.rlimits.clone(),
            private_shm: args.private_shm,
            private_proc: args.private_proc,
            ids: args.ids,
            chdir: args.chdir.clone(),
            chdir_fd: args.chdir_fd,
            landlock,
            seccomp,
        })
    }

    /// Apply every layer to the calling (child) process.
    pub fn apply(self) -> Result<(), String> {
        for (r, v) in &self.rlimits {
            set_rlimit(*r, *v)?;
        }
        // A caller's directory is entered from its handle before any mount namespace of the
        // helper's own: unshare carries the working directory over into the new one, while
        // a directory entered afterwards from a handle of the old one is unreachable there
        // (getcwd fails). The handle was opened, and its way checked, as the session's uid.
        if let Some(fd) = self.chdir_fd {
            // SAFETY: a descriptor number the server placed for this; only borrowed.
            let dir = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            nix::unistd::fchdir(dir).map_err(|e| {
                format!(
                    "cannot enter the working directory {}: {}",
                    self.chdir.as_deref().unwrap_or(Path::new("?")).display(),
                    std::io::Error::from(e)
                )
            })?;
        }
        let (shm, proc) = if self.private_shm.is_some() || self.private_proc {
            private_mounts(self.private_shm, self.private_proc)?
        } else {
            (false, false)
        };
        if let Some((uid, gid)) = self.ids {
            drop_to(uid, gid)?;
        }
        if self.chdir_fd.is_none()
            && let Some(dir) = &self.chdir
        {
            nix::unistd::chdir(dir).map_err(|e| {
                format!(
                    "cannot enter the working directory {} as uid {}: {}",
                    dir.display(),
                    nix::unistd::getuid(),
                    std::io::Error::from(e)
                )
            })?;
        }
        if let Some((mut rs, mode)) = self.landlock {
            if shm {
                rs = landlock::add(rs, Path::new("/dev/shm"), landlock::handled())
                    .map_err(|e| format!("landlock: {e}"))?;
            }
            if proc {
                // The host's /proc, which the read rules name, is hidden beneath the new
                // mount, and Landlock does not look at hidden mount points.
                rs = landlock::add(rs, Path::new("/proc"), landlock::read_access())
                    .map_err(|e| format!("landlock: {e}"))?;
            }
            let status = rs
                .restrict_self()
                .map_err(|e| format!("landlock: cannot enforce the ruleset: {e}"))?;
            if mode == LandlockMode::Required && status.ruleset == RulesetStatus::NotEnforced {
                return Err("landlock: the kernel did not enforce the ruleset".into());
            }
        }
        for prog in &self.seccomp {
            seccompiler::apply_filter(prog).map_err(|e| format!("seccomp: {e}"))?;
        }
        close_inherited();
        Ok(())
    }
}

/// Nothing the server (or whoever started it) left open reaches the program.
fn close_inherited() {
    // SAFETY: close_range on descriptor numbers only.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    if rc != 0 {
        for fd in 3..4096 {
            // SAFETY: closing descriptors that may not exist.
            unsafe {
                libc::close(fd);
            }
        }
    }
}

/// In a mount namespace of this process's own (root), or of a user namespace mapping only
/// its own ids (not root): a private tmpfs of `shm` bytes on /dev/shm, and with `proc` (as
/// root only) a /proc of its own where only the processes this one could trace appear
/// (`hidepid=invisible`: its own uid's, in its own Landlock domain), so that other users'
/// command lines, environments and descriptors are not there to read. Whether each was
/// mounted: false, with nothing changed, when the kernel refuses a namespace (a container, a
/// policy against user namespaces), and the program then has no writable /dev/shm. The
/// namespace, and everything written there, ends with the last process of the tree.
fn private_mounts(shm: Option<u64>, proc: bool) -> Result<(bool, bool), String> {
    use nix::mount::{MsFlags, mount};
    use nix::sched::{CloneFlags, unshare};
    let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
    if uid.is_root() {
        if unshare(CloneFlags::CLONE_NEWNS).is_err() {
            return Ok((false, false));
        }
    } else {
        if unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS).is_err() {
            return Ok((false, false));
        }
        // From here on the process is in the new user namespace: without its ids mapped it
        // would run as the overflow uid, so a failure stops the child.
        let map = |file: &str, text: String| {
            std::fs::write(format!("/proc/self/{file}"), text)
                .map_err(|e| format!("private /dev/shm: {file}: {e}"))
        };
        map("setgroups", "deny".into())?;
        map("uid_map", format!("{uid} {uid} 1"))?;
        map("gid_map", format!("{gid} {gid} 1"))?;
    }
    // Mounts made here must not propagate back to the host.
    let none = None::<&str>;
    if mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_SLAVE, none).is_err() {
        return Ok((false, false));
    }
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    // A new instance (kernels from 5.8 on, the only ones that know "invisible"; older ones
    // refuse the option rather than change the host's /proc, whose superblock they share).
    // Without root the host's pid namespace cannot be mounted: nothing is hidden.
    let proc = proc
        && uid.is_root()
        && mount(
            Some("proc"),
            "/proc",
            Some("proc"),
            flags | MsFlags::MS_NOEXEC,
            Some("hidepid=invisible"),
        )
        .is_ok();
    let shm = shm.is_some_and(|bytes| {
        let options = format!("size={bytes},mode=1777");
        mount(
            Some("tmpfs"),
            "/dev/shm",
            Some("tmpfs"),
            flags,
            Some(options.as_str()),
        )
        .is_ok()
    });
    Ok((shm, proc))
}

fn resource(r: Rlimit) -> Resource {
    match r {
        Rlimit::Data => Resource::RLIMIT_DATA,
        Rlimit::Nproc => Resource::RLIMIT_NPROC,
        Rlimit::Fsize => Resource::RLIMIT_FSIZE,
        Rlimit::Nofile => Resource::RLIMIT_NOFILE,
        Rlimit::Cpu => Resource::RLIMIT_CPU,
        Rlimit::Msgqueue => Resource::RLIMIT_MSGQUEUE,
    }
}

fn set_rlimit(r: Rlimit, v: u64) -> Result<(), String> {
    let res = resource(r);
    let (_, hard) = getrlimit(res).map_err(|e| format!("getrlimit {r:?}: {e}"))?;
    let root = nix::unistd::geteuid().is_root();
    // Without privilege a limit cannot be raised past its hard value: keep the lower one.
    let v = if root { v } else { v.min(hard) };
    // CPU: SIGXCPU at the soft limit (a clear cause of death), SIGKILL a second later.
    let max = if r == Rlimit::Cpu {
        v.saturating_add(1).min(if root { u64::MAX } else { hard })
    } else {
        v
    };
    setrlimit(res, v, max).map_err(|e| format!("setrlimit {r:?}={v}: {e}"))
}

/// Become `uid`/`gid` for good: empty the capability bounding set (so nothing can bring a
/// capability back even through a file capability), drop supplementary groups, then gid and
/// uid (real, effective and saved). Changing from uid 0 clears every capability.
pub(crate) fn drop_to(uid: u32, gid: u32) -> Result<(), String> {
    for cap in 0..64 {
        // SAFETY: prctl with integer arguments; PR_CAPBSET_READ fails past the last cap.
        unsafe {
            if libc::prctl(libc::PR_CAPBSET_READ, cap, 0, 0, 0) < 0 {
                break;
            }
            // Needs CAP_SETPCAP; no_new_privs covers its absence.
            libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
        }
    }
    fn err(what: &'static str) -> impl Fn(nix::Error) -> String {
        move |e| format!("{what}: {e}")
    }
    let (u, g) = (Uid::from_raw(uid), Gid::from_raw(gid));
    nix::unistd::setgroups(&[]).map_err(err("setgroups"))?;
    nix::unistd::setresgid(g, g, g).map_err(err("setresgid"))?;
    nix::unistd::setresuid(u, u, u).map_err(err("setresuid"))?;
    let ids = nix::unistd::getresuid().map_err(err("getresuid"))?;
    let gids = nix::unistd::getresgid().map_err(err("getresgid"))?;
    if [ids.real, ids.effective, ids.saved] != [u; 3]
        || [gids.real, gids.effective, gids.saved] != [g; 3]
    {
        return Err("the uid drop did not take".into());
    }
    // At every level, even `none`: a setuid-root program must not bring root back.
    nix::sys::prctl::set_no_new_privs().map_err(err("no_new_privs"))
}
