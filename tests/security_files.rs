//! Attack tests for the server's own work on a caller's paths (`cwd`, `files`, resources):
//! it must never use its own rights for them. One test per finding of the security review,
//! named after it, run at every sandbox level it applies to, with the server as root (user
//! code then runs as a pool uid) and as an unprivileged uid; resources over HTTP too.
//!
//! Every server is started with `--sandbox LEVEL` and the level it reports is checked, so a
//! silent downgrade fails. A level that cannot start here is skipped with its reason printed
//! (a failure under REPLBOX_REQUIRE_ALL=1).

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use rmcp::model::ReadResourceRequestParams;
use rmcp::{Peer, RoleClient};
use serde_json::{Value, json};

/// Unprivileged servers (when the tests run as root) each get a uid of their own from here,
/// away from tests/isolation.rs's range (tests of both files may run at once).
static NEXT_UID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(61_000);
const ALL: &[&str] = &["bwrap", "landlock", "none"];

#[derive(Debug, Clone, Copy)]
struct Setup {
    level: &'static str,
    /// The server runs as root (user code then runs as a pool uid).
    root: bool,
}

fn we_are_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Every (level, root?) combination this host can try.
fn setups() -> Vec<Setup> {
    let mut v = Vec::new();
    for &level in ALL {
        if we_are_root() {
            v.push(Setup { level, root: true });
        }
        v.push(Setup { level, root: false });
    }
    v
}

fn root_setups() -> Vec<Setup> {
    if !we_are_root() {
        skip_optional("a root server's guarantees need the tests to run as root");
    }
    setups().into_iter().filter(|s| s.root).collect()
}

