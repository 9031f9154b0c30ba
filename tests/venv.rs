//! Python virtual environments, through the MCP client at every sandbox level, with the
//! server as root and as an unprivileged uid: a caller's `venv` (run-code, session_start)
//! and a `.venv` in a session's cwd become the interpreter (`sys.prefix` is the venv's, its
//! packages import); one its user cannot reach is refused saying what to do; a hostile one
//! never makes the server run anything as root; the operator's venv (first on PATH, or
//! `--python`) is used or its refusal said. Venvs are made with `python3 -m venv
//! --without-pip` from a Python every user can run, with a local package dropped into
//! their site-packages (nothing from the network).

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::*;
use serde_json::{Value, json};

/// Unprivileged servers (when the tests run as root) get uids of their own from here.
static NEXT_UID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(62_000);
const ALL: &[&str] = &["bwrap", "landlock", "none"];

#[derive(Debug, Clone, Copy)]
struct Setup {
    level: &'static str,
    root: bool,
}

fn we_are_root() -> bool {
    nix::unistd::geteuid().is_root()
}

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

/// Start a server for `setup`, or say why that level cannot run here (a failure in CI).
async fn start(setup: Setup, args: &[&str], env: &[(&str, &str)]) -> Option<TestServer> {
    let mut a = vec!["--sandbox", setup.level];
    a.extend_from_slice(args);
    let uid = (!setup.root && we_are_root())
        .then(|| NEXT_UID.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    match TestServer::try_start(&a, env, uid).await {
        Ok(s) => {
            assert!(
                s.instructions()
                    .contains(&format!("Sandbox: {} (", setup.level)),
                "{setup:?}: {}",
                s.instructions()
            );
            Some(s)
        }
        Err(e) => {
            skip(format!("{setup:?}: level {} fails here: {e}", setup.level));
            None
        }
    }
}

/// A python3 on PATH that every user can run (the pool's uids make venvs from it work at
/// every level), or a printed reason why not.
fn base_python() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .map(|d| d.join("python3"))
        .find(|p| p.is_file() && replbox::api::reachable_by_others(p));
    if found.is_none() {
        skip("venv tests: no python3 on PATH that other users can run");
    }
    found
}

/// A directory under /tmp the pool's uids can enter (the server is given `--allow-cwd`
/// for it: /tmp is masked).
fn shared_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir_in("/tmp").expect("tempdir");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    d
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// `python -m venv --without-pip DIR`, with the module `rbxdemo` (`VALUE = 42`) in its
/// site-packages. Returns the venv's version as its pyvenv.cfg states it.
fn make_venv(python: &Path, dir: &Path) -> String {
    let out = std::process::Command::new(python)
        .args(["-m", "venv", "--without-pip"])
        .arg(dir)
        .output()
        .expect("run python -m venv");
    assert!(
        out.status.success(),
        "python -m venv: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let site = std::fs::read_dir(dir.join("lib"))
        .expect("lib/")
        .flatten()
        .map(|e| e.path().join("site-packages"))
        .find(|p| p.is_dir())
        .expect("site-packages");
    std::fs::write(site.join("rbxdemo.py"), "VALUE = 42\n").expect("write the package");
    let cfg = std::fs::read_to_string(dir.join("pyvenv.cfg")).expect("pyvenv.cfg");
    cfg.lines()
        .find_map(|l| l.strip_prefix("version = "))
        .unwrap_or("unknown")
        .trim()
        .to_string()
}

/// Code that shows whether the venv `root` is the interpreter's prefix, and its package.
fn probe(root: &Path) -> String {
    format!(
        "import sys, rbxdemo\nprint(sys.prefix == {:?}, sys.prefix != sys.base_prefix, rbxdemo.VALUE)",
        s(root)
    )
}

fn interpreter(o: &Out) -> &Value {
    &o.structured["interpreter"]
}

#[tokio::test(flavor = "multi_thread")]
async fn a_venv_is_the_interpreter_of_runs_and_sessions() {
    let Some(python) = base_python() else {
        return;
    };
    let base = shared_dir();
    let venv = base.path().join("env");
    let version = make_venv(&python, &venv);
    let project = base.path().join("project");
    std::fs::create_dir(&project).expect("mkdir");
    let dotvenv = project.join(".venv");
    make_venv(&python, &dotvenv);
    for setup in setups() {
        let Some(srv) = start(setup, &["--allow-cwd", s(base.path())], &[]).await else {
            continue;
        };
        // session_start with venv.
        let o = srv
            .call("session_start", json!({"language": "python", "venv": venv}))
            .await;
        assert!(!o.is_error, "{setup:?}: {}", o.text);
        assert_eq!(
            interpreter(&o)["why"],
            "venv",
            "{setup:?}: {}",
            o.structured
        );
        assert_eq!(interpreter(&o)["venv"], s(&venv), "{setup:?}");
        assert_eq!(
            interpreter(&o)["path"],
            s(&venv.join("bin/python")),
            "{setup:?}"
        );
        assert_eq!(o.s("version"), version, "{setup:?}");
        assert!(
            o.text.contains("(the venv argument)"),
            "{setup:?}: {}",
            o.text
        );
        let id = o.s("session_id").to_string();
        let e = srv.eval(&id, &probe(&venv)).await;
        assert_eq!(output(&e), "True True 42\n", "{setup:?}: {}", e.text);
        // Activated as `source bin/activate` would: its bin/ first on PATH, VIRTUAL_ENV.
        let e = srv
            .eval(
                &id,
                "import os, shutil\nprint(os.environ['VIRTUAL_ENV'], shutil.which('python'))",
            )
            .await;
        assert_eq!(
            output(&e),
            format!("{} {}\n", s(&venv), s(&venv.join("bin/python"))),
            "{setup:?}"
        );
        // run-code with venv: cold, the same interpreter.
        let o = srv
            .call(
                "run-code",
                json!({"languageId": "python", "code": probe(&venv), "venv": venv}),
            )
            .await;
        assert_eq!(o.text, "True True 42\n", "{setup:?}: {}", o.text);
        assert_eq!(interpreter(&o)["why"], "venv", "{setup:?}");
        // A cwd holding .venv uses it.
        let o = srv
            .call(
                "session_start",
                json!({"language": "python", "cwd": project}),
            )
            .await;
        assert!(!o.is_error, "{setup:?}: {}", o.text);
        assert_eq!(interpreter(&o)["why"], "cwd_venv", "{setup:?}");
        let id = o.s("session_id").to_string();
        let e = srv.eval(&id, &probe(&dotvenv)).await;
        assert_eq!(output(&e), "True True 42\n", "{setup:?}: {}", e.text);
        // Without venv the server's own Python, which says why it is the one.
        let o = srv
            .call("run-code", json!({"languageId": "python", "code": "import sys\nprint(sys.prefix == sys.base_prefix)"}))
            .await;
        assert_eq!(o.text, "True\n", "{setup:?}");
        assert_eq!(interpreter(&o)["why"], "path", "{setup:?}");
        // Other languages take no venv.
        let o = srv
            .call("session_start", json!({"language": "bash", "venv": venv}))
            .await;
        assert_eq!(o.error_kind(), "invalid_argument", "{setup:?}: {}", o.text);
        srv.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_venv_its_user_cannot_reach_is_refused_saying_what_to_do() {
    let Some(python) = base_python() else {
        return;
    };
    let base = shared_dir();
    let locked = base.path().join("locked");
    std::fs::create_dir(&locked).expect("mkdir");
    let venv = locked.join("env");
    make_venv(&python, &venv);
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    // A project whose .venv is out of reach: the session starts with the server's Python
    // and says why.
    let project = base.path().join("project");
    std::fs::create_dir(&project).expect("mkdir");
    std::os::unix::fs::symlink(&venv, project.join(".venv")).expect("symlink");
    let not_a_venv = base.path().join("plain");
    std::fs::create_dir(&not_a_venv).expect("mkdir");
    let elsewhere = shared_dir();
    let hidden = elsewhere.path().join("env");
    make_venv(&python, &hidden);
    for setup in setups() {
        // A non-root server as root's 0700 directory is another user, as a pool uid is.
        let Some(srv) = start(setup, &["--allow-cwd", s(base.path())], &[]).await else {
            continue;
        };
        for tool in ["session_start", "run-code"] {
            let args = |v: &Path| {
                if tool == "run-code" {
                    json!({"languageId": "python", "code": "print(1)", "venv": v})
                } else {
                    json!({"language": "python", "venv": v})
                }
            };
            let o = srv.call(tool, args(&venv)).await;
            assert_eq!(
                o.error_kind(),
                "invalid_argument",
                "{setup:?} {tool}: {}",
                o.text
            );
            assert!(
                o.text.contains("cannot enter") && o.text.contains("chmod o+x"),
                "{setup:?} {tool}: {}",
                o.text
            );
            let o = srv.call(tool, args(&not_a_venv)).await;
            assert_eq!(o.error_kind(), "invalid_argument", "{setup:?} {tool}");
            assert!(
                o.text.contains("not a Python virtual environment"),
                "{setup:?} {tool}: {}",
                o.text
            );
            // In a masked tree the operator did not allow.
            let o = srv.call(tool, args(&hidden)).await;
            assert_eq!(o.error_kind(), "invalid_argument", "{setup:?} {tool}");
            assert!(
                o.text.contains("--allow-cwd"),
                "{setup:?} {tool}: {}",
                o.text
            );
            for bad in ["relative/env", "/proc/self"] {
                let o = srv.call(tool, args(Path::new(bad))).await;
                assert_eq!(o.error_kind(), "invalid_argument", "{setup:?} {tool} {bad}");
            }
        }
        let o = srv
            .call(
                "session_start",
                json!({"language": "python", "cwd": project}),
            )
            .await;
        assert!(!o.is_error, "{setup:?}: {}", o.text);
        assert_eq!(interpreter(&o)["why"], "path", "{setup:?}");
        let notes = o.structured["notes"].to_string();
        assert!(
            notes.contains(".venv in cwd was not used") && notes.contains("cannot enter"),
            "{setup:?}: {notes}"
        );
        srv.stop().await;
    }
}

/// Files named `ran-*` in `dir`: what the hostile interpreters left (their name says as
/// which uid they ran).
fn ran(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("ran-"))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_venv_never_runs_anything_as_root() {
    if !require("python", "python3") {
        return;
    }
    let base = shared_dir();
    let marks = base.path().join("marks");
    std::fs::create_dir(&marks).expect("mkdir");
    std::fs::set_permissions(&marks, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let script = |name: &str| {
        format!(
            "#!/bin/sh\nid -u > {}/ran-{name}-$(id -u)\nexit 7\n",
            s(&marks)
        )
    };
    // `home` names a directory whose python3 would leave a mark if anything ran it.
    let home = base.path().join("home");
    std::fs::create_dir(&home).expect("mkdir");
    for name in ["python3", "python"] {
        std::fs::write(home.join(name), script("home")).expect("write");
        std::fs::set_permissions(home.join(name), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
    }
    let cfg = format!(
        "home = {}\ninclude-system-site-packages = false\nversion = 3.99.0\n",
        s(&home)
    );
    // bin/python -> /bin/sh
    let shell = base.path().join("shell");
    std::fs::create_dir_all(shell.join("bin")).expect("mkdir");
    std::fs::write(shell.join("pyvenv.cfg"), &cfg).expect("write");
    std::os::unix::fs::symlink("/bin/sh", shell.join("bin/python")).expect("symlink");
    // bin/python is a script that passes for python: only a confined child may run it.
    let fake = base.path().join("fake");
    std::fs::create_dir_all(fake.join("bin")).expect("mkdir");
    std::fs::write(fake.join("pyvenv.cfg"), &cfg).expect("write");
    std::fs::write(fake.join("bin/python"), script("venv")).expect("write");
    std::fs::set_permissions(
        fake.join("bin/python"),
        std::fs::Permissions::from_mode(0o755),
    )
    .expect("chmod");
    // bin/python -> a file of a hidden tree (/root is masked and not allowed).
    let secret = base.path().join("secret");
    std::fs::create_dir_all(secret.join("bin")).expect("mkdir");
    std::fs::write(secret.join("pyvenv.cfg"), &cfg).expect("write");
    std::os::unix::fs::symlink("/root/.profile", secret.join("bin/python")).expect("symlink");
    for setup in setups() {
        let Some(srv) = start(setup, &["--allow-cwd", s(base.path())], &[]).await else {
            continue;
        };
        let o = srv
            .call(
                "session_start",
                json!({"language": "python", "venv": shell}),
            )
            .await;
        assert_eq!(o.error_kind(), "invalid_argument", "{setup:?}: {}", o.text);
        assert!(
            o.text.contains("not a Python interpreter"),
            "{setup:?}: {}",
            o.text
        );
        let o = srv
            .call(
                "session_start",
                json!({"language": "python", "venv": secret}),
            )
            .await;
        assert_eq!(o.error_kind(), "invalid_argument", "{setup:?}: {}", o.text);
        // The fake one is user code: it may run, confined, as the session's uid.
        let o = srv
            .call("session_start", json!({"language": "python", "venv": fake}))
            .await;
        assert!(o.is_error, "{setup:?}: {}", o.text);
        assert_eq!(o.error_kind(), "start_failed", "{setup:?}: {}", o.text);
        let o = srv
            .call(
                "run-code",
                json!({"languageId": "python", "code": "print(1)", "venv": fake}),
            )
            .await;
        assert_eq!(o.structured["exit_code"], 7, "{setup:?}: {}", o.text);
        let marks_left = ran(&marks);
        for m in &marks_left {
            assert!(!m.starts_with("ran-home"), "{setup:?}: home ran: {m}");
            assert!(!m.ends_with("-0"), "{setup:?}: ran as root: {m}");
        }
        if setup.level != "none" {
            // Confined: the marks directory is not even writable.
            assert!(marks_left.is_empty(), "{setup:?}: {marks_left:?}");
        }
        srv.stop().await;
    }
    assert!(ran(&marks).iter().all(|m| !m.ends_with("-0")));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_operators_venv_is_used_or_its_refusal_said() {
    let Some(python) = base_python() else {
        return;
    };
    let base = shared_dir();
    let venv = base.path().join("env");
    make_venv(&python, &venv);
    let path = format!(
        "{}:{}",
        s(&venv.join("bin")),
        std::env::var("PATH").unwrap_or_default()
    );
    for setup in setups() {
        // First on PATH: every level uses it (at bwrap the venv under the masked /tmp is
        // made visible, as its interpreter is).
        let Some(srv) = start(setup, &[], &[("PATH", &path)]).await else {
            continue;
        };
        let o = srv
            .call("session_start", json!({"language": "python"}))
            .await;
        assert!(!o.is_error, "{setup:?}: {}", o.text);
        assert_eq!(interpreter(&o)["why"], "path", "{setup:?}");
        assert_eq!(
            interpreter(&o)["path"],
            s(&venv.join("bin/python3")),
            "{setup:?}"
        );
        let e = srv.eval(o.s("session_id"), &probe(&venv)).await;
        assert_eq!(output(&e), "True True 42\n", "{setup:?}: {}", e.text);
        srv.stop().await;
        // --python names it.
        let python_flag = venv.join("bin/python");
        let Some(srv) = start(setup, &["--python", s(&python_flag)], &[]).await else {
            continue;
        };
        let o = srv
            .call(
                "run-code",
                json!({"languageId": "python", "code": probe(&venv)}),
            )
            .await;
        assert_eq!(o.text, "True True 42\n", "{setup:?}: {}", o.text);
        assert_eq!(interpreter(&o)["why"], "python_flag", "{setup:?}");
        srv.stop().await;
    }
    // A venv the pool's uids cannot run: at landlock and none, as root, it is passed over
    // for the next python on PATH, and every result says so; --python stops the server.
    if !we_are_root() {
        return;
    }
    let locked = base.path().join("locked");
    std::fs::create_dir(&locked).expect("mkdir");
    let hidden = locked.join("env");
    make_venv(&python, &hidden);
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let path = format!(
        "{}:{}",
        s(&hidden.join("bin")),
        std::env::var("PATH").unwrap_or_default()
    );
    for level in ["landlock", "none"] {
        let setup = Setup { level, root: true };
        let Some(srv) = start(setup, &[], &[("PATH", &path)]).await else {
            continue;
        };
        let o = srv
            .call(
                "run-code",
                json!({"languageId": "python", "code": "print(1)"}),
            )
            .await;
        assert_eq!(o.text, "1\n", "{setup:?}");
        let note = interpreter(&o)["note"].as_str().unwrap_or_default();
        assert!(
            note.contains(s(&hidden)) && note.contains("cannot be used"),
            "{setup:?}: {}",
            o.structured
        );
        srv.stop().await;
        let flag = hidden.join("bin/python");
        let e = TestServer::try_start(&["--sandbox", level, "--python", s(&flag)], &[], None)
            .await
            .err()
            .unwrap_or_default();
        assert!(!e.is_empty(), "{setup:?}: the server started");
        let out = std::process::Command::new(BIN)
            .args(["languages", "--sandbox", level, "--python", s(&flag)])
            .output()
            .expect("replbox languages");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("--python") && err.contains("not reachable"),
            "{setup:?}: {err}"
        );
    }
}

/// `replbox languages` says which Python runs and why.
#[test]
fn languages_says_which_python_and_why() {
    let Some(python) = base_python() else {
        return;
    };
    let out = std::process::Command::new(BIN)
        .args(["languages", "--python", s(&python)])
        .output()
        .expect("replbox languages");
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text
        .lines()
        .find(|l| l.starts_with("python "))
        .unwrap_or_default();
    assert!(
        row.contains(&format!("{} (the server's --python)", s(&python))),
        "{text}"
    );
    assert!(
        text.contains("python: a run or session can use a virtual environment"),
        "{text}"
    );
}
