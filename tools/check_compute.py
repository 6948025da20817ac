#!/usr/bin/env python3
"""Checks that the layers and the engine leave all compute to the kernels' ops.

A layer (runtime/model/*_layer.cc, the architectures' residual stacks, the
model's forward pass) and the engine's step path (runtime/engine/) call ops
on views; a
loop of their own over activation values would run on the host whatever
device the data is on, so it is refused. What counts as such compute, in
those files (comments and string literals left out):

  - a range loop over values: `for (float ...`, `for (double ...`;
  - scalar math or conversions of values: std::exp, std::log, std::tanh,
    std::isfinite, FloatToBf16, Bf16ToFloat, and element copies (std::memcpy,
    std::copy, std::copy_n), max_element, partial_sort;
  - a write to an element of a float array the file declares (ScratchFloats,
    std::vector<float>, float*): `name[i] = ...`, `name[i] += ...`.

And at the boundaries between layers (runtime/model/layers.h, model.h,
arch/architecture.h, runtime/engine/stage_runner.h) no declaration takes or
returns a raw `float*`: arrays cross as kernels::Tensor / MutableTensor views
or kernels::Buffer.

Usage:
  check_compute.py --root SRC                      checks the tree
  check_compute.py --root SRC --check FILE --as P  checks FILE as if it were P
Exit 1 with one line per violation (file:line: what).
"""

import argparse
import fnmatch
import os
import re
import sys

COMPUTE_FILES = [
    "runtime/model/*_layer.cc",
    "runtime/model/model.cc",
    "runtime/model/sequence_state.cc",
    "runtime/model/arch/*.cc",
    # The engine's step paths; step_codec.cc moves message bytes, not values.
    "runtime/engine/stage_runner.cc",
    "runtime/engine/step_executor.cc",
    "runtime/engine/replica.cc",
]
BOUNDARY_FILES = [
    "runtime/model/layers.h",
    "runtime/model/model.h",
    "runtime/model/arch/architecture.h",
    "runtime/engine/stage_runner.h",
]

VALUE_LOOP = re.compile(r"\bfor\s*\(\s*(const\s+)?(float|double)\b")
SCALAR_MATH = re.compile(
    r"\b(std::(exp|log|tanh|isfinite|memcpy|copy|copy_n|max_element|partial_sort)|"
    r"FloatToBf16|Bf16ToFloat)\s*\(")
FLOAT_DECL = re.compile(
    r"\b(?:ScratchFloats|std::vector<float>|float\s*\*)\s*&?\s*(\w+)")
RAW_FLOAT_PTR = re.compile(r"\bfloat\s*\*")


def strip(text):
    """Blanks comments and string/char literals, keeping line numbers."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matches(path, patterns):
    return any(fnmatch.fnmatch(path, p) for p in patterns)


def check_text(path, text):
    problems = []
    code = strip(text)
    lines = code.split("\n")
    if matches(path, COMPUTE_FILES):
        floats = set(FLOAT_DECL.findall(code))
        element_write = None
        if floats:
            names = "|".join(sorted(re.escape(f) for f in floats))
            element_write = re.compile(
                r"\b(" + names + r")\s*\[[^\]]*\]\s*([+\-*/]?=)(?!=)")
        for number, line in enumerate(lines, 1):
            if VALUE_LOOP.search(line):
                problems.append((number, "a loop over values; call an op (kernels/) instead"))
            m = SCALAR_MATH.search(line)
            if m:
                problems.append((number, f"{m.group(1)} on values; call an op (kernels/) instead"))
            if element_write is not None:
                m = element_write.search(line)
                if m:
                    problems.append((number, f"writes elements of the float array '{m.group(1)}'; "
                                             "call an op (kernels/) instead"))
    if matches(path, BOUNDARY_FILES):
        for number, line in enumerate(lines, 1):
            if RAW_FLOAT_PTR.search(line):
                problems.append((number, "a raw float* at a layer boundary; pass a "
                                         "kernels::Tensor / MutableTensor view"))
    return [f"{path}:{number}: {what}" for number, what in problems]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True)
    parser.add_argument("--check")
    parser.add_argument("--as", dest="as_path")
    args = parser.parse_args()
    problems = []
    if args.check:
        with open(args.check, encoding="utf-8") as f:
            problems = check_text(args.as_path or args.check, f.read())
        problems = [p.replace(args.as_path, args.check, 1) if args.as_path else p
                    for p in problems]
    else:
        checked = 0
        for folder in ("runtime/model", "runtime/engine"):
            for dirpath, _, files in os.walk(os.path.join(args.root, folder)):
                for name in sorted(files):
                    full = os.path.join(dirpath, name)
                    rel = os.path.relpath(full, args.root)
                    if not matches(rel, COMPUTE_FILES + BOUNDARY_FILES):
                        continue
                    checked += 1
                    with open(full, encoding="utf-8") as f:
                        problems += check_text(rel, f.read())
        if checked == 0:
            problems.append(f"{args.root}: no layer or engine file found")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
