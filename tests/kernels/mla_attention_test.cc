// kernels/mla_attention.h, both forms, against the float64 reference on every
// device of AvailableDevices(), each output a guarded buffer whose guards are
// checked after the call.
#include "kernels/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/reference/mla_attention_ref.h"
#include "kernels/threads.h"
#include "tests/kernels/device_test_util.h"
#include "tests/test_util.h"

namespace deltaserve::kernels {
namespace {

using ::deltaserve::testing::AllClose;
using ::deltaserve::testing::DeviceTest;
using ::deltaserve::testing::GuardedBuffer;
using ::deltaserve::testing::NaNs;
using ::deltaserve::testing::RandomFloats;
using ::deltaserve::testing::ReductionTolerance;
using ::deltaserve::testing::ToDouble;

double MaxAbsDiff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

struct PrefillCase {
  int64_t t, prefix, heads, nope, rope, v;
  float scale;
};

// Random inputs for one prefill call; k_rope rows are strided (rope + 3) as
// when they sit inside the [c | kr] latent cache.
struct PrefillInputs {
  PrefillInputs(const PrefillCase& c, uint64_t seed)
      : s(c.prefix + c.t),
        stride(c.rope + 3),
        q(RandomFloats(c.t * c.heads * (c.nope + c.rope), seed)),
        kv(RandomFloats(s * c.heads * (c.nope + c.v), seed + 1)),
        k_rope(RandomFloats(s * stride, seed + 2)) {}
  int64_t s, stride;
  std::vector<float> q, kv, k_rope;
};

// `values` in guarded memory on `device`: an op's input.
template <typename T>
GuardedBuffer<T> OnDevice(Device device, const std::vector<T>& values) {
  GuardedBuffer<T> buffer(device, static_cast<int64_t>(values.size()));
  buffer.Fill(values);
  return buffer;
}

// PrefillInputs copied to a device.
struct PrefillDeviceInputs {
  PrefillDeviceInputs(Device device, const PrefillInputs& in)
      : q(OnDevice(device, in.q)),
        kv(OnDevice(device, in.kv)),
        k_rope(OnDevice(device, in.k_rope)) {}
  GuardedBuffer<float> q, kv, k_rope;
};

// The prefill call for case `c` on `in` (on `dev`), writing o [t, heads * v].
MlaPrefillArgs PrefillArgs(const PrefillCase& c, const PrefillInputs& in, PrefillDeviceInputs& dev,
                           const MutableTensor& o) {
  MlaPrefillArgs args;
  args.t = c.t;
  args.prefix = c.prefix;
  args.heads = c.heads;
  args.nope_dim = c.nope;
  args.rope_dim = c.rope;
  args.v_dim = c.v;
  args.q = dev.q.View(c.t, c.heads * (c.nope + c.rope));
  args.kv = dev.kv.View(in.s, c.heads * (c.nope + c.v));
  args.k_rope = dev.k_rope.View(in.s, c.rope, in.stride);
  args.scale = c.scale;
  args.o = o;
  return args;
}

// On `device`, into a guarded output whose guards it checks.
std::vector<float> RunPrefill(Device device, const PrefillCase& c, const PrefillInputs& in) {
  GuardedBuffer<float> o(device, c.t * c.heads * c.v);
  PrefillDeviceInputs dev(device, in);
  MlaPrefillAttention(PrefillArgs(c, in, dev, o.View(c.t, c.heads * c.v)));
  EXPECT_TRUE(o.GuardsIntact()) << "T=" << c.t << " prefix=" << c.prefix << " heads=" << c.heads;
  return o.Values();
}

std::vector<double> RefPrefill(const PrefillCase& c, const PrefillInputs& in) {
  const std::vector<double> q = ToDouble(in.q), kv = ToDouble(in.kv), k_rope = ToDouble(in.k_rope);
  std::vector<double> o(c.t * c.heads * c.v);
  ref::MlaPrefillArgs args;
  args.t = c.t;
  args.prefix = c.prefix;
  args.heads = c.heads;
  args.nope_dim = c.nope;
  args.rope_dim = c.rope;
  args.v_dim = c.v;
  args.q = q.data();
  args.kv = kv.data();
  args.k_rope = k_rope.data();
  args.k_rope_stride = in.stride;
  args.scale = c.scale;
  args.o = o.data();
  ref::MlaPrefillAttention(args);
  return o;
}

// Inputs are O(1): the scores are float32 dot products of P+R terms and the
// output a convex combination of S values, each error bounded by its
// reduction length.
double PrefillTolerance(const PrefillCase& c) {
  return ReductionTolerance(c.prefix + c.t + c.nope + c.rope);
}

class MlaPrefillAttentionTest : public DeviceTest {};
class MlaAbsorbedAttentionTest : public DeviceTest {};

TEST_P(MlaPrefillAttentionTest, MatchesReferenceOverShapes) {
  const int64_t dims[][3] = {{3, 5, 12}, {16, 8, 16}, {12, 3, 5}, {5, 0, 3}, {0, 4, 7}};
  uint64_t seed = 1;
  double worst = 0.0;
  for (int64_t t : {0, 1, 2, 7, 64, 65, 130}) {
    for (int64_t prefix : {0, 1, 5, 100}) {
      for (int64_t heads = 1; heads <= 4; ++heads) {
        for (const auto& d : dims) {
          const float scale = 1.0f / std::sqrt(static_cast<float>(d[0] + d[1] + 1));
          const PrefillCase c{t, prefix, heads, d[0], d[1], d[2], scale};
          const PrefillInputs in(c, seed += 3);
          const std::vector<float> o = RunPrefill(device(), c, in);
          const std::vector<double> want = RefPrefill(c, in);
          const double tol = PrefillTolerance(c);
          ASSERT_TRUE(AllClose(o, want, tol, tol))
              << "T=" << t << " prefix=" << prefix << " heads=" << heads << " P,R,Vd=" << d[0]
              << "," << d[1] << "," << d[2];
          worst = std::max(worst, MaxAbsDiff(o, want));
        }
      }
    }
  }
  std::printf("max abs error over the sweep: %.3g\n", worst);
}

// Sharp softmax (large scale): the running max changes often between key
// blocks, so the online rescaling is exercised; the real model's dims.
TEST_P(MlaPrefillAttentionTest, SharpSoftmaxAndModelDims) {
  for (const PrefillCase& c :
       {PrefillCase{70, 40, 2, 128, 64, 128, 0.5f}, PrefillCase{130, 200, 3, 7, 5, 9, 4.0f},
        PrefillCase{1, 3000, 2, 16, 8, 16, 2.0f}, PrefillCase{3, 2000, 1, 12, 4, 20, 1.0f}}) {
    const PrefillInputs in(c, 77);
    const std::vector<float> o = RunPrefill(device(), c, in);
    const std::vector<double> want = RefPrefill(c, in);
    // Scores reach |scale| * (P+R) / 3; their float32 rounding grows with
    // them, so the tolerance does too.
    const double tol = PrefillTolerance(c) * std::max(1.0f, c.scale * 4);
    EXPECT_TRUE(AllClose(o, want, tol, tol)) << "T=" << c.t << " prefix=" << c.prefix;
    std::printf("T=%ld prefix=%ld: max abs error %.3g\n", static_cast<long>(c.t),
                static_cast<long>(c.prefix), MaxAbsDiff(o, want));
  }
}

// Few query blocks and long caches split the keys across threads; the result
// must not depend on the thread count.
TEST_P(MlaPrefillAttentionTest, KeySplitsMatchReference) {
  const int saved = NumThreads();
  const PrefillCase c{5, 2500, 2, 16, 8, 12, 0.3f};
  const PrefillInputs in(c, 91);
  const std::vector<double> want = RefPrefill(c, in);
  for (int threads : {1, 3, 16}) {
    SetNumThreads(threads);
    const std::vector<float> o = RunPrefill(device(), c, in);
    const double tol = PrefillTolerance(c);
    EXPECT_TRUE(AllClose(o, want, tol, tol)) << threads << " threads";
  }
  SetNumThreads(saved);
}

// A chunk computed in one call equals the chunk computed in two pieces, the
// second one seeing the first as prefix.
TEST_P(MlaPrefillAttentionTest, PiecesEqualOneCall) {
  const int64_t L = 37, T = 130, heads = 2, P = 12, R = 6, Vd = 10;
  const PrefillCase whole{T, L, heads, P, R, Vd, 0.25f};
  const PrefillInputs in(whole, 5);
  const std::vector<float> o = RunPrefill(device(), whole, in);
  PrefillDeviceInputs dev(device(), in);
  for (int64_t t1 : {1, 50, 64, 129}) {
    auto pieces = Output<float>(static_cast<int64_t>(o.size()));  // [T, heads * Vd]
    for (int piece = 0; piece < 2; ++piece) {
      const int64_t t0 = piece == 0 ? 0 : t1;
      MlaPrefillArgs args;
      args.t = piece == 0 ? t1 : T - t1;
      args.prefix = L + t0;
      args.heads = heads;
      args.nope_dim = P;
      args.rope_dim = R;
      args.v_dim = Vd;
      const int64_t s = args.prefix + args.t;
      args.q = dev.q.View(T, heads * (P + R)).Rows(t0, args.t);
      args.kv = dev.kv.View(s, heads * (P + Vd));
      args.k_rope = dev.k_rope.View(s, R, in.stride);
      args.scale = whole.scale;
      args.o = pieces.View(T, heads * Vd).Rows(t0, args.t);
      MlaPrefillAttention(args);
    }
    EXPECT_TRUE(pieces.GuardsIntact()) << "split at " << t1;
    const double tol = ReductionTolerance(L + T);
    EXPECT_TRUE(AllClose(pieces.Values(), ToDouble(o), tol, tol)) << "split at " << t1;
  }
}

struct AbsorbedCase {
  int64_t t, prefix, heads, latent, rope;
};

TEST_P(MlaAbsorbedAttentionTest, MatchesReferenceOverShapes) {
  const int64_t dims[][2] = {{3, 5}, {12, 0}, {32, 8}, {17, 3}};
  uint64_t seed = 1000;
  double worst = 0.0;
  const int saved = NumThreads();
  // 5 threads split decode keys even on small hosts; the CUDA variant does
  // not depend on the host's threads, one pass suffices (and keeps the
  // harness's run short).
  for (int threads : {saved, 5}) {
    if (device() == Device::kCuda && threads != saved) continue;
    SetNumThreads(threads);
    for (int64_t t : {0, 1, 2, 7, 64, 65, 130}) {
      for (int64_t prefix : {0, 1, 5, 100, 1500}) {
        if (prefix == 1500 && t > 7) continue;  // long caches: decode-like only
        for (int64_t heads = 1; heads <= 4; ++heads) {
          for (const auto& d : dims) {
            for (DType cache_dtype : {DType::kF32, DType::kBF16}) {
              const AbsorbedCase c{t, prefix, heads, d[0], d[1]};
              const int64_t s = prefix + t, w = c.latent + c.rope;
              const std::vector<float> ql = RandomFloats(t * heads * c.latent, seed += 3);
              const std::vector<float> qr = RandomFloats(t * heads * c.rope, seed + 1);
              std::vector<float> cache = RandomFloats(s * w, seed + 2);
              // A bf16 cache holds the top halves; the reference sees the same
              // values, which the kernel widens exactly.
              std::vector<uint16_t> cache16(cache.size());
              for (size_t i = 0; i < cache.size(); ++i) {
                uint32_t bits;
                std::memcpy(&bits, &cache[i], 4);
                cache16[i] = static_cast<uint16_t>(bits >> 16);
                if (cache_dtype == DType::kBF16) {
                  bits &= 0xffff0000u;
                  std::memcpy(&cache[i], &bits, 4);
                }
              }
              const float scale = 1.0f / std::sqrt(static_cast<float>(w));
              auto out = Output<float>(t * heads * c.latent);
              auto ql_device = Input(ql), qr_device = Input(qr), cache_device = Input(cache);
              auto cache16_device = Input(cache16);
              MlaAbsorbedArgs args;
              args.t = t;
              args.prefix = prefix;
              args.heads = heads;
              args.latent_dim = c.latent;
              args.rope_dim = c.rope;
              args.q_latent = ql_device.View(t, heads * c.latent);
              args.q_rope = qr_device.View(t, heads * c.rope);
              args.cache =
                  cache_dtype == DType::kBF16 ? cache16_device.View(s, w) : cache_device.View(s, w);
              args.scale = scale;
              args.o_latent = out.View(t, heads * c.latent);
              MlaAbsorbedAttention(args);
              ASSERT_TRUE(out.GuardsIntact())
                  << threads << " threads, T=" << t << " prefix=" << prefix << " heads=" << heads
                  << " C,R=" << d[0] << "," << d[1] << " cache " << DTypeName(cache_dtype);
              const std::vector<float> o = out.Values();

              const std::vector<double> qld = ToDouble(ql), qrd = ToDouble(qr),
                                        cached = ToDouble(cache);
              std::vector<double> want(o.size());
              ref::MlaAbsorbedArgs ra;
              ra.t = t;
              ra.prefix = prefix;
              ra.heads = heads;
              ra.latent_dim = c.latent;
              ra.rope_dim = c.rope;
              ra.q_latent = qld.data();
              ra.q_rope = qrd.data();
              ra.cache = cached.data();
              ra.scale = scale;
              ra.o_latent = want.data();
              ref::MlaAbsorbedAttention(ra);
              const double tol = ReductionTolerance(s + w);
              ASSERT_TRUE(AllClose(o, want, tol, tol))
                  << threads << " threads, T=" << t << " prefix=" << prefix << " heads=" << heads
                  << " C,R=" << d[0] << "," << d[1] << " cache " << DTypeName(cache_dtype);
              worst = std::max(worst, MaxAbsDiff(o, want));
            }
          }
        }
      }
    }
  }
  SetNumThreads(saved);
  std::printf("max abs error over the sweep: %.3g\n", worst);
}

// The real model's latent dims (C = 512, R = 64): wide rows, which the CUDA
// variant takes in smaller tiles than the sweep's, over a short cache and a
// long one (split keys).
TEST_P(MlaAbsorbedAttentionTest, ModelDims) {
  const int64_t heads = 3, C = 512, R = 64, w = C + R;
  uint64_t seed = 7000;
  for (const auto& [t, prefix] : {std::pair<int64_t, int64_t>{2, 40}, {1, 1000}}) {
    const int64_t s = prefix + t;
    const std::vector<float> ql = RandomFloats(t * heads * C, ++seed);
    const std::vector<float> qr = RandomFloats(t * heads * R, ++seed);
    const std::vector<float> cache = RandomFloats(s * w, ++seed);
    const float scale = 1.0f / std::sqrt(static_cast<float>(w));
    auto ql_device = Input(ql), qr_device = Input(qr), cache_device = Input(cache);
    auto out = Output<float>(t * heads * C);
    MlaAbsorbedAttention({t, prefix, heads, C, R, ql_device.View(t, heads * C),
                          qr_device.View(t, heads * R), cache_device.View(s, w), scale,
                          out.View(t, heads * C), Tensor{}, 0});
    ASSERT_TRUE(out.GuardsIntact()) << "T=" << t << " prefix=" << prefix;
    const std::vector<double> qld = ToDouble(ql), qrd = ToDouble(qr), cached = ToDouble(cache);
    std::vector<double> want(t * heads * C);
    ref::MlaAbsorbedArgs ra{t,          prefix,     heads,         C,     R,
                            qld.data(), qrd.data(), cached.data(), scale, want.data()};
    ref::MlaAbsorbedAttention(ra);
    const double tol = ReductionTolerance(s + w);
    EXPECT_TRUE(AllClose(out.Values(), want, tol, tol)) << "T=" << t << " prefix=" << prefix;
  }
}

// A paged cache gives the bits of the same keys held contiguously: keys are
// read through the page table in the same order, at any page size (one that
// splits a key block, one of a key block exactly), dtype and key split.
TEST_P(MlaAbsorbedAttentionTest, PagedCacheEqualsContiguous) {
  const int64_t heads = 2, C = 12, R = 4, w = C + R;
  uint64_t seed = 5000;
  const int saved = NumThreads();
  for (int threads : {saved, 5}) {
    if (device() == Device::kCuda && threads != saved) continue;  // no host threads
    SetNumThreads(threads);
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (int64_t page_tokens : {1, 7, 64}) {
        for (int64_t t : {1, 3, 65}) {
          for (int64_t prefix : {0, 5, 700}) {
            const int64_t s = prefix + t;
            const int64_t pages = (s + page_tokens - 1) / page_tokens;
            const int64_t pool_pages = pages + 2;
            std::vector<int32_t> table(static_cast<size_t>(pool_pages));
            std::iota(table.begin(), table.end(), 0);
            std::shuffle(table.begin(), table.end(), std::mt19937_64(seed));
            table.resize(static_cast<size_t>(pages));
            const std::vector<float> ql = RandomFloats(t * heads * C, seed += 3);
            const std::vector<float> qr = RandomFloats(t * heads * R, seed + 1);
            const std::vector<float> keys = RandomFloats(s * w, seed + 2);
            std::vector<uint16_t> keys16(keys.size());
            for (size_t i = 0; i < keys.size(); ++i) keys16[i] = FloatToBf16(keys[i]);
            // The pool: NaN everywhere but the sequence's rows.
            std::vector<float> pool = NaNs(pool_pages * page_tokens * w);
            std::vector<uint16_t> pool16(pool.size(), 0x7fc0);
            for (int64_t k = 0; k < s; ++k) {
              const int64_t row = table[k / page_tokens] * page_tokens + k % page_tokens;
              std::copy_n(keys.data() + k * w, w, pool.data() + row * w);
              std::copy_n(keys16.data() + k * w, w, pool16.data() + row * w);
            }
            auto keys_device = Input(keys), pool_device = Input(pool);
            auto keys16_device = Input(keys16), pool16_device = Input(pool16);
            auto ql_device = Input(ql), qr_device = Input(qr);
            auto table_device = Input(table);
            MlaAbsorbedArgs args;
            args.t = t;
            args.prefix = prefix;
            args.heads = heads;
            args.latent_dim = C;
            args.rope_dim = R;
            args.q_latent = ql_device.View(t, heads * C);
            args.q_rope = qr_device.View(t, heads * R);
            args.scale = 0.25f;
            auto flat_out = Output<float>(t * heads * C), paged_out = Output<float>(t * heads * C);
            args.cache = dtype == DType::kBF16 ? keys16_device.View(s, w) : keys_device.View(s, w);
            args.o_latent = flat_out.View(t, heads * C);
            MlaAbsorbedAttention(args);
            args.cache = dtype == DType::kBF16 ? pool16_device.View(pool_pages * page_tokens, w)
                                               : pool_device.View(pool_pages * page_tokens, w);
            args.page_table = table_device.View(1, pages);
            args.page_tokens = page_tokens;
            args.o_latent = paged_out.View(t, heads * C);
            MlaAbsorbedAttention(args);
            ASSERT_TRUE(flat_out.GuardsIntact() && paged_out.GuardsIntact())
                << threads << " threads, " << DTypeName(dtype) << " page_tokens " << page_tokens
                << " T=" << t << " prefix=" << prefix;
            const std::vector<float> flat = flat_out.Values(), paged = paged_out.Values();
            ASSERT_EQ(std::memcmp(flat.data(), paged.data(), flat.size() * sizeof(float)), 0)
                << threads << " threads, " << DTypeName(dtype) << " page_tokens " << page_tokens
                << " T=" << t << " prefix=" << prefix;
          }
        }
      }
    }
  }
  SetNumThreads(saved);
}

// The absorbed form over the latent cache equals the prefill form over the
// materialised keys and values: kv = c·Wᵀ, q_latent_h = W_UK_hᵀ q_nope_h,
// o_h = W_UV_h o_latent_h.
TEST_P(MlaAbsorbedAttentionTest, EqualsPrefillOverMaterialisedKv) {
  const int64_t T = 9, L = 150, n = 3, P = 16, R = 8, Vd = 12, C = 40;
  const int64_t S = L + T, kvw = P + Vd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(P + R));
  // W [n * (P + Vd), C] scaled so that kv entries stay O(1).
  std::vector<float> w = RandomFloats(n * kvw * C, 11, -1.0f, 1.0f);
  for (float& x : w) x *= 1.7f / std::sqrt(static_cast<float>(C));
  const std::vector<float> c = RandomFloats(S * C, 12);
  const std::vector<float> kr = RandomFloats(S * R, 13);
  const std::vector<float> q = RandomFloats(T * n * (P + R), 14);  // [T, n, P+R]

  // Materialised kv [S, n, P + Vd] = c·Wᵀ, in float64.
  std::vector<double> kv(S * n * kvw, 0.0);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t r = 0; r < n * kvw; ++r)
      for (int64_t j = 0; j < C; ++j) kv[s * n * kvw + r] += double{c[s * C + j]} * w[r * C + j];
  // Absorbed queries and the [c | kr] cache.
  std::vector<double> q_latent(T * n * C, 0.0), q_rope(T * n * R);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < n; ++h) {
      const float* qh = q.data() + (t * n + h) * (P + R);
      for (int64_t j = 0; j < C; ++j)
        for (int64_t p = 0; p < P; ++p)
          q_latent[(t * n + h) * C + j] += double{w[(h * kvw + p) * C + j]} * qh[p];
      for (int64_t r = 0; r < R; ++r) q_rope[(t * n + h) * R + r] = qh[P + r];
    }
  std::vector<double> cache(S * (C + R));
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t j = 0; j < C; ++j) cache[s * (C + R) + j] = c[s * C + j];
    for (int64_t r = 0; r < R; ++r) cache[s * (C + R) + C + r] = kr[s * R + r];
  }
  // o_h = W_UV_h o_latent_h.
  auto up_project = [&](const auto& o_latent) {
    std::vector<double> o(T * n * Vd, 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < n; ++h)
        for (int64_t v = 0; v < Vd; ++v)
          for (int64_t j = 0; j < C; ++j)
            o[(t * n + h) * Vd + v] +=
                double{w[(h * kvw + P + v) * C + j]} * o_latent[(t * n + h) * C + j];
    return o;
  };

  // Float64 references of both forms agree to float64 rounding: this checks
  // the test's algebra.
  std::vector<double> ref_prefill(T * n * Vd), ref_latent(T * n * C);
  const std::vector<double> qd = ToDouble(q), krd = ToDouble(kr);
  ref::MlaPrefillArgs rp{T,         L,         n,          P, R,     Vd,
                         qd.data(), kv.data(), krd.data(), R, scale, ref_prefill.data()};
  ref::MlaPrefillAttention(rp);
  ref::MlaAbsorbedArgs ra{
      T, L, n, C, R, q_latent.data(), q_rope.data(), cache.data(), scale, ref_latent.data()};
  ref::MlaAbsorbedAttention(ra);
  const std::vector<double> ref_absorbed = up_project(ref_latent);
  ASSERT_LT(testing::RelL2(ref_absorbed, ref_prefill), 1e-12);

  // The two fast kernels on float32 inputs.
  const std::vector<float> kv_f = testing::ToFloat(kv), cache_f = testing::ToFloat(cache),
                           ql_f = testing::ToFloat(q_latent), qr_f = testing::ToFloat(q_rope);
  auto prefill_out = Output<float>(T * n * Vd), latent_out = Output<float>(T * n * C);
  auto q_device = Input(q), kv_device = Input(kv_f), kr_device = Input(kr);
  auto ql_device = Input(ql_f), qr_device = Input(qr_f), cache_device = Input(cache_f);
  MlaPrefillAttention({T, L, n, P, R, Vd, q_device.View(T, n * (P + R)), kv_device.View(S, n * kvw),
                       kr_device.View(S, R), scale, prefill_out.View(T, n * Vd)});
  MlaAbsorbedAttention({T, L, n, C, R, ql_device.View(T, n * C), qr_device.View(T, n * R),
                        cache_device.View(S, C + R), scale, latent_out.View(T, n * C), Tensor{},
                        0});
  EXPECT_TRUE(prefill_out.GuardsIntact());
  EXPECT_TRUE(latent_out.GuardsIntact());
  const std::vector<float> o_prefill = prefill_out.Values(), o_latent = latent_out.Values();
  const std::vector<double> o_absorbed = up_project(o_latent);
  // Both paths round their inputs (kv, q_latent) to float32 and reduce over
  // S keys and C latent channels.
  const double tol = ReductionTolerance(S + C + P + R);
  EXPECT_TRUE(AllClose(o_prefill, o_absorbed, tol, tol));
  EXPECT_TRUE(AllClose(o_prefill, ref_prefill, tol, tol));
  std::printf("prefill vs absorbed: max abs diff %.3g (prefill vs ref %.3g)\n",
              MaxAbsDiff(o_prefill, o_absorbed), MaxAbsDiff(o_prefill, ref_prefill));
}

TEST(MlaAttentionDeathTest, EntryPointRefusesWrongShapeDtypeDevice) {
  const PrefillCase c{3, 2, 2, 4, 2, 4, 0.5f};
  const PrefillInputs in(c, 7);
  std::vector<float> o(c.t * c.heads * c.v);
  PrefillDeviceInputs dev(Device::kCpu, in);
  const MlaPrefillArgs args =
      PrefillArgs(c, in, dev, MutableTensor::F32(o.data(), c.t, c.heads * c.v));
  MlaPrefillAttention(args);

  MlaPrefillArgs short_kv = args;  // one key row fewer than prefix + t
  short_kv.kv.rows -= 1;
  EXPECT_DEATH(MlaPrefillAttention(short_kv), "a.kv: shape \\[4, 16\\], expected \\[5, 16\\]");
  MlaPrefillArgs bf16_q = args;
  bf16_q.q.dtype = DType::kBF16;
  EXPECT_DEATH(MlaPrefillAttention(bf16_q), "a.q: dtype bf16, expected f32");
  MlaPrefillArgs gpu_o = args;
  gpu_o.o.device = Device::kCuda;
  // Without a CUDA backend the output is refused; with one, the inputs.
  EXPECT_DEATH(MlaPrefillAttention(gpu_o),
               "(a.o: device cuda, but no CUDA backend is active|a.q: device cpu, but the op runs "
               "on the cuda)");
  MlaPrefillArgs narrow_rope = args;  // rows closer than a row's width
  narrow_rope.k_rope.stride = c.rope - 1;
  EXPECT_DEATH(MlaPrefillAttention(narrow_rope), "a.k_rope: row stride 1");

  const int64_t latent = 8;
  std::vector<float> ql(c.t * c.heads * latent), qr(c.t * c.heads * c.rope);
  std::vector<float> cache(in.s * (latent + c.rope)), ol(c.t * c.heads * latent);
  MlaAbsorbedArgs ab;
  ab.t = c.t;
  ab.prefix = c.prefix;
  ab.heads = c.heads;
  ab.latent_dim = latent;
  ab.rope_dim = c.rope;
  ab.q_latent = Tensor::F32(ql.data(), c.t, c.heads * latent);
  ab.q_rope = Tensor::F32(qr.data(), c.t, c.heads * c.rope);
  ab.cache = Tensor::F32(cache.data(), in.s, latent + c.rope);
  ab.o_latent = MutableTensor::F32(ol.data(), c.t, c.heads * latent);
  MlaAbsorbedAttention(ab);
  MlaAbsorbedArgs i32_cache = ab;
  i32_cache.cache.dtype = DType::kI32;
  EXPECT_DEATH(MlaAbsorbedAttention(i32_cache), "cache.dtype == DType::kF32");
  MlaAbsorbedArgs gpu_cache = ab;
  gpu_cache.cache.device = Device::kCuda;
  EXPECT_DEATH(MlaAbsorbedAttention(gpu_cache), "a.cache: device cuda");
}

DELTASERVE_INSTANTIATE_DEVICE_TEST(MlaPrefillAttentionTest);
DELTASERVE_INSTANTIATE_DEVICE_TEST(MlaAbsorbedAttentionTest);

}  // namespace
}  // namespace deltaserve::kernels
