//! Attack tests of an adversarial review of the security fixes: a bind destination raced
//! into running a caller's program as root (bwrap), a deep tree that aborted the server, a
//! host file copied out of a masked tree, and a uid handed from one principal to another.
//! Each drives the built server through the MCP client, as root (where the finding needs
//! it), at every sandbox level it applies to. A level that cannot start here is skipped with
//! its reason printed (a failure under REPLBOX_REQUIRE_ALL=1).

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

fn we_are_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn root() -> bool {
    if !we_are_root() {
        skip("these attacks need a root server, so the tests must run as root");
    }
    we_are_root()
}

fn python() -> bool {
    require("python", "python3")
}

/// A root server at `level` (with `args`), or None (printed) when the level does not work.
async fn start(level: &str, args: &[&str], env: &[(&str, &str)]) -> Option<TestServer> {
    let mut a = vec!["--sandbox", level];
    a.extend_from_slice(args);
    match TestServer::try_start(&a, env, None).await {
        Ok(s) => {
            let ins = s.instructions();
            assert!(
                ins.contains(&format!("Sandbox: {level} (")),
                "{level}: the server reports another level: {ins}"
            );
            Some(s)
        }
        Err(e) => {
            skip(format!("level {level} does not work here: {e}"));
            None
        }
    }
}

async fn session(s: &TestServer, extra: Value) -> Out {
    let mut args = json!({"language": "python"});
    if let (Some(a), Some(e)) = (args.as_object_mut(), extra.as_object()) {
        a.extend(e.clone());
    }
    s.call("session_start", args).await
}

