//! Attack tests of the third adversarial review's kernel-facing findings, through the built
//! server and a real MCP client: sockets other than TCP streams getting past Landlock and the
//! egress proxy, an egress endpoint serving whoever finds it, POSIX message queues and other
//! IPC outliving a run, and a run's arguments read by another principal in `/proc`. Each test
//! is named after its finding and fails without its fix.
//!
//! A level that cannot start here is skipped with its reason, or fails under
//! REPLBOX_REQUIRE_ALL=1.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

const TOKEN_A: &str = "token-of-alice-r3-kernel-0123";
const TOKEN_B: &str = "token-of-bob-r3-kernel-456789";
const CONFINED: &[&str] = &["bwrap", "landlock"];
const ALL: &[&str] = &["bwrap", "landlock", "none"];

/// Unprivileged servers (when the tests run as root) each get a uid of their own from here
/// (RLIMIT_NPROC counts every process of a uid, and tests run in parallel); a range no other
/// test file uses.
static NEXT_UID: AtomicU32 = AtomicU32::new(63_000);

fn require_all() -> bool {
    std::env::var("REPLBOX_REQUIRE_ALL").is_ok_and(|v| v == "1")
}

fn we_are_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Skip (or fail in CI) what cannot run here.
fn skip(what: impl std::fmt::Display) {
    assert!(!require_all(), "{what}");
    eprintln!("SKIP: {what}");
}

#[derive(Debug, Clone, Copy)]
struct Setup {
    level: &'static str,
    /// The server runs as root (user code then runs as a pool uid).
    root: bool,
}

/// Every (level, root?) combination this host can try for `levels`.
fn setups(levels: &[&'static str]) -> Vec<Setup> {
    let mut v = Vec::new();
    for &level in levels {
        if we_are_root() {
            v.push(Setup { level, root: true });
        }
        v.push(Setup { level, root: false });
    }
    v
}

/// A stdio server for `setup`, checked to run at that level, or None with the reason.
async fn start(setup: Setup, args: &[&str]) -> Option<TestServer> {
    let mut a = vec!["--sandbox", setup.level];
    a.extend_from_slice(args);
    let uid = (!setup.root && we_are_root()).then(|| NEXT_UID.fetch_add(1, Ordering::Relaxed));
    match TestServer::try_start(&a, &[], uid).await {
        Ok(s) => {
            let ins = s.instructions();
            assert!(
                ins.contains(&format!("Sandbox: {} (", setup.level)),
                "{setup:?}: the server reports another level: {ins}"
            );
            assert_eq!(
                ins.contains("as an unprivileged user"),
                setup.root,
                "{setup:?}: {ins}"
            );
            Some(s)
        }
        Err(e) => {
            skip(format_args!(
                "{setup:?}: level {} does not work here: {e}",
                setup.level
            ));
            None
        }
    }
}

/// An HTTP server as root at `level` with principals A and B, or None with the reason.
async fn start_http(level: &str, args: &[&str]) -> Option<HttpChild> {
    if !we_are_root() {
        skip("the tests with two principals run the HTTP server as root");
        return None;
    }
    let mut a = vec!["--sandbox", level];
    a.extend_from_slice(args);
    let tokens = format!("{TOKEN_A},{TOKEN_B}");
    match HttpChild::try_start(&a, &[("REPLBOX_TOKENS", &tokens)]).await {
        Ok(s) => Some(s),
        Err(e) => {
            skip(format_args!("level {level} does not work here: {e}"));
            None
        }
    }
}

async fn run(client: &rmcp::Peer<rmcp::RoleClient>, what: &str, lang: &str, code: &str) -> Out {
    let o = http_call(
        client,
        "run-code",
        json!({"languageId": lang, "code": code, "timeout_ms": 60_000}),
    )
    .await;
    assert!(!o.is_error, "{what}: run-code {lang}: {}", o.text);
    o
}

/// A loopback HTTP listener that counts connections and answers each with "reached".
struct Listener {
    port: u16,
    hits: Arc<AtomicUsize>,
}

impl Listener {
    fn open() -> Self {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                h.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                let _ = c.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\nreached",
                );
            }
        });
        Self { port, hits }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

