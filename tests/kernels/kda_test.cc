// kernels/kda.h against the float64 recurrence and the golden files, on every
// device of AvailableDevices(); o and the state (read and written in place)
// are guarded buffers whose guards are checked after each call.
#include "kernels/kda.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "kernels/reference/kda_ref.h"
#include "tests/kernels/device_test_util.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

using kernels::Device;
using kernels::KdaShape;
using kernels::MutableTensor;
using testing::GuardedBuffer;

// Random rows of length dim, each L2-normalised (q and k arrive normalised).
std::vector<float> NormalizedRows(int64_t rows, int64_t dim, uint64_t seed) {
  std::vector<float> x = testing::RandomFloats(rows * dim, seed);
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0.0;
    for (int64_t c = 0; c < dim; ++c) sum += double{x[r * dim + c]} * x[r * dim + c];
    const double inv = 1.0 / std::sqrt(sum + 1e-12);
    for (int64_t c = 0; c < dim; ++c) {
      x[r * dim + c] = static_cast<float>(x[r * dim + c] * inv);
    }
  }
  return x;
}

struct Inputs {
  KdaShape shape;
  std::vector<float> q, k, v, g, beta, state;
};

enum class Decay { kRealistic, kStrong, kMixed };

Inputs MakeInputs(const KdaShape& s, Decay decay, uint64_t seed) {
  Inputs in;
  in.shape = s;
  in.q = NormalizedRows(s.t * s.heads, s.k_dim, seed + 1);
  in.k = NormalizedRows(s.t * s.heads, s.k_dim, seed + 2);
  in.v = testing::RandomFloats(s.t * s.v_heads * s.v_dim, seed + 3);
  const size_t ng = s.t * s.v_heads * s.k_dim;
  switch (decay) {
    case Decay::kRealistic:  // K3's gate range (lower bound -5), mostly mild
      in.g = testing::RandomFloats(ng, seed + 4, -1.0f, -0.001f);
      break;
    case Decay::kStrong:  // Kimi Linear without a lower bound
      in.g = testing::RandomFloats(ng, seed + 4, -200.0f, -5.0f);
      break;
    case Decay::kMixed: {
      // Per element either a tiny or a huge decay: in-chunk cumulative sums
      // reach -10^4 while their differences stay small, the case where
      // exp(Γ_i)·exp(-Γ_j) overflows and a float32 Γ loses digits.
      const std::vector<float> pick = testing::RandomFloats(ng, seed + 5, 0.0f, 1.0f);
      const std::vector<float> mild = testing::RandomFloats(ng, seed + 4, -0.05f, 0.0f);
      const std::vector<float> strong = testing::RandomFloats(ng, seed + 6, -250.0f, -30.0f);
      in.g.resize(ng);
      for (size_t i = 0; i < ng; ++i) in.g[i] = pick[i] < 0.8f ? mild[i] : strong[i];
      break;
    }
  }
  in.beta = testing::RandomFloats(s.t * s.v_heads, seed + 7, 0.01f, 0.99f);
  in.state = testing::RandomFloats(s.v_heads * s.k_dim * s.v_dim, seed + 8);
  return in;
}

struct RefResult {
  std::vector<double> o, state;
};

RefResult RunReference(const Inputs& in, double scale) {
  const KdaShape& s = in.shape;
  RefResult r;
  r.o.assign(s.t * s.v_heads * s.v_dim, 0.0);
  r.state = testing::ToDouble(in.state);
  const std::vector<double> q = testing::ToDouble(in.q), k = testing::ToDouble(in.k),
                            v = testing::ToDouble(in.v), g = testing::ToDouble(in.g),
                            beta = testing::ToDouble(in.beta);
  kernels::ref::KdaRecurrent(s, q.data(), k.data(), v.data(), g.data(), beta.data(), scale,
                             r.state.data(), r.o.data());
  return r;
}

// Which fast form to run; chunk_size only for the chunked one.
struct Form {
  bool chunked;
  int64_t chunk_size;
};

std::string FormName(const Form& f) {
  return f.chunked ? "KdaChunk(" + std::to_string(f.chunk_size) + ")" : "KdaRecurrent";
}

