// replbox: what the session gave its cells that a notebook or a script does not, so that
// they run again as they ran there: the answers typed at their prompts, which the cells'
// reads of process.stdin (readline, 'data' listeners) get, a line a turn of the event loop
// (as typed after each prompt: a reader the cell closes leaves the next line to the next);
// and `require`, which the session's REPL had, also where node runs the script as an ES
// module (a top-level `await` makes it one).
{
  const builtin = process.getBuiltinModule?.bind(process) ?? require;
  const lines = {answers:json}.match(/[^\n]*\n|[^\n]+$/g) || [];
  const stdin = new (builtin('stream').Readable)({
    read() {
      setImmediate(() => this.push(lines.length ? lines.shift() : null));
    },
  });
  Object.defineProperty(process, 'stdin', { configurable: true, enumerable: true, get: () => stdin });
  globalThis.require ??= builtin('module').createRequire(process.cwd() + '/');
}
