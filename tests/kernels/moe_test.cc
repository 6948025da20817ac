// kernels/moe.h: routing checked exactly where it can be, and the grouped
// expert compute against a float64 reference that runs each token's experts
// one by one.
#include "kernels/moe.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/isa.h"
#include "kernels/reference/moe_ref.h"
#include "kernels/reference/mxfp4_ref.h"
#include "kernels/threads.h"
#include "tests/kernels/device_test_util.h"
#include "tests/test_util.h"

namespace deltaserve::kernels {
namespace {

using testing::AllClose;
using testing::DeviceTest;
using testing::GuardedBuffer;
using testing::RandomFloats;
using testing::ReductionTolerance;
using testing::ToDouble;

constexpr double kFloatEps = 1.1920928955078125e-07;

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// ---------------------------------------------------------------- MoeRoute

class MoeRouteTest : public DeviceTest {};
class MoeExpertsTest : public DeviceTest {};

struct Routed {
  std::vector<int32_t> idx;
  std::vector<float> weights;
};

// On `device`, into guarded outputs whose guards it checks.
Routed Route(Device device, const std::vector<float>& logits, const std::vector<float>* bias,
             int64_t t, int64_t e, int64_t k, bool renormalize, float scaling) {
  GuardedBuffer<int32_t> idx(device, t * k);
  GuardedBuffer<float> weights(device, t * k);
  GuardedBuffer<float> logits_on(device, t * e), bias_on(device, e);
  logits_on.Fill(logits);
  if (bias != nullptr) bias_on.Fill(*bias);
  MoeRoute(logits_on.View(t, e), bias != nullptr ? Tensor(bias_on.View(1, e)) : Tensor{}, k,
           renormalize, scaling, idx.View(t, k), weights.View(t, k));
  EXPECT_TRUE(idx.GuardsIntact());
  EXPECT_TRUE(weights.GuardsIntact());
  return Routed{idx.Values(), weights.Values()};
}

TEST_P(MoeRouteTest, MatchesReference) {
  uint64_t seed = 1;
  for (int64_t t : {1, 3, 40}) {  // 40 tokens route on several threads
    for (int64_t e : {1, 4, 64}) {
      for (int64_t k : {1, 2, 8}) {
        if (k > e) continue;
        for (bool with_bias : {false, true}) {
          for (bool renormalize : {false, true}) {
            SCOPED_TRACE(::testing::Message() << "t " << t << " e " << e << " k " << k << " bias "
                                              << with_bias << " renormalize " << renormalize);
            const auto logits = RandomFloats(t * e, ++seed, -4.0f, 4.0f);
            const auto bias = RandomFloats(e, ++seed, -0.5f, 0.5f);
            const Routed got =
                Route(device(), logits, with_bias ? &bias : nullptr, t, e, k, renormalize, 2.5f);
            std::vector<int32_t> want_idx(t * k, -1);
            std::vector<double> want_w(t * k);
            const auto bias_d = ToDouble(bias);
            ref::MoeRoute(ToDouble(logits).data(), with_bias ? bias_d.data() : nullptr, t, e, k,
                          renormalize, 2.5, want_idx.data(), want_w.data());
            EXPECT_EQ(got.idx, want_idx);
            // Computed in double, rounded once to float.
            EXPECT_TRUE(AllClose(got.weights, want_w, 0.0, kFloatEps));
          }
        }
      }
    }
  }
}

// The bias decides which experts are picked; the weights still come from the
// unbiased scores.
TEST_P(MoeRouteTest, BiasOnlySelects) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f, -1.0f};
  const std::vector<float> bias = {0.0f, 0.0f, 5.0f, 0.0f};
  const Routed r = Route(device(), logits, &bias, 1, 4, 2, /*renormalize=*/true, 1.0f);
  EXPECT_EQ(r.idx, (std::vector<int32_t>{2, 0}));
  const double s2 = Sigmoid(0.0), s0 = Sigmoid(2.0);
  EXPECT_NEAR(r.weights[0], s2 / (s2 + s0), 1e-7);
  EXPECT_NEAR(r.weights[1], s0 / (s2 + s0), 1e-7);
  // Without the bias the two highest logits win.
  const Routed plain = Route(device(), logits, nullptr, 1, 4, 2, true, 1.0f);
  EXPECT_EQ(plain.idx, (std::vector<int32_t>{0, 1}));
}