/// The uid a non-root server of `setup` runs as (None: as the tests' own uid).
fn server_uid(setup: Setup) -> Option<u32> {
    (!setup.root && we_are_root())
        .then(|| NEXT_UID.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

/// Start a server for `setup` (as `uid`), or print why that level cannot run here.
async fn start_as(
    setup: Setup,
    uid: Option<u32>,
    args: &[&str],
    env: &[(&str, &str)],
) -> Option<TestServer> {
    let mut a = vec!["--sandbox", setup.level];
    a.extend_from_slice(args);
    match TestServer::try_start(&a, env, uid).await {
        Ok(s) => {
            let ins = s.instructions();
            assert!(
                ins.contains(&format!("Sandbox: {} (", setup.level)),
                "{setup:?}: the server reports another level: {ins}"
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

async fn start(setup: Setup, args: &[&str]) -> Option<TestServer> {
    start_as(setup, server_uid(setup), args, &[]).await
}

fn python() -> bool {
    require("python", "python3")
}

async fn session(s: &TestServer, setup: Setup, extra: Value) -> Out {
    let mut args = json!({"language": "python"});
    if let (Some(a), Some(e)) = (args.as_object_mut(), extra.as_object()) {
        a.extend(e.clone());
    }
    let o = s.call("session_start", args).await;
    if !o.is_error {
        assert_eq!(
            o.structured["sandbox"], setup.level,
            "{setup:?}: {}",
            o.text
        );
    }
    o
}

async fn eval(s: &TestServer, id: &str, code: &str) -> Out {
    s.call(
        "session_eval",
        json!({"session_id": id, "code": code, "timeout_ms": 60_000}),
    )
    .await
}

async fn read(s: &TestServer, uri: &str) -> Result<String, String> {
    read_with(s.client.peer(), uri).await
}

async fn read_with(peer: &Peer<RoleClient>, uri: &str) -> Result<String, String> {
    let r = peer
        .read_resource(ReadResourceRequestParams::new(uri))
        .await
        .map_err(|e| e.to_string())?;
    Ok(format!("{:?}", r.contents))
}

async fn listed(s: &TestServer) -> Vec<String> {
    s.client
        .list_all_resources()
        .await
        .expect("resources/list")
        .into_iter()
        .map(|r| r.uri)
        .collect()
}

fn file_uri(id: &str, path: &str) -> String {
    format!("replbox://sessions/{id}/files/{path}")
}

/// A directory for the test under /tmp with `mode`, owned by root (the tests' user).
fn dir(mode: u32) -> tempfile::TempDir {
    let d = tempfile::tempdir_in("/tmp").expect("tempdir");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(mode)).expect("chmod");
    d
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

// Finding 2 (critical): resources/read read as root under a caller's cwd: /proc gave the
// server's environment (its tokens), /etc gave /etc/shadow, and a root-only directory or
// another server's workspace were readable. Session files are now read and listed as the
// session's uid, beneath its directory, through no link and on no pseudo-filesystem, and
// such a cwd is refused.
#[tokio::test(flavor = "multi_thread")]
async fn finding_2_session_files_are_read_as_the_session_uid() {
    if !python() {
        return;
    }
    let tok = token();
    for setup in setups() {
        // A shared directory the operator allows, with links into /proc and a root-only part.
        let shared = dir(0o1777);
        let root_only = shared.path().join("private");
        std::fs::create_dir(&root_only).expect("mkdir");
        std::fs::write(root_only.join("secret.txt"), &tok).expect("write");
        chmod(&root_only, 0o700);
        std::fs::write(shared.path().join("mode600.txt"), &tok).expect("write");
        chmod(&shared.path().join("mode600.txt"), 0o600);
        std::fs::write(shared.path().join("ok.txt"), "fine").expect("write");
        let uid = server_uid(setup);
        let Some(srv) = start_as(
            setup,
            uid,
            &["--allow-cwd", s(shared.path())],
            &[("REPLBOX_TEST_SECRET", &tok)],
        )
        .await
        else {
            continue;
        };
        let pid = srv.pid;
        std::os::unix::fs::symlink(
            format!("/proc/{pid}/environ"),
            shared.path().join("environ"),
        )
        .expect("symlink");
        std::os::unix::fs::symlink("/proc", shared.path().join("proc")).expect("symlink");
        std::os::unix::fs::symlink("/etc", shared.path().join("etc")).expect("symlink");

        // Pseudo-filesystems and system runtime directories are never a cwd, by any path.
        for cwd in [
            "/proc".to_string(),
            format!("/proc/{pid}"),
            "/proc/self".to_string(),
            "/sys".to_string(),
            "/sys/kernel".to_string(),
            "/dev".to_string(),
            "/dev/shm".to_string(),
            "/run".to_string(),
            s(&shared.path().join("proc")).to_string(),
        ] {
            let o = session(&srv, setup, json!({ "cwd": cwd })).await;
            assert!(o.is_error, "{setup:?}: cwd {cwd} accepted: {}", o.text);
            assert!(!o.text.contains(&tok), "{setup:?}: {}", o.text);
        }

        // /etc may be a cwd (anyone can read it), but its root-only files stay unreadable.
        let o = session(&srv, setup, json!({"cwd": "/etc"})).await;
        assert!(!o.is_error, "{setup:?}: {}", o.text);
        let etc = o.s("session_id").to_string();
        let r = read(&srv, &file_uri(&etc, "shadow")).await;
        let err = r.expect_err("shadow read");
        assert!(!err.contains("root:"), "{setup:?}: {err}");
        assert!(read(&srv, &file_uri(&etc, "passwd")).await.is_ok());
        srv.call("session_close", json!({ "session_id": etc }))
            .await;

        // The shared directory: links into /proc are not followed; what the session's uid
        // cannot read is not read (as root, the pool uid; otherwise the server's own uid,
        // which can read its own files).
        let o = session(&srv, setup, json!({"cwd": shared.path()})).await;
        assert!(!o.is_error, "{setup:?}: {}", o.text);
        let id = o.s("session_id").to_string();
        assert!(read(&srv, &file_uri(&id, "ok.txt")).await.is_ok());
        for path in [
            "environ".to_string(),
            format!("proc/{pid}/environ"),
            "proc/self/environ".to_string(),
            "etc/shadow".to_string(),
        ] {
            let r = read(&srv, &file_uri(&id, &path)).await;
            let err = r.expect_err(&path);
            assert!(!err.contains(&tok), "{setup:?}: {path}: {err}");
        }
        if setup.root {
            for path in ["private/secret.txt", "mode600.txt"] {
                let r = read(&srv, &file_uri(&id, path)).await;
                assert!(r.is_err(), "{setup:?}: {path} read as root: {r:?}");
            }
            // Nor listed: the pool uid cannot enter the root-only directory.
            let uris = listed(&srv).await;
            assert!(
                uris.contains(&file_uri(&id, "ok.txt")),
                "{setup:?}: {uris:?}"
            );
            assert!(
                !uris.iter().any(|u| u.contains("secret.txt")),
                "{setup:?}: {uris:?}"
            );
        }
        // Links are not listed.
        let uris = listed(&srv).await;
        let links: Vec<&String> = uris
            .iter()
            .filter(|u| u.starts_with(&file_uri(&id, "")) && !u.ends_with(".txt"))
            .collect();
        assert!(links.is_empty(), "{setup:?}: {links:?}");

        // Another server's working area is not a cwd, and is neither listed nor read by a
        // session whose cwd contains it.
        let other_parent = shared.path().join("other");
        std::fs::create_dir(&other_parent).expect("mkdir");
        chmod(&other_parent, 0o755);
        if let Some(uid) = uid {
            std::os::unix::fs::chown(&other_parent, Some(uid), Some(uid)).expect("chown");
        }
        let Some(other) = start_as(setup, uid, &["--work-dir", s(&other_parent)], &[]).await else {
            continue;
        };
        let o = session(&other, setup, json!({})).await;
        assert!(!o.is_error, "{setup:?}: {}", o.text);
        let other_id = o.s("session_id").to_string();
        let other_cwd = PathBuf::from(o.s("cwd"));
        let o = eval(
            &other,
            &other_id,
            &format!("open('theirs.txt', 'w').write('{tok}')"),
        )
        .await;
        assert_eq!(status(&o), "ok", "{setup:?}: {}", o.text);
        let other_root = other_cwd
            .ancestors()
            .find(|a| a.parent() == Some(other_parent.as_path()))
            .expect("the other workspace's root")
            .to_path_buf();
        for cwd in [
            other_cwd.clone(),
            other_root.clone(),
            other_root.join("sessions"),
        ] {
            let o = session(&srv, setup, json!({ "cwd": cwd })).await;
            assert!(o.is_error, "{setup:?}: cwd {} accepted", cwd.display());
            assert!(o.text.contains("working area"), "{setup:?}: {}", o.text);
        }
        let o = session(&srv, setup, json!({"cwd": other_parent})).await;
        assert!(!o.is_error, "{setup:?}: {}", o.text);
        let around = o.s("session_id").to_string();
        let rel = other_cwd
            .strip_prefix(&other_parent)
            .expect("inside")
            .join("theirs.txt");
        let r = read(&srv, &file_uri(&around, s(&rel))).await;
        let err = r.expect_err("another server's session file");
        assert!(!err.contains(&tok), "{setup:?}: {err}");
        let uris = listed(&srv).await;
        assert!(
            !uris.iter().any(|u| u.contains("theirs.txt")),
            "{setup:?}: {uris:?}"
        );
        other.stop().await;
        srv.stop().await;
    }
}

// Finding 2 over HTTP, where one token read another's through the server's environment.
#[tokio::test(flavor = "multi_thread")]
async fn finding_2_over_http_no_token_leaks_through_resources() {
    if !python() {
        return;
    }
    const ALICE: &str = "token-of-alice-for-files-0123";
    const BOB: &str = "token-of-bob-for-files-456789";
    let setups: Vec<Setup> = if we_are_root() {
        root_setups()
    } else {
        setups()
    };
    for setup in setups {
        let shared = dir(0o1777);
        let Some(srv) = start_http(
            setup,
            &["--allow-cwd", s(shared.path())],
            &format!("{ALICE},{BOB}"),
        )
        .await
        else {
            continue;
        };
        let pid = srv.pid;
        std::os::unix::fs::symlink(
            format!("/proc/{pid}/environ"),
            shared.path().join("environ"),
        )
        .expect("symlink");
        std::os::unix::fs::symlink("/proc", shared.path().join("proc")).expect("symlink");
        let alice = srv.connect(ALICE).await;
        for cwd in [
            "/proc".to_string(),
            format!("/proc/{pid}"),
            s(&shared.path().join("proc")).to_string(),
        ] {
            let o = http_call(
                alice.peer(),
                "session_start",
                json!({"language": "python", "cwd": cwd}),
            )
            .await;
            assert!(o.is_error, "{setup:?}: cwd {cwd} accepted over HTTP");
            assert!(!o.text.contains(BOB), "{setup:?}: {}", o.text);
        }
        let o = http_call(
            alice.peer(),
            "session_start",
            json!({"language": "python", "cwd": shared.path()}),
        )
        .await;
        assert!(!o.is_error, "{setup:?}: {}", o.text);
        let id = o.s("session_id").to_string();
        for path in [
            "environ".to_string(),
            format!("proc/{pid}/environ"),
            "proc/self/environ".to_string(),
        ] {
            let r = read_with(alice.peer(), &file_uri(&id, &path)).await;
            let err = r.expect_err(&path);
            assert!(!err.contains(BOB), "{setup:?}: {path}: {err}");
        }
        let all = alice
            .peer()
            .list_all_resources()
            .await
            .expect("resources/list");
        assert!(!format!("{all:?}").contains(BOB), "{setup:?}");
        let _ = alice.cancel().await;
        srv.stop().await;
    }
}

// Finding 3 (high): `files` were written as root: into /etc, through a link a session had
// planted, and left behind when the start failed. They are now checked before anything is
// written, then written as the session's uid beneath the directory, through no link.
#[tokio::test(flavor = "multi_thread")]
async fn finding_3_files_are_written_as_the_session_uid_through_no_link() {
    if !python() {
        return;
    }
    let tok = token();
    let prompts = broken_language();
    for setup in setups() {
        let shared = dir(0o1777);
        let root_only = dir(0o700);
        std::fs::write(root_only.path().join("secret.txt"), &tok).expect("write");
        let Some(srv) = start(
            setup,
            &[
                "--allow-cwd",
                s(shared.path()),
                "--prompts",
                s(prompts.path()),
            ],
        )
        .await
        else {
            continue;
        };
        // Into a directory the session's uid may not write: refused, nothing created.
        let name = format!("replbox-{tok}");
        let o = session(
            &srv,
            setup,
            json!({"cwd": "/etc", "files": [{"name": name, "content": "x"}]}),
        )
        .await;
        assert!(o.is_error, "{setup:?}: {}", o.text);
        assert!(o.text.contains("may not write"), "{setup:?}: {}", o.text);
        assert!(!Path::new("/etc").join(&name).exists(), "{setup:?}");

        // Everything is checked before anything is written.
        let o = session(
            &srv,
            setup,
            json!({"cwd": shared.path(), "files": [
                {"name": "first.txt", "content": "1"},
                {"name": "../escape.txt", "content": "2"}
            ]}),
        )
        .await;
        assert!(o.is_error, "{setup:?}: {}", o.text);
        assert!(!shared.path().join("first.txt").exists(), "{setup:?}");

        // A start that fails after the files were written takes them away again.
        let o = srv
            .call(
                "session_start",
                json!({"language": "brokenrepl", "cwd": shared.path(),
                       "files": [{"name": "left.txt", "content": "x"}]}),
            )
            .await;
        assert!(
            o.is_error,
            "{setup:?}: the broken language started: {}",
            o.text
        );
        assert!(
            !shared.path().join("left.txt").exists(),
            "{setup:?}: a failed start left its file: {}",
            o.text
        );

        // Session code plants links in the shared directory; a later start writes through
        // none of them.
        let o = session(&srv, setup, json!({"cwd": shared.path()})).await;
        assert!(!o.is_error, "{setup:?}: {}", o.text);
        let planter = o.s("session_id").to_string();
        let o = eval(
            &srv,
            &planter,
            &format!(
                "import os\nos.symlink({rd:?}, 'lnk')\nos.symlink({new:?}, 'dangling')\nos.symlink('/etc', 'etc')",
                rd = s(root_only.path()),
                new = s(&root_only.path().join("new.txt")),
            ),
        )
        .await;
        assert_eq!(status(&o), "ok", "{setup:?}: {}", o.text);
        for name in ["lnk/f.txt", "dangling", "etc/replbox-through-link", "lnk"] {
            let o = session(
                &srv,
                setup,
                json!({"cwd": shared.path(), "files": [{"name": name, "content": tok}]}),
            )
            .await;
            assert!(o.is_error, "{setup:?}: {name}: {}", o.text);
        }
        assert!(!root_only.path().join("f.txt").exists(), "{setup:?}");
        assert!(!root_only.path().join("new.txt").exists(), "{setup:?}");
        assert!(
            !Path::new("/etc/replbox-through-link").exists(),
            "{setup:?}"
        );

        // Host files (the local principal's `path`) are read as the session's uid, and
        // never from a pseudo-filesystem.
        let mut refused = vec![
            "/proc/self/environ".to_string(),
            format!("/proc/{}/environ", srv.pid),
            "/dev/fd/0".to_string(),
            "/sys/kernel/notes".to_string(),
        ];
        if setup.root {
            refused.push("/etc/shadow".into());
            refused.push(s(&root_only.path().join("secret.txt")).to_string());
        }
        for path in refused {
            let o = session(
                &srv,
                setup,
                json!({"files": [{"path": path, "name": "copy.txt"}]}),
            )
            .await;
            assert!(o.is_error, "{setup:?}: copied {path}: {}", o.text);
            assert!(!o.text.contains(&tok), "{setup:?}: {}", o.text);
        }

        // What is written belongs to the session's uid.
        let o = session(
            &srv,
            setup,
            json!({"files": [{"name": "sub/mine.txt", "content": "mine"}]}),
        )
        .await;
        assert!(!o.is_error, "{setup:?}: {}", o.text);
        let id = o.s("session_id").to_string();
        let made = PathBuf::from(o.s("cwd")).join("sub/mine.txt");
        let o = eval(&srv, &id, "import os; print(os.getuid())").await;
        let uid: u32 = output(&o).trim().parse().expect("uid");
        let meta = std::fs::metadata(&made).expect("the file is there");
        assert_eq!(meta.uid(), uid, "{setup:?}");
        if we_are_root() {
            assert_eq!(meta.gid(), uid, "{setup:?}: the pool's gid is its uid");
        }
        if setup.root {
            assert_ne!(uid, 0, "{setup:?}");
        }
        srv.stop().await;
    }
}

/// A prompts directory with a session language whose interpreter exits at once.
fn broken_language() -> tempfile::TempDir {
    let d = tempfile::tempdir().expect("tempdir");
    let lang = d.path().join("brokenrepl");
    std::fs::create_dir(&lang).expect("mkdir");
    std::fs::write(lang.join("bootstrap.sh"), "").expect("write");
    std::fs::write(
        lang.join("language.toml"),
        r#"id = "brokenrepl"
name = "Broken REPL"
programs = ["bash"]
version = { args = ["--version"], regex = 'version (\d[\w.]*)' }

[run]
file = "main.sh"
command = ["{exe}", "{file}"]

[session]
command = ["{exe}", "-c", "exit 3"]
bootstrap = { file = "bootstrap.sh" }
cell_file = "cell-{n}.sh"
eval = "x {n}"
prompt = "\u001b_rbx;{nonce};p\u001b\\"
"#,
    )
    .expect("write");
    chmod(d.path(), 0o755);
    chmod(&lang, 0o755);
    d
}

// Finding 8 (medium): a cwd inside a masked 0700 home (/root/.cargo) was accepted, and bwrap
// relaxed its parents for the pool uid. A cwd must now lie outside the masked trees (unless
// the operator allows it) and be reachable by the session's uid on the host.
#[tokio::test(flavor = "multi_thread")]
async fn finding_8_cwd_is_reachable_by_the_session_uid_and_outside_masked_trees() {
    if !python() {
        return;
    }
    for setup in setups() {
        let Some(srv) = start(setup, &[]).await else {
            continue;
        };
        // Masked trees (the defaults, and a symlink into one) are refused with the flag to use.
        let open = dir(0o755);
        std::os::unix::fs::symlink("/root", open.path().join("to-root")).expect("symlink");
        for cwd in [
            "/root".to_string(),
            "/root/.cargo".to_string(),
            "/home".to_string(),
            s(open.path()).to_string(),
            s(&open.path().join("to-root")).to_string(),
        ] {
            let o = session(&srv, setup, json!({ "cwd": cwd })).await;
            assert!(o.is_error, "{setup:?}: cwd {cwd} accepted: {}", o.text);
            if cwd != "/root" || setup.root {
                assert!(
                    o.text.contains("--allow-cwd") || o.text.contains("cannot enter"),
                    "{setup:?}: {cwd}: {}",
                    o.text
                );
            }
        }
        let o = session(&srv, setup, json!({"cwd": "/root/.cargo"})).await;
        assert!(o.text.contains("--allow-cwd"), "{setup:?}: {}", o.text);
        srv.stop().await;

        // Allowed by the operator (flag or variable), but with a parent the session's uid
        // cannot search: refused, saying which directory needs which permission.
        let allowed = dir(0o755);
        let locked = allowed.path().join("locked");
        std::fs::create_dir_all(locked.join("inner")).expect("mkdir");
        chmod(&locked, 0o700);
        chmod(&locked.join("inner"), 0o777);
        let uid = server_uid(setup);
        let both = format!("{}:/root/.cargo", s(allowed.path()));
        let Some(srv) = start_as(setup, uid, &[], &[("REPLBOX_ALLOW_CWD", &both)]).await else {
            continue;
        };
        let o = session(&srv, setup, json!({"cwd": allowed.path()})).await;
        assert!(!o.is_error, "{setup:?}: allowed by variable: {}", o.text);
        let o = session(&srv, setup, json!({"cwd": locked.join("inner")})).await;
        assert!(o.is_error, "{setup:?}: {}", o.text);
        assert!(
            o.text.contains("cannot enter") && o.text.contains(s(&locked)),
            "{setup:?}: {}",
            o.text
        );
        // /root is 0700: allowing /root/.cargo is not enough for the session's uid.
        let o = session(&srv, setup, json!({"cwd": "/root/.cargo"})).await;
        let root_searchable = std::fs::metadata("/root").is_ok_and(|m| m.mode() & 0o001 != 0);
        if !root_searchable {
            assert!(o.is_error, "{setup:?}: {}", o.text);
            assert!(
                o.text.contains("cannot enter") && o.text.contains("/root"),
                "{setup:?}: {}",
                o.text
            );
        }
        srv.stop().await;
    }
}

// Finding 9 (low-medium, none): another session's ctl/ (its cells, with whatever secrets
// the code held, and its nonce) was readable. It is now root's, group of the session's uid,
// 0750, files 0640.
#[tokio::test(flavor = "multi_thread")]
async fn finding_9_ctl_is_readable_only_by_its_session() {
    if !python() {
        return;
    }
    let tok = token();
    for setup in root_setups() {
        let Some(srv) = start(setup, &[]).await else {
            continue;
        };
        let o = session(&srv, setup, json!({})).await;
        assert!(!o.is_error, "{setup:?}: {}", o.text);
        let a = o.s("session_id").to_string();
        let ctl = PathBuf::from(o.s("cwd"))
            .parent()
            .expect("session dir")
            .join("ctl");
        let o = eval(
            &srv,
            &a,
            &format!("secret = '{tok}'\nimport os\nos.getuid()"),
        )
        .await;
        let a_uid: u32 = output(&o).trim().parse().expect("uid");
        let meta = std::fs::metadata(&ctl).expect("ctl");
        assert_eq!(meta.mode() & 0o7777, 0o2750, "{setup:?}");
        assert_eq!((meta.uid(), meta.gid()), (0, a_uid), "{setup:?}");
        for e in std::fs::read_dir(&ctl).expect("ctl").flatten() {
            let m = e.metadata().expect("stat");
            assert_eq!(m.mode() & 0o777, 0o640, "{setup:?}: {:?}", e.path());
            assert_eq!(m.gid(), a_uid, "{setup:?}: {:?}", e.path());
        }
        // Session a can still read its own (it runs its cells from there).
        let o = eval(&srv, &a, "print(secret[:7])").await;
        assert_eq!(output(&o), "canary-\n", "{setup:?}: {}", o.text);

        let o = session(&srv, setup, json!({})).await;
        let b = o.s("session_id").to_string();
        let code = format!(
            r#"
import os
r = []
for p in [{ctl:?}, {cell:?}]:
    try:
        r.append(repr(os.listdir(p)) if os.path.isdir(p) else open(p).read())
    except OSError as e:
        r.append(type(e).__name__)
print(r)
"#,
            ctl = s(&ctl),
            cell = s(&ctl.join("cell-1.py")),
        );
        let o = eval(&srv, &b, &code).await;
        assert_eq!(status(&o), "ok", "{setup:?}: {}", o.text);
        assert!(!output(&o).contains(&tok), "{setup:?}: {}", output(&o));
        assert!(!output(&o).contains("cell-"), "{setup:?}: {}", output(&o));
        srv.stop().await;
    }
}

// Finding 10 (low-medium): per-uid caches carried files from one session to the next on
// that uid (a matplotlibrc planted in MPLCONFIGDIR). Caches now live and die with their
// session or run; within one they still work (matplotlib's font cache).
#[tokio::test(flavor = "multi_thread")]
async fn finding_10_caches_do_not_carry_between_sessions() {
    if !python() {
        return;
    }
    let plant = "import os\nd = os.environ['MPLCONFIGDIR']\nos.makedirs(d, exist_ok=True)\nopen(os.path.join(d, 'matplotlibrc'), 'w').write('lines.linewidth: 42\\n')\nprint(os.getuid())";
    let look = "import os\nprint(os.getuid(), os.path.exists(os.path.join(os.environ['MPLCONFIGDIR'], 'matplotlibrc')))";
    for setup in setups() {
        // As root, a pool of one uid (of its own): every session and run gets the uid the
        // previous one planted in.
        let Some(srv) = start(setup, &["--uid-base", "120000", "--uids", "1"]).await else {
            continue;
        };
        let o = session(&srv, setup, json!({})).await;
        let a = o.s("session_id").to_string();
        let o = eval(&srv, &a, plant).await;
        assert_eq!(status(&o), "ok", "{setup:?}: {}", o.text);
        let uid_a = output(&o).trim().to_string();
        srv.call("session_close", json!({"session_id": a})).await;
        let o = when_a_uid_is_free(|| session(&srv, setup, json!({}))).await;
        let b = o.s("session_id").to_string();
        let o = eval(&srv, &b, look).await;
        assert_eq!(
            output(&o),
            format!("{uid_a} False\n"),
            "{setup:?}: {}",
            o.text
        );
        // matplotlib's font cache still works. Only bwrap binds in an interpreter from a
        // masked tree (the tests' pyenv under /root): at the other levels, or as another
        // uid, the python found may lack matplotlib.
        let o = eval(
            &srv,
            &b,
            "import os\ntry:\n    import matplotlib\nexcept ImportError:\n    print('no matplotlib')\nelse:\n    import matplotlib.font_manager\n    d = matplotlib.get_cachedir()\n    print(d == os.environ['MPLCONFIGDIR'], any(f.startswith('fontlist') for f in os.listdir(d)))",
        )
        .await;
        if output(&o) == "no matplotlib\n" {
            if setup.root && setup.level == "bwrap" && require_all() {
                panic!("{setup:?}: matplotlib is missing, and REPLBOX_REQUIRE_ALL=1 requires it");
            }
            skip_optional(format!("{setup:?}: the font cache check needs matplotlib"));
        } else {
            assert_eq!(output(&o), "True True\n", "{setup:?}: {}", o.text);
        }
        // Runs alike.
        srv.call("session_close", json!({ "session_id": b })).await;
        let o = when_a_uid_is_free(|| srv.run("python", plant)).await;
        assert!(!o.is_error, "{setup:?}: {}", o.text);
        assert_eq!(o.text, format!("{uid_a}\n"), "{setup:?}");
        let o = when_a_uid_is_free(|| srv.run("python", look)).await;
        assert!(o.text.ends_with(" False\n"), "{setup:?}: {}", o.text);
        srv.stop().await;
    }
}

/// Call `f` until its answer is not "all uids in use" (a uid goes back to the pool once the
/// previous holder's processes are confirmed gone, which may finish after close returns).
async fn when_a_uid_is_free<F, Fut>(f: F) -> Out
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
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// A caller's cwd the session's uid may not write (a root-owned 0755 directory while the
// server runs as root) is accepted read-only, and the start result says so and what the
// directory needs; the server never writes there with its own rights.
#[tokio::test(flavor = "multi_thread")]
async fn a_cwd_the_session_cannot_write_is_read_only_and_says_so() {
    if !python() {
        return;
    }
    if !we_are_root() {
        // Every directory the tests can make is then writable by the server's own user.
        skip_optional("a directory the session cannot write needs the tests to run as root");
        return;
    }
    for setup in setups() {
        let ro = dir(0o755);
        std::fs::write(ro.path().join("data.txt"), "readable").expect("write");
        let rw = dir(0o1777);
        let Some(srv) = start(
            setup,
            &["--allow-cwd", s(ro.path()), "--allow-cwd", s(rw.path())],
        )
        .await
        else {
            continue;
        };
        let o = session(&srv, setup, json!({"cwd": ro.path()})).await;
        assert!(!o.is_error, "{setup:?}: {}", o.text);
        assert_eq!(o.structured["cwd_writable"], false, "{setup:?}: {}", o.text);
        let note = o.structured["notes"].to_string();
        assert!(
            note.contains("read-only") && note.contains("write"),
            "{setup:?}: {note}"
        );
        assert!(o.text.contains("read-only"), "{setup:?}: {}", o.text);
        let id = o.s("session_id").to_string();
        let o = eval(
            &srv,
            &id,
            "print(open('data.txt').read())\ntry:\n    open('new.txt', 'w')\nexcept OSError as e:\n    print(type(e).__name__)",
        )
        .await;
        assert_eq!(output(&o), "readable\nPermissionError\n", "{setup:?}");
        assert!(!ro.path().join("new.txt").exists());
        // Files cannot be brought into it either.
        let o = session(
            &srv,
            setup,
            json!({"cwd": ro.path(), "files": [{"name": "x.txt", "content": "x"}]}),
        )
        .await;
        assert!(o.is_error && o.text.contains("may not write"), "{}", o.text);
        assert!(!ro.path().join("x.txt").exists());

        let o = session(&srv, setup, json!({"cwd": rw.path()})).await;
        assert!(!o.is_error, "{setup:?}: {}", o.text);
        assert_eq!(o.structured["cwd_writable"], true, "{setup:?}");
        let id = o.s("session_id").to_string();
        let o = eval(&srv, &id, "open('made.txt', 'w').write('x')").await;
        assert_eq!(status(&o), "ok", "{setup:?}: {}", o.text);
        assert!(rw.path().join("made.txt").is_file());
        srv.stop().await;
    }
}

// ----- HTTP -----

/// `replbox serve --http 127.0.0.1:0 --sandbox LEVEL` with `tokens` (the harness's
/// `Server::http()`), or None (skipped, a failure in CI) when it does not start.
async fn start_http(setup: Setup, args: &[&str], tokens: &str) -> Option<HttpServer> {
    match Server::http()
        .args(["--sandbox", setup.level])
        .args(args)
        .env("REPLBOX_TOKENS", tokens)
        .try_start()
        .await
    {
        Ok(srv) => Some(srv),
        Err(e) => {
            skip(format!("{setup:?}: the HTTP server did not start: {e}"));
            None
        }
    }
}

/// The inotify watches the server holds (`wd:` lines of its inotify descriptors' fdinfo).
fn inotify_watches(pid: u32) -> usize {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    let mut n = 0;
    for fd in fds.flatten() {
        let is_inotify =
            std::fs::read_link(fd.path()).is_ok_and(|t| t.to_string_lossy().contains("inotify"));
        if is_inotify {
            let info = std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                fd.file_name().to_string_lossy()
            ))
            .unwrap_or_default();
            n += info
                .lines()
                .filter(|l| l.starts_with("inotify wd:"))
                .count();
        }
    }
    n
}

fn changes(o: &Out) -> Vec<(String, String)> {
    o.structured["files"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|f| {
                    (
                        f["path"].as_str().unwrap_or("").to_string(),
                        f["change"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

// Change tracking of a big session directory is kept by inotify watches: they are added as
// the session's uid on directories opened through no link, so a link out of the directory
// or a directory that uid cannot read is never watched, and what is written through a link
// is not reported.
#[tokio::test(flavor = "multi_thread")]
async fn watched_directories_follow_no_link_and_read_as_the_session_uid() {
    if !python() {
        return;
    }
    for setup in setups() {
        // Not sticky, and the files writable: the session changes the test's files.
        let shared = dir(0o777);
        for i in 0..300 {
            let f = shared.path().join(format!("f{i:03}"));
            std::fs::write(&f, "x").expect("write");
            chmod(&f, 0o666);
        }
        let root_only = shared.path().join("private");
        std::fs::create_dir(&root_only).expect("mkdir");
        chmod(&root_only, 0o700);
        let outside = dir(0o1777);
        std::fs::create_dir(outside.path().join("deep")).expect("mkdir");
        chmod(&outside.path().join("deep"), 0o777);
        std::os::unix::fs::symlink(outside.path(), shared.path().join("out")).expect("symlink");
        let Some(srv) = start(setup, &["--allow-cwd", s(shared.path())]).await else {
            continue;
        };
        let o = session(&srv, setup, json!({"cwd": shared.path()})).await;
        assert!(!o.is_error, "{setup:?}: {}", o.text);
        let id = o.s("session_id").to_string();
        // Only the directory itself: not the link's target, not the root-only folder.
        assert_eq!(inotify_watches(srv.pid), 1, "{setup:?}");

        // Written beside the session's code (at bwrap the link's target is not in its view).
        std::fs::write(root_only.join("hidden-from-uid"), "r").expect("write");
        std::fs::write(outside.path().join("through-link"), "t").expect("write");
        let o = eval(
            &srv,
            &id,
            "import os\nopen('new.txt', 'w').write('n')\nopen('f001', 'a').write('more')\nos.remove('f002')\nos.makedirs('d/e')\nopen('d/e/x', 'w').write('x')",
        )
        .await;
        assert_eq!(status(&o), "ok", "{setup:?}: {}", o.text);
        assert_eq!(
            changes(&o),
            [
                ("d/e/x".to_string(), "created".to_string()),
                ("f001".into(), "modified".into()),
                ("f002".into(), "deleted".into()),
                ("new.txt".into(), "created".into()),
            ],
            "{setup:?}: {}",
            o.text
        );
        assert_eq!(
            inotify_watches(srv.pid),
            3,
            "{setup:?}: d and d/e are watched"
        );

        // A watched folder swapped for a link: its files are gone, the target is not
        // entered, and writes beneath the target are not the session's.
        let o = eval(
            &srv,
            &id,
            &format!(
                "import shutil\nshutil.rmtree('d')\nos.symlink({:?}, 'd')",
                s(outside.path())
            ),
        )
        .await;
        std::fs::write(outside.path().join("deep/y"), "y").expect("write");
        assert_eq!(status(&o), "ok", "{setup:?}: {}", o.text);
        assert_eq!(
            changes(&o),
            [("d/e/x".to_string(), "deleted".to_string())],
            "{setup:?}: {}",
            o.text
        );
        assert_eq!(inotify_watches(srv.pid), 1, "{setup:?}");
        let o = eval(&srv, &id, "1").await;
        assert_eq!(changes(&o), [], "{setup:?}: {}", o.text);
        srv.call("session_close", json!({ "session_id": id })).await;
        assert_eq!(
            inotify_watches(srv.pid),
            0,
            "{setup:?}: closed with the session"
        );
        srv.stop().await;
    }
}