// ----- 1. Sockets other than TCP streams, and egress endpoints open to anyone -----

/// Python that tries socket() for every family number with the common types, every
/// protocol number of AF_INET and AF_INET6 with every type and flag bit, and socketpair()
/// for every family; then MPTCP, SMC and SCTP streams, and TCP Fast Open (which connects
/// from sendto, where Landlock's connect rule is not asked), against the host's listener on
/// `port`. Prints one JSON line: the triples that opened, the pairs, the attack's outcome.
fn socket_walk(port: u16) -> String {
    format!(
        r#"
import ctypes, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
NB, CX = 0o4000, 0o2000000
TYPES = (1, 2, 3, 4, 5, 6, 10)
opened = set()
def attempt(f, t, p):
    fd = libc.socket(f, t, p)
    if fd >= 0:
        os.close(fd)
        opened.add((f, t, p))
for f in range(0, 64):
    for t in TYPES:
        for fl in (0, NB | CX):
            attempt(f, t | fl, 0)
protos = list(range(0, 300)) + [1000, 65535, 2**31 - 1, -1]
for f in (2, 10):
    for t in TYPES:
        for p in protos:
            for fl in (0, NB, CX, NB | CX):
                attempt(f, t | fl, p)
pairs = set()
for f in range(0, 64):
    for t in (1, 2, 5):
        sv = (ctypes.c_int * 2)()
        if libc.socketpair(f, t, 0, sv) == 0:
            os.close(sv[0]); os.close(sv[1])
            pairs.add((f, t))
attack = []
for proto in (262, 256, 132):
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, proto)
    except OSError as e:
        attack.append(f"{{proto}} socket errno {{e.errno}}")
        continue
    try:
        s.settimeout(5)
        s.connect(("127.0.0.1", {port}))
        attack.append(f"{{proto}} connected")
    except OSError as e:
        attack.append(f"{{proto}} connect errno {{e.errno}}")
    try:
        s2 = socket.socket(socket.AF_INET, socket.SOCK_STREAM, proto)
        s2.bind(("127.0.0.1", 0))
        s2.listen()
        attack.append(f"{{proto}} listening")
    except OSError as e:
        attack.append(f"{{proto}} listen errno {{e.errno}}")
for fam, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::ffff:127.0.0.1")):
    try:
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.settimeout(5)
        s.sendto(b"fast open", socket.MSG_FASTOPEN, (host, {port}))
        attack.append(f"fastopen {{fam}} connected")
    except OSError as e:
        attack.append(f"fastopen {{fam}} errno {{e.errno}}")
print(json.dumps({{"opened": sorted(opened), "pairs": sorted(pairs), "attack": attack}}))
"#
    )
}

fn ipv6_on_host() -> bool {
    std::net::TcpListener::bind("[::1]:0").is_ok()
}

