#include "launcher/prefill_bar.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace deltaserve {

std::string FormatDuration(double s) {
  // Capped (and NaN made 0) before the cast, which is undefined out of range:
  // a rate near 0 makes an ETA of years.
  constexpr double kMax = 1e8;
  if (!(s > 0)) s = 0;
  if (s > kMax) return ">27000h";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t < 60) return absl::StrCat(t, "s");
  if (t < 3600) return absl::StrCat(t / 60, "m", t % 60 < 10 ? "0" : "", t % 60, "s");
  return absl::StrCat(t / 3600, "h", (t / 60) % 60 < 10 ? "0" : "", (t / 60) % 60, "m");
}

PrefillBar::PrefillBar(bool enabled, Clock::time_point start)
    : enabled_(enabled), terminal_(::isatty(STDERR_FILENO) == 1), start_(start) {}

PrefillBar::~PrefillBar() { Done(); }

std::string PrefillBar::Line(int64_t done, int64_t total, double rate) {
  constexpr int kWidth = 30;
  // The server's numbers: bounded before use, so a bad peer cannot make the
  // bar overflow or divide by zero.
  total = std::max<int64_t>(total, 1);
  done = std::clamp<int64_t>(done, 0, total);
  const double fraction = static_cast<double>(done) / static_cast<double>(total);
  const int filled = static_cast<int>(fraction * kWidth);
  std::string line =
      absl::StrCat("prefill [", std::string(filled, '#'), std::string(kWidth - filled, '.'), "] ",
                   done, "/", total, absl::StrFormat(" tokens (%.0f%%)", fraction * 100));
  if (rate > 0) {
    absl::StrAppend(&line, absl::StrFormat(", %.0f tok/s, ETA ", rate),
                    FormatDuration(static_cast<double>(total - done) / rate));
  }
  return line;
}

void PrefillBar::Update(int64_t tokens_done, int64_t tokens_total) {
  if (!enabled_) return;
  const auto now = Clock::now();
  double rate = 0;
  if (first_done_ < 0) {
    first_done_ = tokens_done;
    first_at_ = now;
    const double s = std::chrono::duration<double>(now - start_).count();
    if (s > 0) rate = static_cast<double>(tokens_done) / s;
  } else {
    const double s = std::chrono::duration<double>(now - first_at_).count();
    if (s > 0) rate = static_cast<double>(tokens_done - first_done_) / s;
  }
  const std::string line = Line(tokens_done, tokens_total, rate);
  if (terminal_) {
    std::fprintf(stderr, "\r%s\033[K", line.c_str());
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
  drawn_ = true;
}

void PrefillBar::Done() {
  if (!drawn_) return;
  drawn_ = false;
  if (terminal_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }
}

}  // namespace deltaserve
