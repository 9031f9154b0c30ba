//! Warm sessions (`--session-pool`, `--preload`) through a real MCP client: a warm session
//! shows its user what a cold one shows (names, directory, environment, its own uid), with
//! the preloaded modules in `sys.modules` only; a request a warm session cannot honour, and
//! `--session-pool 0`, start cold; a warm session gives its uid up to a caller that needs it.
//!
//! A warm session is there once its interpreter has started and imported the preloaded
//! modules; the tests poll `session_start` (closing the cold ones) until one is, with a bound.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

/// Unprivileged servers (when the tests run as root) each get a uid of their own.
static NEXT_UID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(62_000);

#[derive(Debug, Clone, Copy)]
struct Setup {
    level: &'static str,
    /// The server runs as root (user code then runs as a pool uid).
    root: bool,
}

fn we_are_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// bwrap and landlock, as root and (when the tests run as root) as an unprivileged uid.
fn setups() -> Vec<Setup> {
    let mut v = Vec::new();
    for level in ["bwrap", "landlock"] {
        if we_are_root() {
            v.push(Setup { level, root: true });
        }
        v.push(Setup { level, root: false });
    }
    v
}

/// A server for `setup`, or None (a printed skip; a failure in CI) when the level cannot
/// run here.
async fn start(setup: Setup, args: &[&str]) -> Option<TestServer> {
    let mut a = vec!["--sandbox", setup.level];
    a.extend_from_slice(args);
    let uid = (!setup.root && we_are_root())
        .then(|| NEXT_UID.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    match TestServer::try_start(&a, &[], uid).await {
        Ok(s) => Some(s),
        Err(e) => {
            skip(format!(
                "{setup:?}: level {} does not work here: {e}",
                setup.level
            ));
            None
        }
    }
}

async fn start_python(s: &TestServer, extra: Value) -> Out {
    let mut args = json!({"language": "python"});
    if let (Some(a), Some(e)) = (args.as_object_mut(), extra.as_object()) {
        a.extend(e.clone());
    }
    s.call("session_start", args).await
}

fn warm(o: &Out) -> bool {
    match &o.structured["warm"] {
        Value::Bool(b) => *b,
        other => panic!("session_start without a boolean warm: {other} ({})", o.text),
    }
}

async fn close(s: &TestServer, id: &str) {
    let o = s.call("session_close", json!({"session_id": id})).await;
    assert!(!o.is_error, "{}", o.text);
}

/// Start python sessions until one is warm (closing the cold ones), for at most 120 s.
async fn warm_session(s: &TestServer) -> (String, Out) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let o = start_python(s, json!({})).await;
        assert!(!o.is_error, "session_start: {}", o.text);
        let id = o.s("session_id").to_string();
        if warm(&o) {
            assert!(o.text.contains(" started warm: "), "{}", o.text);
            return (id, o);
        }
        assert!(!o.text.contains("warm"), "{}", o.text);
        close(s, &id).await;
        assert!(
            Instant::now() < deadline,
            "no warm session within 120 s: {}",
            o.text
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the user of a session sees: its names, its directory, its environment (the
/// session's directory written `S`), its uid, and which data modules are imported.
async fn seen(s: &TestServer, id: &str) -> Value {
    let names = s.eval(id, "print(sorted(globals()), sorted(dir()))").await;
    assert_eq!(status(&names), "ok", "{}", names.text);
    let probe = s
        .eval(
            id,
            "import os, sys, json\n\
             d = os.path.dirname(os.getcwd())\n\
             print(json.dumps({'cwd': os.getcwd().replace(d, 'S'), \
             'env': {k: v.replace(d, 'S') for k, v in os.environ.items()}, \
             'uid': os.getuid(), 'pandas': 'pandas' in sys.modules, \
             'pyplot': 'matplotlib.pyplot' in sys.modules}))",
        )
        .await;
    assert_eq!(status(&probe), "ok", "{}", probe.text);
    let mut v: Value = serde_json::from_str(output(&probe).trim())
        .unwrap_or_else(|e| panic!("{e}: {}", probe.text));
    v["names"] = Value::String(output(&names).to_string());
    v
}

/// Whether `code` runs without an error.
async fn s_eval_ok(s: &TestServer, id: &str, code: &str) -> bool {
    status(&s.eval(id, code).await) == "ok"
}

/// The data stack works as a user uses it: pandas imported by name, a figure drawn and
/// returned as an image.
async fn data_works(s: &TestServer, id: &str, setup: Setup) {
    let o = s
        .eval(
            id,
            "import pandas as pd, numpy as np, matplotlib.pyplot as plt\n\
             plt.plot(np.arange(3), [1, 3, 2])\n\
             print(pd.DataFrame({'a': [1, 2]}).shape)",
        )
        .await;
    assert_eq!(status(&o), "ok", "{setup:?}: {}", o.text);
    assert_eq!(output(&o).trim(), "(2, 1)", "{setup:?}: {}", o.text);
    assert_eq!(o.images.len(), 1, "{setup:?}: the figure: {}", o.text);
    assert_eq!(o.images[0].0, "image/png");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_sessions_show_what_cold_ones_show() {
    if !require_data_stack() {
        return;
    }
    for setup in setups() {
        let Some(hot) = start(setup, &["--session-pool", "2"]).await else {
            continue;
        };
        let Some(cold) = start(setup, &["--session-pool", "0"]).await else {
            continue;
        };
        let (w, wo) = warm_session(&hot).await;
        assert_eq!(wo.structured["sandbox"], setup.level, "{}", wo.text);
        let c = start_python(&cold, json!({})).await;
        assert!(!c.is_error && !warm(&c), "{setup:?}: {}", c.text);
        let c = c.s("session_id").to_string();
        let (sw, sc) = (seen(&hot, &w).await, seen(&cold, &c).await);
        for key in ["names", "cwd", "env"] {
            assert_eq!(sw[key], sc[key], "{setup:?}: {key} differs, warm then cold");
        }
        assert_eq!(sw["cwd"], "S/work", "{setup:?}");
        assert_eq!(wo.s("cwd").rsplit('/').next(), Some("work"), "{}", wo.text);
        assert_eq!(
            (&sc["pandas"], &sc["pyplot"]),
            (&json!(false), &json!(false)),
            "{setup:?}: a cold session imports nothing ahead"
        );
        // The python this server found may lack the data stack (an unprivileged server does
        // not reach the one under /root): then the warm one preloaded nothing.
        let has = s_eval_ok(&cold, &c, "import pandas, matplotlib.pyplot").await;
        assert_eq!(
            (&sw["pandas"], &sw["pyplot"]),
            (&json!(has), &json!(has)),
            "{setup:?}: preloaded"
        );
        if setup.root {
            // Its uid is its own: no other live session of the server runs as it.
            let other = start_python(&hot, json!({"env": {"X": "1"}})).await;
            assert!(!other.is_error && !warm(&other), "{}", other.text);
            let other_id = other.s("session_id").to_string();
            let second = warm_session(&hot).await.0;
            let mut uids = Vec::new();
            for id in [&w, &other_id, &second] {
                uids.push(seen(&hot, id).await["uid"].clone());
            }
            uids.sort_by_key(|u| u.as_u64());
            uids.dedup();
            assert_eq!(uids.len(), 3, "{setup:?}: uids {uids:?}");
            assert!(
                uids.iter()
                    .all(|u| u.as_u64().is_some_and(|u| u >= 100_000)),
                "{setup:?}: pool uids: {uids:?}"
            );
        }
        if has {
            data_works(&hot, &w, setup).await;
            data_works(&cold, &c, setup).await;
        } else {
            skip_optional(format!(
                "{setup:?}: this server's python3 cannot import the data stack"
            ));
        }
        hot.stop().await;
        cold.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_preload_a_warm_session_imports_nothing_ahead() {
    if !require_data_stack() {
        return;
    }
    let setup = Setup {
        level: "bwrap",
        root: we_are_root(),
    };
    let Some(s) = start(setup, &["--session-pool", "1", "--preload", ""]).await else {
        return;
    };
    let (w, _) = warm_session(&s).await;
    let v = seen(&s, &w).await;
    assert_eq!((&v["pandas"], &v["pyplot"]), (&json!(false), &json!(false)));
    data_works(&s, &w, setup).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_a_warm_session_cannot_honour_start_cold() {
    if !require("python", "python3") {
        return;
    }
    let dir = tempfile::tempdir_in("/tmp").expect("tempdir");
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .expect("chmod");
    let cwd = dir.path().display().to_string();
    let s = TestServer::start_with(
        &["--session-pool", "2", "--preload", "", "--allow-cwd", &cwd],
        &[],
    )
    .await;
    let asks = [
        json!({"env": {"GREETING": "hi"}}),
        json!({"cwd": cwd}),
        json!({"files": [{"name": "a.txt", "content": "x"}]}),
    ];
    // The pool has been seen working before each request that must not use it, and again
    // after it.
    let (first, _) = warm_session(&s).await;
    close(&s, &first).await;
    for ask in asks {
        let o = start_python(&s, ask.clone()).await;
        assert!(!o.is_error, "{ask}: {}", o.text);
        assert!(!warm(&o), "{ask}: started warm: {}", o.text);
        let id = o.s("session_id").to_string();
        if let Some(env) = ask.get("env") {
            let e = s
                .eval(&id, "import os; print(os.environ['GREETING'])")
                .await;
            assert_eq!(output(&e).trim(), env["GREETING"], "{}", e.text);
        }
        close(&s, &id).await;
        let (again, _) = warm_session(&s).await;
        close(&s, &again).await;
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_pool_0_starts_every_session_cold() {
    if !require("python", "python3") {
        return;
    }
    let s = TestServer::start_with(&["--session-pool", "0"], &[]).await;
    for _ in 0..3 {
        let o = start_python(&s, json!({})).await;
        assert!(!o.is_error, "{}", o.text);
        assert!(!warm(&o), "{}", o.text);
        let id = o.s("session_id").to_string();
        // Time for a pool, were there one, to have filled (a warm session takes about this).
        let e = s.eval(&id, "import json, decimal, email.parser; 1").await;
        assert_eq!(status(&e), "ok", "{}", e.text);
        close(&s, &id).await;
    }
    s.stop().await;
}

/// Which of `base..base + n` some process holds (its lock file locked).
fn held_uids(base: u32, n: u32) -> Vec<u32> {
    use nix::fcntl::{Flock, FlockArg};
    (base..base + n)
        .filter(|uid| {
            let Ok(f) = std::fs::File::open(format!("/run/replbox/{uid}")) else {
                return false;
            };
            Flock::lock(f, FlockArg::LockExclusiveNonblock).is_err()
        })
        .collect()
}

/// The principal a uid is bound to ("" when none), from its lock file.
fn owner(uid: u32) -> String {
    std::fs::read_to_string(format!("/run/replbox/{uid}"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_session_gives_its_uid_to_a_caller() {
    if !we_are_root() {
        skip_optional("the uid pool is used only when the server runs as root");
        return;
    }
    if !require("python", "python3") {
        return;
    }
    const BASE: u32 = 233_000;
    unbind_test_uids(BASE, 4);
    let s = TestServer::start_with(
        &[
            "--sandbox",
            "bwrap",
            "--uid-base",
            "233000",
            "--uids",
            "4",
            "--session-pool",
            "1",
            "--preload",
            "",
            "--keep-files-s",
            "0",
        ],
        &[],
    )
    .await;
    // A warm session taken leaves its uid unbound (it has no caller cwd, so nothing of it
    // outlives its directory): a warm start binds no fresh uid to its taker. Its
    // replacement starts at once, on a free uid (3 are free).
    let (w, _) = warm_session(&s).await;
    let e = s.eval(&w, "import os; print(os.getuid())").await;
    let uid: u32 = output(&e).trim().parse().expect("a uid");
    assert_eq!(owner(uid), "", "uid {uid}");
    close(&s, &w).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let o = start_python(&s, json!({"env": {"X": "1"}})).await;
        assert!(!o.is_error && !warm(&o), "{}", o.text);
        ids.push(o.s("session_id").to_string());
    }
    // Three sessions and the warm one hold every uid.
    let deadline = Instant::now() + Duration::from_secs(60);
    while held_uids(BASE, 4).len() < 4 {
        assert!(
            Instant::now() < deadline,
            "the warm session holds no uid: {:?}",
            held_uids(BASE, 4)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The sessions' uids are the principal's; the warm session's is nobody's.
    let mut owners: Vec<String> = (BASE..BASE + 4).map(owner).collect();
    owners.sort();
    assert_eq!(owners, ["", "local", "local", "local"]);
    // A fourth session gets the warm session's uid once that one is ready to give it up.
    let deadline = Instant::now() + Duration::from_secs(60);
    let fourth = loop {
        let o = start_python(&s, json!({"env": {"X": "1"}})).await;
        if !o.is_error {
            break o;
        }
        assert_eq!(o.error_kind(), "limit", "{}", o.text);
        assert!(Instant::now() < deadline, "no uid was given up: {}", o.text);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!warm(&fourth), "{}", fourth.text);
    let id = fourth.s("session_id").to_string();
    let e = s.eval(&id, "import os; print(os.getuid())").await;
    let uid: u32 = output(&e).trim().parse().expect("a uid");
    assert!((BASE..BASE + 4).contains(&uid), "{uid}");
    s.stop().await;
    unbind_test_uids(BASE, 4);
}
