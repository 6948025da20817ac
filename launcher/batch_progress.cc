#include "launcher/batch_progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "launcher/prefill_bar.h"

namespace deltaserve {
namespace {

std::string Rate(double count, double seconds) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.1f", seconds > 0 ? count / seconds : 0.0);
  return buffer;
}

}  // namespace

BatchProgress::BatchProgress(bool quiet, double interval_s)
    : quiet_(quiet),
      terminal_(::isatty(STDERR_FILENO) == 1),
      interval_s_(interval_s > 0 ? interval_s : (terminal_ ? 1.0 : 30.0)),
      start_(Clock::now()),
      last_print_(start_) {}

void BatchProgress::SetTotal(int64_t requests, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  total_ = requests;
  total_bytes_ = bytes;
}

void BatchProgress::RequestSkipped(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  ++skipped_;
  skipped_bytes_ += bytes;
}

void BatchProgress::RequestDone(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  ++done_;
  done_bytes_ += bytes;
}

void BatchProgress::Record(bool error) {
  std::lock_guard<std::mutex> lock(mu_);
  ++records_;
  errors_ += error;
}

void BatchProgress::AddPrompt(int64_t tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += tokens;
}

void BatchProgress::AddGenerated(int64_t tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  generated_tokens_ += tokens;
}

void BatchProgress::SetPrefill(const std::string& what, int64_t position, int64_t total) {
  std::lock_guard<std::mutex> lock(mu_);
  prefill_what_ = what;
  prefill_position_ = position;
  prefill_total_ = total;
}

std::string BatchProgress::Line(Clock::time_point now) const {
  std::lock_guard<std::mutex> lock(mu_);
  return LineLocked(now);
}

std::string BatchProgress::LineLocked(Clock::time_point now) const {
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const int64_t complete = skipped_ + done_;
  std::string line = absl::StrCat("batch: ", complete, "/", total_, " requests");
  if (skipped_ > 0) absl::StrAppend(&line, " (", skipped_, " from before)");
  if (errors_ > 0) absl::StrAppend(&line, ", ", errors_, " errors");
  absl::StrAppend(&line, ", prompt ", Rate(static_cast<double>(prompt_tokens_), elapsed),
                  " tok/s, generated ", Rate(static_cast<double>(generated_tokens_), elapsed),
                  " tok/s");
  // The time left: the work left (bytes of the requests not complete) at
  // the rate of this run's work done (bytes of the requests it completed,
  // per second). Requests complete from before are neither.
  const int64_t left_bytes = total_bytes_ - skipped_bytes_ - done_bytes_;
  if (done_bytes_ > 0 && complete < total_ && elapsed > 0) {
    const double rate = static_cast<double>(done_bytes_) / elapsed;
    absl::StrAppend(&line, ", ETA ",
                    FormatDuration(static_cast<double>(std::max<int64_t>(left_bytes, 0)) / rate));
  }
  if (!prefill_what_.empty()) {
    absl::StrAppend(&line, "; prefill of ", prefill_what_, " at ", prefill_position_, "/",
                    prefill_total_, " tokens");
  }
  return line;
}

void BatchProgress::Tick() {
  if (quiet_) return;
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  if (std::chrono::duration<double>(now - last_print_).count() < interval_s_) return;
  last_print_ = now;
  printed_ = true;
  const std::string line = LineLocked(now);
  if (terminal_) {
    std::fprintf(stderr, "\r%s\033[K", line.c_str());
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

void BatchProgress::Summary(const std::string& output, int64_t records_before,
                            int64_t errors_before, int64_t retried) {
  std::lock_guard<std::mutex> lock(mu_);
  const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
  if (terminal_ && printed_) std::fprintf(stderr, "\r\033[K");
  std::string line = absl::StrCat("batch: wrote ", records_, " records (", errors_, " errors) to ",
                                  output, " in ", FormatDuration(elapsed), "; ");
  if (records_before > 0) {
    absl::StrAppend(&line, records_before, " records (", errors_before,
                    " errors) were there from before; ");
  }
  if (retried > 0) {
    absl::StrAppend(&line, retried, " error records from before were run again (--retry-errors); ");
  }
  absl::StrAppend(&line, skipped_ + done_, "/", total_, " requests complete; prompt ",
                  prompt_tokens_, " tokens (", Rate(static_cast<double>(prompt_tokens_), elapsed),
                  " tok/s), generated ", generated_tokens_, " tokens (",
                  Rate(static_cast<double>(generated_tokens_), elapsed), " tok/s)");
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

}  // namespace deltaserve
