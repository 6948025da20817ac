#include "runtime/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/bf16.h"
#include "nlohmann/json.hpp"
#include "runtime/common/file_util.h"
#include "runtime/common/json_bounds.h"
#include "runtime/common/status_macros.h"

namespace deltaserve {
namespace {

using json = nlohmann::json;

// Largest header we accept: real checkpoints have headers of a few MB.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
// A header is an object of tensor objects holding shape and offset lists:
// depth 3. The index is as deep and much smaller.
constexpr int kMaxHeaderDepth = 8;
constexpr int64_t kMaxIndexBytes = 64 << 20;

template <typename T>
T LoadUnaligned(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

absl::Status ParseTensorEntry(const std::string& path, const std::string& name, const json& entry,
                              size_t data_size, TensorView* view) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "': ", what));
  };
  if (!entry.is_object()) return bad("header entry is not an object");
  if (!entry.contains("dtype") || !entry["dtype"].is_string()) {
    return bad("missing or non-string 'dtype'");
  }
  auto dtype = ParseDType(entry["dtype"].get<std::string>());
  if (!dtype.ok()) return bad(std::string(dtype.status().message()));
  if (!entry.contains("shape") || !entry["shape"].is_array()) {
    return bad("missing or non-array 'shape'");
  }
  if (!entry.contains("data_offsets") || !entry["data_offsets"].is_array() ||
      entry["data_offsets"].size() != 2) {
    return bad("'data_offsets' must be [begin, end]");
  }
  view->name = name;
  view->file = path;
  view->dtype = *dtype;
  uint64_t elements = 1;
  for (const json& dim : entry["shape"]) {
    if (!dim.is_number_integer() || dim.get<int64_t>() < 0) {
      return bad("shape has a non-integer or negative dimension");
    }
    const uint64_t d = dim.get<uint64_t>();
    if (d != 0 && elements > std::numeric_limits<uint64_t>::max() / d / 8) {
      return bad("shape is too large");
    }
    elements *= d;
    view->shape.push_back(static_cast<int64_t>(d));
  }
  const json& offsets = entry["data_offsets"];
  if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
    return bad("'data_offsets' must be non-negative integers");
  }
  const uint64_t begin = offsets[0].get<uint64_t>();
  const uint64_t end = offsets[1].get<uint64_t>();
  if (begin > end || end > data_size) {
    return bad(absl::StrCat("data_offsets [", begin, ", ", end,
                            ") fall outside the data section of ", data_size,
                            " bytes (truncated file?)"));
  }
  const uint64_t expected = elements * DTypeSize(*dtype);
  if (end - begin != expected) {
    return bad(absl::StrCat("holds ", end - begin, " bytes but shape and dtype ", DTypeName(*dtype),
                            " need ", expected));
  }
  view->nbytes = end - begin;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DType> ParseDType(const std::string& name) {
  if (name == "F32") return DType::kF32;
  if (name == "F64") return DType::kF64;
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  if (name == "I64") return DType::kI64;
  if (name == "I32") return DType::kI32;
  if (name == "U8") return DType::kU8;
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", name, "'"));
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF64:
      return "F64";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kI64:
      return "I64";
    case DType::kI32:
      return "I32";
    case DType::kU8:
      return "U8";
  }
  return "?";
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kU8:
      return 1;
  }
  return 0;
}

int64_t TensorView::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

float BF16ToFloat(uint16_t bits) { return kernels::Bf16ToFloat(bits); }

uint16_t FloatToBF16(float value) { return kernels::FloatToBf16(value); }

float F16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exponent = 127 - 15 + 1;
      while ((mantissa & 0x400) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      mantissa &= 0x3ff;
      bits = sign | (exponent << 23) | (mantissa << 13);
    }
  } else if (exponent == 31) {
    bits = sign | 0x7f800000 | (mantissa << 13);
  } else {
    bits = sign | ((exponent - 15 + 127) << 23) | (mantissa << 13);
  }
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

