//! Data-analysis sessions through a real MCP client: figures come back as PNG images,
//! tables print wide, files the code writes are listed and readable as resources, and
//! session_start brings files in.

use crate::common;

use base64::Engine;
use common::*;
use rmcp::model::{ReadResourceRequestParams, ResourceContents};
use serde_json::{Value, json};

impl TestServer {
    async fn start_python(&self) -> String {
        let out = self
            .call("session_start", json!({"language": "python"}))
            .await;
        assert!(!out.is_error, "session_start: {}", out.text);
        out.s("session_id").to_string()
    }

    /// A python session with pyplot imported. A session's matplotlib cache is its own, so
    /// the first import builds the font cache and, when that takes over 5 s (a loaded
    /// machine), matplotlib says so on stderr: that line lands in this evaluation, not in
    /// the output a test checks.
    async fn start_plotting(&self) -> String {
        let id = self.start_python().await;
        self.eval_ok(&id, "import matplotlib.pyplot as plt").await;
        id
    }

    async fn eval_ok(&self, id: &str, code: &str) -> Out {
        // Generous: the first matplotlib import builds its font cache.
        let o = self
            .call(
                "session_eval",
                json!({"session_id": id, "code": code, "timeout_ms": 120_000}),
            )
            .await;
        assert_eq!(o.structured["status"], "ok", "{code}\n=> {}", o.text);
        o
    }

    async fn read(&self, uri: &str) -> Result<ResourceContents, String> {
        self.client
            .read_resource(ReadResourceRequestParams::new(uri))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.contents.into_iter().next().ok_or("no contents".into()))
    }

    async fn resource_uris(&self) -> Vec<String> {
        self.client
            .list_all_resources()
            .await
            .expect("resources/list")
            .into_iter()
            .map(|r| r.uri)
            .collect()
    }
}

fn output(o: &Out) -> &str {
    o.structured["output"].as_str().unwrap_or("")
}

/// Decode a base64 PNG fully (every chunk, CRCs and the zlib stream) and return its size.
fn decode_png(b64: &str) -> (u32, u32) {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("image data is base64");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = decoder.read_info().expect("PNG header decodes");
    let mut buf = vec![0; reader.output_buffer_size().expect("sane size")];
    let info = reader.next_frame(&mut buf).expect("PNG image data decodes");
    // A plot is not blank: some pixels differ from the first.
    let px = info.line_size / info.width as usize;
    let first = &buf[..px];
    assert!(
        buf[..info.buffer_size()].chunks(px).any(|p| p != first),
        "the image is a single colour"
    );
    (info.width, info.height)
}

