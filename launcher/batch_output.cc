#include "launcher/batch_output.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "runtime/common/file_util.h"
#include "runtime/common/json_bounds.h"
#include "runtime/common/status_macros.h"

namespace deltaserve {
namespace {

using json = nlohmann::ordered_json;

// A float as the double with the fewest digits that reads back as the same
// float ("-2.7725887", not "-2.772588729858398"); null when not finite,
// which JSON cannot hold.
json Number(float value) {
  if (!std::isfinite(value)) return nullptr;
  char buffer[32];
  const auto end = std::to_chars(buffer, buffer + sizeof(buffer), value).ptr;
  return std::strtod(std::string(buffer, end).c_str(), nullptr);
}

json Numbers(const std::vector<float>& values) {
  json list = json::array();
  for (float v : values) list.push_back(Number(v));
  return list;
}

// The id and, for the long-document form, the question: the first fields.
json Head(const std::string& id_json, int question) {
  json record = json::object();
  record["id"] = id_json.empty() ? json(nullptr) : json::parse(id_json);
  if (question >= 0) record["question"] = question;
  return record;
}

// Seconds to the microsecond.
json Timings(const BatchTimings& t, bool generate) {
  auto us = [](double s) { return std::round(s * 1e6) / 1e6; };
  json out = json::object();
  out["queue_s"] = us(t.queue_s);
  if (generate) out["time_to_first_token_s"] = us(t.time_to_first_token_s);
  out["total_s"] = us(t.total_s);
  return out;
}

std::string Line(const json& record) {
  return record.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string Errno(const std::string& path, const std::string& what) {
  return absl::StrCat(path, ": ", what, ": ", std::strerror(errno));
}

// The fields each kind of record may have (ShapeProblem checks the required
// ones).
const std::set<std::string> kGenerateFields = {
    "id",       "question",     "text",  "token_ids", "finish_reason", "stop",
    "logprobs", "top_logprobs", "reply", "usage",     "timings"};
const std::set<std::string> kScoreFields = {
    "id", "question", "token_ids", "logprobs", "total_logprob", "usage", "timings"};
const std::set<std::string> kErrorFields = {"id", "question", "line", "error"};

bool IsIntegerList(const json& v) {
  return v.is_array() &&
         std::all_of(v.begin(), v.end(), [](const json& x) { return x.is_number_integer(); });
}

// Why `record` is not one of the records this command writes, or "".
std::string ShapeProblem(const json& record) {
  if (!record.is_object()) return "not a JSON object";
  if (!record.contains("id")) return "no id";
  const json& id = record["id"];
  if (!id.is_string() && !id.is_number_integer() && !id.is_null()) {
    return "id is not a string, an integer or null";
  }
  if (record.contains("question")) {
    const json& q = record["question"];
    if (!q.is_number_integer() || q.get<int64_t>() < 0 ||
        q.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return "question is not an index";
    }
  }
  const std::set<std::string>* fields = nullptr;
  if (record.contains("error")) {
    fields = &kErrorFields;
    if (!record["error"].is_string()) return "error is not a string";
    if (!record.contains("line") || !record["line"].is_number_integer() ||
        record["line"].get<int64_t>() < 1) {
      return "an error record without its line";
    }
  } else {
    if (id.is_null()) return "null id in a result";
    if (!record.contains("token_ids") || !IsIntegerList(record["token_ids"])) {
      return "no token_ids";
    }
    if (!record.contains("usage") || !record["usage"].is_object()) return "no usage";
    if (!record.contains("timings") || !record["timings"].is_object()) return "no timings";
    if (record.contains("finish_reason")) {
      fields = &kGenerateFields;
      if (!record["finish_reason"].is_string()) return "finish_reason is not a string";
    } else if (record.contains("total_logprob")) {
      fields = &kScoreFields;
      if (!record.contains("logprobs") || !record["logprobs"].is_array()) return "no logprobs";
    } else {
      return "neither a result (finish_reason, total_logprob) nor an error";
    }
  }
  for (const auto& [key, value] : record.items()) {
    if (!fields->count(key)) return absl::StrCat("a field '", key, "' that no record has");
  }
  return "";
}

}  // namespace

absl::StatusOr<BatchRecordRead> ReadBatchRecord(std::string_view line) {
  // A record is one object with lists of numbers at most 3 levels down
  // (top_logprobs); nlohmann's parser throws nothing with
  // allow_exceptions=false, and the bound keeps a foreign file's deep
  // nesting out of it.
  if (absl::Status s = CheckJsonBounds(line, int64_t{1} << 30, 8, "the line"); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("not a batch record (", s.message(), ")"));
  }
  const json record = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (record.is_discarded()) return absl::InvalidArgumentError("not JSON");
  if (const std::string problem = ShapeProblem(record); !problem.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("not a batch record (", problem, ")"));
  }
  BatchRecordRead read;
  read.error = record.contains("error");
  const int question = record.contains("question") ? record["question"].get<int>() : -1;
  const json& id = record["id"];
  read.key = id.is_null()
                 ? RecordKey("", question, record["line"].get<int64_t>())
                 : RecordKey(id.dump(-1, ' ', false, json::error_handler_t::replace), question, 0);
  return read;
}

