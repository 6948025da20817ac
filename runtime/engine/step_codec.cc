#include "runtime/engine/step_codec.h"

#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "runtime/common/status_macros.h"

namespace deltaserve {
namespace {

class Writer {
 public:
  template <typename T>
  void Put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &value, sizeof(T));
  }
  template <typename T>
  void PutVector(const std::vector<T>& values) {
    Put<uint64_t>(values.size());
    const size_t at = out_.size();
    out_.resize(at + values.size() * sizeof(T));
    if (!values.empty()) std::memcpy(out_.data() + at, values.data(), values.size() * sizeof(T));
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  Reader(std::string_view bytes, const char* what) : bytes_(bytes), what_(what) {}

  template <typename T>
  absl::Status Get(T* value) {
    if (bytes_.size() < sizeof(T)) return Short(sizeof(T));
    std::memcpy(value, bytes_.data(), sizeof(T));
    bytes_.remove_prefix(sizeof(T));
    return absl::OkStatus();
  }
  template <typename T>
  absl::Status GetVector(std::vector<T>* values) {
    uint64_t count = 0;
    DELTASERVE_RETURN_IF_ERROR(Get(&count));
    // Checked before allocating: a hostile count cannot ask for more memory
    // than the message holds.
    if (count > bytes_.size() / sizeof(T)) return Short(count * sizeof(T));
    values->resize(count);
    if (count > 0) std::memcpy(values->data(), bytes_.data(), count * sizeof(T));
    bytes_.remove_prefix(count * sizeof(T));
    return absl::OkStatus();
  }
  // A count of items at least `min_item_bytes` each.
  absl::StatusOr<uint64_t> GetCount(size_t min_item_bytes) {
    uint64_t count = 0;
    DELTASERVE_RETURN_IF_ERROR(Get(&count));
    if (count > bytes_.size() / min_item_bytes) return Short(count * min_item_bytes);
    return count;
  }
  absl::Status Finish() const {
    if (bytes_.empty()) return absl::OkStatus();
    return absl::DataLossError(
        absl::StrCat(what_, ": ", bytes_.size(), " bytes left over after the message"));
  }

 private:
  absl::Status Short(uint64_t wanted) const {
    return absl::DataLossError(
        absl::StrCat(what_, ": truncated (", wanted, " bytes wanted, ", bytes_.size(), " left)"));
  }
  std::string_view bytes_;
  const char* what_;
};

// Smallest encodings, for the count checks.
constexpr size_t kMinWorkBytes = 8 + 1 + 8 + 4 + 4 + 8 + 4 + 8 + 1 + 4 + 8 + 1 + 8 + 1;
constexpr size_t kMinResultBytes = 8 + 4 + 4 + 5 * 8;

}  // namespace

std::string EncodeStep(const Step& step) {
  Writer w;
  w.Put<uint64_t>(step.id);
  w.Put<uint8_t>(step.more_coming);
  w.PutVector(step.release);
  w.Put<uint64_t>(step.work.size());
  for (const SequenceWork& s : step.work) {
    w.Put<uint64_t>(s.sequence_id);
    w.Put<uint8_t>(s.start);
    w.PutVector(s.tokens);
    w.Put<int32_t>(static_cast<int32_t>(s.output));
    w.Put<float>(s.sampling.temperature);
    w.Put<int64_t>(s.sampling.top_k);
    w.Put<float>(s.sampling.top_p);
    w.Put<uint64_t>(s.seed);
    w.Put<uint8_t>(s.logprobs);
    w.Put<int32_t>(s.top_logprobs);
    w.PutVector(s.targets);
    w.Put<uint8_t>(s.fork_from.has_value());
    w.Put<uint64_t>(s.fork_from.value_or(0));
    w.Put<uint8_t>(s.feed_sampled);
  }
  return w.Take();
}

