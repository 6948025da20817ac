// Long context, 262,144 tokens (256k): the KDA recurrence and MLA attention
// against their float64 references at that length, and a tiny model run over
// it in one piece and in ragged pieces. The dims are the tiny models' or
// smaller, so the whole file takes about a minute of CPU time; the length
// is what is under test (state drift, softmax over 256k keys, positions).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/kda.h"
#include "kernels/mla_attention.h"
#include "kernels/paged_cache.h"
#include "kernels/reference/kda_ref.h"
#include "kernels/reference/mla_attention_ref.h"
#include "runtime/model/model.h"
#include "runtime/model/presets.h"
#include "runtime/model/random_checkpoint.h"
#include "tests/model_runs.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

constexpr int64_t kLong = 262144;

std::vector<float> NormalizedRows(int64_t rows, int64_t dim, uint64_t seed) {
  std::vector<float> x = testing::RandomFloats(rows * dim, seed);
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0.0;
    for (int64_t c = 0; c < dim; ++c) sum += double{x[r * dim + c]} * x[r * dim + c];
    const double inv = 1.0 / std::sqrt(sum + 1e-12);
    for (int64_t c = 0; c < dim; ++c) x[r * dim + c] = static_cast<float>(x[r * dim + c] * inv);
  }
  return x;
}

double MaxAbs(const std::vector<float>& x) {
  double m = 0.0;
  for (float v : x) m = std::max(m, std::abs(double{v}));
  return m;
}

// ------------------------------------------------------------------- KDA

// The chunked KDA kernel (what prefill runs) carried through 262,144 tokens in
// pieces of 16,384, as a long prompt's chunks carry the state, against the
// float64 recurrence carried the same way. Half the decays are near zero
// (a half-life of ~70k tokens, the slowest a K3 gate gives in practice), so
// the state remembers across the whole context and rounding could build up.
// Every output is compared, piece by piece, against the tolerance a short
// run gets (kernels' kda_test): no drift means the last piece is as good as
// the first; the state stays finite and bounded.
TEST(LongContextTest, KdaChunkFollowsTheFloat64RecurrenceOver256kTokens) {
  kernels::KdaShape s;
  s.heads = 4;
  s.v_heads = 4;
  s.k_dim = 8;
  s.v_dim = 8;
  const int64_t piece = 16384;
  s.t = piece;
  // As kda_test's KdaTolerance, for a chunk of 64: K·64 + 64 terms.
  const double tol = testing::ReductionTolerance(s.k_dim * 64 + 64);
  std::vector<float> state(s.v_heads * s.k_dim * s.v_dim, 0.0f);
  std::vector<double> state_ref(state.size(), 0.0);
  double worst = 0.0, worst_first = 0.0, max_state = 0.0;
  for (int64_t begin = 0; begin < kLong; begin += piece) {
    const uint64_t seed = 1000 + begin / piece * 10;
    const std::vector<float> q = NormalizedRows(piece * s.heads, s.k_dim, seed + 1);
    const std::vector<float> k = NormalizedRows(piece * s.heads, s.k_dim, seed + 2);
    const std::vector<float> v = testing::RandomFloats(piece * s.v_heads * s.v_dim, seed + 3);
    std::vector<float> g =
        testing::RandomFloats(piece * s.v_heads * s.k_dim, seed + 4, -5.0f, 0.0f);
    for (size_t i = 0; i < g.size(); i += 2) g[i] = -1e-5f;  // slow channels
    const std::vector<float> beta = testing::RandomFloats(piece * s.v_heads, seed + 5, 0.0f, 1.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.k_dim));

    std::vector<float> o = testing::NaNs(piece * s.v_heads * s.v_dim);
    kernels::KdaChunk(s, kernels::Tensor::F32(q.data(), s.t, s.heads * s.k_dim),
                      kernels::Tensor::F32(k.data(), s.t, s.heads * s.k_dim),
                      kernels::Tensor::F32(v.data(), s.t, s.v_heads * s.v_dim),
                      kernels::Tensor::F32(g.data(), s.t, s.v_heads * s.k_dim),
                      kernels::Tensor::F32(beta.data(), s.t, s.v_heads), scale,
                      kernels::MutableTensor::F32(state.data(), s.v_heads, s.k_dim * s.v_dim),
                      kernels::MutableTensor::F32(o.data(), s.t, s.v_heads * s.v_dim));
    std::vector<double> o_ref(o.size());
    kernels::ref::KdaRecurrent(s, testing::ToDouble(q).data(), testing::ToDouble(k).data(),
                               testing::ToDouble(v).data(), testing::ToDouble(g).data(),
                               testing::ToDouble(beta).data(), scale, state_ref.data(),
                               o_ref.data());
    const double err_o = testing::RelL2(o, o_ref);
    const double err_s = testing::RelL2(state, state_ref);
    EXPECT_LE(err_o, tol) << "tokens [" << begin << ", " << begin + piece << ")";
    EXPECT_LE(err_s, tol) << "state after " << begin + piece << " tokens";
    worst = std::max({worst, err_o, err_s});
    if (begin == 0) worst_first = worst;
    max_state = std::max(max_state, MaxAbs(state));
  }
  // The delta rule writes with normalised keys and beta <= 1 and the gates
  // only shrink it: |S| stays O(|v|) however long the context.
  EXPECT_LE(max_state, 8.0);
  std::printf(
      "KDA over %lld tokens: max rel L2 error %.3g (first piece %.3g, tolerance %.3g), "
      "max |state| %.3g\n",
      static_cast<long long>(kLong), worst, worst_first, tol, max_state);
}

// ------------------------------------------------------------------- MLA

// A latent cache of 262,144 entries (the tiny models' C = 16, R = 4) with a
// row at position 3 that matches every query more than the rest do: its
// weight and the near-uniform rest's must both survive a softmax over 256k
// keys (an online softmax that drops small blocks, or sums 256k weights of
// ~4e-6 carelessly, fails here). Queries at sampled positions (t = 1 after a prefix, as
// decode runs, and a chunk of 16 at the end) in the absorbed form over the
// f32 and the bf16 cache, and in the prefill form, against float64.
struct LongCache {
  int64_t heads = 4, C = 16, R = 4;
  std::vector<float> cache;  // [kLong, C + R]
};

LongCache MakeLongCache() {
  LongCache c;
  c.cache = testing::RandomFloats(kLong * (c.C + c.R), 77);
  // Along (1, 1, ...); the queries are positive, so they lean the same way.
  for (int64_t j = 0; j < c.C + c.R; ++j) c.cache[3 * (c.C + c.R) + j] = 2.0f;
  return c;
}

std::vector<float> Bf16Rounded(const std::vector<float>& x) {
  std::vector<float> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = kernels::Bf16ToFloat(kernels::FloatToBf16(x[i]));
  return r;
}

TEST(LongContextTest, MlaAttentionOver256kLatentEntriesMatchesFloat64AtSampledPositions) {
  const LongCache lc = MakeLongCache();
  const int64_t W = lc.C + lc.R;
  const std::vector<float> cache_bf16_values = Bf16Rounded(lc.cache);
  std::vector<uint16_t> cache_bf16(lc.cache.size());
  for (size_t i = 0; i < lc.cache.size(); ++i) cache_bf16[i] = kernels::FloatToBf16(lc.cache[i]);
  const std::vector<double> cache_d = testing::ToDouble(lc.cache);
  const std::vector<double> cache_bf16_d = testing::ToDouble(cache_bf16_values);
  const float scale = 1.0f / std::sqrt(static_cast<float>(W));

  double worst = 0.0;
  const std::vector<int64_t> positions = {0,    1,     3,      4,      63,       64,
                                          4097, 65535, 131072, 200003, kLong - 1};
  for (int64_t pos : positions) {
    // A chunk of 16 only at the end: the float64 reference is scalar and
    // reads the cache one column at a time, and there it covers the most keys.
    for (int64_t t : {int64_t{1}, int64_t{16}}) {
      if (t > 1 && pos != kLong - 1) continue;
      const int64_t prefix = pos + 1 - t;
      const int64_t S = prefix + t;
      std::vector<float> q_latent = testing::RandomFloats(t * lc.heads * lc.C, 5 + pos, 0.0f, 1.0f);
      std::vector<float> q_rope = testing::RandomFloats(t * lc.heads * lc.R, 6 + pos, 0.0f, 1.0f);
      // Reduction over S keys of the softmax and C + R per score.
      const double tol = testing::ReductionTolerance(S + W);
      for (const bool bf16 : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "position " << pos << ", t " << t
                                          << (bf16 ? ", bf16 cache" : ", f32 cache"));
        std::vector<float> o = testing::NaNs(t * lc.heads * lc.C);
        kernels::MlaAbsorbedArgs a;
        a.t = t;
        a.prefix = prefix;
        a.heads = lc.heads;
        a.latent_dim = lc.C;
        a.rope_dim = lc.R;
        a.q_latent = kernels::Tensor::F32(q_latent.data(), t, lc.heads * lc.C);
        a.q_rope = kernels::Tensor::F32(q_rope.data(), t, lc.heads * lc.R);
        a.cache = bf16 ? kernels::Tensor{cache_bf16.data(),     nullptr, kernels::DType::kBF16,
                                         kernels::Device::kCpu, S,       lc.C + lc.R}
                       : kernels::Tensor::F32(lc.cache.data(), S, lc.C + lc.R);
        a.scale = scale;
        a.o_latent = kernels::MutableTensor::F32(o.data(), t, lc.heads * lc.C);
        kernels::MlaAbsorbedAttention(a);
        const std::vector<double> ql = testing::ToDouble(q_latent), qr = testing::ToDouble(q_rope);
        std::vector<double> want(o.size());
        kernels::ref::MlaAbsorbedArgs r;
        r.t = t;
        r.prefix = prefix;
        r.heads = lc.heads;
        r.latent_dim = lc.C;
        r.rope_dim = lc.R;
        r.q_latent = ql.data();
        r.q_rope = qr.data();
        r.cache = bf16 ? cache_bf16_d.data() : cache_d.data();
        r.scale = scale;
        r.o_latent = want.data();
        kernels::ref::MlaAbsorbedAttention(r);
        ASSERT_TRUE(testing::AllClose(o, want, tol, tol));
        worst = std::max(worst, testing::RelL2(o, want));
      }
    }
  }
  std::printf("MLA absorbed over up to %lld latent entries: max rel L2 error %.3g\n",
              static_cast<long long>(kLong), worst);
}