std::string GenerateRecord(const BatchUnit& unit, const GenerateOutcome& o) {
  json record = Head(unit.id_json, unit.question);
  if (o.has_text) record["text"] = o.text;
  record["token_ids"] = o.token_ids;
  record["finish_reason"] = o.finish_reason;
  if (!o.stop.empty()) record["stop"] = o.stop;
  if (o.reply) {
    json calls = json::array();
    for (const ChatToolCall& call : o.reply->tool_calls) {
      calls.push_back(json{{"id", call.id}, {"name", call.name}, {"arguments", call.arguments}});
    }
    record["reply"] = json{{"content", o.reply->content},
                           {"reasoning_content", o.reply->reasoning_content},
                           {"tool_calls", std::move(calls)}};
  }
  if (unit.logprobs()) record["logprobs"] = Numbers(o.logprobs);
  if (unit.request.top_logprobs > 0) {
    json all = json::array();
    for (const auto& alternatives : o.top_logprobs) {
      json list = json::array();
      for (const auto& [id, logprob] : alternatives) {
        list.push_back(json{{"id", id}, {"logprob", Number(logprob)}});
      }
      all.push_back(std::move(list));
    }
    record["top_logprobs"] = std::move(all);
  }
  record["usage"] = json{{"prompt_tokens", o.prompt_tokens},
                         {"completion_tokens", static_cast<int64_t>(o.token_ids.size())}};
  record["timings"] = Timings(o.timings, true);
  return Line(record);
}

std::string ScoreRecord(const BatchUnit& unit, const ScoreOutcome& o) {
  json record = Head(unit.id_json, unit.question);
  record["token_ids"] = o.token_ids;
  record["logprobs"] = Numbers(o.logprobs);
  double total = 0;
  for (float lp : o.logprobs) total += lp;
  record["total_logprob"] = std::isfinite(total) ? json(total) : json(nullptr);
  record["usage"] = json{{"prompt_tokens", static_cast<int64_t>(o.token_ids.size())}};
  record["timings"] = Timings(o.timings, false);
  return Line(record);
}

std::string ErrorRecord(const std::string& id_json, int question, int64_t line,
                        const std::string& message) {
  json record = Head(id_json, question);
  record["line"] = line;
  record["error"] = message;
  return Line(record);
}