async fn eval(s: &TestServer, id: &str, code: &str) -> Out {
    s.call(
        "session_eval",
        json!({"session_id": id, "code": code, "timeout_ms": 120_000}),
    )
    .await
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// Whether only root can change what `dir`'s path leads to: every directory from `/` to
/// its parent is root's and writable by no one else.
fn only_root_changes(dir: &Path) -> bool {
    dir.ancestors()
        .skip(1)
        .all(|a| std::fs::symlink_metadata(a).is_ok_and(|m| m.uid() == 0 && m.mode() & 0o022 == 0))
}

/// A fresh directory outside every masked tree, root's, `mode`: in the build's temp dir,
/// else (a checkout under /tmp or a home) in /var/lib/replbox-tests, made for it. None
/// (printed) when neither place is outside the masks with only root able to change the
/// way to it.
fn outside_masks(mode: u32) -> Option<tempfile::TempDir> {
    let masked = [
        "/home", "/root", "/run", "/tmp", "/var/tmp", "/mnt", "/media", "/srv",
    ];
    let fits = |base: &Path| {
        !masked.iter().any(|m| base.starts_with(m)) && only_root_changes(&base.join("x"))
    };
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let fallback = PathBuf::from("/var/lib/replbox-tests");
    for base in [&target, &fallback] {
        use std::os::unix::fs::DirBuilderExt;
        let _ = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(base);
        let Ok(base) = std::fs::canonicalize(base) else {
            continue;
        };
        if fits(&base) {
            let d = tempfile::tempdir_in(&base).expect("tempdir");
            chmod(d.path(), mode);
            return Some(d);
        }
    }
    skip(format!(
        "{} and {} are masked or changeable by users other than root: the attack needs a \
place outside the masks that only root controls",
        target.display(),
        fallback.display()
    ));
    None
}

// ----- F1: a bind destination raced into running a caller's program as root (bwrap) -----

/// Session code for the attack: in its cwd P, a directory `x` holding an executable named
/// like the helper, a link `xl -> ../…/run`, and a process exchanging the two names
/// without pause (renameat2 RENAME_EXCHANGE). A start with cwd P/x then has bwrap mount
/// P/x by its path while the name is swapped: the mount lands on /run and hides the
/// helper bound there, so bwrap (root) runs the planted file instead.
fn race_setup(depth: usize) -> String {
    let up = "../".repeat(depth);
    format!(
        r#"
import os
os.makedirs('x', exist_ok=True); os.chmod('x', 0o777)
with open('x/replbox-helper', 'w') as f:
    f.write('#!/bin/sh\n{{ echo PWNED; id; }} > "$(dirname "$0")/PROOF" 2>&1\n')
os.chmod('x/replbox-helper', 0o755)
if not os.path.islink('xl'):
    os.symlink('{up}run', 'xl')
print('planted')
"#
    )
}

const FLIP: &str = r#"
import subprocess
flip = "import ctypes, os\nl = ctypes.CDLL(None, use_errno=True)\nfd = os.open('.', os.O_PATH)\nwhile True: l.renameat2(fd, b'x', fd, b'xl', 2)\n"
p = subprocess.Popen(['python3', '-c', flip], start_new_session=True,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print('flipping', p.pid)
"#;

// F1 (critical): the cwd is opened without following links, but bwrap mounted it onto its
// *path*, which follows links and can be swapped by whoever may rename entries on the way.
// Won, this ran the caller's file as real root. A cwd whose way others could change was then
// refused outright; now paths do not matter: the directory is opened once, as the session's
// uid, and bound from that descriptor at its path on bwrap's own root (nobody outside the
// sandbox can change the way there), or given Landlock rules and entered from it. So the
// same attack, tried for a bounded number of starts while the names are swapped without
// pause, finds every start either refused (the swap met a check) or in the very directory
// that was checked, never anything mounted elsewhere, and the planted file never runs.
#[tokio::test(flavor = "multi_thread")]
async fn a_cwd_others_can_rename_on_the_way_redirects_nothing() {
    if !python() || !root() {
        return;
    }
    for level in ["bwrap", "landlock"] {
        let Some(shared) = outside_masks(0o1777) else {
            return;
        };
        let p = std::fs::canonicalize(shared.path()).expect("canonical");
        let Some(srv) = start(level, &[], &[]).await else {
            continue;
        };
        let o = session(&srv, json!({"cwd": p})).await;
        assert!(
            !o.is_error,
            "{level}: a root-controlled shared cwd: {}",
            o.text
        );
        let attacker = o.s("session_id").to_string();
        let depth = p.components().count() - 1;
        let o = eval(&srv, &attacker, &race_setup(depth)).await;
        assert_eq!(output(&o), "planted\n", "{level}: {}", o.text);

        // A directory another uid could rename is taken, and it is the one the session sees.
        let target = p.join("x");
        let sees = "import os; print(os.getcwd(), sorted(os.listdir('.')))";
        let expected = format!("{} ['replbox-helper']\n", target.display());
        let o = session(&srv, json!({ "cwd": target })).await;
        assert!(!o.is_error, "{level}: {}", o.text);
        let id = o.s("session_id").to_string();
        let o = eval(&srv, &id, sees).await;
        assert_eq!(output(&o), expected, "{level}: {}", o.text);
        srv.call("session_close", json!({ "session_id": id })).await;

        // While the names are swapped without pause: every start refused or in x itself.
        let o = eval(&srv, &attacker, FLIP).await;
        assert!(output(&o).contains("flipping"), "{level}: {}", o.text);
        let mut started = 0;
        for i in 0..40 {
            let o = session(&srv, json!({ "cwd": target })).await;
            if o.is_error {
                // Refused by the server's checks, or by bwrap's own check that the bound
                // descriptor's directory is still at its path: nothing mounted either way.
                let bwrap_refused = o.error_kind() == "start_failed"
                    && o.text.contains("bwrap: Race condition binding dirfd");
                assert!(
                    o.error_kind() == "invalid_argument" || bwrap_refused,
                    "{level}: {}",
                    o.text
                );
            } else {
                started += 1;
                let id = o.s("session_id").to_string();
                let o = eval(&srv, &id, sees).await;
                // Entered from the descriptor: x itself, under whichever name it has now.
                let out = output(&o);
                assert!(
                    out.ends_with(" ['replbox-helper']\n") && !out.starts_with("/run"),
                    "{level}: start {i} sees another directory: {}",
                    o.text
                );
                srv.call("session_close", json!({ "session_id": id })).await;
            }
            for proof in [p.join("x/PROOF"), p.join("xl/PROOF")] {
                assert!(
                    !proof.exists(),
                    "{level}: the planted file ran: {}",
                    proof.display()
                );
            }
        }
        eprintln!("{level}: {started} of 40 starts during the swaps began, in x itself");
        // Closing the attacker's session ends its flipper with it.
        srv.call("session_close", json!({ "session_id": attacker }))
            .await;
        srv.stop().await;
    }
}

// F1, every destination: the server's own directories are opened (and bound) by path too. A
// working area under a directory a non-root user owns would let that user put directories of
// theirs in its place: the server refuses to start there, at every level, and says which
// directory and why.
#[tokio::test(flavor = "multi_thread")]
async fn a_workspace_others_can_rename_on_the_way_is_refused_at_start() {
    if !python() || !root() {
        return;
    }
    let Some(base) = outside_masks(0o755) else {
        return;
    };
    let users = base.path().join("users-dir");
    std::fs::create_dir(&users).expect("mkdir");
    std::os::unix::fs::chown(&users, Some(54_321), Some(54_321)).expect("chown");
    for level in ["bwrap", "landlock", "none"] {
        let out = std::process::Command::new(BIN)
            .args(["serve", "--sandbox", level, "--work-dir", s(&users)])
            .env("REPLBOX_POOL", "0")
            .env("REPLBOX_SESSION_POOL", "0")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run replbox");
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{level}: started under a user's directory"
        );
        assert!(
            log.contains(s(&users)) && log.contains("uid 54321"),
            "{level}: {log}"
        );
    }
}

// ----- F2: one call aborted the whole server (a deep directory tree) -----

/// Levels of the tree: std's recursive removal overflowed a runtime worker's stack at about
/// 13,000 and needs one descriptor per level.
const DEEP: usize = 20_000;

/// Python that makes a chain of DEEP directories below its working directory and prints
/// where the chain starts. Made as 200 chains of 100 levels, nested by renaming each into the
/// bottom of the one before: one mkdir per level at full depth costs time in the depth under
/// Landlock (its checks walk up to the root), quadratic in all.
fn deep_tree() -> String {
    format!(
        "import os\ntop = os.getcwd()\nN, K = {}, 100\nfor i in range(N):\n    os.makedirs(f'c{{i}}' + '/d' * (K - 1))\nfor i in range(N - 2, -1, -1):\n    os.rename(f'c{{i + 1}}', f'c{{i}}' + '/d' * (K - 1) + '/x')\nprint(top)",
        DEEP / 100
    )
}

/// A root server at `level` whose open-file limit is `nofile` (None: the tests' own), working
/// in `work` (a tmpfs: on a disk, 20,000 directories take minutes to make and remove).
async fn start_limited(level: &str, nofile: Option<u64>, work: &Path) -> Option<TestServer> {
    let mut server = Server::stdio()
        .args(["--sandbox", level, "--keep-files-s", "0", "--work-dir"])
        .arg(work)
        .env_remove("REPLBOX_LOG");
    if let Some(n) = nofile {
        use nix::sys::resource::{Resource, getrlimit, setrlimit};
        // The soft limit only: the helper raises its own to --open-files.
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
        server = server.configure(move |cmd| {
            // SAFETY: setrlimit is async-signal-safe and touches nothing of the parent.
            unsafe {
                cmd.pre_exec(move || {
                    setrlimit(Resource::RLIMIT_NOFILE, n, hard).map_err(std::io::Error::from)
                });
            }
        });
    }
    match server.try_start().await {
        Ok(srv) => {
            let ins = srv.instructions();
            assert!(ins.contains(&format!("Sandbox: {level} (")), "{ins}");
            Some(srv)
        }
        Err(e) => {
            skip(format!("level {level} does not work here: {e}"));
            None
        }
    }
}

/// A root-owned directory for a server's work, on a tmpfs of its own (mounted here, detached
/// when dropped) when the host lets us mount one: on a disk, 20,000 directories take minutes
/// to make and remove. Not /dev/shm, which level landlock replaces with a private one.
struct WorkDir {
    dir: tempfile::TempDir,
    mounted: bool,
}

impl WorkDir {
    fn new() -> Self {
        let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        std::fs::create_dir_all(&base).expect("target tmp dir");
        let dir = tempfile::tempdir_in(&base).expect("tempdir");
        chmod(dir.path(), 0o755);
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=512m,mode=0755", "tmpfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("NOTE: no tmpfs could be mounted: the deep tree is made on disk (slow)");
        }
        Self { dir, mounted }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if self.mounted {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .status();
        }
    }
}

