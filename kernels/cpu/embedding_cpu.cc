// Embedding lookup: one row per token, widened to float32.
#include "kernels/cpu/gemm_cpu.h"
#include "kernels/cpu/ops.h"
#include "kernels/embedding.h"

namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA {
namespace {

// Below this many elements an OpenMP fork costs more than the copies.
constexpr int64_t kParallelMinElements = int64_t{1} << 16;

}  // namespace

void Embedding(const Tensor& table, const int32_t* tokens, int64_t t, float* out) {
  const int64_t dim = table.cols;
  if (t == 0 || dim == 0) return;
  const bool parallel = t > 1 && t * dim >= kParallelMinElements;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t i = 0; i < t; ++i) WidenRows(table, tokens[i], tokens[i] + 1, out + i * dim);
}

}  // namespace deltaserve::kernels::cpu::DELTASERVE_CPU_ISA
