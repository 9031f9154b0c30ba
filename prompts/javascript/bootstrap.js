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
      // A class's `static name` may be anything: only a string goes into the JSON.
      if (typeof type !== "string") type = typeof v;
      if (typeof v === "function") type = /^class\s/.test(Function.prototype.toString.call(v)) ? "class" : "function";
    }
    let summary;
    try {
      // A String object's index keys (one per character) would all be listed first.
      summary = util.types.isStringObject(v)
        ? "[String: " + util.inspect(String.prototype.valueOf.call(v), { maxStringLength: 60 }) + "]"
        : util.inspect(v, { depth: 0, breakLength: Infinity, maxArrayLength: 5, maxStringLength: 60, colors: false });
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
  // A value with a display method also comes back rich, as display(value) would return it.
  const writer = r.writer;
  let shown = () => {};
  r.writer = function (v) {
    const text = writer.call(this, v);
    if (cur && !cur.done) {
      cur.extra.value_lines = String(text).split("\n").length;
      shown(v);
    }
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
  // A SIGINT listener of the cell's own takes the interrupt while it awaits, as in a
  // program: the REPL then leaves the awaited promise alone.
  const onSigint = () => {
    if (awaiting && !process.listeners("SIGINT").some((l) => l !== onSigint)) r.emit("SIGINT");
  };
  function listenSigint() {
    // First, so that it sees a `process.once` listener the call is about to remove.
    if (!process.listeners("SIGINT").includes(onSigint)) process.prependListener("SIGINT", onSigint);
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
    // Only primitives are taken (no toString of the thrown value runs, no Proxy trap): an
    // object there would make the end marker's JSON throw, and the cell never end. A
    // getter (DOMException's name) runs as the thrown value's own code, its result a string.
    const text = (x) => (x !== null && (typeof x === "object" || typeof x === "function") ? undefined : String(x));
    const field = (k) => {
      if (e === null || (typeof e !== "object" && typeof e !== "function")) return undefined;
      try {
        const p = prop(e, k);
        if ("value" in p) return p.value;
        if (!p.getter) return undefined;
        const got = e[k];
        return typeof got === "string" ? got : undefined;
      } catch {
        return undefined;
      }
    };
    const name = field("name");
    const type = (name && text(name)) || typeof e;
    const m = field("message");
    const message = (m !== undefined ? text(m) : text(e)) || "?";
    return ["error", { type: type.slice(0, 200), message: message.slice(0, 2000) }];
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
  // --- rich display: display(obj), and a cell's value with a display method, leave a MIME
  // bundle (JSON, as in a notebook) in out/, which the end marker names; replbox returns
  // each kind as content. What user code returns is checked and bounded here, and again by
  // replbox. ---
  const OUT = {out:json};
  const MAX_DISPLAYS = 16;
  const MAX_BUNDLE = 4 << 20;
  // Deno's Jupyter kernel's protocol, and the method names Python's display protocol uses.
  const JUPYTER = Symbol.for("Jupyter.display");
  const REPRS = [["text/html", "_repr_html_"], ["text/markdown", "_repr_markdown_"],
    ["text/latex", "_repr_latex_"], ["image/svg+xml", "_repr_svg_"],
    ["image/png", "_repr_png_"], ["image/jpeg", "_repr_jpeg_"], ["application/json", "_repr_json_"]];
  const MAGIC = [["image/png", [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]],
    ["image/jpeg", [0xff, 0xd8, 0xff]], ["image/gif", [0x47, 0x49, 0x46, 0x38]]];
  const T = util.types;
  const isProxy = T.isProxy;
  const isU8 = (v) => util.types.isUint8Array(v);
  function imageType(v) {
    if (!isU8(v)) return null;
    for (const [mime, m] of MAGIC) if (v.length >= m.length && m.every((b, i) => v[i] === b)) return mime;
    return null;
  }
  // JSON text of `v` within `limit` characters, or null (a cycle, a BigInt, too big): the
  // replacer counts as it goes, so a huge value costs no more than the limit.
  function boundedJson(v, limit) {
    let used = 0;
    const stop = {};
    try {
      return JSON.stringify(v, function (k, x) {
        used += k.length + (typeof x === "string" ? x.length : 8);
        if (used > limit) throw stop;
        return x;
      });
    } catch {
      return null;
    }
  }
  function bundleOf(v) {
    const parts = [];
    const seen = new Set();
    let used = 0;
    const put = (mime, x) => {
      if (typeof mime !== "string" || seen.has(mime) || mime === "text/plain" || x == null) return;
      let text;
      if (isU8(x) && mime.startsWith("image/")) text = JSON.stringify(Buffer.from(x.buffer, x.byteOffset, x.byteLength).toString("base64"));
      else if (typeof x === "string") text = JSON.stringify(x);
      else if (typeof x === "object" && /json$/.test(mime)) text = boundedJson(x, MAX_BUNDLE - used);
      if (text == null || used + text.length > MAX_BUNDLE) return;
      used += text.length;
      seen.add(mime);
      parts.push(JSON.stringify(mime) + ":" + text);
    };
    let plain;
    if (v !== null && (typeof v === "object" || typeof v === "function") && !isProxy(v)) {
      for (const name of [JUPYTER, "_repr_mimebundle_"]) {
        try {
          const m = v[name];
          if (typeof m !== "function") continue;
          const got = m.call(v);
          if (got && typeof got === "object" && !isProxy(got)) {
            for (const mime of Object.keys(got).slice(0, 32)) {
              if (mime === "text/plain" && typeof got[mime] === "string") plain = got[mime];
              else put(mime, got[mime]);
            }
          }
          break;
        } catch {}
      }
      for (const [mime, name] of REPRS) {
        try {
          const m = v[name];
          if (typeof m === "function") put(mime, m.call(v));
        } catch {}
      }
    }
    return { parts, plain };
  }
  function publish(parts) {
    const c = cur;
    if (!c || c.done || !parts.length) return;
    const list = c.extra.displays || (c.extra.displays = []);
    if (list.length >= MAX_DISPLAYS) {
      c.extra.displays_omitted = (c.extra.displays_omitted || 0) + 1;
      return;
    }
    const name = "disp-" + c.n + "-" + (list.length + 1) + ".json";
    try {
      fs.writeFileSync(path.join(OUT, name), '{"data":{' + parts.join(",") + "}}");
      list.push({ file: name });
    } catch (e) {
      process.stderr.write("[replbox: display could not be kept: " + e + "]\n");
    }
  }
  // A notebook's display(): each value's text printed, its rich forms returned. Beyond the
  // display methods: a Buffer or Uint8Array holding a PNG, JPEG or GIF is that image, and a
  // plain object or array is also returned as JSON. A string is text only.
  function display(...values) {
    for (const v of values) {
      if (typeof v === "string") {
        process.stdout.write(v + "\n");
        continue;
      }
      const { parts, plain } = bundleOf(v);
      const image = imageType(v);
      if (image) parts.push(JSON.stringify(image) + ":" + JSON.stringify(Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString("base64")));
      let text = plain;
      if (text === undefined && image) text = "<" + image + ", " + v.byteLength + " bytes>";
      if (text === undefined) {
        try { text = writer(v); } catch (e) { text = "<display: " + e + ">"; }
      }
      process.stdout.write(text + "\n");
      if (!parts.length && !image && v !== null && typeof v === "object" && !isProxy(v)) {
        let shape = false;
        try { shape = Array.isArray(v) || Object.getPrototypeOf(v) === Object.prototype || Object.getPrototypeOf(v) === null; } catch {}
        const json = shape ? boundedJson(v, MAX_BUNDLE) : null;
        if (json != null) parts.push('"application/json":' + json);
      }
      publish(parts);
    }
  }
  Object.defineProperty(globalThis, "display", {
    enumerable: false,
    configurable: true,
    writable: true,
    value: display,
  });
  shown = (v) => {
    if (v === null || (typeof v !== "object" && typeof v !== "function")) return;
    try { publish(bundleOf(v).parts); } catch {}
  };

  // --- session_inspect: one name looked at within a budget, printing nothing and running
  // none of the value's own code. Properties are read through their descriptors (a getter
  // is named, never called), a Proxy is named, never entered (no trap runs), lengths, sizes
  // and entries come from the intrinsics captured here rather than the value's methods,
  // and every walk is bounded (elements, keys, nodes, depth, characters). ---
  const gOPD = Object.getOwnPropertyDescriptor;
  const getProto = Object.getPrototypeOf;
  const fnSource = Function.prototype.call.bind(Function.prototype.toString);
  const TypedArray = getProto(Uint8Array.prototype);
  const taLength = gOPD(TypedArray, "length").get;
  const taName = gOPD(TypedArray, Symbol.toStringTag).get;
  const taBytes = gOPD(TypedArray, "byteLength").get;
  // Own enumerable keys of a value that is not a Proxy: unlike for-in, nothing up the
  // prototype chain (where a Proxy's traps would run) is asked. Within one inspection each
  // object's keys are listed once, so a big object referred to many times costs one walk.
  const keysOf = Object.keys;
  const strValue = String.prototype.valueOf;
  let keyCache = null;
  function ownKeys(o) {
    if (!keyCache) return keysOf(o);
    let ks = keyCache.get(o);
    if (!ks) { ks = keysOf(o); keyCache.set(o, ks); }
    return ks;
  }
  const mapSize = gOPD(Map.prototype, "size").get;
  const setSize = gOPD(Set.prototype, "size").get;
  const mapEntries = Map.prototype.entries;
  const setValues = Set.prototype.values;
  const mapNext = getProto(new Map().entries()).next;
  const setNext = getProto(new Set().values()).next;
  const dateIso = Date.prototype.toISOString;
  const reSource = gOPD(RegExp.prototype, "source").get;
  const symText = Symbol.prototype.toString;
  const ELEMENT = { Int8Array: "int8", Uint8Array: "uint8", Uint8ClampedArray: "uint8",
    Int16Array: "int16", Uint16Array: "uint16", Int32Array: "int32", Uint32Array: "uint32",
    Float32Array: "float32", Float64Array: "float64", BigInt64Array: "int64",
    BigUint64Array: "uint64" };
  const SCAN = 1e7;        // typed array elements read for statistics
  const SCAN_SLOTS = 1e5;  // plain array slots read (each through its descriptor)
  // A property of a value that is not a Proxy, looked up along its prototype chain:
  // {value}, or {getter}, {proxy}, {missing}.
  function prop(o, k) {
    for (let p = o, i = 0; p !== null && p !== undefined && i < 64; i++) {
      if (isProxy(p)) return { proxy: true };
      const d = gOPD(p, k);
      if (d) return "value" in d ? { value: d.value } : { getter: true };
      p = getProto(p);
    }
    return { missing: true };
  }
  function ownValue(o, k) {
    const d = gOPD(o, k);
    return d && "value" in d ? d.value : undefined;
  }
  function isClass(f) {
    try { return /^class[\s{]/.test(fnSource(f)); } catch { return false; }
  }
  function typeName(v) {
    if (v === null) return "null";
    const t = typeof v;
    if (t !== "object" && t !== "function") return t;
    if (isProxy(v)) return "Proxy";
    if (t === "function") return isClass(v) ? "class" : "function";
    try {
      const proto = getProto(v);
      if (proto === null) return "Object (null prototype)";
      const c = prop(proto, "constructor").value;
      if (typeof c === "function" && !isProxy(c)) {
        const n = ownValue(c, "name");
        if (typeof n === "string" && n) return n.slice(0, 200);
      }
    } catch {}
    return "Object";
  }
  // A short text of a value, util.inspect's look, within `st.left` characters and
  // `st.nodes` values.
  function brief(v, depth, st, seen) {
    if (--st.nodes < 0 || st.left <= 0) return "…";
    const put = (s) => { st.left -= s.length; return s; };
    switch (typeof v) {
      case "string": return put(JSON.stringify(v.length > 200 ? v.slice(0, 200) + "…" : v));
      case "bigint": return put(String(v) + "n");
      case "symbol": return put(symText.call(v));
      case "function": {
        if (isProxy(v)) return put("Proxy");
        const n = ownValue(v, "name");
        return put("[" + (isClass(v) ? "class " : "Function ") + (typeof n === "string" && n ? n.slice(0, 100) : "(anonymous)") + "]");
      }
      case "object": break;
      default: return put(String(v));
    }
    if (v === null) return put("null");
    if (isProxy(v)) return put("Proxy");
    if (seen.has(v)) return put("[Circular]");
    const type = typeName(v);
    if (T.isDate(v)) { try { return put(dateIso.call(v)); } catch { return put("Invalid Date"); } }
    if (T.isRegExp(v)) return put("/" + String(reSource.call(v)).slice(0, 200) + "/");
    if (T.isPromise(v)) return put("Promise");
    if (depth <= 0) return put("[" + type + "]");
    seen.add(v);
    const items = [];
    let more = 0;
    const room = () => st.nodes > 0 && st.left > 0 && items.length < 20;
    try {
      if (T.isTypedArray(v)) {
        const n = taLength.call(v);
        for (let i = 0; i < n; i++) {
          if (!room()) { more = n - i; break; }
          items.push(brief(v[i], depth - 1, st, seen));
        }
        return type + "(" + n + ") [" + items.join(", ") + (more ? ", … " + more + " more" : "") + "]";
      }
      if (T.isMap(v) || T.isSet(v)) {
        const map = T.isMap(v);
        const n = map ? mapSize.call(v) : setSize.call(v);
        const it = map ? mapEntries.call(v) : setValues.call(v);
        for (let i = 0; i < n; i++) {
          if (!room()) { more = n - i; break; }
          const r = (map ? mapNext : setNext).call(it);
          if (r.done) break;
          items.push(map ? brief(r.value[0], depth - 1, st, seen) + " => " + brief(r.value[1], depth - 1, st, seen)
            : brief(r.value, depth - 1, st, seen));
        }
        return type + "(" + n + ") {" + items.join(", ") + (more ? ", … " + more + " more" : "") + "}";
      }
      if (Array.isArray(v)) {
        const n = ownValue(v, "length");
        for (let i = 0; i < n; i++) {
          if (!room()) { more = n - i; break; }
          const d = gOPD(v, i);
          items.push(!d ? "<empty>" : "value" in d ? brief(d.value, depth - 1, st, seen) : put("[Getter]"));
        }
        return "[" + items.join(", ") + (more ? ", … " + more + " more" : "") + "]";
      }
      if (T.isStringObject(v)) return put("[String: " + brief(strValue.call(v), 0, st, seen) + "]");
      const keys = ownKeys(v);
      for (const k of keys) {
        if (!room()) break;
        const d = gOPD(v, k);
        const key = /^[\p{L}_$][\p{L}\p{N}_$]*$/u.test(k) ? k : JSON.stringify(k.slice(0, 100));
        items.push(put(key + ": ") + (!d ? "?" : "value" in d ? brief(d.value, depth - 1, st, seen) : put("[Getter]")));
      }
      more = keys.length - items.length;
      const head = type === "Object" ? "" : type + " ";
      return head + "{" + items.join(", ") + (more > 0 ? ", … " + more + " more" : "") + "}";
    } finally {
      seen.delete(v);
    }
  }
  function short(v) {
    return brief(v, 2, { nodes: 400, left: 4000 }, new Set());
  }
  // Statistics of numbers read by `get(i)` for i below n; NaN and infinities are counted,
  // not summed.
  function stats(n, get) {
    let count = 0, mean = 0, m2 = 0, min = Infinity, max = -Infinity, nans = 0;
    for (let i = 0; i < n; i++) {
      const x = get(i);
      if (typeof x !== "number") continue;
      if (!Number.isFinite(x)) { nans++; continue; }
      count++;
      const delta = x - mean;
      mean += delta / count;
      m2 += delta * (x - mean);
      if (x < min) min = x;
      if (x > max) max = x;
    }
    if (!count) return { nans };
    return { min, max, mean, std: count > 1 ? Math.sqrt(m2 / count) : 0, nans, count };
  }
  function signature(f, src) {
    const name = ownValue(f, "name");
    const label = typeof name === "string" && name ? name.slice(0, 100) : "(anonymous)";
    if (/\{\s*\[native code\]\s*\}\s*$/.test(src)) {
      return label + "(" + "… " + ownValue(f, "length") + " parameter(s), native)";
    }
    let s = src;
    if (/^class[\s{]/.test(s)) {
      const m = /\bconstructor\s*\(/.exec(s);
      if (!m) return "class " + label;
      s = s.slice(m.index + m[0].length - 1);
    }
    const arrow = /^(?:async\s+)?([\p{L}_$][\p{L}\p{N}_$]*)\s*=>/u.exec(s);
    if (arrow) return label + "(" + arrow[1] + ")";
    const open = s.indexOf("(");
    if (open < 0) return label;
    let depth = 0;
    for (let i = open; i < Math.min(s.length, open + 2000); i++) {
      if (s[i] === "(") depth++;
      else if (s[i] === ")" && --depth === 0) return label + s.slice(open, i + 1).replace(/\s+/g, " ");
    }
    return label + "(…)";
  }
  function describeValue(v) {
    const type = typeName(v);
    const d = { type };
    if (type === "Proxy") {
      d.summary = "a Proxy: neither its target nor its handler is looked into (that would run its traps)";
      return d;
    }
    if (typeof v === "function") {
      let src = "";
      try { src = fnSource(v); } catch {}
      d.kind = type;
      d.signature = signature(v, src);
      d.len = ownValue(v, "length");
      d.source = src.length > 20000 ? src.slice(0, 20000) + "…" : src;
      if (src.length > 20000) d.truncated = true;
      if (type === "class") {
        const proto = ownValue(v, "prototype");
        if (proto && typeof proto === "object" && !isProxy(proto)) {
          d.members = Object.getOwnPropertyNames(proto).filter((k) => k !== "constructor").slice(0, 100);
        }
      }
      return d;
    }
    if (v !== null && typeof v === "object" && T.isTypedArray(v)) {
      const tag = taName.call(v);
      const n = taLength.call(v);
      d.kind = "array";
      d.len = n;
      d.dtype = ELEMENT[tag] || tag;
      d.size = taBytes.call(v);
      if (!tag.startsWith("Big")) {
        d.stats = stats(Math.min(n, SCAN), (i) => v[i]);
        if (n > SCAN) d.stats.of_first = SCAN;
      }
      d.head = [];
      for (let i = 0; i < Math.min(n, 20); i++) d.head.push(typeof v[i] === "bigint" ? String(v[i]) : Number.isFinite(v[i]) ? v[i] : null);
    } else if (Array.isArray(v)) {
      const n = ownValue(v, "length");
      const scanned = Math.min(n, SCAN_SLOTS);
      const kinds = {};
      const slot = (i) => {
        const s = gOPD(v, i);
        return s && "value" in s ? s.value : undefined;
      };
      for (let i = 0; i < scanned; i++) {
        const s = gOPD(v, i);
        const k = !s ? "empty" : !("value" in s) ? "getter" : s.value === null ? "null" : typeof s.value;
        kinds[k] = (kinds[k] || 0) + 1;
      }
      const names = Object.keys(kinds);
      d.kind = "array";
      d.len = n;
      d.dtype = names.length === 1 ? names[0] : names.length ? "mixed" : "empty";
      d.types = kinds;
      if (n > scanned) d.types_of_first = scanned;
      if (kinds.number) {
        d.stats = stats(scanned, slot);
        if (n > scanned) d.stats.of_first = scanned;
      }
      d.head = [];
      for (let i = 0; i < Math.min(n, 10); i++) d.head.push(short(slot(i)));
      if (n > 10) {
        d.tail = [];
        for (let i = Math.max(10, n - 5); i < n; i++) d.tail.push(short(slot(i)));
      }
    } else if (v !== null && typeof v === "object" && (T.isMap(v) || T.isSet(v))) {
      d.kind = "collection";
      d.len = T.isMap(v) ? mapSize.call(v) : setSize.call(v);
      d.repr = short(v);
    } else if (typeof v === "string") {
      d.len = v.length;
      d.repr = JSON.stringify(v.length > 4000 ? v.slice(0, 4000) + "…" : v);
      if (v.length > 4000) d.truncated = true;
    } else if (v !== null && typeof v === "object" && T.isStringObject(v)) {
      d.len = strValue.call(v).length;
      d.repr = short(v);
    } else if (v !== null && typeof v === "object") {
      const all = ownKeys(v);
      const keys = [];
      for (let i = 0; i < Math.min(all.length, 100); i++) keys.push(all[i].slice(0, 200));
      d.kind = "object";
      d.len = all.length;
      d.keys = keys;
      d.repr = short(v);
    } else {
      d.repr = short(v);
    }
    return d;
  }
  // The longest field gives way (a text is cut, a list halved) until the whole fits.
  function fit(d, budget) {
    const size = () => JSON.stringify(d).length + 20;
    let cut = false;
    for (let i = 0; i < 64 && size() > budget; i++) {
      cut = true;
      let best = null, bestLen = 1;
      for (const [k, x] of Object.entries(d)) {
        if ((typeof x === "string" || Array.isArray(x)) && x.length > 1) {
          const l = JSON.stringify(x).length;
          if (l > bestLen) { best = k; bestLen = l; }
        }
      }
      if (best === null) break;
      const x = d[best];
      d[best] = Array.isArray(x) ? x.slice(0, x.length >> 1) : x.slice(0, Math.max(1, x.length >> 1)) + "…";
    }
    const keys = Object.keys(d);
    while (size() > budget && keys.length > 2) delete d[keys.pop()];
    if (cut) d.truncated = true;
    return d;
  }
  const IDENT = /^[\p{L}_$][\p{L}\p{N}_$]*$/u;
  function lookup(path) {
    const [head, ...rest] = path.split(".");
    if (![head, ...rest].every((s) => IDENT.test(s))) throw new SyntaxError("not a name: " + path);
    let v;
    const g = gOPD(globalThis, head);
    if (g) {
      if (!("value" in g)) throw new TypeError(head + " is an accessor property: its getter is not run");
      v = g.value;
    } else if (lexicalNames().includes(head)) {
      v = vm.runInThisContext(head);
    } else {
      throw new ReferenceError(head + " is not defined");
    }
    let at = head;
    for (const k of rest) {
      if (v === null || v === undefined) throw new TypeError(at + " is " + v);
      if (isProxy(v)) throw new TypeError(at + " is a Proxy: its traps are not run");
      const p = prop(typeof v === "object" || typeof v === "function" ? v : Object(v), k);
      if (p.getter) throw new TypeError(at + "." + k + " is an accessor property: its getter is not run");
      if (p.proxy) throw new TypeError(at + " has a Proxy in its prototype chain: its traps are not run");
      if (p.missing) throw new TypeError(at + " has no property " + k);
      v = p.value;
      at += "." + k;
    }
    return v;
  }
  Object.defineProperty(globalThis, "__rbx_inspect", {
    enumerable: false,
    value: (hex, budget) => {
      if (!cur) return;
      let d;
      try {
        keyCache = new Map();
        d = describeValue(lookup(Buffer.from(String(hex), "hex").toString("utf8")));
      } catch (e) {
        let text;
        try { text = (e && e.name ? e.name + ": " : "") + String(e && e.message); } catch { text = "error"; }
        d = { error: text.slice(0, 500) };
      } finally {
        keyCache = null;
      }
      cur.extra.inspect = fit(d, Math.max(200, Number(budget) || 2000));
    },
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
