//! Finding 1: a caller's `env` must reach only the final program, after the uid drop and the
//! confinement, never a process that runs before it (bwrap, the helper), which run as root
//! when the server does.
//!
//! The attack: real shared objects (built here with gcc, in a directory every uid can read)
//! named in `LD_PRELOAD`, `LD_AUDIT` or `LD_LIBRARY_PATH`. Their constructor leaves a mark
//! when it runs in a process that is not yet confined (euid 0, bwrap, or the helper): a file
//! in a host directory, a file in `/tmp` (the sandbox's own, for the helper inside bwrap,
//! which sessions then look for) and a line on stderr (which is a run's stderr). Every
//! level, the server as root and not, over stdio and over HTTP, for `run-code` and
//! `session_start`; the program itself must still get the variable (and, where it can see the
//! directory, run the constructor: sessions work in it, runs see it at level `none`).

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use common::*;
use rmcp::RoleClient;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use serde_json::{Value, json};

const LEVELS: &[&str] = &["bwrap", "landlock", "none"];
const TOKEN: &str = "token-of-the-env-test-0123456789";
/// Unprivileged servers each get a uid of their own (tests run in parallel).
static NEXT_UID: AtomicU32 = AtomicU32::new(61_000);

/// The constructor: marks a run before confinement, says so on stderr otherwise.
const CTOR: &str = r#"
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void rbx_touch(const char *path) {
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
    if (fd >= 0) close(fd);
}

__attribute__((constructor)) static void rbx_init(void) {
    char comm[64] = {0};
    int fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, comm, sizeof comm - 1);
        if (n > 0 && comm[n - 1] == '\n') comm[n - 1] = 0;
        close(fd);
    }
    char msg[256];
    int n;
    if (geteuid() == 0 || strstr(comm, "bwrap") || strstr(comm, "replbox")) {
        char p[512];
        snprintf(p, sizeof p, "%s/hit-%s-%d", RBX_MARK_DIR, comm, (int)getpid());
        rbx_touch(p);
        snprintf(p, sizeof p, "/tmp/rbx-hit-%s-%s-%d", RBX_TAG, comm, (int)getpid());
        rbx_touch(p);
        n = snprintf(msg, sizeof msg, "RBX-HIT %s euid=%d\n", comm, (int)geteuid());
    } else {
        n = snprintf(msg, sizeof msg, "RBX-RAN %s\n", comm);
    }
    if (n > 0) write(2, msg, (size_t)n);
}

unsigned int la_version(unsigned int version) { return version; }
"#;

/// The shared objects of one test, in a directory every uid can read: the preload/audit
/// object and, for `LD_LIBRARY_PATH`, look-alikes (same name, symbols and versions, stub
/// bodies, the constructor) of every library bwrap and the helper load besides libc.
struct Objects {
    dir: tempfile::TempDir,
    marks: tempfile::TempDir,
}

fn sh(cmd: &mut std::process::Command) -> Result<Vec<u8>, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(out.stdout)
}

/// The libraries `bin` needs (name, path), except libc and the loader.
fn needed(bin: &Path) -> Vec<(String, PathBuf)> {
    let out = sh(std::process::Command::new("ldd").arg(bin)).unwrap_or_default();
    String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.trim().split_once(" => ")?;
            let path = rest.split_whitespace().next()?;
            (!name.starts_with("libc.so") && path.starts_with('/'))
                .then(|| (name.to_string(), PathBuf::from(path)))
        })
        .collect()
}

/// C source and version script of a look-alike of `real`: every symbol it defines, with its
/// version, as a stub.
fn look_alike(real: &Path) -> (String, String) {
    let out = sh(std::process::Command::new("objdump").arg("-T").arg(real)).unwrap_or_default();
    let mut by_version: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut seen = std::collections::BTreeSet::new();
    let mut src = String::from(CTOR);
    for line in String::from_utf8_lossy(&out).lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || !f[0].chars().all(|c| c.is_ascii_hexdigit()) {
            continue;
        }
        let name = f[f.len() - 1];
        let version = f[f.len() - 2].trim_matches(|c| c == '(' || c == ')');
        let Some(section) = f.iter().find(|t| t.starts_with('.') || t.starts_with('*')) else {
            continue;
        };
        if section.starts_with('*')
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            || !seen.insert(name.to_string())
            || name == "la_version"
        {
            continue;
        }
        if f.contains(&"DO") {
            src.push_str(&format!("char {name}[64];\n"));
        } else {
            src.push_str(&format!("void {name}(void) {{ __builtin_trap(); }}\n"));
        }
        by_version
            .entry(version.to_string())
            .or_default()
            .push(name.to_string());
    }
    let mut script = String::new();
    let versions: Vec<_> = by_version.iter().filter(|(v, _)| *v != "Base").collect();
    for (i, (v, names)) in versions.iter().enumerate() {
        script.push_str(&format!("{v} {{ global: {}; ", names.join("; ")));
        if i == 0 {
            script.push_str("local: *; ");
        }
        script.push_str("};\n");
    }
    (src, script)
}

