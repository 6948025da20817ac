// The work of a `deltaserve batch` job, read from the input as it is needed
// (the input may hold many long documents; only the requests in flight are
// in memory): each line parsed and checked (launcher/batch_request.h), its
// units whose records the output already holds skipped, the ones that fail
// their checks written as error records, the rest handed out to run. Every
// record goes to the output through here, which is how a request is known
// to be complete. Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "launcher/batch_output.h"
#include "launcher/batch_progress.h"
#include "launcher/batch_request.h"

namespace deltaserve {

class BatchSource {
 public:
  // `model` (may be null: no checks against a model, see UnitsOf), `output`
  // and `progress` must outlive the source. Counts the requests (non-blank
  // lines) for the progress. A line longer than `max_line_bytes` (its
  // newline not counted) is not read into memory: it becomes an error
  // record keyed by its line.
  static absl::StatusOr<std::unique_ptr<BatchSource>> Open(const std::string& path,
                                                           const BatchModel* model,
                                                           int64_t max_line_bytes,
                                                           BatchOutput* output,
                                                           BatchProgress* progress);

  // The next unit to run; nullopt when the input is done. Errors: reading
  // the input, writing the output.
  absl::StatusOr<std::optional<BatchUnit>> Next();
  // Writes a unit's record (an error record when `error`).
  absl::Status Write(const BatchUnit& unit, const std::string& record, bool error);

 private:
  BatchSource(std::string path, const BatchModel* model, int64_t max_line_bytes,
              BatchOutput* output, BatchProgress* progress)
      : path_(std::move(path)),
        model_(model),
        max_line_bytes_(max_line_bytes),
        output_(output),
        progress_(progress) {}
  // Reads lines until one has a unit to run (queued in ready_), or the end.
  absl::Status ReadLocked();
  absl::Status WriteLocked(int64_t line, const std::string& key, const std::string& record,
                           bool error);

  const std::string path_;
  const BatchModel* const model_;
  const int64_t max_line_bytes_;
  BatchOutput* const output_;
  BatchProgress* const progress_;
  std::mutex mu_;
  std::ifstream in_;
  int64_t line_number_ = 0;
  bool end_ = false;
  std::deque<BatchUnit> ready_;
  std::map<std::string, int64_t> first_line_;  // of each id
  struct OpenLine {
    int records = 0;    // still to write
    int64_t bytes = 0;  // of the line, its work for the progress's time left
  };
  std::map<int64_t, OpenLine> open_;  // by line
};

}  // namespace deltaserve
