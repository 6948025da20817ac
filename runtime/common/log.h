// The servers' log: one line per event on stderr, each with its time (UTC,
// milliseconds), its level and the part of the server it comes from, as
// text for a person or as a JSON object per line for a log pipeline
// (`--log-format json`). Lines are written whole, so lines of several
// threads never interleave.
//
//   text: 2026-12-03T06:30:00.123Z info coordinator: worker 1 attached: ... key=value ...
//   json: {"time":"2026-12-03T06:30:00.123Z","level":"info","component":"coordinator",
//          "message":"worker 1 attached: ...","key":"value",...}
//
// Field values are strings or numbers; in text a string field with spaces,
// quotes or control characters is quoted and escaped as in JSON. Bytes that
// are not UTF-8 are replaced (U+FFFD), so a JSON line always parses.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <variant>

#include "absl/status/statusor.h"

namespace deltaserve::log {

enum class Format { kText, kJson };
enum class Level { kInfo, kWarning, kError };

// "text" or "json"; anything else is InvalidArgument naming it.
absl::StatusOr<Format> ParseFormat(std::string_view name);

// The format of every line after it; text until called. Set once, at start.
void SetFormat(Format format);

struct Field {
  Field(std::string_view k, std::string_view v) : key(k), value(std::string(v)) {}
  Field(std::string_view k, const char* v) : key(k), value(std::string(v)) {}
  Field(std::string_view k, const std::string& v) : key(k), value(v) {}
  Field(std::string_view k, int64_t v) : key(k), value(v) {}
  Field(std::string_view k, int v) : key(k), value(int64_t{v}) {}
  Field(std::string_view k, uint64_t v) : key(k), value(static_cast<int64_t>(v)) {}
  Field(std::string_view k, double v) : key(k), value(v) {}
  std::string_view key;  // a JSON-safe name: [a-z0-9_]
  std::variant<std::string, int64_t, double> value;
};

// The line of one event, as SetFormat says, without the newline.
std::string FormatLine(Level level, std::string_view component, std::string_view message,
                       std::initializer_list<Field> fields = {});

// Writes FormatLine(...) and a newline to stderr in one write.
void Write(Level level, std::string_view component, std::string_view message,
           std::initializer_list<Field> fields = {});

inline void Info(std::string_view component, std::string_view message,
                 std::initializer_list<Field> fields = {}) {
  Write(Level::kInfo, component, message, fields);
}
inline void Warning(std::string_view component, std::string_view message,
                    std::initializer_list<Field> fields = {}) {
  Write(Level::kWarning, component, message, fields);
}
inline void Error(std::string_view component, std::string_view message,
                  std::initializer_list<Field> fields = {}) {
  Write(Level::kError, component, message, fields);
}

}  // namespace deltaserve::log
