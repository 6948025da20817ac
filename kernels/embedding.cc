// Entry point of kernels/embedding.h: the CPU variant of this machine's level.
#include "kernels/embedding.h"

#include "kernels/check.h"
#include "kernels/cpu/ops.h"

namespace deltaserve::kernels {

void Embedding(const Tensor& table, const int32_t* tokens, int64_t t, float* out) {
  DELTASERVE_CHECK(table.device == Device::kCpu);
  DELTASERVE_CPU_DISPATCH(Embedding)(table, tokens, t, out);
}

}  // namespace deltaserve::kernels
