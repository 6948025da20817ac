#!/usr/bin/env bash
# Fails when a C++ or CUDA file of the repository differs from what
# clang-format makes of it with .clang-format, and names every such file.
# The files are git's (tracked, plus new ones not ignored); outside a git
# checkout, every *.h, *.cc, *.cu outside build*/.
#   tools/check_format.sh          check (ctest's format_check runs this)
#   tools/check_format.sh --fix    rewrite the files that differ
# Formatting changes between clang-format releases: CI uses Debian 12's (14),
# which deploy/setup.sh installs; CLANG_FORMAT=... picks another binary.
set -euo pipefail
cd "$(dirname "$0")/.."

fix=0
if [[ "${1:-}" == "--fix" ]]; then
  fix=1
elif [[ $# -gt 0 ]]; then
  echo "usage: $0 [--fix]" >&2
  exit 2
fi

clang_format=${CLANG_FORMAT:-}
if [[ -z "$clang_format" ]]; then
  for candidate in clang-format-14 clang-format; do
    if command -v "$candidate" >/dev/null; then
      clang_format=$candidate
      break
    fi
  done
fi
if [[ -z "$clang_format" ]] || ! command -v "$clang_format" >/dev/null; then
  echo "check_format: clang-format not found (bash deploy/setup.sh installs it)" >&2
  exit 2
fi

files=()
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  while IFS= read -r -d '' f; do
    [[ -f "$f" ]] && files+=("$f")
  done < <(git ls-files -z --cached --others --exclude-standard -- '*.h' '*.cc' '*.cu' | sort -zu)
else
  while IFS= read -r -d '' f; do
    files+=("${f#./}")
  done < <(find . -path './build*' -prune -o -path './.git' -prune -o \
                \( -name '*.h' -o -name '*.cc' -o -name '*.cu' \) -type f -print0 | sort -z)
fi

differ=()
for f in "${files[@]}"; do
  if ! "$clang_format" --style=file --dry-run -Werror "$f" >/dev/null 2>&1; then
    differ+=("$f")
  fi
done

if ((${#differ[@]} == 0)); then
  echo "check_format: ${#files[@]} files formatted ($("$clang_format" --version))"
  exit 0
fi
if ((fix)); then
  "$clang_format" --style=file -i "${differ[@]}"
  printf 'check_format: reformatted %s\n' "${differ[@]}"
  exit 0
fi
printf 'check_format: %s differs from .clang-format\n' "${differ[@]}" >&2
echo "check_format: ${#differ[@]} of ${#files[@]} files differ;" \
     "tools/check_format.sh --fix rewrites them" >&2
exit 1