// At landlock, with any egress flag, `socket(AF_INET, SOCK_STREAM, IPPROTO_MPTCP)` was
// allowed (seccomp allowed any protocol of an IP stream), and Landlock's TCP rules do not
// cover MPTCP: the socket reached host loopback listeners, and bound and listened. Now an
// IP socket opens only as (AF_INET or AF_INET6, SOCK_STREAM with or without its flag bits,
// protocol 0 or IPPROTO_TCP), and only when the level hands out the egress proxy; every
// other family but Unix is refused, and socketpair() is Unix only. The same class: a TCP
// socket's `sendto(MSG_FASTOPEN)` connected to any host listener, Landlock's connect rule
// never asked; the flag is refused.
#[tokio::test(flavor = "multi_thread")]
async fn finding_r3_1_ip_sockets_open_only_as_tcp_streams() {
    if !require("python", "python3") {
        return;
    }
    let six = ipv6_on_host();
    for setup in setups(CONFINED) {
        for egress in [false, true] {
            let l = Listener::open();
            let host = format!("127.0.0.1:{}", l.port);
            let args: &[&str] = if egress {
                &["--allow-host", &host]
            } else {
                &[]
            };
            let Some(s) = start(setup, args).await else {
                continue;
            };
            let what = format!("{setup:?} egress {egress}");
            let o = run(&s.client, &what, "python", &socket_walk(l.port)).await;
            let v: Value = serde_json::from_str(o.s("stdout").trim())
                .unwrap_or_else(|e| panic!("{what}: {e}: {}", o.text));
            let triple = |x: &Value| -> (i64, i64, i64) {
                let n = |i: usize| x[i].as_i64().unwrap_or(-999);
                (n(0), n(1), n(2))
            };
            let opened: Vec<(i64, i64, i64)> = v["opened"]
                .as_array()
                .expect("opened")
                .iter()
                .map(triple)
                .collect();
            let allowed = |&(f, t, p): &(i64, i64, i64)| {
                let ip_stream = (f == 2 || f == 10) && t & 0xf == 1 && (p == 0 || p == 6);
                f == 1 || (egress && ip_stream)
            };
            let wrong: Vec<_> = opened.iter().filter(|t| !allowed(t)).collect();
            assert!(wrong.is_empty(), "{what}: sockets opened: {wrong:?}");
            // What the level needs still opens (so the walk can tell refusal from breakage).
            let mut needed = vec![(1, 1 | 0o4000 | 0o2000000, 0)];
            if egress {
                for f in [2].into_iter().chain(six.then_some(10)) {
                    for fl in [0, 0o4000, 0o2000000, 0o4000 | 0o2000000] {
                        needed.push((f, 1 | fl, 0));
                        needed.push((f, 1 | fl, 6));
                    }
                }
            }
            for n in &needed {
                assert!(opened.contains(n), "{what}: {n:?} did not open: {opened:?}");
            }
            let pairs: Vec<(i64, i64)> = v["pairs"]
                .as_array()
                .expect("pairs")
                .iter()
                .map(|x| (x[0].as_i64().unwrap_or(-1), x[1].as_i64().unwrap_or(-1)))
                .collect();
            assert!(pairs.iter().all(|p| p.0 == 1), "{what}: pairs {pairs:?}");
            assert!(
                pairs.contains(&(1, 1)),
                "{what}: no Unix socketpair: {pairs:?}"
            );
            let attack = v["attack"].to_string();
            assert!(
                !attack.contains("connected") && !attack.contains("listening"),
                "{what}: {attack}"
            );
            assert_eq!(l.hits(), 0, "{what}: the host's listener was reached");
            s.stop().await;
        }
    }
}

/// The proxy URL a session's program was given: its port, and whether it carries
/// credentials.
const PROXY_OF_SESSION: &str = r#"
import os, urllib.parse
u = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
print(u.port, u.username is not None and u.password is not None)
"#;

/// Python that connects to `addr` (a TCP port on the host's loopback, or a Unix socket
/// path) and asks the proxy there for `target`, once without credentials and once with
/// made-up ones; prints the status line of each answer, or the error.
fn intrude(addr: &str, target: &str) -> String {
    format!(
        r#"
import base64, socket
addr = {addr:?}
for auth in ("", "Proxy-Authorization: Basic " + base64.b64encode(b"replbox:guess").decode() + "\r\n"):
    try:
        if addr.startswith("/"):
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(10)
            s.connect(addr)
        else:
            s = socket.create_connection(("127.0.0.1", int(addr)), 10)
        s.sendall(("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n" + auth + "\r\n").encode())
        print("answer", s.recv(200).split(b"\r\n")[0].decode(errors="replace"))
    except OSError as e:
        print("refused", type(e).__name__)
"#
    )
}

/// What the test itself (any process on the host) gets from `addr`: the first line of the
/// answer to a CONNECT to `target`, with the given Proxy-Authorization line ("" for none).
fn ask_proxy(addr: &str, target: &str, auth: &str) -> String {
    let req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n");
    let mut buf = vec![0u8; 512];
    let n = if addr.starts_with('/') {
        let mut s = std::os::unix::net::UnixStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(20))).ok();
        s.write_all(req.as_bytes()).expect("write");
        s.read(&mut buf).unwrap_or(0)
    } else {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", addr.parse::<u16>().expect("port")))
            .expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(20))).ok();
        s.write_all(req.as_bytes()).expect("write");
        s.read(&mut buf).unwrap_or(0)
    };
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

/// The egress endpoints' Unix sockets the server `pid` listens on (from /proc/net/unix,
/// those whose inode is one of its descriptors).
fn egress_sockets(pid: u32) -> Vec<String> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    std::fs::read_to_string("/proc/net/unix")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 8 && inodes.iter().any(|i| i == f[6])).then(|| f[7].to_string())
        })
        .filter(|p| p.contains("/egress/") && p.ends_with(".sock"))
        .collect()
}

// An egress endpoint served whoever connected to it: at landlock another principal's
// scan found a session's port and the proxy served it with that session's allowlist and
// caps (and anything on the host could do the same, at every level). Each endpoint now
// hands its own program an unguessable secret in the proxy URL and refuses (407) every
// connection that does not present it, checked in constant time.
/// The review of the fixes above: at landlock, with a TCP way out to the proxy, `listen` on a
/// socket never bound picks an ephemeral port of the host's by itself, and Landlock (which
/// checks `bind`) is never asked: a server anyone reaching the host could connect to.
/// Refused; inside bwrap's network namespace a listener is the sandbox's own.
#[tokio::test(flavor = "multi_thread")]
async fn finding_r3_review_listen_without_bind_opens_no_host_port() {
    if !require("python", "python3") {
        return;
    }
    let code = "import socket\n\
                for fam in (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX):\n\
                \x20   s = socket.socket(fam, socket.SOCK_STREAM)\n\
                \x20   try:\n\
                \x20       s.listen(5)\n\
                \x20       print(int(fam), 'listening', s.getsockname())\n\
                \x20   except OSError as e:\n\
                \x20       print(int(fam), 'refused', e.errno)\n";
    for setup in setups(&["landlock"]) {
        let l = Listener::open();
        let host = format!("127.0.0.1:{}", l.port);
        let Some(s) = start(setup, &["--allow-host", &host]).await else {
            continue;
        };
        let what = format!("{setup:?}");
        let o = run(&s.client, &what, "python", code).await;
        let out = o.s("stdout").to_string();
        assert!(!out.contains("listening"), "{what}: {out}");
        assert!(out.contains("2 refused 1"), "{what}: {out}");
        s.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn finding_r3_1_an_egress_endpoint_serves_only_its_own_run_or_session() {
    if !require("python", "python3") {
        return;
    }
    for level in ["bwrap", "landlock", "none"] {
        let l = Listener::open();
        let target = format!("127.0.0.1:{}", l.port);
        let Some(s) = start_http(level, &["--allow-host", &target]).await else {
            continue;
        };
        let a = s.connect(TOKEN_A).await;
        let b = s.connect(TOKEN_B).await;
        let o = http_call(&a, "session_start", json!({"language": "python"})).await;
        assert!(!o.is_error, "{level}: {}", o.text);
        let id = o.s("session_id").to_string();
        let o = http_call(
            &a,
            "session_eval",
            json!({"session_id": id, "code": PROXY_OF_SESSION}),
        )
        .await;
        let out = o.structured["output"]
            .as_str()
            .unwrap_or("")
            .trim()
            .to_string();
        let (port, creds) = out
            .split_once(' ')
            .unwrap_or_else(|| panic!("{level}: {}", o.text));
        assert_eq!(
            creds, "True",
            "{level}: the proxy URL carries no credentials"
        );
        // The session's own program gets through, with what its environment gives it.
        let fetch = format!(
            "import urllib.request\nprint(urllib.request.urlopen('http://{target}/', timeout=30).read().decode())"
        );
        let o = http_call(&a, "session_eval", json!({"session_id": id, "code": fetch})).await;
        assert_eq!(
            o.structured["output"].as_str().map(str::trim),
            Some("reached"),
            "{level}: {}",
            o.text
        );
        assert_eq!(l.hits(), 1, "{level}");

        // Where A's endpoint is: a port on the host's loopback, or (bwrap) a Unix socket.
        let addrs: Vec<String> = if level == "bwrap" {
            assert_eq!(port, "3128", "{level}");
            let socks = egress_sockets(s.pid());
            assert!(
                !socks.is_empty(),
                "{level}: no egress socket in /proc/net/unix"
            );
            socks
        } else {
            vec![port.to_string()]
        };
        let guess = format!(
            "Proxy-Authorization: Basic {}\r\n",
            base64_of("replbox:guess")
        );
        for addr in &addrs {
            // Anyone on the host who finds it: refused, with or without made-up credentials.
            for auth in ["", guess.as_str()] {
                let line = ask_proxy(addr, &target, auth);
                assert!(
                    line.starts_with("HTTP/1.1 407"),
                    "{level}: {addr} {auth:?}: {line}"
                );
            }
            // Another principal's run that finds it: refused too (or it cannot connect).
            let o = run(&b, level, "python", &intrude(addr, &target)).await;
            let text = o.s("stdout");
            assert!(
                text.lines().count() == 2
                    && text
                        .lines()
                        .all(|l| l.starts_with("answer HTTP/1.1 407") || l.starts_with("refused")),
                "{level}: B's run at {addr}: {text}"
            );
        }
        assert_eq!(
            l.hits(),
            1,
            "{level}: the listener was reached through another's endpoint"
        );
        let _ = a.cancel().await;
        let _ = b.cancel().await;
        s.stop().await;
    }
}

fn base64_of(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

// ----- 5. POSIX message queues and other IPC outliving a run -----

/// Python that tries every kind of IPC object a run could leave behind, named after `tok`:
/// POSIX message queues (libc and raw syscalls), System V segments, queues and semaphores,
/// and in /dev/shm a file, a POSIX shared memory object and a named semaphore. One JSON
/// line: each attempt's "ok" or errno.
fn ipc_probe(tok: &str) -> String {
    format!(
        r#"
import ctypes, json, os, _posixshmem
libc = ctypes.CDLL(None, use_errno=True)
libc.sem_open.restype = ctypes.c_void_p
try:
    mq_open = libc.mq_open
except AttributeError:
    mq_open = ctypes.CDLL("librt.so.1", use_errno=True).mq_open
class Attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long),
                ("curmsgs", ctypes.c_long), ("pad", ctypes.c_long * 4)]
attr = Attr(0, 1, 16, 0)
r = {{}}
def rc(name, v):
    r[name] = "ok" if v >= 0 else "errno %d" % ctypes.get_errno()
rc("mq_open", mq_open(b"/{tok}-q", os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(attr)))
rc("mq_open_default", mq_open(b"/{tok}-q2", os.O_CREAT | os.O_RDWR, 0o600, None))
rc("sys_mq_open", libc.syscall({mq_open}, b"{tok}-q3", os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(attr)))
rc("sys_mq_unlink", libc.syscall({mq_unlink}, b"{tok}-absent"))
rc("shmget", libc.syscall({shmget}, 0, 4096, 0o1000 | 0o600))
rc("msgget", libc.syscall({msgget}, 0, 0o1000 | 0o600))
rc("semget", libc.syscall({semget}, 0, 1, 0o1000 | 0o600))
try:
    with open("/dev/shm/{tok}-file", "w") as f:
        f.write("x")
    r["shm_file"] = "ok"
except OSError as e:
    r["shm_file"] = "errno %d" % e.errno
try:
    fd = _posixshmem.shm_open("/{tok}-shm", os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 4096)
    r["shm_open"] = "ok"
except OSError as e:
    r["shm_open"] = "errno %d" % e.errno
s = libc.sem_open(b"/{tok}-sem", os.O_CREAT, 0o600, 1)
r["sem_open"] = "ok" if s else "errno %d" % ctypes.get_errno()
print(json.dumps(r))
"#,
        mq_open = libc::SYS_mq_open,
        mq_unlink = libc::SYS_mq_unlink,
        shmget = libc::SYS_shmget,
        msgget = libc::SYS_msgget,
        semget = libc::SYS_semget,
    )
}

/// What the host's /dev/shm holds that is named after `tok`.
fn host_shm_with(tok: &str) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(tok))
        .collect()
}

