//! What user code sees of the host's filesystem, attacked through the MCP client: a `.venv`
//! one principal's code plants in a shared `cwd` never runs in another principal's session;
//! a root server takes an ordinary user's project (and its `.venv`), bound from the
//! directory it opened as the session's uid, so that renaming names on the way redirects
//! nothing; and user code sees an allow-list of the host (the system, each interpreter's
//! installation, its own directories), so a world-readable file elsewhere stays unseen.
//!
//! Each test runs at every level it applies to, with the server as root and, when the tests
//! run as root, as an unprivileged uid; a level that cannot start here is skipped with its
//! reason printed (a failure under REPLBOX_REQUIRE_ALL=1).

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::*;
use serde_json::{Value, json};

/// Unprivileged servers get uids of their own from here (RLIMIT_NPROC counts per uid).
static NEXT_UID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(63_500);

const TOKEN_A: &str = "token-of-alice-fsview-0123456789";
const TOKEN_B: &str = "token-of-bob-fsview-9876543210ab";

#[derive(Debug, Clone, Copy)]
struct Setup {
    level: &'static str,
    /// The server runs as root (user code then runs as a pool uid).
    root: bool,
}

fn we_are_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn require_all() -> bool {
    std::env::var("REPLBOX_REQUIRE_ALL").is_ok_and(|v| v == "1")
}

/// Print why a test cannot run here; under REPLBOX_REQUIRE_ALL=1 that is a failure.
fn skip(why: &str) {
    if require_all() {
        panic!("{why}, and REPLBOX_REQUIRE_ALL=1 requires it");
    }
    eprintln!("SKIP: {why}");
}

/// `levels`, as root and (when the tests run as root) as an unprivileged uid.
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

