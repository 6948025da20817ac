// Log-softmax statistics per row, in the scalar arithmetic of
// kernels/logsoftmax.h: a double sum in id order (not split into lanes, which
// would change its rounding) of the library's exp, and std::partial_sort of
// the ids for the top-k, as the code it replaces did. Rows are independent,
// so they spread over threads without changing any bit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>

#include "kernels/cpu/ops.h"
#include "kernels/logsoftmax.h"
#include "kernels/scratch.h"

namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA {
namespace {

// Below this many logits an OpenMP fork costs more than the work.
constexpr int64_t kParallelMinElements = int64_t{1} << 15;

double LogSumExp(const float* row, int64_t vocab) {
  const double max = *std::max_element(row, row + vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(row[i] - max);
  return max + std::log(sum);
}

// The k most likely ids of `row`, highest first, lower id on ties, and
// their log-probs. `order` is [vocab] of scratch.
void TopK(const float* row, int64_t vocab, double log_z, int64_t k, int32_t* order, int32_t* ids,
          float* logprobs) {
  std::iota(order, order + vocab, 0);
  std::partial_sort(order, order + k, order + vocab, [row](int32_t a, int32_t b) {
    return row[a] > row[b] || (row[a] == row[b] && a < b);
  });
  for (int64_t i = 0; i < k; ++i) {
    ids[i] = order[i];
    logprobs[i] = static_cast<float>(row[order[i]] - log_z);
  }
}

}  // namespace

void LogSoftmaxTopK(const LogSoftmaxTopKPtrs& p) {
  const int64_t vocab = p.vocab, k = p.top_k;
  const bool parallel = p.rows > 1 && p.rows * vocab >= kParallelMinElements;
#pragma omp parallel if (parallel)
  {
    // One vocabulary of ids per thread, from its own scratch pool.
    const Scratch<int32_t> order(k > 0 ? vocab : 0);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < p.rows; ++r) {
      const float* row = p.logits + r * p.logits_stride;  // [vocab]
      const double log_z = LogSumExp(row, vocab);
      p.log_z[r] = log_z;
      if (p.targets != nullptr) {
        const int32_t target = p.targets[r];
        p.target_logprobs[r] =
            target < 0 || target >= vocab ? 0.0f : static_cast<float>(row[target] - log_z);
      }
      if (k > 0)
        TopK(row, vocab, log_z, k, order.data(), p.top_ids + r * k, p.top_logprobs + r * k);
    }
  }
}

// Blocks of plain integer tests the compiler vectorises; the first hit is
// then found within its block.
int64_t FindNonFinite(const float* x, int64_t rows, int64_t cols, int64_t stride) {
  constexpr int64_t kBlock = 256;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * stride;  // [cols]
    for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
      const int64_t n = std::min(kBlock, cols - c0);
      uint32_t any = 0;
      for (int64_t i = 0; i < n; ++i) {
        uint32_t bits;
        std::memcpy(&bits, row + c0 + i, sizeof(bits));
        any |= (bits & 0x7f800000u) == 0x7f800000u;  // exponent all ones: inf or NaN
      }
      if (any == 0) continue;
      for (int64_t i = 0; i < n; ++i) {
        if (!std::isfinite(row[c0 + i])) return r * cols + c0 + i;
      }
    }
  }
  return -1;
}

}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA
