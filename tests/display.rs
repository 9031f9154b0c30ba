//! Rich display in Python sessions, as Jupyter defines it but without IPython: `display()`
//! and a cell's value with `_repr_*_` methods come back as MCP content (images as image
//! blocks, HTML/Markdown/LaTeX/JSON/Vega/Plotly as embedded resources with their MIME type)
//! beside their text, a pandas table also as records; and what user code can forge (names,
//! links, sizes, types) is refused.

use crate::common;

use common::*;
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

/// An evaluation's result: its text, its content blocks as JSON, its structured content.
struct Shown {
    text: String,
    blocks: Vec<Value>,
    structured: Value,
}

impl Shown {
    /// The blocks other than text and links: (type, MIME type).
    fn kinds(&self) -> Vec<(String, String)> {
        self.blocks
            .iter()
            .filter(|b| b["type"] != "text" && b["type"] != "resource_link")
            .map(|b| {
                let mime = match b["type"].as_str() {
                    Some("resource") => &b["resource"]["mimeType"],
                    _ => &b["mimeType"],
                };
                (
                    b["type"].as_str().unwrap_or("").to_string(),
                    mime.as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    /// The `resource_link` blocks: (uri, name, MIME type).
    fn links(&self) -> Vec<(String, String, String)> {
        self.blocks
            .iter()
            .filter(|b| b["type"] == "resource_link")
            .map(|b| {
                let s = |k: &str| b[k].as_str().unwrap_or("").to_string();
                (s("uri"), s("name"), s("mimeType"))
            })
            .collect()
    }

    /// The base64 data of the image block of a MIME type.
    fn image(&self, mime: &str) -> String {
        self.blocks
            .iter()
            .find(|b| b["type"] == "image" && b["mimeType"] == mime)
            .and_then(|b| b["data"].as_str())
            .unwrap_or_else(|| panic!("no {mime} image in {:?}", self.kinds()))
            .to_string()
    }

    /// The embedded resource of a MIME type: (uri, text).
    fn resource(&self, mime: &str) -> (String, String) {
        let b = self
            .blocks
            .iter()
            .find(|b| b["type"] == "resource" && b["resource"]["mimeType"] == mime)
            .unwrap_or_else(|| panic!("no {mime} resource in {:?}", self.kinds()));
        (
            b["resource"]["uri"].as_str().unwrap_or("").to_string(),
            b["resource"]["text"].as_str().unwrap_or("").to_string(),
        )
    }
}

async fn eval(s: &TestServer, id: &str, code: &str) -> Shown {
    eval_on(s.client.peer(), id, code).await
}

/// [`eval`] through any client (stdio or HTTP).
async fn eval_on(peer: &rmcp::Peer<rmcp::RoleClient>, id: &str, code: &str) -> Shown {
    let args = json!({"session_id": id, "code": code});
    let r = peer
        .call_tool(
            CallToolRequestParams::new("session_eval")
                .with_arguments(args.as_object().cloned().expect("object")),
        )
        .await
        .expect("session_eval");
    let blocks: Vec<Value> = r
        .content
        .iter()
        .map(|c| serde_json::to_value(c).expect("a content block"))
        .collect();
    let text = blocks
        .iter()
        .filter(|b| b["type"] == "text")
        .filter_map(|b| b["text"].as_str())
        .collect();
    let structured = r.structured_content.clone().unwrap_or(Value::Null);
    assert_eq!(structured["status"], "ok", "{code}\n{text}\n{structured}");
    Shown {
        text,
        blocks,
        structured,
    }
}

/// A class with every `_repr_*_` method, a real 1x1 PNG among them.
const EVERY_REPR: &str = r##"
import base64, struct, zlib
def _chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
PNG = (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
       + _chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + _chunk(b"IEND", b""))
class Every:
    def __repr__(self): return "Every(text form)"
    def _repr_html_(self): return "<b>bold</b>"
    def _repr_markdown_(self): return "# Title"
    def _repr_latex_(self): return r"$x^2$"
    def _repr_json_(self): return {"k": [1, 2]}
    def _repr_svg_(self): return '<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"/>'
    def _repr_png_(self): return PNG
"##;

#[tokio::test(flavor = "multi_thread")]
async fn display_and_a_value_return_each_mime_type_as_its_content_block() {
    if !require("python", "python3") {
        return;
    }
    let s = TestServer::start().await;
    let id = s.start_session("python").await;
    eval(&s, &id, EVERY_REPR).await;

    // display() with no import, as in a notebook: the text form printed, each rich form a
    // block of its kind, images first.
    let shown = eval(&s, &id, "display(Every())\nprint('after')").await;
    assert!(
        shown.text.starts_with("Every(text form)\nafter\n"),
        "{}",
        shown.text
    );
    assert_eq!(
        shown.kinds(),
        [
            ("image", "image/png"),
            ("image", "image/svg+xml"),
            ("resource", "application/json"),
            ("resource", "text/html"),
            ("resource", "text/latex"),
            ("resource", "text/markdown"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    assert_eq!(shown.resource("text/html").1, "<b>bold</b>");
    assert_eq!(shown.resource("text/markdown").1, "# Title");
    assert_eq!(shown.resource("text/latex").1, "$x^2$");
    assert_eq!(
        serde_json::from_str::<Value>(&shown.resource("application/json").1).expect("json"),
        json!({"k": [1, 2]})
    );
    let (uri, _) = shown.resource("text/html");
    assert!(
        uri.starts_with(&format!("replbox://sessions/{id}/displays/")),
        "{uri}"
    );
    let png = shown
        .blocks
        .iter()
        .find(|b| b["mimeType"] == "image/png")
        .expect("png");
    assert!(
        png["data"]
            .as_str()
            .expect("data")
            .starts_with("iVBORw0KGgo")
    );
    assert_eq!(
        shown.structured["displays"][0]["mime_types"],
        json!([
            "image/png",
            "image/svg+xml",
            "application/json",
            "text/html",
            "text/latex",
            "text/markdown"
        ])
    );
    assert!(
        shown.text.contains("[display: image/png, image/svg+xml"),
        "{}",
        shown.text
    );

    // The cell's value: the same, after the REPL's own text of it.
    let shown = eval(&s, &id, "Every()").await;
    assert!(
        shown.text.starts_with("Every(text form)\n"),
        "{}",
        shown.text
    );
    assert_eq!(shown.kinds().len(), 6, "{:?}", shown.kinds());

    // A value with nothing but text adds nothing; nor does a class (its methods are
    // unbound), nor an object that answers every attribute.
    let shown = eval(
        &s,
        &id,
        "class Any:\n    def __getattr__(self, n): return lambda *a, **k: '<i>x</i>'\n\
         display(Every, Any(), 42)",
    )
    .await;
    assert!(shown.kinds().is_empty(), "{:?}", shown.kinds());
    assert!(
        shown.structured.get("displays").is_none(),
        "{}",
        shown.structured
    );

    // The exported notebook holds each part as display_data and is valid nbformat.
    let nbformat = std::process::Command::new("python3")
        .args(["-c", "import nbformat, jsonschema"])
        .status()
        .is_ok_and(|s| s.success());
    if nbformat || skip("python3 cannot import nbformat and jsonschema (pip install nbformat)") {
        let uri = format!("replbox://sessions/{id}/export.ipynb");
        let nb = read_on(s.client.peer(), &uri).await.expect("the notebook");
        let text = nb[0]["text"].as_str().expect("text").to_string();
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("n.ipynb");
        std::fs::write(&path, &text).expect("write");
        let o = std::process::Command::new("python3")
            .args([
                "-c",
                "import sys, nbformat\n\
nb = nbformat.read(sys.argv[1], as_version=nbformat.NO_CONVERT)\n\
nbformat.validate(nb)\n\
print([list(o.get('data', {})) for o in nb.cells[2].outputs])",
            ])
            .arg(&path)
            .output()
            .expect("python3");
        let out =
            String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.success(),
            "the notebook is not valid nbformat: {out}"
        );
        assert_eq!(
            out.trim(),
            "[[], ['image/png'], ['image/svg+xml'], ['application/json'], ['text/html'], \
['text/latex'], ['text/markdown']]",
            "{text}"
        );
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pandas_frame_comes_back_as_html_and_as_records() {
    if !require_data_stack() {
        return;
    }
    let s = TestServer::start().await;
    let id = s.start_session("python").await;
    let shown = eval(
        &s,
        &id,
        "import pandas as pd\n\
         df = pd.DataFrame({'n': range(20), 'x': [i / 2 for i in range(20)], \
         'name': [chr(97 + i) for i in range(20)]})\n\
         df",
    )
    .await;
    // The text form as the REPL prints it, the HTML as a resource, the records structured.
    assert!(shown.text.contains("19  19  9.5    t"), "{}", shown.text);
    assert_eq!(
        shown.kinds(),
        [("resource".to_string(), "text/html".to_string())]
    );
    assert!(shown.resource("text/html").1.contains("<table"));
    let frame = &shown.structured["displays"][0]["frame"];
    assert_eq!(frame["type"], "pandas.DataFrame");
    assert_eq!(frame["shape"], json!([20, 3]));
    assert_eq!(frame["columns"][0], json!({"name": "n", "dtype": "int64"}));
    assert_eq!(
        frame["columns"][1],
        json!({"name": "x", "dtype": "float64"})
    );
    // Strings are `object` before pandas 3, `str` from it.
    assert!(
        ["object", "str"].contains(&frame["columns"][2]["dtype"].as_str().unwrap_or("")),
        "{frame}"
    );
    assert_eq!(frame["head"][0], json!({"n": 0, "x": 0.0, "name": "a"}));
    assert_eq!(frame["head"].as_array().map(Vec::len), Some(5));
    assert_eq!(frame["tail"][4], json!({"n": 19, "x": 9.5, "name": "t"}));
    assert!(
        shown
            .text
            .contains("[display: text/html; a table of shape [20,3] in structuredContent]"),
        "{}",
        shown.text
    );
    // A grouped frame keeps its index in the records; a series is a table of one column.
    let shown = eval(&s, &id, "df.groupby(df.n % 2).x.sum()").await;
    let frame = &shown.structured["displays"][0]["frame"];
    assert_eq!(frame["type"], "pandas.Series");
    assert_eq!(
        frame["head"],
        json!([{"n": 0, "x": 45.0}, {"n": 1, "x": 50.0}])
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn libraries_rich_forms_ipython_sympy_plotly_altair() {
    if !require("python", "python3") {
        return;
    }
    let importable = |m: &str| {
        std::process::Command::new("python3")
            .args(["-c", &format!("import {m}")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let s = TestServer::start().await;
    let id = s.start_session("python").await;
    if importable("IPython") || skip("IPython display objects: python3 cannot import IPython") {
        // IPython's display(), imported, returns the rich forms too (outside its own shell
        // it would print only a repr).
        let shown = eval(
            &s,
            &id,
            "from IPython.display import display, HTML, Markdown\n\
             display(HTML('<p>hi</p>'), Markdown('*md*'))",
        )
        .await;
        assert_eq!(shown.resource("text/html").1, "<p>hi</p>");
        assert_eq!(shown.resource("text/markdown").1, "*md*");
        assert!(shown.text.contains("<IPython.core.display.HTML object>"));
    }
    if importable("sympy") || skip("sympy's LaTeX: python3 cannot import sympy") {
        let shown = eval(
            &s,
            &id,
            "import sympy\nx = sympy.Symbol('x')\nsympy.sqrt(x) / 2",
        )
        .await;
        assert!(shown.text.starts_with("sqrt(x)/2"), "{}", shown.text);
        assert_eq!(
            shown.resource("text/latex").1,
            "$\\displaystyle \\frac{\\sqrt{x}}{2}$"
        );
    }
    if importable("plotly") || skip("Plotly's JSON: python3 cannot import plotly") {
        let shown = eval(
            &s,
            &id,
            "import plotly.graph_objects as go\ngo.Figure(go.Bar(x=[1, 2], y=[3, 4]))",
        )
        .await;
        let (_, text) = shown.resource("application/vnd.plotly.v1+json");
        let v: Value = serde_json::from_str(&text).expect("plotly json");
        assert_eq!(v["data"][0]["y"], json!([3, 4]), "{v}");
    }
    if importable("altair") || skip("Altair's Vega-Lite: python3 cannot import altair") {
        let shown = eval(
            &s,
            &id,
            "import altair as alt, pandas as pd\n\
             alt.Chart(pd.DataFrame({'a': [1, 2]})).mark_bar().encode(x='a')",
        )
        .await;
        let (mime, _) = shown
            .kinds()
            .into_iter()
            .find(|(_, m)| m.contains("vegalite"))
            .map(|(t, m)| (m, t))
            .expect("a Vega-Lite resource");
        let (_, text) = shown.resource(&mime);
        let v: Value = serde_json::from_str(&text).expect("vega-lite json");
        assert_eq!(v["mark"]["type"], "bar", "{v}");
    }
    s.stop().await;
}

/// The bundles are user code's: code that reaches the bootstrap's own lists can name any
/// file, link one, write a huge one or label anything with any type. None of it leaves
/// `out/`, follows a link or passes the caps; the session goes on.
#[tokio::test(flavor = "multi_thread")]
async fn forged_display_names_links_sizes_and_types_are_refused() {
    if !require("python", "python3") {
        return;
    }
    let s = TestServer::start().await;
    let id = s.start_session("python").await;
    let canary = token();
    let shown = eval(
        &s,
        &id,
        &format!(
            r#"
import builtins, json, os
def free(f, name):
    return dict(zip(f.__code__.co_freevars, (c.cell_contents for c in f.__closure__)))[name]
publish = free(builtins.display, "publish")
out, cell = free(publish, "out"), free(publish, "cell")
bundle = json.dumps({{"data": {{"text/html": "{canary}"}}}})
open("outside.json", "w").write(bundle)
os.symlink(os.path.abspath("outside.json"), os.path.join(out, "link.json"))
open(os.path.join(out, "big.json"), "w").write(" " * (7 << 20))
open(os.path.join(out, "typed.json"), "w").write(json.dumps({{"data": {{
    "image/png": "bm90IGEgcG5n", "application/x-sh": "rm -rf /",
    "text/html/../../x": "{canary}", "text/markdown": "m" * (100 << 10)}}}}))
cell["displays"] += [{{"file": "../outside.json"}}, {{"file": "link.json"}}, {{"file": "big.json"}},
                     {{"file": "/etc/passwd"}}, {{"file": "typed.json"}}]
"#
        ),
    )
    .await;
    let all = serde_json::to_string(&shown.blocks).expect("json");
    assert!(!all.contains(&canary), "{all}");
    assert!(shown.kinds().is_empty(), "{:?}", shown.kinds());
    assert!(
        shown.text.contains("over the 6.0 MiB read per display"),
        "{}",
        shown.text
    );
    assert!(
        shown
            .text
            .contains("text/markdown (100.0 KiB) was not returned"),
        "{}",
        shown.text
    );
    // Read, then removed: the next evaluation finds none of them.
    let shown = eval(&s, &id, "sorted(os.listdir(out))").await;
    assert!(shown.text.starts_with("[]"), "{}", shown.text);
    s.stop().await;
}

/// Files an evaluation writes come back as `resource_link` blocks (links, not copies) that
/// `resources/read` resolves and `resources/list` lists, and the client is told its list
/// changed; a file merely modified changes no list.
#[tokio::test(flavor = "multi_thread")]
async fn written_files_are_resource_links_and_the_list_changes() {
    use rmcp::model::ReadResourceRequestParams;
    use std::sync::atomic::Ordering;
    if !require("python", "python3") {
        return;
    }
    let s = TestServer::start().await;
    let id = s.start_session("python").await;
    let shown = eval(
        &s,
        &id,
        "open('out.csv', 'w').write('a,b\\n1,2\\n')\nopen('note.txt', 'w').write('hi')",
    )
    .await;
    let links: Vec<&Value> = shown
        .blocks
        .iter()
        .filter(|b| b["type"] == "resource_link")
        .collect();
    assert_eq!(links.len(), 2, "{:?}", shown.blocks);
    let csv = format!("replbox://sessions/{id}/files/out.csv");
    assert_eq!(links[1]["uri"], csv.as_str(), "{links:?}");
    assert_eq!(links[1]["name"], "out.csv");
    assert_eq!(links[1]["mimeType"], "text/csv");
    assert_eq!(links[1]["size"], 8);
    assert_eq!(links[0]["name"], "note.txt");
    let read = s
        .client
        .read_resource(ReadResourceRequestParams::new(csv.clone()))
        .await
        .expect("resources/read");
    let body = serde_json::to_value(&read.contents[0]).expect("json");
    assert_eq!(body["text"], "a,b\n1,2\n");
    let listed = s.client.list_all_resources().await.expect("resources/list");
    assert!(listed.iter().any(|r| r.uri == csv), "{listed:?}");
    // The notification comes before the result; the client hands it over on its own task.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while s.recorder.resources_changed.load(Ordering::SeqCst) == 0
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(s.recorder.resources_changed.load(Ordering::SeqCst), 1);
    // Modified, not created: a link, and no notification.
    let shown = eval(&s, &id, "open('note.txt', 'a').write('!')").await;
    assert_eq!(
        shown
            .blocks
            .iter()
            .filter(|b| b["type"] == "resource_link")
            .count(),
        1
    );
    let again = eval(&s, &id, "1").await;
    assert!(again.kinds().is_empty());
    assert_eq!(s.recorder.resources_changed.load(Ordering::SeqCst), 1);
    s.stop().await;
}

/// `resources/read` of a URI: each content as JSON, or the error's text.
async fn read_on(peer: &rmcp::Peer<rmcp::RoleClient>, uri: &str) -> Result<Vec<Value>, String> {
    let r = peer
        .read_resource(rmcp::model::ReadResourceRequestParams::new(uri))
        .await
        .map_err(|e| e.to_string())?;
    Ok(r.contents
        .iter()
        .map(|c| serde_json::to_value(c).expect("json"))
        .collect())
}

/// Every figure and display a cell returned has a URI its owner can read again later
/// (`resources/read` gives back the same bytes, `resources/list` lists it); another token's
/// principal cannot read or list it, and no URI made up from one reaches anything else: no
/// other session, no file, no path out of the server's own store.
#[tokio::test(flavor = "multi_thread")]
async fn shown_outputs_are_resources_only_their_owner_reads() {
    if !require("python", "python3") {
        return;
    }
    let (ta, tb) = (token(), token());
    let s = Server::http().token(&ta).token(&tb).start().await;
    let (a, b) = (s.connect(&ta).await, s.connect(&tb).await);
    let id = http_call(a.peer(), "session_start", json!({"language": "python"}))
        .await
        .s("session_id")
        .to_string();
    let other = http_call(b.peer(), "session_start", json!({"language": "python"}))
        .await
        .s("session_id")
        .to_string();
    eval_on(a.peer(), &id, EVERY_REPR).await;
    eval_on(b.peer(), &other, EVERY_REPR).await;
    // A file of the same name as a stored output, in the session's own directory.
    let shown = eval_on(
        a.peer(),
        &id,
        "import os; os.makedirs('displays', exist_ok=True); open('secret.txt','w').write('S3')\n\
         display(Every())",
    )
    .await;

    // Images come with a link to read them again; text resources carry their URI.
    let links: Vec<_> = shown
        .links()
        .into_iter()
        .filter(|l| l.0.contains("/displays/"))
        .collect();
    assert_eq!(
        links.iter().map(|l| l.2.as_str()).collect::<Vec<_>>(),
        ["image/png", "image/svg+xml"],
        "{:?}",
        shown.blocks
    );
    let png = &links[0].0;
    let read = read_on(a.peer(), png).await.expect("read the png");
    assert_eq!(read[0]["mimeType"], "image/png");
    assert_eq!(read[0]["blob"], shown.image("image/png").as_str());
    let svg = read_on(a.peer(), &links[1].0).await.expect("read the svg");
    assert!(svg[0]["text"].as_str().unwrap_or("").starts_with("<svg"));
    let (html, text) = shown.resource("text/html");
    let read = read_on(a.peer(), &html).await.expect("read the html");
    assert_eq!(read[0]["text"], text.as_str());
    assert_eq!(read[0]["mimeType"], "text/html");
    assert_eq!(
        shown.structured["displays"][0]["uris"][0].as_str(),
        Some(png.as_str())
    );
    let listed: Vec<String> = a
        .list_all_resources()
        .await
        .expect("list")
        .into_iter()
        .map(|r| r.uri)
        .collect();
    assert!(listed.contains(png) && listed.contains(&html), "{listed:?}");

    // Another principal: not readable, not listed, the same error as for no such session.
    for uri in [png, &html] {
        let e = read_on(b.peer(), uri)
            .await
            .expect_err("another token read it");
        assert!(e.contains("no session"), "{e}");
    }
    let theirs: Vec<String> = b
        .list_all_resources()
        .await
        .expect("list")
        .into_iter()
        .map(|r| r.uri)
        .collect();
    assert!(
        theirs.iter().all(|u| !u.contains(&id)),
        "{theirs:?} lists {id}"
    );

    // Made-up URIs: other names, traversal, encodings, another session's numbering.
    let name = png.rsplit('/').next().expect("name");
    let base = format!("replbox://sessions/{id}");
    for uri in [
        format!("{base}/displays/../files/secret.txt"),
        format!("{base}/displays/..%2Ffiles%2Fsecret.txt"),
        format!("{base}/displays/%2e%2e/files/secret.txt"),
        format!("{base}/displays/{name}/../../files/secret.txt"),
        format!("{base}/figures/{name}"),
        format!("{base}/displays/{name}?x=1"),
        format!("{base}/displays/0-0.png"),
        format!("{base}/displays/99999999999999999999999-1.png"),
        format!("{base}/displays/"),
        format!("{base}/displays/{}", "1".repeat(5000)),
        format!("replbox://sessions/{id}%2F..%2F{other}/displays/{name}"),
        format!("replbox://sessions/../sessions/{other}/displays/{name}"),
        format!("replbox://sessions/{other}/displays/{name}"),
        format!("replbox://sessions/{other}/displays/../../{id}/displays/{name}"),
        format!("replbox://sessions/{id}/DISPLAYS/{name}"),
    ] {
        match read_on(a.peer(), &uri).await {
            Err(_) => {}
            Ok(c) => panic!("{uri} read as {c:?}"),
        }
    }
    // The session's own file of the same shape is a file, under files/.
    let own = read_on(a.peer(), &format!("{base}/files/secret.txt"))
        .await
        .expect("its own file");
    assert_eq!(own[0]["text"], "S3");
    // Still served after its session ends, while what it leaves is kept (--keep-files-s).
    let closed = http_call(a.peer(), "session_close", json!({"session_id": id})).await;
    assert!(!closed.is_error, "{}", closed.text);
    let again = read_on(a.peer(), &html)
        .await
        .expect("kept after the close");
    assert_eq!(again[0]["text"], text.as_str());
    assert!(read_on(b.peer(), &html).await.is_err());
    drop((a, b));
    s.stop().await;
}

/// A matplotlib figure comes back as an image and a link that reads it again as the same PNG.
#[tokio::test(flavor = "multi_thread")]
async fn a_figure_is_a_resource_read_again_later() {
    if !require_data_stack() {
        return;
    }
    let s = TestServer::start().await;
    let id = s.start_session("python").await;
    let shown = eval(
        &s,
        &id,
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()",
    )
    .await;
    let links = shown.links();
    assert_eq!(links.len(), 1, "{:?}", shown.blocks);
    let (uri, name, mime) = &links[0];
    assert!(
        uri.starts_with(&format!("replbox://sessions/{id}/figures/")) && uri.ends_with(".png"),
        "{uri}"
    );
    assert_eq!(
        (name.as_str(), mime.as_str()),
        ("figure-1.png", "image/png")
    );
    assert_eq!(shown.structured["images"][0]["uri"], uri.as_str());
    eval(&s, &id, "x = 1").await;
    let read = read_on(s.client.peer(), uri).await.expect("read");
    assert_eq!(read[0]["blob"], shown.image("image/png").as_str());
    let listed = s.client.list_all_resources().await.expect("list");
    let r = listed.iter().find(|r| &r.uri == uri).expect("listed");
    assert_eq!(r.mime_type.as_deref(), Some("image/png"));
    s.stop().await;
}

/// `session_inspect` on one name: its result, or the refused call's error kind and text.
async fn inspect(s: &TestServer, id: &str, name: &str, budget: Option<u64>) -> Out {
    let mut args = json!({"session_id": id, "name": name});
    if let Some(b) = budget {
        args["budget_bytes"] = json!(b);
    }
    s.call("session_inspect", args).await
}

/// A name is caller input that reaches the session's code: anything but a variable or a
/// dotted path of attributes is refused before any code runs, and what the session answers
/// (its bootstrap can be replaced by user code) is cut to the budget by the server.
#[tokio::test(flavor = "multi_thread")]
async fn inspect_names_cannot_become_code_and_answers_keep_the_budget() {
    if !require("python", "python3") {
        return;
    }
    let s = TestServer::start().await;
    let id = s.start_session("python").await;
    eval(&s, &id, "x = 1").await;
    for name in [
        "x); open('pwned', 'w').write('1'); (x",
        "x\nopen('pwned','w')",
        "x[0]",
        "x.__class__.__init__.__globals__['os'].system('touch pwned')",
        "",
        &"a".repeat(300),
    ] {
        let r = inspect(&s, &id, name, None).await;
        assert_eq!(r.error_kind(), "invalid_argument", "{name}: {}", r.text);
    }
    let r = inspect(&s, &id, "x", Some(10)).await;
    assert_eq!(r.error_kind(), "invalid_argument", "{}", r.text);
    assert!(r.text.contains("200 to 8000"), "{}", r.text);
    let r = inspect(&s, &id, "nothing_here", None).await;
    assert_eq!(r.error_kind(), "invalid_argument", "{}", r.text);
    assert!(r.text.contains("NameError"), "{}", r.text);
    let listed = eval(&s, &id, "import os; sorted(os.listdir('.'))").await;
    assert!(!listed.text.contains("pwned"), "{}", listed.text);

    // A big value within the budget, cut by the session's own bootstrap.
    eval(
        &s,
        &id,
        "big = 'x' * 1_000_000\nitems = list(range(100_000))",
    )
    .await;
    for name in ["big", "items"] {
        let r = inspect(&s, &id, name, Some(500)).await;
        assert!(!r.is_error, "{}", r.text);
        assert!(
            r.structured["details"].to_string().len() <= 500,
            "{}",
            r.structured
        );
        assert_eq!(
            r.structured["details"]["len"],
            if name == "big" { 1_000_000 } else { 100_000 }
        );
    }
    let r = inspect(&s, &id, "big", Some(500)).await;
    assert_eq!(r.structured["truncated"], true, "{}", r.structured);
    // A bootstrap replaced by user code: the server cuts its answer, whatever it says.
    eval(
        &s,
        &id,
        r#"
import builtins
def free(f, name):
    return dict(zip(f.__code__.co_freevars, (c.cell_contents for c in f.__closure__)))[name]
cell = free(builtins.__rbx_inspect, "cell")
def fake(name, budget):
    cell["extra"]["inspect"] = {"type": "\x1b[31mred", "big": "y" * 7000, "small": 1,
                                **{"k%d" % i: i for i in range(100)}}
builtins.__rbx_inspect = fake
"#,
    )
    .await;
    let r = inspect(&s, &id, "x", Some(300)).await;
    assert!(!r.is_error, "{}", r.text);
    assert!(
        r.structured["details"].to_string().len() <= 300,
        "{}",
        r.structured
    );
    assert!(r.structured["details"].get("big").is_none());
    assert_eq!(r.structured["truncated"], true);
    assert!(!r.text.contains('\x1b'), "{}", r.text);
    s.stop().await;
}

/// What `session_inspect` tells of a frame, an array, a function, a class and a plain value,
/// within the default budget; and a language without it says so.
#[tokio::test(flavor = "multi_thread")]
async fn inspect_tells_each_kind_of_value_within_its_budget() {
    if !require_data_stack() {
        return;
    }
    let s = TestServer::start().await;
    let id = s.start_session("python").await;
    eval(
        &s,
        &id,
        r#"
import numpy as np, pandas as pd
df = pd.DataFrame({"city": ["a", "b", None, "a"] * 25, "n": range(100)})
arr = np.arange(12, dtype=float).reshape(3, 4)
def area(w: float, h: float = 1.0) -> float:
    """Width times height."""
    return w * h
class Box:
    """A box."""
    def volume(self): return 0
"#,
    )
    .await;
    let d = inspect(&s, &id, "df", None).await;
    assert!(!d.is_error, "{}", d.text);
    let v = &d.structured;
    assert_eq!(v["type"], "pandas.DataFrame");
    assert_eq!(v["details"]["shape"], json!([100, 2]));
    let city = &v["details"]["columns"][0];
    assert_eq!(
        (&city["name"], &city["nulls"], &city["distinct"]),
        (&json!("city"), &json!(25), &json!(2)),
        "{v}"
    );
    // pandas 3 names its strings `str`, older ones `object`.
    assert!(
        ["object", "str"].contains(&city["dtype"].as_str().unwrap_or("")),
        "{v}"
    );
    assert_eq!(v["details"]["head"][0], json!({"city": "a", "n": 0}));
    assert_eq!(v["details"]["tail"][4], json!({"city": "a", "n": 99}));
    assert!(v.to_string().len() < 2000 + 200, "{v}");
    assert!(d.text.starts_with("df: pandas.DataFrame\n"), "{}", d.text);

    let a = inspect(&s, &id, "arr", None).await.structured;
    assert_eq!(a["details"]["shape"], json!([3, 4]));
    assert_eq!(a["details"]["dtype"], "float64");
    assert_eq!(a["details"]["stats"]["max"], 11.0);
    assert_eq!(a["details"]["stats"]["mean"], 5.5);

    let f = inspect(&s, &id, "area", None).await;
    assert_eq!(
        f.structured["details"]["signature"],
        "area(w: float, h: float = 1.0) -> float"
    );
    assert_eq!(f.structured["details"]["doc"], "Width times height.");
    assert!(
        f.structured["details"]["source"]
            .as_str()
            .unwrap_or("")
            .contains("return w * h"),
        "{}",
        f.structured
    );
    // Source reads as code in the text, not as an escaped string.
    assert!(f.text.contains("source:\ndef area("), "{}", f.text);
    let c = inspect(&s, &id, "Box", None).await.structured;
    assert_eq!(c["details"]["members"], json!(["volume"]));
    let m = inspect(&s, &id, "df.n", None).await.structured;
    assert_eq!(m["type"], "pandas.Series");
    assert_eq!(m["details"]["stats"]["max"], 99.0);

    // The listing of names still works, and inspecting printed nothing into the session.
    let after = eval(&s, &id, "print('next')").await;
    assert_eq!(after.text, "next\n");

    if require("shellscript", "bash") {
        let b = s.start_session("bash").await;
        let r = inspect(&s, &b, "HOME", None).await;
        assert_eq!(r.error_kind(), "unsupported_language", "{}", r.text);
    }
    s.stop().await;
}

/// An output longer than the result holds: the result has its head and tail and a link to
/// the whole, which its owner reads again in pages that join into exactly what was printed;
/// another token's principal cannot read or list it, and no made-up URI reaches another
/// session's output, a file, or a page that is not there.
#[tokio::test(flavor = "multi_thread")]
async fn a_big_output_is_a_preview_and_a_link_only_its_owner_reads() {
    if !require("python", "python3") {
        return;
    }
    let (ta, tb) = (token(), token());
    let s = Server::http().token(&ta).token(&tb).start().await;
    let (a, b) = (s.connect(&ta).await, s.connect(&tb).await);
    let start = |p| async move {
        http_call(p, "session_start", json!({"language": "python"}))
            .await
            .s("session_id")
            .to_string()
    };
    let (id, other) = (start(a.peer()).await, start(b.peer()).await);
    // About 5 MB of numbered lines.
    let big = eval_on(
        a.peer(),
        &id,
        "open('secret.txt','w').write('S3')\n\
         print('\\n'.join(f'{i:06d} ' + 'x' * 44 for i in range(100_000)))",
    )
    .await;
    let expected: String = (0..100_000)
        .map(|i| format!("{i:06} {}\n", "x".repeat(44)))
        .collect();
    let uri = big.structured["output_uri"]
        .as_str()
        .expect("output_uri")
        .to_string();
    let eval_id = big.structured["eval_id"].as_u64().expect("eval_id");
    assert_eq!(
        uri,
        format!("replbox://sessions/{id}/outputs/{eval_id}.txt")
    );
    assert_eq!(big.structured["truncated"], true);
    let out = big.structured["output"].as_str().expect("output");
    assert!(
        out.len() <= 64 * 1024 + 100,
        "preview of {} bytes",
        out.len()
    );
    assert!(out.starts_with("000000 x"), "the head is in the preview");
    assert!(
        out.ends_with(&format!("\n099999 {}\n", "x".repeat(44))),
        "the tail is in the preview"
    );
    assert!(
        big.text.contains(&uri),
        "the text names the link: {}",
        &big.text[big.text.len().saturating_sub(600)..]
    );
    let link = big
        .links()
        .into_iter()
        .find(|l| l.0 == uri)
        .expect("a resource_link");
    assert_eq!(link.2, "text/plain");

    // Too big to read at once (--max-resource-bytes): read by pages.
    let e = read_on(a.peer(), &uri).await.expect_err("5 MB at once");
    assert!(e.contains("?page=1"), "{e}");
    let pages = expected.len().div_ceil(64 * 1024);
    let mut joined = String::new();
    for n in 1..=pages {
        let c = read_on(a.peer(), &format!("{uri}?page={n}"))
            .await
            .expect("a page");
        assert_eq!(c[0]["mimeType"], "text/plain");
        joined.push_str(c[0]["text"].as_str().expect("text"));
    }
    assert!(
        joined == expected,
        "pages join into the whole: {} of {} bytes",
        joined.len(),
        expected.len()
    );
    let e = read_on(a.peer(), &format!("{uri}?page={}", pages + 1))
        .await
        .expect_err("past the end");
    assert!(e.contains(&format!("{pages} page(s)")), "{e}");
    let listed: Vec<String> = a
        .list_all_resources()
        .await
        .expect("list")
        .into_iter()
        .map(|r| r.uri)
        .collect();
    assert!(listed.contains(&uri), "{listed:?}");

    // A short output has no link.
    let small = eval_on(a.peer(), &id, "print('short')").await;
    assert!(small.structured.get("output_uri").is_none());
    assert!(small.links().is_empty(), "{:?}", small.blocks);

    // Another principal's big output, and what it cannot do with ours.
    eval_on(b.peer(), &other, "pass").await;
    let theirs = eval_on(b.peer(), &other, "print('y' * 200_000)").await;
    let their_uri = theirs.structured["output_uri"]
        .as_str()
        .expect("theirs")
        .to_string();
    for u in [uri.clone(), format!("{uri}?page=1")] {
        let e = read_on(b.peer(), &u)
            .await
            .expect_err("another token read it");
        assert!(e.contains("no session"), "{e}");
    }
    let b_listed: Vec<String> = b
        .list_all_resources()
        .await
        .expect("list")
        .into_iter()
        .map(|r| r.uri)
        .collect();
    assert!(b_listed.iter().all(|u| !u.contains(&id)), "{b_listed:?}");

    // Made-up URIs: pages that are not numbers, traversal, encodings, other sessions.
    let base = format!("replbox://sessions/{id}");
    let their_eval = theirs.structured["eval_id"].as_u64().expect("eval_id");
    assert_ne!(their_eval, eval_id);
    for u in [
        format!("{uri}?page=0"),
        format!("{uri}?page=-1"),
        format!("{uri}?page=1&page=2"),
        format!("{uri}?page=99999999999999999999"),
        format!("{uri}?offset=0"),
        format!("{base}/outputs/../files/secret.txt"),
        format!("{base}/outputs/%2e%2e/files/secret.txt"),
        format!("{base}/outputs/{eval_id}.txt/../../files/secret.txt"),
        format!("{base}/outputs/..%2Ffiles%2Fsecret.txt"),
        format!("{base}/outputs/{}.txt", small.structured["eval_id"]),
        format!("{base}/outputs/{their_eval}.txt?page=1"),
        format!("{base}/OUTPUTS/{eval_id}.txt"),
        format!("replbox://sessions/{id}%2F..%2F{other}/outputs/{their_eval}.txt"),
        format!("replbox://sessions/../sessions/{other}/outputs/{their_eval}.txt"),
        their_uri.clone(),
    ] {
        if let Ok(c) = read_on(a.peer(), &u).await {
            let text = c[0]["text"].as_str().unwrap_or("");
            panic!("{u} read as {}", &text[..text.len().min(200)]);
        }
    }
    // Kept after the close, for its owner only.
    let closed = http_call(a.peer(), "session_close", json!({"session_id": id})).await;
    assert!(!closed.is_error, "{}", closed.text);
    let again = read_on(a.peer(), &format!("{uri}?page=1"))
        .await
        .expect("kept after the close");
    assert!(
        again[0]["text"]
            .as_str()
            .unwrap_or("")
            .starts_with("000000 x")
    );
    assert!(read_on(b.peer(), &format!("{uri}?page=1")).await.is_err());
    drop((a, b));
    s.stop().await;
}

/// R: a data frame a cell shows (or `display()`s) comes back as data, as a pandas frame
/// does (type, shape, columns with their classes, first and last rows as records, its row
/// names as `_row`); `session_vars` lists the user's names. Neither runs a method of the
/// user's classes (`length`, `[`, `as.character` that fail), and names and strings with
/// quotes and control characters arrive as data.
#[tokio::test(flavor = "multi_thread")]
async fn r_frames_are_records_and_vars_run_no_user_method() {
    if !require("r", "R") {
        return;
    }
    let s = TestServer::start().await;
    let id = s.start_session("r").await;
    let shown = eval(
        &s,
        &id,
        "df <- data.frame(n = 1:20, x = (1:20) / 2, s = letters[1:20], \
         f = factor(rep(c('u', 'v'), 10)), d = as.Date('2024-01-01') + 0:19)\n\
         df$s[2] <- NA\ndf",
    )
    .await;
    assert!(shown.text.contains("20 20 10.0    t"), "{}", shown.text);
    let frame = &shown.structured["displays"][0]["frame"];
    assert_eq!(frame["type"], "data.frame");
    assert_eq!(frame["shape"], json!([20, 5]));
    assert_eq!(
        frame["columns"],
        json!([{"name": "n", "dtype": "integer"}, {"name": "x", "dtype": "double"},
               {"name": "s", "dtype": "character"}, {"name": "f", "dtype": "factor"},
               {"name": "d", "dtype": "Date"}])
    );
    assert_eq!(
        frame["head"][1],
        json!({"n": 2, "x": 1.0, "s": null, "f": "v", "d": "2024-01-02"})
    );
    assert_eq!(frame["tail"][4]["d"], "2024-01-20");
    assert_eq!(frame["head"].as_array().map(Vec::len), Some(5));

    // display(), row names, and a hostile column class, name and strings.
    let shown = eval(
        &s,
        &id,
        "length.evil <- function(x) stop('length ran')\n\
         `[.evil` <- function(x, i) stop('[ ran')\n\
         as.character.evil <- function(x, ...) stop('as.character ran')\n\
         format.evil <- function(x, ...) c('E1', 'E2')\n\
         e <- structure(list(1), class = 'evil')\n\
         assign('we\"ird\\n\\033[31mname', 'va\"l\\u0001ue')\n\
         m <- structure(list(v = structure(c(1.5, 2), class = 'evil'), 'q\"uote' = c('a\"b', 'c\\nd')), \
         class = 'data.frame', row.names = c('first', 'second'))\n\
         display(mtcars[1:2, 1:2])\ninvisible(0)",
    )
    .await;
    let frame = &shown.structured["displays"][0]["frame"];
    assert_eq!(
        frame["head"][0],
        json!({"_row": "Mazda RX4", "mpg": 21.0, "cyl": 6.0})
    );
    let shown = eval(&s, &id, "display(m)").await;
    let frame = &shown.structured["displays"][0]["frame"];
    assert_eq!(frame["columns"][0], json!({"name": "v", "dtype": "evil"}));
    assert_eq!(
        frame["head"][1],
        json!({"_row": "second", "v": 2.0, "q\"uote": "c\nd"})
    );

    // Attributes with a class of their own: classed row names in a frame's display (its
    // printing is the user's own quiet method), classed factor levels in session_vars.
    let shown = eval(
        &s,
        &id,
        "`[.mark` <- function(x, i) { writeLines('X', 'marker'); unclass(x)[i] }\n\
         as.character.mark <- function(x, ...) { writeLines('X', 'marker'); 'm' }\n\
         print.quiet <- function(x, ...) invisible(x)\n\
         fl <- factor(c('a', 'b')); attr(fl, 'levels') <- structure(c('a', 'b'), class = 'mark')\n\
         r <- structure(list(a = 1:2), class = c('quiet', 'data.frame'), \
         row.names = structure(c('p', 'q'), class = 'mark'))\n\
         display(r)",
    )
    .await;
    let frame = &shown.structured["displays"][0]["frame"];
    assert_eq!(frame["head"][1], json!({"_row": "q", "a": 2}), "{frame}");
    // A name that is not UTF-8, a class name of a million bytes, a planted promise.
    eval(
        &s,
        &id,
        "assign(rawToChar(as.raw(c(0x61, 0xff))), 1)\n\
         k <- structure(1, class = strrep('K', 1e6))\n\
         delayedAssign('p', {writeLines('RAN', 'promise_marker'); 42})\n\
         invisible(0)",
    )
    .await;

    let o = s.call("session_vars", json!({"session_id": id})).await;
    assert!(!o.is_error, "{}", o.text);
    let vars = o.structured["vars"].as_array().cloned().unwrap_or_default();
    let find = |name: &str| {
        vars.iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("{name} not in {vars:?}"))
            .clone()
    };
    let df = find("df");
    assert_eq!(df["type"], "data.frame");
    assert!(
        df["summary"]
            .as_str()
            .unwrap_or("")
            .starts_with("20 x 5: n <integer>, x <double>"),
        "{df}"
    );
    assert_eq!(find("e")["type"], "evil");
    let f = find("length.evil");
    assert_eq!(
        (f["kind"].as_str(), f["summary"].as_str()),
        (Some("function"), Some("function(x)"))
    );
    // Control characters are spaces in a listing.
    let weird = find("we\"ird  [31mname");
    assert!(
        weird["summary"].as_str().unwrap_or("").contains("va\"l ue"),
        "{weird}"
    );
    assert!(
        find("fl")["summary"]
            .as_str()
            .unwrap_or("")
            .contains("\"a\" \"b\"")
    );
    // The odd name is listed with its byte escaped, and so is every other name.
    assert_eq!(find("a<ff>")["summary"], "double [1] 1");
    let k = find("k");
    assert_eq!(k["type"], "K".repeat(200), "the class name is cut");
    assert_eq!(
        o.structured["omitted"].as_u64().unwrap_or(0),
        0,
        "{}",
        o.structured
    );
    // A promise the session planted with delayedAssign is forced (docs/security.md says so).
    assert_eq!(find("p")["summary"], "double [1] 42");
    // No method of the attributes' classes ran, in the display or in session_vars.
    let after = eval(
        &s,
        &id,
        "cat(file.exists('marker'), file.exists('promise_marker'), '\\n')",
    )
    .await;
    assert!(after.text.starts_with("FALSE TRUE \n"), "{}", after.text);
    // Nothing printed into the session, which goes on.
    let after = eval(&s, &id, "cat('next\\n')").await;
    assert_eq!(after.text, "next\n");

    // session_inspect in the same session: a frame's columns with nulls and distinct
    // counts and its first and last rows, a matrix's shape and statistics, a function's
    // formals and its own source, a list's members through a dotted path; and values
    // whose classes' methods (and methods for the types' implicit classes) would leave a
    // mark are read without running any of them.
    eval(
        &s,
        &id,
        "area <- function(w, h = 1) {\n  # width times height\n  w * h\n}\n\
         mx <- matrix(1:6, 2)\n\
         lst <- list(a = c(1.5, NA, 3), b = 'x')\n\
         mark <- function(...) { writeLines('x', 'S3-ran'); stop('a method ran') }\n\
         for (g in c('length', '[', '[[', '$', 'is.na', 'dim', 'names', 'format', 'unique', \
         'summary', 'head', 'print', 'as.character', 'mean', 'levels')) \
         assign(paste0(g, '.evil'), mark)\n\
         ev <- structure(list(a = structure(c(1, 2, NA), class = 'evil'), b = c('u', 'v', 'u')), \
         class = c('evil', 'data.frame'), row.names = c(NA, -3L))\n\
         vec <- structure(c(2, 4, NA), class = 'evil')\n\
         huge <- as.numeric(1:1e7)\n\
         makeActiveBinding('ab', mark, globalenv())\n\
         unique.numeric <- unique.integer <- format.numeric <- head.character <- mark\n\
         invisible(0)",
    )
    .await;
    let i = |name: &'static str| inspect(&s, &id, name, None);
    let d = i("df").await;
    assert!(!d.is_error, "{}", d.text);
    let v = &d.structured["details"];
    assert_eq!(
        (&d.structured["type"], &v["shape"]),
        (&json!("data.frame"), &json!([20, 5])),
        "{v}"
    );
    assert_eq!(
        v["columns"][2],
        json!({"name": "s", "dtype": "character", "nulls": 1, "distinct": 19})
    );
    assert_eq!(
        v["columns"][3],
        json!({"name": "f", "dtype": "factor", "nulls": 0, "distinct": 2})
    );
    assert_eq!(
        v["head"][1],
        json!({"n": 2, "x": 1.0, "s": null, "f": "v", "d": "2024-01-02"})
    );
    assert_eq!(v["tail"][4]["n"], 20, "{v}");
    let m = i("mx").await.structured;
    assert_eq!(
        (&m["details"]["shape"], &m["details"]["dtype"]),
        (&json!([2, 3]), &json!("integer")),
        "{m}"
    );
    assert_eq!(
        m["details"]["stats"],
        json!({"min": 1.0, "max": 6.0, "mean": 3.5, "sd": 1.87082869338697, "nans": 0})
    );
    let f = i("area").await;
    assert_eq!(
        f.structured["details"]["signature"], "function(w, h = 1)",
        "{}",
        f.structured
    );
    assert!(
        f.text
            .contains("source:\nfunction(w, h = 1) {\n  # width times height\n  w * h\n}"),
        "{}",
        f.text
    );
    let a = i("lst.a").await.structured;
    assert_eq!(
        (&a["type"], &a["details"]["nulls"], &a["details"]["head"]),
        (&json!("double"), &json!(1), &json!([1.5, null, 3.0])),
        "{a}"
    );
    let l = i("lst").await.structured;
    assert_eq!(
        l["details"]["members"],
        json!([{"name": "a", "type": "double"}, {"name": "b", "type": "character"}]),
        "{l}"
    );
    let ev = i("ev").await;
    assert!(!ev.is_error, "{}", ev.text);
    assert_eq!(ev.structured["type"], "evil");
    assert_eq!(
        ev.structured["details"]["columns"][0],
        json!({"name": "a", "dtype": "evil", "nulls": 1, "distinct": 2})
    );
    assert_eq!(
        ev.structured["details"]["head"][2],
        json!({"a": null, "b": "u"})
    );
    let vec = i("vec").await.structured;
    assert_eq!(vec["details"]["stats"]["max"], 4.0, "{vec}");
    let h = inspect(&s, &id, "huge", Some(300)).await.structured;
    assert_eq!(
        (&h["details"]["len"], &h["details"]["stats"]["max"]),
        (&json!(10_000_000), &json!(1e7)),
        "{h}"
    );
    assert!(h["details"].to_string().len() <= 300, "{h}");
    for (name, says) in [
        ("ab", "active binding"),
        ("nothing", "object 'nothing' not found"),
        ("lst.zz", "no element zz"),
    ] {
        let r = inspect(&s, &id, name, None).await;
        assert_eq!(r.error_kind(), "invalid_argument", "{name}: {}", r.text);
        assert!(r.text.contains(says), "{name}: {}", r.text);
    }
    let after = eval(&s, &id, "cat(file.exists('S3-ran'), '\\n')").await;
    assert_eq!(after.text, "FALSE \n");
    s.stop().await;
}

/// A 1x1 PNG.
const PNG_1X1: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

/// JavaScript: `display()` as in a notebook kernel. An object's display method (Deno's
/// `Symbol.for("Jupyter.display")`, or `_repr_mimebundle_`) gives its MIME bundle, a plain
/// object or array also comes back as JSON, a Buffer holding a PNG as an image, a string as
/// text only; a cell's value with a display method comes back rich too. Values that fight
/// back (a cycle, a throwing getter, a Proxy, a huge array) give text, never a broken cell.
#[tokio::test(flavor = "multi_thread")]
async fn javascript_display_returns_mime_bundles_as_content_blocks() {
    if !require("javascript", "node") {
        return;
    }
    let s = TestServer::start().await;
    let id = s.start_session("javascript").await;
    let shown = eval(
        &s,
        &id,
        r##"class Chart {
  [Symbol.for("Jupyter.display")]() {
    return {"text/plain": "Chart(3)", "text/html": "<b>3</b>",
            "image/svg+xml": '<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"/>',
            "application/x-evil": "no"};
  }
}
const md = { _repr_mimebundle_() { return {"text/markdown": "# T", "application/vnd.vegalite.v5+json": {mark: "bar"}}; } };
display(new Chart(), md, {a: 1, b: [1, 2]}, "just text")
console.log("after")"##,
    )
    .await;
    assert!(shown.text.starts_with("Chart(3)\n"), "{}", shown.text);
    assert!(
        shown
            .text
            .contains("{ a: 1, b: [ 1, 2 ] }\njust text\nafter\n"),
        "{}",
        shown.text
    );
    assert_eq!(
        shown.kinds(),
        [
            ("image", "image/svg+xml"),
            ("resource", "text/html"),
            ("resource", "application/vnd.vegalite.v5+json"),
            ("resource", "text/markdown"),
            ("resource", "application/json"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    assert_eq!(shown.resource("text/html").1, "<b>3</b>");
    assert_eq!(shown.resource("text/markdown").1, "# T");
    assert_eq!(
        serde_json::from_str::<Value>(&shown.resource("application/json").1).expect("json"),
        json!({"a": 1, "b": [1, 2]})
    );
    assert_eq!(
        shown.structured["displays"].as_array().map(Vec::len),
        Some(3)
    );
    let (uri, _) = shown.resource("text/html");
    assert!(
        uri.starts_with(&format!("replbox://sessions/{id}/displays/")),
        "{uri}"
    );

    // A PNG in a Buffer is an image with its link; a cell's value with a display method
    // comes back rich after the REPL's text of it; a plain value does not.
    let shown = eval(
        &s,
        &id,
        &format!("display(Buffer.from('{PNG_1X1}', 'base64'))"),
    )
    .await;
    assert_eq!(shown.image("image/png"), PNG_1X1);
    assert!(shown.text.starts_with("<image/png, "), "{}", shown.text);
    assert_eq!(shown.links().len(), 1, "{:?}", shown.links());
    let shown = eval(&s, &id, "new Chart()").await;
    assert_eq!(shown.kinds().len(), 2, "{:?}", shown.kinds());
    let shown = eval(&s, &id, "({a: 1})").await;
    assert!(shown.kinds().is_empty(), "{:?}", shown.kinds());

    // Hostile values: text only, and the cell goes on.
    let shown = eval(
        &s,
        &id,
        r#"const cyc = {}; cyc.self = cyc;
const thrower = { get x() { throw new Error("getter ran"); } };
const trap = new Proxy({}, { get() { throw new Error("trap ran"); }, ownKeys() { throw new Error("trap ran"); } });
const huge = new Array(5e6).fill(1);
display(cyc, thrower, trap, huge, null, undefined, 42)
console.log("still here")"#,
    )
    .await;
    assert!(shown.kinds().is_empty(), "{:?}", shown.kinds());
    assert!(
        shown.text.contains("<ref *1> { self: [Circular *1] }"),
        "{}",
        shown.text
    );
    assert!(shown.text.ends_with("42\nstill here\n"), "{}", shown.text);
    assert!(!shown.text.contains("ran"), "{}", shown.text);

    // session_inspect in the same session: arrays, typed arrays, functions, classes and
    // objects within the budget; and the hostile values above (a cycle, getters that throw
    // or never end, Proxies whose traps leave a mark, a huge sparse array) are read without
    // running any of their code.
    eval(
        &s,
        &id,
        r#"const xs = [3, 1, 2, NaN];
const f64 = new Float64Array([1, 2, 3, NaN]);
function area(w, h = 1) {
  // width times height
  return w * h;
}
class Box { constructor(w, d) { this.w = w; } volume() { return 0; } }
const spin = { get forever() { for (;;); }, get boom() { throw new Error("getter ran"); }, ok: 1 };
const marks = new Proxy({}, {
  get() { require("fs").writeFileSync("trap-ran", "1"); for (;;); },
  ownKeys() { require("fs").writeFileSync("trap-ran", "1"); return []; },
  getPrototypeOf() { require("fs").writeFileSync("trap-ran", "1"); return null; },
  getOwnPropertyDescriptor() { require("fs").writeFileSync("trap-ran", "1"); return undefined; },
});
const holder = { inner: marks, cyc, n: 1 };
const sparse = []; sparse[2 ** 32 - 2] = 1;
const floats = new Float64Array(5e6).fill(0.5);
Object.defineProperty(globalThis, "lazy", { get() { for (;;); } });
undefined"#,
    )
    .await;
    let i = |name: &'static str| inspect(&s, &id, name, None);
    let xs = i("xs").await;
    assert!(!xs.is_error, "{}", xs.text);
    let d = &xs.structured["details"];
    assert_eq!(
        (&xs.structured["type"], &d["len"], &d["dtype"]),
        (&json!("Array"), &json!(4), &json!("number")),
        "{d}"
    );
    assert_eq!(
        d["stats"],
        json!({"min": 1, "max": 3, "mean": 2, "std": (2.0f64 / 3.0).sqrt(), "nans": 1, "count": 3})
    );
    let d = i("f64").await.structured["details"].clone();
    assert_eq!(
        (&d["dtype"], &d["stats"]["max"], &d["head"]),
        (&json!("float64"), &json!(3), &json!([1, 2, 3, null])),
        "{d}"
    );
    let f = i("area").await;
    assert_eq!(
        f.structured["details"]["signature"], "area(w, h = 1)",
        "{}",
        f.structured
    );
    assert!(
        f.text
            .contains("source:\nfunction area(w, h = 1) {\n  // width times height"),
        "{}",
        f.text
    );
    let c = i("Box").await.structured;
    assert_eq!(
        (
            &c["type"],
            &c["details"]["signature"],
            &c["details"]["members"]
        ),
        (&json!("class"), &json!("Box(w, d)"), &json!(["volume"])),
        "{c}"
    );
    let o = i("spin").await.structured;
    assert_eq!(
        o["details"]["keys"],
        json!(["forever", "boom", "ok"]),
        "{o}"
    );
    assert_eq!(
        o["details"]["repr"], "{forever: [Getter], boom: [Getter], ok: 1}",
        "{o}"
    );
    let p = i("marks").await.structured;
    assert_eq!(p["type"], "Proxy", "{p}");
    let h = i("holder").await.structured;
    assert_eq!(
        h["details"]["repr"], "{inner: Proxy, cyc: {self: [Circular]}, n: 1}",
        "{h}"
    );
    let sp = i("sparse").await.structured;
    assert_eq!(
        (&sp["details"]["len"], &sp["details"]["dtype"]),
        (&json!(4294967295u64), &json!("empty")),
        "{sp}"
    );
    let fl = inspect(&s, &id, "floats", Some(400)).await.structured;
    assert_eq!(
        (&fl["details"]["len"], &fl["details"]["stats"]["mean"]),
        (&json!(5_000_000), &json!(0.5)),
        "{fl}"
    );
    assert!(fl["details"].to_string().len() <= 400, "{fl}");
    for (name, says) in [
        ("spin.forever", "getter is not run"),
        ("marks.x", "traps are not run"),
        ("lazy", "getter is not run"),
        ("nothing", "ReferenceError"),
    ] {
        let r = inspect(&s, &id, name, None).await;
        assert_eq!(r.error_kind(), "invalid_argument", "{name}: {}", r.text);
        assert!(r.text.contains(says), "{name}: {}", r.text);
    }
    let after = eval(
        &s,
        &id,
        "console.log(require('fs').existsSync('trap-ran'), xs.length)",
    )
    .await;
    assert_eq!(after.text, "false 4\n");
    s.stop().await;
}