template <typename Out>
static absl::StatusOr<std::vector<Out>> ConvertFloat(const TensorView& view) {
  const int64_t n = view.NumElements();
  std::vector<Out> out(static_cast<size_t>(n));
  const uint8_t* p = view.data;
  switch (view.dtype) {
    case DType::kF32:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<Out>(LoadUnaligned<float>(p + 4 * i));
      break;
    case DType::kF64:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<Out>(LoadUnaligned<double>(p + 8 * i));
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) out[i] = BF16ToFloat(LoadUnaligned<uint16_t>(p + 2 * i));
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) out[i] = F16ToFloat(LoadUnaligned<uint16_t>(p + 2 * i));
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(view.file, ": tensor '", view.name,
                                                     "' has dtype ", DTypeName(view.dtype),
                                                     ", expected a floating-point type"));
  }
  return out;
}

absl::StatusOr<std::vector<float>> ToFloat32(const TensorView& view) {
  return ConvertFloat<float>(view);
}

absl::StatusOr<std::vector<double>> ToFloat64(const TensorView& view) {
  return ConvertFloat<double>(view);
}

absl::StatusOr<std::vector<int64_t>> ToInt64(const TensorView& view) {
  const int64_t n = view.NumElements();
  std::vector<int64_t> out(static_cast<size_t>(n));
  if (view.dtype == DType::kI64) {
    for (int64_t i = 0; i < n; ++i) out[i] = LoadUnaligned<int64_t>(view.data + 8 * i);
  } else if (view.dtype == DType::kI32) {
    for (int64_t i = 0; i < n; ++i) out[i] = LoadUnaligned<int32_t>(view.data + 4 * i);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(view.file, ": tensor '", view.name,
                                                   "' has dtype ", DTypeName(view.dtype),
                                                   ", expected I64 or I32"));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  // O_NONBLOCK: a FIFO in place of the file must not hang the open.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat(path, ": cannot stat"));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  if (size < 8) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": truncated safetensors file (", size,
                                                   " bytes; the 8-byte header length is missing)"));
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) {
    return absl::InternalError(absl::StrCat(path, ": mmap failed: ", std::strerror(errno)));
  }
  file->map_ = map;
  file->map_size_ = size;
  const auto* bytes = static_cast<const uint8_t*>(map);
  const uint64_t header_len = LoadUnaligned<uint64_t>(bytes);
  if (header_len > kMaxHeaderBytes || header_len > size - 8) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", header_len,
                                                   " exceeds the file size of ", size,
                                                   " bytes (truncated or not a safetensors file)"));
  }
  DELTASERVE_RETURN_IF_ERROR(
      CheckJsonBounds(std::string_view(reinterpret_cast<const char*>(bytes + 8), header_len),
                      kMaxHeaderBytes, kMaxHeaderDepth, absl::StrCat(path, ": header")));
  json header = json::parse(bytes + 8, bytes + 8 + header_len, nullptr,
                            /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header is not a valid JSON object"));
  }
  const size_t data_size = size - 8 - header_len;
  const uint8_t* data = bytes + 8 + header_len;
  struct Range {
    uint64_t begin, end;
    std::string name;
    bool operator<(const Range& o) const { return begin < o.begin; }
  };
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": __metadata__ is not an object"));
      }
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ": __metadata__ value '", m.key(), "' is not a string"));
        }
        file->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    TensorView view;
    DELTASERVE_RETURN_IF_ERROR(ParseTensorEntry(path, it.key(), it.value(), data_size, &view));
    const uint64_t begin = it.value()["data_offsets"][0].get<uint64_t>();
    view.data = data + begin;
    ranges.push_back({begin, begin + view.nbytes, it.key()});
    file->tensors_.emplace(it.key(), std::move(view));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensors '", ranges[i - 1].name,
                                                     "' and '", ranges[i].name,
                                                     "' overlap in the data section"));
    }
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

