// The positional integer arguments of the small benchmark programs
// (kda_bench, skinny_bench): `PROGRAM [A] [B]`, each one optional.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <vector>

namespace deltaserve::bench {

// Reads argv[1..] as integers into `values`, whose entries are the defaults of
// their positions. Returns the exit status when the program is to stop
// instead: 0 after printing `usage` to stdout for --help or -h, 2 after
// printing it to stderr for anything else (not an integer, or one too many).
inline std::optional<int> ParseIntArgs(int argc, char** argv, const char* usage,
                                       std::vector<int64_t>* values) {
  for (int i = 1; i < argc; ++i) {
    char* end = nullptr;
    const long long value = std::strtoll(argv[i], &end, 10);
    const bool number = *argv[i] != '\0' && *end == '\0';
    if (!number || static_cast<size_t>(i) > values->size()) {
      const std::string_view arg = argv[i];
      const bool help = arg == "--help" || arg == "-h";
      std::fputs(usage, help ? stdout : stderr);
      return help ? 0 : 2;
    }
    (*values)[i - 1] = value;
  }
  return std::nullopt;
}

}  // namespace deltaserve::bench