// sigmoid(0) = 0.5 exactly, so equal logits give exact ties and exact weights.
TEST_P(MoeRouteTest, TiesGoToLowerIndex) {
  const std::vector<float> zeros(6, 0.0f);
  const Routed r = Route(device(), zeros, nullptr, 1, 6, 3, /*renormalize=*/false, 2.5f);
  EXPECT_EQ(r.idx, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(r.weights, (std::vector<float>{1.25f, 1.25f, 1.25f}));

  // Keys 0.5, 1.5, 0.5, 1.5, 0.5, 1.5: the biased ones first, each tie group
  // in index order.
  const std::vector<float> bias = {0.0f, 1.0f, 0.0f, 1.0f, 0.0f, 1.0f};
  const Routed b = Route(device(), zeros, &bias, 1, 6, 4, /*renormalize=*/true, 2.0f);
  EXPECT_EQ(b.idx, (std::vector<int32_t>{1, 3, 5, 0}));
  EXPECT_EQ(b.weights, (std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f}));
}

TEST_P(MoeRouteTest, SaturatedLogitsStayFinite) {
  // sigmoid(-1000) = 0 in any precision; renormalising over the others.
  const std::vector<float> logits = {-1000.0f, 1000.0f, 0.0f};
  const Routed r = Route(device(), logits, nullptr, 1, 3, 3, true, 1.0f);
  EXPECT_EQ(r.idx, (std::vector<int32_t>{1, 2, 0}));
  EXPECT_NEAR(r.weights[0], 1.0 / 1.5, 1e-7);
  EXPECT_NEAR(r.weights[1], 0.5 / 1.5, 1e-7);
  EXPECT_EQ(r.weights[2], 0.0f);
}

// ------------------------------------------------------------- MoeExperts
//
// Routing for these tests runs on the CPU (MoeRoute has no CUDA variant);
// RunFast copies its results to the device under test.

// Random expert weights, scaled so activations stay O(1) at every width.
struct ExpertSet {
  int64_t n = 0, din = 0, inter = 0, dout = 0;
  std::vector<std::vector<float>> w13, w2;  // per expert
  std::vector<std::vector<double>> w13_d, w2_d;

  ExpertSet(int64_t n_, int64_t din_, int64_t inter_, int64_t dout_, uint64_t seed)
      : n(n_), din(din_), inter(inter_), dout(dout_) {
    const float a13 = 2.0f / std::sqrt(static_cast<float>(din));
    const float a2 = 2.0f / std::sqrt(static_cast<float>(inter));
    for (int64_t e = 0; e < n; ++e) {
      w13.push_back(RandomFloats(2 * inter * din, seed + 2 * e, -a13, a13));
      w2.push_back(RandomFloats(dout * inter, seed + 2 * e + 1, -a2, a2));
      w13_d.push_back(ToDouble(w13.back()));
      w2_d.push_back(ToDouble(w2.back()));
    }
  }
  std::vector<MoeExpert> Fast() const {
    std::vector<MoeExpert> out(n);
    for (int64_t e = 0; e < n; ++e) {
      out[e] = {Tensor::F32(w13[e].data(), 2 * inter, din), Tensor::F32(w2[e].data(), dout, inter)};
    }
    return out;
  }
  std::vector<ref::MoeExpert> Ref() const {
    std::vector<ref::MoeExpert> out(n);
    for (int64_t e = 0; e < n; ++e) out[e] = {w13_d[e].data(), w2_d[e].data()};
    return out;
  }
};