// The prefill form (keys and values materialised per head) over 256k keys: a
// chunk of 64 queries at the end, and one in the middle.
TEST(LongContextTest, MlaPrefillOver256kKeysMatchesFloat64) {
  const int64_t heads = 2, P = 8, R = 4, Vd = 8;
  const std::vector<float> kv = testing::RandomFloats(kLong * heads * (P + Vd), 91);
  const std::vector<float> k_rope = testing::RandomFloats(kLong * R, 92);
  const std::vector<double> kv_d = testing::ToDouble(kv), k_rope_d = testing::ToDouble(k_rope);
  const float scale = 1.0f / std::sqrt(static_cast<float>(P + R));
  for (const int64_t prefix : {kLong / 2 - 64, kLong - 64}) {
    const int64_t t = 64;
    const std::vector<float> q = testing::RandomFloats(t * heads * (P + R), 93 + prefix);
    std::vector<float> o = testing::NaNs(t * heads * Vd);
    kernels::MlaPrefillArgs a;
    a.t = t;
    a.prefix = prefix;
    a.heads = heads;
    a.nope_dim = P;
    a.rope_dim = R;
    a.v_dim = Vd;
    a.q = kernels::Tensor::F32(q.data(), t, heads * (P + R));
    a.kv = kernels::Tensor::F32(kv.data(), prefix + t, heads * (P + Vd));
    a.k_rope = kernels::Tensor::F32(k_rope.data(), prefix + t, R);
    a.scale = scale;
    a.o = kernels::MutableTensor::F32(o.data(), t, heads * Vd);
    kernels::MlaPrefillAttention(a);
    const std::vector<double> q_d = testing::ToDouble(q);
    std::vector<double> want(o.size());
    kernels::ref::MlaPrefillArgs r;
    r.t = t;
    r.prefix = prefix;
    r.heads = heads;
    r.nope_dim = P;
    r.rope_dim = R;
    r.v_dim = Vd;
    r.q = q_d.data();
    r.kv = kv_d.data();
    r.k_rope = k_rope_d.data();
    r.k_rope_stride = R;
    r.scale = scale;
    r.o = want.data();
    kernels::ref::MlaPrefillAttention(r);
    const double tol = testing::ReductionTolerance(prefix + t + P + R);
    EXPECT_TRUE(testing::AllClose(o, want, tol, tol)) << "prefix " << prefix;
    std::printf("MLA prefill, 64 queries after %lld keys: rel L2 error %.3g (tolerance %.3g)\n",
                static_cast<long long>(prefix), testing::RelL2(o, want), tol);
  }
}

// ----------------------------------------------------------------- model

// K3's layer rhythm at its smallest: one KDA layer then one MLA layer, with
// the K3 gate, attention residuals and latent MoE, at dims small enough that
// MLA's quadratic prefill over 256k tokens takes seconds.
ModelConfig LongContextConfig() {
  ModelConfig c = testing::SmallestK3({LayerKind::kKda, LayerKind::kMla}, 32);
  c.max_position_embeddings = kLong;
  return c;
}

// 262,144 tokens in one Forward call and in ragged pieces (1, 63, 1000, 7000,
// 20000, 32768, ... : KDA chunk boundaries off the 64 grid, MLA switching
// between its materialised and absorbed forms as the prefix grows): the last
// logits of every piece equal the one-shot logits at that position, every
// logit is finite, and the states at the end agree.
// The values of a contiguous f32 view.
std::vector<float> Values(const kernels::Tensor& t) {
  return std::vector<float>(t.As<float>(), t.As<float>() + t.rows * t.cols);
}

// The rows of layer `layer`'s MLA cache, read from the sequence's pages.
std::vector<float> CachedRows(const SequenceState& state, int64_t layer) {
  const kernels::MutablePagedCache cache = state.MlaCache(layer);
  std::vector<float> rows(static_cast<size_t>(state.length * cache.pool.cols));
  kernels::PagedCacheRead(cache, 0,
                          kernels::MutableTensor::F32(rows.data(), state.length, cache.pool.cols));
  return rows;
}

TEST(LongContextTest, TinyModelOver256kTokensChunkedEqualsOneShot) {
  const std::string dir = testing::TempDir("long_context_model");
  ASSERT_TRUE(WriteRandomCheckpoint(LongContextConfig(), dir, 5).ok());
  auto model = Model::Load(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const int64_t vocab = (*model)->config().vocab_size;
  const std::vector<int32_t> tokens = testing::RandomTokens(kLong, 8, vocab);

  auto one_state = (*model)->NewSequence().value();
  const ForwardInput whole{one_state.get(), tokens, /*all_logits=*/true};
  auto one = (*model)->Forward(std::span(&whole, 1));
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(static_cast<int64_t>(one->size()), kLong * vocab);
  const auto bad =
      std::find_if_not(one->begin(), one->end(), [](float x) { return std::isfinite(x); });
  ASSERT_EQ(bad, one->end()) << "row " << (bad - one->begin()) / vocab;

  auto state = (*model)->NewSequence().value();
  const std::vector<int64_t> sizes = {1, 63, 1000, 7000, 20000, 32768};
  double worst = 0.0;
  int64_t begin = 0, pieces = 0;
  while (begin < kLong) {
    const int64_t n = std::min(sizes[pieces % sizes.size()], kLong - begin);
    const ForwardInput input{state.get(), std::span(tokens).subspan(begin, n), false};
    auto last = (*model)->Forward(std::span(&input, 1));
    ASSERT_TRUE(last.ok()) << last.status();
    begin += n;
    ++pieces;
    const std::vector<float> want(one->begin() + (begin - 1) * vocab, one->begin() + begin * vocab);
    const double err = testing::RelL2(*last, testing::ToDouble(want));
    // As tests/runtime/scheduler/invariance_test: chunking changes only the
    // order of float32 sums.
    EXPECT_LE(err, 5e-5) << "position " << begin - 1;
    worst = std::max(worst, err);
  }
  EXPECT_EQ(state->length, kLong);
  // The config's max_position_embeddings is this length: one more token is
  // refused, naming it, and changes nothing.
  const std::vector<int32_t> one_more = {1};
  const ForwardInput beyond{state.get(), one_more, false};
  const auto refused = (*model)->Forward(std::span(&beyond, 1));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("context of 262145 tokens exceeds the model's "
                                            "max_position_embeddings of 262144"),
            std::string::npos)
      << refused.status();
  EXPECT_EQ(state->length, kLong);
  const std::vector<float> kda = Values(state->KdaState(0));
  EXPECT_LE(testing::RelL2(kda, testing::ToDouble(Values(one_state->KdaState(0)))), 5e-5);
  EXPECT_LE(MaxAbs(kda), 8.0);
  EXPECT_LE(testing::RelL2(CachedRows(*state, 1), testing::ToDouble(CachedRows(*one_state, 1))),
            5e-5);
  std::printf("%lld pieces over %lld tokens: max rel L2 of the last logits %.3g\n",
              static_cast<long long>(pieces), static_cast<long long>(kLong), worst);
}

}  // namespace
}  // namespace deltaserve
