// The CPU variants of every op (kernels/cpu/dispatch.h): one declaration per
// op and level, each with the type of the public function it implements.
#pragma once

#include "kernels/activation.h"
#include "kernels/attn_res.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/kda.h"
#include "kernels/kda_gate.h"
#include "kernels/mla_attention.h"
#include "kernels/moe.h"
#include "kernels/norm.h"
#include "kernels/sampling.h"
#include "kernels/short_conv.h"

DELTASERVE_CPU_DECLARE(GatedActivation)
DELTASERVE_CPU_DECLARE(AttnResMix)
DELTASERVE_CPU_DECLARE(Embedding)
DELTASERVE_CPU_DECLARE(LinearStrided)
DELTASERVE_CPU_DECLARE(KdaRecurrent)
DELTASERVE_CPU_DECLARE(KdaChunk)
DELTASERVE_CPU_DECLARE(KdaGateLowerBound)
DELTASERVE_CPU_DECLARE(KdaGateSoftplus)
DELTASERVE_CPU_DECLARE(MlaPrefillAttention)
DELTASERVE_CPU_DECLARE(MlaAbsorbedAttention)
DELTASERVE_CPU_DECLARE(MoeRoute)
DELTASERVE_CPU_DECLARE(MoeExperts)
DELTASERVE_CPU_DECLARE(RmsNorm)
DELTASERVE_CPU_DECLARE(L2Norm)
DELTASERVE_CPU_DECLARE(SamplingDistribution)
DELTASERVE_CPU_DECLARE(Sample)
DELTASERVE_CPU_DECLARE(ShortConv)
