//! Code mode: session and run-code code calling the tools of other MCP servers. The
//! upstreams are real: the official `@modelcontextprotocol/server-everything` over stdio
//! (installed by .ci/run into its cache), and `examples/upstream_probe.rs` (rmcp) over stdio
//! and over streamable HTTP.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{HttpChild, Out, TestServer, http_call, output, require, require_data_stack, status};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

/// Where .ci/run installs server-everything.
fn everything() -> Option<PathBuf> {
    let cache = std::env::var_os("REPLBOX_CI_CACHE")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .map(|c| c.join("replbox-ci"))
        })?;
    let p =
        cache.join("upstream/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    p.is_file().then_some(p)
}

fn require_everything() -> Option<PathBuf> {
    if !require("javascript", "node") {
        return None;
    }
    if let Some(p) = everything() {
        return Some(p);
    }
    if std::env::var("REPLBOX_REQUIRE_ALL").is_ok_and(|v| v == "1") {
        panic!("@modelcontextprotocol/server-everything is not installed (.ci/run installs it)");
    }
    eprintln!("SKIP: server-everything is not installed in the CI cache (.ci/run installs it)");
    None
}

/// The probe upstream (an example of this package), built when a targeted test run did not.
fn probe() -> PathBuf {
    let dir = Path::new(common::BIN).parent().expect("target dir");
    let p = dir.join("examples/upstream_probe");
    if !p.is_file() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let ok = std::process::Command::new(cargo)
            .args(["build", "-q", "--example", "upstream_probe"])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "cargo build --example upstream_probe failed");
    }
    p
}

/// A probe serving streamable HTTP that wants header `x-api-key: KEY`.
struct HttpProbe {
    child: tokio::process::Child,
    url: String,
}

impl HttpProbe {
    async fn start(key: &str) -> Self {
        let mut child = tokio::process::Command::new(probe())
            .args([
                "--http",
                "127.0.0.1:0",
                "--require-header",
                &format!("x-api-key:{key}"),
            ])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the HTTP probe");
        let out = child.stdout.take().expect("stdout");
        let mut lines = tokio::io::BufReader::new(out).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the HTTP probe listens")
            .expect("read")
            .expect("a line");
        let url = line.trim_start_matches("listening on ").to_string();
        Self { child, url }
    }
}

impl Drop for HttpProbe {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// The operator's files for one test.
struct Setup {
    dir: tempfile::TempDir,
    env_secret: String,
    header_secret: String,
    _http: Option<HttpProbe>,
}

impl Setup {
    /// `everything` and `probe` over stdio (server-everything when installed), `remote`
    /// (the probe over HTTP) when `http`.
    async fn new(http: bool) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let env_secret = common::token();
        let header_secret = format!("hdr-{}", common::token());
        let mut servers = serde_json::Map::new();
        servers.insert(
            "probe".into(),
            json!({"command": probe(), "env": {"PROBE_API_KEY": env_secret}}),
        );
        if let Some(ev) = everything() {
            servers.insert(
                "everything".into(),
                json!({"command": "node", "args": [ev, "stdio"], "env": {"EVERYTHING_KEY": env_secret}}),
            );
        }
        let http = if http {
            let h = HttpProbe::start(&header_secret).await;
            servers.insert(
                "remote".into(),
                json!({"url": h.url, "headers": {"X-Api-Key": header_secret}}),
            );
            Some(h)
        } else {
            None
        };
        std::fs::write(
            dir.path().join("servers.json"),
            serde_json::to_string_pretty(&json!({"mcpServers": servers})).unwrap(),
        )
        .unwrap();
        Self {
            dir,
            env_secret,
            header_secret,
            _http: http,
        }
    }

    fn servers(&self) -> String {
        self.dir.path().join("servers.json").display().to_string()
    }

    async fn server(&self, extra: &[&str]) -> TestServer {
        let file = self.servers();
        let mut args = vec!["--mcp-servers", file.as_str()];
        args.extend_from_slice(extra);
        TestServer::start_with(&args, &[]).await
    }
}

async fn start(s: &TestServer, lang: &str, servers: &[&str]) -> Out {
    s.call(
        "session_start",
        json!({"language": lang, "mcp_servers": servers}),
    )
    .await
}

fn session(o: &Out) -> String {
    assert!(!o.is_error, "session_start failed: {}", o.text);
    o.s("session_id").to_string()
}

#[tokio::test]
async fn python_chains_calls_into_a_dataframe_kept_for_the_next_cell() {
    if !require_data_stack() {
        return;
    }
    let Some(_) = require_everything() else {
        return;
    };
    let setup = Setup::new(false).await;
    let s = setup.server(&[]).await;
    let r = start(&s, "python", &["everything", "probe"]).await;
    let id = session(&r);
    // The start result lists what the code can call.
    let listed = &r.structured["mcp_servers"];
    assert_eq!(listed[0]["name"], "everything");
    assert!(
        listed[0]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t == "get-sum"),
        "{listed}"
    );
    assert!(
        r.text.contains("MCP server probe (tools.probe): add"),
        "{}",
        r.text
    );

    let o = s
        .eval(
            &id,
            "from replbox import tools\nprint(tools.everything.get_sum(a=2, b=3))\nprint(sorted(tools.list()['probe']))",
        )
        .await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    assert!(output(&o).contains("5"), "{}", o.text);
    assert!(
        output(&o).contains("'add'") && output(&o).contains("'crash'"),
        "{}",
        o.text
    );

    // help(): the description and the input schema, as a signature and a docstring.
    let o = s.eval(&id, "help(tools.probe.add)").await;
    assert!(output(&o).contains("add(*, a: int, b: int)"), "{}", o.text);
    assert!(
        output(&o).contains("Add two integers") && output(&o).contains("First addend"),
        "{}",
        o.text
    );

    // A hundred calls in one cell, into a DataFrame; the next cell still has it.
    let o = s
        .eval(
            &id,
            "import pandas as pd\nrows = [dict(i=i, **tools.probe.add(a=i, b=i)) for i in range(100)]\ndf = pd.DataFrame(rows)\nprint(len(df))",
        )
        .await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    assert!(output(&o).contains("100"), "{}", o.text);
    let o = s.eval(&id, "print(int(df['sum'].sum()), df.shape)").await;
    assert!(output(&o).contains("9900 (100, 2)"), "{}", o.text);

    // Images come as bytes with their MIME type.
    let o = s
        .eval(
            &id,
            "b = tools.probe.image()\nprint(b.mime_type, b.data[:4])",
        )
        .await;
    assert!(output(&o).contains("image/png b'\\x89PNG'"), "{}", o.text);

    // The history records each call: server, tool, arguments, status, hash and size.
    let h = s.call("session_history", json!({"session_id": id})).await;
    let cells = h.structured["cells"].as_array().expect("cells");
    let calls = cells[2]["tool_calls"]
        .as_array()
        .expect("tool calls of cell 3");
    assert_eq!(calls.len(), 100);
    assert_eq!(calls[7]["server"], "probe");
    assert_eq!(calls[7]["tool"], "add");
    assert_eq!(calls[7]["arguments"], json!({"a": 7, "b": 7}));
    assert_eq!(calls[7]["status"], "ok");
    assert_eq!(calls[7]["result_sha256"].as_str().map(str::len), Some(64));
    assert!(calls[7]["result_bytes"].as_u64().unwrap() > 0);
    s.stop().await;
}

#[tokio::test]
async fn javascript_chains_calls_and_keeps_the_results() {
    if !require("javascript", "node") {
        return;
    }
    let setup = Setup::new(false).await;
    let s = setup.server(&[]).await;
    let id = session(&start(&s, "javascript", &["probe"]).await);
    let o = s
        .eval(
            &id,
            "const { tools } = require('replbox');\nvar rows = [];\nfor (let i = 0; i < 100; i++) rows.push(await tools.probe.add({a: i, b: 1}));\nconsole.log(rows.length, rows[99].sum)",
        )
        .await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    assert!(output(&o).contains("100 100"), "{}", o.text);
    // At once (Promise.all), and in the next cell.
    let o = s
        .eval(
            &id,
            "const more = await Promise.all([1,2,3].map((a) => tools.probe.add({a, b: 10})));\nconsole.log(rows.reduce((t, r) => t + r.sum, 0), more.map((r) => r.sum).join(','))",
        )
        .await;
    assert!(output(&o).contains("5050 11,12,13"), "{}", o.text);
    let o = s
        .eval(
            &id,
            "try { await tools.probe.fail({text: 'bad input'}) } catch (e) { console.log(e.name, e.kind, e.message) }\nconsole.log(await tools.help('probe', 'add'))",
        )
        .await;
    assert!(
        output(&o).contains("ToolError tool_error bad input"),
        "{}",
        o.text
    );
    assert!(output(&o).contains("First addend"), "{}", o.text);
    s.stop().await;
}

#[tokio::test]
async fn tool_errors_refusals_and_the_shell_command() {
    if !require("python", "python3") {
        return;
    }
    let setup = Setup::new(false).await;
    let s = setup.server(&[]).await;
    let id = session(&start(&s, "python", &["probe"]).await);
    let o = s
        .eval(
            &id,
            "from replbox import tools, ToolError\n\
             for f in (lambda: tools.probe.fail(text='no such city'), lambda: tools.call('probe', 'nope'), lambda: tools.call('other', 'x')):\n\
             \x20   try:\n\
             \x20       f()\n\
             \x20   except ToolError as e:\n\
             \x20       print(e.kind, '|', e)\n",
        )
        .await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    let out = output(&o);
    assert!(out.contains("tool_error | no such city"), "{out}");
    assert!(
        out.contains("refused | MCP server probe has no tool \"nope\"; its tools: add"),
        "{out}"
    );
    assert!(out.contains("refused | no MCP server \"other\""), "{out}");
    // An unknown server, or none configured for it, is refused at start with the reason.
    let r = start(&s, "python", &["nope"]).await;
    assert_eq!(r.error_kind(), "invalid_argument", "{}", r.text);
    assert!(
        r.text.contains("no MCP server \"nope\" here; you may use:"),
        "{}",
        r.text
    );
    assert!(r.text.contains("probe"), "{}", r.text);

    if require("bash", "bash") {
        let b = session(&start(&s, "bash", &["probe"]).await);
        let o = s
            .eval(
                &b,
                "replbox-tool probe add '{\"a\": 1, \"b\": 2}'; echo \"rc=$?\"; replbox-tool probe fail '{\"text\": \"oops\"}'; echo \"rc=$?\"; replbox-tool --list | head -1",
            )
            .await;
        let out = output(&o);
        assert!(out.contains("{\"sum\":3}\nrc=0"), "{out}");
        assert!(out.contains("replbox-tool: oops\nrc=1"), "{out}");
        assert!(out.contains("probe add\tAdd two integers"), "{out}");
    }
    s.stop().await;
}

#[tokio::test]
async fn a_slow_tool_meets_the_deadline_and_an_interrupt_cancels_the_call() {
    if !require("python", "python3") {
        return;
    }
    let setup = Setup::new(false).await;
    let s = setup.server(&[]).await;
    let id = session(&start(&s, "python", &["probe"]).await);
    s.eval(&id, "from replbox import tools").await;
    let o = s.eval_t(&id, "tools.probe.slow(ms=60000)", 1500).await;
    assert_eq!(status(&o), "timeout", "{}", o.text);
    // The session keeps its state and its tools.
    let o = s.eval(&id, "print(tools.probe.add(a=1, b=1))").await;
    assert!(output(&o).contains("{'sum': 2}"), "{}", o.text);
    let h = s.call("session_history", json!({"session_id": id})).await;
    let slow = &h.structured["cells"][1]["tool_calls"][0];
    assert!(
        matches!(slow["status"].as_str(), Some("timeout" | "cancelled")),
        "{slow}"
    );

    // An interrupt while a call is in flight: the call is cancelled, the cell ends.
    let client = s.client.peer().clone();
    let id2 = id.clone();
    let eval = tokio::spawn(async move {
        http_call(
            &client,
            "session_eval",
            json!({"session_id": id2, "code": "tools.probe.slow(ms=60000)", "timeout_ms": 120000}),
        )
        .await
    });
    // Wait until the evaluation is running, then interrupt it (repeatedly: the first may
    // land before the cell began its call).
    let mut interrupted = false;
    for _ in 0..200 {
        let r = s.call("session_interrupt", json!({"session_id": id})).await;
        if r.structured["interrupted"] == json!(true) {
            interrupted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(interrupted);
    let o = tokio::time::timeout(Duration::from_secs(60), eval)
        .await
        .expect("the interrupted cell ends")
        .expect("join");
    assert_ne!(status(&o), "ok", "{}", o.text);
    let o = s.eval(&id, "print(tools.probe.add(a=2, b=2))").await;
    assert!(output(&o).contains("{'sum': 4}"), "{}", o.text);
    s.stop().await;
}

#[tokio::test]
async fn a_dead_upstream_is_started_again_and_an_oversized_result_is_refused() {
    if !require("python", "python3") {
        return;
    }
    let setup = Setup::new(false).await;
    let s = setup.server(&["--mcp-max-result-bytes", "20000"]).await;
    let id = session(&start(&s, "python", &["probe"]).await);
    let o = s
        .eval(
            &id,
            "from replbox import tools, ToolError\nfirst = tools.probe.count()\ntry:\n    tools.probe.crash()\nexcept ToolError as e:\n    print('crash:', e.kind)\nsecond = tools.probe.count()\nprint(first['pid'] != second['pid'], second['calls'])",
        )
        .await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    assert!(output(&o).contains("crash: failed"), "{}", o.text);
    assert!(output(&o).contains("True 1"), "{}", o.text);

    let o = s
        .eval(
            &id,
            "try:\n    tools.probe.big(bytes=50000)\nexcept ToolError as e:\n    print(e.kind, '|', e)\nprint(len(tools.probe.big(bytes=1000)))",
        )
        .await;
    let out = output(&o);
    assert!(
        out.contains("too_large | the result of probe.big is"),
        "{out}"
    );
    assert!(out.contains("--mcp-max-result-bytes"), "{out}");
    assert!(out.contains("\n1000"), "{out}");
    s.stop().await;
}

#[tokio::test]
async fn run_code_calls_tools_and_reports_them() {
    if !require("python", "python3") {
        return;
    }
    let setup = Setup::new(false).await;
    let s = setup.server(&[]).await;
    let o = s
        .call(
            "run-code",
            json!({"languageId": "python", "mcp_servers": ["probe"],
                   "code": "from replbox import tools\nprint(sum(tools.probe.add(a=i, b=0)['sum'] for i in range(20)))"}),
        )
        .await;
    assert!(!o.is_error, "{}", o.text);
    assert_eq!(o.text, "190\n");
    assert_eq!(
        o.structured["tool_calls"].as_array().map(Vec::len),
        Some(20)
    );
    assert_eq!(o.structured["mcp_servers"][0]["name"], "probe");
    // Without mcp_servers the code has no tools.
    let o = s
        .run("python", "from replbox import tools\ntools.list()")
        .await;
    assert!(o.is_error);
    s.stop().await;
}

#[tokio::test]
async fn another_session_cannot_use_the_channel() {
    if !require("python", "python3") {
        return;
    }
    let setup = Setup::new(false).await;
    let s = setup.server(&[]).await;
    let a = session(&start(&s, "python", &["probe"]).await);
    let b = session(&start(&s, "python", &["probe"]).await);
    let o = s
        .eval(&a, "import os\nprint(os.environ['REPLBOX_TOOLS'])")
        .await;
    let dir_a = output(&o).trim().to_string();
    assert!(dir_a.starts_with('/'), "{}", o.text);
    // From B: A's socket and A's secret are out of reach; B's own socket wants B's secret.
    let code = format!(
        "import os, socket, json\n\
         d = {dir_a:?}\n\
         def try_(f):\n\
         \x20   try:\n\
         \x20       return f()\n\
         \x20   except OSError as e:\n\
         \x20       return 'refused'\n\
         def connect():\n\
         \x20   s = socket.socket(socket.AF_UNIX); s.connect(d + '/sock')\n\
         \x20   s.sendall(b'{{\"secret\":\"x\",\"op\":\"list\"}}\\n'); return s.recv(4096) or 'closed'\n\
         print('A sock:', try_(connect))\n\
         print('A secret:', try_(lambda: open(d + '/secret').read()))\n\
         own = os.environ['REPLBOX_TOOLS']\n\
         s = socket.socket(socket.AF_UNIX); s.connect(own + '/sock')\n\
         s.sendall(json.dumps({{'secret': 'guess', 'op': 'list'}}).encode() + b'\\n')\n\
         print('B wrong secret:', s.recv(4096))\n"
    );
    let o = s.eval(&b, &code).await;
    let out = output(&o);
    assert!(
        out.contains("A sock: refused") || out.contains("A sock: closed"),
        "{out}"
    );
    assert!(out.contains("A secret: refused"), "{out}");
    assert!(
        out.contains(
            "B wrong secret: b'{\"error\":{\"kind\":\"refused\",\"message\":\"not this session"
        ),
        "{out}"
    );
    // A run-code program cannot reach it either.
    let o = s
        .run(
            "python",
            &format!(
                "import socket\ntry:\n    s = socket.socket(socket.AF_UNIX); s.connect({:?}); print('connected')\nexcept OSError as e:\n    print('refused')",
                format!("{dir_a}/sock")
            ),
        )
        .await;
    assert!(o.text.contains("refused"), "{}", o.text);
    s.stop().await;
}

#[tokio::test]
async fn no_credential_from_env_or_headers_reaches_user_code() {
    if !require("python", "python3") {
        return;
    }
    let setup = Setup::new(true).await;
    let s = setup.server(&[]).await;
    let id = session(&start(&s, "python", &["probe", "remote"]).await);
    // The HTTP upstream takes the header (else it would refuse the call).
    let o = s
        .eval(
            &id,
            "from replbox import tools\nprint(tools.remote.add(a=20, b=22))",
        )
        .await;
    assert!(output(&o).contains("{'sum': 42}"), "{}", o.text);
    let scan = format!(
        "import os\n\
         needles = [{:?}.encode(), {:?}.encode()]\n\
         found = []\n\
         if any(n.decode() in ''.join(os.environ.values()) for n in needles): found.append('environ')\n\
         def look(path):\n\
         \x20   try:\n\
         \x20       with open(path, 'rb') as f: data = f.read(1 << 20)\n\
         \x20   except Exception: return\n\
         \x20   if any(n in data for n in needles): found.append(path)\n\
         for root in [os.environ['REPLBOX_TOOLS'], os.environ.get('HOME', '/'), os.getcwd(), '/tmp', '/dev/shm', '/run', '/etc']:\n\
         \x20   for dp, dn, fn in os.walk(root):\n\
         \x20       for f in fn: look(os.path.join(dp, f))\n\
         for p in os.listdir('/proc'):\n\
         \x20   if p.isdigit():\n\
         \x20       for f in ('environ', 'cmdline'): look('/proc/%s/%s' % (p, f))\n\
         look({:?})\n\
         print('found:', found)\n",
        setup.env_secret,
        setup.header_secret,
        setup.servers()
    );
    let o = s.eval(&id, &scan).await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    assert!(output(&o).contains("found: []"), "{}", o.text);
    s.stop().await;
}

#[tokio::test]
async fn grants_per_token_over_http_and_the_audit_and_metrics() {
    if !require("python", "python3") {
        return;
    }
    let setup = Setup::new(false).await;
    let dir = setup.dir.path();
    std::fs::write(
        dir.join("tokens"),
        "alice:alice-token-0123456789\nbob:bob-token-0123456789\ncarol:carol-token-0123456789\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("grants.json"),
        r#"{"alice": ["probe"], "carol": {"probe": ["add"]}}"#,
    )
    .unwrap();
    let tokens = dir.join("tokens").display().to_string();
    let grants = dir.join("grants.json").display().to_string();
    let servers = setup.servers();
    let h = HttpChild::try_start(
        &[
            "--tokens-file",
            &tokens,
            "--mcp-servers",
            &servers,
            "--mcp-grants",
            &grants,
        ],
        &[("REPLBOX_LOG", "warn,replbox=info,replbox::audit=info")],
    )
    .await
    .expect("HTTP server");
    let bob = h.connect("bob-token-0123456789").await;
    let r = http_call(
        bob.peer(),
        "session_start",
        json!({"language": "python", "mcp_servers": ["probe"]}),
    )
    .await;
    assert_eq!(r.error_kind(), "invalid_argument", "{}", r.text);
    assert!(
        r.text.contains("not granted to you (principal bob)"),
        "{}",
        r.text
    );
    let r = http_call(
        bob.peer(),
        "run-code",
        json!({"languageId": "python", "code": "print(1)", "mcp_servers": ["probe"]}),
    )
    .await;
    assert_eq!(r.error_kind(), "invalid_argument", "{}", r.text);

    let carol = h.connect("carol-token-0123456789").await;
    let r = http_call(
        carol.peer(),
        "run-code",
        json!({"languageId": "python", "mcp_servers": ["probe"],
               "code": "from replbox import tools, ToolError\nprint(tools.probe.add(a=1, b=2))\ntry:\n    tools.call('probe', 'echo', text='x')\nexcept ToolError as e:\n    print(e.kind, e)"}),
    )
    .await;
    assert!(r.text.contains("{'sum': 3}"), "{}", r.text);
    assert!(
        r.text.contains(
            "refused probe.echo is not among the tools the server's operator lets you call"
        ),
        "{}",
        r.text
    );
    assert_eq!(r.structured["mcp_servers"][0]["tools"], json!(["add"]));

    let alice = h.connect("alice-token-0123456789").await;
    let r = http_call(
        alice.peer(),
        "run-code",
        json!({"languageId": "python", "mcp_servers": ["probe"],
               "code": "from replbox import tools\nprint(tools.probe.echo(text='hello'))"}),
    )
    .await;
    assert_eq!(r.text, "hello\n", "{}", r.text);

    // /metrics counts the calls by server and status.
    let metrics = reqwest::Client::new()
        .get(format!("http://{}/metrics", h.addr))
        .bearer_auth("alice-token-0123456789")
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("replbox_upstream_tool_calls_total{server=\"probe\",status=\"ok\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics
            .contains("replbox_upstream_tool_calls_total{server=\"probe\",status=\"refused\"} 1"),
        "{metrics}"
    );
    h.stop().await;
}

#[tokio::test]
async fn a_restored_session_replays_with_the_recorded_results() {
    if !require("python", "python3") {
        return;
    }
    let setup = Setup::new(false).await;
    let state = tempfile::tempdir().expect("state dir");
    let state_s = state.path().join("state").display().to_string();
    let s = setup.server(&["--state-dir", &state_s]).await;
    let id = session(&start(&s, "python", &["probe"]).await);
    let o = s
        .eval(
            &id,
            "from replbox import tools\nc = tools.probe.count()\nprint(c['calls'])",
        )
        .await;
    assert!(output(&o).contains('1'), "{}", o.text);
    // The server stops (the session is suspended), a new one starts on the same journals.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(s.pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while common::alive(s.pid as i32) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server did not stop"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(s);
    let s = setup.server(&["--state-dir", &state_s]).await;
    let r = s.call("session_restore", json!({"session_id": id})).await;
    assert!(!r.is_error, "{}", r.text);
    assert_eq!(r.structured["replayed"], json!(1));
    // The replay answered the call from the journal: the new upstream served none, and
    // the variable holds the recorded value.
    let o = s
        .eval(&id, "print(c['calls'], tools.probe.count()['calls'])")
        .await;
    assert!(output(&o).contains("1 1"), "{}", o.text);
    // The export documents where the data came from.
    let e = s
        .call(
            "session_export",
            json!({"session_id": id, "format": "ipynb"}),
        )
        .await;
    let uri = e.structured["uri"].as_str().expect("the export's uri");
    let r = s
        .client
        .read_resource(rmcp::model::ReadResourceRequestParams::new(uri))
        .await
        .expect("read the notebook");
    let Some(rmcp::model::ResourceContents::TextResourceContents { text, .. }) =
        r.contents.into_iter().next()
    else {
        panic!("no notebook text")
    };
    let nb: Value = serde_json::from_str(&text).expect("a notebook");
    // The session's first cell (a setup cell may come before it).
    let first = nb["cells"]
        .as_array()
        .and_then(|cells| cells.iter().find(|c| c["id"] == "cell-1"))
        .unwrap_or_else(|| panic!("no cell-1: {nb}"));
    let call = &first["metadata"]["replbox"]["tool_calls"][0];
    assert_eq!(call["server"], "probe", "{nb}");
    assert_eq!(call["tool"], "count", "{nb}");
    assert_eq!(call["status"], "ok", "{nb}");
    s.stop().await;
}