absl::StatusOr<const TensorView*> SafetensorsFile::Get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": missing tensor '", name, "'"));
  }
  return &it->second;
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  namespace fs = std::filesystem;
  auto checkpoint = std::unique_ptr<Checkpoint>(new Checkpoint());
  checkpoint->dir_ = dir;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single_path = fs::path(dir) / "model.safetensors";
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    DELTASERVE_ASSIGN_OR_RETURN(const std::string text,
                                ReadRegularFile(index_path.string(), kMaxIndexBytes));
    DELTASERVE_RETURN_IF_ERROR(
        CheckJsonBounds(text, kMaxIndexBytes, kMaxHeaderDepth, index_path.string()));
    json index = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
        !index["weight_map"].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path.string(), ": not valid JSON with a 'weight_map' object"));
    }
    std::map<std::string, SafetensorsFile*> shards;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it.value().is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": weight_map entry '",
                                                       it.key(), "' is not a file name"));
      }
      const std::string shard = it.value().get<std::string>();
      if (shard.find('/') != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path.string(), ": shard name '", shard,
                         "' must be a file in the checkpoint directory"));
      }
      if (!shards.count(shard)) {
        DELTASERVE_ASSIGN_OR_RETURN(auto file,
                                    SafetensorsFile::Open((fs::path(dir) / shard).string()));
        shards[shard] = file.get();
        checkpoint->files_.push_back(std::move(file));
      }
      DELTASERVE_ASSIGN_OR_RETURN(const TensorView* view, shards[shard]->Get(it.key()));
      checkpoint->tensors_[it.key()] = view;
    }
  } else if (fs::exists(single_path, ec)) {
    DELTASERVE_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(single_path.string()));
    for (const auto& [name, view] : file->tensors()) {
      checkpoint->tensors_[name] = &view;
    }
    checkpoint->files_.push_back(std::move(file));
  } else {
    return absl::NotFoundError(
        absl::StrCat(dir, ": no model.safetensors or model.safetensors.index.json"));
  }
  return checkpoint;
}

absl::StatusOr<const TensorView*> Checkpoint::Get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(dir_, ": checkpoint has no tensor '", name, "'"));
  }
  return it->second;
}

TensorData MakeF32Tensor(std::string name, std::vector<int64_t> shape,
                         const std::vector<float>& values) {
  TensorData t{std::move(name), DType::kF32, std::move(shape), {}};
  t.bytes.resize(values.size() * 4);
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

TensorData MakeBF16Tensor(std::string name, std::vector<int64_t> shape,
                          const std::vector<float>& values) {
  TensorData t{std::move(name), DType::kBF16, std::move(shape), {}};
  t.bytes.resize(values.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t bits = FloatToBF16(values[i]);
    std::memcpy(t.bytes.data() + 2 * i, &bits, 2);
  }
  return t;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorData>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::set<std::string> names;
  for (const TensorData& t : tensors) {
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": duplicate tensor '", t.name, "'"));
    }
    uint64_t elements = 1;
    for (int64_t d : t.shape) elements *= static_cast<uint64_t>(d);
    if (elements * DTypeSize(t.dtype) != t.bytes.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", t.name, "' has ", t.bytes.size(),
                       " bytes, its shape and dtype need ", elements * DTypeSize(t.dtype)));
    }
    header[t.name] = {{"dtype", DTypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string header_text = header.dump();
  // Pad the header with spaces so the data section is 8-byte aligned.
  while ((8 + header_text.size()) % 8 != 0) header_text.push_back(' ');
  return WriteFileAtomically(path, [&](std::ostream& out) {
    const uint64_t header_len = header_text.size();
    out.write(reinterpret_cast<const char*>(&header_len), 8);
    out.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));
    for (const TensorData& t : tensors) {
      out.write(reinterpret_cast<const char*>(t.bytes.data()),
                static_cast<std::streamsize>(t.bytes.size()));
    }
  });
}

void ReleaseCheckpointPages(const void* p, size_t n) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto at = reinterpret_cast<uintptr_t>(p);
  const uintptr_t begin = (at + page - 1) & ~(page - 1);
  const uintptr_t end = (at + n) & ~(page - 1);
  if (end <= begin) return;
  void* const at_page = reinterpret_cast<void*>(begin);
  // Before Linux 5.4 there is no MADV_PAGEOUT: drop them from the process.
  if (::madvise(at_page, end - begin, MADV_PAGEOUT) != 0) {
    ::madvise(at_page, end - begin, MADV_DONTNEED);
  }
}

void SafetensorsFile::ReleasePages() const {
  ReleaseCheckpointPages(map_, map_size_);
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;  // advice only: a file gone since stays as it was
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void Checkpoint::ReleasePages() const {
  for (const auto& file : files_) file->ReleasePages();
}

}  // namespace deltaserve
