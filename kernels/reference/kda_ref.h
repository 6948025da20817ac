// Float64 reference for kernels/kda.h: the recurrence token by token. It is
// also the reference for KdaChunk (the chunkwise form computes the same thing).
#pragma once

#include "kernels/kda.h"

namespace deltaserve::kernels::ref {

// Same contract as kernels::KdaRecurrent, in double.
void KdaRecurrent(const KdaShape& shape, const double* q, const double* k, const double* v,
                  const double* g, const double* beta, double scale, double* state, double* o);

}  // namespace deltaserve::kernels::ref