// The experts' weights on `device`: the CPU's are used where they are,
// another device gets copies in its workspace's memory, freed with this.
class DeviceExperts {
 public:
  DeviceExperts(const std::vector<MoeExpert>& experts, Device device)
      : device_(device), experts_(experts) {
    if (device == Device::kCpu) return;
    for (MoeExpert& ex : experts_) {
      for (Tensor* w : {&ex.w13, &ex.w2}) {
        if (w->empty()) continue;
        w->device = device;
        w->data = Copy(w->data, static_cast<size_t>(w->RowBytes() * w->rows));
        if (w->scales != nullptr) {
          w->scales = static_cast<const uint8_t*>(
              Copy(w->scales, static_cast<size_t>(w->ScaleRowBytes() * w->rows)));
        }
      }
    }
  }
  DeviceExperts(const DeviceExperts&) = delete;
  DeviceExperts& operator=(const DeviceExperts&) = delete;
  ~DeviceExperts() {
    for (const auto& [p, bytes] : blocks_) Workspace::Of(device_).Free(p, bytes);
  }
  const MoeExpert* data() const { return experts_.data(); }

 private:
  const void* Copy(const void* host, size_t bytes) {
    void* p = Workspace::Of(device_).Allocate(bytes);
    Workspace::Of(device_).CopyFromHost(p, host, bytes);
    blocks_.emplace_back(p, bytes);
    return p;
  }

  Device device_;
  std::vector<MoeExpert> experts_;
  std::vector<std::pair<void*, size_t>> blocks_;
};

// On `device` (inputs copied there), into a guarded output whose guards it
// checks.
std::vector<float> RunFast(Device device, const ExpertSet& set,
                           const std::vector<MoeExpert>& experts, const std::vector<float>& z,
                           int64_t t, int64_t k, const std::vector<int32_t>& idx,
                           const std::vector<float>& weights, const ActivationParams& act) {
  GuardedBuffer<float> out(device, t * set.dout);
  GuardedBuffer<float> zd(device, static_cast<int64_t>(z.size()));
  zd.Fill(z);
  GuardedBuffer<int32_t> idxd(device, static_cast<int64_t>(idx.size()));
  idxd.Fill(idx);
  GuardedBuffer<float> weightsd(device, static_cast<int64_t>(weights.size()));
  weightsd.Fill(weights);
  const DeviceExperts on_device(experts, device);
  MoeExpertsArgs a;
  a.t = t;
  a.din = set.din;
  a.inter = set.inter;
  a.dout = set.dout;
  a.top_k = k;
  a.n_experts = set.n;
  a.z = zd.View(t, set.din);
  a.experts = on_device.data();
  a.idx = idxd.View(t, k);
  a.weights = weightsd.View(t, k);
  a.act = act;
  a.out = out.View(t, set.dout);
  MoeExperts(a);
  EXPECT_TRUE(out.GuardsIntact());
  return out.Values();
}

std::vector<double> RunRef(const ExpertSet& set, const std::vector<float>& z, int64_t t, int64_t k,
                           const std::vector<int32_t>& idx, const std::vector<float>& weights,
                           const ActivationParams& act) {
  std::vector<double> out(t * set.dout);
  const auto experts = set.Ref();
  const auto zd = ToDouble(z);
  const auto wd = ToDouble(weights);
  ref::MoeExpertsArgs a;
  a.t = t;
  a.din = set.din;
  a.inter = set.inter;
  a.dout = set.dout;
  a.top_k = k;
  a.n_experts = set.n;
  a.z = zd.data();
  a.experts = experts.data();
  a.idx = idx.data();
  a.weights = wd.data();
  a.act = act;
  a.out = out.data();
  ref::MoeExperts(a);
  return out;
}

// Two GEMM reductions (din, then inter) with the activation between them, and
// the sum over top_k: their tolerances add. Relative to the output's RMS for
// the absolute part, since cancellation makes single elements small.
::testing::AssertionResult MoeClose(const std::vector<float>& got, const std::vector<double>& want,
                                    int64_t din, int64_t inter, int64_t k) {
  const double tol = ReductionTolerance(din) + ReductionTolerance(inter) + ReductionTolerance(k);
  double sq = 0.0;
  for (double v : want) sq += v * v;
  const double rms = want.empty() ? 0.0 : std::sqrt(sq / want.size());
  return AllClose(got, want, tol * rms, tol);
}