fn gcc(dir: &Path, name: &str, src: &str, script: &str, marks: &Path) -> Result<Vec<u8>, String> {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, src).map_err(|e| e.to_string())?;
    let out = dir.join(name);
    let mut cmd = std::process::Command::new("gcc");
    cmd.args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&out)
        .arg(format!("-Wl,-soname,{name}"))
        .arg(format!("-DRBX_MARK_DIR=\"{}\"", marks.display()))
        .arg(format!("-DRBX_TAG=\"{}\"", tag(marks)))
        .arg(&c);
    if !script.is_empty() {
        let map = dir.join(format!("{name}.map"));
        std::fs::write(&map, script).map_err(|e| e.to_string())?;
        cmd.arg(format!("-Wl,--version-script={}", map.display()));
    }
    sh(&mut cmd)?;
    std::fs::read(&out).map_err(|e| e.to_string())
}

/// What this test's marks in a shared /tmp are named with.
fn tag(marks: &Path) -> String {
    marks
        .file_name()
        .map(|n| {
            n.to_string_lossy()
                .replace(|c: char| !c.is_ascii_alphanumeric(), "")
        })
        .unwrap_or_default()
}

fn build() -> Result<Objects, String> {
    let world = |p: &Path, mode: u32| {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .map_err(|e| e.to_string())
    };
    let marks = tempfile::tempdir_in("/tmp").map_err(|e| e.to_string())?;
    // Writable by whoever the server runs as: only a process before confinement writes here.
    world(marks.path(), 0o777)?;
    let dir = tempfile::tempdir_in("/tmp").map_err(|e| e.to_string())?;
    world(dir.path(), 0o755)?;
    let work = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut files = vec![(
        "rbx-e.so".to_string(),
        gcc(work.path(), "rbx-e.so", CTOR, "", marks.path())?,
    )];
    let helper = PathBuf::from(env!("CARGO_BIN_EXE_replbox-exec"));
    let mut bins = vec![helper];
    if let Some(bwrap) = which("bwrap") {
        bins.push(bwrap);
    }
    let mut libs: Vec<(String, PathBuf)> = bins.iter().flat_map(|b| needed(b)).collect();
    libs.sort();
    libs.dedup();
    if libs.is_empty() {
        return Err("ldd found no library to imitate".into());
    }
    for (name, real) in libs {
        let (src, script) = look_alike(&real);
        files.push((
            name.clone(),
            gcc(work.path(), &name, &src, &script, marks.path())?,
        ));
    }
    for (name, bytes) in files {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).map_err(|e| e.to_string())?;
        world(&p, 0o644)?;
    }
    Ok(Objects { dir, marks })
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    })
}

