//! R sessions beyond the conformance rows of tests/languages.rs, through the MCP client:
//! plots come back as PNG images and SVG links (base graphics, grid, ggplot2 when
//! installed), data frames
//! print wide, errors carry the condition's class, interrupts (at the deadline, of a
//! readline, by SIGINT at the prompt) keep the state; and `run-code` runs R through Rscript.

use crate::common;

use std::time::Duration;

use base64::Engine;
use common::*;
use serde_json::json;

fn r() -> bool {
    require("r", "R")
}

/// An R package the test needs: a printed skip without it (a failure in CI).
fn r_package(name: &str) -> bool {
    let ok = std::process::Command::new("Rscript")
        .args([
            "-e",
            &format!("quit(status = !requireNamespace('{name}', quietly = TRUE))"),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        skip(format!("R package {name} is not installed"));
    }
    ok
}

/// The PNG images of a result: (figure name, width, height) from the structured result,
/// each checked to be the PNG attached.
fn images(o: &Out) -> Vec<(String, u64, u64)> {
    let listed = o.structured["images"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(listed.len(), o.images.len(), "{}", o.structured);
    for (mime, data) in &o.images {
        assert_eq!(mime, "image/png");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data)
            .expect("base64");
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    }
    listed
        .iter()
        .map(|i| {
            (
                i["name"].as_str().unwrap_or("?").to_string(),
                i["width"].as_u64().unwrap_or(0),
                i["height"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

fn names(o: &Out) -> Vec<String> {
    images(o).into_iter().map(|i| i.0).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn plots_come_back_as_png_images() {
    if !r() {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("r").await;
    let o = s.eval(&id, "plot(1:10, main = 'one')").await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    assert_eq!(
        images(&o),
        vec![("figure-1.png".to_string(), 672, 480)],
        "{}",
        o.text
    );
    assert!(o.text.contains("[images attached: figure-1.png (672x480)]"));
    // Its SVG is kept too, as a resource the result links to (not a second image).
    assert_eq!(
        o.structured["displays"][0]["mime_types"],
        json!(["image/svg+xml"]),
        "{}",
        o.structured
    );
    let uri = o.structured["displays"][0]["uris"][0]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        uri.starts_with(&format!("replbox://sessions/{id}/displays/")) && uri.ends_with(".svg"),
        "{uri}"
    );
    let svg = s
        .client
        .peer()
        .read_resource(rmcp::model::ReadResourceRequestParams::new(&uri))
        .await
        .expect("the SVG is readable");
    let svg = serde_json::to_value(&svg.contents[0]).expect("json");
    assert_eq!(svg["mimeType"], "image/svg+xml");
    assert!(svg["text"].as_str().unwrap_or("").contains("<svg"), "{svg}");
    // The page is still open: adding to it sends it again, under its number; a cell that
    // does not draw sends nothing.
    let o = s.eval(&id, "abline(h = 5)").await;
    assert_eq!(names(&o), ["figure-1.png"], "{}", o.text);
    let o = s.eval(&id, "y <- 2").await;
    assert!(o.images.is_empty(), "{}", o.text);
    // Every page a cell finishes comes back, in order, each under a new number; several
    // plots on one page are one; par() alone changes no picture (page 1 is not sent again).
    let o = s
        .eval(
            &id,
            "par(mfrow = c(1, 2)); plot(1); plot(2); plot(3); par(mfrow = c(1, 1)); hist(c(1, 2, 2, 3))",
        )
        .await;
    assert_eq!(
        names(&o),
        ["figure-2.png", "figure-3.png", "figure-4.png"],
        "{}",
        o.text
    );
    // grid graphics (what lattice and ggplot2 draw with).
    let o = s
        .eval(
            &id,
            "grid::grid.newpage(); grid::grid.rect(); grid::grid.text('grid')",
        )
        .await;
    assert_eq!(names(&o), ["figure-5.png"], "{}", o.text);
    // The cap: the first --max-images (8) come back, the rest are counted; their SVGs are
    // links, not counted as images. options(replbox.svg = FALSE) keeps the PNGs alone.
    let o = s.eval(&id, "for (i in 1:10) plot(i)").await;
    assert_eq!(o.images.len(), 8, "{}", o.text);
    assert_eq!(o.structured["images_omitted"], 2, "{}", o.structured);
    assert_eq!(
        o.structured["displays"].as_array().map(Vec::len),
        Some(8),
        "{}",
        o.structured
    );
    let o = s.eval(&id, "plot(runif(1e5))").await;
    assert_eq!(o.images.len(), 1, "{}", o.text);
    assert!(
        o.structured.get("displays").is_none(),
        "100,000 points get no SVG: {}",
        o.structured
    );
    let o = s.eval(&id, "options(replbox.svg = FALSE); plot(1)").await;
    assert_eq!(o.images.len(), 1, "{}", o.text);
    assert!(o.structured.get("displays").is_none(), "{}", o.structured);
    // A file device of the code's own is its business: the file is listed, not attached.
    let o = s
        .eval(&id, "png('mine.png'); plot(1); invisible(dev.off())")
        .await;
    assert!(o.images.is_empty(), "{}", o.text);
    let files = o.structured["files"].to_string();
    assert!(files.contains("mine.png"), "{files}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ggplot2_plots_come_back() {
    if !r() || !r_package("ggplot2") {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("r").await;
    let o = s
        .eval_t(
            &id,
            "library(ggplot2)\np <- ggplot(mtcars, aes(wt, mpg)) + geom_point()",
            60_000,
        )
        .await;
    assert_eq!(status(&o), "ok", "{}", o.text);
    assert!(
        o.images.is_empty(),
        "an unprinted plot draws nothing: {}",
        o.text
    );
    let o = s.eval_t(&id, "p", 60_000).await;
    assert_eq!(names(&o), ["figure-1.png"], "{}", o.text);
    assert_eq!(
        o.structured["displays"][0]["mime_types"],
        json!(["image/svg+xml"]),
        "ggplot2's plot has its SVG: {}",
        o.structured
    );
    let o = s
        .eval_t(&id, "print(p); print(p + ggtitle('again'))", 60_000)
        .await;
    assert_eq!(names(&o), ["figure-2.png", "figure-3.png"], "{}", o.text);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn data_frames_print_wide() {
    if !r() {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("r").await;
    let o = s
        .eval(
            &id,
            "df <- as.data.frame(matrix(1:30, nrow = 2, dimnames = list(NULL, paste0('column_', 1:15))))\ndf",
        )
        .await;
    let lines: Vec<&str> = output(&o).lines().collect();
    // 15 columns of 9 characters: one block, a header and two rows (80 columns would wrap
    // it into two blocks).
    assert_eq!(lines.len(), 3, "{}", output(&o));
    assert!(lines[0].ends_with("column_15"), "{}", lines[0]);
    assert!(
        lines[2].starts_with("2 ") && lines[2].ends_with("30"),
        "{}",
        lines[2]
    );
    let o = s.eval(&id, "getOption('width')").await;
    assert_eq!(output(&o), "[1] 200\n");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn errors_have_the_condition_class_and_print_as_at_a_prompt() {
    if !r() {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("r").await;
    let error = |o: &Out| {
        (
            status(o).to_string(),
            o.structured["error"]["type"]
                .as_str()
                .unwrap_or("?")
                .to_string(),
            o.structured["error"]["message"]
                .as_str()
                .unwrap_or("?")
                .to_string(),
        )
    };
    // In a function: R's own report, and traceback() shows the code's calls only.
    let o = s
        .eval(
            &id,
            "f <- function() stop('boom')\ng <- function() f()\ng()",
        )
        .await;
    assert_eq!(
        error(&o),
        ("error".into(), "simpleError".into(), "boom".into())
    );
    assert_eq!(output(&o), "Error in f() : boom\n");
    let o = s.eval(&id, "traceback()").await;
    assert_eq!(
        output(&o),
        "3: stop(\"boom\") at <cell 1>#1\n2: f() at <cell 1>#2\n1: g()\n"
    );
    // At the cell's top level, as at a prompt.
    let o = s.eval(&id, "undefined_thing").await;
    assert_eq!(
        error(&o),
        (
            "error".into(),
            "simpleError".into(),
            "object 'undefined_thing' not found".into()
        )
    );
    assert_eq!(output(&o), "Error: object 'undefined_thing' not found\n");
    // A condition class of the code's own.
    let o = s
        .eval(
            &id,
            "cond <- structure(class = c('myError', 'error', 'condition'), list(message = 'mine', call = NULL))\nstop(cond)",
        )
        .await;
    assert_eq!(error(&o), ("error".into(), "myError".into(), "mine".into()));
    // The first error ends the cell; what ran before it stays done.
    let o = s.eval(&id, "a <- 1\nstop('halt')\na <- 2").await;
    assert_eq!(status(&o), "error");
    let o = s.eval(&id, "a").await;
    assert_eq!(output(&o), "[1] 1\n");
    // A syntax error runs nothing and names the cell.
    let o = s.eval(&id, "a <- 3\nx y").await;
    assert_eq!(status(&o), "error");
    assert!(
        output(&o).starts_with("Error: <cell 7>:2:3: unexpected symbol"),
        "{}",
        output(&o)
    );
    let o = s.eval(&id, "a").await;
    assert_eq!(output(&o), "[1] 1\n");
    // Warnings print after the value, as R prints them after a top-level call; a warning
    // is not an error; with an error they follow it ("In addition").
    let o = s.eval(&id, "log(-1)").await;
    assert_eq!(
        (status(&o), output(&o)),
        (
            "ok",
            "[1] NaN\nWarning message:\nIn log(-1) : NaNs produced\n"
        )
    );
    let o = s.eval(&id, "warnings()").await;
    assert_eq!(output(&o), "Warning message:\nIn log(-1) : NaNs produced\n");
    let o = s
        .eval(
            &id,
            "h <- function() { warning('careful'); stop('broke') }\nh()",
        )
        .await;
    assert_eq!(
        output(&o),
        "Error in h() : broke\nIn addition: Warning message:\nIn h() : careful\n"
    );
    // .Last.value is the last value, as at a prompt.
    let o = s.eval(&id, "invisible(7)").await;
    assert_eq!(output(&o), "");
    let o = s.eval(&id, ".Last.value").await;
    assert_eq!(output(&o), "[1] 7\n");
    s.stop().await;
}

/// Whether `pid` has SIGINT pending (not yet delivered).
fn sigint_pending(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().any(|l| {
        (l.starts_with("SigPnd:") || l.starts_with("ShdPnd:"))
            && l.split_whitespace()
                .nth(1)
                .and_then(|m| u64::from_str_radix(m, 16).ok())
                .is_some_and(|m| m & (1 << (libc::SIGINT - 1)) != 0)
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn interrupts_keep_the_state() {
    if !r() {
        return;
    }
    let s = Server::stdio().start().await;
    let o = s.call("session_start", json!({"language": "r"})).await;
    assert!(!o.is_error, "{}", o.text);
    let id = o.s("session_id").to_string();
    let pid = o.structured["pid"].as_u64().expect("pid") as u32;
    let o = s.eval(&id, "x <- 41").await;
    assert_eq!(status(&o), "ok");
    // At the deadline: a sleep, a busy loop, a long computation in R code.
    for code in [
        "Sys.sleep(60)",
        "while (TRUE) x2 <- 1",
        "for (i in 1:1e9) x3 <- i",
    ] {
        let o = s.eval_t(&id, code, 1000).await;
        assert_eq!(status(&o), "timeout", "{code}: {}", o.text);
        assert_eq!(o.structured.get("restarted"), None, "{code}");
        let o = s.eval(&id, "x + 1").await;
        assert_eq!(output(&o), "[1] 42\n", "{code}");
    }
    // A readline() that waits, interrupted on request.
    let o = s.eval(&id, "answer <- readline('? ')").await;
    assert_eq!(status(&o), "awaiting_input", "{}", o.text);
    let o = s.call("session_interrupt", json!({"session_id": id})).await;
    assert_eq!(o.structured["interrupted"], true, "{}", o.text);
    let o = s.eval(&id, "exists('answer')").await;
    assert_eq!(output(&o), "[1] FALSE\n");
    // SIGINT at the prompt (as a late Ctrl-C would be): R stays, with its state.
    if nix::unistd::geteuid().is_root() {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGINT,
        )
        .expect("kill");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while sigint_pending(pid) && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!sigint_pending(pid), "SIGINT never delivered");
        let o = s.eval(&id, "x + 1").await;
        assert_eq!(status(&o), "ok", "{}", o.text);
        assert!(output(&o).ends_with("[1] 42\n"), "{}", output(&o));
        assert_eq!(o.structured["session_id"], id.as_str());
    } else {
        skip_optional("SIGINT at the prompt: the session runs as another uid");
    }
    s.stop().await;
}

/// What the bootstrap runs in every cell is compiled before the first cell. R's JIT compiles
/// the bootstrap's functions at their second call, the first being the resynchronising cell
/// at start: left to it, what runs between a cell's expressions was compiled between the
/// first cell's first two expressions, and `run` itself after the first cell's line was
/// typed and before its code started (0.16-0.43 s at load 13), inside the cell's deadline: a
/// deadline meant to find the cell in its code could stop it before that code started. Asked
/// in one expression, which runs before any of them is called again; `run` is not asked (it
/// is the call this cell runs in, compiled by then either way).
#[tokio::test(flavor = "multi_thread")]
async fn what_runs_in_every_cell_is_compiled_before_the_first_cell() {
    if !r() {
        return;
    }
    let s = Server::stdio().start().await;
    let id = s.start_session("r").await;
    let o = s
        .eval(
            &id,
            "cat(paste(c('not compiled:', Filter(function(f) !any(grepl('^<bytecode', \
             capture.output(print(get(f, environment(.rbx_eval)))))), \
             c('finish', 'drop_late', 'set_last', 'show', 'publish', 'print_warnings', \
             'snapshot', 'render', 'discard_unread', 'user_calls', 'emit', 'payload', 'js'))), \
             collapse = ' '), '\\n', sep = '')",
        )
        .await;
    assert_eq!(
        (status(&o), output(&o)),
        ("ok", "not compiled:\n"),
        "{}",
        o.text
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn run_code_runs_r_with_rscript() {
    if !require("r", "Rscript") {
        return;
    }
    let s = Server::stdio().start().await;
    let o = s.run("r", "x <- 6 * 7\ncat(x, '\\n')\nprint(x)").await;
    assert_eq!(o.text, "42 \n[1] 42\n", "{}", o.text);
    assert_eq!(o.structured["interpreter"]["why"], "path");
    let o = s.run("R", "stop('broken')").await;
    assert!(o.is_error);
    assert_eq!(o.structured["exit_code"], 1, "{}", o.structured);
    assert!(
        o.s("stderr").starts_with("Error: broken"),
        "{}",
        o.s("stderr")
    );
    let o = s.run("r", "quit(status = 4)").await;
    assert_eq!(o.structured["exit_code"], 4, "{}", o.structured);
    s.stop().await;
}
