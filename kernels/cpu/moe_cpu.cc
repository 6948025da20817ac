// MoE routing and grouped expert compute on the CPU.
//
// MoeExperts groups the (token, slot) pairs by expert with a counting sort and
// runs each expert as two GEMMs over its gathered tokens, on the expert's
// weights as stored (MXFP4 in K3: the GEMM widens them a block at a time).
// Experts run one after another, each GEMM using all threads (oneDNN's sgemm
// for many rows, the skinny kernel's OpenMP loop for few); the gathers and
// scatters stay serial: they move O(rows·d) floats against O(rows·d·inter)
// GEMM work, and nested OpenMP regions would oversubscribe the cores.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/gemm.h"
#include "kernels/moe.h"
#include "kernels/scratch.h"

namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA {
namespace {

// Tokens below this count are routed on the calling thread.
constexpr int64_t kParallelMinTokens = 16;

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
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(x.data() + r * a.din, a.z + (pair[r] / a.top_k) * a.din,
                  static_cast<size_t>(a.din) * sizeof(float));
    }
    const MoeExpert& ex = a.experts[e];
    DELTASERVE_CPU_ISA::LinearStrided(x.data(), a.din, ex.w13, rows, gu.data(), 2 * a.inter, false);
    DELTASERVE_CPU_ISA::GatedActivation(gu.data(), rows, a.inter, a.act, h.data());
    DELTASERVE_CPU_ISA::LinearStrided(h.data(), a.inter, ex.w2, rows, y.data(), a.dout, false);
    for (int64_t r = 0; r < rows; ++r) {
      const float w = a.weights[pair[r]];
      const float* yr = y.data() + r * a.dout;
      float* o = a.out + (pair[r] / a.top_k) * a.dout;
      for (int64_t c = 0; c < a.dout; ++c) o[c] += w * yr[c];
    }
  }
}

}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA
