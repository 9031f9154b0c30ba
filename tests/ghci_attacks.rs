//! Attacks by one principal's ghci session on what another principal's ghci loads.

use crate::common;
use serde_json::json;

/// B's cell: every absolute path ghci was started with (its own control directory's
/// bootstrap aside), and its directory, chmodded 0. Not root at Landlock a session runs as
/// the server's uid, and chmod is no Landlock right: whatever the server shares between
/// sessions by path there (a package database, object code built once) must not be one
/// that another principal's ghci then reads.
const CHMOD_WHAT_GHCI_LOADS: &str = r#"import qualified System.Posix.Files as F
import qualified Control.Exception as E
import System.FilePath (takeDirectory)
raw <- readFile "/proc/self/cmdline"
let args = drop 1 (lines (map (\c -> if c == '\0' then '\n' else c) raw))
let script = head ([b | (a, b) <- zip args (drop 1 args), a == "-ghci-script"] ++ [""])
let targets = [p | p <- args, take 1 p == "/", p /= script] >>= \p -> [p, takeDirectory p]
mapM_ (\p -> E.try (F.setFileMode p 0) >>= \r -> putStrLn (either (\e -> "refused " ++ p ++ " " ++ show (e :: E.SomeException)) (const ("chmod " ++ p)) r)) targets
putStrLn "attack done"
"#;

/// Not root at Landlock: B's ghci chmods what its ghci was started with; A's ghci, started
/// after, still evaluates.
#[tokio::test(flavor = "multi_thread")]
async fn a_ghci_session_cannot_break_another_principals_ghci_at_landlock_not_root() {
    use std::os::unix::fs::PermissionsExt;
    if !common::require("haskell", "ghci") {
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        common::skip("a server of another uid needs root");
        return;
    }
    let uid = 61_951;
    // The server's own cache (its XDG_CACHE_HOME), as a server not root has one.
    let home = std::env::temp_dir().join(format!("replbox-ghci-attacks-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).expect("scratch");
    std::os::unix::fs::chown(&home, Some(uid), Some(uid)).expect("chown");
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let started = common::Server::http()
        .token("ghci-attack-principal-a-0123456789")
        .token("ghci-attack-principal-b-0123456789")
        .args(["--sandbox", "landlock"])
        .env("XDG_CACHE_HOME", &home)
        .uid(uid)
        .try_start()
        .await;
    let s = match started {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&home);
            common::skip(format!("ghci at landlock, not root: {e}"));
            return;
        }
    };
    let a = s.connect("ghci-attack-principal-a-0123456789").await;
    let b = s.connect("ghci-attack-principal-b-0123456789").await;
    let o = common::http_call(&b, "session_start", json!({"language": "haskell"})).await;
    assert!(!o.is_error, "{}", o.text);
    let sb = o.s("session_id").to_string();
    let o = common::http_call(
        &b,
        "session_eval",
        json!({"session_id": sb, "code": CHMOD_WHAT_GHCI_LOADS}),
    )
    .await;
    assert!(o.text.contains("attack done"), "{}", o.text);
    eprintln!("B's attack: {}", o.text);
    let o = common::http_call(&a, "session_start", json!({"language": "haskell"})).await;
    assert!(!o.is_error, "A's ghci did not start: {}", o.text);
    let sa = o.s("session_id").to_string();
    let o = common::http_call(
        &a,
        "session_eval",
        json!({"session_id": sa, "code": "6 * 7"}),
    )
    .await;
    assert!(!o.is_error, "{}", o.text);
    assert_eq!(o.s("status"), "ok", "{}", o.text);
    assert_eq!(
        o.structured["output"].as_str().unwrap_or("").trim(),
        "42",
        "{}",
        o.text
    );
    drop((a, b));
    s.stop().await;
    // The server's files (some chmodded 0 by B) are root's to remove.
    let _ = std::process::Command::new("chmod")
        .args(["-R", "u+rwx"])
        .arg(&home)
        .status();
    let _ = std::fs::remove_dir_all(&home);
}

/// ghci reads a package environment file (`.ghc.environment.<arch>-<os>-<version>`) from its
/// working directory and every directory above it, and loads the package databases and
/// packages it names: whoever can write a session's cwd, or a directory above it, would choose
/// the code the session's ghci loads. Sessions and runs start ghc with `-package-env -`, so
/// no such file is read: the hostile one here names a package set ghci cannot satisfy, and
/// both start and evaluate as usual.
#[tokio::test(flavor = "multi_thread")]
async fn a_package_environment_file_in_the_cwd_is_not_read() {
    use std::os::unix::fs::PermissionsExt;
    if !common::require("haskell", "ghci") {
        return;
    }
    let version = std::process::Command::new("ghc")
        .arg("--numeric-version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // Every name ghc might look for, whatever its version and platform's spelling.
    let hostile = "clear-package-db\nglobal-package-db\npackage-id ghc-prim-no-such-unit\n";
    for name in [
        format!(".ghc.environment.x86_64-linux-{version}"),
        format!(".ghc.environment.aarch64-linux-{version}"),
    ] {
        std::fs::write(dir.path().join(name), hostile).expect("environment file");
    }
    let cwd = dir.path().to_string_lossy().to_string();
    let s = common::Server::stdio().start().await;
    let o = s
        .call("session_start", json!({"language": "haskell", "cwd": cwd}))
        .await;
    assert!(!o.is_error, "{}", o.text);
    let id = o.s("session_id").to_string();
    let o = s.eval(&id, "6 * 7").await;
    assert_eq!(o.s("status"), "ok", "{}", o.text);
    assert_eq!(
        o.structured["output"].as_str().unwrap_or("").trim(),
        "42",
        "{}",
        o.text
    );
    s.stop().await;
}
