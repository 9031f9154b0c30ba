// replbox's bootstrap for node's REPL (see docs/bootstrap-protocol.md). Before writing it
// into the session's control directory, replbox replaces the placeholders below, marked
// `:json`, by JavaScript string literals.
"use strict";
// The bootstrap runs under the script name "repl" rather than this file's path, so that no
// output (a stack trace node prints itself, as process.abort() does) names replbox's files.
require("vm").runInThisContext("(" + main.toString() + ")", { filename: "repl" })(require);

function main(require) {
  "use strict";
  const repl = require("repl");
  const fs = require("fs");
  const vm = require("vm");
  const tty = require("tty");
  const { PassThrough } = require("stream");
  const path = require("path");
  const NONCE = {nonce:json};
  const CTL = {ctl:json};
  const CELL_FILE = {cell_file:json};
  const INPUT_FILE = {input_file:json};
  const PROMPT = {prompt:json};
  const SELF = "repl";
  const LINE = /^__rbx_eval\((\d+)\)\s*$/;

  // Markers go to a descriptor of their own on the terminal, so code that closes or
  // redirects stdout cannot swallow them.
  const { O_WRONLY, O_RDONLY, O_NOCTTY, O_NONBLOCK } = fs.constants;
  const TTY = fs.fstatSync(1).rdev;
  let markFd = fs.openSync("/dev/tty", O_WRONLY | O_NOCTTY);
  function tell(text) {
    try {
      const st = fs.fstatSync(markFd);
      if (!st.isCharacterDevice() || st.rdev !== TTY) throw new Error("not the terminal");
    } catch {
      // Closed, or its number reused by the code for something else: leave that alone.
      try { markFd = fs.openSync("/dev/tty", O_WRONLY | O_NOCTTY); } catch { return; }
    }
    try { fs.writeSync(markFd, text); } catch {}
  }

  // Input typed into the cell (replbox says so with a file) that the program did not read
  // would be the REPL's next line: read the whole lines of it out of the terminal and count
  // them (replbox discards a line without Enter itself before typing the next cell).
  function discardUnread(n) {
    if (!fs.existsSync(path.join(CTL, INPUT_FILE.replace("{n}", n)))) return 0;
    let count = 0;
    let fd = -1;
    try {
      fd = fs.openSync("/proc/self/fd/0", O_RDONLY | O_NOCTTY | O_NONBLOCK);
      const buf = Buffer.alloc(65536);
      for (let k; count < 1 << 24 && (k = fs.readSync(fd, buf)) > 0; ) count += k;
    } catch {
      // EAGAIN: nothing more to read.
    } finally {
      if (fd >= 0) fs.closeSync(fd);
    }
    return count;
  }

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
    prompt: PROMPT,
    terminal: false,
    useColors: false,
    ignoreUndefined: true,
    breakEvalOnSigint: true,
    preview: false,
    useGlobal: true,
  });
  // Look like a fresh `node` REPL.
  process.argv = [process.argv[0]];
  try { repl.repl = r; } catch {}
  // `.exit` (and the end of the REPL's input) ends node, as the `node` REPL does.
  r.on("exit", () => process.exit());
  // The prompt is ours between cells (replbox recognises it) and the user's while a cell
  // runs: `repl.repl.setPrompt('$ ')` is kept for the cell that reads it, never printed.
  let userPrompt = "> ";
  let mine = true;
  function ownPrompt() {
    if (mine) return;
    userPrompt = r.getPrompt();
    r.setPrompt(PROMPT);
    mine = true;
  }
  function giveUserPrompt() {
    r.setPrompt(userPrompt);
    mine = false;
  }
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
  // Ctrl-C. While the REPL runs the script, V8's SIGINT watchdog interrupts it. While an
  // evaluation awaits, the interrupt goes to the REPL's queue, which rejects the awaited
  // promise. Between evaluations, and as the script ends, it is too late for the cell and
  // changes nothing (the REPL's own answer, "(To exit, press Ctrl+C again...)", is
  // replaced).
  //
  // The watchdog, when its last user stops it, puts node's default back: exit on SIGINT,
  // until a JS listener installs a handler again (only the first listener does); an
  // interrupt in between ended node. So the bootstrap holds the watchdog too: the REPL's
  // stop after the script is never the last, the watchdog's handler stays, and a SIGINT
  // outside a script is only noted. A cell that awaits gets a listener (its handler
  // replaces the watchdog's at once), kept until just before the next script, where the
  // bootstrap lets the watchdog go so that the REPL's start installs it again (no
  // interrupt is sent before the cell's start marker). Where node does not offer the
  // watchdog to JS, the listener is taken away just before each script and put back first
  // thing after it.
  let awaiting = false;
  let watchdog = null;
  let held = false;
  let listened = false;
  try {
    const b = process.binding("contextify");
    if (b.startSigintWatchdog()) {
      watchdog = b;
      held = true;
    }
  } catch {}
  const onSigint = () => {
    if (awaiting) r.emit("SIGINT");
  };
  function listenSigint() {
    if (!process.listeners("SIGINT").includes(onSigint)) process.on("SIGINT", onSigint);
  }
  function armSigint() {
    if (!watchdog) listenSigint();
  }
  function beforeScript() {
    process.removeListener("SIGINT", onSigint);
    if (watchdog && listened) {
      listened = false;
      if (held) watchdog.stopSigintWatchdog();
      held = false;
    }
  }
  function scriptEnded() {
    if (watchdog && !held) held = watchdog.startSigintWatchdog();
  }
  function whileAwaiting() {
    if (watchdog) listened = true;
    listenSigint();
  }
  armSigint();
  const replSigint = r.listeners("SIGINT");
  r.removeAllListeners("SIGINT");
  r.on("SIGINT", () => {
    // While a cell awaits, the REPL's handler rejects the awaited promise.
    if (awaiting) for (const l of replSigint) l.call(r);
  });
  // The REPL's evaluator arms V8's SIGINT watchdog, then switches the terminal out of raw
  // mode (a method of the REPL, looked up on it) and runs the script: that switch is the
  // moment the cell starts, and the server may interrupt it from then on. The code itself
  // is evaluated as typed, so a 'use strict' directive and error positions are its own.
  const setRawMode = r._setRawMode;
  // Its second call, in the evaluator's `finally`, comes as the script ends, before the
  // REPL stops the watchdog.
  r._setRawMode = function (mode) {
    if (cur && cur.inScript && ++cur.raw === 2) scriptEnded();
    if (cur && !cur.started && mode === false) {
      cur.started = true;
      tell("\x1b_rbx;" + NONCE + ";s;" + cur.n + "\x1b\\");
    }
    return setRawMode.call(this, mode);
  };

  // REPL commands (`.help`, `.load file`, `.exit`) on the cell's first lines run as the
  // REPL runs them; the rest is code, with its line numbers kept.
  function splitCommands(src) {
    const lines = src.split("\n");
    const commands = [];
    let i = 0;
    for (; i < lines.length; i++) {
      const t = lines[i].trim();
      if (!t) continue;
      const m = /^\.([^\s]+)\s*(.*)$/.exec(t);
      if (t[1] === "." || !Number.isNaN(Number.parseFloat(t)) || !m) break;
      commands.push([m[1], m[2]]);
      lines[i] = "";
    }
    return { commands, code: commands.length ? lines.join("\n") : src };
  }

  // Keep the cell's lines, not the typed `__rbx_eval(N)`, in the REPL's record (`.save`).
  function remember(c) {
    const i = r.lines.findLastIndex((l) => l.trim() === c.line);
    if (i >= 0) r.lines.splice(i, 1, ...c.src.replace(/\n$/, "").split("\n"));
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
    const unread = discardUnread(c.n);
    ownPrompt();
    remember(c);
    listen();
    // Let pending rejections of this evaluation be reported first.
    setImmediate(() => {
      if (cur === c) cur = null;
      const body = Object.assign({}, c.err || {}, c.extra);
      if (unread) body.unread = unread;
      const payload = Object.keys(body).length ? Buffer.from(JSON.stringify(body)).toString("base64") : "";
      tell("\x1b_rbx;" + NONCE + ";e;" + c.n + ";" + c.status + ";" + payload + "\x1b\\");
    });
  }
  // Thrown errors and unhandled rejections reach the REPL's domain, not the callback. One
  // thrown by a callback (a timer, an event) while the cell still awaits is the cell's
  // error, shown in it as the REPL shows it, and the cell goes on to its own end: its later
  // output and value belong to it, not to whichever cell runs next. The REPL's answer to
  // it ends by showing the prompt, which would land in the cell's output: not then.
  let promptHeld = false;
  const displayPrompt = r.displayPrompt;
  r.displayPrompt = function (...args) {
    if (promptHeld) return;
    return displayPrompt.apply(this, args);
  };
  // The REPL itself reports the cell's own error (thrown, or the awaited promise's
  // rejection); anything else (a callback's throw, a rejection nobody handled) comes from
  // the event loop.
  function fromRepl() {
    const saved = Error.prepareStackTrace;
    const limit = Error.stackTraceLimit;
    const here = {};
    try {
      Error.prepareStackTrace = (_, frames) => frames;
      Error.stackTraceLimit = 16;
      Error.captureStackTrace(here, fromRepl);
      return here.stack.some((f) => f.getFileName() === "node:repl");
    } catch {
      return true;
    } finally {
      Error.prepareStackTrace = saved;
      Error.stackTraceLimit = limit;
    }
  }
  r._domain.prependListener("error", (e) => {
    unstick(e);
    if (!cur) return;
    fail(cur, e);
    if (awaiting && !cur.done && !fromRepl()) promptHeld = true;
    else finish(cur);
  });
  r._domain.on("error", () => {
    promptHeld = false;
  });

  // `await replbox.install('pkg')` on a line of its own at the top of a cell is done by
  // replbox's server before the cell runs; anywhere else it says so.
  Object.defineProperty(globalThis, "replbox", {
    enumerable: false,
    configurable: true,
    writable: true,
    value: Object.freeze({
      install: () => Promise.reject(new Error(
        "replbox.install works as a line of its own at the top of a cell, with string " +
        "literals: await replbox.install('lodash', 'is-odd@3')")),
    }),
  });
  listen();
  baseline = new Set(Object.getOwnPropertyNames(globalThis));

  r.eval = function (cmd, context, file, cb) {
    const m = LINE.exec(cmd);
    if (!m) return defaultEval.call(this, cmd, context, file, cb);
    const c = { n: m[1], line: cmd.trim(), src: "", status: "ok", err: null, done: false, extra: {},
      inScript: false, raw: 0 };
    cur = c;
    unlisten();
    giveUserPrompt();
    // With the REPL's descriptor closed, something must keep the event loop alive while
    // the evaluation awaits.
    c.alive = setInterval(() => {}, 1 << 30);
    let src;
    try {
      src = fs.readFileSync(path.join(CTL, CELL_FILE.replace("{n}", c.n)), "utf8");
    } catch (e) {
      fail(c, e);
      ownPrompt();
      cb(e);
      finish(c);
      return;
    }
    c.src = src;
    const { commands, code } = splitCommands(src);
    if (commands.length) {
      r._setRawMode(false);
      // A command ends by showing the prompt: ours, which is no output.
      ownPrompt();
      for (const [keyword, rest] of commands) {
        const command = r.commands[keyword];
        if (command) command.action.call(r, rest);
        else r.output.write("Invalid REPL keyword\n");
      }
      giveUserPrompt();
      if (!code.trim()) {
        ownPrompt();
        cb(null);
        finish(c);
        return;
      }
    }
    try {
      beforeScript();
      c.inScript = true;
      defaultEval.call(this, code, context, "<cell " + c.n + ">", (e, res) => {
        armSigint();
        if (e instanceof repl.Recoverable) e = e.err;
        unstick(e);
        if (e) fail(c, e);
        ownPrompt();
        cb(e, res);
        finish(c);
      });
    } catch (e) {
      armSigint();
      fail(c, e);
      ownPrompt();
      cb(e);
      finish(c);
    }
    armSigint();
    if (!c.done) {
      awaiting = true;
      whileAwaiting();
    }
  };
}
