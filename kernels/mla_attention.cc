// Entry point of kernels/mla_attention.h: the CPU variant of this machine's level.
#include "kernels/mla_attention.h"

#include "kernels/cpu/ops.h"

namespace deltaserve::kernels {

void MlaPrefillAttention(const MlaPrefillArgs& args) {
  DELTASERVE_CPU_DISPATCH(MlaPrefillAttention)(args);
}

void MlaAbsorbedAttention(const MlaAbsorbedArgs& args) {
  DELTASERVE_CPU_DISPATCH(MlaAbsorbedAttention)(args);
}

}  // namespace deltaserve::kernels