ActivationParams Situ() {
  ActivationParams p;
  p.kind = Activation::kSitu;
  return p;
}

struct Case {
  int64_t t, n_experts, top_k;
};

// The experts of `set` in MXFP4, as K3 stores them: random codes under
// scales chosen so values spread like the float set's (2^-4 .. 2^-2 times
// codes up to 6); `set`'s float weights are replaced by the dequantised
// values, which the reference then uses.
struct Mxfp4Experts {
  std::vector<std::vector<uint8_t>> packed13, scales13, packed2, scales2;

  Mxfp4Experts(ExpertSet* set, uint64_t seed) {
    for (int64_t e = 0; e < set->n; ++e) {
      Quantize(2 * set->inter, set->din, seed + 2 * e, &set->w13[e], &set->w13_d[e], &packed13,
               &scales13);
      Quantize(set->dout, set->inter, seed + 2 * e + 1, &set->w2[e], &set->w2_d[e], &packed2,
               &scales2);
    }
  }
  static void Quantize(int64_t rows, int64_t cols, uint64_t seed, std::vector<float>* f,
                       std::vector<double>* d, std::vector<std::vector<uint8_t>>* packed_out,
                       std::vector<std::vector<uint8_t>>* scales_out) {
    const auto codes = testing::RandomTokens(rows * cols / 2, seed, 256);
    const auto powers = testing::RandomTokens(rows * cols / 32, seed + 7, 3);
    std::vector<uint8_t> packed(codes.begin(), codes.end()), scales(powers.size());
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = static_cast<uint8_t>(123 + powers[i]);
    *d = ref::DequantizeMxfp4Ref(packed.data(), scales.data(), rows, cols);
    *f = testing::ToFloat(*d);
    packed_out->push_back(std::move(packed));
    scales_out->push_back(std::move(scales));
  }
  std::vector<MoeExpert> Fast(const ExpertSet& set) const {
    std::vector<MoeExpert> out(set.n);
    for (int64_t e = 0; e < set.n; ++e) {
      out[e].w13 = {packed13[e].data(), scales13[e].data(), DType::kMxfp4,
                    Device::kCpu,       2 * set.inter,      set.din};
      out[e].w2 = {packed2[e].data(), scales2[e].data(), DType::kMxfp4,
                   Device::kCpu,      set.dout,          set.inter};
    }
    return out;
  }
};

// K3's routed experts in MXFP4, consumed directly: few tokens per expert
// (the skinny kernel) and many (widened panels), against the float64
// reference on the dequantised weights.
TEST_P(MoeExpertsTest, Mxfp4ExpertsMatchReferenceOnDequantisedWeights) {
  for (const Case& c : {Case{1, 8, 2}, Case{5, 4, 2}, Case{200, 4, 2}}) {
    SCOPED_TRACE(::testing::Message() << "t " << c.t);
    ExpertSet set(c.n_experts, 64, 32, 64, 900);
    const Mxfp4Experts mx(&set, 901);
    const auto z = RandomFloats(c.t * set.din, 902);
    const auto logits = RandomFloats(c.t * c.n_experts, 903, -3.0f, 3.0f);
    const Routed r = Route(Device::kCpu, logits, nullptr, c.t, c.n_experts, c.top_k, true, 1.0f);
    const auto got =
        RunFast(device(), set, mx.Fast(set), z, c.t, c.top_k, r.idx, r.weights, Situ());
    const auto want = RunRef(set, z, c.t, c.top_k, r.idx, r.weights, Situ());
    EXPECT_TRUE(MoeClose(got, want, set.din, set.inter, c.top_k));
  }
}

