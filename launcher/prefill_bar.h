// The prefill progress bar of `deltaserve client generate|score` on stderr:
// prompt tokens done of the total, the rate and the time left, from the
// server's PrefillProgress messages. On a terminal the bar is redrawn in
// place and erased once the prefill is over, so stdout's text is never
// mixed with it; elsewhere (--progress into a log) each update is a line.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace deltaserve {

// "42s", "3m07s", "2h05m": a duration for people (">27000h" past 1e8 s).
std::string FormatDuration(double seconds);

class PrefillBar {
 public:
  using Clock = std::chrono::steady_clock;

  // `enabled`: draw at all (false: every call does nothing). `start`: when
  // the request was sent, the rate's origin until a second update comes.
  PrefillBar(bool enabled, Clock::time_point start);
  ~PrefillBar();  // Done()s

  // A progress message came.
  void Update(int64_t tokens_done, int64_t tokens_total);
  // The prefill is over (a token, the result or an error came): erases the
  // bar on a terminal. Safe to call more than once.
  void Done();

  // The bar's text for `done` of `total` tokens at `rate` tokens/s (<= 0:
  // unknown), without the redraw codes.
  static std::string Line(int64_t done, int64_t total, double rate);

 private:
  const bool enabled_;
  const bool terminal_;
  const Clock::time_point start_;
  bool drawn_ = false;
  // The first update: the rate is measured from it once a second one comes,
  // which leaves out the time the request waited in the queue.
  int64_t first_done_ = -1;
  Clock::time_point first_at_;
};

}  // namespace deltaserve