/// The POSIX message queues of the host's IPC namespace named after `tok` (removed once
/// seen, so a failing run leaves none behind), listed by mounting its mqueue filesystem in a
/// mount namespace of a child's own; None when that cannot be done here (not root).
fn host_queues_with(tok: &str) -> Option<Vec<String>> {
    if !we_are_root() {
        return None;
    }
    let script = format!(
        "d=$(mktemp -d) && mount -t mqueue none \"$d\" && for q in \"$d\"/*{tok}*; do \
         [ -e \"$q\" ] && echo \"${{q##*/}}\" && rm -f \"$q\"; done; umount \"$d\"; rmdir \"$d\""
    );
    let out = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .ok()?;
    if !out.status.success() && out.stdout.is_empty() {
        skip(format_args!(
            "cannot list the host's message queues: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
        return None;
    }
    Some(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect(),
    )
}

/// Check one probe's result: POSIX queues refused, and none left in the host's IPC
/// namespace (a Landlock refusal of the open came after the queue was made), at every
/// level; System V refused and nothing in the host's /dev/shm where the level confines.
fn check_ipc(what: &str, setup: Setup, stdout: &str, tok: &str) {
    let v: Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{what}: {e}: {stdout}"));
    if let Some(left) = host_queues_with(tok) {
        assert_eq!(
            left,
            Vec::<String>::new(),
            "{what}: queues left on the host: {v}"
        );
    }
    for k in ["mq_open", "mq_open_default", "sys_mq_open"] {
        assert_ne!(v[k], "ok", "{what}: {k}: {v}");
    }
    if setup.level != "none" {
        for k in ["sys_mq_unlink", "shmget", "msgget", "semget"] {
            assert_eq!(v[k], "errno 1", "{what}: {k}: {v}");
        }
        assert_eq!(host_shm_with(tok), Vec::<String>::new(), "{what}: {v}");
    }
}

// At landlock one run left 255 POSIX message queues (mq_open) in the host's IPC namespace,
// which filled the host's queues_max: every unprivileged process on the host then got
// "no space left on device". POSIX queues are now refused at every level (seccomp where
// it applies, and RLIMIT_MSGQUEUE 0 at every level, none included); System V IPC stays
// refused where seccomp applies; and what a run or session puts in /dev/shm (files, POSIX
// shared memory, named semaphores) is in a private /dev/shm gone with it, never the host's.
#[tokio::test(flavor = "multi_thread")]
async fn finding_r3_5_posix_queues_and_shared_memory_do_not_outlive_a_run() {
    if !require("python", "python3") {
        return;
    }
    for setup in setups(ALL) {
        let Some(s) = start(setup, &[]).await else {
            continue;
        };
        let what = format!("{setup:?}");
        let tok = token();
        let o = run(&s.client, &what, "python", &ipc_probe(&tok)).await;
        check_ipc(&format!("{what} run"), setup, o.s("stdout"), &tok);
        if setup.level == "none" {
            // Not confined: the host's /dev/shm is shared (docs/isolation.md says so).
            for n in host_shm_with(&tok) {
                let _ = std::fs::remove_file(format!("/dev/shm/{n}"));
            }
            s.stop().await;
            continue;
        }
        // The next run does not find what the first one made.
        let o = run(
            &s.client,
            &what,
            "python",
            "import os\nprint(sorted(os.listdir('/dev/shm')) if os.path.isdir('/dev/shm') else [])",
        )
        .await;
        assert!(!o.text.contains(&tok), "{what}: {}", o.text);
        // A session: nothing in the host's /dev/shm while it lives, nor after.
        let tok = token();
        let id = s.start_session("python").await;
        let o = s.eval(&id, &ipc_probe(&tok)).await;
        assert_eq!(status(&o), "ok", "{what}: {}", o.text);
        check_ipc(&format!("{what} session"), setup, output(&o), &tok);
        let o = s.call("session_close", json!({"session_id": id})).await;
        assert!(!o.is_error, "{what}: {}", o.text);
        assert_eq!(host_shm_with(&tok), Vec::<String>::new(), "{what}");
        s.stop().await;
    }
}

// ----- 6. A run's arguments in /proc -----

/// A program in `lang` that waits to be killed, with `tok` in its code.
fn waiting_program(lang: &str, tok: &str) -> String {
    match lang {
        "python" => format!("# {tok}\nimport time\ntime.sleep(600)\n"),
        "javascript" => format!("// {tok}\nsetTimeout(() => {{}}, 600000);\n"),
        "bash" => format!("# {tok}\nsleep 600 &\nwait\n"),
        _ => format!("# {tok}\nSys.sleep(600)\n"),
    }
}

/// Python that looks for `tok` in every process's command line, environment, standard
/// input and working directory's program file; prints how many processes it sees and where
/// it found the token (which its own code holds only in hex).
fn proc_scan(tok: &str) -> String {
    let hex: String = tok.bytes().map(|b| format!("{b:02x}")).collect();
    format!(
        r#"
import os
tok = bytes.fromhex("{hex}")
pids = [p for p in os.listdir("/proc") if p.isdigit()]
seen = []
for pid in pids:
    for what in ("cmdline", "environ", "fd/0", "cwd/main.py", "cwd/main.js", "cwd/main.sh", "cwd/main.R"):
        try:
            fd = os.open(f"/proc/{{pid}}/{{what}}", os.O_RDONLY | os.O_NONBLOCK)
            try:
                data = os.read(fd, 1 << 20)
            finally:
                os.close(fd)
        except OSError:
            continue
        if tok in data:
            seen.append(f"{{pid}}/{{what}}")
print("seen", seen)
"#
    )
}

/// The interpreters (not the helper or bwrap, whose command lines may carry the program's)
/// with `needle` in their command line.
fn programs_with(needle: &str) -> Vec<i32> {
    processes_with(needle)
        .into_iter()
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| {
                let name = e.file_name().map(|n| n.to_string_lossy().into_owned());
                !matches!(name.as_deref(), Some("replbox-exec" | "bwrap"))
            })
        })
        .collect()
}

