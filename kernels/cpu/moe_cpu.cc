// MoE routing and grouped expert compute on the CPU.
//
// MoeExperts groups the (token, slot) pairs by expert with a counting sort and
// runs each expert as two GEMMs over its gathered tokens, on the expert's
// weights as stored (MXFP4 in K3), so that the tokens sent to one expert share
// one read of its weights. In a long prefill step (hundreds of rows an
// expert) experts run one after another, each GEMM using all threads, and
// so do each expert's gather of its tokens and the weighted sum of its rows
// into the output. With fewer rows an expert (a 512-token chunk: ~32) and
// enough experts to go round, the threads take whole experts instead, each
// running its expert's GEMMs alone (ExpertsInParallel below says why).
//
// A decode step sends each expert a few tokens (at most the skinny kernel's
// 16), and its experts are small products: one OpenMP region per GEMM per
// expert then costs about as much as reading the expert. There the gate|up
// products of all the step's experts share one parallel region, and the down
// products another, the threads splitting the experts' rows in blocks; each
// product is the skinny kernel's, bitwise what the per-expert GEMM gives.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cpu/gemm_cpu.h"
#include "kernels/cpu/ops.h"
#include "kernels/gemm.h"
#include "kernels/moe.h"
#include "kernels/scratch.h"

namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA {
namespace {

// Tokens below this count are routed on the calling thread.
constexpr int64_t kParallelMinTokens = 16;

// A prefill expert's gather and weighted sum into the output move this many
// floats or more on all threads: at K3's widths (512) an expert's rows from
// 32 up, the tokens of a 512-token chunk. Run serially, they were a quarter of
// an 8192-token step on two cores (k3-moe-small, bench/moe_bench --prefill),
// the other thread idle.
constexpr int64_t kParallelMinFloats = int64_t{1} << 14;
// Columns of the output a thread sums at a time (a multiple of the vectors).
constexpr int64_t kScatterColumns = 64;

// ExpertsInParallel below holds every pair's output row, up to this many
// floats (32 MiB: a 2048-token step of k3-moe-small), and needs this many
// experts with rows per thread to share them out evenly.
constexpr int64_t kExpertParallelMaxFloats = int64_t{1} << 23;
constexpr int64_t kExpertParallelMinExperts = 8;

// out[pair rows, w.rows] = x[pair rows] · wᵀ for every expert e with rows, its
// rows of x and out at offset[e] (x: [pairs, ldx], out: [pairs, ldy]), in one
// parallel region (SkinnyProducts): the experts' blocks of weight rows are
// shared among the threads in expert order, so each thread streams a
// contiguous share of the step's weights and the blocks of an expert with
// more rows than the others do not leave a thread waiting.
void ExpertProducts(const std::vector<int64_t>& offset, const MoeExpert* experts, bool down,
                    const float* x, int64_t ldx, float* out, int64_t ldy) {
  std::vector<LinearPtrs> products;
  for (size_t e = 0; e + 1 < offset.size(); ++e) {
    if (offset[e + 1] == offset[e] || experts[e].w13.empty()) continue;
    const int64_t r0 = offset[e];
    products.push_back({x + r0 * ldx, ldx, down ? &experts[e].w2 : &experts[e].w13,
                        offset[e + 1] - r0, out + r0 * ldy, ldy, false});
  }
  DELTASERVE_CPU_ISA::SkinnyProducts(products.data(), static_cast<int64_t>(products.size()));
}

// A prefill step whose experts get few rows each (a 512-token chunk: 32 of
// k3-moe-small's 128): the threads take whole experts, each running its
// expert's GEMMs alone (their OpenMP regions nested, so one thread each),
// and every pair's output row goes to y in expert order; then each token sums
// its rows in that order, the threads splitting the tokens. Run one expert
// after another on all threads, such an expert's five regions (gather, two
// GEMMs, activation, sum) each ended in a barrier with a few microseconds of
// work a thread, and a GEMM of 32 rows ran at 300 GFLOP/s on two cores
// against 2 x 159 alone on each (MXFP4 [1024 x 512], a Xeon with AVX-512).
// The sums per token run in the order of the loop over experts, so the
// result is bitwise that loop's.
void ExpertsInParallel(const MoeExpertsPtrs& a, const std::vector<int64_t>& offset,
                       const std::vector<int64_t>& order, const std::vector<int64_t>& active,
                       int64_t max_rows) {
  const int64_t pairs = a.t * a.top_k;
  const ScratchFloats y(pairs * a.dout);  // [pairs in expert order, dout]
  const int64_t n_active = static_cast<int64_t>(active.size());
#pragma omp parallel
  {
    const ScratchFloats x(max_rows * a.din), gu(max_rows * 2 * a.inter), h(max_rows * a.inter);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n_active; ++i) {
      const int64_t e = active[i], r0 = offset[e], rows = offset[e + 1] - r0;
      for (int64_t r = 0; r < rows; ++r) {
        std::memcpy(x.data() + r * a.din, a.z + (order[r0 + r] / a.top_k) * a.din,
                    static_cast<size_t>(a.din) * sizeof(float));
      }
      const MoeExpert& ex = a.experts[e];
      DELTASERVE_CPU_ISA::LinearStrided(x.data(), a.din, ex.w13, rows, gu.data(), 2 * a.inter,
                                        false);
      DELTASERVE_CPU_ISA::GatedActivation(gu.data(), rows, a.inter, a.act, h.data());
      DELTASERVE_CPU_ISA::LinearStrided(h.data(), a.inter, ex.w2, rows, y.data() + r0 * a.dout,
                                        a.dout, false);
    }
  }
  // where[p]: pair p's row of y (-1 for an expert held elsewhere).
  std::vector<int64_t> where(pairs, -1);
  for (const int64_t e : active) {
    for (int64_t r = offset[e]; r < offset[e + 1]; ++r) where[order[r]] = r;
  }
#pragma omp parallel
  {
    std::vector<int64_t> rows(a.top_k);  // a token's rows of y, ascending
#pragma omp for schedule(static)
    for (int64_t i = 0; i < a.t; ++i) {
      int64_t n = 0;
      for (int64_t j = 0; j < a.top_k; ++j) {
        const int64_t r = where[i * a.top_k + j];
        if (r < 0) continue;
        int64_t at = n++;  // insertion: ascending rows are ascending experts
        for (; at > 0 && rows[at - 1] > r; --at) rows[at] = rows[at - 1];
        rows[at] = r;
      }
      float* o = a.out + i * a.dout;
      for (int64_t q = 0; q < n; ++q) {
        const float w = a.weights[order[rows[q]]];
        const float* yr = y.data() + rows[q] * a.dout;
        for (int64_t c = 0; c < a.dout; ++c) o[c] += w * yr[c];
      }
    }
  }
}

}  // namespace

