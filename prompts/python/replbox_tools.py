"""Call the MCP tools this session (or run) was given: replbox's code mode.

    from replbox import tools
    tools.list()                          # {server: [tool, ...]}
    help(tools.everything.echo)           # its description and arguments
    tools.everything.echo(message="hi")   # structuredContent, else the text

A call returns the tool's structuredContent when it has one, else its content: text as
str, images and audio as Blob(data, mime_type), several blocks as a list. A tool that
reports an error, or a call that fails (not granted, too slow, too large, interrupted),
raises ToolError with `kind` and the message. Names that are not Python identifiers
(get-sum) are reachable with underscores (tools.everything.get_sum) or by subscript
(tools["everything"]["get-sum"]). Calls from several threads run at once, each on its own
connection, up to the server's bound.

This module is written by replbox into the session's tools directory; the socket it talks
to is the session's own and answers only while a cell (or the run) is being evaluated.
"""

import base64 as _b64
import inspect as _inspect
import json as _json
import keyword as _keyword
import os as _os
import re as _re
import socket as _socket
import threading as _threading

__all__ = ["tools", "ToolError", "Blob"]


class ToolError(Exception):
    """A tool call that did not return a result.

    kind: tool_error (the tool reported an error; `result` holds its answer), refused (not
    granted, no such tool, over a bound), timeout, cancelled (the cell was interrupted),
    failed (the MCP server failed), too_large (the result is over the server's bound).
    """

    def __init__(self, kind, message, server=None, tool=None, result=None):
        super().__init__(message)
        self.kind = kind
        self.server = server
        self.tool = tool
        self.result = result


class Blob:
    """Binary content a tool returned (an image, audio, a blob resource)."""

    __slots__ = ("data", "mime_type")

    def __init__(self, data, mime_type):
        self.data = data
        self.mime_type = mime_type

    def __repr__(self):
        return "Blob(%r, %d bytes)" % (self.mime_type, len(self.data))

    def __eq__(self, other):
        return isinstance(other, Blob) and (self.data, self.mime_type) == (
            other.data,
            other.mime_type,
        )

    def __len__(self):
        return len(self.data)

    def _repr_png_(self):
        return self.data if self.mime_type == "image/png" else None


_local = _threading.local()
_state = {"secret": None, "catalog": None}


def _dir():
    d = _os.environ.get("REPLBOX_TOOLS")
    if not d:
        raise ToolError(
            "refused",
            "no MCP servers for this code: start the session (or run-code) with mcp_servers",
        )
    return d


def _secret():
    if _state["secret"] is None:
        with open(_os.path.join(_dir(), "secret")) as f:
            _state["secret"] = f.read().strip()
    return _state["secret"]


def _drop():
    s = getattr(_local, "sock", None)
    _local.sock = None
    if s is not None:
        try:
            s.close()
        except OSError:
            pass


def _readline(s):
    chunks = []
    while True:
        b = s.recv(1 << 16)
        if not b:
            raise ToolError("failed", "replbox closed the tools connection")
        i = b.find(b"\n")
        if i >= 0:
            chunks.append(b[:i])
            return b"".join(chunks)
        chunks.append(b)


def _request(msg):
    msg = dict(msg)
    msg["secret"] = _secret()
    data = (_json.dumps(msg, separators=(",", ":")) + "\n").encode()
    s = getattr(_local, "sock", None)
    if s is None:
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            s.connect(_os.path.join(_dir(), "sock"))
        except OSError as e:
            s.close()
            raise ToolError("failed", "cannot reach replbox's tools socket: %s" % e)
        _local.sock = s
    try:
        s.sendall(data)
        line = _readline(s)
    except BaseException:
        # Interrupted or broken mid-reply: this connection's state is unknown.
        _drop()
        raise
    return _json.loads(line)


def _content(c):
    t = c.get("type")
    if t == "text":
        return c.get("text", "")
    if t in ("image", "audio"):
        return Blob(_b64.b64decode(c.get("data", "")), c.get("mimeType", ""))
    if t == "resource":
        r = c.get("resource") or {}
        if "text" in r:
            return r["text"]
        if "blob" in r:
            return Blob(_b64.b64decode(r["blob"]), r.get("mimeType", ""))
        return r
    return c


def _value(result):
    if result.get("structuredContent") is not None:
        return result["structuredContent"]
    blocks = [_content(c) for c in result.get("content") or []]
    if not blocks:
        return None
    return blocks[0] if len(blocks) == 1 else blocks


def _call(server, tool, arguments):
    reply = _request(
        {"op": "call", "server": server, "tool": tool, "arguments": arguments}
    )
    if reply.get("ok"):
        return _value(reply.get("result") or {})
    e = reply.get("error") or {}
    raise ToolError(
        e.get("kind", "failed"),
        e.get("message", "the call failed"),
        server,
        tool,
        e.get("result"),
    )


def _catalog(refresh=False):
    if _state["catalog"] is None or refresh:
        reply = _request({"op": "list"})
        if not reply.get("ok"):
            e = reply.get("error") or {}
            raise ToolError(e.get("kind", "failed"), e.get("message", "cannot list tools"))
        _state["catalog"] = {s["name"]: s for s in reply.get("servers") or []}
    return _state["catalog"]


def _ident(name):
    n = _re.sub(r"\W", "_", name)
    if not n or n[0].isdigit():
        n = "_" + n
    if _keyword.iskeyword(n):
        n += "_"
    return n


_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


def _tool(server, spec):
    name = spec["name"]
    schema = spec.get("inputSchema") or {}
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])

    def call(*args, **arguments):
        if len(args) > 1 or (args and not isinstance(args[0], dict)):
            raise TypeError(
                "%s takes keyword arguments (or one dict of them)" % call.__qualname__
            )
        if args:
            arguments = dict(args[0], **arguments)
        return _call(server, name, arguments)

    params = []
    for p, ps in props.items():
        if not p.isidentifier() or _keyword.iskeyword(p):
            continue
        ps = ps if isinstance(ps, dict) else {}
        default = _inspect.Parameter.empty if p in required else ps.get("default")
        ann = _TYPES.get(ps.get("type"), _inspect.Parameter.empty)
        params.append(
            _inspect.Parameter(p, _inspect.Parameter.KEYWORD_ONLY, default=default, annotation=ann)
        )
    call.__signature__ = _inspect.Signature(params)
    call.__name__ = _ident(name)
    call.__qualname__ = "tools.%s.%s" % (_ident(server), _ident(name))
    call.__module__ = "replbox"
    doc = [(spec.get("description") or "").strip() or "(no description)", ""]
    doc.append("MCP tool %r of server %r. Arguments (JSON Schema):" % (name, server))
    doc.append(_json.dumps(schema, indent=2))
    if spec.get("outputSchema"):
        doc.append("Returns (JSON Schema):")
        doc.append(_json.dumps(spec["outputSchema"], indent=2))
    call.__doc__ = "\n".join(doc)
    call.schema = schema
    call.tool_name = name
    return call


class _Server:
    def __init__(self, name):
        self._name = name

    def _spec(self):
        return _catalog()[self._name]

    def _find(self, name, refresh=True):
        tools = self._spec().get("tools") or []
        for t in tools:
            if t["name"] == name:
                return t
        for t in tools:
            if _ident(t["name"]) == name:
                return t
        if refresh:
            _catalog(refresh=True)
            return self._find(name, refresh=False)
        return None

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        t = self._find(attr)
        if t is None:
            raise AttributeError(
                "MCP server %r has no tool %r; its tools: %s"
                % (self._name, attr, ", ".join(self.names()) or "none")
            )
        return _tool(self._name, t)

    def __getitem__(self, name):
        t = self._find(name)
        if t is None:
            raise KeyError(name)
        return _tool(self._name, t)

    def names(self):
        """The names of the tools this code may call on this server."""
        return [t["name"] for t in self._spec().get("tools") or []]

    def __dir__(self):
        return sorted(_ident(n) for n in self.names())

    def __repr__(self):
        spec = self._spec()
        if spec.get("error"):
            return "<MCP server %s: %s>" % (self._name, spec["error"])
        return "<MCP server %s: %s>" % (self._name, ", ".join(self.names()))


class _Tools:
    """The MCP servers this code may call: tools.<server>.<tool>(**arguments)."""

    def _server(self, name):
        cat = _catalog()
        if name in cat:
            return _Server(name)
        for s in cat:
            if _ident(s) == name:
                return _Server(s)
        return None

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        s = self._server(attr)
        if s is None:
            raise AttributeError(
                "no MCP server %r for this code; servers: %s"
                % (attr, ", ".join(_catalog()) or "none")
            )
        return s

    def __getitem__(self, name):
        s = self._server(name)
        if s is None:
            raise KeyError(name)
        return s

    def list(self):
        """{server: [tool, ...]}: what this code may call."""
        return {n: [t["name"] for t in s.get("tools") or []] for n, s in _catalog().items()}

    def call(self, server, tool, arguments=None, **kwargs):
        """Call `tool` of `server` with `arguments` (a dict) and/or keyword arguments."""
        args = dict(arguments or {}, **kwargs)
        return _call(server, tool, args)

    def __dir__(self):
        return sorted(set(_ident(s) for s in _catalog()) | {"list", "call"})

    def __repr__(self):
        return "<MCP tools: %s>" % ", ".join(
            "%s (%d)" % (n, len(t)) for n, t in self.list().items()
        )


tools = _Tools()