// A prefill step on MXFP4 experts of uneven widths: ~110 tokens an expert
// (the tiled MXFP4 GEMM on the CPU, kernels/cpu/mxfp4_gemm_cpu.cc) with din
// and inter multiples of 32 but not of its column blocks and dout not a
// multiple of its output tiles; the first tokens pick one expert twice, so an
// expert has two rows of one token, which the weighted sum into the output
// adds on threads that split the output's columns.
TEST_P(MoeExpertsTest, Mxfp4PrefillMatchesReference) {
  const int64_t t = 300, n = 8, k = 3;
  ExpertSet set(n, 160, 96, 200, 1500);
  const Mxfp4Experts mx(&set, 1501);
  const auto z = RandomFloats(t * set.din, 1502);
  const auto logits = RandomFloats(t * n, 1503, -3.0f, 3.0f);
  Routed r = Route(Device::kCpu, logits, nullptr, t, n, k, true, 1.0f);
  for (int64_t i = 0; i < 20; ++i) r.idx[i * k + 1] = r.idx[i * k];
  const auto got = RunFast(device(), set, mx.Fast(set), z, t, k, r.idx, r.weights, Situ());
  const auto want = RunRef(set, z, t, k, r.idx, r.weights, Situ());
  EXPECT_TRUE(MoeClose(got, want, set.din, set.inter, k));
}

// A prefill step with few rows an expert and at least 8 experts with rows a
// thread: the CPU shares whole experts among its threads, each pair's output
// in a buffer, then sums each token's rows in expert order (below that, it
// runs the experts one after another on all threads). On MXFP4 experts,
// whose tiled GEMM sums in one order whatever the threads (not so oneDNN's
// sgemm, which the generic level widens them for), both ways give the same
// bits: on one thread 23 experts with rows are shared, on four they are not.
// An expert held elsewhere (none of its pairs computed) and a token picking
// one expert twice are in the step, and expert subsets on two ranks add up
// to the reference.
TEST(MoeExpertsCpuTest, PrefillSharingExpertsAmongThreadsGivesTheSameBits) {
  const int64_t t = 150, n = 24, k = 4;
  ExpertSet set(n, 96, 64, 80, 1600);
  const Mxfp4Experts mx(&set, 1601);
  const auto z = RandomFloats(t * set.din, 1602);
  const auto logits = RandomFloats(t * n, 1603, -3.0f, 3.0f);
  Routed r = Route(Device::kCpu, logits, nullptr, t, n, k, true, 1.0f);
  for (int64_t i = 0; i < 10; ++i) r.idx[i * k + 1] = r.idx[i * k];
  auto experts = mx.Fast(set);
  experts[5] = {};
  const int threads = NumThreads();
  SetNumThreads(1);
  const auto shared = RunFast(Device::kCpu, set, experts, z, t, k, r.idx, r.weights, Situ());
  SetNumThreads(4);
  const auto one_by_one = RunFast(Device::kCpu, set, experts, z, t, k, r.idx, r.weights, Situ());
  if (ActiveIsa() == Isa::kGeneric) {
    EXPECT_TRUE(MoeClose(shared, ToDouble(one_by_one), set.din, set.inter, k));
  } else {
    EXPECT_EQ(0, std::memcmp(shared.data(), one_by_one.data(), shared.size() * sizeof(float)));
  }
  SetNumThreads(1);
  std::vector<float> sum(t * set.dout, 0.0f);
  for (int rank = 0; rank < 2; ++rank) {
    auto part = mx.Fast(set);
    for (int64_t e = 0; e < n; ++e) {
      if (e % 2 != rank) part[e] = {};
    }
    const auto got = RunFast(Device::kCpu, set, part, z, t, k, r.idx, r.weights, Situ());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += got[i];
  }
  SetNumThreads(threads);
  EXPECT_TRUE(MoeClose(sum, RunRef(set, z, t, k, r.idx, r.weights, Situ()), set.din, set.inter, k));
}

