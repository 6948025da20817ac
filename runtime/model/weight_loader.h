// Reads a rank's part of checkpoint tensors by the tensor parallel split
// written on each tensor's spec (tp_split.h): all of a replicated tensor, its
// slice of rows, columns or leading values, a routed expert on its owning rank
// only. Matrices keep their stored dtype and are views of the mapped file
// where the part is contiguous there; vectors are float32. Only the bytes of
// the rank's parts are touched, and counted.
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
#include "runtime/model/weights.h"

namespace deltaserve {

class WeightLoader {
 public:
  // Tensors of `checkpoint` as `specs` (CheckpointTensors of its config: the
  // form each is stored in) declare them, for TP rank `tp_rank` of `tp_size`; *bytes_read
  // (optional) accumulates the bytes read. The checkpoint must have passed
  // ValidateCheckpoint; mapped weights keep it alive.
  WeightLoader(std::shared_ptr<const Checkpoint> checkpoint, const std::vector<TensorSpec>& specs,
               int tp_rank, int tp_size, int64_t* bytes_read);

  // The same loader with names relative to prefix + `sub` ("layers.3.").
  WeightLoader Under(std::string_view sub) const;

  // This rank's part of vector (or any float tensor) `name` as float32;
  // empty when it holds none of it.
  absl::StatusOr<VectorWeight> Load(const std::string& name) const;
  // The parts of several tensors split alike, concatenated, as float32.
  absl::StatusOr<VectorWeight> Concat(std::initializer_list<std::string> names) const;

  // This rank's part of matrix `name` ("....weight") in its stored dtype: a
  // float32 or bf16 tensor as such (f16 and f64 widened or rounded to
  // float32), or the MXFP4 pair `....weight_packed` + `....weight_scale`
  // where the checkpoint holds that instead (a scale byte of 255, NaN, is
  // an error naming the tensor). Empty when the rank holds none of it.
  absl::StatusOr<Weight> Matrix(const std::string& name) const;
  // Several matrices of one dtype and width split alike, their rows
  // concatenated (q/k/v, gate/up, w1/w3) so one GEMM serves them.
  absl::StatusOr<Weight> ConcatRows(std::initializer_list<std::string> names) const;

 private:
  struct Shared {
    std::shared_ptr<const Checkpoint> checkpoint;
    std::unordered_map<std::string, TensorSpec> specs;
    int tp_rank;
    int tp_size;
    int64_t* bytes_read;
  };
  WeightLoader(std::shared_ptr<const Shared> shared, std::string prefix)
      : shared_(std::move(shared)), prefix_(std::move(prefix)) {}
  absl::StatusOr<const TensorSpec*> Spec(const std::string& full) const;
  absl::StatusOr<std::vector<float>> Values(const std::string& name) const;  // Load's values
  absl::StatusOr<std::vector<float>> Convert(const TensorView& view) const;

  std::shared_ptr<const Shared> shared_;
  std::string prefix_;
};

}  // namespace deltaserve
