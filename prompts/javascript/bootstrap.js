// replbox's bootstrap for node's REPL (see docs/bootstrap-protocol.md). Before writing it
// into the session's control directory, replbox replaces the placeholders below, marked
// `:json`, by JavaScript string literals.
"use strict";
// The bootstrap runs under the script name "repl" rather than this file's path, so that no
// output (a stack trace node prints itself, as process.abort() does) names replbox's files.
require("vm").runInThisContext("(" + main.toString() + ")", { filename: "repl" })(require);

function main(require) {
  "use strict";
  // What the bootstrap uses to frame a cell is captured here, before any cell runs: the
  // session's code may replace JSON.stringify, Array.prototype.join, Object.keys,
  // process.stdout.write, fs.writeSync... and every cell must still end with its marker and
  // print its value. Methods are called through the original `call` bound to the original
  // method, as node's own primordials (which user land cannot reach) are; loops over arrays
  // are index loops (for-of and spreads would ask Array.prototype[Symbol.iterator]).
  const uncurry = Function.prototype.bind.bind(Function.prototype.call);
  const apply = Reflect.apply;
  const JSONStringify = JSON.stringify;
  const ObjectKeys = Object.keys;
  const ObjectDefineProperty = Object.defineProperty;
  const ObjectGetOwnPropertyNames = Object.getOwnPropertyNames;
  const ObjectFreeze = Object.freeze;
  const ObjectGetPrototypeOf = Object.getPrototypeOf;
  const ObjectGetOwnPropertyDescriptor = Object.getOwnPropertyDescriptor;
  const ObjectPrototype = Object.prototype;
  const hasOwn = Object.hasOwn;
  const ArrayIsArray = Array.isArray;
  const push = uncurry(Array.prototype.push);
  const join = uncurry(Array.prototype.join);
  const aslice = uncurry(Array.prototype.slice);
  const splice = uncurry(Array.prototype.splice);
  const includes = uncurry(Array.prototype.includes);
  const sslice = uncurry(String.prototype.slice);
  const indexOf = uncurry(String.prototype.indexOf);
  const trim = uncurry(String.prototype.trim);
  const startsWith = uncurry(String.prototype.startsWith);
  const charCodeAt = uncurry(String.prototype.charCodeAt);
  const exec = uncurry(RegExp.prototype.exec);
  const setHas = uncurry(Set.prototype.has);
  const setAdd = uncurry(Set.prototype.add);
  const setDelete = uncurry(Set.prototype.delete);
  const mapGet = uncurry(Map.prototype.get);
  const mapSet = uncurry(Map.prototype.set);
  const $String = String;
  const $Set = Set;
  const $Map = Map;
  const $Error = Error;
  const captureStackTrace = Error.captureStackTrace;
  const $TypeError = TypeError;
  const $ReferenceError = ReferenceError;
  const $SyntaxError = SyntaxError;
  const MathMin = Math.min;
  const MathMax = Math.max;
  const MathSqrt = Math.sqrt;
  const NumberIsFinite = Number.isFinite;
  const NumberIsNaN = Number.isNaN;
  const NumberParseFloat = Number.parseFloat;
  const NumberParseInt = Number.parseInt;
  const $Number = Number;
  const $Object = Object;
  const fromCharCode = String.fromCharCode;
  const utf8Length = Buffer.byteLength;
  const encodeUtf8 = uncurry(TextEncoder.prototype.encode);
  const decodeUtf8 = uncurry(TextDecoder.prototype.decode);
  const encoder = new TextEncoder();
  const decoder = new TextDecoder();
  const SetImmediate = setImmediate;
  const SetInterval = setInterval;
  const ClearInterval = clearInterval;
  const EE = require("events").prototype;
  const on = uncurry(EE.on);
  const emit = uncurry(EE.emit);
  const listeners = uncurry(EE.listeners);
  const prependListener = uncurry(EE.prependListener);
  const removeListener = uncurry(EE.removeListener);
  const removeAllListeners = uncurry(EE.removeAllListeners);
  const repl = require("repl");
  const fs = require("fs");
  const { openSync, writeSync, fstatSync, readSync, closeSync, existsSync, readFileSync,
    writeFileSync } = fs;
  const vm = require("vm");
  const runInThisContext = vm.runInThisContext;
  const tty = require("tty");
  const { PassThrough, Writable, Readable } = require("stream");
  const rawWrite = Writable.prototype.write;
  const streamWrite = uncurry(rawWrite);
  const streamDestroy = uncurry(Readable.prototype.destroy);
  // A stream's own `on`: a "data" listener also starts the flow.
  const streamOn = uncurry(Readable.prototype.on);
  const setRawModeOf = uncurry(tty.ReadStream.prototype.setRawMode);
  const path = require("path");
  // Paths joined by hand: path.join calls methods of arrays the session may replace.
  const pathJoin = (dir, name) => dir + "/" + name;
  const InspectorSession = require("inspector").Session;
  const inspectorConnect = uncurry(InspectorSession.prototype.connect);
  const inspectorPost = uncurry(InspectorSession.prototype.post);
  const stdout = process.stdout;
  const stderr = process.stderr;
  // Text written as the stream's write was at start.
  const writeText = (stream, text) => streamWrite(stream, text);
  // A cell file's name: the template's text around `{n}`.
  const around = (t) => { const i = indexOf(t, "{n}"); return [sslice(t, 0, i), sslice(t, i + 3)]; };
  // Lines of a text, without the separator's lookup (split asks String.prototype[@@split]).
  function lines(text) {
    const out = [];
    for (let at = 0; ;) {
      const i = indexOf(text, "\n", at);
      if (i < 0) { push(out, sslice(text, at)); return out; }
      push(out, sslice(text, at, i));
      at = i + 1;
    }
  }
  // JSON of the plain data the bootstrap itself builds (objects, arrays, strings, numbers,
  // booleans, null): JSON.stringify of an object would ask its toJSON, which the session may
  // have put on Object.prototype or Array.prototype. Only primitives reach JSONStringify.
  function toJson(v) {
    if (v === null || typeof v !== "object") return v === undefined ? "null" : JSONStringify(v);
    const parts = [];
    if (ArrayIsArray(v)) {
      for (let i = 0; i < v.length; i++) push(parts, toJson(v[i]));
      return "[" + join(parts, ",") + "]";
    }
    const keys = ObjectKeys(v);
    for (let i = 0; i < keys.length; i++) {
      if (v[keys[i]] !== undefined) push(parts, JSONStringify(keys[i]) + ":" + toJson(v[keys[i]]));
    }
    return "{" + join(parts, ",") + "}";
  }
  const B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  // Base64 of bytes (a Uint8Array), by hand: Buffer's own encoders are methods the session
  // can replace.
  function base64(u8) {
    const chunks = [];
    let piece = "";
    const n = u8.length;
    for (let i = 0; i < n; i += 3) {
      const a = u8[i], b = i + 1 < n ? u8[i + 1] : 0, c = i + 2 < n ? u8[i + 2] : 0;
      piece += B64[a >> 2] + B64[((a & 3) << 4) | (b >> 4)] +
        (i + 1 < n ? B64[((b & 15) << 2) | (c >> 6)] : "=") + (i + 2 < n ? B64[c & 63] : "=");
      if (piece.length >= 8192) { push(chunks, piece); piece = ""; }
    }
    push(chunks, piece);
    return join(chunks, "");
  }
  const NONCE = {nonce:json};
  const CTL = {ctl:json};
  const CELL_FILE = {cell_file:json};
  const INPUT_FILE = {input_file:json};
  const PROMPT = {prompt:json};
  const SELF = "repl";
  const LINE = /^__rbx_eval\((\d+)\)\s*$/;
  const CELL_NAME = around(CELL_FILE);
  const INPUT_NAME = around(INPUT_FILE);

  // Markers go to a descriptor of their own on the terminal, so code that closes or
  // redirects stdout cannot swallow them.
  const { O_WRONLY, O_RDONLY, O_NOCTTY, O_NONBLOCK, S_IFMT, S_IFCHR } = fs.constants;
  const TTY = fstatSync(1).rdev;
  let markFd = openSync("/dev/tty", O_WRONLY | O_NOCTTY);
  function tell(text) {
    try {
      // The mode's bits, not Stats' methods (the session could replace those).
      const st = fstatSync(markFd);
      if ((st.mode & S_IFMT) !== S_IFCHR || st.rdev !== TTY) throw new $Error("not the terminal");
    } catch {
      // Closed, or its number reused by the code for something else: leave that alone.
      try { markFd = openSync("/dev/tty", O_WRONLY | O_NOCTTY); } catch { return; }
    }
    try { writeSync(markFd, text); } catch {}
  }

  // Input typed into the cell (replbox says so with a file) that the program did not read
  // would be the REPL's next line: read the whole lines of it out of the terminal and count
  // them (replbox discards a line without Enter itself before typing the next cell).
  function discardUnread(n) {
    if (!existsSync(pathJoin(CTL, INPUT_NAME[0] + n + INPUT_NAME[1]))) return 0;
    let count = 0;
    let fd = -1;
    try {
      fd = openSync("/proc/self/fd/0", O_RDONLY | O_NOCTTY | O_NONBLOCK);
      const buf = new Uint8Array(65536);
      for (let k; count < 1 << 24 && (k = readSync(fd, buf)) > 0; ) count += k;
    } catch {
      // EAGAIN: nothing more to read.
    } finally {
      if (fd >= 0) closeSync(fd);
    }
    return count;
  }

  // Stack traces show the user's frames, not node's internals or this bootstrap.
  const errorText = uncurry(Error.prototype.toString);
  $Error.prepareStackTrace = (err, frames) => {
    let out;
    try { out = errorText(err); } catch { out = $String(err); }
    for (let i = 0; i < frames.length; i++) {
      const file = frames[i].getFileName() || "";
      if (!(startsWith(file, "node:") || file === SELF)) out += "\n    at " + frames[i];
    }
    return out;
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
    const fd = openSync("/proc/self/fd/0", "r");
    source = new tty.ReadStream(fd);
    streamOn(source, "data", (d) => streamWrite(feed, d));
    streamOn(source, "error", () => {});
  }
  function unlisten() {
    if (!source) return;
    const s = source;
    source = null;
    streamDestroy(s);
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
        userStdin = new tty.ReadStream(openSync("/proc/self/fd/0", "r"));
        streamOn(userStdin, "error", () => {});
      }
      return userStdin;
    },
  });
  function closeStdin() {
    if (!userStdin) return;
    const s = userStdin;
    userStdin = null;
    if (s.isRaw) setRawModeOf(s, false);
    streamDestroy(s);
  }

  // session_vars: the names the user defined, each with a short summary, in the end
  // marker's payload. Globals are those not there once the REPL is up; let, const and
  // class declarations live in the global lexical scope, which only the inspector lists.
  const util = require("util");
  let inspectorSession = null;
  function lexicalNames() {
    try {
      if (!inspectorSession) {
        inspectorSession = new InspectorSession();
        inspectorConnect(inspectorSession);
      }
      let names = [];
      // The inspector writes its message with JSON.stringify, which would ask a toJSON the
      // session put on Object.prototype: that one is set aside for the call (which answers
      // at once), then put back as it was.
      const toJSON = ObjectGetOwnPropertyDescriptor(ObjectPrototype, "toJSON");
      const aside = toJSON !== undefined && toJSON.configurable && delete ObjectPrototype.toJSON;
      try {
        inspectorPost(inspectorSession, "Runtime.globalLexicalScopeNames", {}, (err, res) => {
          if (!err && res && ArrayIsArray(res.names)) names = res.names;
        });
      } finally {
        if (aside) ObjectDefineProperty(ObjectPrototype, "toJSON", toJSON);
      }
      return names;
    } catch {
      return [];
    }
  }
  // One name's entry, read as session_inspect reads (see below): through descriptors and
  // the intrinsics captured at start, so no getter, Proxy trap, toString, constructor
  // getter or util.inspect.custom method of the value runs. An accessor of the global object
  // is named, not called.
  function summarize(name, d) {
    if (d.uninitialized) return { name, type: "uninitialized", summary: "" };
    if (d.getter) return { name, type: "accessor", summary: "[Getter]" };
    const v = d.value;
    const type = typeName(v);
    let summary;
    try {
      summary = brief(v, 1, { nodes: 40, left: 240 }, new $Set());
      if (typeof v === "string") summary = "length " + v.length + ": " + summary;
      else if (v !== null && typeof v === "object" && !isProxy(v)) {
        if (ArrayIsArray(v)) summary = "length " + ownValue(v, "length") + ": " + summary;
        else if (T.isMap(v)) summary = "size " + mapSize(v) + ": " + summary;
        else if (T.isSet(v)) summary = "size " + setSize(v) + ": " + summary;
      }
    } catch {
      summary = "(no summary)";
    }
    const out = { name, type, summary: sslice(summary, 0, 200) };
    if (v !== null && typeof v === "object" && !isProxy(v)) {
      if (T.isTypedArray(v)) out.size = taBytes(v);
      else if (T.isDataView(v)) out.size = dvBytes(v);
    }
    return out;
  }
  let baseline = null;
  ObjectDefineProperty(globalThis, "__rbx_vars", {
    enumerable: false,
    value: () => {
      if (!cur) return;
      const seen = new $Set();
      const found = [];
      let used = 2, omitted = 0;
      const add = (name, read) => {
        if (setHas(seen, name) || startsWith(name, "__rbx") || name === "_" || name === "_error") return;
        setAdd(seen, name);
        let d;
        try { d = read(); } catch { d = { uninitialized: true }; }
        const e = summarize(name, d);
        const cost = toJson(e).length + 1;
        if (used + cost > 11000) { omitted++; return; }
        used += cost;
        push(found, e);
      };
      const lexical = lexicalNames();
      for (let i = 0; i < lexical.length; i++) {
        const name = lexical[i];
        // Reading a binding runs nothing; one in its temporal dead zone throws.
        add(name, () => ({ value: runInThisContext(name) }));
      }
      const globals = ObjectGetOwnPropertyNames(globalThis);
      for (let i = 0; i < globals.length; i++) {
        const name = globals[i];
        if (setHas(baseline, name)) continue;
        add(name, () => {
          const g = gOPD(globalThis, name);
          return !g ? { uninitialized: true } : hasOwn(g, "value") ? { value: g.value } : { getter: true };
        });
      }
      cur.extra.vars = found;
      if (omitted) cur.extra.vars_omitted = omitted;
    },
  });

  // The REPL writes (its prompt, a cell's value, an error) through stdout's write as it was
  // at start: code that replaces process.stdout.write changes what its own writes do.
  const output = Object.create(stdout);
  ObjectDefineProperty(output, "write", { value: (...a) => apply(rawWrite, stdout, a) });
  const r = repl.start({
    input: feed,
    output,
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
  const exit = process.exit;
  on(r, "exit", () => apply(exit, process, []));
  // The prompt is ours between cells (replbox recognises it) and the user's while a cell
  // runs: `repl.repl.setPrompt('$ ')` is kept for the cell that reads it, never printed.
  let userPrompt = "> ";
  let mine = true;
  const getPrompt = uncurry(r.getPrompt);
  const setPrompt = uncurry(r.setPrompt);
  function ownPrompt() {
    if (mine) return;
    mine = true;
    try { userPrompt = getPrompt(r); } catch {}
    setPrompt(r, PROMPT);
  }
  function giveUserPrompt() {
    setPrompt(r, userPrompt);
    mine = false;
  }
  // How many lines the value of the cell takes (the REPL shows it with its writer), so a
  // notebook export can tell it from what the cell printed.
  // A value with a display method also comes back rich, as display(value) would return it.
  const writer = r.writer;
  let shown = () => {};
  r.writer = function (v) {
    const text = apply(writer, this, [v]);
    if (cur && !cur.done) {
      let n = 1;
      const t = $String(text);
      for (let i = indexOf(t, "\n"); i >= 0; i = indexOf(t, "\n", i + 1)) n++;
      cur.extra.value_lines = n;
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
    if (!awaiting) return;
    const ls = listeners(process, "SIGINT");
    for (let i = 0; i < ls.length; i++) if (ls[i] !== onSigint) return;
    emit(r, "SIGINT");
  };
  function listenSigint() {
    // First, so that it sees a `process.once` listener the call is about to remove.
    if (!includes(listeners(process, "SIGINT"), onSigint)) prependListener(process, "SIGINT", onSigint);
  }
  function armSigint() {
    if (!watchdog) listenSigint();
  }
  function beforeScript() {
    removeListener(process, "SIGINT", onSigint);
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
    if (awaiting) for (let i = 0; i < replSigint.length; i++) apply(replSigint[i], r, []);
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
    return apply(setRawMode, this, [mode]);
  };

  // REPL commands (`.help`, `.load file`, `.exit`) on the cell's first lines run as the
  // REPL runs them; the rest is code, with its line numbers kept.
  const COMMAND = /^\.([^\s]+)\s*(.*)$/;
  function splitCommands(src) {
    const ls = lines(src);
    const commands = [];
    let i = 0;
    for (; i < ls.length; i++) {
      const t = trim(ls[i]);
      if (!t) continue;
      const m = exec(COMMAND, t);
      if (t[1] === "." || !NumberIsNaN(NumberParseFloat(t)) || !m) break;
      push(commands, [m[1], m[2]]);
      ls[i] = "";
    }
    return { commands, code: commands.length ? join(ls, "\n") : src };
  }

  // Keep the cell's lines, not the typed `__rbx_eval(N)`, in the REPL's record (`.save`).
  function remember(c) {
    const had = r.lines;
    let i = had.length - 1;
    while (i >= 0 && !(typeof had[i] === "string" && trim(had[i]) === c.line)) i--;
    if (i < 0) return;
    const src = c.src.length && c.src[c.src.length - 1] === "\n" ? sslice(c.src, 0, -1) : c.src;
    const ls = lines(src);
    splice(had, i, 1);
    for (let k = 0; k < ls.length; k++) splice(had, i + k, 0, ls[k]);
  }

  function describe(e) {
    if (e && e.code === "ERR_SCRIPT_EXECUTION_INTERRUPTED") return ["interrupted", null];
    // Only primitives are taken (no toString of the thrown value runs, no Proxy trap): an
    // object there would make the end marker's JSON throw, and the cell never end. A
    // getter (DOMException's name) runs as the thrown value's own code, its result a string.
    const text = (x) => (x !== null && (typeof x === "object" || typeof x === "function") ? undefined : $String(x));
    const field = (k) => {
      if (e === null || (typeof e !== "object" && typeof e !== "function")) return undefined;
      try {
        const p = prop(e, k);
        if (hasOwn(p, "value")) return p.value;
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
    return ["error", { type: sslice(type, 0, 200), message: sslice(message, 0, 2000) }];
  }
  // The watchdog stops the script wherever it is, possibly inside a write to the terminal
  // after the stream marked it in flight and before it recorded its completion: the stream
  // would then hold all later output (the error, the end marker, the prompt) back for ever.
  // Writes to a terminal complete synchronously, so once the script has stopped none is
  // really in flight: complete the stuck one (its bytes went out, or went with the script).
  function unstick(e) {
    if (!e || e.code !== "ERR_SCRIPT_EXECUTION_INTERRUPTED") return;
    for (let i = 0; i < 2; i++) {
      const s = i ? stderr : stdout;
      const st = s && s.isTTY && s._writableState;
      if (st && st.writing && typeof st.onwrite === "function") {
        try { st.onwrite(null); } catch {}
      }
    }
  }
  function fail(c, e) {
    if (c.status !== "ok") return;
    const d = describe(e);
    c.status = d[0];
    c.err = d[1];
  }
  // Each step is on its own: one that fails (the session broke what it uses) costs only
  // itself, never the end marker.
  function finish(c) {
    if (c.done) return;
    c.done = true;
    awaiting = false;
    const step = (f) => { try { return f(); } catch { return undefined; } };
    step(armSigint);
    step(() => ClearInterval(c.alive));
    step(closeStdin);
    const unread = step(() => discardUnread(c.n));
    step(ownPrompt);
    step(() => remember(c));
    step(listen);
    const end = () => {
      if (cur === c) cur = null;
      const body = {};
      const parts = [c.err || {}, c.extra];
      for (let p = 0; p < 2; p++) {
        const keys = ObjectKeys(parts[p]);
        for (let i = 0; i < keys.length; i++) body[keys[i]] = parts[p][keys[i]];
      }
      if (unread) body.unread = unread;
      let payload = "";
      try {
        if (ObjectKeys(body).length) payload = base64(encodeUtf8(encoder, toJson(body)));
      } catch {}
      tell("\x1b_rbx;" + NONCE + ";e;" + c.n + ";" + c.status + ";" + payload + "\x1b\\");
    };
    // Let pending rejections of this evaluation be reported first.
    try { SetImmediate(end); } catch { end(); }
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
    return apply(displayPrompt, this, args);
  };
  // The REPL itself reports the cell's own error (thrown, or the awaited promise's
  // rejection); anything else (a callback's throw, a rejection nobody handled) comes from
  // the event loop.
  function fromRepl() {
    const saved = $Error.prepareStackTrace;
    const limit = $Error.stackTraceLimit;
    const here = {};
    try {
      $Error.prepareStackTrace = (_, frames) => frames;
      $Error.stackTraceLimit = 16;
      captureStackTrace(here, fromRepl);
      const frames = here.stack;
      for (let i = 0; i < frames.length; i++) if (frames[i].getFileName() === "node:repl") return true;
      return false;
    } catch {
      return true;
    } finally {
      $Error.prepareStackTrace = saved;
      $Error.stackTraceLimit = limit;
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
  const JSON_TYPE = /json$/;
  const MAGIC = [["image/png", [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]],
    ["image/jpeg", [0xff, 0xd8, 0xff]], ["image/gif", [0x47, 0x49, 0x46, 0x38]]];
  // util.types' checks, copied at start (the session could replace them on util.types).
  const T = {};
  const typeChecks = ObjectKeys(util.types);
  for (let i = 0; i < typeChecks.length; i++) T[typeChecks[i]] = util.types[typeChecks[i]];
  const isProxy = T.isProxy;
  const isU8 = T.isUint8Array;
  const u8Length = uncurry(ObjectGetOwnPropertyDescriptor(ObjectGetPrototypeOf(Uint8Array.prototype), "length").get);
  // The image a Uint8Array holds, by its signature (replbox checks its header too).
  function imageType(v) {
    if (!isU8(v)) return null;
    const n = u8Length(v);
    for (let k = 0; k < MAGIC.length; k++) {
      const m = MAGIC[k][1];
      let same = n >= m.length;
      for (let i = 0; same && i < m.length; i++) same = v[i] === m[i];
      if (same) return MAGIC[k][0];
    }
    return null;
  }
  // JSON text of `v` within `limit` bytes of UTF-8, or null (a cycle, a BigInt, too big).
  // The replacer adds up, as it goes, at least what each value adds to the text (a key's
  // quoted text and its colon and comma, a string's quoted text, a number's digits), so a
  // huge value costs no more than the limit; the text's length is checked again at the end.
  function boundedJson(v, limit) {
    let used = 0;
    const stop = {};
    let text;
    try {
      text = JSONStringify(v, function (k, x) {
        used += utf8Length(JSONStringify(k)) + 2;
        // A String object is written as its text.
        const str = typeof x === "string" ? x : x !== null && typeof x === "object" && T.isStringObject(x) ? strValue(x) : null;
        if (str !== null) {
          // Its quoted text is no shorter than the string: measure it only if that fits.
          if (used + str.length + 2 > limit) throw stop;
          used += utf8Length(JSONStringify(str));
        } else if (typeof x === "number" || (x !== null && typeof x === "object" && T.isNumberObject(x))) {
          used += 24;
        } else {
          used += 5;
        }
        if (used > limit) throw stop;
        return x;
      });
    } catch {
      return null;
    }
    return typeof text === "string" && utf8Length(text) <= limit ? text : null;
  }
  // Whether the base64 of bytes `u8` fits in `room` bytes, before encoding them.
  const fits = (u8, room) => 4 * ((u8Length(u8) + 2) / 3 | 0) + 2 <= room;
  // An error's text, for a note: its type and message as describe() reads them.
  function errText(e) {
    try { const d = describe(e)[1]; return d ? d.type + ": " + d.message : "interrupted"; } catch { return "error"; }
  }
  function bundleOf(v) {
    const parts = [];
    const seen = new $Set();
    let used = 0;
    const put = (mime, x) => {
      if (typeof mime !== "string" || setHas(seen, mime) || mime === "text/plain" || x == null) return;
      let text;
      if (isU8(x) && startsWith(mime, "image/")) text = fits(x, MAX_BUNDLE - used) ? '"' + base64(x) + '"' : null;
      else if (typeof x === "string") text = x.length + 2 > MAX_BUNDLE - used ? null : JSONStringify(x);
      else if (typeof x === "object" && exec(JSON_TYPE, mime)) text = boundedJson(x, MAX_BUNDLE - used);
      if (text == null) return;
      const size = utf8Length(text);
      if (used + size > MAX_BUNDLE) return;
      used += size;
      setAdd(seen, mime);
      push(parts, JSONStringify(mime) + ":" + text);
    };
    let plain;
    if (v !== null && (typeof v === "object" || typeof v === "function") && !isProxy(v)) {
      const methods = [JUPYTER, "_repr_mimebundle_"];
      for (let i = 0; i < 2; i++) {
        try {
          const m = v[methods[i]];
          if (typeof m !== "function") continue;
          const got = apply(m, v, []);
          if (got && typeof got === "object" && !isProxy(got)) {
            const mimes = ObjectKeys(got);
            for (let k = 0; k < mimes.length && k < 32; k++) {
              const mime = mimes[k];
              if (mime === "text/plain" && typeof got[mime] === "string") plain = got[mime];
              else put(mime, got[mime]);
            }
          }
          break;
        } catch {}
      }
      for (let i = 0; i < REPRS.length; i++) {
        try {
          const m = v[REPRS[i][1]];
          if (typeof m === "function") put(REPRS[i][0], apply(m, v, []));
        } catch {}
      }
    }
    return { parts, plain, used };
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
      writeFileSync(pathJoin(OUT, name), '{"data":{' + join(parts, ",") + "}}");
      push(list, { file: name });
    } catch (e) {
      writeText(stderr, "[replbox: display could not be kept: " + errText(e) + "]\n");
    }
  }
  // A notebook's display(): each value's text printed, its rich forms returned. Beyond the
  // display methods: a Buffer or Uint8Array holding a PNG, JPEG or GIF is that image, and a
  // plain object or array is also returned as JSON. A string is text only.
  function display(...values) {
    for (let i = 0; i < values.length; i++) {
      const v = values[i];
      if (typeof v === "string") {
        writeText(stdout, v + "\n");
        continue;
      }
      const b = bundleOf(v);
      const parts = b.parts, plain = b.plain;
      const image = imageType(v);
      if (image && fits(v, MAX_BUNDLE - b.used - 20)) push(parts, JSONStringify(image) + ':"' + base64(v) + '"');
      let text = plain;
      if (text === undefined && image) text = "<" + image + ", " + u8Length(v) + " bytes>";
      if (text === undefined) {
        try { text = writer(v); } catch (e) { text = "<display: " + errText(e) + ">"; }
      }
      writeText(stdout, text + "\n");
      if (!parts.length && !image && v !== null && typeof v === "object" && !isProxy(v)) {
        let shape = false;
        try {
          const proto = ObjectGetPrototypeOf(v);
          shape = ArrayIsArray(v) || proto === ObjectPrototype || proto === null;
        } catch {}
        const json = shape ? boundedJson(v, MAX_BUNDLE) : null;
        if (json != null) push(parts, '"application/json":' + json);
      }
      publish(parts);
    }
  }
  ObjectDefineProperty(globalThis, "display", {
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
  const taLength = uncurry(gOPD(TypedArray, "length").get);
  const taName = uncurry(gOPD(TypedArray, Symbol.toStringTag).get);
  const taBytes = uncurry(gOPD(TypedArray, "byteLength").get);
  const dvBytes = uncurry(gOPD(DataView.prototype, "byteLength").get);
  // Own enumerable keys of a value that is not a Proxy: unlike for-in, nothing up the
  // prototype chain (where a Proxy's traps would run) is asked. Within one inspection each
  // object's keys are listed once, so a big object referred to many times costs one walk.
  const keysOf = Object.keys;
  const strValue = uncurry(String.prototype.valueOf);
  let keyCache = null;
  function ownKeys(o) {
    if (!keyCache) return keysOf(o);
    let ks = mapGet(keyCache, o);
    if (!ks) { ks = keysOf(o); mapSet(keyCache, o, ks); }
    return ks;
  }
  const mapSize = uncurry(gOPD(Map.prototype, "size").get);
  const setSize = uncurry(gOPD(Set.prototype, "size").get);
  const mapEntries = uncurry(Map.prototype.entries);
  const setValues = uncurry(Set.prototype.values);
  const mapNext = uncurry(getProto(new $Map().entries()).next);
  const setNext = uncurry(getProto(new $Set().values()).next);
  const dateIso = uncurry(Date.prototype.toISOString);
  const reSource = uncurry(gOPD(RegExp.prototype, "source").get);
  const symText = uncurry(Symbol.prototype.toString);
  const sjoin = (xs, sep) => join(xs, sep);
  // A regular expression's match, by the intrinsic exec (`.test` and String's methods would
  // look up `exec` on the expression, which the session can replace).
  const matches = (re, text) => exec(re, text) !== null;
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
      if (d) return hasOwn(d, "value") ? { value: d.value } : { getter: true };
      p = getProto(p);
    }
    return { missing: true };
  }
  function ownValue(o, k) {
    const d = gOPD(o, k);
    return d && hasOwn(d, "value") ? d.value : undefined;
  }
  function isClass(f) {
    try { return matches(/^class[\s{]/, fnSource(f)); } catch { return false; }
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
        if (typeof n === "string" && n) return sslice(n, 0, 200);
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
      case "string": return put(JSONStringify(v.length > 200 ? sslice(v, 0, 200) + "…" : v));
      case "bigint": return put($String(v) + "n");
      case "symbol": return put(symText(v));
      case "function": {
        if (isProxy(v)) return put("Proxy");
        const n = ownValue(v, "name");
        return put("[" + (isClass(v) ? "class " : "Function ") + (typeof n === "string" && n ? sslice(n, 0, 100) : "(anonymous)") + "]");
      }
      case "object": break;
      default: return put($String(v));
    }
    if (v === null) return put("null");
    if (isProxy(v)) return put("Proxy");
    if (setHas(seen, v)) return put("[Circular]");
    const type = typeName(v);
    if (T.isDate(v)) { try { return put(dateIso(v)); } catch { return put("Invalid Date"); } }
    if (T.isRegExp(v)) return put("/" + sslice($String(reSource(v)), 0, 200) + "/");
    if (T.isPromise(v)) return put("Promise");
    if (depth <= 0) return put("[" + type + "]");
    setAdd(seen, v);
    const items = [];
    let more = 0;
    const room = () => st.nodes > 0 && st.left > 0 && items.length < 20;
    try {
      if (T.isTypedArray(v)) {
        const n = taLength(v);
        for (let i = 0; i < n; i++) {
          if (!room()) { more = n - i; break; }
          push(items, brief(v[i], depth - 1, st, seen));
        }
        return type + "(" + n + ") [" + join(items, ", ") + (more ? ", … " + more + " more" : "") + "]";
      }
      if (T.isMap(v) || T.isSet(v)) {
        const map = T.isMap(v);
        const n = map ? mapSize(v) : setSize(v);
        const it = map ? mapEntries(v) : setValues(v);
        for (let i = 0; i < n; i++) {
          if (!room()) { more = n - i; break; }
          const r = (map ? mapNext : setNext)(it);
          if (r.done) break;
          push(items, map ? brief(r.value[0], depth - 1, st, seen) + " => " + brief(r.value[1], depth - 1, st, seen)
            : brief(r.value, depth - 1, st, seen));
        }
        return type + "(" + n + ") {" + join(items, ", ") + (more ? ", … " + more + " more" : "") + "}";
      }
      if (ArrayIsArray(v)) {
        const n = ownValue(v, "length");
        for (let i = 0; i < n; i++) {
          if (!room()) { more = n - i; break; }
          const d = gOPD(v, i);
          push(items, !d ? "<empty>" : hasOwn(d, "value") ? brief(d.value, depth - 1, st, seen) : put("[Getter]"));
        }
        return "[" + join(items, ", ") + (more ? ", … " + more + " more" : "") + "]";
      }
      if (T.isStringObject(v)) return put("[String: " + brief(strValue(v), 0, st, seen) + "]");
      const keys = ownKeys(v);
      for (let ki = 0; ki < keys.length; ki++) {
        const k = keys[ki];
        if (!room()) break;
        const d = gOPD(v, k);
        const key = matches(/^[\p{L}_$][\p{L}\p{N}_$]*$/u, k) ? k : JSONStringify(sslice(k, 0, 100));
        push(items, put(key + ": ") + (!d ? "?" : hasOwn(d, "value") ? brief(d.value, depth - 1, st, seen) : put("[Getter]")));
      }
      more = keys.length - items.length;
      const head = type === "Object" ? "" : type + " ";
      return head + "{" + join(items, ", ") + (more > 0 ? ", … " + more + " more" : "") + "}";
    } finally {
      setDelete(seen, v);
    }
  }
  function short(v) {
    return brief(v, 2, { nodes: 400, left: 4000 }, new $Set());
  }
  // Statistics of numbers read by `get(i)` for i below n; NaN and infinities are counted,
  // not summed.
  function stats(n, get) {
    let count = 0, mean = 0, m2 = 0, min = Infinity, max = -Infinity, nans = 0;
    for (let i = 0; i < n; i++) {
      const x = get(i);
      if (typeof x !== "number") continue;
      if (!NumberIsFinite(x)) { nans++; continue; }
      count++;
      const delta = x - mean;
      mean += delta / count;
      m2 += delta * (x - mean);
      if (x < min) min = x;
      if (x > max) max = x;
    }
    if (!count) return { nans };
    return { min, max, mean, std: count > 1 ? MathSqrt(m2 / count) : 0, nans, count };
  }
  // Runs of white space as one space.
  function squeeze(text) {
    let out = "";
    let space = false;
    for (let i = 0; i < text.length; i++) {
      const ch = text[i];
      if (ch === " " || ch === "\n" || ch === "\t" || ch === "\r") space = true;
      else { out += (space ? " " : "") + ch; space = false; }
    }
    return out + (space ? " " : "");
  }
  function signature(f, src) {
    const name = ownValue(f, "name");
    const label = typeof name === "string" && name ? sslice(name, 0, 100) : "(anonymous)";
    if (matches(/\{\s*\[native code\]\s*\}\s*$/, src)) {
      return label + "(" + "… " + ownValue(f, "length") + " parameter(s), native)";
    }
    let s = src;
    if (matches(/^class[\s{]/, s)) {
      const m = exec(/\bconstructor\s*\(/, s);
      if (!m) return "class " + label;
      s = sslice(s, m.index + m[0].length - 1);
    }
    const arrow = exec(/^(?:async\s+)?([\p{L}_$][\p{L}\p{N}_$]*)\s*=>/u, s);
    if (arrow) return label + "(" + arrow[1] + ")";
    const open = indexOf(s, "(");
    if (open < 0) return label;
    let depth = 0;
    for (let i = open; i < MathMin(s.length, open + 2000); i++) {
      if (s[i] === "(") depth++;
      else if (s[i] === ")" && --depth === 0) return label + squeeze(sslice(s, open, i + 1));
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
      d.source = src.length > 20000 ? sslice(src, 0, 20000) + "…" : src;
      if (src.length > 20000) d.truncated = true;
      if (type === "class") {
        const proto = ownValue(v, "prototype");
        if (proto && typeof proto === "object" && !isProxy(proto)) {
          const names = ObjectGetOwnPropertyNames(proto);
          d.members = [];
          for (let i = 0; i < names.length && d.members.length < 100; i++) {
            if (names[i] !== "constructor") push(d.members, names[i]);
          }
        }
      }
      return d;
    }
    if (v !== null && typeof v === "object" && T.isTypedArray(v)) {
      const tag = taName(v);
      const n = taLength(v);
      d.kind = "array";
      d.len = n;
      d.dtype = ELEMENT[tag] || tag;
      d.size = taBytes(v);
      if (!startsWith(tag, "Big")) {
        d.stats = stats(MathMin(n, SCAN), (i) => v[i]);
        if (n > SCAN) d.stats.of_first = SCAN;
      }
      d.head = [];
      for (let i = 0; i < MathMin(n, 20); i++) push(d.head, typeof v[i] === "bigint" ? $String(v[i]) : NumberIsFinite(v[i]) ? v[i] : null);
    } else if (ArrayIsArray(v)) {
      const n = ownValue(v, "length");
      const scanned = MathMin(n, SCAN_SLOTS);
      const kinds = {};
      const slot = (i) => {
        const s = gOPD(v, i);
        return s && hasOwn(s, "value") ? s.value : undefined;
      };
      for (let i = 0; i < scanned; i++) {
        const s = gOPD(v, i);
        const k = !s ? "empty" : !hasOwn(s, "value") ? "getter" : s.value === null ? "null" : typeof s.value;
        kinds[k] = (kinds[k] || 0) + 1;
      }
      const names = ObjectKeys(kinds);
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
      for (let i = 0; i < MathMin(n, 10); i++) push(d.head, short(slot(i)));
      if (n > 10) {
        d.tail = [];
        for (let i = MathMax(10, n - 5); i < n; i++) push(d.tail, short(slot(i)));
      }
    } else if (v !== null && typeof v === "object" && (T.isMap(v) || T.isSet(v))) {
      d.kind = "collection";
      d.len = T.isMap(v) ? mapSize(v) : setSize(v);
      d.repr = short(v);
    } else if (typeof v === "string") {
      d.len = v.length;
      d.repr = JSONStringify(v.length > 4000 ? sslice(v, 0, 4000) + "…" : v);
      if (v.length > 4000) d.truncated = true;
    } else if (v !== null && typeof v === "object" && T.isStringObject(v)) {
      d.len = strValue(v).length;
      d.repr = short(v);
    } else if (v !== null && typeof v === "object") {
      const all = ownKeys(v);
      const keys = [];
      for (let i = 0; i < MathMin(all.length, 100); i++) push(keys, sslice(all[i], 0, 200));
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
    const size = () => toJson(d).length + 20;
    let cut = false;
    for (let i = 0; i < 64 && size() > budget; i++) {
      cut = true;
      let best = null, bestLen = 1;
      const ks = ObjectKeys(d);
      for (let j = 0; j < ks.length; j++) {
        const x = d[ks[j]];
        if ((typeof x === "string" || ArrayIsArray(x)) && x.length > 1) {
          const l = toJson(x).length;
          if (l > bestLen) { best = ks[j]; bestLen = l; }
        }
      }
      if (best === null) break;
      const x = d[best];
      d[best] = ArrayIsArray(x) ? aslice(x, 0, x.length >> 1) : sslice(x, 0, MathMax(1, x.length >> 1)) + "…";
    }
    const keys = ObjectKeys(d);
    for (let k = keys.length - 1; size() > budget && k >= 2; k--) delete d[keys[k]];
    if (cut) d.truncated = true;
    return d;
  }
  const IDENT = /^[\p{L}_$][\p{L}\p{N}_$]*$/u;
  function lookup(path) {
    const parts = [];
    for (let at = 0; ;) {
      const i = indexOf(path, ".", at);
      push(parts, i < 0 ? sslice(path, at) : sslice(path, at, i));
      if (i < 0) break;
      at = i + 1;
    }
    for (let i = 0; i < parts.length; i++) {
      if (!matches(IDENT, parts[i])) throw new $SyntaxError("not a name: " + path);
    }
    const head = parts[0];
    let v;
    const g = gOPD(globalThis, head);
    if (g) {
      if (!hasOwn(g, "value")) throw new $TypeError(head + " is an accessor property: its getter is not run");
      v = g.value;
    } else if (includes(lexicalNames(), head)) {
      v = runInThisContext(head);
    } else {
      throw new $ReferenceError(head + " is not defined");
    }
    let at = head;
    for (let i = 1; i < parts.length; i++) {
      const k = parts[i];
      if (v === null || v === undefined) throw new $TypeError(at + " is " + v);
      if (isProxy(v)) throw new $TypeError(at + " is a Proxy: its traps are not run");
      const p = prop(typeof v === "object" || typeof v === "function" ? v : $Object(v), k);
      if (p.getter) throw new $TypeError(at + "." + k + " is an accessor property: its getter is not run");
      if (p.proxy) throw new $TypeError(at + " has a Proxy in its prototype chain: its traps are not run");
      if (p.missing) throw new $TypeError(at + " has no property " + k);
      v = p.value;
      at += "." + k;
    }
    return v;
  }
  // The UTF-8 text of a hex string (replbox's encoding of the name).
  function unhex(hex) {
    const h = $String(hex);
    const bytes = new Uint8Array(h.length >> 1);
    for (let i = 0; i < bytes.length; i++) {
      const b = NumberParseInt(sslice(h, 2 * i, 2 * i + 2), 16);
      if (NumberIsNaN(b)) throw new $SyntaxError("not a name");
      bytes[i] = b;
    }
    return decodeUtf8(decoder, bytes);
  }
  ObjectDefineProperty(globalThis, "__rbx_inspect", {
    enumerable: false,
    value: (hex, budget) => {
      if (!cur) return;
      let d;
      try {
        keyCache = new $Map();
        d = describeValue(lookup(unhex(hex)));
      } catch (e) {
        let text;
        try { text = (e && e.name ? e.name + ": " : "") + $String(e && e.message); } catch { text = "error"; }
        d = { error: sslice(text, 0, 500) };
      } finally {
        keyCache = null;
      }
      cur.extra.inspect = fit(d, MathMax(200, $Number(budget) || 2000));
    },
  });

  listen();
  baseline = new $Set(ObjectGetOwnPropertyNames(globalThis));

  const Recoverable = repl.Recoverable;
  const ownRawMode = r._setRawMode;
  const commandsOf = r.commands;
  // The REPL's callback, then the end of the cell: the end comes even when the callback
  // throws (a writer or a write the session broke).
  function settle(c, cb, e, res) {
    try {
      ownPrompt();
      apply(cb, null, e === undefined ? [] : res === undefined ? [e] : [e, res]);
    } finally {
      finish(c);
    }
  }
  r.eval = function (cmd, context, file, cb) {
    const m = exec(LINE, cmd);
    if (!m) return apply(defaultEval, this, [cmd, context, file, cb]);
    const c = { n: m[1], line: trim(cmd), src: "", status: "ok", err: null, done: false, extra: {},
      inScript: false, raw: 0 };
    cur = c;
    unlisten();
    giveUserPrompt();
    // With the REPL's descriptor closed, something must keep the event loop alive while
    // the evaluation awaits.
    c.alive = SetInterval(() => {}, 1 << 30);
    let src;
    try {
      src = readFileSync(pathJoin(CTL, CELL_NAME[0] + c.n + CELL_NAME[1]), "utf8");
    } catch (e) {
      fail(c, e);
      settle(c, cb, e);
      return;
    }
    c.src = src;
    const { commands, code } = splitCommands(src);
    if (commands.length) {
      apply(ownRawMode, r, [false]);
      // A command ends by showing the prompt: ours, which is no output.
      ownPrompt();
      for (let i = 0; i < commands.length; i++) {
        const command = commandsOf[commands[i][0]];
        if (command) apply(command.action, r, [commands[i][1]]);
        else writeText(stdout, "Invalid REPL keyword\n");
      }
      giveUserPrompt();
      if (!trim(code)) {
        settle(c, cb, null);
        return;
      }
    }
    try {
      beforeScript();
      c.inScript = true;
      apply(defaultEval, this, [code, context, "<cell " + c.n + ">", (e, res) => {
        armSigint();
        try { if (e instanceof Recoverable) e = e.err; } catch {}
        unstick(e);
        if (e) fail(c, e);
        settle(c, cb, e, res);
      }]);
    } catch (e) {
      armSigint();
      fail(c, e);
      settle(c, cb, e);
    }
    armSigint();
    if (!c.done) {
      awaiting = true;
      whileAwaiting();
    }
  };
}
