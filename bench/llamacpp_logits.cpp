// The logits llama.cpp computes for given token ids, for checking a GGUF
// conversion against deltaserve before timing both (bench/llamacpp_compare.sh).
// Built by that script against the llama.cpp it builds in its cache
// directory, never by deltaserve's CMake (hence .cpp, not .cc).
//
//   llamacpp_logits MODEL.gguf IDS OUT.f32 [--threads N] [--decode-from K]
//                   [--generate N] [--f32-cache] [--no-flash-attn]
//
// IDS: comma-separated token ids. OUT.f32 gets float32 logits [T, vocab], row
// t the logits after token t, as `deltaserve score --logits-out` writes them.
// --decode-from K: the first K tokens in one llama_decode, then one per call
// (the decode path), as `deltaserve score --decode-from K` does.
// --generate N: then N greedy tokens, printed to stdout as "generated: ids".
// --f32-cache, --no-flash-attn: llama.cpp's defaults are an F16 KV cache and
// flash attention where the backend has it (on the CPU it rounds Q to F16);
// these two take both out, to compare the graph itself with a float64 golden.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llama.h"

namespace {

// Runs tokens[begin, end) as one batch at positions begin.., all logits kept.
bool Decode(llama_context* ctx, const std::vector<llama_token>& tokens, size_t begin, size_t end) {
  llama_batch batch = llama_batch_init(static_cast<int32_t>(end - begin), 0, 1);
  for (size_t i = begin; i < end; ++i) {
    const int32_t j = batch.n_tokens++;
    batch.token[j] = tokens[i];
    batch.pos[j] = static_cast<llama_pos>(i);
    batch.n_seq_id[j] = 1;
    batch.seq_id[j][0] = 0;
    batch.logits[j] = 1;
  }
  const int32_t rc = llama_decode(ctx, batch);
  llama_batch_free(batch);
  if (rc != 0) std::fprintf(stderr, "llamacpp_logits: llama_decode returned %d\n", rc);
  return rc == 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: llamacpp_logits MODEL.gguf IDS OUT.f32 [--threads N] [--decode-from K] "
                 "[--generate N] [--f32-cache] [--no-flash-attn]\n");
    return 2;
  }
  const char* model_path = argv[1];
  std::vector<llama_token> tokens;
  for (const char* p = argv[2]; *p;) {
    char* end = nullptr;
    tokens.push_back(static_cast<llama_token>(std::strtol(p, &end, 10)));
    if (end == p) {
      std::fprintf(stderr, "llamacpp_logits: bad token list '%s'\n", argv[2]);
      return 2;
    }
    p = *end == ',' ? end + 1 : end;
  }
  const char* out_path = argv[3];
  int threads = 2;
  size_t decode_from = tokens.size();
  int generate = 0;
  bool f32_cache = false, flash_attn = true;
  for (int i = 4; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (!std::strcmp(argv[i], "--f32-cache")) {
      f32_cache = true;
    } else if (!std::strcmp(argv[i], "--no-flash-attn")) {
      flash_attn = false;
    } else if (has_value && !std::strcmp(argv[i], "--threads")) {
      threads = std::atoi(argv[++i]);
    } else if (has_value && !std::strcmp(argv[i], "--decode-from")) {
      decode_from = std::strtoul(argv[++i], nullptr, 10);
    } else if (has_value && !std::strcmp(argv[i], "--generate")) {
      generate = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "llamacpp_logits: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (tokens.empty() || decode_from == 0 || decode_from > tokens.size()) {
    std::fprintf(stderr, "llamacpp_logits: need 1 <= --decode-from <= %zu tokens\n", tokens.size());
    return 2;
  }

  llama_backend_init();
  llama_model_params mparams = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(model_path, mparams);
  if (model == nullptr) {
    std::fprintf(stderr, "llamacpp_logits: cannot load %s\n", model_path);
    return 1;
  }
  const int32_t vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  const size_t total = tokens.size() + static_cast<size_t>(generate);
  llama_context_params cparams = llama_context_default_params();
  cparams.n_ctx = static_cast<uint32_t>(total + 16);
  cparams.n_batch = static_cast<uint32_t>(decode_from);
  cparams.n_ubatch = static_cast<uint32_t>(decode_from);
  cparams.n_threads = threads;
  cparams.n_threads_batch = threads;
  if (f32_cache) cparams.type_k = cparams.type_v = GGML_TYPE_F32;
  if (!flash_attn) cparams.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama_context* ctx = llama_init_from_model(model, cparams);
  if (ctx == nullptr) {
    std::fprintf(stderr, "llamacpp_logits: cannot make a context\n");
    return 1;
  }

  // [T, vocab]: one row per prompt token.
  std::vector<float> logits;
  logits.reserve(tokens.size() * static_cast<size_t>(vocab));
  auto keep = [&](int32_t n) {
    for (int32_t i = 0; i < n; ++i) {
      const float* row = llama_get_logits_ith(ctx, i);
      logits.insert(logits.end(), row, row + vocab);
    }
  };
  if (!Decode(ctx, tokens, 0, decode_from)) return 1;
  keep(static_cast<int32_t>(decode_from));
  for (size_t t = decode_from; t < tokens.size(); ++t) {
    if (!Decode(ctx, tokens, t, t + 1)) return 1;
    keep(1);
  }
  FILE* out = std::fopen(out_path, "wb");
  if (out == nullptr ||
      std::fwrite(logits.data(), sizeof(float), logits.size(), out) != logits.size() ||
      std::fclose(out) != 0) {
    std::fprintf(stderr, "llamacpp_logits: cannot write %s\n", out_path);
    return 1;
  }

  if (generate > 0) {
    std::vector<llama_token> all = tokens;
    std::printf("generated:");
    for (int g = 0; g < generate; ++g) {
      const float* row = &logits[logits.size() - static_cast<size_t>(vocab)];
      if (g > 0) row = llama_get_logits_ith(ctx, 0);
      int32_t best = 0;
      for (int32_t v = 1; v < vocab; ++v) {
        if (row[v] > row[best]) best = v;
      }
      std::printf("%s%d", g ? "," : " ", best);
      all.push_back(best);
      if (g + 1 < generate && !Decode(ctx, all, all.size() - 1, all.size())) return 1;
    }
    std::printf("\n");
  }
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