void MoeRoute(const float* logits, const float* bias, int64_t t, int64_t experts, int64_t top_k,
              bool renormalize, float scaling, int32_t* idx, float* weights) {
  if (t == 0 || top_k == 0) return;
#pragma omp parallel if (t >= kParallelMinTokens)
  {
    // Scores and keys in double: routing is T·E exps next to a T·E·D gate
    // GEMM, and double keys make near-ties resolve as the float64 reference
    // resolves them instead of by float rounding.
    std::vector<double> score(experts), key(experts);
    std::vector<int32_t> cand(experts);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < t; ++i) {
      const float* row = logits + i * experts;  // [experts]
      for (int64_t e = 0; e < experts; ++e) {
        score[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(row[e])));
        key[e] = score[e] + (bias != nullptr ? static_cast<double>(bias[e]) : 0.0);
        cand[e] = static_cast<int32_t>(e);
      }
      // Highest key first, lower index on ties: a strict total order, so the
      // selection and its order are unique.
      std::partial_sort(
          cand.begin(), cand.begin() + top_k, cand.end(),
          [&key](int32_t a, int32_t b) { return key[a] > key[b] || (key[a] == key[b] && a < b); });
      double sum = 0.0;
      for (int64_t j = 0; j < top_k; ++j) sum += score[cand[j]];
      const double norm = renormalize ? scaling / sum : scaling;
      for (int64_t j = 0; j < top_k; ++j) {
        idx[i * top_k + j] = cand[j];
        weights[i * top_k + j] = static_cast<float>(score[cand[j]] * norm);
      }
    }
  }
}

