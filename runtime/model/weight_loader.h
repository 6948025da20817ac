// Reads a rank's part of checkpoint tensors as float32, by the tensor
// parallel split written on each tensor's spec (tp_split.h): all of a
// replicated tensor, its slice of rows, columns or leading values, a routed
// expert on its owning rank only. Only those bytes are read from the mapped
// files, and counted.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/weight_spec.h"

namespace deltaserve {

class WeightLoader {
 public:
  // Tensors of `checkpoint` as `specs` (ExpectedTensors of its config)
  // declare them, for TP rank `tp_rank` of `tp_size`; *bytes_read
  // (optional) accumulates the bytes read. The checkpoint must outlive the
  // loader and have passed ValidateCheckpoint.
  WeightLoader(const Checkpoint& checkpoint, const std::vector<TensorSpec>& specs, int tp_rank,
               int tp_size, int64_t* bytes_read);

  // The same loader with names relative to prefix + `sub` ("layers.3.").
  WeightLoader Under(std::string_view sub) const;

  // This rank's part of tensor `name`; empty when it holds none of it.
  absl::StatusOr<std::vector<float>> Load(const std::string& name) const;
  // The parts of several tensors split alike, concatenated row-wise (q/k/v,
  // gate/up), so that one GEMM serves them.
  absl::StatusOr<std::vector<float>> Concat(std::initializer_list<std::string> names) const;

 private:
  struct Shared {
    const Checkpoint& checkpoint;
    std::unordered_map<std::string, TensorSpec> specs;
    int tp_rank;
    int tp_size;
    int64_t* bytes_read;
  };
  WeightLoader(std::shared_ptr<const Shared> shared, std::string prefix)
      : shared_(std::move(shared)), prefix_(std::move(prefix)) {}
  absl::StatusOr<std::vector<float>> Convert(const TensorView& view) const;

  std::shared_ptr<const Shared> shared_;
  std::string prefix_;
};

}  // namespace deltaserve
