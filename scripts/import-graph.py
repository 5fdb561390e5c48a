#!/usr/bin/env python3
"""Import circles between the modules of the workspace's crates.

For each library crate it reads every module file, resolves the paths it
names (`use crate::a::b`, `crate::a::b::f(...)`, `super::x`, and the shared
front-end sources, which each front-end compiles as its `shared` module) to
the module files they point into, and reports every strongly connected
group of two or more modules: a circle of imports. A module naming its own
parent or child is containment, not a circle, and is left out (a `mod.rs`
re-exporting its children, a child using its parent's items), and so are
unit-test modules (`#[cfg(test)] mod tests`, and the test-only modules
that hand tests their types, as `contract::testing`). Crates are
checked against each other the same way through Cargo's dependency graph
(which Cargo already keeps acyclic).

    scripts/import-graph.py            # prints the graph's size and any circle; exit 1 on one
    scripts/import-graph.py --edges    # also every edge, for reading
    REPO=/other/checkout scripts/import-graph.py   # another checkout
"""

import os
import re
import sys
from collections import defaultdict

ROOT = os.environ.get("REPO", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CRATES = {
    "burn-ddp-rendezvous": "burn-ddp-rendezvous/src",
    "burn-ddp-comm": "burn-ddp-comm/src",
    "burn-ddp-training": "burn-ddp-training/src",
    "burn-ddp-sampler": "burn-ddp-sampler/src",
    "burn-ddp": "burn-ddp/src",
    "burn-ddp-22": "burn-ddp-22/src",
    "burn-ddp-run": "burn-ddp-run/src",
}

PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE = re.compile(r"\buse\s+((?:crate|super|self)::[^;]*);", re.S)
COMMENT = re.compile(r"//[^\n]*")


def module_files(src):
    """module path (tuple) -> file, following symbolic links (shared/)."""
    modules = {}
    for dirpath, _dirs, files in os.walk(src, followlinks=True):
        for name in files:
            if not name.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), src)
            parts = rel[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            if parts and parts[-1] == "tests" and len(parts) > 1:
                pass
            modules[tuple(parts)] = os.path.join(dirpath, name)
    return modules


def resolve(modules, base, segments):
    """The longest module prefix of `base + segments` that is a module file."""
    path = list(base) + list(segments)
    while path:
        if tuple(path) in modules:
            return tuple(path)
        path.pop()
    return ()


TEST_MODULE = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")


def without_tests(text):
    """`text` without its `#[cfg(test)] mod ... { }` blocks: a unit test
    reaching for the shim's test helpers is not a dependency of the code."""
    while True:
        found = TEST_MODULE.search(text)
        if not found:
            return text
        depth, end = 0, found.end() - 1
        for end in range(found.end() - 1, len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                break
        text = text[: found.start()] + text[end + 1 :]


def use_paths(tree):
    """The paths of a `use` tree (`a::{b, c::{d, e}}` -> a::b, a::c::d, a::c::e)."""
    tree = re.sub(r"\s+", "", tree)
    brace = tree.find("{")
    if brace < 0:
        return [tree.split(" as ")[0]]
    prefix, inner = tree[:brace], tree[brace + 1 : tree.rfind("}")]
    items, depth, start = [], 0, 0
    for i, c in enumerate(inner):
        depth += {"{": 1, "}": -1}.get(c, 0)
        if c == "," and depth == 0:
            items.append(inner[start:i])
            start = i + 1
    items.append(inner[start:])
    return [prefix + path for item in items if item for path in use_paths(item)]


def references(text):
    """Every (anchor, segments) path a file names, `use` trees expanded."""
    text = without_tests(COMMENT.sub("", text))
    for tree in USE.findall(text):
        for path in use_paths(tree):
            segments = [s for s in path.split("::") if s and s != "self"]
            if segments and segments[0] in ("crate", "super"):
                yield segments[0], segments[1:]
    for anchor, rest in PATH.findall(text):
        yield anchor, [s for s in rest.split("::") if s]


def crate_graph(src):
    modules = module_files(src)
    edges = defaultdict(set)
    for module, file in modules.items():
        text = open(file, encoding="utf-8").read()
        # The module's own `mod` scope: a `mod.rs`/`lib.rs` is its module, a
        # file `a/b.rs` is module a::b whose parent is a.
        for anchor, segments in references(text):
            if anchor == "crate":
                base = ()
            elif anchor == "self":
                base = module
            else:  # super
                base = module[:-1]
                while segments and segments[0] == "super":
                    base = base[:-1]
                    segments = segments[1:]
            target = resolve(modules, base, segments)
            if target == module or is_family(target, module):
                continue
            edges[module].add(target)
    return modules, edges


def is_family(a, b):
    """Whether one module contains the other."""
    shorter, longer = (a, b) if len(a) <= len(b) else (b, a)
    return longer[: len(shorter)] == shorter


def circles(nodes, edges):
    """Tarjan's strongly connected components of two or more nodes."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for next_node in edges.get(node, ()):
            if next_node not in index:
                visit(next_node)
                low[node] = min(low[node], low[next_node])
            elif next_node in on_stack:
                low[node] = min(low[node], index[next_node])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(component)

    sys.setrecursionlimit(10000)
    for node in nodes:
        if node not in index:
            visit(node)
    return found


def name(module):
    return "::".join(module) or "(crate root)"


def main():
    show_edges = "--edges" in sys.argv
    total_modules = total_edges = 0
    bad = False
    for crate, src in CRATES.items():
        if not os.path.isdir(os.path.join(ROOT, src)):
            continue
        modules, edges = crate_graph(os.path.join(ROOT, src))
        count = sum(len(targets) for targets in edges.values())
        total_modules += len(modules)
        total_edges += count
        found = circles(modules, edges)
        print(f"{crate}: {len(modules)} modules, {count} imports between them, "
              f"{len(found)} circle(s)")
        for component in found:
            bad = True
            print("  circle: " + " <-> ".join(sorted(name(m) for m in component)))
        if show_edges:
            for module in sorted(edges):
                for target in sorted(edges[module]):
                    print(f"    {name(module)} -> {name(target)}")
    print(f"all: {total_modules} modules, {total_edges} imports, "
          f"{'circles found' if bad else 'no circle'}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
