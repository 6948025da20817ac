// Entry point of kernels/kda.h: the CPU variant of this machine's level.
#include "kernels/kda.h"

#include "kernels/cpu/ops.h"

namespace deltaserve::kernels {

void KdaRecurrent(const KdaShape& shape, const float* q, const float* k, const float* v,
                  const float* g, const float* beta, float scale, float* state, float* o) {
  DELTASERVE_CPU_DISPATCH(KdaRecurrent)(shape, q, k, v, g, beta, scale, state, o);
}

void KdaChunk(const KdaShape& shape, const float* q, const float* k, const float* v, const float* g,
              const float* beta, float scale, float* state, float* o, int64_t chunk_size) {
  DELTASERVE_CPU_DISPATCH(KdaChunk)(shape, q, k, v, g, beta, scale, state, o, chunk_size);
}

}  // namespace deltaserve::kernels
