// Kimi K3 (MODEL.md, `model_type: kimi_k3`): weights under `language_model.`,
// A_log padded to a multiple of 128 entries, and Block Attention Residuals
// between the layers.
#pragma once

#include "runtime/model/arch/architecture.h"

namespace deltaserve {

const ModelArchitecture& KimiK3Architecture();

}  // namespace deltaserve