fn uid_for(setup: Setup) -> Option<u32> {
    (!setup.root && we_are_root())
        .then(|| NEXT_UID.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

/// A stdio server for `setup`, or None (printed) when its level does not work here.
async fn start(setup: Setup, args: &[&str], env: &[(&str, &str)]) -> Option<TestServer> {
    let mut a = vec!["--sandbox", setup.level];
    a.extend_from_slice(args);
    match TestServer::try_start(&a, env, uid_for(setup)).await {
        Ok(s) => {
            let ins = s.instructions();
            assert!(
                ins.contains(&format!("Sandbox: {} (", setup.level)),
                "{setup:?}: the server reports another level: {ins}"
            );
            Some(s)
        }
        Err(e) => {
            skip(&format!(
                "{setup:?}: level {} does not work here: {e}",
                setup.level
            ));
            None
        }
    }
}

/// An HTTP server for `setup` with two principals (TOKEN_A, TOKEN_B), or None (printed).
async fn start_http(setup: Setup, args: &[&str]) -> Option<HttpChild> {
    let mut a = vec!["--sandbox", setup.level];
    a.extend_from_slice(args);
    let tokens = format!("{TOKEN_A},{TOKEN_B}");
    let env = [
        ("REPLBOX_TOKENS", tokens.as_str()),
        ("REPLBOX_SESSION_POOL", "0"),
    ];
    match HttpChild::try_start_as(&a, &env, uid_for(setup)).await {
        Ok(s) => Some(s),
        Err(e) => {
            skip(&format!(
                "{setup:?}: level {} does not work here: {e}",
                setup.level
            ));
            None
        }
    }
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// A python3 every user can run (what a planted environment's wrapper hands over to).
fn world_python() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .map(|d| d.join("python3"))
        .chain([PathBuf::from("/usr/bin/python3")])
        .find(|p| p.is_file() && replbox::api::reachable_by_others(p));
    if found.is_none() {
        skip("no python3 that other users can run");
    }
    found
}

/// A fresh directory outside every masked tree, root's, `mode`, with only root able to
/// change the way to it: in the build's temp dir, else in /var/lib/replbox-tests. None
/// (printed) when neither fits.
fn outside_masks(mode: u32) -> Option<tempfile::TempDir> {
    use std::os::unix::fs::MetadataExt;
    let masked = [
        "/home", "/root", "/run", "/tmp", "/var/tmp", "/mnt", "/media", "/srv",
    ];
    let root_only = |dir: &Path| {
        dir.ancestors().all(|a| {
            std::fs::symlink_metadata(a).is_ok_and(|m| m.uid() == 0 && m.mode() & 0o022 == 0)
        })
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
        if !masked.iter().any(|m| base.starts_with(m)) && root_only(&base) {
            let d = tempfile::tempdir_in(&base).expect("tempdir");
            chmod(d.path(), mode);
            return Some(d);
        }
    }
    skip(&format!(
        "{} and {} are masked or changeable by users other than root",
        target.display(),
        fallback.display()
    ));
    None
}

fn interpreter(o: &Out) -> &Value {
    &o.structured["interpreter"]
}

// ----- a .venv planted in a shared cwd -----

/// Python for a session in a shared cwd: plant `.venv` there, whose `bin/python` is a
/// wrapper that records who ran it (in `proof`) and then runs `python`.
fn plant(python: &Path, proof: &str) -> String {
    format!(
        r#"
import os
os.makedirs('.venv/bin', exist_ok=True)
with open('.venv/pyvenv.cfg', 'w') as f:
    f.write('home = /usr/bin\nversion = 3.11.2\n')
with open('.venv/bin/python', 'w') as f:
    f.write('#!/bin/sh\necho "PLANTED ran as $(id -u)" >> "$(dirname "$0")/../../{proof}"\nexec {python} "$@"\n')
for p in ['.venv', '.venv/bin']:
    os.chmod(p, 0o755)
os.chmod('.venv/bin/python', 0o755)
os.chmod('.venv/pyvenv.cfg', 0o644)
print('planted')
"#,
        python = s(python),
    )
}

// Finding (medium): a `.venv` that principal A's code planted in a cwd both principals may
// use was found by B's plain `session_start {cwd}`, and its `bin/python` (A's program) ran as
// B's uid (landlock, none; at bwrap the start was refused). A `.venv` found in the cwd is now
// used only when no other principal's code could have made it or could change it: owned, and
// writable, only by the host's accounts and by sandbox uids bound to the caller's principal.
// Otherwise the session starts with the server's Python and says why; a `venv` named by the
// caller is still the caller's choice.
#[tokio::test(flavor = "multi_thread")]
async fn finding_r3_4_a_venv_planted_in_a_shared_cwd_never_runs_for_another_principal() {
    if !require("python", "python3") {
        return;
    }
    let Some(python) = world_python() else {
        return;
    };
    for (i, setup) in setups(&["landlock", "bwrap", "none"])
        .into_iter()
        .enumerate()
    {
        // Sticky and writable by all: the shared place two principals' sessions work in.
        let Some(shared) = outside_masks(0o1777) else {
            return;
        };
        let cwd = std::fs::canonicalize(shared.path()).expect("canonical");
        // A uid range of this test's own per setup (servers of a range share its bindings).
        let base = (181_000 + 10 * i).to_string();
        let Some(srv) = start_http(setup, &["--uid-base", &base, "--uids", "8"]).await else {
            continue;
        };
        let a = srv.connect(TOKEN_A).await;
        let b = srv.connect(TOKEN_B).await;
        let o = http_call(
            &a,
            "session_start",
            json!({"language": "python", "cwd": cwd}),
        )
        .await;
        assert!(!o.is_error, "{setup:?}: A's start: {}", o.text);
        let a_id = o.s("session_id").to_string();
        let o = http_call(
            &a,
            "session_eval",
            json!({"session_id": a_id, "code": plant(&python, "proof")}),
        )
        .await;
        assert_eq!(output(&o), "planted\n", "{setup:?}: {}", o.text);
        let proof = cwd.join("proof");

        // B's plain start in the same cwd: A's environment is not used, and the result
        // says why.
        let o = http_call(
            &b,
            "session_start",
            json!({"language": "python", "cwd": cwd}),
        )
        .await;
        assert!(!o.is_error, "{setup:?}: B's start: {}", o.text);
        assert!(
            o.text.contains("the .venv in cwd was not used")
                && o.text
                    .contains("code of another principal could have put it there"),
            "{setup:?}: the result says why: {}",
            o.text
        );
        assert_ne!(interpreter(&o)["why"], "cwd_venv", "{setup:?}: {}", o.text);
        let b_id = o.s("session_id").to_string();
        let o = http_call(
            &b,
            "session_eval",
            json!({"session_id": b_id, "code": "import sys; print(sys.prefix.endswith('.venv'))"}),
        )
        .await;
        assert_eq!(output(&o), "False\n", "{setup:?}: {}", o.text);
        assert!(
            !proof.exists(),
            "{setup:?}: A's program ran in B's session: {}",
            std::fs::read_to_string(&proof).unwrap_or_default()
        );
        http_call(&b, "session_close", json!({"session_id": b_id})).await;

        // As root, A's own code made it as A's own uid: A's next start still finds it.
        if setup.root {
            let o = http_call(
                &a,
                "session_start",
                json!({"language": "python", "cwd": cwd}),
            )
            .await;
            assert!(!o.is_error, "{setup:?}: A's second start: {}", o.text);
            assert_eq!(interpreter(&o)["why"], "cwd_venv", "{setup:?}: {}", o.text);
            let proof_text = std::fs::read_to_string(&proof).unwrap_or_default();
            assert!(
                proof_text.contains("PLANTED ran as"),
                "{setup:?}: {proof_text}"
            );
            let id = o.s("session_id").to_string();
            http_call(&a, "session_close", json!({"session_id": id})).await;
        }
        http_call(&a, "session_close", json!({"session_id": a_id})).await;
        let _ = a.cancel().await;
        let _ = b.cancel().await;
        srv.stop().await;
    }
}

// ----- a root server and an ordinary user's project -----

/// `python -m venv --without-pip DIR`, with the module `rbxdemo` (`VALUE = 42`) in its
/// site-packages.
fn make_venv(python: &Path, dir: &Path) {
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
}

/// Give `dir` and everything in it to `uid` (links themselves, not what they lead to).
fn chown_tree(dir: &Path, uid: u32) {
    let status = std::process::Command::new("chown")
        .args(["-R", "-h", &format!("{uid}:{uid}")])
        .arg(dir)
        .status()
        .expect("chown");
    assert!(status.success());
}

// Finding: a root server refused any project an ordinary user owns: `cwd` /opt/proj (uid
// 1000, 0755) with a `.venv` failed, as the `.venv`'s mount destination lay in a directory
// its owner could rename entries in; so did such a `venv`. Paths no longer matter: the
// directory is opened once, as the session's uid, beneath a handle and through no link;
// bwrap binds that descriptor at its path on its own root (which nobody outside the sandbox
// can change), and Landlock takes its rules from it. The project, its `.venv` found in it
// (its owner is an account of the host, not any principal's sandbox uid) and the same `venv`
// named explicitly all work at bwrap and landlock. The rename races of the earlier review
// (tests/security_review.rs) still redirect nothing.
#[tokio::test(flavor = "multi_thread")]
async fn finding_r3_9_a_root_server_takes_an_ordinary_users_project_and_its_venv() {
    if !require("python", "python3") {
        return;
    }
    if !we_are_root() {
        skip("the finding is about a root server, so the test must run as root");
        return;
    }
    let Some(python) = world_python() else {
        return;
    };
    // Like /opt: root's, 0755; in it the project of an ordinary user (not a pool uid).
    let Some(base) = outside_masks(0o755) else {
        return;
    };
    let proj = std::fs::canonicalize(base.path())
        .expect("canonical")
        .join("proj");
    std::fs::create_dir(&proj).expect("mkdir");
    make_venv(&python, &proj.join(".venv"));
    std::fs::write(proj.join("data.txt"), "hello").expect("write");
    chown_tree(&proj, 54_322);
    chmod(&proj, 0o755);
    let venv = proj.join(".venv");
    let probe = format!(
        "import sys, rbxdemo\nprint(sys.prefix == {:?}, rbxdemo.VALUE, open({:?}).read())",
        s(&venv),
        s(&proj.join("data.txt"))
    );
    // The venv alone shows the environment, not the project around it.
    let venv_only = format!(
        "import sys, rbxdemo\nprint(sys.prefix == {:?}, rbxdemo.VALUE)",
        s(&venv)
    );
    for level in ["bwrap", "landlock"] {
        let setup = Setup { level, root: true };
        let Some(srv) = start(setup, &[], &[]).await else {
            continue;
        };
        // The project as cwd: its .venv is found and used; the session may read, not write.
        let o = srv
            .call("session_start", json!({"language": "python", "cwd": proj}))
            .await;
        assert!(
            !o.is_error,
            "{level}: an ordinary user's project: {}",
            o.text
        );
        assert_eq!(interpreter(&o)["why"], "cwd_venv", "{level}: {}", o.text);
        assert_eq!(o.structured["cwd_writable"], false, "{level}: {}", o.text);
        let id = o.s("session_id").to_string();
        let o = srv.eval(&id, &probe).await;
        assert_eq!(output(&o), "True 42 hello\n", "{level}: {}", o.text);
        srv.call("session_close", json!({"session_id": id})).await;
        // The same venv named, without a cwd: a session and a run.
        let o = srv
            .call("session_start", json!({"language": "python", "venv": venv}))
            .await;
        assert!(!o.is_error, "{level}: the user's venv: {}", o.text);
        assert_eq!(interpreter(&o)["why"], "venv", "{level}: {}", o.text);
        let id = o.s("session_id").to_string();
        let o = srv.eval(&id, &venv_only).await;
        assert_eq!(output(&o), "True 42\n", "{level}: {}", o.text);
        srv.call("session_close", json!({"session_id": id})).await;
        let o = srv
            .call(
                "run-code",
                json!({"languageId": "python", "code": venv_only, "venv": venv}),
            )
            .await;
        assert_eq!(o.text, "True 42\n", "{level}: {}", o.text);
        srv.stop().await;
    }
}

// ----- the view of the host -----

/// (language id, program, expected output) for every language this test starts.
const HELLOS: &[(&str, &str, &str)] = &[
    (
        "python",
        "print('hello from python')",
        "hello from python\n",
    ),
    (
        "javascript",
        "console.log('hello from js')",
        "hello from js\n",
    ),
    ("shellscript", "echo hello from bash", "hello from bash\n"),
    ("ruby", "puts 'hello from ruby'", "hello from ruby\n"),
    ("perl", "print \"hello from perl\\n\";", "hello from perl\n"),
    (
        "haskell",
        "main = putStrLn \"hello from haskell\"",
        "hello from haskell\n",
    ),
    ("r", "cat('hello from r\\n')", "hello from r\n"),
    (
        "awk",
        "BEGIN { print \"hello from awk\" }",
        "hello from awk\n",
    ),
    (
        "c",
        "#include <stdio.h>\nint main(void) { puts(\"hello from c\"); return 0; }",
        "hello from c\n",
    ),
    (
        "cpp",
        "#include <iostream>\nint main() { std::cout << \"hello from cpp\\n\"; }",
        "hello from cpp\n",
    ),
    (
        "rust",
        "fn main() { println!(\"hello from rust\"); }",
        "hello from rust\n",
    ),
    (
        "java",
        "public class Main { public static void main(String[] a) { System.out.println(\"hello from java\"); } }",
        "hello from java\n",
    ),
    (
        "go",
        "package main\nimport \"fmt\"\nfunc main() { fmt.Println(\"hello from go\") }",
        "hello from go\n",
    ),
    (
        "php",
        "<?php echo \"hello from php\\n\";",
        "hello from php\n",
    ),
    ("lua", "print('hello from lua')", "hello from lua\n"),
];

/// (session language, code, expected output).
const SESSIONS: &[(&str, &str, &str)] = &[
    ("python", "print(6 * 7)", "42\n"),
    ("javascript", "console.log(6 * 7)", "42\n"),
    ("ruby", "puts 6 * 7", "42\n"),
    ("haskell", "print (6 * 7)", "42\n"),
    ("shellscript", "echo $((6 * 7))", "42\n"),
    ("r", "cat(6 * 7, '\\n')", "42 \n"),
];

/// The language ids `run-code` offers on this server.
async fn installed(s: &TestServer) -> Vec<String> {
    let tools = s.client.list_all_tools().await.expect("tools/list");
    let run = tools
        .iter()
        .find(|t| t.name == "run-code")
        .expect("run-code is listed");
    run.input_schema["properties"]["languageId"]["enum"]
        .as_array()
        .expect("languageId has an enum")
        .iter()
        .filter_map(|v| v.as_str().map(String::from))
        .collect()
}

/// A canary in a world-readable tree outside the view (`/opt`, `/var/lib`): (its directory,
/// the file, the secret in it).
fn canary(parent: &str) -> Option<(tempfile::TempDir, PathBuf, String)> {
    let dir = match tempfile::Builder::new()
        .prefix("replbox-canary-")
        .tempdir_in(parent)
    {
        Ok(d) => d,
        Err(e) => {
            skip(&format!("cannot make a canary in {parent}: {e}"));
            return None;
        }
    };
    chmod(dir.path(), 0o755);
    let file = dir.path().join("secret.txt");
    let secret = token();
    std::fs::write(&file, &secret).expect("write the canary");
    chmod(&file, 0o644);
    Some((dir, file, secret))
}

/// Python reading each of `files` and listing each of `dirs`, printing what it could.
fn snoop(files: &[&Path], dirs: &[&str]) -> String {
    let files: Vec<&str> = files.iter().map(|p| s(p)).collect();
    format!(
        r#"
import os
for p in {files:?}:
    try:
        print('READ', p, open(p).read())
    except Exception as e:
        print('NO', p, type(e).__name__)
for d in {dirs:?}:
    try:
        print('LIST', d, sorted(os.listdir(d)))
    except Exception as e:
        print('NOLIST', d, type(e).__name__)
"#
    )
}

// Finding (medium): at bwrap and landlock user code read every world-readable file outside a
// short deny-list: other projects under /opt, /var/lib, other checkouts, /var/log, /etc/ssh.
// The default is now an allow-list view of the host: the system (/usr, /bin, /lib*, the
// parts of /etc programs read), each interpreter's own installation and the trees its
// language reads (ghc's package database in /var/lib/ghc, R's /etc/R), the session's own
// directories and the caller's allowed cwd and venv. Everything else is absent at bwrap and
// unreadable at landlock; `--expose` adds read-only trees, and the start-up log lists the
// view. Every installed language still starts, and the data stack imports.
#[tokio::test(flavor = "multi_thread")]
async fn finding_r3_10_user_code_sees_only_the_view_of_the_host() {
    if !require("python", "python3") {
        return;
    }
    let Some((opt_dir, opt_file, opt_secret)) = canary("/opt") else {
        return;
    };
    let Some((lib_dir, lib_file, lib_secret)) = canary("/var/lib") else {
        return;
    };
    let opt_name = opt_dir
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();
    let lib_name = lib_dir
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();
    let code = snoop(
        &[&opt_file, &lib_file, Path::new("/etc/ssh/sshd_config")],
        &[
            "/opt", "/var/lib", "/var/log", "/etc/ssh", "/work", "/srv", "/",
        ],
    );
    for setup in setups(&["bwrap", "landlock"]) {
        let Some(srv) = start(setup, &[], &[]).await else {
            continue;
        };
        let o = srv.run("python", &code).await;
        assert!(!o.is_error, "{setup:?}: {}", o.text);
        for (secret, name) in [(&opt_secret, &opt_name), (&lib_secret, &lib_name)] {
            // Neither read nor listed (its path is printed only where reading it failed).
            let listed = o
                .text
                .lines()
                .any(|l| l.starts_with("LIST") && l.contains(name.as_str()));
            assert!(
                !o.text.contains(secret.as_str()) && !listed,
                "{setup:?}: user code saw a canary outside the view: {}",
                o.text
            );
        }
        assert!(!o.text.contains("READ"), "{setup:?}: {}", o.text);
        assert!(
            !o.text.contains("LIST /var/log ['"),
            "{setup:?}: {}",
            o.text
        );
        // Absent at bwrap; there but unreadable at landlock.
        let why = if setup.level == "bwrap" {
            "FileNotFoundError"
        } else {
            "PermissionError"
        };
        assert!(
            o.text.contains(&format!("NO {} {why}", s(&opt_file))),
            "{setup:?}: {}",
            o.text
        );
        // A session sees the same.
        let id = srv.start_session("python").await;
        let o = srv.eval(&id, &code).await;
        assert!(
            !o.text.contains(opt_secret.as_str()) && !o.text.contains(lib_secret.as_str()),
            "{setup:?}: {}",
            o.text
        );
        srv.call("session_close", json!({"session_id": id})).await;

        // Every installed language still runs, and every session language starts.
        let langs = installed(&srv).await;
        for (lang, program, expected) in HELLOS {
            if !langs.iter().any(|l| l == lang) {
                continue;
            }
            let o = srv
                .call(
                    "run-code",
                    json!({"languageId": lang, "code": program, "timeout_ms": 120_000}),
                )
                .await;
            assert_eq!(o.text, *expected, "{setup:?}: {lang}: {}", o.text);
        }
        for (lang, code, expected) in SESSIONS {
            let o = srv.call("session_start", json!({"language": lang})).await;
            if o.is_error && o.error_kind() == "not_installed" {
                skip(&format!("{setup:?}: {lang} is not installed: {}", o.text));
                continue;
            }
            assert!(!o.is_error, "{setup:?}: {lang}: {}", o.text);
            let id = o.s("session_id").to_string();
            let o = srv.eval_t(&id, code, 60_000).await;
            assert_eq!(output(&o), *expected, "{setup:?}: {lang}: {}", o.text);
            srv.call("session_close", json!({"session_id": id})).await;
        }
        // The data stack, where the server's Python has it (pyenv's under /root, which a root
        // server's pool uid reaches at bwrap only).

        let o = srv
            .run(
                "python",
                "import sys\ntry:\n    import numpy, pandas, matplotlib\n    matplotlib.use('Agg')\n    import matplotlib.pyplot as plt\n    plt.plot(pandas.Series(numpy.arange(3)))\n    plt.savefig('p.png')\n    print('data ok')\nexcept ImportError as e:\n    print('no data stack:', sys.executable, e)",
            )
            .await;
        if setup.level == "bwrap" && setup.root && require_data_stack() {
            assert_eq!(o.text, "data ok\n", "{setup:?}: {}", o.text);
        } else {
            assert!(
                o.text.contains("data ok") || o.text.contains("no data stack"),
                "{setup:?}: {}",
                o.text
            );
        }
        srv.stop().await;

        // The operator adds a tree: then it is readable, and only that one.
        let expose = s(opt_dir.path()).to_string();
        let Some(srv) = start(setup, &["--expose", &expose], &[]).await else {
            continue;
        };
        let o = srv.run("python", &code).await;
        assert!(
            o.text
                .contains(&format!("READ {} {opt_secret}", s(&opt_file))),
            "{setup:?}: --expose {expose}: {}",
            o.text
        );
        assert!(
            !o.text.contains(lib_secret.as_str()),
            "{setup:?}: {}",
            o.text
        );
        srv.stop().await;
    }
}

// The start-up log lists the view, the operator's trees included.
#[tokio::test(flavor = "multi_thread")]
async fn finding_r3_10_the_start_up_log_lists_the_view() {
    use std::io::BufRead;
    for level in ["bwrap", "landlock"] {
        let mut child = std::process::Command::new(BIN)
            .args(["serve", "--sandbox", level, "--expose", "/etc/hostname"])
            .env("REPLBOX_LOG", "info")
            .env("REPLBOX_POOL", "0")
            .env("REPLBOX_SESSION_POOL", "0")
            // No client: the server logs its view while it starts, then reads the end of
            // its input and stops.
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start replbox");
        let stderr = child.stderr.take().expect("stderr");
        let mut found = None;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if line.contains("sandbox view") {
                found = Some(line);
                break;
            }
            if line.contains("ERROR") {
                break;
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        let Some(line) = found else {
            skip(&format!("level {level} did not start here"));
            continue;
        };
        assert!(
            line.contains("/usr/") && line.contains("/etc/hostname") && !line.contains("/opt/"),
            "{level}: {line}"
        );
    }
}