// A decode step reads each expert once for all the tokens sent to it: a
// token's output is still bitwise what that token alone gets, whatever other
// tokens share its experts (decode batches of 8 and 32 on K3-shaped MXFP4
// experts, 4 of 32 picked, so experts serve several tokens), and matches the
// float64 reference. On the CPU, whose decode steps run all their experts'
// products in one parallel region (kernels/cpu/moe_cpu.cc).
TEST(MoeExpertsCpuTest, ATokenOfADecodeBatchEqualsThatTokenAlone) {
  for (const int64_t t : {8, 32}) {
    SCOPED_TRACE(::testing::Message() << "t " << t);
    const int64_t n = 32, k = 4;
    ExpertSet set(n, 96, 64, 96, 1100 + t);
    const Mxfp4Experts mx(&set, 1200 + t);
    const auto z = RandomFloats(t * set.din, 1300 + t);
    const auto logits = RandomFloats(t * n, 1400 + t, -3.0f, 3.0f);
    const Routed r = Route(Device::kCpu, logits, nullptr, t, n, k, true, 1.0f);
    const auto batch = RunFast(Device::kCpu, set, mx.Fast(set), z, t, k, r.idx, r.weights, Situ());
    EXPECT_TRUE(
        MoeClose(batch, RunRef(set, z, t, k, r.idx, r.weights, Situ()), set.din, set.inter, k));
    for (int64_t i = 0; i < t; ++i) {
      const std::vector<float> zi(z.begin() + i * set.din, z.begin() + (i + 1) * set.din);
      const std::vector<int32_t> idx(r.idx.begin() + i * k, r.idx.begin() + (i + 1) * k);
      const std::vector<float> w(r.weights.begin() + i * k, r.weights.begin() + (i + 1) * k);
      const auto alone = RunFast(Device::kCpu, set, mx.Fast(set), zi, 1, k, idx, w, Situ());
      ASSERT_EQ(0, std::memcmp(alone.data(), batch.data() + i * set.dout,
                               static_cast<size_t>(set.dout) * sizeof(float)))
          << "token " << i;
    }
  }
}

TEST_P(MoeExpertsTest, MatchesPerTokenReference) {
  // T = 1; more experts than routed pairs; every expert chosen by every
  // token; a single expert.
  const Case cases[] = {{1, 8, 2}, {3, 16, 2}, {17, 4, 4}, {64, 8, 3}, {5, 1, 1}};
  const int64_t dims[][3] = {{1, 1, 1}, {7, 5, 9}, {64, 32, 48}, {129, 17, 3}};
  uint64_t seed = 10;
  for (const Case& c : cases) {
    for (const auto& d : dims) {
      for (const ActivationParams& act : {ActivationParams{}, Situ()}) {
        SCOPED_TRACE(::testing::Message()
                     << "t " << c.t << " experts " << c.n_experts << " top_k " << c.top_k << " din "
                     << d[0] << " inter " << d[1] << " dout " << d[2] << " act "
                     << static_cast<int>(act.kind));
        const ExpertSet set(c.n_experts, d[0], d[1], d[2], seed += 100);
        const auto z = RandomFloats(c.t * set.din, ++seed);
        // Route for realistic idx/weights; the bias keeps the last expert out
        // whenever it can, so some expert always gets no tokens.
        const auto logits = RandomFloats(c.t * c.n_experts, ++seed, -3.0f, 3.0f);
        std::vector<float> bias(c.n_experts, 0.0f);
        if (c.n_experts > c.top_k) bias.back() = -10.0f;
        const Routed r = Route(Device::kCpu, logits, &bias, c.t, c.n_experts, c.top_k, true, 2.0f);
        const auto got = RunFast(device(), set, set.Fast(), z, c.t, c.top_k, r.idx, r.weights, act);
        const auto want = RunRef(set, z, c.t, c.top_k, r.idx, r.weights, act);
        EXPECT_TRUE(MoeClose(got, want, set.din, set.inter, c.top_k));
      }
    }
  }
}

// Expert parallelism: each rank holds the experts e % ranks == rank (the
// others null); the ranks' partial outputs add up to the whole.
TEST_P(MoeExpertsTest, PartialSumsOverExpertSubsetsAddUp) {
  const ExpertSet set(8, 24, 12, 20, 700);
  const int64_t t = 9, k = 3;
  const auto z = RandomFloats(t * set.din, 701);
  const auto logits = RandomFloats(t * set.n, 702, -3.0f, 3.0f);
  const Routed r = Route(Device::kCpu, logits, nullptr, t, set.n, k, true, 1.5f);
  const auto want = RunRef(set, z, t, k, r.idx, r.weights, ActivationParams{});
  for (int ranks : {2, 3}) {
    std::vector<float> sum(t * set.dout, 0.0f);
    for (int rank = 0; rank < ranks; ++rank) {
      auto experts = set.Fast();
      for (int64_t e = 0; e < set.n; ++e) {
        if (e % ranks != rank) experts[e] = {};
      }
      const auto part =
          RunFast(device(), set, experts, z, t, k, r.idx, r.weights, ActivationParams{});
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
    }
    EXPECT_TRUE(MoeClose(sum, want, set.din, set.inter, k)) << ranks << " ranks";
  }
}

