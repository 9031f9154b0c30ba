//! The bridge to the egress proxy. In a sandbox with a network namespace of its own (bwrap),
//! nothing outside is reachable: the server's proxy listens on a Unix socket bound into the
//! sandbox, and this process of the tree listens on `127.0.0.1:PORT` inside the namespace and
//! relays every connection to that socket, byte for byte. It decides nothing (the proxy does)
//! and runs as the program's uid, without the helper's capabilities.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use nix::sys::signal::{self, SigSet, SigmaskHow, Signal};
use nix::unistd::{ForkResult, fork, setsid};

/// Connections relayed at once; more are closed at once (each takes two threads, and threads
/// count against the uid's process limit).
const MAX_CONNECTIONS: usize = 32;

/// Bind the bridge's port and start the bridge in a child of the helper (so it is part of
/// the tree, and killed with it). Called before the program is forked, so the port is open
/// before the program's first line runs.
pub fn start(port: u16, socket: &Path, ids: Option<(u32, u32)>) -> Result<(), String> {
    let listener = TcpListener::bind(("127.0.0.1", port))
        .map_err(|e| format!("egress bridge: cannot listen on 127.0.0.1:{port}: {e}"))?;
    let socket = socket.to_path_buf();
    // SAFETY: the helper is single-threaded, so the child may do anything the parent could.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => serve(listener, socket, ids),
        Ok(ForkResult::Parent { .. }) => Ok(()),
        Err(e) => Err(format!("egress bridge: fork: {e}")),
    }
}

fn serve(listener: TcpListener, socket: PathBuf, ids: Option<(u32, u32)>) -> ! {
    let fail = |msg: String| -> ! {
        let _ = nix::unistd::write(std::io::stderr(), msg.as_bytes());
        // SAFETY: _exit ends the process at once; nothing is left to run.
        unsafe { libc::_exit(127) }
    };
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    let _ = signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
    // Off the terminal: Ctrl-C and the terminal's job control are the program's, and the
    // session's "waiting for input?" check must never see this process reading it.
    let _ = setsid();
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        use std::os::fd::AsRawFd;
        for fd in 0..3 {
            // SAFETY: dup2 onto the standard descriptors, which this process owns.
            unsafe {
                libc::dup2(null.as_raw_fd(), fd);
            }
        }
    }
    {
        // Nothing of the helper's (the status pipe, the prepared rulesets) stays open here.
        use std::os::fd::AsRawFd;
        let keep = listener.as_raw_fd() as u32;
        // SAFETY: close_range on descriptor numbers only.
        unsafe {
            if keep > 3 {
                libc::syscall(libc::SYS_close_range, 3u32, keep - 1, 0u32);
            }
            libc::syscall(libc::SYS_close_range, keep + 1, u32::MAX, 0u32);
        }
    }
    if let Some((uid, gid)) = ids
        && let Err(e) = crate::confine::drop_to(uid, gid)
    {
        fail(format!("replbox-exec: egress bridge: {e}\n"));
    }
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let Ok(tcp) = conn else { continue };
        if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let slot = Slot(active.clone());
        let socket = socket.clone();
        // A thread that cannot start drops its slot (and the connection) with the closure.
        let _ = std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || relay(tcp, &socket, slot));
    }
    fail("replbox-exec: egress bridge: the listener failed\n".into())
}

/// One connection counted while alive.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn relay(tcp: TcpStream, socket: &Path, _slot: Slot) {
    let Ok(up) = UnixStream::connect(socket) else {
        return;
    };
    let (Ok(tcp_in), Ok(up_out)) = (tcp.try_clone(), up.try_clone()) else {
        return;
    };
    let upward = std::thread::Builder::new()
        .stack_size(64 * 1024)
        .spawn(move || {
            copy(tcp_in, &up_out);
            let _ = up_out.shutdown(Shutdown::Write);
        });
    copy(&up, &tcp);
    // The proxy is done: nothing the program still sends could be delivered.
    let _ = tcp.shutdown(Shutdown::Both);
    if let Ok(t) = upward {
        let _ = t.join();
    }
}

fn copy(mut from: impl Read, mut to: impl Write) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}
