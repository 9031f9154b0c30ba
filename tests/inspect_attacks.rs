//! Attacks on `session_inspect` and the end marker in node sessions: values built so that
//! reading them would run their own code (a Proxy up the prototype chain, a getter shadowing
//! an intrinsic accessor), and values that would stop the bootstrap from framing the
//! evaluation's end. Each must be read without running any of it, and the session must go
//! on serving.

use crate::common;

use common::*;
use serde_json::json;

/// `session_inspect` on one name.
async fn inspect(s: &TestServer, id: &str, name: &str) -> Out {
    s.call("session_inspect", json!({"session_id": id, "name": name}))
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn javascript_inspect_runs_no_trap_up_the_chain_and_odd_errors_still_end_the_cell() {
    if !require("javascript", "node") {
        return;
    }
    let s = TestServer::start().await;
    let id = s.start_session("javascript").await;
    // Every trap and getter leaves its name in the file `ran`.
    let set = s
        .eval(
            &id,
            r#"const mark = (w) => require("fs").appendFileSync("ran", w + "\n");
const trap = new Proxy({}, {
  ownKeys() { mark("ownKeys"); return []; },
  getPrototypeOf() { mark("getPrototypeOf"); return null; },
  getOwnPropertyDescriptor() { mark("getOwnPropertyDescriptor"); return undefined; },
  get() { mark("get"); return undefined; },
  has() { mark("has"); return false; },
});
const onProxy = Object.create(trap); onProxy.a = 1;
const holder = { x: onProxy };
const u8 = new Uint8Array(4);
Object.defineProperty(u8, "byteLength", { get() { mark("byteLength"); return 4; } });
const u8p = new Uint8Array(4); Object.setPrototypeOf(u8p, trap);
const arrp = [1, 2]; Object.setPrototypeOf(arrp, trap);
class Odd { static name = 1n; }
const bigs = new String("x".repeat(3e7));
const odd = new Odd();
undefined"#,
        )
        .await;
    assert_eq!(status(&set), "ok", "{}", set.text);
    for (name, repr_has) in [
        ("onProxy", "a: 1"),
        ("holder", "x: "),
        ("u8", ""),
        ("u8p", ""),
        ("arrp", ""),
    ] {
        let r = inspect(&s, &id, name).await;
        assert!(!r.is_error, "{name}: {}", r.text);
        assert!(r.text.contains(repr_has), "{name}: {}", r.text);
    }
    let after = s
        .eval(
            &id,
            "console.log(JSON.stringify(require('fs').existsSync('ran') ? require('fs').readFileSync('ran', 'utf8') : ''))",
        )
        .await;
    assert_eq!(
        output(&after),
        "\"\"\n",
        "traps or getters ran: {}",
        after.text
    );
    // A String object is its text, not thirty million index keys: the inspection neither
    // runs out of memory nor out of time, and the session keeps its state.
    let r = inspect(&s, &id, "bigs").await;
    assert!(!r.is_error, "{}", r.text);
    assert_eq!(r.structured["details"]["len"], 30_000_000, "{}", r.text);
    // A class whose name is not a string leaves session_vars' list intact (session_vars,
    // unlike session_inspect, reads through the values' own getters).
    let vars = s.call("session_vars", json!({"session_id": id})).await;
    assert!(!vars.is_error, "{}", vars.text);
    assert!(vars.text.contains("odd"), "{}", vars.text);

    // A thrown value whose name is not a string (a BigInt, a cycle) still ends the cell with
    // its error, and the next cell runs in the same session.
    for code in [
        "throw { name: 1n, message: 'big' }",
        "const c = {}; c.c = c; throw { name: c, message: 'cyc' }",
    ] {
        let r = s.eval_t(&id, code, 20_000).await;
        assert_eq!(status(&r), "error", "{code}: {}", r.text);
    }
    let after = s.eval(&id, "console.log(typeof mark)").await;
    assert_eq!(output(&after), "function\n", "{}", after.text);
    s.stop().await;
}

/// R: a function whose `srcref` names a source file environment of the session's making,
/// with its `lines` an active binding or a promise: `session_inspect` shows the function
/// without running either.
#[tokio::test(flavor = "multi_thread")]
async fn r_inspect_runs_no_binding_or_promise_of_a_forged_srcfile() {
    if !require("r", "R") {
        return;
    }
    let s = TestServer::start().await;
    let id = s.start_session("r").await;
    let set = s
        .eval(
            &id,
            r#"ran <- function(w) cat(w, "\n", file = "ran", append = TRUE)
f <- function(x) x + 1
e <- new.env(); makeActiveBinding("lines", function() { ran("active"); "function(x) x + 1" }, e)
attr(f, "srcref") <- structure(c(1L, 1L, 1L, 18L, 1L, 18L, 1L, 1L), srcfile = e, class = "srcref")
g <- function(x) x
e2 <- new.env(); delayedAssign("lines", { ran("promise"); "function(x) x" }, assign.env = e2)
attr(g, "srcref") <- structure(c(1L, 1L, 1L, 14L, 1L, 14L, 1L, 1L), srcfile = e2, class = "srcref")
invisible()"#,
        )
        .await;
    assert_eq!(status(&set), "ok", "{}", set.text);
    for name in ["f", "g"] {
        let r = inspect(&s, &id, name).await;
        assert!(!r.is_error, "{name}: {}", r.text);
        assert!(r.text.contains("function(x)"), "{name}: {}", r.text);
    }
    let after = s.eval(&id, "cat(file.exists('ran'), '\\n')").await;
    assert_eq!(output(&after), "FALSE \n", "{}", after.text);
    s.stop().await;
}
