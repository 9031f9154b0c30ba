//! The child-side layers of the helper: rlimits, uid drop, Landlock, seccomp. Prepared in the
//! helper before it forks (so errors are reported with context), applied in the child just
//! before `exec`.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};

use super::{HelperArgs, LandlockMode, Rlimit};

/// The newest Landlock ABI this code knows what to do with: filesystem (with truncate and
/// device ioctls), TCP bind/connect, and the signal and abstract-socket scopes. Older
/// kernels get what they support (best effort), newer ones these rights.
const LANDLOCK_ABI: ABI = ABI::V6;

pub struct Confinement {
    rlimits: Vec<(Rlimit, u64)>,
    ids: Option<(u32, u32)>,
    chdir: Option<CString>,
    landlock: Option<(RulesetCreated, LandlockMode)>,
    seccomp: Vec<BpfProgram>,
}

impl Confinement {
    pub fn prepare(args: &HelperArgs) -> Result<Self, String> {
        let chdir = match &args.chdir {
            Some(d) => Some(
                CString::new(d.as_os_str().as_bytes())
                    .map_err(|_| "--chdir contains NUL".to_string())?,
            ),
            None => None,
        };
        let landlock = match args.landlock {
            Some(mode) => Some((ruleset(args).map_err(|e| format!("landlock: {e}"))?, mode)),
            None => None,
        };
        let seccomp = if args.seccomp {
            seccomp_programs(args.net)?
        } else {
            Vec::new()
        };
        Ok(Self {
            rlimits: args.rlimits.clone(),
            ids: args.uid.zip(args.gid),
            chdir,
            landlock,
            seccomp,
        })
    }

