//! Attacks on `session_inspect`, `session_vars`, `display()` and the end marker in node
//! sessions: values built so that reading them would run their own code (a Proxy up the
//! prototype chain, a getter shadowing an intrinsic accessor, `util.inspect.custom`, a
//! `constructor` getter, an accessor of the global object), values that would stop the
//! bootstrap from framing the evaluation's end, built-ins the session replaced, and JSON
//! whose size is more than its length. Each must be read without running any of it, and the
//! session must go on serving.

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
const custom = { [require("util").inspect.custom]() { mark("inspect.custom"); return "c"; } };
const ctor = Object.create({ get constructor() { mark("constructor"); return Object; } });
Object.defineProperty(globalThis, "acc", { get() { mark("global getter"); return 1; }, enumerable: true, configurable: true });
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
    // session_vars reads every name as session_inspect does: the Proxies, the getters, the
    // inspect.custom method and the global accessor above are named, never run.
    let vars = s.call("session_vars", json!({"session_id": id})).await;
    assert!(!vars.is_error, "{}", vars.text);
    let list = vars.structured["vars"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let entry = |name: &str| {
        list.iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("{name} not listed: {}", vars.text))
            .clone()
    };
    assert_eq!(entry("trap")["type"], "Proxy", "{}", vars.text);
    assert_eq!(entry("acc")["type"], "accessor", "{}", vars.text);
    assert_eq!(entry("custom")["type"], "Object", "{}", vars.text);
    assert_eq!(entry("u8")["size"], 4, "{}", vars.text);
    assert!(entry("odd")["type"].is_string(), "{}", vars.text);
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
    // JSON is bounded in bytes, not characters: a string of three-byte characters, or of
    // characters JSON escapes in six, is left out by the bootstrap within its 4 MiB, never
    // written for the server's read to refuse; a small one still comes back.
    let big = s
        .eval_t(
            &id,
            r#"display({s: "\u20ac".repeat(3.5e6)}, {t: "\u0001".repeat(1.1e6)}, {small: "\u20ac"})"#,
            60_000,
        )
        .await;
    assert_eq!(status(&big), "ok", "{}", big.text);
    assert!(
        !big.structured.to_string().contains("per display"),
        "{}",
        big.structured
    );
    let displays = big.structured["displays"].as_array().map(Vec::len);
    assert_eq!(displays, Some(1), "{}", big.structured);

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

    // The session replaces what a bootstrap would use to frame a cell: every later cell
    // still ends, with its value and its error printed, and session_vars and
    // session_inspect still answer.
    let broke = s
        .eval_t(
            &id,
            r#"const fsm = require("fs");
JSON.stringify = () => { throw new Error("JSON.stringify replaced"); };
Array.prototype.join = function () { return "joined"; };
String.prototype.replace = function () { return "replaced"; };
String.prototype.split = function () { return []; };
String.prototype.slice = function () { return "sliced"; };
Object.keys = () => { throw new Error("Object.keys replaced"); };
Object.assign = () => { throw new Error("Object.assign replaced"); };
Object.prototype.toJSON = function () { throw new Error("toJSON ran"); };
RegExp.prototype.exec = function () { return null; };
Buffer.prototype.toString = function () { return "buffer"; };
fsm.writeSync = () => { throw new Error("writeSync replaced"); };
globalThis.setImmediate = () => { throw new Error("setImmediate replaced"); };
process.stdout.write = function () { return true; };
undefined"#,
            20_000,
        )
        .await;
    assert_eq!(status(&broke), "ok", "{}", broke.text);
    let two = s.eval_t(&id, "1 + 1", 20_000).await;
    assert_eq!(status(&two), "ok", "{}", two.text);
    assert_eq!(output(&two), "2\n", "{}", two.text);
    let thrown = s.eval_t(&id, "throw new TypeError('boom')", 20_000).await;
    assert_eq!(status(&thrown), "error", "{}", thrown.text);
    assert_eq!(
        thrown.structured["error"]["type"], "TypeError",
        "{}",
        thrown.text
    );
    assert!(
        output(&thrown).contains("Uncaught TypeError: boom"),
        "{}",
        thrown.text
    );
    let shown = s.eval_t(&id, "display('shown'); 'value'", 20_000).await;
    assert_eq!(output(&shown), "shown\n'value'\n", "{}", shown.text);
    let vars = s.call("session_vars", json!({"session_id": id})).await;
    assert!(!vars.is_error, "{}", vars.text);
    assert!(
        vars.structured["vars"]
            .as_array()
            .is_some_and(|v| v.iter().any(|e| e["name"] == "mark")),
        "{}",
        vars.text
    );
    let r = inspect(&s, &id, "holder").await;
    assert!(!r.is_error && r.text.contains("x: "), "{}", r.text);
    // The session's own write is its own: console.log goes through it (here, nowhere) until
    // the session puts stdout's back.
    let own = s
        .eval_t(
            &id,
            "console.log('swallowed'); delete process.stdout.write; console.log('back')",
            20_000,
        )
        .await;
    assert_eq!(output(&own), "back\n", "{}", own.text);
    s.stop().await;
}

/// R: a function whose `srcref` names a source file environment of the session's making,
/// with its `lines` an active binding or a promise: `session_inspect` shows the function
/// without running either. A promise along a dotted path through an environment is shown
/// as its expression, not forced.
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
e3 <- new.env(); delayedAssign("later", { ran("dotted promise"); 42 }, assign.env = e3)
assign("plain", 7L, envir = e3)
invisible()"#,
        )
        .await;
    assert_eq!(status(&set), "ok", "{}", set.text);
    for name in ["f", "g"] {
        let r = inspect(&s, &id, name).await;
        assert!(!r.is_error, "{name}: {}", r.text);
        assert!(r.text.contains("function(x)"), "{name}: {}", r.text);
    }
    let r = inspect(&s, &id, "e3.later").await;
    assert!(!r.is_error, "{}", r.text);
    assert!(
        r.text.contains("dotted promise"),
        "its expression: {}",
        r.text
    );
    let r = inspect(&s, &id, "e3.plain").await;
    assert!(!r.is_error, "{}", r.text);
    assert_eq!(r.structured["details"]["head"][0], 7, "{}", r.text);
    let after = s.eval(&id, "cat(file.exists('ran'), '\\n')").await;
    assert_eq!(output(&after), "FALSE \n", "{}", after.text);
    s.stop().await;
}
