#!/usr/bin/env python3
"""Checks that the user-facing documents speak about the software, not about its development.

The README, docs/, the examples' documents and the Slurm scripts are read by people running
deltaserve. A reference to the project's own work items ("issue 12, item 5", `(issue "The
exact core")`, "the bar for this issue", "a later issue", "stop 3", "earlier in the session")
tells them nothing they can act on, and goes stale as soon as the item closes. What counts as
such a reference, case-insensitive:

  - the word "issue" or "issues" in any form of sentence;
  - "item N" / "items N" and "stop N" (numbered work items);
  - "work item", "filed by";
  - "session" as a stretch of the project's own work ("in one session", "the first session");
    a TLS session ("session resumption", "session cache", "session tickets") is fine;
  - the title of a work item in quotes (the list below, from the titles that were cited).

Usage:
  check_docs.py --root SRC                      checks the tree's documents
  check_docs.py --root SRC --check FILE --as P  checks FILE as if it were P
Exit 1 with one line per finding (file:line: what).
"""

import argparse
import fnmatch
import os
import re
import sys

DOC_FILES = [
    "README.md",
    "docs/*.md",
    "examples/*/*.md",
    "models/*/README.md",
    "deploy/slurm/*.sbatch",
]

# Titles of work items that documents once cited; quoted, they are a citation.
WORK_ITEM_TITLES = [
    "The exact core",
    "Across nodes",
    "The gRPC coordinator",
    "A million-token prefill, proven end to end",
    "One engine path, a scheduler you can test alone",
    "Cluster and batch entry points",
    "Real checkpoints at their stored size",
]

# A TLS session is a thing of the software; these words after "session" say it is one.
TLS_SESSION = re.compile(r"\bsessions?\s+(resumption|cache|tickets?|keys?|ids?)\b", re.I)

PATTERNS = [
    (re.compile(r"\bissues?\b", re.I), "names an issue"),
    (re.compile(r"\bitems?\s+\d+", re.I), "names a numbered work item"),
    (re.compile(r"\bstop\s+\d+\b", re.I), "names a numbered stop of the work"),
    (re.compile(r"\bwork\s+items?\b", re.I), "names a work item"),
    (re.compile(r"\bfiled\s+by\b", re.I), "says who filed something"),
    (re.compile(r"\bsessions?\b"), "speaks of a working session"),
]


def Findings(text):
    """Yields (line number, what) for each reference to the project's own work in text."""
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, what in PATTERNS:
            for match in pattern.finditer(line):
                if "session" in what and TLS_SESSION.match(line, match.start()):
                    continue
                if "session" in what and line[max(0, match.start() - 4):match.start()] == "TLS ":
                    continue
                yield number, '%s: "%s"' % (what, match.group(0))
        lowered = line.lower()
        for title in WORK_ITEM_TITLES:
            for quote in ('"', "\u201c"):
                if quote + title.lower() in lowered:
                    yield number, 'cites the work item "%s"' % title


def DocFiles(root):
    found = []
    for folder, _, names in os.walk(root):
        rel_folder = os.path.relpath(folder, root)
        if rel_folder.startswith(("build", ".git", "Testing")):
            continue
        for name in names:
            rel = os.path.normpath(os.path.join(rel_folder, name))
            if any(fnmatch.fnmatch(rel, pattern) for pattern in DOC_FILES):
                found.append(rel)
    return sorted(found)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--check", help="a file to check instead of the tree")
    parser.add_argument("--as", dest="as_path", help="the tree path --check stands for")
    args = parser.parse_args()
    if args.check:
        files = [(args.check, args.as_path or args.check)]
    else:
        files = [(os.path.join(args.root, rel), rel) for rel in DocFiles(args.root)]
        if not files:
            print("check_docs.py: no documents under %s" % args.root)
            return 1
    failed = False
    for path, shown in files:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for number, what in Findings(text):
            print("%s:%d: %s" % (shown, number, what))
            failed = True
    if failed:
        print("Documents speak to users about the software; say what it does, not which work "
              "item or session it came from.")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
