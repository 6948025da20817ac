// libFuzzer: any text as config.json. Parsing fails with a Status or gives a
// config whose sizes every consumer may multiply out: its parameter count
// (every tensor of ExpectedTensors) must not overflow (UBSan), and writing it
// back and parsing again gives the same config.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "runtime/model/config.h"
#include "runtime/model/weight_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = deltaserve::ParseModelConfig(text, "fuzz");
  if (!config.ok()) return 0;
  // Counting walks every tensor: keep inputs with huge tensor lists fast.
  if (config->num_layers * (config->num_experts + 1) <= 4096) {
    const deltaserve::ParameterCount count = deltaserve::CountParameters(*config);
    if (count.total < 0 || count.active_per_token < 0) std::abort();
  }
  const std::string written = deltaserve::ModelConfigToJson(*config);
  auto again = deltaserve::ParseModelConfig(written, "fuzz (written back)");
  if (!again.ok() || deltaserve::ModelConfigToJson(*again) != written) std::abort();
  return 0;
}
