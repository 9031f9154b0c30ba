//! The egress proxy through a real MCP client, at `bwrap` and `landlock` with the server as
//! root: a package installed from the index through the allowlist and imported in the same
//! session; a domain off the list refused with a message naming the list; the host's
//! loopback out of reach with `--allow-network` and with an allowed name that resolves to it;
//! a host the operator names reached. Listeners are the test's own, on loopback.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use serde_json::json;

const LEVELS: &[&str] = &["bwrap", "landlock"];
const INDEX: &str = "pypi.org,files.pythonhosted.org";

/// The server as root at `level`, or None with the reason printed (a failure in CI).
async fn start(level: &str, args: &[&str]) -> Option<TestServer> {
    if !nix::unistd::geteuid().is_root() {
        skip("the egress tests run the server as root");
        return None;
    }
    let mut a = vec!["--sandbox", level];
    a.extend_from_slice(args);
    match TestServer::try_start(&a, &[], None).await {
        Ok(s) => {
            let ins = s.instructions();
            assert!(ins.contains(&format!("Sandbox: {level} (")), "{ins}");
            Some(s)
        }
        Err(e) => {
            skip(format!("level {level} does not work here: {e}"));
            None
        }
    }
}

/// A loopback HTTP listener that counts connections and answers each with "reached".
struct Listener {
    port: u16,
    hits: Arc<AtomicUsize>,
}

impl Listener {
    fn open() -> Self {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                h.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                let _ = c.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\nreached",
                );
            }
        });
        Self { port, hits }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// Python that fetches `url` and prints the body or the error.