/// The numbers of the figures matplotlib still has open.
async fn open_figures(s: &TestServer, id: &str) -> String {
    let o = s
        .eval(id, "import matplotlib.pyplot as plt\nplt.get_fignums()")
        .await;
    output(&o).trim().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plot_comes_back_as_a_png_that_decodes() {
    if !require_data_stack() {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_plotting().await;
    let o = s
        .eval(
            &id,
            "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2], label='a')\nplt.title('t')\nprint('drawn')",
        )
        .await;
    assert_eq!(o.images.len(), 1, "{}", o.text);
    assert_eq!(o.images[0].0, "image/png");
    let (w, h) = decode_png(&o.images[0].1);
    let info = &o.structured["images"][0];
    assert_eq!(info["name"], "figure-1.png");
    assert_eq!(
        (info["width"].as_u64(), info["height"].as_u64()),
        (Some(w as u64), Some(h as u64))
    );
    assert!(w > 100 && h > 100, "{w}x{h}");
    // The text says so too (for clients that drop images), after the output.
    assert!(
        o.text.starts_with("drawn\n[images attached: figure-1.png"),
        "{}",
        o.text
    );
    // Not kept by the code: closed once returned, and not returned again.
    assert_eq!(open_figures(&s, &id).await, "[]");
    let o = s.eval_ok(&id, "1 + 1").await;
    assert!(o.images.is_empty());
    assert_eq!(o.text, "2\n", "nothing else in the text");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_figures_two_images_and_show_does_not_block() {
    if !require_data_stack() {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_plotting().await;
    let o = s
        .eval(
            &id,
            "import matplotlib.pyplot as plt\nplt.figure(); plt.plot([1, 2])\nplt.figure(figsize=(3, 2)); plt.bar([1, 2], [3, 4])",
        )
        .await;
    assert_eq!(o.images.len(), 2, "{}", o.text);
    let sizes: Vec<(u32, u32)> = o.images.iter().map(|i| decode_png(&i.1)).collect();
    assert_ne!(sizes[0], sizes[1], "two different figures, in order");
    assert!(sizes[1].0 < sizes[0].0, "the 3x2 figure is the second");
    let names: Vec<&str> = o.structured["images"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["name"].as_str())
        .collect();
    assert_eq!(names, ["figure-1.png", "figure-2.png"]);

    // plt.show() returns at once and, as in a notebook, ends the figure: the next plot
    // starts a new one.
    // A blocking show would hold the evaluation until its timeout: the status says it did not.
    let o = s
        .eval_ok(
            &id,
            "plt.plot([1, 2]); plt.show()\nplt.plot([2, 1]); plt.show(block=True)\nprint('after show')",
        )
        .await;
    assert_eq!(output(&o), "after show\n");
    assert_eq!(o.images.len(), 2, "{}", o.text);
    assert_eq!(open_figures(&s, &id).await, "[]");

    // In interactive mode pyplot draws each change at once; the figure still comes back.
    let o = s
        .eval_ok(&id, "plt.ion()\nplt.plot([1, 2]); plt.title('ion')")
        .await;
    assert_eq!(o.images.len(), 1, "{}", o.text);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kept_figure_comes_back_when_changed_and_only_then() {
    if !require_data_stack() {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_plotting().await;
    let o = s
        .eval(
            &id,
            "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2, 3])",
        )
        .await;
    assert_eq!(o.images.len(), 1, "{}", o.text);
    let first = decode_png(&o.images[0].1);
    // Kept (the code holds fig and ax): still open, not returned while unchanged.
    let o = s.eval_ok(&id, "x = 1").await;
    assert!(o.images.is_empty(), "{}", o.text);
    assert_eq!(open_figures(&s, &id).await, "[1]");
    // Changed: returned again.
    let o = s.eval_ok(&id, "ax.set_title('now with a title')").await;
    assert_eq!(o.images.len(), 1, "{}", o.text);
    let second = decode_png(&o.images[0].1);
    assert_ne!(first, second, "the title changed the (tight) image's size");
    // Saved by the code: that counts as drawn, and the file is reported.
    let o = s
        .eval_ok(&id, "ax.plot([3, 1]); fig.savefig('saved.png')")
        .await;
    assert_eq!(o.images.len(), 1, "{}", o.text);
    assert_eq!(o.structured["files"][0]["path"], "saved.png");
    // A figure as the cell's value is shown even unchanged, as notebooks do.
    let o = s.eval_ok(&id, "fig").await;
    assert_eq!(o.images.len(), 1, "{}", o.text);
    // No longer referenced: closed at the end of the next evaluation.
    s.eval_ok(&id, "del fig, ax").await;
    assert_eq!(open_figures(&s, &id).await, "[]");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn image_caps_are_stated_in_the_result() {
    if !require_data_stack() {
        return;
    }
    let s = TestServer::start_with(&["--max-images", "2"], &[]).await;
    let id = s.start_plotting().await;
    let o = s
        .eval(
            &id,
            "import matplotlib.pyplot as plt\nfor i in range(5):\n    plt.figure(); plt.plot([i, 1])",
        )
        .await;
    assert_eq!(o.images.len(), 2, "{}", o.text);
    assert_eq!(o.structured["images_omitted"], 3);
    assert!(
        o.text.contains("3 more figure(s) not returned") && o.text.contains("--max-images"),
        "{}",
        o.text
    );
    assert_eq!(open_figures(&s, &id).await, "[]", "all closed anyway");
    s.stop().await;

    let s = TestServer::start_with(&["--max-image-bytes", "2000"], &[]).await;
    let id = s.start_plotting().await;
    let o = s
        .eval_ok(&id, "import matplotlib.pyplot as plt\nplt.plot([1, 2])")
        .await;
    assert!(o.images.is_empty());
    assert_eq!(o.structured["images_omitted"], 1);
    assert!(
        o.text.contains("figure-1.png not returned") && o.text.contains("--max-image-bytes"),
        "{}",
        o.text
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tables_and_arrays_print_wide() {
    if !require_data_stack() {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_python().await;
    // Imported and printed in the same cell: already wide.
    let o = s
        .eval(
            &id,
            "import pandas as pd\ndf = pd.DataFrame({f'column_{i}': [i * 1000 + r for r in range(5)] for i in range(30)})\nprint(df)",
        )
        .await;
    let out = output(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines.len(),
        6,
        "a header and five rows, one line each:\n{out}"
    );
    for i in 0..30 {
        assert!(
            lines[0].contains(&format!("column_{i}")),
            "column_{i}:\n{out}"
        );
    }
    assert!(!out.contains("..."), "{out}");
    assert!(lines[5].contains("29004"), "{out}");
    // A trailing DataFrame shows the same way; a long one is cut with its shape said.
    let o = s.eval_ok(&id, "df").await;
    assert_eq!(output(&o).lines().count(), 6);
    let o = s.eval_ok(&id, "pd.DataFrame({'a': range(1000)})").await;
    let out = output(&o);
    assert!(out.contains("[1000 rows x 1 columns]"), "{out}");
    assert!(out.lines().count() < 30, "{out}");
    // A Series too.
    let o = s.eval_ok(&id, "df.iloc[0]").await;
    assert!(output(&o).contains("column_29"), "{}", output(&o));
    // The user's own settings win over ours.
    let o = s
        .eval_ok(&id, "pd.set_option('display.max_columns', 4)\ndf")
        .await;
    assert!(output(&o).contains("..."), "{}", output(&o));
    // numpy: one line up to the terminal's width.
    let o = s.eval_ok(&id, "import numpy as np\nnp.arange(40)").await;
    let out = output(&o);
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.contains(" 39])"), "{out}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_that_do_not_plot_import_nothing() {
    if !require("python", "python3") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_python().await;
    s.eval_ok(&id, "x = [i * i for i in range(10)]").await;
    let o = s
        .eval(
            &id,
            "import sys\nsorted(m for m in ('matplotlib', 'pandas', 'numpy') if m in sys.modules)",
        )
        .await;
    assert_eq!(output(&o), "[]\n");
    s.stop().await;
}

/// matplotlib's notice that it is building its font cache (logged only when that takes over
/// 5 s, so present or not with the host's load) never reaches a cell's output; its other
/// warnings do.
#[tokio::test(flavor = "multi_thread")]
async fn the_font_cache_notice_never_shows_in_output() {
    if !require_data_stack() {
        return;
    }
    let s = TestServer::start().await;
    let id = s.start_python().await;
    let o = s
        .eval_ok(
            &id,
            "import logging, matplotlib\n\
             log = logging.getLogger('matplotlib.font_manager')\n\
             log.warning('Matplotlib is building the font cache; this may take a moment.')\n\
             log.warning('findfont: Font family not found')\n\
             print('done')",
        )
        .await;
    assert_eq!(output(&o), "findfont: Font family not found\ndone\n");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn files_written_are_listed_and_readable_as_resources() {
    if !require_data_stack() {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_python().await;
    let o = s
        .eval(
            &id,
            "import pandas as pd\npd.DataFrame({'city': ['Oslo', 'Lima'], 'temp': [3, 19]}).to_csv('out.csv', index=False)",
        )
        .await;
    let files = o.structured["files"].as_array().expect("files listed");
    assert_eq!(files.len(), 1, "{files:?}");
    let f = &files[0];
    assert_eq!(f["path"], "out.csv");
    assert_eq!(f["change"], "created");
    assert_eq!(f["size"], 25);
    assert!(
        o.text.contains("[files: created out.csv (25 B)]"),
        "{}",
        o.text
    );
    let uri = f["uri"].as_str().unwrap().to_string();
    assert_eq!(uri, format!("replbox://sessions/{id}/files/out.csv"));

    // Listed by resources/list, read as text by resources/read.
    assert!(s.resource_uris().await.contains(&uri));
    match s.read(&uri).await.expect("read out.csv") {
        ResourceContents::TextResourceContents {
            text, mime_type, ..
        } => {
            assert_eq!(text, "city,temp\nOslo,3\nLima,19\n");
            assert_eq!(mime_type.as_deref(), Some("text/csv"));
        }
        other => panic!("expected text: {other:?}"),
    }

    // Modified, created in a folder, deleted; a binary file is a blob.
    let o = s
        .eval(
            &id,
            "import os\nopen('out.csv', 'a').write('Rome,15\\n')\nos.makedirs('sub dir')\nopen('sub dir/raw.bin', 'wb').write(bytes(range(256)))",
        )
        .await;
    let changes: Vec<(String, String)> = o.structured["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().into(),
                f["change"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        changes,
        [
            ("out.csv".to_string(), "modified".to_string()),
            ("sub dir/raw.bin".into(), "created".into())
        ]
    );
    let bin_uri = o.structured["files"][1]["uri"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(bin_uri.ends_with("/files/sub%20dir/raw.bin"), "{bin_uri}");
    match s.read(&bin_uri).await.expect("read raw.bin") {
        ResourceContents::BlobResourceContents { blob, .. } => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(blob)
                .unwrap();
            assert_eq!(bytes, (0..=255u8).collect::<Vec<u8>>());
        }
        other => panic!("expected a blob: {other:?}"),
    }
    let o = s.eval_ok(&id, "os.remove('out.csv')").await;
    assert_eq!(o.structured["files"][0]["change"], "deleted");
    assert!(o.text.contains("deleted out.csv"), "{}", o.text);
    // An evaluation that writes nothing says nothing about files.
    let o = s.eval_ok(&id, "2 + 2").await;
    assert_eq!(o.structured.get("files"), None);

    // The template is advertised.
    let templates = s
        .client
        .list_all_resource_templates()
        .await
        .expect("templates");
    assert_eq!(
        templates[0].uri_template,
        "replbox://sessions/{session_id}/files/{path}"
    );

    // Still readable (read-only) for a while after the close: --keep-files-s, which
    // tests/durable.rs covers.
    s.call("session_close", json!({"session_id": id})).await;
    assert!(s.read(&bin_uri).await.is_ok());
    assert!(s.resource_uris().await.contains(&bin_uri));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn resources_never_leave_the_session_directory() {
    if !require("python", "python3") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_python().await;
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret.txt");
    std::fs::write(&secret, "do not read").unwrap();
    s.eval(
        &id,
        &format!(
            "import os\nos.symlink({secret:?}, 'link.txt')\nos.symlink({dir:?}, 'linkdir')\nos.mkfifo('fifo')\nopen('ok.txt', 'w').write('ok')",
            dir = outside.path()
        ),
    )
    .await;
    let base = format!("replbox://sessions/{id}/files/");
    assert!(s.read(&format!("{base}ok.txt")).await.is_ok());
    for path in [
        "../ctl/bootstrap.py",
        "..%2Fctl%2Fbootstrap.py",
        "%2E%2E/ctl/bootstrap.py",
        "sub/../../ctl/bootstrap.py",
        "%2Fetc%2Fpasswd",
        "link.txt",
        "linkdir/secret.txt",
        "fifo",
        "missing.txt",
    ] {
        let r = s.read(&format!("{base}{path}")).await;
        let err = r.expect_err(path);
        assert!(!err.contains("do not read"), "{path}: {err}");
    }
    // Links are not listed either; unknown sessions and other schemes are errors.
    let uris = s.resource_uris().await;
    assert!(uris.contains(&format!("{base}ok.txt")));
    assert!(!uris.iter().any(|u| u.contains("link")), "{uris:?}");
    assert!(
        s.read("replbox://sessions/nope/files/ok.txt")
            .await
            .is_err()
    );
    assert!(s.read("file:///etc/passwd").await.is_err());
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn session_start_brings_files_in() {
    if !require_data_stack() {
        return;
    }
    // Host files are read as the session's user: a directory it can reach, which the
    // operator allows as a cwd too (it lies under /tmp, which the sandbox masks).
    let host = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        host.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let s = TestServer::start_with(&["--allow-cwd", host.path().to_str().unwrap()], &[]).await;
    let csv = host.path().join("sales.csv");
    std::fs::write(&csv, "region,amount\nnorth,10\nsouth,32\n").unwrap();
    let o = s
        .call(
            "session_start",
            json!({"language": "python", "files": [
                {"path": csv},
                {"path": csv, "name": "data/copy.csv"},
                {"content": "{\"rate\": 1.5}", "name": "config.json"}
            ]}),
        )
        .await;
    assert!(!o.is_error, "{}", o.text);
    assert_eq!(
        o.structured["files"],
        json!(["sales.csv", "data/copy.csv", "config.json"])
    );
    let id = o.s("session_id").to_string();
    let o = s
        .eval(
            &id,
            "import json, pandas as pd\ndf = pd.read_csv('sales.csv')\nprint(int(df.amount.sum() * json.load(open('config.json'))['rate']), len(pd.read_csv('data/copy.csv')))",
        )
        .await;
    assert_eq!(output(&o), "63 2\n");
    assert_eq!(
        o.structured.get("files"),
        None,
        "brought-in files are not news"
    );

    // Errors say what is wrong and start nothing.
    let bad: [(Value, &str); 6] = [
        (json!([{"path": host.path()}]), "is a directory"),
        (json!([{"path": "/no/such/file.csv"}]), "/no/such/file.csv"),
        (json!([{"content": "x"}]), "name is required"),
        (json!([{"content": "x", "name": "../escape.txt"}]), ".."),
        (json!([{"path": csv, "content": "x"}]), "either path"),
        (
            json!([{"content": "a", "name": "x.txt"}, {"content": "b", "name": "./x.txt"}]),
            "given twice",
        ),
    ];
    for (files, says) in bad {
        let o = s
            .call(
                "session_start",
                json!({"language": "python", "files": files}),
            )
            .await;
        assert_eq!(o.error_kind(), "invalid_argument", "{files}: {}", o.text);
        assert!(o.text.contains(says), "{files}: {}", o.text);
    }
    // Into a given cwd, nothing is overwritten.
    let o = s
        .call(
            "session_start",
            json!({"language": "python", "cwd": host.path(), "files": [{"path": csv}]}),
        )
        .await;
    assert_eq!(o.error_kind(), "invalid_argument", "{}", o.text);
    assert!(o.text.contains("already exists"), "{}", o.text);
    assert_eq!(
        s.call("session_list", json!({})).await.structured["sessions"]
            .as_array()
            .map(Vec::len),
        Some(1),
        "failed starts leave no session"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn no_session_reaches_into_the_server_workspace() {
    if !require("python", "python3") {
        return;
    }
    let parent = tempfile::tempdir().unwrap();
    let parent_s = parent.path().to_str().unwrap().to_string();
    let s = TestServer::start_with(&["--work-dir", &parent_s], &[]).await;
    let o = s.call("session_start", json!({"language": "python"})).await;
    let a = o.s("session_id").to_string();
    let a_dir = o.s("cwd").to_string();
    s.eval_ok(&a, "open('secret.txt', 'w').write('private to a')")
        .await;
    // A cwd inside the workspace (another session's directory) is refused, and so is one
    // that contains it: either would reach other sessions' files.
    for cwd in [a_dir.clone(), parent_s.clone()] {
        let o = s
            .call("session_start", json!({"language": "python", "cwd": cwd}))
            .await;
        assert_eq!(o.error_kind(), "invalid_argument", "{cwd}: {}", o.text);
        assert!(
            o.text.contains("overlaps the server's own working area"),
            "{}",
            o.text
        );
    }
    // And no resource of session a is reachable by a path that climbs out of it.
    let uri = format!("replbox://sessions/{a}/files/..%2F..%2F..");
    assert!(s.read(&uri).await.is_err());
    s.stop().await;
}
