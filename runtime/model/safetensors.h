// Reading and writing safetensors checkpoints. Files are memory-mapped; a
// tensor is a view into the mapping until converted. Every structural problem
// (truncation, bad header JSON, overlapping or out-of-range offsets, unknown
// dtype, shape/size mismatch) is an error naming the file and the tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace deltaserve {

enum class DType { kF32, kF64, kBF16, kF16, kI64, kI32, kU8 };

absl::StatusOr<DType> ParseDType(const std::string& name);
const char* DTypeName(DType dtype);
size_t DTypeSize(DType dtype);

// A tensor inside a mapped file: valid while its SafetensorsFile lives.
struct TensorView {
  std::string name;
  std::string file;  // the file it lives in, for error messages
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;

  int64_t NumElements() const;
};

// Converts a floating-point view (F32, F64, BF16, F16) to float32 / float64.
// Any other dtype is an error naming the tensor.
absl::StatusOr<std::vector<float>> ToFloat32(const TensorView& view);
absl::StatusOr<std::vector<double>> ToFloat64(const TensorView& view);
// Integer views (I64, I32) to int64.
absl::StatusOr<std::vector<int64_t>> ToInt64(const TensorView& view);

// Drops the whole pages of [p, p + n), a range of a mapped checkpoint, once
// a copy of them is made: from this process and from the page cache
// (MADV_PAGEOUT; pages another process maps stay). Dropping them from the
// process alone (MADV_DONTNEED) is not enough: a fault on a neighbouring page
// maps the page-cache pages around it too (fault-around, large folios), and
// the first forward pass brought most of them back
// (tests/runtime/model/resident_weights_test.cc).
void ReleaseCheckpointPages(const void* p, size_t n);

class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor, or NotFound naming the tensor and the file.
  absl::StatusOr<const TensorView*> Get(const std::string& name) const;
  // The mapping's pages (ReleaseCheckpointPages), and then the file's pages
  // the page cache holds without this process mapping them (read ahead):
  // for when nothing reads the mapping again.
  void ReleasePages() const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint directory: `model.safetensors`, or the shards
// listed by `model.safetensors.index.json` (each tensor must be in the shard
// the index names).
class Checkpoint {
 public:
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const std::map<std::string, const TensorView*>& tensors() const { return tensors_; }
  absl::StatusOr<const TensorView*> Get(const std::string& name) const;
  // Every page of its files, as ReleaseCheckpointPages drops them: for when
  // the weights are all copies (on huge pages, on a GPU) and nothing reads
  // the mapping again.
  void ReleasePages() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> tensors_;
};

// A tensor to write: raw little-endian bytes of `dtype` in row-major order.
struct TensorData {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

TensorData MakeF32Tensor(std::string name, std::vector<int64_t> shape,
                         const std::vector<float>& values);
TensorData MakeBF16Tensor(std::string name, std::vector<int64_t> shape,
                          const std::vector<float>& values);

// Writes a safetensors file (tensors in the given order), atomically: to a
// temporary file renamed into place, so a failed write leaves no partial file.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorData>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// bfloat16 / float16 conversions (round to nearest even on the way down).
float BF16ToFloat(uint16_t bits);
uint16_t FloatToBF16(float value);
float F16ToFloat(uint16_t bits);

}  // namespace deltaserve
