//! The shared package cache kept under `--package-cache-mb` (least recently used first,
//! never what a live session holds), its metrics on `/metrics`, and warm sessions taking
//! requests with `packages`. The package index is a loopback one of the test's own (wheels
//! it builds), so no test here needs the internet.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::{Server, http_call, output, require};
use serde_json::json;

const TOKEN: &str = "package-cache-token-0123456789";

/// A directory of the test's own, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("replbox-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("test dir");
        Self(p)
    }
    fn s(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Pure-Python wheels `NAME-1.0-py3-none-any.whl`, each a module whose `VALUE` is its name
/// and a `blob.bin` of `blob` random bytes (stored, so that it weighs as much unpacked),
/// built by python's zipfile into `dir`; the sha256 of each.
fn build_wheels(dir: &std::path::Path, names: &[&str], blob: usize) -> Vec<(String, String)> {
    let script = r#"
import base64, hashlib, os, sys, zipfile
out, blob = sys.argv[1], int(sys.argv[2])
for name in sys.argv[3:]:
    dist = f"{name}-1.0.dist-info"
    files = {
        f"{name}/__init__.py": f"VALUE = {name!r}\n".encode(),
        f"{name}/blob.bin": os.urandom(blob),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: replbox-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}\n"
        for p, d in files.items()
    ) + f"{dist}/RECORD,,\n"
    files[f"{dist}/RECORD"] = record.encode()
    path = os.path.join(out, f"{name}-1.0-py3-none-any.whl")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for p, d in files.items():
            z.writestr(p, d)
    print(name, hashlib.sha256(open(path, "rb").read()).hexdigest())
"#;
    let mut args = vec![
        "-c".to_string(),
        script.to_string(),
        dir.display().to_string(),
        blob.to_string(),
    ];
    args.extend(names.iter().map(|n| n.to_string()));
    let out = std::process::Command::new("python3")
        .args(&args)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(n, h)| (n.to_string(), h.to_string()))
        .collect()
}

/// A loopback simple index (PEP 503 pages) serving the wheels in `dir`, on its own
/// thread's runtime (it lives as long as the test process; the port is the test's).
/// Its base URL (`http://127.0.0.1:PORT/simple`).
fn serve_index(dir: PathBuf, wheels: Vec<(String, String)>) -> String {
    use axum::extract::Path as P;
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    let pages = std::sync::Arc::new(wheels);
    let page = {
        let pages = pages.clone();
        move |P(name): P<String>| {
            let pages = pages.clone();
            async move {
                match pages.iter().find(|(n, _)| *n == name) {
                    Some((n, h)) => (
                        StatusCode::OK,
                        [(header::CONTENT_TYPE, "text/html")],
                        format!(
                            "<!DOCTYPE html><html><body><a href=\"/files/{n}-1.0-py3-none-any.whl#sha256={h}\">{n}-1.0-py3-none-any.whl</a></body></html>"
                        ),
                    )
                        .into_response(),
                    None => StatusCode::NOT_FOUND.into_response(),
                }
            }
        }
    };
    let file = move |P(f): P<String>| {
        let dir = dir.clone();
        async move {
            if f.contains('/') || f.starts_with('.') {
                return StatusCode::NOT_FOUND.into_response();
            }
            match std::fs::read(dir.join(&f)) {
                Ok(b) => (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/octet-stream")],
                    b,
                )
                    .into_response(),
                Err(_) => StatusCode::NOT_FOUND.into_response(),
            }
        }
    };
    let app = axum::Router::new()
        .route("/simple/{name}/", axum::routing::get(page))
        .route("/files/{file}", axum::routing::get(file));
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(listener).expect("listener");
            let _ = axum::serve(l, app).await;
        });
    });
    format!("http://127.0.0.1:{port}/simple")
}

