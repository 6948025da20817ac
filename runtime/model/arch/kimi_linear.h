// Kimi Linear (MODEL.md, `model_type: kimi_linear`): weights under `model.`,
// A_log stored [1, 1, H, 1], and a plain pre-norm residual stream.
#pragma once

#include "runtime/model/arch/architecture.h"

namespace deltaserve {

const ModelArchitecture& KimiLinearArchitecture();

}  // namespace deltaserve
