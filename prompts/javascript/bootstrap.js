// replbox's bootstrap for node's REPL (see docs/bootstrap-protocol.md). Before writing it
// into the session's control directory, replbox replaces the placeholders below, marked
// `:json`, by JavaScript string literals.
"use strict";
(() => {
  const repl = require("repl");
  const fs = require("fs");
  const vm = require("vm");
  const tty = require("tty");
  const { PassThrough } = require("stream");
  const path = require("path");
  const NONCE = {nonce:json};
  const CTL = {ctl:json};
  const CELL_FILE = {cell_file:json};
  const SELF = __filename;
  const LINE = /^__rbx_eval\((\d+)\)\s*$/;

  // Stack traces show the user's frames, not node's internals or this bootstrap.
  Error.prepareStackTrace = (err, frames) => {
    const keep = frames.filter((f) => {
      const file = f.getFileName() || "";
      return !(file.startsWith("node:") || file === SELF);
    });
    let head;
    try { head = Error.prototype.toString.call(err); } catch { head = String(err); }
    return head + keep.map((f) => "\n    at " + f).join("");
  };

  // The REPL reads its lines through its own descriptor for the terminal, opened between
  // evaluations and closed while one runs. So fd 0 belongs to the user's code: a program
  // reading it is visible under /proc (closing a descriptor takes it out of libuv's epoll
  // set at once, whereas a paused stream stays registered), and the REPL neither steals
  // its input nor resets the terminal mode it chose.
  const feed = new PassThrough();
  let source = null;
  function listen() {
    if (source) return;
    const fd = fs.openSync("/proc/self/fd/0", "r");
    source = new tty.ReadStream(fd);
    source.on("data", (d) => feed.write(d));
    source.on("error", () => {});
  }
  function unlisten() {
    if (!source) return;
    source.destroy();
    source = null;
  }

  // User code gets its own process.stdin, on a fresh descriptor, created on first use and
  // closed when the evaluation ends (an interface left open sees its input end). So only
  // the evaluation in flight ever reads the terminal besides the REPL, never both at once.
  let userStdin = null;
  Object.defineProperty(process, "stdin", {
    configurable: true,
    enumerable: true,
    get() {
      if (!userStdin) {
        userStdin = new tty.ReadStream(fs.openSync("/proc/self/fd/0", "r"));
        userStdin.on("error", () => {});
      }
      return userStdin;
    },
  });
  function closeStdin() {
    if (!userStdin) return;
    if (userStdin.isRaw) userStdin.setRawMode(false);
    userStdin.destroy();
    userStdin = null;
  }

  // session_vars: the names the user defined, each with a short summary, in the end
  // marker's payload. Globals are those not there once the REPL is up; let, const and
  // class declarations live in the global lexical scope, which only the inspector lists.
  const util = require("util");
  let inspectorSession = null;
  function lexicalNames() {
    try {
      if (!inspectorSession) {
        inspectorSession = new (require("inspector").Session)();
        inspectorSession.connect();
      }
      let names = [];
      inspectorSession.post("Runtime.globalLexicalScopeNames", {}, (err, res) => {
        if (!err && res && Array.isArray(res.names)) names = res.names;
      });
      return names;
    } catch {
      return [];
    }
  }
  function summarize(name, read) {
    let v;
    try { v = read(); } catch (e) { return { name, type: "uninitialized", summary: "" }; }
    let type = typeof v;
    if (v === null) type = "null";
    else if (type === "object" || type === "function") {
      try { type = (v.constructor && v.constructor.name) || type; } catch {}
      if (typeof v === "function") type = /^class\s/.test(Function.prototype.toString.call(v)) ? "class" : "function";
    }
    let summary;
    try {
      summary = util.inspect(v, { depth: 0, breakLength: Infinity, maxArrayLength: 5, maxStringLength: 60, colors: false });
      if (Array.isArray(v) || typeof v === "string") summary = "length " + v.length + ": " + summary;
      else if (v instanceof Map || v instanceof Set) summary = "size " + v.size + ": " + summary;
    } catch (e) {
      summary = "(no summary)";
    }
    const out = { name, type, summary: summary.slice(0, 200) };
    if (ArrayBuffer.isView(v)) out.size = v.byteLength;
    return out;
  }
  let baseline = null;
  Object.defineProperty(globalThis, "__rbx_vars", {
    enumerable: false,
    value: () => {
      if (!cur) return;
      const seen = new Set();
      const found = [];
      let used = 2, omitted = 0;
      const add = (name, read) => {
        if (seen.has(name) || name.startsWith("__rbx") || name === "_" || name === "_error") return;
        seen.add(name);
        const e = summarize(name, read);
        const cost = JSON.stringify(e).length + 1;
        if (used + cost > 11000) { omitted++; return; }
        used += cost;
        found.push(e);
      };
      for (const name of lexicalNames()) add(name, () => vm.runInThisContext(name));
      for (const name of Object.getOwnPropertyNames(globalThis)) {
        if (!baseline.has(name)) add(name, () => globalThis[name]);
      }
      cur.extra.vars = found;
      if (omitted) cur.extra.vars_omitted = omitted;
    },
  });

  const r = repl.start({
    input: feed,
    output: process.stdout,
    prompt: {prompt:json},
    terminal: false,
    useColors: false,
    ignoreUndefined: true,
    breakEvalOnSigint: true,
    preview: false,
    useGlobal: true,
  });
  // Look like a fresh `node` REPL.
  process.argv = [process.argv[0]];
  // How many lines the value of the cell takes (the REPL shows it with its writer), so a
  // notebook export can tell it from what the cell printed.
  const writer = r.writer;
  r.writer = function (v) {
    const text = writer.call(this, v);
    if (cur && !cur.done) cur.extra.value_lines = String(text).split("\n").length;
    return text;
  };
  Object.assign(r.writer, writer);
  r.writer.options = writer.options;
  const defaultEval = r.eval;
  let cur = null;
  // Ctrl-C. While the REPL runs the script, V8's SIGINT watchdog interrupts it, and no JS
  // listener may exist then (node removes them around the script, and removing the last
  // one resets SIGINT to its default, disarming the watchdog). While an evaluation
  // awaits, the interrupt goes to the REPL's queue, which rejects the awaited promise.
  // Between evaluations it is ignored (after the watchdog, node's default is to exit).
  let awaiting = false;
  const onSigint = () => {
    if (awaiting) r.emit("SIGINT");
  };
  function armSigint() {
    process.removeListener("SIGINT", onSigint);
    process.on("SIGINT", onSigint);
  }
  armSigint();
  // The cell's first statement announces that user code runs (under the watchdog), so the
  // server never interrupts before that. The server interrupts as soon as it reads the
  // marker, and the watchdog stops the script wherever it then is: the marker goes out
  // with one plain write, never through process.stdout, whose bookkeeping, if stopped
  // after the write and before its completion, would hold all later output (the end
  // marker, the prompt) back for ever.
  Object.defineProperty(globalThis, "__rbx_go", {
    enumerable: false,
    value: (n) => {
      fs.writeSync(1, "\x1b_rbx;" + NONCE + ";s;" + n + "\x1b\\");
    },
  });
  function prefixed(src, n) {
    // The REPL evaluates `{ a: 1 }` as an object literal; keep that when prefixing.
    if (/^\s*\{/.test(src) && /\}\s*;?\s*$/.test(src)) {
      try {
        new vm.Script("(" + src + ")");
        src = "(" + src + ")";
      } catch {}
    }
    return "__rbx_go(" + n + ");" + src;
  }

  function describe(e) {
    if (e && e.code === "ERR_SCRIPT_EXECUTION_INTERRUPTED") return ["interrupted", null];
    const type = (e && e.name) || typeof e;
    let message;
    try { message = e && e.message !== undefined ? String(e.message) : String(e); } catch { message = "?"; }
    return ["error", { type, message: message.slice(0, 2000) }];
  }
  // The watchdog stops the script wherever it is, possibly inside a write to the terminal
  // after the stream marked it in flight and before it recorded its completion: the stream
  // would then hold all later output (the error, the end marker, the prompt) back for ever.
  // Writes to a terminal complete synchronously, so once the script has stopped none is
  // really in flight: complete the stuck one (its bytes went out, or went with the script).
  function unstick(e) {
    if (!e || e.code !== "ERR_SCRIPT_EXECUTION_INTERRUPTED") return;
    for (const s of [r.output, process.stderr]) {
      const st = s && s.isTTY && s._writableState;
      if (st && st.writing && typeof st.onwrite === "function") {
        try { st.onwrite(null); } catch {}
      }
    }
  }
  function fail(c, e) {
    if (c.status !== "ok") return;
    const [status, info] = describe(e);
    c.status = status;
    c.err = info;
  }
  function finish(c) {
    if (c.done) return;
    c.done = true;
    awaiting = false;
    armSigint();
    clearInterval(c.alive);
    closeStdin();
    listen();
    // Let pending rejections of this evaluation be reported first.
    setImmediate(() => {
      if (cur === c) cur = null;
      const body = Object.assign({}, c.err || {}, c.extra);
      const payload = Object.keys(body).length ? Buffer.from(JSON.stringify(body)).toString("base64") : "";
      process.stdout.write("\x1b_rbx;" + NONCE + ";e;" + c.n + ";" + c.status + ";" + payload + "\x1b\\");
    });
  }
  // Thrown errors and unhandled rejections reach the REPL's domain, not the callback.
  r._domain.prependListener("error", (e) => {
    unstick(e);
    if (cur) {
      fail(cur, e);
      finish(cur);
    }
  });

  listen();
  baseline = new Set(Object.getOwnPropertyNames(globalThis));

  r.eval = function (cmd, context, file, cb) {
    const m = LINE.exec(cmd);
    if (!m) return defaultEval.call(this, cmd, context, file, cb);
    const c = { n: m[1], status: "ok", err: null, done: false, extra: {} };
    cur = c;
    unlisten();
    // With the REPL's descriptor closed, something must keep the event loop alive while
    // the evaluation awaits.
    c.alive = setInterval(() => {}, 1 << 30);
    process.removeListener("SIGINT", onSigint);
    let src;
    try {
      src = fs.readFileSync(path.join(CTL, CELL_FILE.replace("{n}", c.n)), "utf8");
    } catch (e) {
      fail(c, e);
      cb(e);
      finish(c);
      return;
    }
    try {
      defaultEval.call(this, prefixed(src, c.n), context, "<cell " + c.n + ">", (e, res) => {
        if (e instanceof repl.Recoverable) e = e.err;
        unstick(e);
        if (e) fail(c, e);
        cb(e, res);
        finish(c);
      });
    } catch (e) {
      fail(c, e);
      cb(e);
      finish(c);
    }
    if (!c.done) {
      awaiting = true;
      armSigint();
    }
  };
})();