fn fetch(url: &str) -> String {
    format!(
        "import urllib.request\ntry:\n    print(urllib.request.urlopen({url:?}, timeout=30).read().decode())\nexcept Exception as e:\n    print('ERR', e)"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn pip_installs_from_the_allowlist_and_the_package_imports_in_the_same_session() {
    if !require("python", "python3") {
        return;
    }
    for &level in LEVELS {
        let Some(s) = start(level, &["--allow-domain", INDEX]).await else {
            continue;
        };
        assert!(
            s.instructions()
                .contains("to pypi.org, files.pythonhosted.org"),
            "{}",
            s.instructions()
        );
        let id = s.start_session("python").await;
        let o = s.eval(&id, "import iniconfig").await;
        assert_eq!(
            status(&o),
            "error",
            "{level}: iniconfig is installed already"
        );
        let o = s
            .eval_t(
                &id,
                "import subprocess, sys\nr = subprocess.run([sys.executable, '-m', 'pip', 'install', '--no-cache-dir', 'iniconfig'], capture_output=True, text=True)\nprint(r.returncode)\nprint(r.stdout[-2000:], r.stderr[-2000:])",
                180_000,
            )
            .await;
        assert!(
            output(&o).starts_with("0\n") && output(&o).contains("Successfully installed"),
            "{level}: {}",
            o.text
        );
        // Imported without a restart, from the session's own directory.
        let o = s
            .eval(
                &id,
                "import iniconfig, os\nprint(iniconfig.__file__.startswith(os.environ['HOME']))",
            )
            .await;
        assert_eq!(status(&o), "ok", "{level}: {}", o.text);
        assert_eq!(output(&o).trim(), "True", "{level}: {}", o.text);

        // A domain off the list: refused, and the agent is told what the list is.
        let o = s.eval(&id, &fetch("https://example.com/")).await;
        assert!(
            output(&o).contains("403")
                && output(&o).contains(
                    "example.com is not on the allowlist (allowed: pypi.org, files.pythonhosted.org)"
                ),
            "{level}: {}",
            o.text
        );
        let o = s.eval(&id, &fetch("http://example.com/")).await;
        assert!(
            output(&o).contains("HTTP Error 403") && output(&o).contains("not on the allowlist"),
            "{level}: {}",
            o.text
        );
        s.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_hosts_loopback_stays_unreachable_with_allow_network() {
    if !require("python", "python3") {
        return;
    }
    for &level in LEVELS {
        let l = Listener::open();
        let Some(s) = start(level, &["--allow-network"]).await else {
            continue;
        };
        // Through the proxy: refused on the address.
        let o = s
            .run("python", &fetch(&format!("http://127.0.0.1:{}/", l.port)))
            .await;
        assert!(
            o.text.contains("ERR HTTP Error 403") && o.text.contains("resolves to 127.0.0.1"),
            "{level}: {}",
            o.text
        );
        let o = s
            .run("python", &fetch(&format!("https://localhost:{}/", l.port)))
            .await;
        assert!(
            o.text.contains("Tunnel connection failed: 403"),
            "{level}: {}",
            o.text
        );
        // Around the proxy: no route (bwrap), or the port is not the proxy's (landlock).
        let direct = format!(
            "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {}), 5).close()\n    print('connected')\nexcept OSError as e:\n    print('refused', type(e).__name__)",
            l.port
        );
        let o = s.run("python", &direct).await;
        assert!(o.text.starts_with("refused"), "{level}: {}", o.text);
        assert_eq!(l.hits(), 0, "{level}: the host's listener was reached");
        s.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_allowed_name_that_resolves_to_loopback_is_refused() {
    if !require("python", "python3") {
        return;
    }
    for &level in LEVELS {
        let l = Listener::open();
        let Some(s) = start(level, &["--allow-domain", "localhost"]).await else {
            continue;
        };
        let o = s
            .run("python", &fetch(&format!("http://localhost:{}/", l.port)))
            .await;
        assert!(
            o.text.contains("ERR HTTP Error 403") && o.text.contains("localhost resolves to"),
            "{level}: {}",
            o.text
        );
        assert_eq!(l.hits(), 0, "{level}: the host's listener was reached");
        s.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_the_operator_names_is_reached() {
    if !require("python", "python3") {
        return;
    }
    for &level in LEVELS {
        let l = Listener::open();
        let host = format!("127.0.0.1:{}", l.port);
        let Some(s) = start(level, &["--allow-host", &host]).await else {
            continue;
        };
        let o = s.run("python", &fetch(&format!("http://{host}/"))).await;
        assert_eq!(o.text.trim(), "reached", "{level}: {}", o.text);
        assert_eq!(l.hits(), 1, "{level}");
        // Another port of the same host is not named.
        let o = s
            .run(
                "python",
                &fetch(&format!("http://127.0.0.1:{}/", l.port + 1)),
            )
            .await;
        assert!(
            o.text.contains("not on the allowlist"),
            "{level}: {}",
            o.text
        );
        s.stop().await;
    }
}

/// Sessions and runs are only ever given the proxy: `run-code` sees the same variables.
#[tokio::test(flavor = "multi_thread")]
async fn runs_get_the_proxy_variables_and_no_network_without_a_flag() {
    if !require("python", "python3") {
        return;
    }
    for &level in LEVELS {
        let Some(s) = start(level, &[]).await else {
            continue;
        };
        let o = s
            .run("python", "import os\nprint(os.environ.get('HTTPS_PROXY'))")
            .await;
        assert_eq!(o.text.trim(), "None", "{level}");
        assert!(s.instructions().contains("no network"), "{level}");
        s.stop().await;
        let Some(s) = start(level, &["--allow-domain", "pypi.org"]).await else {
            continue;
        };
        let o = s
            .call(
                "run-code",
                json!({"languageId": "python", "code": "import os, urllib.parse\nu = urllib.parse.urlsplit(os.environ['https_proxy'])\nprint(u.hostname == '127.0.0.1' and len(u.password or '') >= 32)"}),
            )
            .await;
        assert_eq!(o.text.trim(), "True", "{level}: {}", o.text);
        s.stop().await;
    }
}

/// `allow_domains` (a caller's own domains) is honoured only within the operator's
/// `--caller-domains`, and refused with the reason otherwise.
#[tokio::test(flavor = "multi_thread")]
async fn callers_add_domains_only_within_the_operators_caller_domains() {
    if !require("python", "python3") {
        return;
    }
    for &level in LEVELS {
        // No --caller-domains: refused, by both tools, whatever else is allowed.
        for flags in [&[][..], &["--allow-domain", "pypi.org"][..]] {
            let Some(s) = start(level, flags).await else {
                continue;
            };
            let o = s
                .call(
                    "session_start",
                    json!({"language": "python", "allow_domains": ["example.com"]}),
                )
                .await;
            assert!(o.is_error, "{level}: {}", o.text);
            assert_eq!(o.error_kind(), "invalid_argument", "{level}: {}", o.text);
            assert!(o.text.contains("--caller-domains"), "{level}: {}", o.text);
            let o = s
                .call(
                    "run-code",
                    json!({"languageId": "python", "code": "print(1)", "allow_domains": ["pypi.org"]}),
                )
                .await;
            assert_eq!(o.error_kind(), "invalid_argument", "{level}: {}", o.text);
            s.stop().await;
        }

        let Some(s) = start(level, &["--caller-domains", INDEX]).await else {
            continue;
        };
        assert!(
            s.instructions()
                .contains("no network unless a call asks for allow_domains among: pypi.org"),
            "{}",
            s.instructions()
        );
        // Outside the operator's list: refused, naming it.
        for bad in [
            json!(["example.com"]),
            json!(["*.org"]),
            json!(["pypi.org\r\nX: y"]),
        ] {
            let o = s
                .call(
                    "session_start",
                    json!({"language": "python", "allow_domains": bad}),
                )
                .await;
            assert_eq!(o.error_kind(), "invalid_argument", "{level}: {}", o.text);
        }
        // Not asked for: no network at all.
        let o = s
            .run("python", "import os\nprint(os.environ.get('HTTPS_PROXY'))")
            .await;
        assert_eq!(o.text.trim(), "None", "{level}: {}", o.text);
        // Asked for: that domain only.
        let id = {
            let o = s
                .call(
                    "session_start",
                    json!({"language": "python", "allow_domains": ["PyPI.org"]}),
                )
                .await;
            assert!(!o.is_error, "{level}: {}", o.text);
            o.s("session_id").to_string()
        };
        let o = s
            .eval(&id, &fetch("https://pypi.org/simple/iniconfig/"))
            .await;
        assert!(
            output(&o).contains("iniconfig") && !output(&o).starts_with("ERR"),
            "{level}: {}",
            o.text
        );
        let o = s.eval(&id, &fetch("https://files.pythonhosted.org/")).await;
        assert!(
            output(&o).contains("not on the allowlist (allowed: pypi.org)"),
            "{level}: {}",
            o.text
        );
        s.stop().await;
    }
}