void MoeExperts(const MoeExpertsPtrs& a) {
  const int64_t pairs = a.t * a.top_k;
  std::fill(a.out, a.out + a.t * a.dout, 0.0f);
  if (pairs == 0) return;

  // Counting sort of pair p = t·top_k + j by expert; stable, so each expert's
  // rows are in token order. offset[e] .. offset[e+1] index `order`.
  std::vector<int64_t> offset(a.n_experts + 1, 0);
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t e = a.idx[p];
    ++offset[e + 1];
  }
  int64_t max_rows = 0;
  for (int64_t e = 0; e < a.n_experts; ++e) {
    max_rows = std::max(max_rows, offset[e + 1]);
    offset[e + 1] += offset[e];
  }
  std::vector<int64_t> order(pairs);
  {
    std::vector<int64_t> cursor(offset.begin(), offset.end() - 1);
    for (int64_t p = 0; p < pairs; ++p) order[cursor[a.idx[p]]++] = p;
  }

  if (max_rows <= kSkinnyMaxRows) {
    // A decode step: every pair's row gathered in expert order, then the
    // step's gate|up products, activation and down products each in one go.
    const ScratchFloats x(pairs * a.din), gu(pairs * 2 * a.inter), h(pairs * a.inter),
        y(pairs * a.dout);
    for (int64_t r = 0; r < pairs; ++r) {
      std::memcpy(x.data() + r * a.din, a.z + (order[r] / a.top_k) * a.din,
                  static_cast<size_t>(a.din) * sizeof(float));
    }
    for (int64_t e = 0; e < a.n_experts; ++e) {
      // Rows of experts held elsewhere get no product: zeros, not garbage,
      // go through the activation.
      if (a.experts[e].w13.empty()) {
        std::fill(gu.data() + offset[e] * 2 * a.inter, gu.data() + offset[e + 1] * 2 * a.inter,
                  0.0f);
      }
    }
    ExpertProducts(offset, a.experts, false, x.data(), a.din, gu.data(), 2 * a.inter);
    DELTASERVE_CPU_ISA::GatedActivation(gu.data(), pairs, a.inter, a.act, h.data());
    ExpertProducts(offset, a.experts, true, h.data(), a.inter, y.data(), a.dout);
    // Experts in ascending id, as below.
    for (int64_t e = 0; e < a.n_experts; ++e) {
      if (a.experts[e].w13.empty()) continue;
      for (int64_t r = offset[e]; r < offset[e + 1]; ++r) {
        const float w = a.weights[order[r]];
        const float* yr = y.data() + r * a.dout;
        float* o = a.out + (order[r] / a.top_k) * a.dout;
        for (int64_t c = 0; c < a.dout; ++c) o[c] += w * yr[c];
      }
    }
    return;
  }

  std::vector<int64_t> active;  // the experts with rows and weights here
  for (int64_t e = 0; e < a.n_experts; ++e) {
    if (offset[e + 1] > offset[e] && !a.experts[e].w13.empty()) active.push_back(e);
  }
  if (pairs * a.dout <= kExpertParallelMaxFloats &&
      static_cast<int64_t>(active.size()) >= kExpertParallelMinExperts * omp_get_max_threads()) {
    return ExpertsInParallel(a, offset, order, active, max_rows);
  }

  // Per-expert buffers, sized for the busiest expert: gathered tokens
  // [rows, din], gate|up [rows, 2*inter], activation [rows, inter], expert
  // output [rows, dout].
  const int64_t m = max_rows;
  const ScratchFloats x(m * a.din), gu(m * 2 * a.inter), h(m * a.inter), y(m * a.dout);

  // Experts in ascending id: every token's sum over its experts runs in that
  // fixed order, whatever other tokens share the batch.
  for (int64_t e = 0; e < a.n_experts; ++e) {
    const int64_t rows = offset[e + 1] - offset[e];
    if (rows == 0 || a.experts[e].w13.empty()) continue;  // idle, or held elsewhere
    const int64_t* pair = order.data() + offset[e];       // [rows]
#pragma omp parallel for schedule(static) if (rows * a.din >= kParallelMinFloats)
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(x.data() + r * a.din, a.z + (pair[r] / a.top_k) * a.din,
                  static_cast<size_t>(a.din) * sizeof(float));
    }
    const MoeExpert& ex = a.experts[e];
    DELTASERVE_CPU_ISA::LinearStrided(x.data(), a.din, ex.w13, rows, gu.data(), 2 * a.inter, false);
    DELTASERVE_CPU_ISA::GatedActivation(gu.data(), rows, a.inter, a.act, h.data());
    DELTASERVE_CPU_ISA::LinearStrided(h.data(), a.inter, ex.w2, rows, y.data(), a.dout, false);
    // The threads split the output's columns, not the rows: a token that
    // picked this expert twice has two rows here, and each column still sums
    // its rows in order.
    const int64_t chunks = (a.dout + kScatterColumns - 1) / kScatterColumns;
#pragma omp parallel for schedule(static) if (chunks > 1 && rows * a.dout >= kParallelMinFloats)
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const int64_t c0 = chunk * kScatterColumns, c1 = std::min(a.dout, c0 + kScatterColumns);
      for (int64_t r = 0; r < rows; ++r) {
        const float w = a.weights[pair[r]];
        const float* yr = y.data() + r * a.dout;
        float* o = a.out + (pair[r] / a.top_k) * a.dout;
        for (int64_t c = c0; c < c1; ++c) o[c] += w * yr[c];
      }
    }
  }
}

}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA
