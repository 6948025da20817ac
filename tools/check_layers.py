#!/usr/bin/env python3
"""Checks every #include against the library graph the build links with.

The graph is build/layers.json, written by CMake from the deltaserve_library()
calls (cmake/DeltaserveLayers.cmake). Each node owns folders or files of the
repository and depends on other nodes, PUBLIC or PRIVATE, as target_link_libraries
says. A file may include a header when the node owning the header is visible to
the file's node, with CMake's rules for usage requirements:

  - a .cc/.cu file sees its node, the node's PUBLIC and PRIVATE dependencies,
    and their PUBLIC dependencies, transitively;
  - a header of a library sees only the library's PUBLIC side, since whoever
    includes it gets no more than that (a header of a leaf, an executable or
    a test folder that nothing links, sees what its .cc files see).

Besides the graph, three rules from ../shared/DESIGN.md:
  - <mpi.h> only in *_mpi.cc (and the tests that run inside an MPI job);
  - <nccl.h> only in *_nccl.cc; CUDA headers only in .cu and *_nccl.cc files;
  - includes of repository files are rooted at the repository
    ("runtime/model/config.h", not "config.h").

Usage:
  check_layers.py --root SRC --graph build/layers.json
      checks every file the graph lists; exit 1 and one line per violation.
  check_layers.py --root SRC --graph build/layers.json --check FILE --as PATH
      checks FILE as if it were the repository file PATH (for the tests).
"""

import argparse
import json
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
HEADER_SUFFIXES = (".h", ".hpp", ".cuh")

# (header pattern, files allowed to include it, what the rule is).
SYSTEM_RULES = [
    (re.compile(r"^mpi\.h$"),
     re.compile(r"(_mpi\.cc|_mpirun_test\.cc|/mpi_test_main\.cc)$"),
     "<mpi.h> stays inside *_mpi.cc files"),
    (re.compile(r"^nccl\.h$"), re.compile(r"_nccl\.cc$"),
     "<nccl.h> stays inside *_nccl.cc files"),
    (re.compile(r"^(cuda|cuda_runtime|cuda_runtime_api|cuda_fp16|cuda_bf16|cublas\w*|"
                r"cub/.*|thrust/.*|cutlass/.*)(\.h|\.cuh)?$"),
     re.compile(r"(\.cu|_nccl\.cc)$"),
     "CUDA headers stay inside .cu (and *_nccl.cc) files"),
]


class Graph:
    def __init__(self, data):
        self.layers = data.get("layers", [])
        self.nodes = data["nodes"]
        self.owners = []  # (prefix or file, node), longest first
        for name, node in self.nodes.items():
            for owned in node["owns"]:
                self.owners.append((owned, name))
        self.owners.sort(key=lambda item: -len(item[0]))
        self._public = {}

    def owner(self, path):
        """The node owning a repo-relative path (or include path), or None."""
        for owned, name in self.owners:
            if owned.endswith("/") and path.startswith(owned) or path == owned:
                return name
        return None

    def public_closure(self, name):
        if name not in self._public:
            self._public[name] = {name}  # guards against cycles
            seen = {name}
            for dep in self.nodes[name]["public"]:
                seen |= self.public_closure(dep)
            self._public[name] = seen
        return self._public[name]

    def visible(self, name, header):
        if header and not self.nodes[name].get("leaf", False):
            return self.public_closure(name)
        seen = {name}
        node = self.nodes[name]
        for dep in node["public"] + node["private"]:
            seen |= self.public_closure(dep)
        return seen

    def deps_text(self, name):
        node = self.nodes[name]
        parts = []
        if node["public"]:
            parts.append("PUBLIC " + " ".join(node["public"]))
        if node["private"]:
            parts.append("PRIVATE " + " ".join(node["private"]))
        return "; ".join(parts) if parts else "no deltaserve dependencies"


_TOP_DIRS = {}


def top_level_dirs(root):
    """The repository's top-level folders: a quoted include starting with one of
    them names a repository file."""
    if root not in _TOP_DIRS:
        _TOP_DIRS[root] = {e for e in os.listdir(root) if os.path.isdir(os.path.join(root, e))}
    return _TOP_DIRS[root]


def check_file(graph, root, shown, text, as_path):
    """Violations of one file, as printable lines. `shown` names it in messages,
    `as_path` is the repository path whose rules apply."""
    node = graph.owner(as_path)
    if node is None:
        return [f"{shown}: no library owns this file (declare its folder with "
                f"deltaserve_library in CMakeLists.txt)"]
    header = as_path.endswith(HEADER_SUFFIXES)
    visible = graph.visible(node, header)
    top_dirs = top_level_dirs(root)
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        match = INCLUDE.match(line)
        if not match:
            continue
        quoted, target = match.group(1) == '"', match.group(2)
        where = f"{shown}:{number}"
        for pattern, allowed, rule in SYSTEM_RULES:
            if pattern.match(target) and not allowed.search("/" + as_path):
                problems.append(f"{where}: includes <{target}>: {rule} (../shared/DESIGN.md)")
        if quoted and "/" not in target and os.path.exists(
                os.path.join(root, os.path.dirname(as_path), target)):
            problems.append(f'{where}: includes "{target}" relative to its folder; root it at '
                            f'the repository: "{os.path.join(os.path.dirname(as_path), target)}"')
            continue
        owner = graph.owner(target)
        if owner is None:
            if quoted and target.split("/")[0] in top_dirs:
                problems.append(f'{where}: includes "{target}", which no library owns')
            continue
        if owner in visible:
            continue
        folder = os.path.dirname(target) + "/"
        if header and owner in graph.visible(node, False):
            why = (f"which {node} depends on only PRIVATE: a header sees the PUBLIC side "
                   f"({graph.deps_text(node)})")
        else:
            why = (f"which {node} does not depend on ({graph.deps_text(node)}; the graph is "
                   f"declared in CMakeLists.txt, layers {' -> '.join(graph.layers)})")
        problems.append(f'{where}: includes "{target}" from {folder} ({owner}), {why}')
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True, help="the repository")
    parser.add_argument("--graph", required=True, help="build/layers.json")
    parser.add_argument("--check", help="check only this file ...")
    parser.add_argument("--as", dest="as_path", help="... as if it were this repository path")
    args = parser.parse_args()
    with open(args.graph, encoding="utf-8") as f:
        graph = Graph(json.load(f))

    if args.check:
        if not args.as_path:
            parser.error("--check needs --as")
        jobs = [(args.check, args.check, args.as_path)]
    else:
        jobs = []
        for name, node in graph.nodes.items():
            for path in node["files"]:
                jobs.append((os.path.join(args.root, path), path, path))

    problems = []
    for disk_path, shown, as_path in jobs:
        try:
            with open(disk_path, encoding="utf-8") as f:
                text = f.read()
        except OSError as error:
            problems.append(f"{shown}: cannot read: {error.strerror}")
            continue
        problems.extend(check_file(graph, args.root, shown, text, as_path))
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"check_layers: {len(problems)} include(s) break the library graph",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