impl Objects {
    /// Marks left by processes before confinement.
    fn hits(&self) -> Vec<String> {
        std::fs::read_dir(self.marks.path())
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A server over stdio or over HTTP (one per test: its size does not matter).
#[allow(clippy::large_enum_variant)]
enum Conn {
    Stdio(TestServer),
    Http {
        server: HttpServer,
        client: RunningService<RoleClient, ()>,
    },
}

impl Conn {
    async fn call(&self, tool: &str, args: Value) -> Out {
        let client = match self {
            Conn::Stdio(s) => return s.call(tool, args).await,
            Conn::Http { client, .. } => client,
        };
        let obj = args.as_object().cloned().expect("arguments are an object");
        let r = client
            .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(obj))
            .await
            .unwrap_or_else(|e| panic!("{tool} failed at the protocol level: {e}"));
        Out {
            text: r
                .content
                .iter()
                .filter_map(|c| c.as_text().map(|t| t.text.clone()))
                .collect(),
            structured: r.structured_content.clone().unwrap_or(Value::Null),
            is_error: r.is_error.unwrap_or(false),
            images: Vec::new(),
        }
    }

    async fn stop(self) {
        match self {
            Conn::Stdio(s) => {
                s.stop().await;
            }
            Conn::Http { server, client } => {
                let _ = client.cancel().await;
                server.stop().await;
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Setup {
    level: &'static str,
    root: bool,
    http: bool,
}

fn server_args(setup: Setup) -> Vec<String> {
    // Sessions work in the objects' directory, under the masked /tmp.
    ["--sandbox", setup.level, "--allow-cwd", "/tmp"]
        .map(String::from)
        .to_vec()
}

async fn start_http(setup: Setup, uid: Option<u32>) -> Result<Conn, String> {
    let server = Server::http()
        .args(server_args(setup))
        .token(TOKEN)
        .uid(uid)
        .try_start()
        .await
        .map_err(|e| e.to_string())?;
    let client = server
        .try_connect(TOKEN)
        .await
        .map_err(|e| format!("MCP handshake over HTTP: {e}"))?;
    Ok(Conn::Http { server, client })
}

async fn start(setup: Setup) -> Option<Conn> {
    let uid = (!setup.root && nix::unistd::geteuid().is_root())
        .then(|| NEXT_UID.fetch_add(1, Ordering::Relaxed));
    let started = if setup.http {
        start_http(setup, uid).await
    } else {
        let args = server_args(setup);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        TestServer::try_start(&args, &[], uid)
            .await
            .map(Conn::Stdio)
    };
    match started {
        Ok(c) => Some(c),
        Err(e) => {
            skip(format!("{setup:?}: this level does not work here: {e}"));
            None
        }
    }
}

fn setups() -> Vec<Setup> {
    let mut v = Vec::new();
    for &level in LEVELS {
        for http in [false, true] {
            if nix::unistd::geteuid().is_root() {
                v.push(Setup {
                    level,
                    root: true,
                    http,
                });
            }
            v.push(Setup {
                level,
                root: false,
                http,
            });
        }
    }
    v
}

/// One server: attack run-code and session_start with each variable; no process before
/// confinement may run the constructor, the program must get the variable.
async fn attack(setup: Setup, objects: &Objects) {
    let Some(s) = start(setup).await else {
        return;
    };
    let dir = objects.dir.path().display().to_string();
    let so = format!("{dir}/rbx-e.so");
    for (var, value) in [
        ("LD_PRELOAD", &so),
        ("LD_AUDIT", &so),
        ("LD_LIBRARY_PATH", &dir),
    ] {
        let o = s
            .call(
                "run-code",
                json!({
                    "languageId": "python",
                    "code": format!("import os\nprint(os.environ[{var:?}])"),
                    "env": {var: value},
                }),
            )
            .await;
        assert_eq!(
            o.structured["sandbox"], setup.level,
            "{setup:?}: {}",
            o.text
        );
        let stderr = o.s("stderr");
        assert!(!stderr.contains("RBX-HIT"), "{setup:?} {var}: {}", o.text);
        assert_eq!(
            o.s("stdout"),
            format!("{value}\n"),
            "{setup:?} {var}: {}",
            o.text
        );
        // A run sees the objects' directory (under the masked /tmp) at level none only.
        if var != "LD_LIBRARY_PATH" && setup.level == "none" {
            assert!(stderr.contains("RBX-RAN"), "{setup:?} {var}: {}", o.text);
        }
        assert_eq!(objects.hits(), Vec::<String>::new(), "{setup:?} {var}");
    }
    let o = s
        .call(
            "session_start",
            json!({"language": "python", "cwd": dir, "env": {
                "LD_PRELOAD": so, "LD_AUDIT": so, "LD_LIBRARY_PATH": dir,
            }}),
        )
        .await;
    assert!(!o.is_error, "{setup:?}: session_start: {}", o.text);
    let id = o.s("session_id").to_string();
    let code = format!(
        "import glob, os\n\
         maps = open('/proc/self/maps').read()\n\
         print('rbx-e.so' in maps, os.environ['LD_LIBRARY_PATH'] != '', glob.glob('/tmp/rbx-hit-{}-*'))",
        tag(objects.marks.path())
    );
    let o = s
        .call("session_eval", json!({"session_id": id, "code": code}))
        .await;
    assert_eq!(output(&o), "True True []\n", "{setup:?}: {}", o.text);
    assert_eq!(objects.hits(), Vec::<String>::new(), "{setup:?}: session");
    let o = s.call("session_close", json!({"session_id": id})).await;
    assert!(!o.is_error, "{setup:?}: {}", o.text);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn finding_1_caller_env_never_reaches_a_root_process() {
    if !require("python", "python3") || !require("C compiler", "gcc") {
        return;
    }
    let objects = match build() {
        Ok(o) => o,
        Err(e) => {
            skip(format!("cannot build the test's shared objects: {e}"));
            return;
        }
    };
    for setup in setups() {
        attack(setup, &objects).await;
    }
}
