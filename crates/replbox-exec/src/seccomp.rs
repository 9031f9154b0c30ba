//! The seccomp filters: the kernel surface user code never needs, sockets other than Unix
//! ones (unless the network is allowed; TCP ones only when the proxy is the way out), namespaces through clone, and clone3 and x32 calls
//! answered ENOSYS.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};

/// Syscalls user code never needs and that widen the kernel surface or reach outside the
/// sandbox: io_uring, tracing other processes, BPF, perf, userfaultfd, keyrings, namespaces
/// and mounts, module and kexec loading, and System V IPC (outside bwrap's IPC namespace its
/// objects outlive the program, hold memory no rlimit counts, and stay reachable as the uid
/// by whoever gets it next).
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
        libc::SYS_shmget,
        libc::SYS_shmat,
        libc::SYS_shmctl,
        libc::SYS_shmdt,
        libc::SYS_msgget,
        libc::SYS_msgsnd,
        libc::SYS_msgrcv,
        libc::SYS_msgctl,
        libc::SYS_semget,
        libc::SYS_semop,
        libc::SYS_semtimedop,
        libc::SYS_semctl,
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

/// Socket types a program that may reach only the proxy must not make: everything but
/// `SOCK_STREAM` (the low bits of `socket`'s type argument), so no UDP and no raw sockets.
const NOT_STREAM: &[u64] = &[0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

/// `net`: any socket family the resolver and clients use. `tcp`: IP stream sockets only
/// (Landlock decides which port they may connect to).
pub fn programs(net: bool, tcp: bool) -> Result<Vec<BpfProgram>, String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| format!("seccomp: {e}"))?;
    let err = |e: seccompiler::BackendError| format!("seccomp: {e}");
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for nr in denied_syscalls() {
        rules.insert(nr, Vec::new());
    }
    // Sockets: Unix only, unless the network is allowed (then IP too, and netlink, which the
    // resolver uses to list interfaces).
    let mut families = vec![libc::AF_UNIX as u64];
    if tcp && !net {
        families.extend([libc::AF_INET as u64, libc::AF_INET6 as u64]);
    } else if net {
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
    let mut socket_rules = vec![SeccompRule::new(not_allowed.clone()).map_err(err)?];
    if tcp && !net {
        // socket(): an IP family (allowed below) with any type but a stream is refused.
        for family in [libc::AF_INET as u64, libc::AF_INET6 as u64] {
            for ty in NOT_STREAM {
                let is_family =
                    SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, family);
                let is_type = SeccompCondition::new(
                    1,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::MaskedEq(0xf),
                    *ty,
                );
                socket_rules.push(
                    SeccompRule::new(vec![is_family.map_err(err)?, is_type.map_err(err)?])
                        .map_err(err)?,
                );
            }
        }
    }
    rules.insert(libc::SYS_socket, socket_rules);
    rules.insert(
        libc::SYS_socketpair,
        vec![SeccompRule::new(not_allowed.clone()).map_err(err)?],
    );
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
