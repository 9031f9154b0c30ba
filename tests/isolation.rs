//! Adversarial tests of the isolation guarantees, through a real MCP client: one test per
//! guarantee that docs/isolation.md states, each run at every sandbox level that claims it,
//! with the server as root and as an unprivileged uid.
//!
//! Every server is started with `--sandbox LEVEL` and every test asserts the level the
//! server reports (instructions and each result's `sandbox`), so a silent downgrade fails.
//! A level that cannot start here is skipped with its reason printed, or fails the test
//! when REPLBOX_REQUIRE_ALL=1. Network tests only use loopback listeners opened here.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

/// Unprivileged servers (when the tests run as root) each get a uid of their own from here:
/// RLIMIT_NPROC counts every process of a uid, and tests run in parallel.
static NEXT_UID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(60_000);
const ALL: &[&str] = &["bwrap", "landlock", "none"];
const CONFINED: &[&str] = &["bwrap", "landlock"];

#[derive(Debug, Clone, Copy)]
struct Setup {
    level: &'static str,
    /// The server runs as root (user code then runs as a pool uid).
    root: bool,
}

impl Setup {
    fn confined(&self) -> bool {
        self.level != "none"
    }
}

fn we_are_root() -> bool {
    nix::unistd::geteuid().is_root()
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

/// Start a server for `setup`, or print why that level cannot run here (and fail in CI).
async fn start(setup: Setup, args: &[&str], env: &[(&str, &str)]) -> Option<TestServer> {
    let mut a = vec!["--sandbox", setup.level];
    a.extend_from_slice(args);
    let uid = (!setup.root && we_are_root())
        .then(|| NEXT_UID.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    match TestServer::try_start(&a, env, uid).await {
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
            skip(format!(
                "{setup:?}: level {} does not work here: {e}",
                setup.level
            ));
            None
        }
    }
}

fn python() -> bool {
    require("python", "python3")
}

fn node() -> bool {
    require("javascript", "node")
}

/// Check the level a result reports.
fn level(o: &Out, setup: Setup) {
    assert_eq!(
        o.structured["sandbox"], setup.level,
        "{setup:?}: result reports another level: {}",
        o.structured
    );
}

async fn run(s: &TestServer, setup: Setup, lang: &str, code: &str) -> Out {
    run_t(s, setup, lang, code, 30_000).await
}

async fn run_t(s: &TestServer, setup: Setup, lang: &str, code: &str, timeout_ms: u64) -> Out {
    let o = s
        .call(
            "run-code",
            json!({"languageId": lang, "code": code, "timeout_ms": timeout_ms}),
        )
        .await;
    level(&o, setup);
    o
}

async fn session(s: &TestServer, setup: Setup, lang: &str, extra: Value) -> Out {
    let mut args = json!({"language": lang});
    if let (Some(a), Some(e)) = (args.as_object_mut(), extra.as_object()) {
        a.extend(e.clone());
    }
    let o = s.call("session_start", args).await;
    if !o.is_error {
        level(&o, setup);
    }
    o
}

async fn start_session(s: &TestServer, setup: Setup, lang: &str) -> (String, Out) {
    let o = session(s, setup, lang, json!({})).await;
    assert!(!o.is_error, "{setup:?}: session_start {lang}: {}", o.text);
    (o.s("session_id").to_string(), o)
}

async fn eval(s: &TestServer, id: &str, code: &str, timeout_ms: u64) -> Out {
    s.call(
        "session_eval",
        json!({"session_id": id, "code": code, "timeout_ms": timeout_ms}),
    )
    .await
}

fn output(o: &Out) -> &str {
    o.structured["output"].as_str().unwrap_or("")
}

/// The server still answers, and runs code.
async fn still_serves(s: &TestServer, setup: Setup) {
    let l = s.call("session_list", json!({})).await;
    assert!(!l.is_error, "{setup:?}: {}", l.text);
    let o = run(s, setup, "python", "print(6 * 7)").await;
    assert_eq!(o.text, "42\n", "{setup:?}");
}

fn world_writable_tempdir() -> tempfile::TempDir {
    let d = tempfile::tempdir_in("/tmp").expect("tempdir");
    std::fs::set_permissions(
        d.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .expect("chmod");
    d
}

fn landlock_abi() -> i64 {
    // SAFETY: the version query of landlock_create_ruleset takes no memory.
    unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    }
}

// 1. Writes outside the working directory fail and nothing appears on the host.
#[tokio::test(flavor = "multi_thread")]
async fn writes_outside_the_workdir_fail() {
    if !python() {
        return;
    }
    let host = world_writable_tempdir();
    let hostdir = host.path().display().to_string();
    let bashrc = std::fs::read("/root/.bashrc").ok();
    for setup in setups(CONFINED) {
        let Some(s) = start(setup, &[], &[]).await else {
            continue;
        };
        let tok = token();
        let code = format!(
            r#"
import os
res = []
for p, m in [("/etc/pwn-{tok}", "w"), ("/usr/lib/pwn-{tok}", "w"), ("{hostdir}/pwn-{tok}", "w"),
             ("/var/tmp/pwn-{tok}", "w"), ("/root/.bashrc", "a")]:
    try:
        with open(p, m) as f:
            f.write("x")
        res.append("wrote " + p)
    except OSError as e:
        res.append(type(e).__name__)
print(res[0], res[1])
"#
        );
        let o = run(&s, setup, "python", &code).await;
        assert!(!o.text.contains("wrote"), "{setup:?}: {}", o.text);
        for p in [
            format!("/etc/pwn-{tok}"),
            format!("/usr/lib/pwn-{tok}"),
            format!("{hostdir}/pwn-{tok}"),
            format!("/var/tmp/pwn-{tok}"),
        ] {
            assert!(!std::path::Path::new(&p).exists(), "{setup:?}: {p} written");
        }
        assert_eq!(
            std::fs::read("/root/.bashrc").ok(),
            bashrc,
            "{setup:?}: ~/.bashrc changed"
        );
        if node() {
            let o = run(
                &s,
                setup,
                "javascript",
                &format!(
                    "try {{ require('fs').writeFileSync('{hostdir}/node-{tok}', 'x'); console.log('wrote') }} catch (e) {{ console.log(e.code) }}"
                ),
            )
            .await;
            assert!(!o.text.contains("wrote"), "{setup:?}: {}", o.text);
            assert!(!host.path().join(format!("node-{tok}")).exists());
        }
        still_serves(&s, setup).await;
        s.stop().await;
    }
}

// 2. Root cannot remount its way out: no capabilities, no_new_privs, mount fails.
#[tokio::test(flavor = "multi_thread")]
async fn no_capabilities_and_the_root_remount_fails() {
    if !python() {
        return;
    }
    for setup in setups(ALL) {
        let Some(s) = start(setup, &[], &[]).await else {
            continue;
        };
        let code = r#"
import subprocess
st = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
r = subprocess.run(["mount", "-o", "remount,bind,rw", "/"], capture_output=True)
try:
    open("/etc/replbox-remount-test", "w").write("x")
    etc = "wrote"
except OSError as e:
    etc = type(e).__name__
print(st["CapEff"].strip(), st["CapPrm"].strip(), st["NoNewPrivs"].strip(), r.returncode != 0, etc)
"#;
        let o = run(&s, setup, "python", code).await;
        let f: Vec<&str> = o.s("stdout").split_whitespace().collect();
        assert_eq!(f.len(), 5, "{setup:?}: {}", o.text);
        assert_eq!(f[0], "0000000000000000", "{setup:?}: CapEff");
        assert_eq!(f[1], "0000000000000000", "{setup:?}: CapPrm");
        if setup.confined() || setup.root {
            assert_eq!(f[2], "1", "{setup:?}: no_new_privs");
        }
        assert_eq!(f[3], "True", "{setup:?}: mount must fail");
        assert_ne!(f[4], "wrote", "{setup:?}");
        assert!(!std::path::Path::new("/etc/replbox-remount-test").exists());
        s.stop().await;
    }
}

// 3. Secrets in home directories are not readable, even when the file itself is.
#[tokio::test(flavor = "multi_thread")]
async fn home_directories_are_hidden() {
    if !python() {
        return;
    }
    let tok = token();
    let secret = format!("secret-{tok}");
    // World-readable file in a world-searchable directory: only the sandbox can hide it.
    let dir = std::path::PathBuf::from(format!("/home/replbox-canary-{tok}"));
    std::fs::create_dir_all(dir.join(".ssh")).expect("canary dir");
    std::fs::write(dir.join(".ssh/id_canary"), &secret).expect("canary");
    struct Cleanup(std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = Cleanup(dir.clone());
    let canary = dir.join(".ssh/id_canary").display().to_string();
    for setup in setups(CONFINED) {
        let Some(s) = start(setup, &[], &[]).await else {
            continue;
        };
        let code = format!(
            r#"
import os
try:
    print(open("{canary}").read())
except OSError as e:
    print(type(e).__name__)
try:
    print(os.listdir("/home"))
except OSError as e:
    print(type(e).__name__)
"#
        );
        let o = run(&s, setup, "python", &code).await;
        assert!(!o.text.contains(&secret), "{setup:?}: {}", o.text);
        assert!(
            !o.text.contains("replbox-canary"),
            "{setup:?}: /home listed: {}",
            o.text
        );
        s.stop().await;
    }
}

// 4. The server's environment never reaches user code, not even through /proc.
#[tokio::test(flavor = "multi_thread")]
async fn server_environment_is_out_of_reach() {
    if !python() {
        return;
    }
    for setup in setups(ALL) {
        // Same uid and no sandbox: /proc/<server>/environ is readable; nothing claimed.
        if setup.level == "none" && !setup.root {
            continue;
        }
        let tok = token();
        let Some(s) = start(setup, &[], &[("CANARY_SECRET", &tok)]).await else {
            continue;
        };
        let code = format!(
            r#"
import os
print("env", os.environ.get("CANARY_SECRET"))
found = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            if b"{tok}" in open(f"/proc/{{pid}}/environ", "rb").read():
                found.append(pid)
        except OSError:
            pass
print("found", found)
"#
        );
        let o = run(&s, setup, "python", &code).await;
        assert_eq!(o.s("stdout"), "env None\nfound []\n", "{setup:?}");
        if node() {
            let o = run(
                &s,
                setup,
                "javascript",
                "console.log(process.env.CANARY_SECRET === undefined)",
            )
            .await;
            assert_eq!(o.text, "true\n", "{setup:?}");
        }
        s.stop().await;
    }
}

/// A loopback TCP listener and UDP socket that count what reaches them.
struct Listeners {
    tcp: std::net::TcpListener,
    udp: std::net::UdpSocket,
}

impl Listeners {
    fn open() -> Self {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("tcp");
        tcp.set_nonblocking(true).expect("nonblocking");
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
        udp.set_nonblocking(true).expect("nonblocking");
        Self { tcp, udp }
    }

    fn ports(&self) -> (u16, u16) {
        (
            self.tcp.local_addr().map(|a| a.port()).unwrap_or(0),
            self.udp.local_addr().map(|a| a.port()).unwrap_or(0),
        )
    }

    /// Connections accepted and datagrams received so far.
    fn reached(&self) -> (usize, usize) {
        let mut conns = 0;
        while self.tcp.accept().is_ok() {
            conns += 1;
        }
        let mut grams = 0;
        let mut buf = [0u8; 64];
        while self.udp.recv(&mut buf).is_ok() {
            grams += 1;
        }
        (conns, grams)
    }
}

fn net_probe(tcp: u16, udp: u16) -> String {
    format!(
        r#"
import socket
r = []
try:
    socket.create_connection(("127.0.0.1", {tcp}), 1).close()
    r.append("tcp-connected")
except OSError as e:
    r.append("tcp-" + type(e).__name__)
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"hello", ("127.0.0.1", {udp}))
    r.append("udp-sent")
except OSError as e:
    r.append("udp-" + type(e).__name__)
print(" ".join(r))
"#
    )
}

// 5. No network: loopback listeners of the host see nothing, also with --allow-network
// (which opens the egress proxy only).
#[tokio::test(flavor = "multi_thread")]
async fn network_is_off_unless_allowed() {
    if !python() {
        return;
    }
    for setup in setups(CONFINED) {
        let l = Listeners::open();
        let (tcp, udp) = l.ports();
        let Some(s) = start(setup, &[], &[]).await else {
            continue;
        };
        let o = run(&s, setup, "python", &net_probe(tcp, udp)).await;
        assert!(!o.text.contains("tcp-connected"), "{setup:?}: {}", o.text);
        if node() {
            let js = format!(
                "const s = require('net').connect({tcp}, '127.0.0.1');\ns.on('connect', () => {{ console.log('connected'); process.exit(0) }});\ns.on('error', (e) => {{ console.log('error', e.code); process.exit(0) }});"
            );
            let o = run_t(&s, setup, "javascript", &js, 5000).await;
            assert!(o.text.starts_with("error"), "{setup:?}: {}", o.text);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            l.reached(),
            (0, 0),
            "{setup:?}: the host listeners were reached"
        );
        s.stop().await;

        // --allow-network opens the egress proxy, and only that: the host's loopback stays
        // out of reach, directly and through the proxy.
        let Some(s) = start(setup, &["--allow-network"], &[]).await else {
            continue;
        };
        assert!(
            s.instructions()
                .contains("network only through the HTTP(S) proxy"),
            "{}",
            s.instructions()
        );
        let o = run(&s, setup, "python", &net_probe(tcp, udp)).await;
        assert!(!o.text.contains("tcp-connected"), "{setup:?}: {}", o.text);
        assert!(!o.text.contains("udp-sent"), "{setup:?}: {}", o.text);
        let via_proxy = format!(
            "import urllib.request\ntry:\n    urllib.request.urlopen('http://127.0.0.1:{tcp}/', timeout=10)\nexcept Exception as e:\n    print(e)"
        );
        let o = run(&s, setup, "python", &via_proxy).await;
        assert!(
            o.text.contains("403") && o.text.contains("resolves to 127.0.0.1"),
            "{setup:?}: {}",
            o.text
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            l.reached(),
            (0, 0),
            "{setup:?}: the host listeners were reached"
        );
        s.stop().await;
    }
}

// 6. Unix sockets of the host: pathname ones are out of sight at bwrap (a known gap at the
// landlock level, where the kernel's permissions decide), abstract ones at both levels.
#[tokio::test(flavor = "multi_thread")]
async fn host_unix_sockets_are_unreachable() {
    if !python() {
        return;
    }
    use std::os::linux::net::SocketAddrExt;
    let dir = world_writable_tempdir();
    let path = dir.path().join("host.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o777))
        .expect("chmod");
    let name = format!("replbox-test-{}", token());
    let addr =
        std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract name");
    let abstract_listener = std::os::unix::net::UnixListener::bind_addr(&addr).expect("bind");
    abstract_listener
        .set_nonblocking(true)
        .expect("nonblocking");
    for setup in setups(CONFINED) {
        let Some(s) = start(setup, &[], &[]).await else {
            continue;
        };
        let code = format!(
            r#"
import socket
for target in ["{path}", "\0{name}"]:
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(target)
        print("connected")
    except OSError as e:
        print(type(e).__name__)
"#,
            path = path.display()
        );
        let o = run(&s, setup, "python", &code).await;
        let lines: Vec<&str> = o.s("stdout").lines().collect();
        assert_eq!(lines.len(), 2, "{setup:?}: {}", o.text);
        if setup.level == "bwrap" {
            assert_ne!(lines[0], "connected", "{setup:?}: pathname socket");
            assert!(listener.accept().is_err());
        } else {
            eprintln!(
                "NOTE: {setup:?}: a pathname socket the kernel lets this uid open is reachable \
                 at the landlock level (known gap): {}",
                lines[0]
            );
            while listener.accept().is_ok() {}
        }
        if setup.level == "bwrap" || landlock_abi() >= 6 {
            assert_ne!(lines[1], "connected", "{setup:?}: abstract socket");
            assert!(abstract_listener.accept().is_err(), "{setup:?}");
        }
        s.stop().await;
    }
}

const FORK_LOOP: &str = r#"
import os, time
pids, err = [], None
for i in range(1000):
    try:
        pid = os.fork()
    except OSError as e:
        err = type(e).__name__
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    pids.append(pid)
print(len(pids), err)
"#;

// 7. A fork loop stops at the process limit; afterwards everything is gone and the next call
// is quick, and a session that ran it still answers.
#[tokio::test(flavor = "multi_thread")]
async fn fork_loops_stop_at_the_limit() {
    if !python() {
        return;
    }
    for setup in setups(ALL) {
        let Some(s) = start(setup, &["--processes", "48"], &[]).await else {
            continue;
        };
        // Not root: the budget is counted on top of what the server's uid runs when the
        // program starts, so let the start-up version probes finish first.
        let _ = s.wait_no_descendants(Duration::from_secs(15)).await;
        let o = run_t(&s, setup, "python", FORK_LOOP, 20_000).await;
        let f: Vec<&str> = o.s("stdout").split_whitespace().collect();
        assert_eq!(f.len(), 2, "{setup:?}: {}", o.text);
        let n: usize = f[0].parse().unwrap_or(usize::MAX);
        // As root the run's uid starts empty, and so does the uid in bwrap's user namespace.
        // Otherwise the budget is on top of what the server's uid ran when the program
        // started (its own threads, which come and go), so it is approximate.
        let most = if setup.root || setup.level == "bwrap" {
            47
        } else {
            2 * 48
        };
        assert!(n <= most, "{setup:?}: {n} forks succeeded");
        eprintln!("{setup:?}: fork loop stopped after {n}");
        assert_eq!(f[1], "BlockingIOError", "{setup:?}: {}", o.text);
        let left = s.wait_no_descendants(Duration::from_secs(2)).await;
        assert!(left.is_empty(), "{setup:?}: left {left:?}");
        let t = Instant::now();
        let o = run(&s, setup, "python", "print(1)").await;
        assert_eq!(o.text, "1\n");
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "{setup:?}: {:?}",
            t.elapsed()
        );

        let (id, _) = start_session(&s, setup, "python").await;
        let code = format!(
            "{FORK_LOOP}\nimport signal\nfor p in pids:\n    os.kill(p, signal.SIGKILL)\n    os.waitpid(p, 0)"
        );
        let o = eval(&s, &id, &code, 20_000).await;
        assert_eq!(o.structured["status"], "ok", "{setup:?}: {}", o.text);
        assert!(
            output(&o).contains("BlockingIOError"),
            "{setup:?}: {}",
            o.text
        );
        let o = eval(&s, &id, "print(1)", 5000).await;
        assert_eq!(output(&o), "1\n", "{setup:?}: the session answers");
        s.stop().await;
    }
}

// 8. Memory: a huge allocation fails inside the program, and the session survives.
#[tokio::test(flavor = "multi_thread")]
async fn big_allocations_fail_and_sessions_survive() {
    if !python() {
        return;
    }
    for setup in setups(ALL) {
        let Some(s) = start(setup, &["--memory-mb", "2048"], &[]).await else {
            continue;
        };
        let (id, _) = start_session(&s, setup, "python").await;
        let o = eval(&s, &id, "x = 41\nb = bytearray(16 * 2**30)", 20_000).await;
        assert_eq!(o.structured["status"], "error", "{setup:?}: {}", o.text);
        assert_eq!(o.structured["error"]["type"], "MemoryError", "{setup:?}");
        let o = eval(&s, &id, "x + 1", 5000).await;
        assert_eq!(output(&o), "42\n", "{setup:?}: the session kept its state");
        if node() {
            let (id, _) = start_session(&s, setup, "node").await;
            // 3 GiB is below node's own Buffer limit (4 GiB): only the sandbox's limit stops it.
            let o = eval(
                &s,
                &id,
                "let kept = 41\ntry { Buffer.alloc(3 * 2**30); 'allocated' } catch (e) { e.name }",
                20_000,
            )
            .await;
            assert_eq!(output(&o), "'RangeError'\n", "{setup:?}: {}", o.text);
            let o = eval(&s, &id, "kept + 1", 5000).await;
            assert_eq!(output(&o), "42\n", "{setup:?}");
        }
        s.stop().await;
    }
}

// 9. Disk: a file beyond the size limit fails with EFBIG; the private /tmp fills up.
#[tokio::test(flavor = "multi_thread")]
async fn file_size_and_tmpfs_are_bounded() {
    if !python() {
        return;
    }
    for setup in setups(ALL) {
        let Some(s) = start(setup, &["--file-size-mb", "8", "--tmpfs-mb", "16"], &[]).await else {
            continue;
        };
        let code = r#"
import errno
chunk = b"x" * (1 << 20)
try:
    with open("big", "wb") as f:
        for i in range(12):
            f.write(chunk)
            f.flush()
    print("big written")
except OSError as e:
    print("big", errno.errorcode.get(e.errno))
try:
    for i in range(4):
        with open(f"/tmp/fill{i}", "wb") as f:
            for j in range(6):
                f.write(chunk)
                f.flush()
    print("tmp filled")
except OSError as e:
    print("tmp", errno.errorcode.get(e.errno))
# At level none /tmp is the host's: leave nothing there.
import glob, os
for p in glob.glob("/tmp/fill[0-3]"):
    os.remove(p)
"#;
        let o = run(&s, setup, "python", code).await;
        let lines: Vec<&str> = o.s("stdout").lines().collect();
        assert_eq!(lines.first(), Some(&"big EFBIG"), "{setup:?}: {}", o.text);
        if setup.level == "bwrap" {
            assert_eq!(lines.get(1), Some(&"tmp ENOSPC"), "{setup:?}: {}", o.text);
        }
        s.stop().await;
    }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

// 10 and 11. Endless output and endless loops: bounded, on time, nothing left behind.
#[tokio::test(flavor = "multi_thread")]
async fn endless_output_and_loops_are_cut_at_the_deadline() {
    if !python() {
        return;
    }
    for setup in setups(ALL) {
        let Some(s) = start(setup, &[], &[]).await else {
            continue;
        };
        run(&s, setup, "python", "print(1)").await;
        let before = rss_kib(s.pid);
        let t = Instant::now();
        let o = run_t(&s, setup, "python", "while True: print('x' * 1000)", 2000).await;
        let took = t.elapsed();
        assert_eq!(o.structured["timed_out"], true, "{setup:?}");
        assert_eq!(o.structured["truncated"], true, "{setup:?}");
        assert!(o.s("stdout").len() <= 64 * 1024 + 200, "{setup:?}");
        assert!(took < Duration::from_secs(4), "{setup:?}: took {took:?}");
        let grew = rss_kib(s.pid).saturating_sub(before);
        assert!(grew < 10 * 1024, "{setup:?}: server RSS grew {grew} KiB");

        let t = Instant::now();
        let o = run_t(&s, setup, "python", "while True: pass", 2000).await;
        assert_eq!(o.structured["timed_out"], true, "{setup:?}");
        assert!(t.elapsed() < Duration::from_secs(3), "{setup:?}");
        let left = s.wait_no_descendants(Duration::from_secs(2)).await;
        assert!(left.is_empty(), "{setup:?}: left {left:?}");
        s.stop().await;
    }
}

// 12. Ctrl-C reaches the code inside the sandbox in every session language; a REPL that
// ignores it is replaced.
#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_works_inside_the_sandbox() {
    let langs: Vec<(&str, &str)> = [
        ("python", "while True: pass"),
        ("javascript", "while (true) {}"),
    ]
    .into_iter()
    .filter(|(l, _)| if *l == "python" { python() } else { node() })
    .collect();
    for setup in setups(ALL) {
        let Some(s) = start(setup, &[], &[]).await else {
            continue;
        };
        for (lang, busy) in &langs {
            let (id, _) = start_session(&s, setup, lang).await;
            let set = if *lang == "python" {
                "kept = 41"
            } else {
                "var kept = 41"
            };
            eval(&s, &id, set, 5000).await;
            let t = Instant::now();
            let o = eval(&s, &id, busy, 800).await;
            assert_eq!(
                o.structured["status"], "timeout",
                "{setup:?} {lang}: {}",
                o.text
            );
            assert_eq!(o.structured.get("restarted"), None, "{setup:?} {lang}");
            assert!(t.elapsed() < Duration::from_secs(4), "{setup:?} {lang}");
            let o = eval(&s, &id, "kept + 1", 5000).await;
            assert_eq!(output(&o), "42\n", "{setup:?} {lang}: state kept");
        }
        if python() {
            let (id, _) = start_session(&s, setup, "python").await;
            let o = eval(
                &s,
                &id,
                // Sleeping, not spinning: the interrupt is ignored all the same, and the
                // restart after the grace period costs no CPU time meanwhile.
                "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: time.sleep(0.05)",
                1000,
            )
            .await;
            assert_eq!(o.structured["restarted"], true, "{setup:?}: {}", o.text);
            let o = eval(&s, &id, "1 + 1", 5000).await;
            assert_eq!(output(&o), "2\n", "{setup:?}");
        }
        s.stop().await;
    }
}

fn daemon_code(tok: &str) -> String {
    format!(
        r#"
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sh", ["sh", "-c", "while :; do echo x >> hb; sleep 0.05; done", "{tok}"])
    os._exit(0)
t = time.time()
while not (os.path.exists("hb") and os.path.getsize("hb") > 0) and time.time() - t < 5:
    time.sleep(0.01)
print("daemon running" if os.path.exists("hb") else "daemon never ran")
"#
    )
}

// 13. A double-forked, setsid daemon dies with its session and with its run.
#[tokio::test(flavor = "multi_thread")]
async fn escaped_daemons_die_with_their_session_or_run() {
    if !python() {
        return;
    }
    for setup in setups(ALL) {
        let Some(s) = start(setup, &[], &[]).await else {
            continue;
        };
        let tok = token();
        let (id, _) = start_session(&s, setup, "python").await;
        let o = eval(&s, &id, &daemon_code(&tok), 10_000).await;
        assert_eq!(output(&o), "daemon running\n", "{setup:?}: {}", o.text);
        assert!(
            !processes_with(&tok).is_empty(),
            "{setup:?}: daemon visible"
        );
        s.call("session_close", json!({"session_id": id})).await;
        let left = wait_none_with(&tok, Duration::from_secs(1)).await;
        assert!(
            left.is_empty(),
            "{setup:?}: daemon survived close: {left:?}"
        );

        let tok = token();
        let o = run(&s, setup, "python", &daemon_code(&tok)).await;
        assert_eq!(o.text, "daemon running\n", "{setup:?}");
        let left = wait_none_with(&tok, Duration::from_secs(1)).await;
        assert!(
            left.is_empty(),
            "{setup:?}: daemon survived the run: {left:?}"
        );
        s.stop().await;
    }
}

// 14. User code cannot stop, read or trace the server, and the server stays responsive.
#[tokio::test(flavor = "multi_thread")]
async fn the_server_cannot_be_attacked() {
    if !python() {
        return;
    }
    for setup in setups(ALL) {
        // Same uid, no sandbox: user code may signal the server; nothing is claimed.
        if setup.level == "none" && !setup.root {
            continue;
        }
        let Some(s) = start(setup, &[], &[]).await else {
            continue;
        };
        let spid = s.pid;
        let code = format!(
            r#"
import ctypes, os, signal
r = []
try:
    os.kill({spid}, signal.SIGSTOP)
    r.append("stopped")
except OSError as e:
    r.append(type(e).__name__)
try:
    open("/proc/{spid}/mem", "rb").read(1)
    r.append("read-mem")
except OSError as e:
    r.append(type(e).__name__)
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
r.append("ptrace=%d" % libc.ptrace(16, {spid}, 0, 0))
print(" ".join(r), flush=True)
try:
    os.kill(os.getppid(), signal.SIGKILL)
except OSError:
    pass
"#
        );
        let o = run(&s, setup, "python", &code).await;
        assert!(!o.text.contains("stopped"), "{setup:?}: {}", o.text);
        assert!(!o.text.contains("read-mem"), "{setup:?}: {}", o.text);
        assert!(o.text.contains("ptrace=-1"), "{setup:?}: {}", o.text);
        let state = ppid_state(spid as i32).map(|(_, st)| st);
        assert!(
            matches!(state, Some('S') | Some('R')),
            "{setup:?}: server {state:?}"
        );
        still_serves(&s, setup).await;
        s.stop().await;
    }
}

// 15. Kernel surface: io_uring, bpf, userfaultfd, new user namespaces and System V IPC
// are refused (a SysV segment made at landlock outlived its run, holding memory and
// readable by the next holder of the uid).
#[tokio::test(flavor = "multi_thread")]
async fn kernel_surface_is_reduced() {
    if !python() {
        return;
    }
    if !cfg!(target_arch = "x86_64") {
        skip_optional("kernel_surface_is_reduced uses x86_64 syscall numbers");
        return;
    }
    for setup in setups(CONFINED) {
        let Some(s) = start(setup, &[], &[]).await else {
            continue;
        };
        let code = r#"
import ctypes, subprocess
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
params = ctypes.create_string_buffer(120)
r = ["io_uring=%d" % libc.syscall(425, 1, params)]
r.append("bpf=%d" % libc.syscall(321, 0, 0, 0))
r.append("userfaultfd=%d" % libc.syscall(323, 0))
r.append("unshare=%d" % libc.unshare(0x10000000))
r.append("shmget=%d" % libc.shmget(0, 4096, 0o1600))
r.append("msgget=%d" % libc.msgget(0, 0o1600))
r.append("semget=%d" % libc.semget(0, 1, 0o1600))
r.append("unshare-cmd=%d" % subprocess.run(["unshare", "-Ur", "true"], capture_output=True).returncode)
print(" ".join(r))
"#;
        let o = run(&s, setup, "python", code).await;
        let out = o.s("stdout").trim().to_string();
        for want in [
            "io_uring=-1",
            "bpf=-1",
            "userfaultfd=-1",
            "unshare=-1",
            "shmget=-1",
            "msgget=-1",
            "semget=-1",
        ] {
            assert!(out.contains(want), "{setup:?}: {out}");
        }
        assert!(!out.contains("unshare-cmd=0"), "{setup:?}: {out}");
        s.stop().await;
    }
}

// 16. Sessions cannot see each other's files or signal each other.
#[tokio::test(flavor = "multi_thread")]
async fn sessions_are_isolated_from_each_other() {
    if !python() {
        return;
    }
    for setup in setups(CONFINED) {
        let Some(s) = start(setup, &[], &[]).await else {
            continue;
        };
        let tok = token();
        let (a, a_start) = start_session(&s, setup, "python").await;
        let a_cwd = a_start.s("cwd").to_string();
        let a_pid = a_start.structured["pid"].as_i64().unwrap_or(0);
        let o = eval(
            &s,
            &a,
            &format!(
                "open('mine.txt', 'w').write('{tok}')\ntry:\n    open('/tmp/a-{tok}', 'w').write('{tok}')\nexcept OSError:\n    pass"
            ),
            5000,
        )
        .await;
        assert_eq!(o.structured["status"], "ok", "{setup:?}: {}", o.text);
        let (b, _) = start_session(&s, setup, "python").await;
        let code = format!(
            r#"
import os
r = []
try:
    r.append(open("{a_cwd}/mine.txt").read())
except OSError as e:
    r.append(type(e).__name__)
r.append(str(os.path.exists("/tmp/a-{tok}")))
try:
    os.kill({a_pid}, 0)
    r.append("signalled")
except OSError as e:
    r.append(type(e).__name__)
print(" ".join(r))
"#
        );
        let o = eval(&s, &b, &code, 5000).await;
        let out = output(&o);
        assert!(!out.contains(&tok), "{setup:?}: read A's file: {out}");
        assert!(out.contains("False"), "{setup:?}: saw A's /tmp: {out}");
        assert!(!out.contains("signalled"), "{setup:?}: {out}");
        let _ = std::fs::remove_file(format!("/tmp/a-{tok}"));
        s.stop().await;
    }
}

// 17. When the server dies (SIGKILL), every sandbox dies with it.
#[tokio::test(flavor = "multi_thread")]
async fn server_death_takes_every_sandbox_down() {
    if !python() {
        return;
    }
    for setup in setups(ALL) {
        let Some(s) = start(setup, &[], &[]).await else {
            continue;
        };
        let tok = token();
        let (id, started) = start_session(&s, setup, "python").await;
        // A server killed by SIGKILL cannot remove its working area: the test does.
        let workspace = std::path::PathBuf::from(started.s("cwd"))
            .ancestors()
            .nth(3)
            .map(|p| p.to_path_buf());
        let o = eval(&s, &id, &daemon_code(&tok), 10_000).await;
        assert_eq!(output(&o), "daemon running\n", "{setup:?}");
        let s = std::sync::Arc::new(s);
        let s2 = s.clone();
        let tok2 = token();
        let code = format!(
            "import time\nprint('{tok2}', flush=True)\nimport os\nos.execv('/bin/sleep', ['sleep', '300.{}'])",
            std::process::id()
        );
        let running = tokio::spawn(async move {
            s2.call("run-code", json!({"languageId": "python", "code": code}))
                .await
        });
        let t = Instant::now();
        while processes_with(&format!("sleep 300.{}", std::process::id())).is_empty() {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "{setup:?}: run not started"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let all = s.descendants();
        assert!(!all.is_empty());
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(s.pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("kill server");
        let t = Instant::now();
        loop {
            let alive: Vec<i32> = all
                .iter()
                .copied()
                .filter(|p| ppid_state(*p).is_some_and(|(_, st)| st != 'Z'))
                .collect();
            let daemons = processes_with(&tok);
            if alive.is_empty() && daemons.is_empty() {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(2),
                "{setup:?}: left after the server died: {alive:?} {daemons:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        running.abort();
        if let Some(w) = workspace.filter(|w| {
            w.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("replbox-"))
        }) {
            let _ = std::fs::remove_dir_all(w);
        }
    }
}

// 18. Open files are bounded, and only stdio is inherited.
#[tokio::test(flavor = "multi_thread")]
async fn descriptors_are_bounded_and_not_inherited() {
    if !python() {
        return;
    }
    for setup in setups(ALL) {
        let Some(s) = start(setup, &[], &[]).await else {
            continue;
        };
        let code = r#"
import os
print(sorted(int(f) for f in os.listdir("/proc/self/fd")))
files = []
try:
    for i in range(100000):
        files.append(open("/dev/null"))
    print("no limit")
except OSError as e:
    print(len(files), type(e).__name__, e.errno)
"#;
        let o = run(&s, setup, "python", code).await;
        let lines: Vec<&str> = o.s("stdout").lines().collect();
        assert_eq!(
            lines.first(),
            Some(&"[0, 1, 2, 3]"),
            "{setup:?}: {}",
            o.text
        );
        let f: Vec<&str> = lines.get(1).unwrap_or(&"").split_whitespace().collect();
        assert_eq!(f.get(2), Some(&"24"), "{setup:?}: EMFILE: {}", o.text);
        let n: usize = f.first().and_then(|n| n.parse().ok()).unwrap_or(usize::MAX);
        assert!(n < 1024, "{setup:?}: {n} files");
        s.stop().await;
    }
}

// As root, user code never runs as root: a pool uid per run and per session,
// owning its own directory, unable to list the server's.
#[tokio::test(flavor = "multi_thread")]
async fn never_as_root() {
    if !python() {
        return;
    }
    if !we_are_root() {
        skip_optional("never_as_root needs the tests to run as root");
        return;
    }
    let code = r#"
import os
try:
    os.listdir(os.path.dirname(os.getcwd()))
    listed = "listed"
except OSError as e:
    listed = type(e).__name__
print(os.getuid(), os.geteuid(), os.getgid(), os.getgroups(), os.stat(".").st_uid, listed)
"#;
    for setup in setups(ALL).into_iter().filter(|s| s.root) {
        let Some(s) = start(setup, &[], &[]).await else {
            continue;
        };
        let o = run(&s, setup, "python", code).await;
        let out = o.s("stdout").trim().to_string();
        let f: Vec<&str> = out.split_whitespace().collect();
        let uid: u32 = f.first().and_then(|u| u.parse().ok()).unwrap_or(0);
        assert!((100_000..100_256).contains(&uid), "{setup:?}: {out}");
        assert_eq!(f[1], f[0], "{setup:?}: euid");
        assert_eq!(f[2], f[0], "{setup:?}: gid");
        assert_eq!(f[3], "[]", "{setup:?}: groups");
        assert_eq!(f[4], f[0], "{setup:?}: owns its directory");
        assert_eq!(
            f[5], "PermissionError",
            "{setup:?}: lists the server's runs"
        );
        let (a, _) = start_session(&s, setup, "python").await;
        let (b, _) = start_session(&s, setup, "python").await;
        let ua = output(&eval(&s, &a, "import os; os.getuid()", 5000).await).to_string();
        let ub = output(&eval(&s, &b, "import os; os.getuid()", 5000).await).to_string();
        assert_ne!(ua, ub, "{setup:?}: one uid per session");
        assert_ne!(ua.trim(), "0");
        s.stop().await;
    }
}

// The level in force is chosen by probing and reported; a required level that is
// not available stops the server before it serves.
#[tokio::test(flavor = "multi_thread")]
async fn levels_are_reported_and_requirements_fail_closed() {
    for (args, why) in [
        (
            vec!["--sandbox", "none", "--require-sandbox", "landlock"],
            "none below landlock",
        ),
        (
            vec!["--sandbox", "landlock", "--require-sandbox", "bwrap"],
            "landlock below bwrap",
        ),
    ] {
        let out = std::process::Command::new(BIN)
            .arg("serve")
            .args(&args)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run replbox");
        assert!(!out.status.success(), "{why}: started anyway");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("refusing to start"), "{why}: {err}");
        assert!(out.stdout.is_empty(), "{why}: wrote to stdout");
    }
    // bwrap named but not on PATH: refused, not downgraded; auto falls back and says so.
    let empty = tempfile::tempdir().expect("tempdir");
    let path = empty.path().display().to_string();
    let out = std::process::Command::new(BIN)
        .args(["serve", "--sandbox", "bwrap"])
        .env("PATH", &path)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run replbox");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bwrap"));
    let s = TestServer::start_with(&[], &[("PATH", &path)]).await;
    let ins = s.instructions();
    let expect = if landlock_abi() >= 1 {
        "landlock"
    } else {
        "none"
    };
    assert!(ins.contains(&format!("Sandbox: {expect} (")), "{ins}");
    s.stop().await;
    // With bwrap available, auto picks it (and reports it in every result).
    if on_path("bwrap") {
        let s = Server::stdio().start().await;
        let ins = s.instructions();
        if ins.contains("Sandbox: bwrap (") {
            if python() {
                let o = s.run("python", "print(1)").await;
                assert_eq!(o.structured["sandbox"], "bwrap");
            }
        } else {
            skip(format!(
                "auto did not pick bwrap: bwrap is installed but does not work here: {ins}"
            ));
        }
        s.stop().await;
    }
}

// A caller's cwd is visible to the session, but the kernel decides what its
// unprivileged user may do there; a directory it cannot enter is refused up front, and the
// server's own working area can never be a cwd.
#[tokio::test(flavor = "multi_thread")]
async fn a_callers_cwd_grants_visibility_not_privilege() {
    if !python() {
        return;
    }
    if !we_are_root() {
        skip_optional("the cwd rules for a root server need the tests to run as root");
        return;
    }
    // Under /tmp, which the sandbox masks: the operator allows the tree.
    let allowed = world_writable_tempdir();
    let allow = allowed.path().to_str().expect("UTF-8").to_string();
    let private = tempfile::tempdir_in(allowed.path()).expect("tempdir");
    std::fs::set_permissions(
        private.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .expect("chmod");
    let shared = tempfile::tempdir_in(allowed.path()).expect("tempdir");
    std::fs::set_permissions(
        shared.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    std::fs::write(shared.path().join("data.txt"), "readable").expect("write");
    for setup in setups(ALL).into_iter().filter(|s| s.root) {
        let Some(s) = start(setup, &["--allow-cwd", &allow], &[]).await else {
            continue;
        };
        let o = session(&s, setup, "python", json!({"cwd": private.path()})).await;
        assert!(
            o.is_error,
            "{setup:?}: entered a root-only directory {}: {}",
            private.path().display(),
            o.text
        );
        assert!(o.text.contains("cannot enter"), "{setup:?}: {}", o.text);
        let o = session(&s, setup, "python", json!({"cwd": shared.path()})).await;
        assert!(!o.is_error, "{setup:?}: {}", o.text);
        assert_eq!(o.structured["cwd_writable"], false, "{setup:?}");
        let id = o.s("session_id").to_string();
        let o = eval(
            &s,
            &id,
            "print(open('data.txt').read())\ntry:\n    open('new.txt', 'w')\nexcept OSError as e:\n    print(type(e).__name__)",
            5000,
        )
        .await;
        assert_eq!(output(&o), "readable\nPermissionError\n", "{setup:?}");
        assert!(!shared.path().join("new.txt").exists());
        // Another session's directory (inside the server's working area) is refused.
        let (_, other) = start_session(&s, setup, "python").await;
        let o = session(&s, setup, "python", json!({"cwd": other.s("cwd")})).await;
        assert_eq!(o.error_kind(), "invalid_argument", "{setup:?}: {}", o.text);
        assert!(o.text.contains("overlaps"), "{setup:?}: {}", o.text);
        s.stop().await;
    }
}

// CPU time of a run is limited (several busy threads cannot burn more than the limit,
// whatever the wall-clock timeout): SIGXCPU, not the 20 s deadline, ends it.
#[tokio::test(flavor = "multi_thread")]
async fn cpu_time_of_a_run_is_limited() {
    if !python() {
        return;
    }
    for setup in setups(ALL) {
        let Some(s) = start(setup, &["--cpu-s", "1"], &[]).await else {
            continue;
        };
        let o = run_t(&s, setup, "python", "while True: pass", 20_000).await;
        assert_eq!(o.structured["signal"], "SIGXCPU", "{setup:?}: {}", o.text);
        assert_ne!(o.structured["timed_out"], true, "{setup:?}: {}", o.text);
        s.stop().await;
    }
}

// Finding 5: at level landlock, /run is hidden as at bwrap, and no symbolic link (such as
// /var/run -> /run) among the read rules opens it again, for runs and sessions alike.
#[tokio::test(flavor = "multi_thread")]
async fn finding_5_run_stays_hidden_through_links_at_landlock() {
    if !python() {
        return;
    }
    // A world-readable file in /run (only root can plant one there): only the sandbox
    // hides it.
    struct Canary(Option<std::path::PathBuf>);
    impl Drop for Canary {
        fn drop(&mut self) {
            if let Some(p) = &self.0 {
                let _ = std::fs::remove_file(p);
            }
        }
    }
    let canary = Canary(we_are_root().then(|| {
        let p = std::path::PathBuf::from(format!("/run/replbox-canary-{}", token()));
        std::fs::write(&p, "visible").expect("canary");
        p
    }));
    let mut probes = vec!["/run".to_string(), "/var/run".to_string()];
    if let Some(name) = canary.0.as_ref().and_then(|p| p.file_name()) {
        let name = name.to_string_lossy();
        probes.push(format!("/run/{name}"));
        probes.push(format!("/var/run/{name}"));
    }
    let code = format!(
        r#"
import os
res = []
for p in {probes:?}:
    try:
        res.append(str(os.listdir(p)) if os.path.isdir(p) else open(p).read())
    except OSError as e:
        res.append(type(e).__name__)
print(" ".join(res))
"#
    );
    let expected = format!("{}\n", vec!["PermissionError"; probes.len()].join(" "));
    for setup in setups(&["landlock"]) {
        let Some(s) = start(setup, &[], &[]).await else {
            continue;
        };
        let o = run(&s, setup, "python", &code).await;
        assert_eq!(o.s("stdout"), expected, "{setup:?}: run: {}", o.text);
        let (id, _) = start_session(&s, setup, "python").await;
        let o = eval(&s, &id, &code, 10_000).await;
        assert_eq!(output(&o), expected, "{setup:?}: session: {}", o.text);
        s.stop().await;
    }
}

// Finding 6: at level landlock the host's /dev/shm is never written; a run or session gets
// a private, bounded one where the kernel allows it (python's multiprocessing then works),
// shared with no other and gone with it.
#[tokio::test(flavor = "multi_thread")]
async fn finding_6_dev_shm_is_private_and_bounded_at_landlock() {
    if !python() {
        return;
    }
    let tok = token();
    let mine = format!("/dev/shm/rbx-{tok}");
    // Writes a small and a too big file, uses a multiprocessing pool, says what it saw.
    let code = format!(
        r#"
import multiprocessing, os
seen = os.path.exists("{mine}")
try:
    with open("{mine}", "wb") as f:
        f.write(b"x" * (2 << 20))
    shm = "private"
except OSError as e:
    shm = type(e).__name__
try:
    with open("{mine}.big", "wb") as f:
        f.write(b"x" * (64 << 20))
    big = "written"
except OSError as e:
    big = type(e).__name__
if shm == "private":
    os.unlink("{mine}.big")
    with multiprocessing.Pool(2) as p:
        pool = sum(p.map(abs, [-1, -2]))
else:
    pool = "-"
print(seen, shm, big, pool)
"#
    );
    for setup in setups(&["landlock"]) {
        let Some(s) = start(setup, &["--tmpfs-mb", "16"], &[]).await else {
            continue;
        };
        let o = run(&s, setup, "python", &code).await;
        let got = o.s("stdout").to_string();
        if got.starts_with("False PermissionError") {
            // The kernel refused a namespace here: no writable /dev/shm at all.
            skip(format!("{setup:?}: no private /dev/shm here: {}", o.text));
        } else {
            assert_eq!(
                got, "False private OSError 3\n",
                "{setup:?}: run: {}",
                o.text
            );
        }
        assert!(!std::path::Path::new(&mine).exists(), "{setup:?}: run");
        // Two sessions at once: neither sees the other's file, nor a run's.
        let (a, _) = start_session(&s, setup, "python").await;
        let (b, _) = start_session(&s, setup, "python").await;
        let o = eval(&s, &a, &code, 20_000).await;
        assert_eq!(output(&o), got, "{setup:?}: session: {}", o.text);
        let o = eval(&s, &b, &code, 20_000).await;
        assert_eq!(output(&o), got, "{setup:?}: other session: {}", o.text);
        assert!(!std::path::Path::new(&mine).exists(), "{setup:?}: session");
        let o = s.call("session_close", json!({"session_id": a})).await;
        assert!(!o.is_error, "{}", o.text);
        // A session started after the close does not find it either.
        let (c, _) = start_session(&s, setup, "python").await;
        let o = eval(
            &s,
            &c,
            &format!("import os\nprint(os.path.exists('{mine}'))"),
            10_000,
        )
        .await;
        assert_eq!(output(&o), "False\n", "{setup:?}: {}", o.text);
        s.stop().await;
    }
}

// The directories a spawn binds and writes are opened without following links: a work
// directory named through a symbolic link still works (the server uses its real path).
#[tokio::test(flavor = "multi_thread")]
async fn a_work_dir_named_through_a_link_works() {
    if !python() {
        return;
    }
    let real = world_writable_tempdir();
    // Sticky, as /tmp is: the server refuses a work dir in which others could rename its
    // working area.
    std::fs::set_permissions(
        real.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .expect("chmod");
    // The link where the sandbox shows it (not under a masked directory).
    let links = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let link = links.path().join("work");
    std::os::unix::fs::symlink(real.path(), &link).expect("symlink");
    let link = link.display().to_string();
    for setup in setups(ALL) {
        let Some(s) = start(setup, &["--work-dir", &link], &[]).await else {
            continue;
        };
        let o = run(
            &s,
            setup,
            "python",
            "open('f', 'w').write('x'); print(open('f').read())",
        )
        .await;
        assert_eq!(o.text, "x\n", "{setup:?}");
        let (id, _) = start_session(&s, setup, "python").await;
        let o = eval(
            &s,
            &id,
            "open('g', 'w').write('y'); print(open('g').read())",
            10_000,
        )
        .await;
        assert_eq!(output(&o), "y\n", "{setup:?}: {}", o.text);
        s.stop().await;
    }
}
