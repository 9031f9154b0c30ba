// replbox warm pool: javascript. This interpreter was started ahead of time as
// `node -r THIS_FILE main.js` (this file being a copy for this start only). It waits on stdin
// for one request, then returns, and node runs main.js exactly as `node main.js ARGS` would:
// the main module, its stack traces and uncaught-error output are node's own.
'use strict';
(() => {
  const fs = require('fs');
  // Nothing of the loader stays behind: its file, its module, node's -r option.
  try {
    fs.unlinkSync(__filename);
  } catch {}
  delete require.cache[__filename];
  process.execArgv = [];
  const take = (n) => {
    const data = Buffer.alloc(n);
    let got = 0;
    while (got < n) {
      let k;
      try {
        k = fs.readSync(0, data, got, n - got, null);
      } catch (e) {
        if (e.code === 'EAGAIN') continue;
        throw e;
      }
      // The pool let this one go unused.
      if (k === 0) process.reallyExit(0);
      got += k;
    }
    return data;
  };
  let head = '';
  while (!head.endsWith('\n')) head += take(1).toString('latin1');
  const fields = take(parseInt(head, 10)).toString('utf8').split('\0');
  const k = parseInt(fields[2], 10);
  const m = parseInt(fields[3], 10);
  const n = parseInt(fields[4], 10);
  const argv = fields.slice(5, 5 + m);
  const env = fields.slice(5 + m, 5 + m + n);
  // node resolved main.js against the directory as it started; the caller's arguments follow.
  process.argv.push(...argv.slice(m - k));
  // The run's environment, with the same variables in the same order. The sandbox may set
  // PWD as it starts a process (bwrap does, replacing or appending it): do the same.
  const pwd = process.env.PWD;
  for (const name of Object.keys(process.env)) delete process.env[name];
  for (const kv of env) {
    const i = kv.indexOf('=');
    process.env[kv.slice(0, i)] = kv.slice(i + 1);
  }
  if (pwd !== undefined) process.env.PWD = pwd;
})();