// Experts that receive no tokens are never touched: give them no weights.
TEST_P(MoeExpertsTest, SkipsExpertsWithoutTokens) {
  const ExpertSet set(16, 24, 12, 20, 500);
  const int64_t t = 3, k = 2;
  const std::vector<int32_t> idx = {5, 2, 2, 9, 14, 5};
  const auto weights = RandomFloats(t * k, 501, 0.1f, 1.0f);
  auto experts = set.Fast();
  for (int64_t e = 0; e < set.n; ++e) {
    if (std::find(idx.begin(), idx.end(), e) == idx.end()) experts[e] = {};
  }
  const auto z = RandomFloats(t * set.din, 502);
  const auto got = RunFast(device(), set, experts, z, t, k, idx, weights, Situ());
  EXPECT_TRUE(MoeClose(got, RunRef(set, z, t, k, idx, weights, Situ()), set.din, set.inter, k));
}

// The same expert twice for one token counts twice.
TEST_P(MoeExpertsTest, RepeatedExpertAddsTwice) {
  const ExpertSet set(4, 16, 8, 12, 600);
  const int64_t t = 2, k = 2;
  const std::vector<int32_t> idx = {3, 3, 0, 1};
  const std::vector<float> weights = {0.25f, 0.75f, 0.5f, 0.5f};
  const auto z = RandomFloats(t * set.din, 601);
  const auto got = RunFast(device(), set, set.Fast(), z, t, k, idx, weights, ActivationParams{});
  EXPECT_TRUE(
      MoeClose(got, RunRef(set, z, t, k, idx, weights, ActivationParams{}), set.din, set.inter, k));
}

// Each token's sum over its experts runs in a fixed order: repeating the call
// and permuting the slots of a token give bitwise the same output.
TEST_P(MoeExpertsTest, DeterministicAcrossSlotOrder) {
  const ExpertSet set(8, 32, 16, 24, 700);
  const int64_t t = 20, k = 3;
  const auto z = RandomFloats(t * set.din, 701);
  const auto logits = RandomFloats(t * set.n, 702, -3.0f, 3.0f);
  const Routed r = Route(Device::kCpu, logits, nullptr, t, set.n, k, true, 1.0f);
  const auto first = RunFast(device(), set, set.Fast(), z, t, k, r.idx, r.weights, Situ());
  const auto again = RunFast(device(), set, set.Fast(), z, t, k, r.idx, r.weights, Situ());
  EXPECT_EQ(0, std::memcmp(first.data(), again.data(), first.size() * sizeof(float)));

  Routed rev = r;
  for (int64_t i = 0; i < t; ++i) {
    std::reverse(rev.idx.begin() + i * k, rev.idx.begin() + (i + 1) * k);
    std::reverse(rev.weights.begin() + i * k, rev.weights.begin() + (i + 1) * k);
  }
  const auto permuted = RunFast(device(), set, set.Fast(), z, t, k, rev.idx, rev.weights, Situ());
  EXPECT_EQ(0, std::memcmp(first.data(), permuted.data(), first.size() * sizeof(float)));
}

TEST_P(MoeExpertsTest, NoTokensIsNoOp) {
  const ExpertSet set(2, 4, 4, 4, 800);
  const auto out = RunFast(device(), set, set.Fast(), {}, 0, 1, {}, {}, ActivationParams{});
  EXPECT_TRUE(out.empty());
}

DELTASERVE_INSTANTIATE_DEVICE_TEST(MoeRouteTest);
DELTASERVE_INSTANTIATE_DEVICE_TEST(MoeExpertsTest);

}  // namespace
}  // namespace deltaserve::kernels
