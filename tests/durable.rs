//! A session's work outlives the session: its history, its export as a notebook or a
//! script, its files after it ended, its journal across restarts of the server (SIGTERM,
//! SIGKILL), and what it defined (`session_vars`). Driven through rmcp's MCP client, over
//! stdio and, for two principals, over HTTP.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use base64::Engine;
use common::*;
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, ReadResourceRequestParams, ResourceContents};
use rmcp::transport::StreamableHttpClientTransport;
use serde_json::{Value, json};

/// python3 with matplotlib, pandas and numpy (the figure, the data frame).
fn python_data() -> bool {
    if !require("python", "python3") {
        return false;
    }
    let ok = std::process::Command::new("python3")
        .args(["-c", "import matplotlib, pandas, numpy"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok || skip("python3 cannot import matplotlib, pandas and numpy")
}

/// python3 with nbformat (its JSON schema validates the notebook).
fn nbformat() -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import nbformat, jsonschema"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok || skip("python3 cannot import nbformat and jsonschema (pip install nbformat)")
}

/// `jupyter nbconvert --execute` with a python3 kernel.
fn nbconvert() -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import nbconvert, nbclient, ipykernel"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok || skip(
        "python3 cannot import nbconvert, nbclient and ipykernel (pip install nbconvert ipykernel)",
    )
}

/// A state directory for journals: a fresh 0700 directory of ours.
fn state_dir() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().expect("tempdir");
    let dir = std::fs::canonicalize(t.path())
        .expect("real path")
        .join("state");
    (t, dir)
}

/// Read a resource; Err is the protocol error's message.
async fn read(s: &TestServer, uri: &str) -> Result<String, String> {
    let r = s
        .client
        .read_resource(ReadResourceRequestParams::new(uri))
        .await
        .map_err(|e| e.to_string())?;
    match r.contents.into_iter().next() {
        Some(ResourceContents::TextResourceContents { text, .. }) => Ok(text),
        Some(ResourceContents::BlobResourceContents { blob, .. }) => Ok(blob),
        _ => Err("no text or blob contents".into()),
    }
}

/// The embedded resource of a tool result: (uri, mime, text).
async fn embedded(s: &TestServer, tool: &str, args: Value) -> (Out, String, String, String) {
    let obj = args.as_object().cloned().expect("object");
    let r = s
        .client
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(obj))
        .await
        .expect("call");
    let text = r
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<String>();
    let out = Out {
        text,
        structured: r.structured_content.clone().unwrap_or(Value::Null),
        is_error: r.is_error.unwrap_or(false),
        images: Vec::new(),
    };
    for c in &r.content {
        if let Some(res) = c.as_resource()
            && let ResourceContents::TextResourceContents {
                uri,
                mime_type,
                text,
                ..
            } = &res.resource
        {
            return (
                out,
                uri.clone(),
                mime_type.clone().unwrap_or_default(),
                text.clone(),
            );
        }
    }
    panic!("{tool}: no embedded resource: {}", out.text);
}

