//! The seccomp filters: the kernel surface user code never needs, sockets other than Unix
//! ones (unless the network is allowed; TCP streams only when the proxy is the way out),
//! TCP Fast Open, namespaces through clone, and clone3 and x32 calls answered ENOSYS.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};

/// Syscalls user code never needs and that widen the kernel surface or reach outside the
/// sandbox: io_uring, tracing other processes, BPF, perf, userfaultfd, keyrings, namespaces
/// and mounts, module and kexec loading, and System V IPC and POSIX message queues (outside
/// bwrap's IPC namespace their objects outlive the program, hold memory no rlimit counts
/// or fill the host's `queues_max`, and stay reachable as the uid by whoever gets it next).
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
        libc::SYS_mq_open,
        libc::SYS_mq_unlink,
        libc::SYS_mq_timedsend,
        libc::SYS_mq_timedreceive,
        libc::SYS_mq_notify,
        libc::SYS_mq_getsetattr,
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

/// The `type` argument of an IP socket a program that may reach only the proxy may make: a
/// stream, with or without `SOCK_NONBLOCK` and `SOCK_CLOEXEC` (the only flag bits the kernel
/// takes there). Anything else (datagram, raw, seqpacket, packet, …) is refused.
const STREAM_TYPES: [u64; 4] = [
    libc::SOCK_STREAM as u64,
    (libc::SOCK_STREAM | libc::SOCK_NONBLOCK) as u64,
    (libc::SOCK_STREAM | libc::SOCK_CLOEXEC) as u64,
    (libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) as u64,
];

/// The `protocol` argument of that stream: the default (TCP) or `IPPROTO_TCP` itself. Every
/// other protocol of a stream (MPTCP, SCTP, SMC, …) is refused: Landlock's TCP rules cover
/// TCP alone, so such a socket would connect and listen wherever it liked.
const TCP_PROTOCOLS: [u64; 2] = [0, libc::IPPROTO_TCP as u64];

/// `net`: any socket family the resolver and clients use. `tcp`: IP stream sockets only,
/// exactly (`AF_INET` or `AF_INET6`, [`STREAM_TYPES`], [`TCP_PROTOCOLS`]); Landlock decides
/// which port they may connect to. `host_net`: the program shares the host's network
/// namespace, so with `tcp` it may not `listen` at all: `listen` on an unbound socket binds
/// an ephemeral port itself, and Landlock, which checks `bind`, is never asked.
pub fn programs(net: bool, tcp: bool, host_net: bool) -> Result<Vec<BpfProgram>, String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| format!("seccomp: {e}"))?;
    let err = |e: seccompiler::BackendError| format!("seccomp: {e}");
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for nr in denied_syscalls() {
        rules.insert(nr, Vec::new());
    }
    // Each rule below matches what is refused (the filter allows what no rule matches).
    let dword = |arg: u8, op: SeccompCmpOp, v: u64| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, v).map_err(err)
    };
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
    let other_family = families
        .iter()
        .map(|f| dword(0, SeccompCmpOp::Ne, *f))
        .collect::<Result<Vec<_>, _>>()?;
    let mut socket_rules = vec![SeccompRule::new(other_family).map_err(err)?];
    if tcp && !net {
        for family in [libc::AF_INET as u64, libc::AF_INET6 as u64] {
            // An IP family with a type other than a stream's...
            let mut other_type = vec![dword(0, SeccompCmpOp::Eq, family)?];
            for t in STREAM_TYPES {
                other_type.push(dword(1, SeccompCmpOp::Ne, t)?);
            }
            socket_rules.push(SeccompRule::new(other_type).map_err(err)?);
            // ... or with a protocol other than TCP.
            let mut other_protocol = vec![dword(0, SeccompCmpOp::Eq, family)?];
            for p in TCP_PROTOCOLS {
                other_protocol.push(dword(2, SeccompCmpOp::Ne, p)?);
            }
            socket_rules.push(SeccompRule::new(other_protocol).map_err(err)?);
        }
    }
    rules.insert(libc::SYS_socket, socket_rules);
    if tcp && !net && host_net {
        // Any socket: seccomp cannot tell an IP socket from a Unix one by its descriptor.
        rules.insert(libc::SYS_listen, Vec::new());
    }
    if !net {
        // TCP Fast Open connects from inside sendto/sendmsg, where Landlock's connect rule
        // is never asked: refused, whatever the socket (connect() then send() is the way).
        let fastopen = libc::MSG_FASTOPEN as u64;
        for (nr, flags_arg) in [
            (libc::SYS_sendto, 3),
            (libc::SYS_sendmsg, 2),
            (libc::SYS_sendmmsg, 3),
        ] {
            let rule = SeccompRule::new(vec![dword(
                flags_arg,
                SeccompCmpOp::MaskedEq(fastopen),
                fastopen,
            )?])
            .map_err(err)?;
            rules.insert(nr, vec![rule]);
        }
    }
    // A pair of connected sockets is a Unix thing (IP families answer EOPNOTSUPP anyway).
    rules.insert(
        libc::SYS_socketpair,
        vec![
            SeccompRule::new(vec![dword(0, SeccompCmpOp::Ne, libc::AF_UNIX as u64)?])
                .map_err(err)?,
        ],
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
