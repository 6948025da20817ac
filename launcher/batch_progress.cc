#include "launcher/batch_progress.h"

#include <unistd.h>

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

void BatchProgress::SetTotal(int64_t requests) {
  std::lock_guard<std::mutex> lock(mu_);
  total_ = requests;
}

void BatchProgress::RequestSkipped() {
  std::lock_guard<std::mutex> lock(mu_);
  ++skipped_;
}

void BatchProgress::RequestDone() {
  std::lock_guard<std::mutex> lock(mu_);
  ++done_;
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

std::string BatchProgress::LineLocked(Clock::time_point now) const {
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const int64_t complete = skipped_ + done_;
  std::string line = absl::StrCat("batch: ", complete, "/", total_, " requests");
  if (skipped_ > 0) absl::StrAppend(&line, " (", skipped_, " from before)");
  if (errors_ > 0) absl::StrAppend(&line, ", ", errors_, " errors");
  absl::StrAppend(&line, ", prompt ", Rate(static_cast<double>(prompt_tokens_), elapsed),
                  " tok/s, generated ", Rate(static_cast<double>(generated_tokens_), elapsed),
                  " tok/s");
  // The time left at this run's pace: requests left over requests done.
  if (done_ > 0 && complete < total_) {
    absl::StrAppend(&line, ", ETA ",
                    FormatDuration(elapsed * static_cast<double>(total_ - complete) /
                                   static_cast<double>(done_)));
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
                            int64_t errors_before) {
  std::lock_guard<std::mutex> lock(mu_);
  const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
  if (terminal_ && printed_) std::fprintf(stderr, "\r\033[K");
  std::string line = absl::StrCat("batch: wrote ", records_, " records (", errors_, " errors) to ",
                                  output, " in ", FormatDuration(elapsed), "; ");
  if (records_before > 0) {
    absl::StrAppend(&line, records_before, " records (", errors_before,
                    " errors) were there from before; ");
  }
  absl::StrAppend(&line, skipped_ + done_, "/", total_, " requests complete; prompt ",
                  prompt_tokens_, " tokens (", Rate(static_cast<double>(prompt_tokens_), elapsed),
                  " tok/s), generated ", generated_tokens_, " tokens (",
                  Rate(static_cast<double>(generated_tokens_), elapsed), " tok/s)");
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

}  // namespace deltaserve