absl::StatusOr<Step> DecodeStep(std::string_view bytes) {
  Reader r(bytes, "step message");
  Step step;
  uint8_t flag = 0;
  DELTASERVE_RETURN_IF_ERROR(r.Get(&step.id));
  DELTASERVE_RETURN_IF_ERROR(r.Get(&flag));
  step.more_coming = flag != 0;
  DELTASERVE_RETURN_IF_ERROR(r.GetVector(&step.release));
  DELTASERVE_ASSIGN_OR_RETURN(uint64_t count, r.GetCount(kMinWorkBytes));
  step.work.resize(count);
  for (SequenceWork& s : step.work) {
    int32_t output = 0;
    DELTASERVE_RETURN_IF_ERROR(r.Get(&s.sequence_id));
    DELTASERVE_RETURN_IF_ERROR(r.Get(&flag));
    s.start = flag != 0;
    DELTASERVE_RETURN_IF_ERROR(r.GetVector(&s.tokens));
    DELTASERVE_RETURN_IF_ERROR(r.Get(&output));
    if (output < 0 || output > static_cast<int32_t>(WorkOutput::kLogits)) {
      return absl::DataLossError(absl::StrCat("step message: unknown output kind ", output));
    }
    s.output = static_cast<WorkOutput>(output);
    DELTASERVE_RETURN_IF_ERROR(r.Get(&s.sampling.temperature));
    DELTASERVE_RETURN_IF_ERROR(r.Get(&s.sampling.top_k));
    DELTASERVE_RETURN_IF_ERROR(r.Get(&s.sampling.top_p));
    DELTASERVE_RETURN_IF_ERROR(r.Get(&s.seed));
    DELTASERVE_RETURN_IF_ERROR(r.Get(&flag));
    s.logprobs = flag != 0;
    DELTASERVE_RETURN_IF_ERROR(r.Get(&s.top_logprobs));
    DELTASERVE_RETURN_IF_ERROR(r.GetVector(&s.targets));
    uint64_t fork = 0;
    DELTASERVE_RETURN_IF_ERROR(r.Get(&flag));
    DELTASERVE_RETURN_IF_ERROR(r.Get(&fork));
    if (flag != 0) s.fork_from = fork;
    DELTASERVE_RETURN_IF_ERROR(r.Get(&flag));
    s.feed_sampled = flag != 0;
  }
  DELTASERVE_RETURN_IF_ERROR(r.Finish());
  return step;
}

std::string EncodeResults(const std::vector<SequenceResult>& results) {
  Writer w;
  w.Put<uint64_t>(results.size());
  for (const SequenceResult& s : results) {
    w.Put<uint64_t>(s.sequence_id);
    w.Put<int32_t>(s.token);
    w.Put<float>(s.logprob);
    w.PutVector(s.top_ids);
    w.PutVector(s.top_logprobs);
    w.PutVector(s.target_logprobs);
    w.PutVector(s.logits);
    w.PutVector(std::vector<char>(s.error.begin(), s.error.end()));
  }
  return w.Take();
}

absl::StatusOr<std::vector<SequenceResult>> DecodeResults(std::string_view bytes) {
  Reader r(bytes, "step results message");
  DELTASERVE_ASSIGN_OR_RETURN(uint64_t count, r.GetCount(kMinResultBytes));
  std::vector<SequenceResult> results(count);
  for (SequenceResult& s : results) {
    DELTASERVE_RETURN_IF_ERROR(r.Get(&s.sequence_id));
    DELTASERVE_RETURN_IF_ERROR(r.Get(&s.token));
    DELTASERVE_RETURN_IF_ERROR(r.Get(&s.logprob));
    DELTASERVE_RETURN_IF_ERROR(r.GetVector(&s.top_ids));
    DELTASERVE_RETURN_IF_ERROR(r.GetVector(&s.top_logprobs));
    DELTASERVE_RETURN_IF_ERROR(r.GetVector(&s.target_logprobs));
    DELTASERVE_RETURN_IF_ERROR(r.GetVector(&s.logits));
    std::vector<char> error;
    DELTASERVE_RETURN_IF_ERROR(r.GetVector(&error));
    s.error.assign(error.begin(), error.end());
  }
  DELTASERVE_RETURN_IF_ERROR(r.Finish());
  return results;
}

}  // namespace deltaserve
