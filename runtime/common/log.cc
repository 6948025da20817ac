#include "runtime/common/log.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

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

using Json = nlohmann::ordered_json;

Json ValueOf(const Field& f) {
  return std::visit([](const auto& v) { return Json(v); }, f.value);
}

// As batch writes its records: control characters escaped, what is not
// UTF-8 replaced by U+FFFD, NaN and infinities as null.
std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// A string field's text form: as is when it is one plain word, else quoted
// as in JSON.
bool Plain(std::string_view s) {
  if (s.empty()) return false;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f || c == '"' || c == '\\' || c == '=' || u >= 0x80) return false;
  }
  return true;
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
  if (g_format.load(std::memory_order_relaxed) == Format::kJson) {
    Json line = {{"time", Now()},
                 {"level", LevelName(level)},
                 {"component", std::string(component)},
                 {"message", std::string(message)}};
    for (const Field& f : fields) line[std::string(f.key)] = ValueOf(f);
    return Dump(line);
  }
  std::string line = absl::StrCat(Now(), " ", LevelName(level), " ", std::string(component), ": ");
  // The message as it is, but for what would break the line.
  for (const char c : message) line += (c == '\n' || c == '\r') ? ' ' : c;
  for (const Field& f : fields) {
    absl::StrAppend(&line, " ", std::string(f.key), "=");
    const auto* s = std::get_if<std::string>(&f.value);
    line += s != nullptr && Plain(*s) ? *s : Dump(ValueOf(f));
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
