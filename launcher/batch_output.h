// The output of `deltaserve batch`: one JSON record per line, and the file
// that holds them, written so that a job killed at any moment (kill -9, a
// lost node) can be rerun and completes it: every record goes out whole in
// one write(2) to an O_APPEND file and is synced before the next; on
// opening, a last line without its newline (a write cut by a crash) is cut
// off, and the keys of the records already there are what the rerun skips.
// An flock keeps a second batch process off the same file.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/batch_request.h"
#include "runtime/tokenizer/chat_format.h"

namespace deltaserve {

struct BatchTimings {
  double queue_s = 0;                // queued -> first step
  double time_to_first_token_s = 0;  // queued -> first token (generate)
  double total_s = 0;                // queued -> finished
};

struct GenerateOutcome {
  std::vector<int32_t> token_ids;
  bool has_text = false;  // the model has a tokenizer
  std::string text;
  std::string finish_reason;  // "length", "stop" or "context"
  std::string stop;           // the stop string, or "token N"
  std::vector<float> logprobs;
  std::vector<std::vector<std::pair<int32_t, float>>> top_logprobs;
  std::optional<ChatReply> reply;  // a conversation's: the chat format's parse of `text`
  int64_t prompt_tokens = 0;
  BatchTimings timings;
};

struct ScoreOutcome {
  std::vector<int32_t> token_ids;
  std::vector<float> logprobs;  // log p(token_ids[i + 1] | token_ids[0..i])
  BatchTimings timings;
};

// The records, one line each, with their newline.
std::string GenerateRecord(const BatchUnit& unit, const GenerateOutcome& outcome);
std::string ScoreRecord(const BatchUnit& unit, const ScoreOutcome& outcome);
// `id_json` empty: the record's id is null, and its line is its key.
std::string ErrorRecord(const std::string& id_json, int question, int64_t line,
                        const std::string& message);

// A line of an output read back: its key (RecordKey) and whether it is an
// error record.
struct BatchRecordRead {
  std::string key;
  bool error = false;
};

// Reads one line of an output as a record of this command, or says why it
// is not one (throws nothing, whatever the bytes). A record is a JSON object
// whose "id" is a string or an integer (null only in an error record) and
// whose "question", when there, is an index >= 0, of one of three shapes,
// with no field beyond its own: an error record ("line" >= 1, "error" a
// string), a generate record ("token_ids" integers, "finish_reason" a
// string, "usage" and "timings" objects; "text", "stop", "logprobs",
// "top_logprobs", "reply" may be there) or a score record ("token_ids", "logprobs" a
// list, "total_logprob", "usage", "timings").
absl::StatusOr<BatchRecordRead> ReadBatchRecord(std::string_view line);

class BatchOutput {
 public:
  // Opens `path` for appending (creating it), locked for this process; with
  // `overwrite`, empties it first. The path must be a new name or a regular
  // file (OpenOutputFile, runtime/common/file_util.h: a symbolic link, a
  // FIFO or a device is refused, never followed), and not the same file as
  // `input` (by device and inode). Fails naming the path and line when a
  // complete line is not a record (ReadBatchRecord: not a file this command
  // wrote). With `retry_errors`, the error records there are dropped (the
  // file is rewritten without them, into a new file renamed over it, so a
  // crash leaves the old file or the new one) and their requests run again.
  static absl::StatusOr<std::unique_ptr<BatchOutput>> Open(const std::string& path, bool overwrite,
                                                           const std::string& input,
                                                           bool retry_errors = false);
  ~BatchOutput();
  BatchOutput(const BatchOutput&) = delete;
  BatchOutput& operator=(const BatchOutput&) = delete;

  bool Done(const std::string& key) const;
  int64_t records_before() const { return records_before_; }
  int64_t errors_before() const { return errors_before_; }
  int64_t cut_bytes() const { return cut_bytes_; }  // an unfinished last line, cut
  int64_t retried() const { return retried_; }      // error records dropped to run again
  // Appends one record (a line ending in '\n') under `key`, synced to disk
  // before it returns. Thread-safe. A key already written is refused.
  absl::Status Append(const std::string& key, const std::string& record);

 private:
  BatchOutput(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  // Rewrites the file with only `kept` (its records but the errors): a new
  // file beside it, locked, synced and renamed over it, which then replaces
  // fd_.
  absl::Status DropErrors(const std::string& kept);

  const std::string path_;
  int fd_;
  mutable std::mutex mu_;
  std::set<std::string> done_;
  int64_t records_before_ = 0, errors_before_ = 0, cut_bytes_ = 0, retried_ = 0;
};

}  // namespace deltaserve
