// Progress of `deltaserve batch` on stderr: requests done of the total,
// prompt and generated tokens per second, the time left, and where the
// longest prompt being prefilled is; then a summary. The time left is the
// work left at the rate this run has done work so far, the work of a
// request being the bytes of its input line: a long document weighs what
// its length says, where counting requests would let a few short ones
// promise an end that the long one then misses by far. On a terminal the line
// is redrawn in place every second; into a log, a line every 30 seconds.
// Thread-safe (the client runner reports from several threads).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace deltaserve {

class BatchProgress {
 public:
  using Clock = std::chrono::steady_clock;

  // `interval_s` <= 0: the default for where stderr goes; `quiet`: no
  // progress lines, only the summary.
  BatchProgress(bool quiet, double interval_s);

  // The input's requests, and the bytes of their lines.
  void SetTotal(int64_t requests, int64_t bytes);
  void RequestSkipped(int64_t bytes);  // already complete in the output
  void RequestDone(int64_t bytes);     // its last record written now
  void Record(bool error);
  void AddPrompt(int64_t tokens);  // prompt tokens sent to the model
  void AddGenerated(int64_t tokens);
  // The prompt being prefilled that has the most left ("" when none):
  // `what` names it ("id \"doc\" question 2").
  void SetPrefill(const std::string& what, int64_t position, int64_t total);
  // Prints a progress line when the interval has passed.
  void Tick();
  // The last line: what was written, from before and now, rates, time;
  // `retried`: error records from before that were dropped to run again.
  void Summary(const std::string& output, int64_t records_before, int64_t errors_before,
               int64_t retried = 0);

  // The progress line as it would be printed at `now` (Tick prints it).
  std::string Line(Clock::time_point now) const;
  Clock::time_point start() const { return start_; }

 private:
  std::string LineLocked(Clock::time_point now) const;

  const bool quiet_;
  const bool terminal_;
  const double interval_s_;
  const Clock::time_point start_;
  mutable std::mutex mu_;
  Clock::time_point last_print_;
  bool printed_ = false;
  int64_t total_ = 0, skipped_ = 0, done_ = 0;
  int64_t total_bytes_ = 0, skipped_bytes_ = 0, done_bytes_ = 0;
  int64_t records_ = 0, errors_ = 0;
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0;
  std::string prefill_what_;
  int64_t prefill_position_ = 0, prefill_total_ = 0;
};

}  // namespace deltaserve