// The inputs of a call on one device, guarded: q, k [t, heads * k_dim],
// v [t, v_heads * v_dim], g [t, v_heads * k_dim], beta [t, v_heads].
struct DeviceInputs {
  DeviceInputs(Device device, const KdaShape& s, const std::vector<float>& q_values,
               const std::vector<float>& k_values, const std::vector<float>& v_values,
               const std::vector<float>& g_values, const std::vector<float>& beta_values)
      : q(device, static_cast<int64_t>(q_values.size())),
        k(device, static_cast<int64_t>(k_values.size())),
        v(device, static_cast<int64_t>(v_values.size())),
        g(device, static_cast<int64_t>(g_values.size())),
        beta(device, static_cast<int64_t>(beta_values.size())),
        shape(s) {
    q.Fill(q_values);
    k.Fill(k_values);
    v.Fill(v_values);
    g.Fill(g_values);
    beta.Fill(beta_values);
  }
  kernels::Tensor Q() { return q.View(shape.t, shape.heads * shape.k_dim); }
  kernels::Tensor K() { return k.View(shape.t, shape.heads * shape.k_dim); }
  kernels::Tensor V() { return v.View(shape.t, shape.v_heads * shape.v_dim); }
  kernels::Tensor G() { return g.View(shape.t, shape.v_heads * shape.k_dim); }
  kernels::Tensor Beta() { return beta.View(shape.t, shape.v_heads); }

  GuardedBuffer<float> q, k, v, g, beta;
  KdaShape shape;
};

// state is [v_heads, k_dim * v_dim], o [t, v_heads * v_dim]; the views on
// one device.
void RunFast(const Form& form, const KdaShape& s, const kernels::Tensor& q,
             const kernels::Tensor& k, const kernels::Tensor& v, const kernels::Tensor& g,
             const kernels::Tensor& beta, float scale, const MutableTensor& sv,
             const MutableTensor& ov) {
  if (form.chunked) {
    kernels::KdaChunk(s, q, k, v, g, beta, scale, sv, ov, form.chunk_size);
  } else {
    kernels::KdaRecurrent(s, q, k, v, g, beta, scale, sv, ov);
  }
}

// Runs the fast form over the tokens cut into pieces of the given lengths
// (the last piece takes what is left), carrying the state across; each
// piece reads and writes its rows of the inputs and of o [t, v_heads * v_dim].
void RunPieces(const Form& form, const KdaShape& s, const std::vector<int64_t>& cuts,
               DeviceInputs& in, float scale, const MutableTensor& state, const MutableTensor& o) {
  int64_t t0 = 0;
  for (size_t p = 0; t0 < s.t; ++p) {
    const int64_t len = p < cuts.size() ? std::min(cuts[p], s.t - t0) : s.t - t0;
    KdaShape piece = s;
    piece.t = len;
    RunFast(form, piece, in.Q().Rows(t0, len), in.K().Rows(t0, len), in.V().Rows(t0, len),
            in.G().Rows(t0, len), in.Beta().Rows(t0, len), scale, state, o.Rows(t0, len));
    t0 += len;
  }
}

// Tolerance on the relative L2 error of a float32 run against float64: every
// output is a reduction over K channels of a state that sums up to T decayed
// rank-one writes, and the chunked form adds reductions over the chunk
// (L, the forward substitution, Aqk): reduction length K·min(T, 64) + T.
// Factor 8 covers the few sequential operations around each reduction, plus
// the growth through (I + L)^-1, whose entries stay O(1) for beta < 1 and
// normalised keys.
// K = 1 is looser: every key is ±1, so nothing averages out, L is dense with
// |entries| = beta, and results can be far smaller than the terms they sum
// (seen: a final state 1/40 of the initial one, off by 44 ulp of the result,
// ~1 ulp of the terms).
double KdaTolerance(const KdaShape& s) {
  return testing::ReductionTolerance(s.k_dim * std::min<int64_t>(s.t, 64) + s.t,
                                     s.k_dim == 1 ? 32.0 : 8.0);
}

