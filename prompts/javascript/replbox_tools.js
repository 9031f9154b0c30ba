// Call the MCP tools this session (or run) was given: replbox's code mode.
//
//   const { tools } = require('replbox');
//   await tools.list();                            // { server: [tool, ...] }
//   console.log(await tools.help('everything', 'echo'));
//   await tools.everything.echo({ message: 'hi' }); // structuredContent, else the text
//
// A call returns the tool's structuredContent when it has one, else its content: text as a
// string, images and audio as { data: Buffer, mimeType }, several blocks as an array. A tool
// that reports an error, or a call that fails (not granted, too slow, too large,
// interrupted), rejects with a ToolError carrying `kind`. Names that are not identifiers
// (get-sum) are reachable as tools.everything['get-sum'] or tools.everything.get_sum.
// Calls run at once when awaited together (Promise.all), up to the server's bound.
//
// This module is written by replbox into the session's tools directory; the socket it
// talks to is the session's own and answers only while a cell (or the run) is evaluated.
'use strict';

const fs = require('fs');
const net = require('net');
const path = require('path');

class ToolError extends Error {
  constructor(kind, message, server, tool, result) {
    super(message);
    this.name = 'ToolError';
    this.kind = kind;
    this.server = server;
    this.tool = tool;
    this.result = result;
  }
}

let secret = null;
let catalog = null;

function dir() {
  const d = process.env.REPLBOX_TOOLS;
  if (!d) {
    throw new ToolError('refused',
      'no MCP servers for this code: start the session (or run-code) with mcp_servers');
  }
  return d;
}

function request(msg) {
  return new Promise((resolve, reject) => {
    let d;
    try {
      d = dir();
      if (secret === null) secret = fs.readFileSync(path.join(d, 'secret'), 'utf8').trim();
    } catch (e) {
      reject(e);
      return;
    }
    const sock = net.createConnection(path.join(d, 'sock'));
    const chunks = [];
    let done = false;
    const finish = (err, value) => {
      if (done) return;
      done = true;
      sock.destroy();
      if (err) reject(err); else resolve(value);
    };
    sock.on('connect', () => {
      sock.write(JSON.stringify(Object.assign({}, msg, { secret })) + '\n');
    });
    sock.on('data', (b) => {
      const i = b.indexOf(10);
      if (i < 0) { chunks.push(b); return; }
      chunks.push(b.subarray(0, i));
      try {
        finish(null, JSON.parse(Buffer.concat(chunks).toString('utf8')));
      } catch (e) {
        finish(e);
      }
    });
    sock.on('error', (e) => finish(new ToolError('failed', `cannot reach replbox's tools socket: ${e.message}`)));
    sock.on('close', () => finish(new ToolError('failed', 'replbox closed the tools connection')));
  });
}

function content(c) {
  switch (c.type) {
    case 'text': return c.text;
    case 'image':
    case 'audio': return { data: Buffer.from(c.data || '', 'base64'), mimeType: c.mimeType };
    case 'resource': {
      const r = c.resource || {};
      if ('text' in r) return r.text;
      if ('blob' in r) return { data: Buffer.from(r.blob, 'base64'), mimeType: r.mimeType };
      return r;
    }
    default: return c;
  }
}

function value(result) {
  if (result.structuredContent !== undefined && result.structuredContent !== null) {
    return result.structuredContent;
  }
  const blocks = (result.content || []).map(content);
  if (blocks.length === 0) return null;
  return blocks.length === 1 ? blocks[0] : blocks;
}

async function call(server, tool, args) {
  const reply = await request({ op: 'call', server, tool, arguments: args || {} });
  if (reply.ok) return value(reply.result || {});
  const e = reply.error || {};
  throw new ToolError(e.kind || 'failed', e.message || 'the call failed', server, tool, e.result);
}

async function load(refresh) {
  if (catalog === null || refresh) {
    const reply = await request({ op: 'list' });
    if (!reply.ok) {
      const e = reply.error || {};
      throw new ToolError(e.kind || 'failed', e.message || 'cannot list tools');
    }
    catalog = {};
    for (const s of reply.servers || []) catalog[s.name] = s;
  }
  return catalog;
}

const ident = (n) => n.replace(/\W/g, '_');

function toolName(spec, name) {
  const tools = (spec && spec.tools) || [];
  const t = tools.find((x) => x.name === name) || tools.find((x) => ident(x.name) === name);
  return t ? t.name : name;
}

const serverName = (c, n) => Object.keys(c).find((s) => s === n || ident(s) === n) || n;

// A server: any property is one of its tools (names resolved against the list, loaded once).
function serverProxy(server) {
  return new Proxy({}, {
    get(_, prop) {
      if (typeof prop !== 'string' || prop === 'then') return undefined;
      return async (args) => {
        const c = await load();
        const s = serverName(c, server);
        return call(s, toolName(c[s], prop), args);
      };
    },
  });
}

const api = {
  ToolError,
  // { server: [tool, ...] }
  async list() {
    const c = await load(true);
    const out = {};
    for (const [n, s] of Object.entries(c)) out[n] = (s.tools || []).map((t) => t.name);
    return out;
  },
  // A tool's description and its arguments' JSON Schema, as text.
  async help(server, tool) {
    const c = await load();
    const s = c[serverName(c, server)];
    const t = s && (s.tools || []).find((x) => x.name === tool || ident(x.name) === tool);
    if (!t) throw new ToolError('refused', `no tool ${tool} on MCP server ${server}`);
    let text = `${t.name} (${server}): ${t.description || '(no description)'}\n` +
      `Arguments (JSON Schema): ${JSON.stringify(t.inputSchema, null, 2)}`;
    if (t.outputSchema) text += `\nReturns (JSON Schema): ${JSON.stringify(t.outputSchema, null, 2)}`;
    return text;
  },
  call(server, tool, args) { return call(server, tool, args); },
};

// tools.<server>.<tool>(args); tools.list(), tools.help(), tools.call() are methods.
const tools = new Proxy(api, {
  get(target, prop) {
    if (prop in target) return target[prop];
    if (typeof prop !== 'string' || prop === 'then') return undefined;
    return serverProxy(prop);
  },
});

module.exports = { tools, ToolError };
