#include "runtime/model/arch/architecture.h"

#include "runtime/model/arch/kimi_k3.h"
#include "runtime/model/arch/kimi_linear.h"

namespace deltaserve {

const ModelArchitecture& ArchitectureOf(Architecture arch) {
  switch (arch) {
    case Architecture::kKimiK3:
      return KimiK3Architecture();
    case Architecture::kKimiLinear:
      return KimiLinearArchitecture();
  }
  return KimiLinearArchitecture();  // not reached: the switch covers the enum
}

}  // namespace deltaserve
