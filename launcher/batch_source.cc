#include "launcher/batch_source.h"

#include <istream>
#include <string>
#include <variant>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace deltaserve {

namespace {

enum class LineRead { kEnd, kLine, kTooLong };

// Reads the next line (without its newline) into `line`, keeping at most
// `max_bytes` of it: a longer line is read to its end but not kept
// (kTooLong, `line` empty). `line` null: the line is only measured, nothing
// kept. `blank`: only ASCII whitespace (a line too long is never blank).
// `bytes`: the line's length, kept or not.
LineRead ReadLine(std::istream& in, int64_t max_bytes, std::string* line, bool* blank,
                  int64_t* bytes) {
  std::string unused;
  const bool keep = line != nullptr;
  if (!keep) line = &unused;
  line->clear();
  int64_t length = 0;
  *blank = true;
  *bytes = 0;
  std::streambuf* buf = in.rdbuf();
  bool any = false, too_long = false;
  for (;;) {
    const int c = buf->sbumpc();
    if (c == std::char_traits<char>::eof()) {
      in.setstate(std::ios::eofbit);
      if (!any) return LineRead::kEnd;
      break;
    }
    any = true;
    if (c == '\n') break;
    ++*bytes;
    if (too_long) continue;
    if (length++ >= max_bytes) {
      too_long = true;
      *blank = false;
      line->clear();
      line->shrink_to_fit();
      continue;
    }
    if (keep) line->push_back(static_cast<char>(c));
    if (!absl::ascii_isspace(static_cast<unsigned char>(c))) *blank = false;
  }
  return too_long ? LineRead::kTooLong : LineRead::kLine;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BatchSource>> BatchSource::Open(const std::string& path,
                                                               const BatchModel* model,
                                                               int64_t max_line_bytes,
                                                               BatchOutput* output,
                                                               BatchProgress* progress) {
  std::unique_ptr<BatchSource> source(
      new BatchSource(path, model, max_line_bytes, output, progress));
  int64_t requests = 0, request_bytes = 0;
  {
    std::ifstream count(path);
    if (!count) return absl::NotFoundError(absl::StrCat(path, ": cannot open (--input)"));
    bool blank = true;
    int64_t bytes = 0;
    for (LineRead r;
         (r = ReadLine(count, max_line_bytes, nullptr, &blank, &bytes)) != LineRead::kEnd;) {
      if (blank) continue;
      ++requests;
      request_bytes += bytes;
    }
    if (count.bad()) return absl::DataLossError(absl::StrCat(path, ": read error (--input)"));
  }
  progress->SetTotal(requests, request_bytes);
  source->in_.open(path);
  if (!source->in_) return absl::NotFoundError(absl::StrCat(path, ": cannot open (--input)"));
  return source;
}

absl::StatusOr<std::optional<BatchUnit>> BatchSource::Next() {
  std::lock_guard<std::mutex> lock(mu_);
  if (ready_.empty()) {
    if (absl::Status s = ReadLocked(); !s.ok()) return s;
  }
  if (ready_.empty()) return std::optional<BatchUnit>();
  BatchUnit unit = std::move(ready_.front());
  ready_.pop_front();
  return std::optional<BatchUnit>(std::move(unit));
}

absl::Status BatchSource::Write(const BatchUnit& unit, const std::string& record, bool error) {
  std::lock_guard<std::mutex> lock(mu_);
  return WriteLocked(unit.line, RecordKey(unit.id_json, unit.question, unit.line), record, error);
}

absl::Status BatchSource::WriteLocked(int64_t line, const std::string& key,
                                      const std::string& record, bool error) {
  if (absl::Status s = output_->Append(key, record); !s.ok()) return s;
  progress_->Record(error);
  auto it = open_.find(line);
  if (it != open_.end() && --it->second.records == 0) {
    progress_->RequestDone(it->second.bytes);
    open_.erase(it);
  }
  progress_->Tick();
  return absl::OkStatus();
}

absl::Status BatchSource::ReadLocked() {
  std::string text;
  while (ready_.empty() && !end_) {
    bool blank = true;
    int64_t bytes = 0;
    const LineRead read = ReadLine(in_, max_line_bytes_, &text, &blank, &bytes);
    if (read == LineRead::kEnd) {
      if (in_.bad()) return absl::DataLossError(absl::StrCat(path_, ": read error"));
      end_ = true;
      break;
    }
    const int64_t line = ++line_number_;
    if (blank) continue;
    std::variant<BatchRequest, BatchLineError> parsed;
    if (read == LineRead::kTooLong) {
      BatchLineError error;
      error.line = line;
      error.message = absl::StrCat("longer than the limit of ", max_line_bytes_,
                                   " bytes (--max-line-bytes); not read");
      parsed = std::move(error);
    } else {
      parsed = ParseBatchLine(text, line);
    }
    text.clear();
    if (auto* request = std::get_if<BatchRequest>(&parsed)) {
      // An id seen before makes this line an error of its own, keyed by line.
      auto [first, inserted] = first_line_.emplace(request->id_json, line);
      if (!inserted) {
        BatchLineError dup;
        dup.line = line;
        dup.message = absl::StrCat("duplicate id ", request->id_json, " (first on line ",
                                   first->second, "); this line is not run");
        parsed = std::move(dup);
      }
    } else {
      const BatchLineError& e = std::get<BatchLineError>(parsed);
      if (!e.id_json.empty() && !first_line_.emplace(e.id_json, line).second) {
        BatchLineError dup;
        dup.line = line;
        dup.message = absl::StrCat("duplicate id ", e.id_json, " (first on line ",
                                   first_line_[e.id_json], "); this line is not run");
        parsed = std::move(dup);
      }
    }

    // The records this line has: every question's for a long document.
    std::vector<BatchUnit> units;
    if (auto* e = std::get_if<BatchLineError>(&parsed)) {
      const bool per_question = e->questions > 0 && !e->id_json.empty();
      for (int i = 0; i < (per_question ? e->questions : 1); ++i) {
        BatchUnit u;
        u.id_json = e->id_json;
        u.question = per_question ? i : -1;
        u.line = line;
        u.error = e->message;
        units.push_back(std::move(u));
      }
    } else {
      const BatchRequest& request = std::get<BatchRequest>(parsed);
      // Resolving (encoding a long document) is skipped when every record
      // of the request is there already.
      bool all_done = true;
      const int n = request.long_document ? static_cast<int>(request.questions.size()) : 1;
      for (int i = 0; i < n; ++i) {
        const int question = request.long_document ? i : -1;
        all_done = all_done && output_->Done(RecordKey(request.id_json, question, line));
      }
      if (!all_done) units = UnitsOf(request, model_);
    }
    int to_write = 0;
    for (BatchUnit& u : units) {
      if (!output_->Done(RecordKey(u.id_json, u.question, u.line))) ++to_write;
    }
    if (to_write == 0) {
      progress_->RequestSkipped(bytes);
      continue;
    }
    open_[line] = OpenLine{to_write, bytes};
    for (BatchUnit& u : units) {
      const std::string key = RecordKey(u.id_json, u.question, u.line);
      if (output_->Done(key)) continue;
      if (!u.error.empty()) {
        const std::string record = ErrorRecord(u.id_json, u.question, u.line, u.error);
        if (absl::Status s = WriteLocked(line, key, record, true); !s.ok()) return s;
      } else {
        ready_.push_back(std::move(u));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace deltaserve