/// `/metrics`, scraped over HTTP with the token.
async fn scrape(addr: std::net::SocketAddr) -> String {
    reqwest::Client::new()
        .get(format!("http://{addr}/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

/// A metric's value in `text` (0 when absent).
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or(0)
}

/// The wheels, the index and a cache: None (skipped) without python or uv.
fn setup(tag: &str, names: &[&str], blob: usize) -> Option<(Dir, Dir, String)> {
    if !require("python", "python3") || !require("uv", "uv") {
        return None;
    }
    let files = Dir::new(&format!("index-{tag}"));
    let wheels = build_wheels(&files.0, names, blob);
    let index = serve_index(files.0.clone(), wheels);
    Some((files, Dir::new(&format!("pkgcache-{tag}")), index))
}

/// Two packages of 600 KiB each under a 1 MiB cap: the second one's installation evicts
/// the first (used least recently, held by nothing), never the one a live session holds;
/// `/metrics` counts the hits and misses and says the cache's size, which stays under the
/// cap; the evicted package is downloaded again when asked for again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_stays_under_its_cap_and_metrics_say_so() {
    let Some((_files, cache, index)) = setup("cap", &["rbcapa", "rbcapb"], 600 << 10) else {
        return;
    };
    let s = Server::http()
        .token(TOKEN)
        .args([
            "--package-cache",
            &cache.s(),
            "--package-cache-mb",
            "1",
            "--package-index",
            &index,
        ])
        .start()
        .await;
    let c = s.connect(TOKEN).await;
    let run = |pkg: &str| {
        json!({"languageId": "python", "packages": [pkg],
               "code": format!("import {pkg}; print({pkg}.VALUE)")})
    };
    let o = http_call(c.peer(), "run-code", run("rbcapa")).await;
    assert_eq!(o.text.lines().next(), Some("rbcapa"), "{}", o.text);
    assert_eq!(
        o.structured["packages"]["downloaded"],
        json!(1),
        "{}",
        o.text
    );
    let o = http_call(c.peer(), "run-code", run("rbcapa")).await;
    assert_eq!(o.text.lines().next(), Some("rbcapa"), "{}", o.text);
    assert_eq!(
        o.structured["packages"]["downloaded"],
        json!(0),
        "{}",
        o.text
    );
    // The session holds rbcapb while it lives: its installation takes the cache past the
    // cap, and rbcapa (no run holds it now) is what goes.
    let o = http_call(
        c.peer(),
        "session_start",
        json!({"language": "python", "packages": ["rbcapb"]}),
    )
    .await;
    assert!(!o.is_error, "{}", o.text);
    let id = o.structured["session_id"].as_str().expect("id").to_string();
    // Eviction runs after the installation, in the background: wait for the server to
    // count it (a bound only as a backstop).
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let m = loop {
        let m = scrape(s.addr).await;
        if metric(&m, "replbox_package_cache_evictions_total") >= 1 {
            break m;
        }
        assert!(std::time::Instant::now() < deadline, "no eviction: {m}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        metric(&m, "replbox_package_cache_evictions_total"),
        1,
        "{m}"
    );
    assert_eq!(metric(&m, "replbox_package_cache_hits_total"), 1, "{m}");
    assert_eq!(metric(&m, "replbox_package_cache_misses_total"), 2, "{m}");
    let bytes = metric(&m, "replbox_package_cache_bytes");
    assert!(bytes > 600 << 10 && bytes <= 1 << 20, "{bytes}: {m}");
    assert!(
        m.contains("replbox_package_installs_total{source=\"index\"} 2"),
        "{m}"
    );
    // What the session holds is intact and imports.
    let o = http_call(
        c.peer(),
        "session_eval",
        json!({"session_id": id, "code": "import rbcapb; print(rbcapb.VALUE, len(open(rbcapb.__path__[0] + '/blob.bin', 'rb').read()))"}),
    )
    .await;
    assert_eq!(
        output(&o).trim(),
        format!("rbcapb {}", 600 << 10),
        "{}",
        o.text
    );
    // rbcapa was evicted: asked for again, it is downloaded again.
    let o = http_call(c.peer(), "run-code", run("rbcapa")).await;
    assert_eq!(o.text.lines().next(), Some("rbcapa"), "{}", o.text);
    assert_eq!(
        o.structured["packages"]["downloaded"],
        json!(1),
        "{}",
        o.text
    );
    s.stop().await;
}

/// With warm sessions, a `session_start` with packages the cache already has starts from a
/// warm session and adds them to its layer (the result says `warm`; the package imports).
/// One whose top-level module a warm session has already imported (here the `--preload`
/// module `colorsys`, shadowed by a package of the same name) starts cold, and gets the
/// layer's module.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_session_takes_cached_packages() {
    let Some((files, cache, index)) = setup("warm", &["rbwarm", "colorsys"], 1024) else {
        return;
    };
    let s = Server::http()
        .token(TOKEN)
        .env("REPLBOX_SESSION_POOL", "1")
        .args([
            "--package-cache",
            &cache.s(),
            "--package-index",
            &index,
            "--preload",
            "colorsys",
        ])
        .start()
        .await;
    let _files = files;
    let c = s.connect(TOKEN).await;
    // Each comes into the cache (and the request's resolution is kept).
    for pkg in ["rbwarm", "colorsys"] {
        let o = http_call(
            c.peer(),
            "run-code",
            json!({"languageId": "python", "packages": [pkg],
                   "code": format!("import {pkg}; print({pkg}.VALUE)")}),
        )
        .await;
        assert_eq!(o.text.lines().next(), Some(pkg), "{}", o.text);
    }
    // Wait for the server to say a warm python session is ready (a backstop bound).
    let ready = || async {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let m = scrape(s.addr).await;
            if m.contains("replbox_warm_sessions{language=\"python\"} 1") {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "no warm session: {m}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    ready().await;
    let o = http_call(
        c.peer(),
        "session_start",
        json!({"language": "python", "packages": ["rbwarm"]}),
    )
    .await;
    assert!(!o.is_error, "{}", o.text);
    assert_eq!(o.structured["warm"], json!(true), "{}", o.text);
    assert_eq!(
        o.structured["packages"]["installed"],
        json!([{"name": "rbwarm", "version": "1.0"}]),
        "{}",
        o.text
    );
    assert_eq!(
        o.structured["packages"]["downloaded"],
        json!(0),
        "{}",
        o.text
    );
    let id = o.structured["session_id"].as_str().expect("id").to_string();
    let o = http_call(
        c.peer(),
        "session_eval",
        json!({"session_id": id, "code": "import rbwarm; print(rbwarm.VALUE)"}),
    )
    .await;
    assert_eq!(output(&o).trim(), "rbwarm", "{}", o.text);
    // The warm session imported the stdlib's colorsys: it cannot stand for the package.
    ready().await;
    let o = http_call(
        c.peer(),
        "session_start",
        json!({"language": "python", "packages": ["colorsys"]}),
    )
    .await;
    assert!(!o.is_error, "{}", o.text);
    assert_eq!(o.structured["warm"], json!(false), "{}", o.text);
    let id = o.structured["session_id"].as_str().expect("id").to_string();
    let o = http_call(
        c.peer(),
        "session_eval",
        json!({"session_id": id, "code": "import colorsys; print(colorsys.VALUE)"}),
    )
    .await;
    assert_eq!(output(&o).trim(), "colorsys", "{}", o.text);
    s.stop().await;
}