const std::vector<KdaShape>& SweepShapes() {
  static const std::vector<KdaShape> shapes = [] {
    // {t, heads, v_heads, k_dim, v_dim}; t is overwritten by the sweep.
    const std::vector<KdaShape> heads = {{0, 1, 1, 1, 1},   {0, 1, 1, 5, 3},    {0, 2, 2, 16, 16},
                                         {0, 1, 3, 8, 24},  {0, 2, 4, 32, 17},  {0, 1, 2, 64, 64},
                                         {0, 3, 3, 13, 40}, {0, 1, 1, 128, 128}};
    std::vector<KdaShape> out;
    for (int64_t t : {1, 2, 3, 63, 64, 65, 130, 200}) {
      for (size_t h = 0; h < heads.size(); ++h) {
        if (heads[h].k_dim == 128 && t > 65) continue;  // keeps the test quick
        KdaShape s = heads[h];
        s.t = t;
        out.push_back(s);
      }
    }
    return out;
  }();
  return shapes;
}

void SweepAgainstReference(Device device, const Form& form, Decay decay, uint64_t seed_base) {
  double worst = 0.0, worst_ratio = 0.0;
  uint64_t seed = seed_base;
  for (const KdaShape& s : SweepShapes()) {
    SCOPED_TRACE("t=" + std::to_string(s.t) + " H=" + std::to_string(s.heads) +
                 " HV=" + std::to_string(s.v_heads) + " K=" + std::to_string(s.k_dim) +
                 " V=" + std::to_string(s.v_dim));
    const Inputs in = MakeInputs(s, decay, seed += 16);
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.k_dim));
    const RefResult want = RunReference(in, scale);
    GuardedBuffer<float> state(device, static_cast<int64_t>(in.state.size()));
    state.Fill(in.state);
    GuardedBuffer<float> o(device, static_cast<int64_t>(want.o.size()));
    DeviceInputs din(device, s, in.q, in.k, in.v, in.g, in.beta);
    RunFast(form, s, din.Q(), din.K(), din.V(), din.G(), din.Beta(), scale,
            state.View(s.v_heads, s.k_dim * s.v_dim), o.View(s.t, s.v_heads * s.v_dim));
    EXPECT_TRUE(state.GuardsIntact());
    EXPECT_TRUE(o.GuardsIntact());
    const double tol = KdaTolerance(s);
    const double err_o = testing::RelL2(o.Values(), want.o);
    const double err_s = testing::RelL2(state.Values(), want.state);
    EXPECT_LE(err_o, tol);
    EXPECT_LE(err_s, tol);
    worst = std::max({worst, err_o, err_s});
    worst_ratio = std::max({worst_ratio, err_o / tol, err_s / tol});
  }
  std::printf("%s vs float64 reference: max rel L2 error %.3g (%.2f of tolerance)\n",
              FormName(form).c_str(), worst, worst_ratio);
}

class KdaRecurrentTest : public testing::DeviceTest {};
class KdaChunkTest : public testing::DeviceTest {};
class KdaGoldenTest : public testing::DeviceTest {};

TEST_P(KdaRecurrentTest, MatchesReference) {
  SweepAgainstReference(device(), {false, 0}, Decay::kRealistic, 100);
}

TEST_P(KdaRecurrentTest, MatchesReferenceStrongDecay) {
  SweepAgainstReference(device(), {false, 0}, Decay::kStrong, 200);
  SweepAgainstReference(device(), {false, 0}, Decay::kMixed, 300);
}

TEST_P(KdaChunkTest, MatchesReference) {
  SweepAgainstReference(device(), {true, 64}, Decay::kRealistic, 400);
}

TEST_P(KdaChunkTest, MatchesReferenceStrongDecay) {
  SweepAgainstReference(device(), {true, 64}, Decay::kStrong, 500);
  SweepAgainstReference(device(), {true, 64}, Decay::kMixed, 600);
}

TEST_P(KdaChunkTest, OtherChunkSizesMatchReference) {
  for (int64_t chunk : {1, 5, 16, 100}) {
    SweepAgainstReference(device(), {true, chunk}, Decay::kRealistic, 700 + chunk);
  }
  SweepAgainstReference(device(), {true, 16}, Decay::kMixed, 800);
}