/// Run python3 on a script with arguments; (success, stdout+stderr).
fn python(script: &str, args: &[&str]) -> (bool, String) {
    let o = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("python3");
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

/// Validate a notebook against nbformat's own JSON schema; print its outline.
fn validate(nb: &Path) -> String {
    let (ok, out) = python(
        r#"import sys, nbformat
nb = nbformat.read(sys.argv[1], as_version=nbformat.NO_CONVERT)
nbformat.validate(nb)
for c in nb.cells:
    outs = ", ".join(o.output_type for o in c.get("outputs", []))
    print(c.cell_type, c.get("execution_count"), c.metadata.get("tags", []), outs)
"#,
        &[nb.to_str().expect("UTF-8")],
    );
    assert!(ok, "the notebook is not valid nbformat: {out}");
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn history_and_exports_of_a_python_session() {
    if !python_data() || !nbformat() {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("python").await;
    let cells = [
        "print('hello')\nx = 41",
        "x + 1",
        "print('before')\n1 / 0",
        "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()",
    ];
    for c in cells {
        s.eval(&id, c).await;
    }
    // History: every cell in order, with status, error, duration and start.
    let h = s.call("session_history", json!({"session_id": id})).await;
    assert!(!h.is_error, "{}", h.text);
    let got = h.structured["cells"].as_array().expect("cells").clone();
    assert_eq!(got.len(), 4, "{}", h.text);
    for (i, c) in got.iter().enumerate() {
        assert_eq!(c["eval_id"], i as u64 + 1);
        assert_eq!(c["code"], cells[i]);
        assert!(c["started_at"].as_u64().unwrap() > 1_600_000_000);
        assert!(c["duration_ms"].is_u64());
    }
    let statuses: Vec<&str> = got.iter().map(|c| c["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["ok", "ok", "error", "ok"]);
    assert_eq!(got[2]["error"]["type"], "ZeroDivisionError");
    assert_eq!(h.structured["dropped"], 0);
    assert_eq!(h.structured["state"], "open");

    // The notebook: valid nbformat, a code cell per evaluation with its outputs.
    let (o, uri, mime, text) = embedded(
        &s,
        "session_export",
        json!({"session_id": id, "format": "ipynb"}),
    )
    .await;
    assert!(!o.is_error, "{}", o.text);
    assert_eq!(uri, format!("replbox://sessions/{id}/export.ipynb"));
    assert_eq!(mime, "application/x-ipynb+json");
    assert_eq!(o.structured["cells"], 4);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("session.ipynb");
    std::fs::write(&path, &text).unwrap();
    let outline = validate(&path);
    eprintln!("notebook outline:\n{outline}");
    assert_eq!(
        outline,
        "code None ['replbox-setup'] \n\
code 1 [] stream\n\
code 2 [] execute_result\n\
code 3 ['raises-exception'] stream, error\n\
code 4 [] display_data\n"
    );
    let nb: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(nb["metadata"]["kernelspec"]["name"], "python3");
    assert_eq!(nb["metadata"]["language_info"]["name"], "python");
    // The setup cell first, then the session's cells.
    let c: Vec<&Value> = nb["cells"].as_array().unwrap().iter().skip(1).collect();
    assert_eq!(c[0]["outputs"][0]["text"], json!(["hello\n"]));
    assert_eq!(c[1]["outputs"][0]["data"]["text/plain"], json!(["42"]));
    assert_eq!(c[2]["outputs"][0]["text"], json!(["before\n"]));
    assert_eq!(c[2]["outputs"][1]["ename"], "ZeroDivisionError");
    assert_eq!(c[2]["outputs"][1]["evalue"], "division by zero");
    let tb = c[2]["outputs"][1]["traceback"].as_array().unwrap();
    assert_eq!(tb[0], "Traceback (most recent call last):");
    assert_eq!(tb.last().unwrap(), "ZeroDivisionError: division by zero");
    let png = base64::engine::general_purpose::STANDARD
        .decode(c[3]["outputs"][0]["data"]["image/png"].as_str().unwrap())
        .unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    // The same notebook as a resource.
    assert_eq!(read(&s, &uri).await.unwrap(), text);

    // The script: cells separated by `# %%`, the failed one commented out.
    let (o, uri, _, script) = embedded(
        &s,
        "session_export",
        json!({"session_id": id, "format": "script"}),
    )
    .await;
    assert!(!o.is_error, "{}", o.text);
    assert_eq!(uri, format!("replbox://sessions/{id}/export.py"));
    assert!(
        script.contains("\n# %% [1]\nprint('hello')\nx = 41\n\n# %% [2]\nx + 1\n"),
        "{script}"
    );
    assert!(
        script.contains(
            "\n# %% [3] error: ZeroDivisionError: division by zero\n# print('before')\n# 1 / 0\n"
        ),
        "{script}"
    );
    assert_eq!(read(&s, &uri).await.unwrap(), script);
    let (ok, out) = python(&script, &[]);
    assert!(ok, "the script runs as it is: {out}");
    assert!(out.starts_with("hello\n"), "{out}");
    // Other URIs of the kind are refused; the templates are listed.
    let wrong = read(&s, &format!("replbox://sessions/{id}/export.rb")).await;
    assert!(wrong.is_err(), "{wrong:?}");
    let templates = s
        .client
        .list_all_resource_templates()
        .await
        .expect("templates");
    let names: Vec<&str> = templates.iter().map(|t| t.uri_template.as_str()).collect();
    assert!(
        names.contains(&"replbox://sessions/{session_id}/export.ipynb"),
        "{names:?}"
    );

    // Re-run top to bottom the way a person would in Jupyter (one kernel: the other cells'
    // texts are compared by `exports_run_again_as_the_session_ran`).
    if nbconvert() {
        // Through python3, so that it is the python whose packages were checked.
        let ran = dir.path().join("run.ipynb");
        let o = std::process::Command::new("python3")
            .args([
                "-m",
                "jupyter",
                "nbconvert",
                "--to",
                "notebook",
                "--execute",
                "--output",
            ])
            .arg(&ran)
            .arg(&path)
            .output()
            .expect("python3 -m jupyter");
        assert!(
            o.status.success(),
            "jupyter nbconvert --execute: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let nb: Value = serde_json::from_str(&std::fs::read_to_string(&ran).unwrap()).unwrap();
        let c = nb["cells"].as_array().unwrap();
        let texts: Vec<String> = c[1]["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|o| o["text"].as_array())
            .flatten()
            .filter_map(|t| t.as_str().map(str::to_string))
            .collect();
        assert_eq!(texts.concat(), "hello\n", "{}", c[1]);
        assert_eq!(c[2]["outputs"][0]["data"]["text/plain"], json!(["42"]));
        let outs = c[3]["outputs"].as_array().unwrap();
        assert_eq!(outs.last().unwrap()["ename"], "ZeroDivisionError");
        let kinds: Vec<&str> = c[4]["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|o| o["output_type"].as_str())
            .collect();
        assert_eq!(kinds, ["display_data"], "{}", c[4]);
    }
    s.stop().await;
}

/// Compares the text of every cell of an exported notebook (printed text, the value, the
/// error) with the same notebook run again by nbclient; prints `same` or the differences.
const RERUN_CHECK: &str = r#"import sys, json, copy, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
ran = copy.deepcopy(nb)
NotebookClient(ran, timeout=120, kernel_name='python3').execute()
def text(c):
    out = []
    for o in c.get('outputs', []):
        if o.output_type == 'stream':
            out.append(o.text)
        elif o.output_type == 'execute_result':
            out.append(o.data['text/plain'])
        elif o.output_type == 'error':
            out.append(o.ename + ': ' + o.evalue)
    return ''.join(out)
diffs = []
for a, b in zip(nb.cells, ran.cells):
    if 'skip-execution' in a.metadata.get('tags', []) or 'replbox-setup' in a.metadata.get('tags', []):
        continue
    if text(a) != text(b):
        diffs.append((a.source, text(a), text(b)))
print(json.dumps(diffs) if diffs else 'same')
"#;

#[tokio::test(flavor = "multi_thread")]
async fn exports_run_again_as_the_session_ran() {
    if !python_data() || !nbformat() || !nbconvert() {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("python").await;
    let o = s.eval(&id, "name = input('name? ')").await;
    assert_eq!(status(&o), "awaiting_input", "{}", o.text);
    // An answer that tries to be code stays an answer.
    let answer = "ada\\\"); print('INJECTED'); (\"";
    let o = s
        .call("session_input", json!({"session_id": id, "text": answer}))
        .await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    let cells: &[(&str, &str)] = &[
        ("print('hi', name)", "ok"),
        (
            "import pandas as pd\npd.DataFrame({c * 9: range(3) for c in 'abcdefghijklmnopqrs'})",
            "ok",
        ),
        ("print('before')\n1 / 0", "error"),
        ("import time\ntime.sleep(60)", "timeout"),
        (
            "import numpy as np\nimport matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nprint(np.arange(60))",
            "ok",
        ),
    ];
    for (code, want) in cells {
        let o = s
            .eval_t(&id, code, if *want == "timeout" { 1500 } else { 120_000 })
            .await;
        assert_eq!(status(&o), *want, "{code}: {}", o.text);
    }
    let (o, _, _, text) = embedded(
        &s,
        "session_export",
        json!({"session_id": id, "format": "ipynb"}),
    )
    .await;
    assert!(!o.is_error, "{}", o.text);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("session.ipynb");
    std::fs::write(&path, &text).unwrap();
    let (ok, out) = python(RERUN_CHECK, &[path.to_str().unwrap()]);
    // (python() adds stderr after stdout: the kernel says how it listens.)
    assert!(
        ok && out.starts_with("same\n"),
        "the notebook runs again differently: {out}"
    );
    // The script runs without a terminal: what its cells print is what they printed.
    let (o, _, _, script) = embedded(
        &s,
        "session_export",
        json!({"session_id": id, "format": "script"}),
    )
    .await;
    assert!(!o.is_error, "{}", o.text);
    let (ok, out) = python(&script, &[]);
    assert!(ok, "the script runs: {out}");
    assert!(
        out.starts_with(&format!("name? hi {}\n", answer)) && !out.contains("\nINJECTED"),
        "{out}"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn files_stay_readable_after_the_interpreter_exits() {
    if !require("python", "python3") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("python").await;
    let o = s
        .eval(
            &id,
            "open('result.txt', 'w').write('kept')\nos = __import__('os')",
        )
        .await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    let o = s.eval(&id, "os._exit(0)").await;
    assert_eq!(status(&o), "exited", "{}", o.text);
    let uri = format!("replbox://sessions/{id}/files/result.txt");
    assert_eq!(read(&s, &uri).await.as_deref(), Ok("kept"));
    // Listed as ended, with until when its files are kept.
    let l = s.call("session_list", json!({})).await;
    assert_eq!(l.structured["sessions"], json!([]));
    let row = &l.structured["ended"][0];
    assert_eq!(row["session_id"], id.as_str(), "{}", l.structured);
    assert_eq!(row["state"], "ended");
    assert_eq!(row["reason"], "exited");
    let until = row["files_kept_until"].as_u64().expect("files_kept_until");
    let ended = row["ended_at"].as_u64().expect("ended_at");
    assert!((590..=610).contains(&(until - ended)), "{row}");
    let resources = s.client.list_all_resources().await.expect("resources");
    assert!(resources.iter().any(|r| r.uri == uri), "{resources:?}");
    // Its history too; but code no longer runs.
    let h = s.call("session_history", json!({"session_id": id})).await;
    assert_eq!(h.structured["state"], "ended", "{}", h.text);
    assert_eq!(h.structured["cells"][1]["status"], "exited");
    let o = s.eval(&id, "1").await;
    assert_eq!(o.error_kind(), "ended_session", "{}", o.text);
    // Closed, its files are kept the same way; with --keep-files-s 0 they go at once.
    let id2 = s.start_session("python").await;
    s.eval(&id2, "open('b.txt', 'w').write('b')").await;
    s.call("session_close", json!({"session_id": id2})).await;
    let uri2 = format!("replbox://sessions/{id2}/files/b.txt");
    assert_eq!(read(&s, &uri2).await.as_deref(), Ok("b"));
    s.stop().await;
    let s = TestServer::start_with(&["--keep-files-s", "0"], &[]).await;
    let id = s.start_session("python").await;
    s.eval(&id, "open('c.txt', 'w').write('c')").await;
    s.call("session_close", json!({"session_id": id})).await;
    let gone = read(&s, &format!("replbox://sessions/{id}/files/c.txt")).await;
    assert!(gone.is_err(), "{gone:?}");
    let l = s.call("session_list", json!({})).await;
    assert!(l.structured.get("ended").is_none(), "{}", l.structured);
    s.stop().await;
}

fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).expect("kill");
}

/// Wait (bounded) until the server process is gone.
async fn wait_dead(pid: u32) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while alive(pid as i32) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "server {pid} still alive"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `x = 41`, the server stops with `sig`, a new one on the same state directory lists the
/// session as suspended and `x + 1` gives 42 by replaying it.
async fn restore_after(sig: nix::sys::signal::Signal) {
    let (_t, state) = state_dir();
    let st = state.to_str().unwrap();
    let s = TestServer::start_with(&["--state-dir", st], &[]).await;
    let id = s.start_session("python").await;
    assert_eq!(status(&s.eval(&id, "x = 41").await), "ok");
    assert_eq!(status(&s.eval(&id, "y").await), "error");
    let interp = s.descendants();
    assert!(!interp.is_empty());
    signal(s.pid, sig);
    wait_dead(s.pid).await;
    // The sandboxed interpreter dies with its server.
    assert!(wait_gone(&interp, Duration::from_secs(10)).await.is_empty());
    let mode = std::fs::metadata(&state).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o700
    );
    let journal = state.join(format!("{id}.journal"));
    let jmode = std::fs::metadata(&journal)
        .expect("journal kept")
        .permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&jmode) & 0o777,
        0o600
    );
    drop(s);

    let s = TestServer::start_with(&["--state-dir", st], &[]).await;
    let l = s.call("session_list", json!({})).await;
    assert_eq!(l.structured["sessions"], json!([]));
    let row = &l.structured["ended"][0];
    assert_eq!(row["session_id"], id.as_str(), "{}", l.structured);
    assert_eq!(row["state"], "suspended");
    assert_eq!(row["reason"], "server_stopped");
    assert_eq!(row["restorable"], true);
    let t0 = std::time::Instant::now();
    let o = s.eval(&id, "x + 1").await;
    eprintln!(
        "restore after {sig:?}: first session_eval {} ms (replay included)",
        t0.elapsed().as_millis()
    );
    assert_eq!((status(&o), output(&o)), ("ok", "42\n"), "{}", o.text);
    assert_eq!(o.structured["replayed"], 1, "{}", o.structured);
    assert_eq!(o.structured["eval_id"], 3);
    assert!(o.text.contains("restored"), "{}", o.text);
    // The history has the journal's cells, the failed one included.
    let h = s.call("session_history", json!({"session_id": id})).await;
    let codes: Vec<&str> = h.structured["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["code"].as_str().unwrap())
        .collect();
    assert_eq!(codes, ["x = 41", "y", "x + 1"]);
    // Closed, its journal is deleted: it is no longer restorable.
    s.call("session_close", json!({"session_id": id})).await;
    assert!(!journal.exists());
    let r = s.call("session_restore", json!({"session_id": id})).await;
    assert_eq!(r.error_kind(), "ended_session", "{}", r.text);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_is_restored_after_sigterm() {
    if require("python", "python3") {
        restore_after(nix::sys::signal::Signal::SIGTERM).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_is_restored_after_sigkill() {
    if require("python", "python3") {
        restore_after(nix::sys::signal::Signal::SIGKILL).await;
    }
}

/// Answers are replayed as they were typed: a key sent alone (`enter: false`) gets no Enter
/// (a raw read of up to 8 bytes would see it).
#[tokio::test(flavor = "multi_thread")]
async fn answers_are_replayed_as_typed() {
    if !require("python", "python3") {
        return;
    }
    let (_t, state) = state_dir();
    let st = state.to_str().unwrap();
    let s = TestServer::start_with(&["--state-dir", st], &[]).await;
    let id = s.start_session("python").await;
    let o = s
        .eval(
            &id,
            "import os, termios, tty\nold = termios.tcgetattr(0)\ntty.setraw(0)\ntry:\n    k = os.read(0, 8)\nfinally:\n    termios.tcsetattr(0, termios.TCSADRAIN, old)",
        )
        .await;
    assert_eq!(status(&o), "awaiting_input", "{}", o.text);
    let o = s
        .call(
            "session_input",
            json!({"session_id": id, "text": "q", "enter": false}),
        )
        .await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    let o = s.eval(&id, "name = input()").await;
    assert_eq!(status(&o), "awaiting_input", "{}", o.text);
    let o = s
        .call("session_input", json!({"session_id": id, "text": "Ada"}))
        .await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    signal(s.pid, nix::sys::signal::Signal::SIGKILL);
    wait_dead(s.pid).await;
    drop(s);

    let s = TestServer::start_with(&["--state-dir", st], &[]).await;
    let o = s.eval(&id, "print(repr(k), repr(name))").await;
    assert_eq!(
        (status(&o), output(&o)),
        ("ok", "b'q' 'Ada'\n"),
        "{}",
        o.text
    );
    assert_eq!(o.structured["replayed"], 2, "{}", o.structured);
    s.stop().await;
}

/// A journal line as the server writes it.
fn line(json: &Value) -> String {
    use sha2::Digest;
    let text = json.to_string();
    let d = sha2::Sha256::digest(text.as_bytes());
    let h: String = d.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{h} {text}\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn journals_are_data_corrupt_ones_are_reported_and_skipped() {
    if !require("python", "python3") {
        return;
    }
    let (_t, state) = state_dir();
    let st = state.to_str().unwrap();
    let s = TestServer::start_with(&["--state-dir", st], &[]).await;
    let id = s.start_session("python").await;
    s.eval(&id, "x = 41").await;
    signal(s.pid, nix::sys::signal::Signal::SIGKILL);
    wait_dead(s.pid).await;
    drop(s);
    // A crash in the middle of an append: the last line is cut short.
    let good = state.join(format!("{id}.journal"));
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&good)
        .unwrap();
    std::io::Write::write_all(
        &mut f,
        b"0123456789abcdef {\"type\":\"cell\",\"eval_id\":2,\"co",
    )
    .unwrap();
    drop(f);
    // Garbage, a changed line, and another session's journal under a third one's name.
    let bad = [
        "6c0a4f5e-0000-4000-8000-000000000001",
        "6c0a4f5e-0000-4000-8000-000000000002",
        "6c0a4f5e-0000-4000-8000-000000000003",
    ];
    std::fs::write(
        state.join(format!("{}.journal", bad[0])),
        b"\x00\xff not a journal\n",
    )
    .unwrap();
    let changed = std::fs::read_to_string(&good)
        .unwrap()
        .replace(&id, bad[1])
        .replace("x = 41", "x = 666");
    std::fs::write(state.join(format!("{}.journal", bad[1])), changed).unwrap();
    std::fs::copy(&good, state.join(format!("{}.journal", bad[2]))).unwrap();
    // A journal whose lines read (the checksum is no seal) but ask for what no session may
    // have: restoring it goes through every check of a new session.
    let forged = "6c0a4f5e-0000-4000-8000-000000000004";
    let start = json!({"type": "start", "version": 1, "session_id": forged, "owner": "local",
        "created_at": 1, "request": {"language": "python", "cwd": "/proc/1",
        "env": {"LD_PRELOAD": "/tmp/x.so"}, "idle_timeout_s": null, "files": []}});
    std::fs::write(state.join(format!("{forged}.journal")), line(&start)).unwrap();

    // The server's own log level (REPLBOX_LOG unset), as an operator runs it.
    let s = Server::stdio()
        .args(["--state-dir", st])
        .env_remove("REPLBOX_LOG")
        .start()
        .await;
    let l = s.call("session_list", json!({})).await;
    let mut listed: Vec<&str> = l.structured["ended"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["session_id"].as_str().unwrap())
        .collect();
    listed.sort();
    let mut want = vec![id.as_str(), forged];
    want.sort();
    assert_eq!(listed, want, "{}", l.structured);
    for b in bad {
        assert!(state.join(format!("{b}.journal.corrupt")).exists(), "{b}");
        assert!(!state.join(format!("{b}.journal")).exists(), "{b}");
    }
    let o = s.eval(&id, "x + 1").await;
    assert_eq!((status(&o), output(&o)), ("ok", "42\n"), "{}", o.text);
    let o = s
        .call("session_restore", json!({"session_id": forged}))
        .await;
    assert!(
        matches!(o.error_kind(), "invalid_argument"),
        "{}: {}",
        o.error_kind(),
        o.text
    );
    // Still suspended, not half started.
    let l = s.call("session_list", json!({})).await;
    assert_eq!(l.structured["sessions"].as_array().unwrap().len(), 1);
    // Closing a suspended session deletes its journal.
    let o = s.call("session_close", json!({"session_id": forged})).await;
    assert_eq!(o.structured["closed"], true, "{}", o.text);
    assert!(!state.join(format!("{forged}.journal")).exists());
    let l = s.call("session_list", json!({})).await;
    assert!(l.structured.get("ended").is_none(), "{}", l.structured);
    let log = s.stop_and_log().await;
    for b in bad {
        assert!(
            log.contains("corrupt session journal") && log.contains(b),
            "not reported: {b}\n{log}"
        );
    }
    assert!(log.contains("cut short"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unsafe_state_directory_stops_the_server() {
    let (_t, state) = state_dir();
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let o = std::process::Command::new(BIN)
        .args(["serve", "--state-dir", state.to_str().unwrap()])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("mode 0700"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.stdout.is_empty());
}

/// A `replbox serve --http` (the harness's `Server::http()`) with a tokens file, called
/// through a fresh client per call.
struct Http(HttpServer);

impl Http {
    async fn start(args: &[&str], tokens_file: &Path) -> Self {
        Self(
            Server::http()
                .arg("--tokens-file")
                .arg(tokens_file)
                .args(args)
                .env_remove("REPLBOX_LOG")
                .start()
                .await,
        )
    }

    async fn call(&self, token: &str, tool: &str, args: Value) -> Out {
        let config =
            rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
                self.0.url(),
            )
            .auth_header(token);
        let client =
            ().serve(StreamableHttpClientTransport::from_config(config))
                .await
                .expect("handshake");
        let r = client
            .call_tool(
                CallToolRequestParams::new(tool.to_string())
                    .with_arguments(args.as_object().cloned().unwrap()),
            )
            .await
            .expect("call");
        let _ = client.cancel().await;
        Out {
            text: r
                .content
                .iter()
                .filter_map(|c| c.as_text().map(|t| t.text.clone()))
                .collect(),
            structured: r.structured_content.unwrap_or(Value::Null),
            is_error: r.is_error.unwrap_or(false),
            images: Vec::new(),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn another_principal_cannot_restore() {
    if !require("python", "python3") {
        return;
    }
    const ALICE: &str = "alice-token-0123456789abcdef";
    const BOB: &str = "bob-token-fedcba9876543210";
    let (t, state) = state_dir();
    let tokens = t.path().join("tokens");
    std::fs::write(&tokens, format!("alice:{ALICE}\nbob:{BOB}\n")).unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let args = ["--state-dir", state.to_str().unwrap()];
    let mut h = Http::start(&args, &tokens).await;
    let o = h
        .call(ALICE, "session_start", json!({"language": "python"}))
        .await;
    let id = o.s("session_id").to_string();
    let o = h
        .call(
            ALICE,
            "session_eval",
            json!({"session_id": id, "code": "x = 41"}),
        )
        .await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    signal(h.0.pid, nix::sys::signal::Signal::SIGTERM);
    let _ = tokio::time::timeout(Duration::from_secs(20), h.0.child().wait()).await;

    let h = Http::start(&args, &tokens).await;
    let l = h.call(BOB, "session_list", json!({})).await;
    assert!(l.structured.get("ended").is_none(), "{}", l.structured);
    for tool in ["session_restore", "session_history", "session_vars"] {
        let o = h.call(BOB, tool, json!({"session_id": id})).await;
        assert_eq!(o.error_kind(), "unknown_session", "{tool}: {}", o.text);
    }
    let o = h
        .call(BOB, "session_eval", json!({"session_id": id, "code": "x"}))
        .await;
    assert_eq!(o.error_kind(), "unknown_session", "{}", o.text);
    let o = h
        .call(
            BOB,
            "session_export",
            json!({"session_id": id, "format": "ipynb"}),
        )
        .await;
    assert_eq!(o.error_kind(), "unknown_session", "{}", o.text);
    // Its owner restores it.
    let l = h.call(ALICE, "session_list", json!({})).await;
    assert_eq!(
        l.structured["ended"][0]["state"], "suspended",
        "{}",
        l.structured
    );
    let o = h
        .call(ALICE, "session_restore", json!({"session_id": id}))
        .await;
    assert!(!o.is_error, "{}", o.text);
    assert_eq!(o.structured["replayed"], 1);
    let o = h
        .call(
            ALICE,
            "session_eval",
            json!({"session_id": id, "code": "x + 1"}),
        )
        .await;
    assert_eq!(output(&o), "42\n", "{}", o.text);
    assert!(o.structured.get("replayed").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restore_counts_against_the_session_limits() {
    if !require("python", "python3") {
        return;
    }
    let (_t, state) = state_dir();
    let st = state.to_str().unwrap();
    let s = TestServer::start_with(&["--state-dir", st], &[]).await;
    let id = s.start_session("python").await;
    s.eval(&id, "x = 41").await;
    s.stop().await;
    let s = TestServer::start_with(
        &["--state-dir", st, "--max-sessions-per-principal", "1"],
        &[],
    )
    .await;
    let other = s.start_session("python").await;
    let o = s.eval(&id, "x").await;
    assert_eq!(o.error_kind(), "limit", "{}", o.text);
    s.call("session_close", json!({"session_id": other})).await;
    let o = s.eval(&id, "x").await;
    assert_eq!(output(&o), "41\n", "{}", o.text);
    s.stop().await;
    // With --no-auto-restore, only session_restore does.
    let s = TestServer::start_with(&["--state-dir", st, "--no-auto-restore"], &[]).await;
    let o = s.eval(&id, "x").await;
    assert_eq!(o.error_kind(), "suspended", "{}", o.text);
    assert!(o.text.contains("session_restore"), "{}", o.text);
    let o = s.call("session_restore", json!({"session_id": id})).await;
    // x = 41, and the x that restored it above.
    assert_eq!(o.structured["replayed"], 2, "{}", o.text);
    s.stop().await;
}

/// What `session_vars` lists: (name, type) pairs.
async fn vars(s: &TestServer, id: &str) -> Vec<(String, String, String)> {
    let o = s.call("session_vars", json!({"session_id": id})).await;
    assert!(!o.is_error, "{}", o.text);
    o.structured["vars"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap().to_string(),
                v["type"].as_str().unwrap().to_string(),
                v["summary"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn session_vars_per_language() {
    struct Case {
        lang: &'static str,
        program: &'static str,
        code: &'static str,
        /// (name, type, a piece of the summary)
        want: &'static [(&'static str, &'static str, &'static str)],
        not: &'static [&'static str],
    }
    let cases = [
        Case {
            lang: "python",
            program: "python3",
            code: "import os\nx = 41\nnames = ['a', 'b']\ndef f(a, b=2):\n    return a\nclass K:\n    pass",
            want: &[
                ("x", "int", "41"),
                ("names", "list", "len 2"),
                ("f", "function", "f(a, b=2)"),
                ("K", "type", "K"),
            ],
            not: &["os", "__name__", "__builtins__"],
        },
        Case {
            lang: "javascript",
            program: "node",
            code: "const fs = require('fs'); let a = [1, 2, 3]; var g = 'hi'; function f(x) { return x }; class K {}",
            want: &[
                ("a", "Array", "length 3"),
                ("g", "string", "hi"),
                ("f", "function", ""),
                ("K", "class", ""),
                ("fs", "Object", ""),
            ],
            not: &["process", "console", "__rbx_go", "_"],
        },
        Case {
            lang: "ruby",
            program: "ruby",
            code: "x = 41\n@h = {a: 1}\nlist = [1, 2]",
            want: &[
                ("x", "Integer", "41"),
                ("@h", "Hash", "size 1"),
                ("list", "Array", "size 2"),
            ],
            not: &["_"],
        },
        Case {
            lang: "haskell",
            program: "ghci",
            code: "x = 41 :: Integer\nf y = y + 1",
            // ghci shows a value not evaluated yet as `_`.
            want: &[("x", "Integer", ""), ("f", "Num a => a -> a", "")],
            not: &[],
        },
        Case {
            lang: "shellscript",
            program: "bash",
            code: "X=41\narr=(a b c)\ngreet() { echo hi; }\nexport MINE=1",
            want: &[
                ("X", "string", "41"),
                ("arr", "array", "3 elements"),
                ("greet", "function", ""),
                ("MINE", "string", "1"),
            ],
            not: &["PATH", "HOME", "PS1", "BASH_VERSION", "__rbx_load"],
        },
    ];
    let s = Server::stdio().start().await;
    for c in cases {
        if !require(c.lang, c.program) {
            continue;
        }
        let id = s.start_session(c.lang).await;
        let o = s.eval(&id, c.code).await;
        assert_eq!(status(&o), "ok", "{}: {}", c.lang, o.text);
        let got = vars(&s, &id).await;
        for (name, kind, piece) in c.want {
            let v = got.iter().find(|v| v.0 == *name);
            let Some(v) = v else {
                panic!("{}: {name} not listed: {got:?}", c.lang);
            };
            assert_eq!(v.1, *kind, "{}: {v:?}", c.lang);
            assert!(v.2.contains(piece), "{}: {v:?}", c.lang);
        }
        for name in c.not {
            assert!(
                !got.iter().any(|v| v.0 == *name),
                "{}: {name} listed: {got:?}",
                c.lang
            );
        }
        // Nothing was printed in the session, and it goes on as before.
        let o = s.eval(&id, "").await;
        assert_eq!(output(&o), "", "{}: {}", c.lang, o.text);
        s.call("session_close", json!({"session_id": id})).await;
    }
    s.stop().await;
}

/// A fresh bash session lists exactly what the cell defined: nothing of the bootstrap's
/// (its prompts' PS0 included), also after a second cell and a `cd`.
#[tokio::test(flavor = "multi_thread")]
async fn bash_session_vars_list_only_what_the_user_defined() {
    if !require("shellscript", "bash") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("shellscript").await;
    let o = s.eval(&id, "x=1").await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    let names = |got: Vec<(String, String, String)>| -> Vec<String> {
        got.into_iter().map(|v| v.0).collect()
    };
    assert_eq!(names(vars(&s, &id).await), ["x"]);
    let o = s.eval(&id, "cd /; echo $x").await;
    assert_eq!(output(&o), "1\n", "{}", o.text);
    assert_eq!(names(vars(&s, &id).await), ["x"]);
    s.stop().await;
}

/// Functions and classes imported from elsewhere are not the user's: named in `imported`,
/// not listed among `vars`; each listed name says whether it is data, a function or a class.
#[tokio::test(flavor = "multi_thread")]
async fn session_vars_names_imported_functions_and_classes_apart() {
    if !require("python", "python3") {
        return;
    }
    let s = TestServer::start().await;
    let id = s.start_session("python").await;
    let code = "from math import sqrt\nfrom collections import OrderedDict\nimport json\nrows = [1, 2]\ndef mine(x):\n    return x\nclass Mine:\n    pass";
    let o = s.eval(&id, code).await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    let o = s.call("session_vars", json!({"session_id": id})).await;
    assert!(!o.is_error, "{}", o.text);
    let list = o.structured["vars"].as_array().unwrap();
    let kind = |name: &str| {
        list.iter()
            .find(|v| v["name"] == name)
            .map(|v| v["kind"].as_str().unwrap_or("").to_string())
    };
    assert_eq!(kind("rows").as_deref(), Some("data"), "{}", o.structured);
    assert_eq!(
        kind("mine").as_deref(),
        Some("function"),
        "{}",
        o.structured
    );
    assert_eq!(kind("Mine").as_deref(), Some("class"), "{}", o.structured);
    for gone in ["sqrt", "OrderedDict", "json"] {
        assert_eq!(kind(gone), None, "{gone} listed: {}", o.structured);
    }
    assert_eq!(o.structured["imported"], json!(["sqrt", "OrderedDict"]));
    // The text puts the user's data first and names the imports on one line.
    let rows = o.text.find("rows:").expect("rows");
    let mine = o.text.find("mine:").expect("mine");
    assert!(rows < mine, "{}", o.text);
    assert!(o.text.contains("imported: sqrt, OrderedDict"), "{}", o.text);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_data_frame_is_summarised_with_shape_dtypes_and_size() {
    if !python_data() {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("python").await;
    let o = s
        .eval(
            &id,
            "import pandas as pd, numpy as np\ndf = pd.DataFrame({'a': [1, 2, 3], 'b': [0.5, 1.5, 2.5]})\narr = np.zeros((3, 4))",
        )
        .await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    let o = s.call("session_vars", json!({"session_id": id})).await;
    let list = o.structured["vars"].as_array().unwrap();
    let df = list.iter().find(|v| v["name"] == "df").expect("df");
    assert_eq!(df["type"], "pandas.DataFrame");
    let summary = df["summary"].as_str().unwrap();
    assert!(
        summary.starts_with("shape (3, 2); a: int64, b: float64"),
        "{summary}"
    );
    assert!(df["size"].as_u64().unwrap() >= 48, "{df}");
    let arr = list.iter().find(|v| v["name"] == "arr").expect("arr");
    assert_eq!(arr["summary"], "shape (3, 4); dtype float64");
    assert_eq!(arr["size"], 96);
    assert!(!list.iter().any(|v| v["name"] == "pd" || v["name"] == "np"));
    s.stop().await;
}

/// An answer that tries, in every language's way, to become code of the exported script:
/// quotes of each kind, a triple quote, a backslash-n, `$(…)`, backquotes, `#{…}`, R's and
/// Python's closing of a call, a `%` format, R's `\U{…}`; none of it may run (each would
/// create a file). NULs, which a terminal does not pass as typed, are the unit tests'.
const HOSTILE: &str = "a\"b'c\"\"\"d\\ne$(touch pwned1)`touch pwned2`#{`touch pwned3`}\
\\\"); system('touch pwned4'); (\"%s'); require('fs').writeFileSync('pwned5', ''); ('\\U{0}";

/// (language, the program that runs its exported script, cells each with the answers typed
/// into it and its status, what the script prints, stdout and stderr together, with `{A}`
/// for [`HOSTILE`])
type Rerun = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static [&'static str], &'static str)],
    &'static str,
);

const RERUN: &[Rerun] = &[
    (
        "ruby",
        "ruby",
        &[
            (
                "print 'Name? '\nname = gets.chomp\nputs \"hello #{name}\"",
                &[HOSTILE],
                "ok",
            ),
            (
                "2.times { print '> '; p STDIN.gets }",
                &["x  y", "two"],
                "ok",
            ),
            ("raise 'boom'", &[], "error"),
            ("puts $stdin.gets.inspect", &[""], "ok"),
        ],
        "Name? hello {A}\n> \"x  y\\n\"\n> \"two\\n\"\n\"\\n\"\n",
    ),
    (
        "shellscript",
        "bash",
        &[
            (
                "read -r -p 'Name? ' name\necho \"hello $name\"",
                &[HOSTILE],
                "ok",
            ),
            (
                "for i in 1 2; do read -r -p '> ' l; printf '%q\\n' \"$l\"; done",
                &["x  y", "two"],
                "ok",
            ),
            ("false", &[], "error"),
            ("mapfile -t -n 2 rest; declare -p rest", &["", "last"], "ok"),
        ],
        "Name? hello {A}\n> x\\ \\ y\n> two\ndeclare -a rest=([0]=\"\" [1]=\"last\")\n",
    ),
    (
        "r",
        "Rscript",
        &[
            (
                "name <- readline('Name? ')\ncat('hello ', name, '\\n', sep = '')",
                &[HOSTILE],
                "ok",
            ),
            (
                "x <- scan(n = 3, quiet = TRUE)\nprint(sum(x))",
                &["1 2", "3"],
                "ok",
            ),
            ("m <- menu(c('tea', 'coffee'))\nprint(m)", &["coffee"], "ok"),
            ("stop('boom')", &[], "error"),
            ("print(readLines('stdin', n = 1))", &["two"], "ok"),
        ],
        "Name? hello {A}\n[1] 6\n\n1: tea\n2: coffee\n\nSelection: [1] 2\n[1] \"two\"\n",
    ),
    (
        "javascript",
        "node",
        &[
            (
                "const rl = require('readline').createInterface({input: process.stdin, output: process.stdout})\n\
                 const name = await new Promise(r => rl.question('Name? ', r))\nrl.close()\n\
                 console.log('hello ' + name)",
                &[HOSTILE],
                "ok",
            ),
            (
                "const rl2 = require('readline').createInterface({input: process.stdin, output: process.stdout})\n\
                 for (const q of ['> ', '> ']) console.log(JSON.stringify(await new Promise(r => rl2.question(q, r))))\n\
                 rl2.close()",
                &["x  y", "two"],
                "ok",
            ),
            ("null.x", &[], "error"),
        ],
        "Name? hello {A}\n> \"x  y\"\n> \"two\"\n",
    ),
];

per_row!(
    /// A session whose cells read answers (`session_input`) exports a script that runs
    /// again without a terminal and prints what the cells printed: the answers are carried
    /// into the script's setup as data (an answer written to break out of its literal stays
    /// text: no file appears), one after another in the order they were typed, a failed
    /// cell's answers not among them.
    exports_run_again_with_their_answers,
    RERUN,
    [ruby, shellscript, r, javascript],
    |&(lang, program, cells, printed)| {
        let s = Server::stdio().start().await;
        let id = s.start_session(lang).await;
        for (code, answers, want) in cells {
            let mut o = s.eval(&id, code).await;
            for a in *answers {
                assert_eq!(status(&o), "awaiting_input", "{lang}: {code}: {}", o.text);
                o = s
                    .call("session_input", json!({"session_id": id, "text": a}))
                    .await;
            }
            assert_eq!(status(&o), *want, "{lang}: {code}: {}", o.text);
        }
        let (o, _, _, script) = embedded(
            &s,
            "session_export",
            json!({"session_id": id, "format": "script"}),
        )
        .await;
        assert!(!o.is_error, "{lang}: {}", o.text);
        s.stop().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("export");
        std::fs::write(&file, &script).expect("write the script");
        let out = std::fs::File::create(dir.path().join("out")).expect("out");
        let status = std::process::Command::new(program)
            .arg(&file)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup"))
            .stderr(out)
            .status()
            .expect("run the script");
        let out = std::fs::read_to_string(dir.path().join("out")).expect("its output");
        let pwned: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("pwned"))
            .collect();
        assert!(pwned.is_empty(), "{lang}: an answer ran as code: {pwned:?}\n{script}");
        let want = printed.replace("{A}", HOSTILE);
        assert!(
            status.success() && out == want,
            "{lang}: the script runs again differently ({status}):\n{out:?}\nwanted\n{want:?}\n\
             script:\n{script}"
        );
    }
);
