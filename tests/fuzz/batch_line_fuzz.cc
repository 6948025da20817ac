// libFuzzer: any bytes as a line of `deltaserve batch` input, and as a line
// of an output being resumed. ParseBatchLine gives a request or an error
// naming the line, never an exception; a request's units, resolved against
// k3-tiny's shape with the tiktoken fixture, fail their checks or fit (ids in
// the vocabulary, prompt plus max_tokens within the context); the records
// batch writes for it read back (ReadBatchRecord) under the key resume
// matches; and ReadBatchRecord on the raw bytes refuses or reads, throwing
// nothing.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <variant>

#include "launcher/batch_output.h"
#include "launcher/batch_request.h"
#include "runtime/model/presets.h"

namespace {

struct Fixture {
  std::unique_ptr<deltaserve::Tokenizer> tokenizer;
  std::unique_ptr<deltaserve::BatchModel> model;
};

const Fixture& Get() {
  static const Fixture* fixture = [] {
    auto* f = new Fixture();
    auto preset = deltaserve::PresetConfig("k3-tiny");
    if (!preset.ok()) std::abort();
    deltaserve::ModelConfig config = *preset;
    config.vocab_size = 1024;  // the fixture's 676 ranks + 256 special ids, padded
    config.max_position_embeddings = 4096;
    auto loaded = deltaserve::LoadTokenizer(
        std::string(DELTASERVE_SOURCE_DIR) + "/tests/data/tokenizer", config.vocab_size);
    if (!loaded.ok()) std::abort();
    f->tokenizer = std::move(*loaded);
    f->model = std::make_unique<deltaserve::BatchModel>(config, f->tokenizer.get(), nullptr);
    return f;
  }();
  return *fixture;
}

// A record batch would write reads back as one, under its key.
void ExpectReadsBack(const std::string& record, const std::string& key, bool error) {
  if (record.empty() || record.back() != '\n') std::abort();
  auto read = deltaserve::ReadBatchRecord(std::string_view(record).substr(0, record.size() - 1));
  if (!read.ok() || read->key != key || read->error != error) std::abort();
}

void CheckUnits(const deltaserve::BatchRequest& request, const deltaserve::BatchModel* model) {
  const std::vector<deltaserve::BatchUnit> units = deltaserve::UnitsOf(request, model);
  const size_t expected = request.long_document ? request.questions.size() : 1;
  if (units.size() != expected) std::abort();
  for (const deltaserve::BatchUnit& u : units) {
    const std::string key = deltaserve::RecordKey(u.id_json, u.question, u.line);
    if (!u.error.empty()) {
      ExpectReadsBack(deltaserve::ErrorRecord(u.id_json, u.question, u.line, u.error), key, true);
      continue;
    }
    if (model != nullptr) {
      const int64_t context = model->config.max_position_embeddings;
      const int64_t n = static_cast<int64_t>(u.prompt.size());
      if (n == 0 || n > context) std::abort();
      for (const int32_t id : u.prompt) {
        if (id < 0 || id >= model->config.vocab_size) std::abort();
      }
      if (u.task == deltaserve::BatchTask::kGenerate && n + u.params.max_tokens > context) {
        std::abort();
      }
    }
    if (u.task == deltaserve::BatchTask::kGenerate) {
      deltaserve::GenerateOutcome outcome;
      outcome.token_ids = {1, 2};
      outcome.finish_reason = "length";
      outcome.logprobs = {-1.0f, -2.0f};
      if (u.chat()) outcome.reply = deltaserve::ChatReply{"a", "b", {{"", "f", "{}"}}};
      ExpectReadsBack(deltaserve::GenerateRecord(u, outcome), key, false);
    } else {
      deltaserve::ScoreOutcome outcome;
      outcome.token_ids = {1, 2};
      outcome.logprobs = {-1.0f};
      ExpectReadsBack(deltaserve::ScoreRecord(u, outcome), key, false);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Fixture& f = Get();
  const std::string_view line(reinterpret_cast<const char*>(data), size);
  auto parsed = deltaserve::ParseBatchLine(line, 7);
  if (const auto* error = std::get_if<deltaserve::BatchLineError>(&parsed)) {
    if (error->line != 7 || error->message.empty()) std::abort();
    ExpectReadsBack(deltaserve::ErrorRecord(error->id_json, -1, 7, error->message),
                    deltaserve::RecordKey(error->id_json, -1, 7), true);
  } else {
    const auto& request = std::get<deltaserve::BatchRequest>(parsed);
    if (request.line != 7 || request.id_json.empty()) std::abort();
    CheckUnits(request, f.model.get());
    CheckUnits(request, nullptr);
  }
  auto read = deltaserve::ReadBatchRecord(line);
  if (!read.ok() && read.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
  return 0;
}