// No tokens: the inputs and o are empty (any write lands in its
// guards) and the state is left as it was.
TEST_P(KdaChunkTest, ZeroTokensIsANoOp) {
  const KdaShape s{0, 2, 4, 8, 8};
  auto state = Output<float>(4 * 8 * 8);
  state.Fill(testing::RandomFloats(4 * 8 * 8, 1));
  const std::vector<float> before = state.Values();
  DeviceInputs in(device(), s, {}, {}, {}, {}, {});
  for (const Form& form : {Form{false, 0}, Form{true, 64}}) {
    auto o = Output<float>(0);
    RunFast(form, s, in.Q(), in.K(), in.V(), in.G(), in.Beta(), 0.5f, state.View(4, 8 * 8),
            o.View(0, 4 * 8));
    EXPECT_EQ(state.Values(), before) << FormName(form);
    EXPECT_TRUE(state.GuardsIntact()) << FormName(form);
    EXPECT_TRUE(o.GuardsIntact()) << FormName(form);
  }
}

// ---------------------------------------------------------------------------
// Golden files: the recurrence in float64 by the public reference
// implementation.

struct Golden {
  std::string name;
  int64_t batch = 0;
  KdaShape shape;  // per batch element
  float scale = 0.0f;
  std::vector<float> q, k, v, g, beta, initial_state;
  std::vector<double> o, final_state;
};

std::vector<Golden> LoadGoldens() {
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(testing::GoldenPath("kda"))) {
    if (entry.path().extension() == ".safetensors") paths.push_back(entry.path().string());
  }
  std::sort(paths.begin(), paths.end());
  std::vector<Golden> out;
  for (const std::string& path : paths) {
    const std::optional<testing::GoldenFile> file = testing::ReadGoldenFile(path);
    if (!file) continue;
    const testing::GoldenFile& f = *file;
    Golden gold;
    gold.name = std::filesystem::path(path).stem().string();
    const std::vector<int64_t> qs = f.Get("q").shape;  // [B, T, H, K]
    const std::vector<int64_t> vs = f.Get("v").shape;  // [B, T, HV, V]
    gold.batch = qs[0];
    gold.shape = KdaShape{qs[1], qs[2], vs[2], qs[3], vs[3]};
    gold.scale = 1.0f / std::sqrt(static_cast<float>(qs[3]));
    const auto meta = f.metadata.find("scale");
    if (meta != f.metadata.end()) {
      EXPECT_NEAR(std::stod(meta->second), gold.scale, 1e-7) << gold.name;
    }
    gold.q = testing::ToFloat(f.Get("q").values);
    gold.k = testing::ToFloat(f.Get("k").values);
    gold.v = testing::ToFloat(f.Get("v").values);
    gold.g = testing::ToFloat(f.Get("g").values);
    gold.beta = testing::ToFloat(f.Get("beta").values);
    const KdaShape& s = gold.shape;
    const size_t state_size = gold.batch * s.v_heads * s.k_dim * s.v_dim;
    if (f.tensors.count("initial_state")) {
      gold.initial_state = testing::ToFloat(f.Get("initial_state").values);
    } else {
      gold.initial_state.assign(state_size, 0.0f);
    }
    gold.o = f.Get("o").values;
    gold.final_state = f.Get("final_state").values;
    EXPECT_EQ(gold.initial_state.size(), state_size) << gold.name;
    EXPECT_EQ(gold.final_state.size(), state_size) << gold.name;
    EXPECT_EQ(gold.o.size(), static_cast<size_t>(gold.batch * s.t * s.v_heads * s.v_dim))
        << gold.name;
    out.push_back(std::move(gold));
  }
  return out;
}

const std::vector<Golden>& Goldens() {
  static const std::vector<Golden> goldens = LoadGoldens();
  return goldens;
}

constexpr double kGoldenTolerance = 1e-5;

