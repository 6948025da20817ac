#include "runtime/common/log.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <ctime>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace deltaserve::log {
namespace {

std::atomic<Format> g_format{Format::kText};

const char* LevelName(Level level) {
  switch (level) {
    case Level::kInfo:
      return "info";
    case Level::kWarning:
      return "warning";
    case Level::kError:
      return "error";
  }
  return "info";
}

std::string Now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const int64_t ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S", &utc);
  return absl::StrFormat("%s.%03dZ", text, static_cast<int>(ms));
}

// The length of the UTF-8 sequence at s[i], or 0 when it is not one
// (overlong, surrogate, beyond U+10FFFF, cut short).
size_t Utf8Length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t n = 0;
  uint32_t cp = 0;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2, cp = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3, cp = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4, cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3f);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10ffff ||
      (cp >= 0xd800 && cp <= 0xdfff)) {
    return 0;
  }
  return n;
}

// `s` as the inside of a JSON string: quotes, backslashes and control
// characters escaped, what is not UTF-8 replaced by U+FFFD.
void AppendEscaped(std::string& out, std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
      ++i;
    } else if (c == '\n') {
      out += "\\n", ++i;
    } else if (c == '\t') {
      out += "\\t", ++i;
    } else if (c == '\r') {
      out += "\\r", ++i;
    } else if (c < 0x20 || c == 0x7f) {
      out += absl::StrFormat("\\u%04x", c), ++i;
    } else if (const size_t n = Utf8Length(s, i); n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xef\xbf\xbd";  // U+FFFD
      ++i;
    }
  }
}

void AppendQuoted(std::string& out, std::string_view s) {
  out += '"';
  AppendEscaped(out, s);
  out += '"';
}

// A string field's text form: as is when it is one plain word.
void AppendTextValue(std::string& out, std::string_view s) {
  bool plain = !s.empty();
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f || c == '"' || c == '\\' || c == '=' || u >= 0x80) plain = false;
  }
  if (plain) {
    out.append(s);
  } else {
    AppendQuoted(out, s);
  }
}

void AppendNumber(std::string& out, const std::variant<std::string, int64_t, double>& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) {
    absl::StrAppend(&out, *i);
  } else {
    const double d = std::get<double>(v);
    // JSON has no NaN or infinity: such a value is written as null.
    if (std::isfinite(d)) {
      absl::StrAppend(&out, absl::StrFormat("%.6g", d));
    } else {
      out += "null";
    }
  }
}

}  // namespace

absl::StatusOr<Format> ParseFormat(std::string_view name) {
  if (name == "text") return Format::kText;
  if (name == "json") return Format::kJson;
  return absl::InvalidArgumentError(
      absl::StrCat("log format \"", std::string(name.substr(0, 64)), "\": use text or json"));
}

void SetFormat(Format format) { g_format.store(format, std::memory_order_relaxed); }

std::string FormatLine(Level level, std::string_view component, std::string_view message,
                       std::initializer_list<Field> fields) {
  std::string line;
  line.reserve(128 + message.size());
  if (g_format.load(std::memory_order_relaxed) == Format::kJson) {
    line += "{\"time\":\"" + Now() + "\",\"level\":\"" + LevelName(level) + "\",\"component\":";
    AppendQuoted(line, component);
    line += ",\"message\":";
    AppendQuoted(line, message);
    for (const Field& f : fields) {
      line += ',';
      AppendQuoted(line, f.key);
      line += ':';
      if (const auto* s = std::get_if<std::string>(&f.value)) {
        AppendQuoted(line, *s);
      } else {
        AppendNumber(line, f.value);
      }
    }
    line += '}';
    return line;
  }
  line += Now();
  line += ' ';
  line += LevelName(level);
  line += ' ';
  // The message as it is, but for what would break the line.
  line.append(component);
  line += ": ";
  for (size_t i = 0; i < message.size(); ++i) {
    const char c = message[i];
    line += (c == '\n' || c == '\r') ? ' ' : c;
  }
  for (const Field& f : fields) {
    line += ' ';
    line.append(f.key);
    line += '=';
    if (const auto* s = std::get_if<std::string>(&f.value)) {
      AppendTextValue(line, *s);
    } else {
      AppendNumber(line, f.value);
    }
  }
  return line;
}

void Write(Level level, std::string_view component, std::string_view message,
           std::initializer_list<Field> fields) {
  std::string line = FormatLine(level, component, message, fields);
  line += '\n';
  // One write(2) per line (stderr is unbuffered), one line at a time: whole
  // lines, whatever the threads; a short write (a pipe's limit) goes on
  // where it stopped.
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace deltaserve::log
