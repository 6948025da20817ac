#!/usr/bin/env python3
"""Checks that a linked binary keeps each CPU level's instructions in its own code.

The CPU kernels are compiled once per level (kernels/isa.h) into namespaces
cpu::generic, cpu::avx2 and cpu::avx512 and chosen at run time. Everything
else is compiled for the x86-64 baseline and must run on any x86-64 CPU. A
function or template that two levels both compile (an inline helper left
outside its level's namespace, a library template both instantiate) exists
once in the binary, and the linker keeps one copy for every caller: if that
copy is an AVX-512 one, a machine without AVX-512 crashes in it. This
disassembles the binary and fails, naming the functions, when code outside
cpu::avx2 / cpu::avx512 uses 256-bit registers, or code outside cpu::avx512
uses 512-bit or mask registers or the upper 16 vector registers.

usage: check_isa.py BINARY...
"""
import re
import subprocess
import sys

FUNCTION = re.compile(r"^[0-9a-f]+ <(.*)>:$")
YMM = re.compile(r"%ymm\d+")
AVX512 = re.compile(r"%zmm\d+|%k[1-7]\b|%[xy]mm(1[6-9]|2\d|3[01])\b|\{%k")


def check(path):
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", path],
                         check=True, capture_output=True, text=True).stdout
    bad = {}
    name = None
    for line in out.splitlines():
        m = FUNCTION.match(line)
        if m:
            name = m.group(1)
            continue
        if name is None or "\t" not in line:
            continue
        level = ("avx512" if "::avx512::" in name else
                 "avx2" if "::avx2::" in name else "baseline")
        if level != "avx512" and AVX512.search(line):
            bad.setdefault(name, (level, "AVX-512", line.strip()))
        elif level == "baseline" and YMM.search(line):
            bad.setdefault(name, (level, "AVX", line.strip()))
    return bad


def main():
    failed = False
    for path in sys.argv[1:]:
        bad = check(path)
        for name, (level, kind, line) in sorted(bad.items()):
            print(f"{path}: {name} ({level} code) uses {kind} instructions: {line}")
        failed = failed or bool(bad)
        if not bad:
            print(f"{path}: every function stays within its CPU level")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