// Runs every batch element through `form` cut at `cuts` on `device`, each
// into its own guarded o and state, and compares o and the final state with
// the golden values; returns the larger error.
double CheckGolden(Device device, const Golden& gold, const Form& form,
                   const std::vector<int64_t>& cuts) {
  const KdaShape& s = gold.shape;
  const int64_t qk = s.t * s.heads * s.k_dim, vv = s.t * s.v_heads * s.v_dim;
  const int64_t gg = s.t * s.v_heads * s.k_dim, bb = s.t * s.v_heads;
  const int64_t ss = s.v_heads * s.k_dim * s.v_dim;
  std::vector<float> o, state;  // all batch elements
  for (int64_t b = 0; b < gold.batch; ++b) {
    GuardedBuffer<float> ob(device, vv), sb(device, ss);
    sb.Fill(std::vector<float>(gold.initial_state.begin() + b * ss,
                               gold.initial_state.begin() + (b + 1) * ss));
    auto part = [b](const std::vector<float>& all, int64_t size) {
      return std::vector<float>(all.begin() + b * size, all.begin() + (b + 1) * size);
    };
    DeviceInputs in(device, s, part(gold.q, qk), part(gold.k, qk), part(gold.v, vv),
                    part(gold.g, gg), part(gold.beta, bb));
    RunPieces(form, s, cuts, in, gold.scale, sb.View(s.v_heads, s.k_dim * s.v_dim),
              ob.View(s.t, s.v_heads * s.v_dim));
    EXPECT_TRUE(ob.GuardsIntact()) << gold.name << " " << FormName(form) << " batch " << b;
    EXPECT_TRUE(sb.GuardsIntact()) << gold.name << " " << FormName(form) << " batch " << b;
    const std::vector<float> ov = ob.Values(), sv = sb.Values();
    o.insert(o.end(), ov.begin(), ov.end());
    state.insert(state.end(), sv.begin(), sv.end());
  }
  const double err_o = testing::RelL2(o, gold.o);
  const double err_s = testing::RelL2(state, gold.final_state);
  std::string cut_text;
  for (int64_t c : cuts) cut_text += std::to_string(c) + ",";
  EXPECT_LE(err_o, kGoldenTolerance)
      << gold.name << " " << FormName(form) << " cuts {" << cut_text << "rest}";
  EXPECT_LE(err_s, kGoldenTolerance)
      << gold.name << " " << FormName(form) << " cuts {" << cut_text << "rest}";
  return std::max(err_o, err_s);
}

TEST_P(KdaGoldenTest, FilesArePresent) {
  EXPECT_GE(Goldens().size(), 6u);
  bool has_gva = false, has_strong = false;
  for (const Golden& gold : Goldens()) {
    has_gva |= gold.shape.v_heads > gold.shape.heads;
    has_strong |= gold.name == "strong_decay_t256";
  }
  EXPECT_TRUE(has_gva);
  EXPECT_TRUE(has_strong);
}

TEST_P(KdaGoldenTest, Recurrent) {
  for (const Golden& gold : Goldens()) {
    const double err = CheckGolden(device(), gold, {false, 0}, {});
    std::printf("golden %-22s KdaRecurrent rel L2 %.3g\n", gold.name.c_str(), err);
    // Token by token in pieces gives the same as one call.
    CheckGolden(device(), gold, {false, 0}, {1, 7, 57});
  }
}

TEST_P(KdaGoldenTest, ChunkOneShot) {
  for (const Golden& gold : Goldens()) {
    const double err = CheckGolden(device(), gold, {true, 64}, {});
    std::printf("golden %-22s KdaChunk one-shot rel L2 %.3g\n", gold.name.c_str(), err);
  }
}

TEST_P(KdaGoldenTest, ChunkInPieces) {
  const std::vector<std::vector<int64_t>> cut_sets = {{1},         {7, 57},      {64},    {100},
                                                      {33, 65, 1}, {63, 2, 130}, {128, 5}};
  for (const Golden& gold : Goldens()) {
    double worst = 0.0;
    for (const auto& cuts : cut_sets) {
      worst = std::max(worst, CheckGolden(device(), gold, {true, 64}, cuts));
    }
    if (gold.shape.t <= 256) {
      // Every token its own prefill call.
      worst = std::max(
          worst, CheckGolden(device(), gold, {true, 64}, std::vector<int64_t>(gold.shape.t, 1)));
    }
    std::printf("golden %-22s KdaChunk in pieces max rel L2 %.3g\n", gold.name.c_str(), worst);
  }
}

