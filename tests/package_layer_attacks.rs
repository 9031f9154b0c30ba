//! Attacks on the package layers one principal's session could aim at another's: a
//! layer shared between principals must be one that no session can make unreadable, or
//! the other principal's imports fail, or fall through to another copy of the package
//! (the interpreter's own site-packages) without a word.

use crate::common;

use serde_json::json;

/// A package cache and a uv every uid can run, both this test's own, removed when dropped.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(name: &str) -> Option<Self> {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("replbox-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("bin")).ok()?;
        for d in [&dir, &dir.join("bin")] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).ok()?;
        }
        let out = std::process::Command::new("python3")
            .args(["-c", "import uv; print(uv.find_uv_bin())"])
            .output()
            .ok()?;
        let uv = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        std::fs::copy(&uv, dir.join("bin/uv")).ok()?;
        Some(Self(dir))
    }
    fn path(&self, p: &str) -> String {
        self.0.join(p).display().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        let _ = std::fs::remove_dir_all(format!("{}-cache", self.0.display()));
    }
}

/// A's import: `ours PATH` when its `six` comes from its packages (on its PYTHONPATH).
const A_IMPORTS: &str = r#"
import os, six
d = os.path.dirname(six.__file__)
print("ours" if d in os.environ.get("PYTHONPATH", "").split(":") else "other", d)
"#;

/// Not root at Landlock every session runs as the server's uid, and chmod is no Landlock
/// right: a session can change the mode of any file of the server's whose path it has. Its
/// own layer's path it has (on its PYTHONPATH): that layer, and the files in it, must be
/// no other principal's (neither a shared layer nor hard links to the cache's files). B's
/// code makes its `six.py` and the directory it came from unreadable; A's session, started
/// with the same packages, still imports its `six` from its own packages; and B's layer,
/// shut as it is, is removed when B's session closes.
#[tokio::test]
async fn a_session_cannot_unseal_another_principals_packages_at_landlock_not_root() {
    if !common::require("python", "python3") || !common::require("uv", "uv") {
        return;
    }
    let Some(scratch) = Scratch::new("layer-attacks") else {
        common::skip("uv's program not found (python3 -c 'import uv')");
        return;
    };
    // Made by the server (as its uid), beside the scratch directory.
    let cache = format!("{}-cache", scratch.0.display());
    let _ = std::fs::remove_dir_all(&cache);
    let uv = scratch.path("bin/uv");
    let uid = nix::unistd::geteuid().is_root().then_some(61_950);
    let started = common::Server::http()
        .token("layer-attack-principal-a-0123456789")
        .token("layer-attack-principal-b-0123456789")
        .args([
            "--sandbox",
            "landlock",
            "--package-cache",
            &cache,
            "--uv",
            &uv,
            // A closed session's files go at once (not kept readable for a while).
            "--keep-files-s",
            "0",
        ])
        .uid(uid)
        .try_start()
        .await;
    let s = match started {
        Ok(s) => s,
        Err(e) => {
            common::skip(format!("packages at landlock, not root: {e}"));
            return;
        }
    };
    let a = s.connect("layer-attack-principal-a-0123456789").await;
    let b = s.connect("layer-attack-principal-b-0123456789").await;
    let start = json!({"language": "python", "packages": ["six"]});
    let o = common::http_call(&a, "session_start", start.clone()).await;
    assert!(!o.is_error, "{}", o.text);
    let sa = o.s("session_id").to_string();
    let o = common::http_call(&b, "session_start", start).await;
    assert!(!o.is_error, "{}", o.text);
    let sb = o.s("session_id").to_string();
    // B's code: the directory of its six, made unreadable (and then its store's).
    let attack = r#"
import os, six
d = os.path.dirname(six.__file__)
for p in [os.path.join(d, "six.py"), d]:
    try:
        os.chmod(p, 0)
        print("chmod", p)
    except OSError as e:
        print("refused", p, type(e).__name__)
"#;
    let o_b = common::http_call(
        &b,
        "session_eval",
        json!({"session_id": sb, "code": attack}),
    )
    .await;
    assert!(!o_b.is_error, "{}", o_b.text);
    let o = common::http_call(
        &a,
        "session_eval",
        json!({"session_id": sa, "code": A_IMPORTS}),
    )
    .await;
    let said = o.structured["output"].as_str().unwrap_or("").trim();
    assert!(
        said.starts_with("ours "),
        "A's six is not its packages': {}",
        o.text
    );
    // B's own layer, shut (mode 0) by B's code, still goes with B's session.
    let shut = o_b.structured["output"]
        .as_str()
        .unwrap_or("")
        .lines()
        .filter_map(|l| l.strip_prefix("chmod "))
        .next_back()
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| panic!("B's code could not shut its layer: {}", o_b.text));
    {
        let layer = shut;
        let o = common::http_call(&b, "session_close", json!({"session_id": sb})).await;
        assert!(!o.is_error, "{}", o.text);
        // The removal runs after the close answers: a bound that is only a backstop.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::fs::symlink_metadata(&layer).is_ok() {
            assert!(
                std::time::Instant::now() < deadline,
                "{} was left behind",
                layer.display()
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    drop((a, b));
    s.stop().await;
}