    /// Apply every layer to the calling (child) process.
    pub fn apply(self) -> Result<(), String> {
        for (r, v) in &self.rlimits {
            set_rlimit(*r, *v)?;
        }
        if let Some((uid, gid)) = self.ids {
            drop_to(uid, gid)?;
        }
        if let Some(dir) = &self.chdir {
            // SAFETY: a NUL-terminated path.
            if unsafe { libc::chdir(dir.as_ptr()) } != 0 {
                let e = std::io::Error::last_os_error();
                // SAFETY: getuid cannot fail.
                let uid = unsafe { libc::getuid() };
                return Err(format!(
                    "cannot enter the working directory {} as uid {uid}: {e}",
                    dir.to_string_lossy()
                ));
            }
        }
        if let Some((rs, mode)) = self.landlock {
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
        // Nothing the server (or whoever started it) left open reaches the program.
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
        Ok(())
    }
}

fn set_rlimit(r: Rlimit, v: u64) -> Result<(), String> {
    let mut cur = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct.
    unsafe {
        libc::getrlimit(r.resource(), &mut cur);
    }
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    // Without privilege a limit cannot be raised past its hard value: keep the lower one.
    let v = if root { v } else { v.min(cur.rlim_max) };
    let new = libc::rlimit {
        rlim_cur: v,
        // CPU: SIGXCPU at the soft limit (a clear cause of death), SIGKILL a second later.
        rlim_max: if r == Rlimit::Cpu {
            v.saturating_add(1)
                .min(if root { u64::MAX } else { cur.rlim_max })
        } else {
            v
        },
    };
    // SAFETY: setrlimit reads the struct.
    if unsafe { libc::setrlimit(r.resource(), &new) } != 0 {
        return Err(format!(
            "setrlimit {r:?}={v}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Become `uid`/`gid` for good: empty the capability bounding set (so nothing can bring a
/// capability back even through a file capability), drop supplementary groups, then gid and
/// uid (real, effective and saved). Changing from uid 0 clears every capability.
fn drop_to(uid: u32, gid: u32) -> Result<(), String> {
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
    let err = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    // SAFETY: plain credential syscalls.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0 {
            return Err(err("setgroups"));
        }
        if libc::setresgid(gid, gid, gid) != 0 {
            return Err(err("setresgid"));
        }
        if libc::setresuid(uid, uid, uid) != 0 {
            return Err(err("setresuid"));
        }
        if libc::getuid() != uid || libc::geteuid() != uid || libc::getegid() != gid {
            return Err("the uid drop did not take".into());
        }
        // At every level, even `none`: a setuid-root program must not bring root back.
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(err("no_new_privs"));
        }
    }
    Ok(())
}

fn ruleset(args: &HelperArgs) -> Result<RulesetCreated, landlock::RulesetError> {
    let abi = LANDLOCK_ABI;
    // Device ioctls stay unrestricted: a terminal reopened after the ruleset (node reopens
    // its terminal through /proc/self/fd/0, and the file lives on the host's devpts mount,
    // which no rule in here can name) must still answer isatty() and set its mode. The
    // dangerous terminal ioctl (TIOCSTI) needs privileges on current kernels anyway.
    let handled = AccessFs::from_all(abi) & !AccessFs::IoctlDev;
    let mut rs = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(handled)?;
    if !args.net {
        // Handled with no rule: no TCP bind or connect at all.
        rs = rs.handle_access(AccessNet::from_all(abi))?;
    }
    // No signals to, and no abstract Unix sockets of, processes outside the sandbox.
    rs = rs.scope(Scope::from_all(abi))?;
    let mut created = rs.create()?;
    let read = AccessFs::from_read(abi) & handled;
    let all = handled;
    for (paths, access) in [(&args.read, read), (&args.write, all)] {
        for p in paths {
            if let Some((fd, access)) = path_rule(p, access) {
                created = created.add_rule(PathBeneath::new(fd, access))?;
            }
        }
    }
    Ok(created)
}

/// A rule for `p` (skipped when it does not exist); a file gets only the rights that apply to
/// files.
fn path_rule(p: &Path, access: BitFlags<AccessFs>) -> Option<(PathFd, BitFlags<AccessFs>)> {
    let meta = std::fs::metadata(p).ok()?;
    let fd = PathFd::new(p).ok()?;
    let access = if meta.is_dir() {
        access
    } else {
        access & AccessFs::from_file(LANDLOCK_ABI)
    };
    Some((fd, access))
}

/// Syscalls user code never needs and that widen the kernel surface or reach outside the
/// sandbox: io_uring, tracing other processes, BPF, perf, userfaultfd, keyrings, namespaces
/// and mounts, module and kexec loading.
fn denied_syscalls() -> Vec<i64> {
    vec![
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_open_tree,
        libc::SYS_move_mount,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_acct,
        libc::SYS_reboot,
    ]
}

/// The namespace flags of clone(2): a process may fork and make threads, never namespaces.
const CLONE_NS_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    // CLONE_NEWTIME shares its bit with clone()'s exit signal, so clone() cannot ask for it
    // (only clone3, which answers ENOSYS, and unshare, which is denied).
];

fn seccomp_programs(net: bool) -> Result<Vec<BpfProgram>, String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| format!("seccomp: {e}"))?;
    let err = |e: seccompiler::BackendError| format!("seccomp: {e}");
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for nr in denied_syscalls() {
        rules.insert(nr, Vec::new());
    }
    // Sockets: Unix only, unless the network is allowed (then IP too, and netlink, which the
    // resolver uses to list interfaces).
    let mut families = vec![libc::AF_UNIX as u64];
    if net {
        families.extend([
            libc::AF_INET as u64,
            libc::AF_INET6 as u64,
            libc::AF_NETLINK as u64,
        ]);
    }
    let not_allowed = families
        .iter()
        .map(|f| SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, *f))
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    for nr in [libc::SYS_socket, libc::SYS_socketpair] {
        rules.insert(
            nr,
            vec![SeccompRule::new(not_allowed.clone()).map_err(err)?],
        );
    }
    let clone_rules = CLONE_NS_FLAGS
        .iter()
        .map(|f| {
            SeccompCondition::new(0, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(*f), *f)
                .and_then(|c| SeccompRule::new(vec![c]))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    rules.insert(libc::SYS_clone, clone_rules);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(err)?;
    let main: BpfProgram = filter.try_into().map_err(err)?;
    Ok(vec![enosys_program(), main])
}

/// A hand-written filter for what seccompiler cannot say: clone3 (its flags are in memory, so
/// it cannot be filtered by flag) answers ENOSYS, which makes libc fall back to clone; and on
/// x86_64 the x32 syscall numbers (bit 30) answer ENOSYS instead of slipping past the
/// per-number rules. A foreign architecture is left to the main filter, which kills it.
fn enosys_program() -> BpfProgram {
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const JGE_K: u16 = 0x35;
    const RET_K: u16 = 0x06;
    const RET_ALLOW: u32 = 0x7fff_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    #[cfg(target_arch = "x86_64")]
    const NATIVE: u32 = 0xC000_003E;
    #[cfg(target_arch = "aarch64")]
    const NATIVE: u32 = 0xC000_00B7;
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    const NATIVE: u32 = 0xC000_00F3; // riscv64
    let x32_bit: u32 = if cfg!(target_arch = "x86_64") {
        0x4000_0000
    } else {
        u32::MAX
    };
    let op = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        op(LD_W_ABS, 0, 0, 4), // arch
        op(JEQ_K, 0, 4, NATIVE),
        op(LD_W_ABS, 0, 0, 0), // syscall number
        op(JEQ_K, 1, 0, libc::SYS_clone3 as u32),
        op(JGE_K, 0, 1, x32_bit),
        op(RET_K, 0, 0, RET_ERRNO | libc::ENOSYS as u32),
        op(RET_K, 0, 0, RET_ALLOW),
    ]
}