TEST(KdaDeathTest, EntryPointRefusesWrongShapeDtypeDeviceAndOverlap) {
  using kernels::DType;
  using kernels::Tensor;
  const KdaShape s{5, 2, 4, 3, 2};
  const std::vector<float> q = testing::RandomFloats(s.t * s.heads * s.k_dim, 1);
  const std::vector<float> k = testing::RandomFloats(q.size(), 2);
  const std::vector<float> v = testing::RandomFloats(s.t * s.v_heads * s.v_dim, 3);
  const std::vector<float> g = testing::RandomFloats(s.t * s.v_heads * s.k_dim, 4, -1.0f, 0.0f);
  const std::vector<float> beta = testing::RandomFloats(s.t * s.v_heads, 5, 0.0f, 1.0f);
  std::vector<float> state(s.v_heads * s.k_dim * s.v_dim), o(s.t * s.v_heads * s.v_dim);
  const Tensor qv = Tensor::F32(q.data(), s.t, s.heads * s.k_dim);
  const Tensor kv = Tensor::F32(k.data(), s.t, s.heads * s.k_dim);
  const Tensor vv = Tensor::F32(v.data(), s.t, s.v_heads * s.v_dim);
  const Tensor gv = Tensor::F32(g.data(), s.t, s.v_heads * s.k_dim);
  const Tensor bv = Tensor::F32(beta.data(), s.t, s.v_heads);
  const MutableTensor sv = MutableTensor::F32(state.data(), s.v_heads, s.k_dim * s.v_dim);
  const MutableTensor ov = MutableTensor::F32(o.data(), s.t, s.v_heads * s.v_dim);
  kernels::KdaChunk(s, qv, kv, vv, gv, bv, 0.5f, sv, ov);

  // g per value head ([T, HV, K]), given per q/k head instead.
  EXPECT_DEATH(kernels::KdaChunk(s, qv, kv, vv, Tensor::F32(g.data(), s.t, s.heads * s.k_dim), bv,
                                 0.5f, sv, ov),
               "g: shape \\[5, 6\\], expected \\[5, 12\\]");
  Tensor beta_bf16 = bv;
  beta_bf16.dtype = DType::kBF16;
  EXPECT_DEATH(kernels::KdaChunk(s, qv, kv, vv, gv, beta_bf16, 0.5f, sv, ov),
               "beta: dtype bf16, expected f32");
  MutableTensor state_gpu = sv;
  state_gpu.device = Device::kCuda;
  EXPECT_DEATH(kernels::KdaChunk(s, qv, kv, vv, gv, bv, 0.5f, state_gpu, ov), "state: device cuda");
  KdaShape odd = s;
  odd.v_heads = 3;  // not a multiple of heads
  EXPECT_DEATH(kernels::KdaChunk(odd, qv, kv, vv, gv, bv, 0.5f, sv, ov), "v_heads % s.heads");
  EXPECT_DEATH(kernels::KdaChunk(s, qv, kv, vv, gv, bv, 0.5f, sv, ov, 0), "chunk_size >= 1");
  // o written over v.
  std::vector<float> vo = v;
  EXPECT_DEATH(
      kernels::KdaRecurrent(s, qv, kv, Tensor::F32(vo.data(), s.t, s.v_heads * s.v_dim), gv, bv,
                            0.5f, sv, MutableTensor::F32(vo.data(), s.t, s.v_heads * s.v_dim)),
      "Overlaps");
}

DELTASERVE_INSTANTIATE_DEVICE_TEST(KdaRecurrentTest);
DELTASERVE_INSTANTIATE_DEVICE_TEST(KdaChunkTest);
DELTASERVE_INSTANTIATE_DEVICE_TEST(KdaGoldenTest);

}  // namespace
}  // namespace deltaserve
