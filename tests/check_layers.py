#!/usr/bin/env python3
"""Layers.NoUpwardIncludes: the #include graph of src/ and include/llamatrain/ against the layers
docs/architecture.md documents.

The document holds two fenced blocks this reads:
  ```layers        one line a layer, the lowest first: NAME: PATTERN... (fnmatch patterns of
                   repository paths; a file belongs to the layer of its longest matching pattern)
  ```layer-exceptions
                   one line an allowed upward include: FILE -> INCLUDED  # why
A file may include its own layer and those listed before it. Every file of src/ and
include/llamatrain/ must be in a layer. An include that goes up is a failure unless it is an
exception; an exception that no longer occurs is a failure too, so the list stays true.

  check_layers.py REPO_ROOT [--list]   (--list: every file with its layer)
"""
import fnmatch
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def fenced_block(doc, tag):
    m = re.search(r"^```" + re.escape(tag) + r"\n(.*?)^```", doc, re.M | re.S)
    if not m:
        sys.exit(f"docs/architecture.md: no ```{tag} block")
    return [line for line in m.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")]


def read_layers(doc):
    layers = []  # (name, [patterns]) lowest first
    for line in fenced_block(doc, "layers"):
        name, _, patterns = line.partition(":")
        layers.append((name.strip(), patterns.split()))
    return layers


def read_exceptions(doc):
    allowed = {}
    for line in fenced_block(doc, "layer-exceptions"):
        edge, _, why = line.partition("#")
        src, arrow, dst = edge.partition("->")
        if not arrow or not why.strip():
            sys.exit(f"docs/architecture.md: layer exception '{line}': expected FILE -> INCLUDED  # why")
        allowed[(src.strip(), dst.strip())] = why.strip()
    return allowed


def layer_of(path, layers):
    best, best_len = None, -1
    for rank, (name, patterns) in enumerate(layers):
        for p in patterns:
            if fnmatch.fnmatch(path, p) and len(p) > best_len:
                best, best_len = (rank, name), len(p)
    return best


def resolve(root, including, target):
    """The repository path an #include "target" in file `including` names, or None (not ours)."""
    here = os.path.dirname(including)
    for cand in (os.path.join(here, target), os.path.join("include", target), os.path.join("src", target),
                 os.path.join("kernels", target)):
        cand = os.path.normpath(cand)
        if os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def main():
    root = sys.argv[1]
    doc = open(os.path.join(root, "docs/architecture.md"), encoding="utf-8").read()
    layers, allowed = read_layers(doc), read_exceptions(doc)
    files = []
    for top in ("src", "include/llamatrain"):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            files += [os.path.relpath(os.path.join(dirpath, n), root) for n in names
                      if n.endswith((".h", ".cpp", ".cu", ".cuh"))]
    files.sort()
    if "--list" in sys.argv:
        for f in files:
            print(f, (layer_of(f, layers) or (None, "?"))[1])
        return 0
    problems, used = [], set()
    unplaced = [f for f in files if layer_of(f, layers) is None]
    problems += [f"{f}: in no layer (add a pattern to the layers block)" for f in unplaced]
    upward = 0
    for f in files:
        mine = layer_of(f, layers)
        if mine is None:
            continue
        for n, line in enumerate(open(os.path.join(root, f), encoding="utf-8", errors="replace"), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = resolve(root, f, m.group(1))
            theirs = layer_of(target, layers) if target else None
            if theirs is None or theirs[0] <= mine[0]:
                continue
            upward += 1
            if (f, target) in allowed:
                used.add((f, target))
                continue
            problems.append(f"{f}:{n}: includes {target}: layer '{mine[1]}' may not include '{theirs[1]}' "
                            f"(above it); move the code, or list the include as an exception with its reason")
    problems += [f"exception {a} -> {b} no longer occurs: remove it from docs/architecture.md"
                 for (a, b) in sorted(set(allowed) - used)]
    print(f"{len(files)} files in {len(layers)} layers ({', '.join(name for name, _ in layers)}); "
          f"{upward} upward include(s), {len(used)} of them documented exceptions")
    for p in problems:
        print("FAIL:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