absl::StatusOr<std::unique_ptr<BatchOutput>> BatchOutput::Open(const std::string& path,
                                                               bool overwrite,
                                                               const std::string& input,
                                                               bool retry_errors) {
  struct stat before {};
  const bool existed = ::lstat(path.c_str(), &before) == 0;  // a new name: sync its directory
  absl::StatusOr<int> fd = OpenOutputFile(path, O_RDWR | O_CREAT | O_APPEND, 0644);
  if (!fd.ok()) {
    return absl::Status(fd.status().code(), absl::StrCat(fd.status().message(), " (--output)"));
  }
  std::unique_ptr<BatchOutput> out(new BatchOutput(path, *fd));
  // The same file as the input (by device and inode: another path to it, a
  // hard link, an input that is a link to the output) would be read as the
  // output, and emptied or appended to.
  struct stat in {};
  struct stat opened {};
  if (::stat(input.c_str(), &in) == 0 && ::fstat(*fd, &opened) == 0 && in.st_dev == opened.st_dev &&
      in.st_ino == opened.st_ino) {
    return absl::InvalidArgumentError(
        absl::StrCat("--output ", path, " is the same file as --input ", input));
  }
  if (::flock(*fd, LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": in use by another `deltaserve batch` (locked)"));
  }
  if (overwrite && ::ftruncate(*fd, 0) != 0) {
    return absl::InternalError(Errno(path, "cannot empty it"));
  }
  // Read what is there: every complete line is a record; a last line
  // without its newline was cut by a crash and goes.
  struct stat st;
  if (::fstat(*fd, &st) != 0) return absl::InternalError(Errno(path, "cannot stat"));
  std::string text(static_cast<size_t>(st.st_size), '\0');
  for (size_t got = 0; got < text.size();) {
    const ssize_t n = ::pread(*fd, text.data() + got, text.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::InternalError(Errno(path, "cannot read"));
    got += static_cast<size_t>(n);
  }
  const size_t keep = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
  if (keep < text.size()) {
    out->cut_bytes_ = static_cast<int64_t>(text.size() - keep);
    if (::ftruncate(*fd, static_cast<off_t>(keep)) != 0 || ::fdatasync(*fd) != 0) {
      return absl::InternalError(Errno(path, "cannot cut the unfinished last line"));
    }
    text.resize(keep);
  }
  int64_t line_number = 0;
  std::string kept;  // the records but the errors, for --retry-errors
  for (size_t at = 0; at < text.size();) {
    const size_t end = text.find('\n', at);
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    ++line_number;
    absl::StatusOr<BatchRecordRead> record = ReadBatchRecord(line);
    if (!record.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " line ", line_number, ": ", record.status().message(),
                       "; not resuming into a file this command did not write"));
    }
    if (record->error && retry_errors) {
      ++out->retried_;
      continue;
    }
    out->done_.insert(record->key);
    ++out->records_before_;
    if (record->error) ++out->errors_before_;
    if (retry_errors) absl::StrAppend(&kept, line, "\n");
  }
  if (out->retried_ > 0) {
    text.clear();
    DELTASERVE_RETURN_IF_ERROR(out->DropErrors(kept));
  }
  if (!existed) {
    // The new file's name must survive a crash too.
    const std::filesystem::path dir = std::filesystem::absolute(path).parent_path();
    const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd >= 0) {
      ::fsync(dir_fd);
      ::close(dir_fd);
    }
  }
  return out;
}

absl::Status BatchOutput::DropErrors(const std::string& kept) {
  // A name of our own beside the file (same directory, so the rename is
  // atomic); O_EXCL, so nothing already there is written through.
  const std::string temp = absl::StrCat(path_, ".retry-", ::getpid());
  const int fd = ::open(temp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(Errno(temp, "cannot create the rewritten output"));
  auto fail = [&](const std::string& what) {
    const absl::Status status = absl::InternalError(Errno(temp, what));
    ::close(fd);
    ::unlink(temp.c_str());
    return status;
  };
  // Locked before it takes the output's name, so no second job gets it.
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) return fail("cannot lock");
  for (size_t done = 0; done < kept.size();) {
    const ssize_t n = ::write(fd, kept.data() + done, kept.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail("cannot write the records kept");
    done += static_cast<size_t>(n);
  }
  if (::fdatasync(fd) != 0) return fail("cannot sync");
  if (::rename(temp.c_str(), path_.c_str()) != 0) return fail("cannot rename over the output");
  const std::filesystem::path dir = std::filesystem::absolute(path_).parent_path();
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  ::close(fd_);
  fd_ = fd;
  return absl::OkStatus();
}

BatchOutput::~BatchOutput() { ::close(fd_); }

bool BatchOutput::Done(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_.count(key) > 0;
}

absl::Status BatchOutput::Append(const std::string& key, const std::string& record) {
  std::lock_guard<std::mutex> lock(mu_);
  if (record.empty() || record.back() != '\n' || record.find('\n') != record.size() - 1) {
    return absl::InternalError(absl::StrCat("a record for ", key, " is not one line"));
  }
  if (!done_.insert(key).second) {
    return absl::InternalError(absl::StrCat("a second record for ", key));
  }
  // One write of the whole line: with O_APPEND it lands whole at the end, or
  // (a crash) as a prefix that the next Open cuts.
  const ssize_t n = ::write(fd_, record.data(), record.size());
  if (n != static_cast<ssize_t>(record.size())) {
    const std::string why = n < 0 ? std::strerror(errno) : "short write (disk full?)";
    return absl::InternalError(absl::StrCat(path_, ": cannot append a record: ", why));
  }
  if (::fdatasync(fd_) != 0) return absl::InternalError(Errno(path_, "cannot sync"));
  return absl::OkStatus();
}

}  // namespace deltaserve
