// Which weights of a checkpoint its config.json declares quantized: the
// compressed-tensors `quantization_config` block, read by config.cc into a
// QuantizationConfig (the one scheme the runtime reads is MXFP4,
// "mxfp4-pack-quantized", groups of 32: MODEL.md), and the matcher that says
// which module names its targets and ignore list select. weight_spec.cc asks
// it of each routed expert matrix; make-model writes the block from it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace re2 {
class RE2;
}

namespace deltaserve {

struct QuantizationConfig {
  // A quantization_config is present (and passed its checks): the modules its
  // targets select and its ignore list does not may be stored as MXFP4. Off:
  // a plain bf16 / f32 checkpoint.
  bool mxfp4 = false;
  // The targets of every config group, then the ignore list, as written:
  // "re:<regex>" (matched as Python's re.match does: from the start of the
  // module name, not necessarily to its end, hence the `$` real configs
  // write), "Linear" (the class of every weight matrix here), or an exact
  // module name. A module is a tensor name without ".weight".
  std::vector<std::string> targets;
  std::vector<std::string> ignore;
  // The key path of the block in config.json ("text_config.quantization_config"
  // or "quantization_config"), for messages.
  std::string key;
};

// The block real K3 checkpoints carry (and the golden k3-tiny-mxfp4): every
// routed expert matrix `...block_sparse_moe.experts.<e>.w{1,2,3}` in MXFP4,
// everything else (attention, shared experts, dense MLPs, latent projections,
// router, head) ignored.
QuantizationConfig RoutedExpertsMxfp4();

// OK when `entry` is a target or ignore entry the matcher can use: a name, or
// "re:" and a pattern RE2 compiles (Python-only syntax such as look-ahead or
// backreferences is refused); the error says what is wrong with the pattern.
absl::Status CheckQuantizationEntry(const std::string& entry);

// A QuantizationConfig's patterns, compiled once (RE2: linear time whatever
// a hostile config writes). Copyable and cheap to pass around.
class QuantizationMatcher {
 public:
  // An error names the key and the entry that does not compile.
  static absl::StatusOr<QuantizationMatcher> Create(const QuantizationConfig& config);

  enum class Verdict {
    kPlain,       // the config has no quantization_config
    kUntargeted,  // no target selects the module
    kIgnored,     // a target selects it, and so does an ignore entry
    kMxfp4,       // selected, not ignored
  };
  struct Match {
    Verdict verdict = Verdict::kPlain;
    std::string ignored_by;  // kIgnored: the ignore entry
  };
  Match Of(const std::string& module) const;

  struct Pattern;  // one compiled entry (quantization.cc)

 private:
  QuantizationMatcher() = default;
  bool mxfp4_ = false;
  std::vector<std::shared_ptr<const Pattern>> targets_;
  std::vector<std::shared_ptr<const Pattern>> ignore_;
};

}  // namespace deltaserve
