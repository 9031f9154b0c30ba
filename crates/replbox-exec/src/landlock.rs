//! The Landlock ruleset: reads and writes beneath the given trees, TCP unless the network is
//! allowed (then only connecting to the proxy's port, when one is given), and the signal and
//! abstract-socket scopes.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath,
    Ruleset, RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetError, Scope,
};
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};

use crate::args::ExecArgs;

/// The newest Landlock ABI this code knows what to do with: filesystem (with truncate and
/// device ioctls), TCP bind/connect, and the signal and abstract-socket scopes. Older
/// kernels get what they support (best effort), newer ones these rights.
const LANDLOCK_ABI: ABI = ABI::V6;

/// What a write rule grants. Device ioctls stay unrestricted: a terminal reopened after the
/// ruleset (node reopens its terminal through /proc/self/fd/0, and the file lives on the
/// host's devpts mount, which no rule in here can name) must still answer isatty() and set
/// its mode. The dangerous terminal ioctl (TIOCSTI) needs privileges on current kernels
/// anyway.
pub fn handled() -> BitFlags<AccessFs> {
    AccessFs::from_all(LANDLOCK_ABI) & !AccessFs::IoctlDev
}

/// What a read rule grants.
pub fn read_access() -> BitFlags<AccessFs> {
    AccessFs::from_read(LANDLOCK_ABI) & handled()
}

pub fn ruleset(args: &ExecArgs) -> Result<RulesetCreated, RulesetError> {
    let abi = LANDLOCK_ABI;
    let handled = handled();
    let mut rs = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(handled)?;
    if !args.net {
        // Handled with no rule (but the proxy's port): no TCP bind, no other connect.
        rs = rs.handle_access(AccessNet::from_all(abi))?;
    }
    // No signals to, and no abstract Unix sockets of, processes outside the sandbox.
    rs = rs.scope(Scope::from_all(abi))?;
    let mut created = rs.create()?;
    if let (false, Some(port)) = (args.net, args.proxy_port) {
        created = created.add_rule(NetPort::new(port, AccessNet::ConnectTcp))?;
    }
    let read = read_access();
    for (paths, access) in [(&args.read, read), (&args.write, handled)] {
        for p in paths {
            created = add(created, p, access)?;
        }
    }
    for (fds, access) in [(&args.read_fds, read), (&args.write_fds, handled)] {
        for &fd in fds {
            // SAFETY: a descriptor number the server placed for this process (checked by
            // fstat below before use); only borrowed here.
            let fd = unsafe { BorrowedFd::borrow_raw(fd) };
            let Ok(st) = nix::sys::stat::fstat(fd) else {
                continue;
            };
            let access = if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                access
            } else {
                access & AccessFs::from_file(LANDLOCK_ABI)
            };
            created = created.add_rule(PathBeneath::new(fd, access))?;
        }
    }
    // The terminal the program was given (a session's): inside bwrap it lies on the host's
    // devpts, outside the sandbox's tree, and the program may reopen it (node does, through
    // /proc/self/fd/0).
    let stdin = std::io::stdin();
    if nix::unistd::isatty(&stdin).unwrap_or(false) {
        let file = handled & AccessFs::from_file(abi);
        created = created.add_rule(PathBeneath::new(stdin.as_fd(), file))?;
    }
    Ok(created)
}

/// Add a rule for `p` (none when it does not exist or is reached through a link).
pub fn add(
    rs: RulesetCreated,
    p: &Path,
    access: BitFlags<AccessFs>,
) -> Result<RulesetCreated, RulesetError> {
    match path_rule(p, access) {
        Some((fd, access)) => rs.add_rule(PathBeneath::new(fd, access)),
        None => Ok(rs),
    }
}

/// A rule for `p`, opened without following any symbolic link (a link planted on the way,
/// or swapped in after the server checked the path, must not widen the rule): skipped when
/// it does not exist or is reached through a link. A file gets only the rights that apply
/// to files.
fn path_rule(p: &Path, access: BitFlags<AccessFs>) -> Option<(OwnedFd, BitFlags<AccessFs>)> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let fd = nix::fcntl::openat2(nix::fcntl::AT_FDCWD, p, how).ok()?;
    let st = nix::sys::stat::fstat(&fd).ok()?;
    let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
    let access = if is_dir {
        access
    } else {
        access & AccessFs::from_file(LANDLOCK_ABI)
    };
    Some((fd, access))
}
