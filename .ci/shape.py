#!/usr/bin/env python3
"""The shape of the server crate: files over 600 lines, the longest functions, `pub` items,
module dependency cycles at the top level (from `crate::X` paths) and inside each top-level
module (`session::table`: from `crate::X::Y` and `super::Y` paths; test modules left out),
and lines in src/. Exits 1 when there is a cycle at either level.
Usage: .ci/shape.py [ROOT]"""
import os, re, sys, collections
root = sys.argv[1] if len(sys.argv) > 1 else "."
src = os.path.join(root, "src")
files = []
for d, _, fs in os.walk(src):
    for f in fs:
        if f.endswith(".rs"):
            files.append(os.path.join(d, f))
def lines(p): return open(p).read().count("\n")
big = sorted(((lines(p), os.path.relpath(p, root)) for p in files), reverse=True)
print("files over 600 lines:", [(n, p) for n, p in big if n > 600])
# longest functions: brace matching from `fn` lines
fnre = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(async\s+)?(unsafe\s+)?(extern\s+"C"\s+)?fn\s+(\w+)')
longest = []
def code_only(text):
    """`text` with string and char literals and comments blanked, newlines kept (so that
    braces inside them are not counted)."""
    tok = re.compile(r'r(#*)".*?"\1|b?"(\\.|[^"\\])*"|\'(\\.|[^\'\\])\'|//[^\n]*', re.S)
    return tok.sub(lambda m: '""' + "\n" * m.group(0).count("\n"), text)
for p in files:
    text = code_only(open(p).read()).split("\n")
    i = 0
    while i < len(text):
        m = fnre.match(text[i])
        if m:
            depth = 0; started = False; j = i
            while j < len(text):
                for ch in text[j]:
                    if ch == '{': depth += 1; started = True
                    elif ch == '}': depth -= 1
                if started and depth <= 0: break
                if not started and text[j].rstrip().endswith(';'): break
                j += 1
            if started: longest.append((j - i + 1, os.path.relpath(p, root), m.group(6)))
        i += 1
longest.sort(reverse=True)
print("longest functions:", longest[:8])
print("functions over 80 lines:", len([l for l in longest if l[0] > 80]))
pubre = re.compile(r'^\s*pub\s+(async\s+)?(fn|struct|enum|const|static|mod|trait|type|use)\b')
print("pub items (pub, not pub(crate)):", sum(1 for p in files for l in open(p) if pubre.match(l)))
# The library's public surface: the names the `pub mod`s of lib.rs export (an item, or each
# name of a `pub use`); every other module is private, so its `pub` items are the crate's own.
def exported(path):
    text = re.sub(r'//[^\n]*', '', open(path).read())
    n = 0
    for m in re.finditer(r'\bpub\s+use\s+([^;]*);', text):
        body = m.group(1)
        inner = body[body.index('{') + 1:body.rindex('}')] if '{' in body else body
        n += len([x for x in re.split(r'[{},]', inner) if x.strip() and x.strip() != 'self'])
    n += len(re.findall(r'\bpub\s+(async\s+)?(fn|struct|enum|const|static|trait|type)\b', text))
    return n
surface = {}
for m in re.findall(r'^pub mod (\w+);', open(os.path.join(src, "lib.rs")).read(), re.M):
    f = os.path.join(src, m + ".rs")
    surface[m] = exported(f if os.path.exists(f) else os.path.join(src, m, "mod.rs"))
print("public surface (names exported by lib.rs's pub modules):", sum(surface.values()), surface)
# module deps: top-level module of each file
def mod_of(p):
    rel = os.path.relpath(p, src)
    parts = rel[:-3].split(os.sep)
    return parts[0] if parts[0] not in ("lib", "main") else None
deps = collections.defaultdict(set)
for p in files:
    m = mod_of(p)
    if not m: continue
    for l in open(p):
        for t in re.findall(r'crate::(\w+)', l):
            if t != m: deps[m].add(t)
        mm = re.match(r'\s*use\s+super::(\w+)', l)
def find_cycles(graph):
    """Every cycle of `graph` (node -> set of nodes), each once, as the sorted nodes on it."""
    found = set()
    def dfs(start, node, path, seen):
        for n in graph.get(node, ()):
            if n == start: found.add(tuple(sorted(path)))
            elif n not in seen and n > start:
                dfs(start, n, path + [n], seen | {n})
    for m in list(graph):
        dfs(m, m, [m], {m})
    return sorted(found)
cycles = find_cycles(deps)
print("module dependency cycles:", cycles)
# The second level: the modules inside each top-level module (`session::table`), from
# `crate::X::Y` paths and `super::Y` (resolved from the file's own module path).
def mod_path(p):
    parts = os.path.relpath(p, src)[:-3].split(os.sep)
    if parts[-1] == "mod": parts = parts[:-1]
    return parts
def second(parts):
    return "::".join(parts[:2]) if len(parts) >= 2 else None
deps2 = collections.defaultdict(set)
userefs = re.compile(r'\b((?:crate|super)(?:::super)*)::(\{[^}]*\}|\w+)')
for p in files:
    me = mod_path(p)
    here = second(me)
    if not here: continue
    text = code_only(open(p).read())
    text = re.sub(r'#\[cfg\(test\)\]\s*mod tests\b.*', '', text, flags=re.S)
    for m in userefs.finditer(text):
        head, rest = m.group(1), m.group(2)
        if head == "crate":
            base = []
        else:
            ups = head.count("super")
            if ups > len(me): continue
            base = me[:len(me) - ups]
        names = re.findall(r'(?:^|[{,])\s*(\w+)', rest.strip()) if rest.startswith("{") else [rest]
        for n in names:
            if n in ("self", "super", "crate"): continue
            target = second(base + [n])
            if target and target != here and target.split("::")[0] == here.split("::")[0]:
                deps2[here].add(target)
def tangles(graph):
    """The strongly connected components of more than one module (every cycle lies in one),
    and the pairs of modules that use each other."""
    index, low, stack, on, out = {}, {}, [], set(), []
    def visit(v):
        index[v] = low[v] = len(index); stack.append(v); on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index: visit(v)
    pairs = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if a in graph.get(b, ())})
    return sorted(out), pairs
components2, pairs2 = tangles(deps2)
print("second-level modules that use each other:", [f"{a}<->{b}" for a, b in pairs2])
print("second-level dependency cycles (strongly connected groups):", components2)
cycles2 = components2
total = sum(lines(p) for p in files)
print("lines in src (product binary):", total)
sys.exit(1 if cycles or cycles2 else 0)
