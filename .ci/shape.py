#!/usr/bin/env python3
"""The shape of the server crate: files over 600 lines, the longest functions, `pub` items,
module dependency cycles (from `crate::X` paths) and lines in src/. Usage: .ci/shape.py [ROOT]"""
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
# cycles via DFS
cycles = set()
def dfs(start, node, path, seen):
    for n in deps.get(node, ()):
        if n == start: cycles.add(tuple(sorted(path)))
        elif n not in seen and n > start:
            dfs(start, n, path + [n], seen | {n})
for m in list(deps):
    dfs(m, m, [m], {m})
print("module dependency cycles:", sorted(cycles))
total = sum(lines(p) for p in files)
print("lines in src (product binary):", total)