/// Wait (bounded) until `path` is gone.
async fn gone(path: &Path) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while std::fs::symlink_metadata(path).is_ok() {
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

// F2 (high): a run whose program left a 20,000-level tree aborted the server (stack overflow
// in the recursive removal of its directory). The removal is now iterative, with a bounded
// stack and a bounded number of descriptors: the run's directory is gone when the result
// comes back, and the server goes on serving.
#[tokio::test(flavor = "multi_thread")]
async fn a_deep_tree_left_by_run_code_is_removed_and_the_server_keeps_serving() {
    if !python() || !root() {
        return;
    }
    for level in ["none", "landlock", "bwrap"] {
        let work = WorkDir::new();
        let Some(srv) = start_limited(level, None, work.path()).await else {
            continue;
        };
        let o = srv
            .call(
                "run-code",
                json!({"languageId": "python", "code": deep_tree(), "timeout_ms": 120_000}),
            )
            .await;
        assert!(!o.is_error, "{level}: {}", o.text);
        let top = PathBuf::from(o.text.trim());
        assert!(top.is_absolute(), "{level}: {}", o.text);
        assert!(
            std::fs::symlink_metadata(&top).is_err(),
            "{level}: the run's directory is still there: {}",
            top.display()
        );
        let o = srv.run("python", "print(6 * 7)").await;
        assert_eq!(o.text, "42\n", "{level}: the server stopped serving");
        srv.stop().await;
    }
}

// F2: the same tree in a session, closed (with a low open-file limit, where the recursive
// removal ran out of descriptors and left the tree silently).
#[tokio::test(flavor = "multi_thread")]
async fn a_deep_tree_left_by_a_session_is_removed_at_close_and_the_server_keeps_serving() {
    if !python() || !root() {
        return;
    }
    for level in ["none", "landlock", "bwrap"] {
        let work = WorkDir::new();
        let Some(srv) = start_limited(level, Some(256), work.path()).await else {
            continue;
        };
        let o = session(&srv, json!({})).await;
        assert!(!o.is_error, "{level}: {}", o.text);
        let id = o.s("session_id").to_string();
        let dir = PathBuf::from(o.s("cwd"))
            .parent()
            .expect("the session's directory")
            .to_path_buf();
        let o = eval(&srv, &id, &deep_tree()).await;
        assert_eq!(status(&o), "ok", "{level}: {}", o.text);
        let o = srv.call("session_close", json!({ "session_id": id })).await;
        assert!(!o.is_error, "{level}: {}", o.text);
        assert!(
            gone(&dir).await,
            "{level}: the session's directory is still there: {}",
            dir.display()
        );
        let o = srv.run("python", "print(6 * 7)").await;
        assert_eq!(o.text, "42\n", "{level}: the server stopped serving");
        srv.stop().await;
    }
}

// ----- F3: files[].path read trees the sandbox hides -----

// F3 (medium): a host file given as files[].path was copied from a tree the sandbox hides
// from the same code (/tmp, /run, /home, /srv...). A host path now obeys the cwd's policy
// (one function): refused by its name and by where it really lies (a link outside the masks
// leading in is refused too), unless the operator allowed the tree with --allow-cwd.
#[tokio::test(flavor = "multi_thread")]
async fn files_from_a_masked_tree_are_refused_like_a_cwd() {
    if !python() || !root() {
        return;
    }
    // A canary in a masked tree, readable by anyone: the session's uid itself could open it.
    let hidden = tempfile::tempdir_in("/tmp").expect("tempdir in /tmp");
    chmod(hidden.path(), 0o755);
    let canary = hidden.path().join("canary.txt");
    let secret = token();
    std::fs::write(&canary, &secret).expect("write");
    chmod(&canary, 0o644);
    let Some(outside) = outside_masks(0o755) else {
        return;
    };
    let link = outside.path().join("to-canary");
    std::os::unix::fs::symlink(&canary, &link).expect("symlink");
    let hidden_s = s(&std::fs::canonicalize(hidden.path()).expect("canonical")).to_string();
    for level in ["bwrap", "landlock"] {
        let Some(srv) = start(level, &[], &[]).await else {
            continue;
        };
        // The code itself cannot read it.
        let o = srv
            .run(
                "python",
                &format!("try:\n    print(open({:?}).read())\nexcept OSError as e:\n    print('hidden', type(e).__name__)", s(&canary)),
            )
            .await;
        assert!(o.text.starts_with("hidden "), "{level}: {}", o.text);
        for path in [&canary, &link] {
            let o = session(&srv, json!({"files": [{"path": path, "name": "c.txt"}]})).await;
            assert!(
                o.is_error,
                "{level}: {} was copied out of a masked tree: {}",
                path.display(),
                o.text
            );
            assert_eq!(o.error_kind(), "invalid_argument", "{level}: {}", o.text);
            assert!(
                o.text.contains("files[0]")
                    && o.text.contains("which the sandbox hides")
                    && o.text.contains("--allow-cwd"),
                "{level}: {}",
                o.text
            );
            assert!(!o.text.contains(&secret), "{level}: {}", o.text);
        }
        srv.stop().await;
        // The operator's --allow-cwd opens that tree to host paths as to a cwd.
        let Some(srv) = start(level, &["--allow-cwd", &hidden_s], &[]).await else {
            continue;
        };
        let o = session(&srv, json!({"files": [{"path": canary, "name": "c.txt"}]})).await;
        assert!(!o.is_error, "{level}: allowed by the operator: {}", o.text);
        let id = o.s("session_id").to_string();
        let o = eval(&srv, &id, "print(open('c.txt').read())").await;
        assert_eq!(output(&o), format!("{secret}\n"), "{level}: {}", o.text);
        srv.call("session_close", json!({ "session_id": id })).await;
        srv.stop().await;
    }
}

// ----- F4: a uid handed from one principal to the next -----

const TOKEN_A: &str = "token-of-principal-a-0123456789";
const TOKEN_B: &str = "token-of-principal-b-9876543210";
const TOKEN_C: &str = "token-of-principal-c-5555555555";

type HttpClient = rmcp::service::RunningService<rmcp::RoleClient, ()>;

/// `replbox serve --http 127.0.0.1:0` as root at `level` with three tokens (principals
/// token-1, token-2, token-3): the harness's `Server::http()`, or None (skipped) when it
/// does not start here.
async fn start_http(level: &str, args: &[&str], pool: &str) -> Option<HttpServer> {
    match Server::http()
        .args(["--sandbox", level])
        .args(args)
        .token(TOKEN_A)
        .token(TOKEN_B)
        .token(TOKEN_C)
        .env("REPLBOX_POOL", pool)
        .env_remove("REPLBOX_LOG")
        .try_start()
        .await
    {
        Ok(s) => Some(s),
        Err(e) => {
            skip(format!(
                "an HTTP server at level {level} did not start here: {e}"
            ));
            None
        }
    }
}

async fn http_call(c: &HttpClient, tool: &str, args: Value) -> Out {
    let obj = args.as_object().cloned().expect("arguments are an object");
    let r = c
        .call_tool(rmcp::model::CallToolRequestParams::new(tool.to_string()).with_arguments(obj))
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

/// Python that leaves `secret` in files only its uid may read: in its cwd, and (at level
/// none, where they are the host's) in /tmp and /dev/shm; prints its uid.
fn leave_secrets(cwd: Option<&Path>, name: &str, secret: &str) -> String {
    let mut places: Vec<String> = vec![format!("/tmp/{name}"), format!("/dev/shm/{name}")];
    if let Some(c) = cwd {
        places.push(s(&c.join(name)).to_string());
    }
    format!(
        "import os\nfor p in {places:?}:\n    try:\n        fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o600); os.write(fd, b{secret:?}); os.close(fd)\n    except OSError:\n        pass\nprint(os.getuid())"
    )
}

/// Python that tries to read what [`leave_secrets`] left; prints its uid, then one line
/// per place: the text read, or why not.
fn read_secrets(cwd: Option<&Path>, name: &str) -> String {
    let mut places: Vec<String> = vec![format!("/tmp/{name}"), format!("/dev/shm/{name}")];
    if let Some(c) = cwd {
        places.push(s(&c.join(name)).to_string());
    }
    format!(
        "import os\nprint(os.getuid())\nfor p in {places:?}:\n    try:\n        print(p, 'READ', open(p).read())\n    except OSError as e:\n        print(p, type(e).__name__)"
    )
}

/// Call `f` until its answer is not "uids in use" (a uid goes back to the pool once the
/// previous holder's processes are confirmed gone, which may finish after close returns).
async fn until_free<F, Fut>(f: F) -> Out
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Out>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let o = f().await;
        if !o.text.contains("are in use") || tokio::time::Instant::now() > deadline {
            return o;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Remove what a test left in the host's /tmp and /dev/shm.
fn remove_host_secrets(name: &str) {
    for d in ["/tmp", "/dev/shm"] {
        let _ = std::fs::remove_file(Path::new(d).join(name));
    }
}

// F4 (medium): the pool handed out the lowest free uid, so principal B's next session ran as
// the uid principal A's had, and read the 0600 file A left in a shared cwd (and, at level
// none, in the host's /tmp and /dev/shm). A uid is now bound to the first principal whose
// code runs as it: B gets another one, and a third principal finds none left (a `limit`
// error naming --uids) rather than a used one.
#[tokio::test(flavor = "multi_thread")]
async fn a_uid_one_principal_used_never_goes_to_another() {
    if !python() || !root() {
        return;
    }
    for (i, level) in ["none", "landlock", "bwrap"].into_iter().enumerate() {
        let Some(shared) = outside_masks(0o1777) else {
            return;
        };
        let p = std::fs::canonicalize(shared.path()).expect("canonical");
        // A range of its own (the bindings outlive the server, in the host's state dir).
        let base = (131_000 + 10 * i).to_string();
        let Some(srv) = start_http(level, &["--uid-base", &base, "--uids", "2"], "0").await else {
            continue;
        };
        let (a, b, c) = (
            srv.connect(TOKEN_A).await,
            srv.connect(TOKEN_B).await,
            srv.connect(TOKEN_C).await,
        );
        let name = format!("a-secret-{}", token());
        let secret = token();
        let o = http_call(&a, "session_start", json!({"language": "python", "cwd": p})).await;
        assert!(!o.is_error, "{level}: {}", o.text);
        let sa = o.s("session_id").to_string();
        let o = http_call(
            &a,
            "session_eval",
            json!({"session_id": sa, "code": leave_secrets(Some(&p), &name, &secret)}),
        )
        .await;
        assert_eq!(status(&o), "ok", "{level}: {}", o.text);
        let uid_a = output(&o).trim().to_string();
        let o = http_call(&a, "session_close", json!({ "session_id": sa })).await;
        assert!(!o.is_error, "{level}: {}", o.text);

        // B, in the same cwd, once A's uid is free again: another uid, nothing of A's read.
        let o =
            until_free(|| http_call(&b, "session_start", json!({"language": "python", "cwd": p})))
                .await;
        assert!(!o.is_error, "{level}: {}", o.text);
        let sb = o.s("session_id").to_string();
        let o = http_call(
            &b,
            "session_eval",
            json!({"session_id": sb, "code": read_secrets(Some(&p), &name)}),
        )
        .await;
        assert_eq!(status(&o), "ok", "{level}: {}", o.text);
        let out = output(&o).to_string();
        assert!(!out.contains(&secret), "{level}: B read A's files: {out}");
        assert_ne!(out.lines().next(), Some(uid_a.as_str()), "{level}: {out}");

        // A third principal: one uid bound to A (free), one to B (in use): refused, not
        // handed A's.
        let o = http_call(&c, "session_start", json!({"language": "python"})).await;
        assert!(
            o.is_error,
            "{level}: a third principal got a used uid: {}",
            o.text
        );
        assert_eq!(o.error_kind(), "limit", "{level}: {}", o.text);
        assert!(o.text.contains("--uids"), "{level}: {}", o.text);
        let o = http_call(
            &c,
            "run-code",
            json!({"languageId": "python", "code": read_secrets(Some(&p), &name)}),
        )
        .await;
        assert!(
            o.is_error,
            "{level}: a third principal's run got a used uid: {}",
            o.text
        );
        assert!(!o.text.contains(&secret), "{level}: {}", o.text);

        // B's runs, on B's uid once its session is closed: nothing of A's read either.
        let o = http_call(&b, "session_close", json!({ "session_id": sb })).await;
        assert!(!o.is_error, "{level}: {}", o.text);
        let o = until_free(|| {
            http_call(
                &b,
                "run-code",
                json!({"languageId": "python", "code": read_secrets(Some(&p), &name)}),
            )
        })
        .await;
        assert!(!o.is_error, "{level}: {}", o.text);
        assert!(
            !o.text.contains(&secret),
            "{level}: B's run read A's files: {}",
            o.text
        );
        assert_ne!(
            o.text.lines().next(),
            Some(uid_a.as_str()),
            "{level}: {}",
            o.text
        );

        // A comes back to its own uid, and its files: in a session in the same cwd (a run
        // without one does not see that directory at bwrap or landlock, whose view of the
        // host holds a caller's directory only for the spawn that named it).
        let o =
            until_free(|| http_call(&a, "session_start", json!({"language": "python", "cwd": p})))
                .await;
        assert!(!o.is_error, "{level}: {}", o.text);
        let sa = o.s("session_id").to_string();
        let o = http_call(
            &a,
            "session_eval",
            json!({"session_id": sa, "code": read_secrets(Some(&p), &name)}),
        )
        .await;
        assert_eq!(status(&o), "ok", "{level}: {}", o.text);
        let out = output(&o).to_string();
        assert_eq!(out.lines().next(), Some(uid_a.as_str()), "{level}: {out}");
        assert!(
            out.contains(&format!("{} READ {secret}", s(&p.join(&name)))),
            "{level}: {out}"
        );
        let _ = http_call(&a, "session_close", json!({ "session_id": sa })).await;
        remove_host_secrets(&name);
        for cl in [a, b, c] {
            let _ = cl.cancel().await;
        }
    }
}

// F4 at level none with the warm pool: an interpreter started before any principal was known
// took a uid, and the next principal's run could be given the same uid and read what the
// previous run left in the host's /tmp. At none the pool hands out no such uids (a run
// there leaves files where the uid can reach them).
#[tokio::test(flavor = "multi_thread")]
async fn warm_runs_at_none_never_share_a_uid_between_principals() {
    if !python() || !root() {
        return;
    }
    let Some(srv) = start_http("none", &["--uid-base", "131100", "--uids", "4"], "1").await else {
        return;
    };
    let (a, b) = (srv.connect(TOKEN_A).await, srv.connect(TOKEN_B).await);
    let name = format!("a-secret-{}", token());
    let secret = token();
    for round in 0..3 {
        let o = http_call(
            &a,
            "run-code",
            json!({"languageId": "python", "code": leave_secrets(None, &name, &secret)}),
        )
        .await;
        assert!(!o.is_error, "round {round}: {}", o.text);
        let uid_a = o.text.trim().to_string();
        let o = http_call(
            &b,
            "run-code",
            json!({"languageId": "python", "code": read_secrets(None, &name)}),
        )
        .await;
        assert!(!o.is_error, "round {round}: {}", o.text);
        assert!(
            !o.text.contains(&secret),
            "round {round}: B read A's file: {}",
            o.text
        );
        assert_ne!(
            o.text.lines().next(),
            Some(uid_a.as_str()),
            "round {round}: {}",
            o.text
        );
    }
    remove_host_secrets(&name);
    let _ = a.cancel().await;
    let _ = b.cancel().await;
}
