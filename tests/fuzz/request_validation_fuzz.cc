// libFuzzer: any bytes as a GenerateRequest, and as a ScoreRequest, mapped
// onto the request model (grpc_request.h) and through RequestValidator for k3-tiny's shape with the
// tiktoken fixture. Validation refuses with INVALID_ARGUMENT (or RESOURCE_EXHAUSTED), or accepts a
// request that fits: every id in the vocabulary, prompt plus max_tokens within the context, at most
// the limits' stop ids.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "google/protobuf/stubs/logging.h"
#include "runtime/model/presets.h"
#include "runtime/serving/grpc_request.h"
#include "runtime/serving/request_validation.h"

namespace {

struct Fixture {
  deltaserve::ModelConfig config;
  std::unique_ptr<deltaserve::Tokenizer> tokenizer;
  std::unique_ptr<deltaserve::RequestValidator> validator;
};

const Fixture& Get() {
  static const Fixture* fixture = [] {
    auto* f = new Fixture();
    auto preset = deltaserve::PresetConfig("k3-tiny");
    if (!preset.ok()) std::abort();
    f->config = *preset;
    f->config.vocab_size = 1024;  // the fixture's 676 ranks + 256 special ids, padded
    f->config.max_position_embeddings = 4096;
    auto loaded = deltaserve::LoadTokenizer(
        std::string(DELTASERVE_SOURCE_DIR) + "/tests/data/tokenizer", f->config.vocab_size);
    if (!loaded.ok()) std::abort();
    f->tokenizer = std::move(*loaded);
    deltaserve::RequestLimits limits;
    limits.max_request_bytes = 1 << 16;
    limits.max_stop_token_ids = 32;
    f->validator =
        std::make_unique<deltaserve::RequestValidator>(f->config, f->tokenizer.get(), limits);
    return f;
  }();
  return *fixture;
}

bool Refusal(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInvalidArgument ||
         status.code() == absl::StatusCode::kResourceExhausted;
}

bool InVocabulary(const std::vector<int32_t>& ids, int64_t vocab) {
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Protobuf logs every string field that is not UTF-8; the fuzzer makes
  // many, and the parse's result is what counts.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Fixture& f = Get();
  const int64_t context = f.config.max_position_embeddings;
  deltaserve::v1::GenerateRequest generate;
  if (generate.ParseFromArray(data, static_cast<int>(size))) {
    auto valid = f.validator->Generate(deltaserve::FromProto(generate));
    if (!valid.ok()) {
      if (!Refusal(valid.status())) std::abort();
    } else {
      const auto& p = valid->params;
      if (valid->prompt.empty() || !InVocabulary(valid->prompt, f.config.vocab_size) ||
          !InVocabulary(p.stop_ids, f.config.vocab_size) ||
          static_cast<int64_t>(p.stop_ids.size()) > f.validator->limits().max_stop_token_ids ||
          static_cast<int64_t>(valid->prompt.size()) + p.max_tokens > context || p.max_tokens < 1 ||
          p.top_logprobs < 0 || p.top_logprobs > deltaserve::kMaxTopLogprobs) {
        std::abort();
      }
    }
    auto id = f.validator->RequestId(generate.request_id());
    if (id.ok() == (generate.request_id().size() > deltaserve::kMaxRequestIdBytes)) std::abort();
  }
  deltaserve::v1::ScoreRequest score;
  if (score.ParseFromArray(data, static_cast<int>(size))) {
    auto tokens = f.validator->Score(deltaserve::FromProto(score));
    if (!tokens.ok()) {
      if (!Refusal(tokens.status())) std::abort();
    } else if (tokens->size() < 2 || static_cast<int64_t>(tokens->size()) > context ||
               !InVocabulary(*tokens, f.config.vocab_size)) {
      std::abort();
    }
  }
  return 0;
}