// At landlock, `/proc/PID/cmdline` of another principal's run showed its `args` (python,
// node, bash, R). As root, the program now gets a /proc of its own, mounted with
// hidepid=invisible, where only processes it could trace (its own uid, its own Landlock
// domain) appear: another principal's command line, environment, input and files are not
// there to read. At bwrap the pid namespace hides them. (Where the level cannot hide them,
// docs/isolation.md says so: at none, and at landlock when the server is not root, where
// every principal's code runs as the server's uid.)
#[tokio::test(flavor = "multi_thread")]
async fn finding_r3_6_another_principal_cannot_read_a_runs_arguments() {
    let langs: Vec<&str> = [
        ("python", "python3"),
        ("javascript", "node"),
        ("bash", "bash"),
        ("r", "Rscript"),
    ]
    .into_iter()
    .filter(|(l, p)| require(l, p))
    .map(|(l, _)| l)
    .collect();
    if !langs.contains(&"python") {
        return;
    }
    for level in CONFINED {
        let Some(s) = start_http(level, &[]).await else {
            continue;
        };
        let a = s.connect(TOKEN_A).await;
        let b = s.connect(TOKEN_B).await;
        let tok = token();
        let mut runs = Vec::new();
        for &lang in &langs {
            let a = a.peer().clone();
            let args = json!({"languageId": lang, "code": waiting_program(lang, &tok),
                              "args": [format!("arg-{tok}-{lang}")], "stdin": format!("input-{tok}\n"),
                              "timeout_ms": 120_000});
            runs.push(tokio::spawn(async move {
                http_call(&a, "run-code", args).await
            }));
        }
        // Wait until every language's program runs (the host sees them all): its
        // interpreter, not the helper or bwrap before it, nor a fork of the script.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let missing: Vec<&str> = langs
                .iter()
                .copied()
                .filter(|l| programs_with(&format!("arg-{tok}-{l}")).is_empty())
                .collect();
            if missing.is_empty() {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{level}: not started: {missing:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let o = run(&b, level, "python", &proc_scan(&tok)).await;
        let text = o.s("stdout").to_string();
        for pid in programs_with(&format!("arg-{tok}")) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        assert_eq!(text.trim(), "seen []", "{level}: B found A's data");
        // Each of A's runs ends, killed.
        for r in runs {
            let o = r.await.expect("run task");
            assert!(o.text.contains("SIGKILL"), "{level}: {}", o.text);
        }
        let _ = a.cancel().await;
        let _ = b.cancel().await;
        s.stop().await;
    }
}
