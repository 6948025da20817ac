// Safetensors and checkpoint robustness: truncated, garbled and hostile files
// must give an error naming the file (and the tensor when one is involved),
// never a crash or an out-of-bounds read; sharded checkpoints read back and
// their index errors name the shard or tensor.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/model/config.h"
#include "runtime/model/presets.h"
#include "runtime/model/random_checkpoint.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/weight_spec.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

using json = nlohmann::json;

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// A small valid file: tensors of three dtypes and some metadata.
std::string ValidFileBytes(const std::string& dir, uint64_t* header_end) {
  const std::string path = dir + "/valid.safetensors";
  std::vector<TensorData> tensors = {
      MakeF32Tensor("alpha", {2, 3}, {1, 2, 3, 4, 5, 6}),
      MakeBF16Tensor("beta", {4}, {0.5f, -1.0f, 2.0f, 8.0f}),
      TensorData{"gamma", DType::kI64, {2}, std::vector<uint8_t>(16, 1)},
  };
  const absl::Status status = WriteSafetensors(path, tensors, {{"format", "pt"}});
  EXPECT_TRUE(status.ok()) << status;
  const std::string bytes = ReadBytes(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  *header_end = 8 + header_len;
  return bytes;
}

// Reads everything a caller could touch in an opened file, so an accepted
// but inconsistent file shows up as a sanitizer or segfault failure here.
void TouchEverything(const SafetensorsFile& file) {
  for (const auto& [name, view] : file.tensors()) {
    uint64_t sum = 0;
    for (size_t i = 0; i < view.nbytes; ++i) sum += view.data[i];
    EXPECT_EQ(static_cast<size_t>(view.NumElements()) * DTypeSize(view.dtype), view.nbytes)
        << name << " " << sum;
    if (view.dtype == DType::kI64 || view.dtype == DType::kI32) {
      EXPECT_TRUE(ToInt64(view).ok());
    } else if (view.dtype != DType::kU8) {
      EXPECT_TRUE(ToFloat64(view).ok());
    }
  }
}

// Open must fail with a message naming the file; `tensor`, if given, too.
void ExpectOpenError(const std::string& path, const std::string& tensor = "") {
  auto file = SafetensorsFile::Open(path);
  ASSERT_FALSE(file.ok()) << path << " was accepted";
  const std::string message(file.status().message());
  EXPECT_NE(message.find(path), std::string::npos) << message;
  if (!tensor.empty()) {
    EXPECT_NE(message.find("'" + tensor + "'"), std::string::npos) << message;
  }
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  size_t Below(size_t n) { return static_cast<size_t>(Next() % n); }

 private:
  uint64_t state_;
};

TEST(SafetensorsRobustnessTest, ValidFileReadsBack) {
  const std::string dir = testing::TempDir("st_valid");
  uint64_t header_end = 0;
  ValidFileBytes(dir, &header_end);
  auto file = SafetensorsFile::Open(dir + "/valid.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->tensors().size(), 3u);
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  auto alpha = ToFloat32(**(*file)->Get("alpha"));
  ASSERT_TRUE(alpha.ok());
  EXPECT_EQ(*alpha, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  auto beta = ToFloat32(**(*file)->Get("beta"));
  ASSERT_TRUE(beta.ok());
  EXPECT_EQ(*beta, (std::vector<float>{0.5f, -1.0f, 2.0f, 8.0f}));
  auto missing = (*file)->Get("delta");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("'delta'"), std::string::npos);
}

TEST(SafetensorsRobustnessTest, EveryTruncationIsAnError) {
  const std::string dir = testing::TempDir("st_truncate");
  uint64_t header_end = 0;
  const std::string bytes = ValidFileBytes(dir, &header_end);
  ASSERT_GT(bytes.size(), header_end);
  const std::string path = dir + "/truncated.safetensors";
  // Every length: inside the length prefix, the header, and the data.
  for (size_t length = 0; length < bytes.size(); ++length) {
    SCOPED_TRACE(length);
    WriteBytes(path, bytes.substr(0, length));
    auto file = SafetensorsFile::Open(path);
    ASSERT_FALSE(file.ok()) << "truncated to " << length << " of " << bytes.size();
    const std::string message(file.status().message());
    EXPECT_NE(message.find(path), std::string::npos) << message;
    if (length > header_end) {
      // The header is intact: the error is about a tensor past the end.
      EXPECT_TRUE(message.find("'alpha'") != std::string::npos ||
                  message.find("'beta'") != std::string::npos ||
                  message.find("'gamma'") != std::string::npos)
          << message;
    }
  }
  WriteBytes(path, bytes);
  EXPECT_TRUE(SafetensorsFile::Open(path).ok());
}

TEST(SafetensorsRobustnessTest, GarbledHeadersNeverCrash) {
  const std::string dir = testing::TempDir("st_garble");
  uint64_t header_end = 0;
  const std::string bytes = ValidFileBytes(dir, &header_end);
  const std::string path = dir + "/garbled.safetensors";
  // Bytes that turn JSON into other JSON more often than random ones do.
  static constexpr char kInteresting[] =
      "{}[]\",:-+.0123456789eE \\\x00\xff"
      "ntf";
  const std::string interesting(kInteresting, sizeof(kInteresting) - 1);
  Rng rng(20240601);
  int accepted = 0;
  for (int iteration = 0; iteration < 600; ++iteration) {
    std::string mutated = bytes;
    const int edits = 1 + static_cast<int>(rng.Below(3));
    for (int e = 0; e < edits; ++e) {
      const size_t pos = 8 + rng.Below(header_end - 8);
      switch (rng.Below(4)) {
        case 0:
          mutated[pos] = static_cast<char>(rng.Next());
          break;
        case 1:
          mutated[pos] = interesting[rng.Below(interesting.size())];
          break;
        case 2:
          mutated[pos] = static_cast<char>(mutated[pos] ^ (1 << rng.Below(8)));
          break;
        default:  // digit changes hit shapes and offsets
          mutated[pos] = static_cast<char>('0' + rng.Below(10));
          break;
      }
    }
    if (iteration % 10 == 0) {  // now and then the length prefix too
      mutated[rng.Below(8)] = static_cast<char>(rng.Next());
    }
    WriteBytes(path, mutated);
    auto file = SafetensorsFile::Open(path);
    if (file.ok()) {
      ++accepted;
      TouchEverything(**file);
    } else {
      const std::string message(file.status().message());
      EXPECT_FALSE(message.empty());
      EXPECT_NE(message.find(path), std::string::npos) << message;
    }
  }
  std::printf("%d of 600 garbled files were still valid\n", accepted);
}

// A file from header text and `data_bytes` bytes of data.
std::string RawFile(const std::string& dir, const std::string& name, const std::string& header,
                    size_t data_bytes, int64_t length_override = -1) {
  const std::string path = dir + "/" + name + ".safetensors";
  const uint64_t length =
      length_override >= 0 ? static_cast<uint64_t>(length_override) : header.size();
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &length, 8);
  bytes += header;
  bytes += std::string(data_bytes, '\x01');
  WriteBytes(path, bytes);
  return path;
}

TEST(SafetensorsRobustnessTest, HostileHeaders) {
  const std::string dir = testing::TempDir("st_hostile");
  struct Case {
    std::string name;
    std::string header;
    size_t data_bytes;
    std::string tensor;  // named in the error, when one is involved
  };
  const std::vector<Case> cases = {
      {"unknown_dtype", R"({"w":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", 4, "w"},
      {"dtype_not_string", R"({"w":{"dtype":7,"shape":[4],"data_offsets":[0,16]}})", 16, "w"},
      {"no_dtype", R"({"w":{"shape":[4],"data_offsets":[0,16]}})", 16, "w"},
      {"negative_dim", R"({"w":{"dtype":"F32","shape":[-1,4],"data_offsets":[0,16]}})", 16, "w"},
      {"float_dim", R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,10]}})", 16, "w"},
      {"string_dim", R"({"w":{"dtype":"F32","shape":["4"],"data_offsets":[0,16]}})", 16, "w"},
      {"shape_not_array", R"({"w":{"dtype":"F32","shape":4,"data_offsets":[0,16]}})", 16, "w"},
      {"huge_shape",
       R"({"w":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904],"data_offsets":[0,16]}})",
       16, "w"},
      {"overflowing_shape",
       R"({"w":{"dtype":"F64","shape":[2305843009213693952,4],"data_offsets":[0,0]}})", 16, "w"},
      {"u64_max_dim",
       R"({"w":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,16]}})", 16, "w"},
      {"many_dims_overflow",
       R"({"w":{"dtype":"BF16","shape":[65536,65536,65536,65536],"data_offsets":[0,16]}})", 16,
       "w"},
      {"offsets_past_end", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,1000]}})", 16, "w"},
      {"offsets_far_past_end",
       R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[18446744073709551600,18446744073709551615]}})",
       16, "w"},
      {"offsets_reversed", R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[16,0]}})", 16, "w"},
      {"offsets_negative", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[-16,0]}})", 16, "w"},
      {"offsets_short", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0]}})", 16, "w"},
      {"offsets_strings", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":["0","16"]}})", 16,
       "w"},
      {"offsets_float", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0.0,16.0]}})", 16, "w"},
      {"size_mismatch", R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 24, "w"},
      {"entry_not_object", R"({"w":[1,2,3]})", 0, "w"},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
       24, "b"},
      {"duplicate_range",
       R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
       16, "b"},
      {"metadata_not_object", R"({"__metadata__":"pt"})", 0, ""},
      {"metadata_not_string", R"({"__metadata__":{"format":1}})", 0, ""},
      {"header_array", R"([1,2,3])", 0, ""},
      {"header_null", R"(null)", 0, ""},
      {"header_empty", "", 0, ""},
      {"header_trailing", R"({} {})", 0, ""},
      {"header_unterminated", R"({"w":{"dtype":"F32")", 0, ""},
      {"header_binary", std::string("\x00\x01\x02\xff{}", 6), 0, ""},
      {"header_bad_utf8", "{\"w\xff\":{}}", 0, ""},
      {"deep_nesting", std::string(100000, '[') + std::string(100000, ']'), 0, ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = RawFile(dir, c.name, c.header, c.data_bytes);
    ExpectOpenError(path, c.tensor);
  }
  // The length prefix larger than the file, or absurd.
  const std::string header = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  EXPECT_TRUE(SafetensorsFile::Open(RawFile(dir, "ok", header, 16)).ok());
  for (int64_t length : {int64_t{1} << 20, static_cast<int64_t>(header.size() + 17),
                         int64_t{1} << 62, int64_t{-1}}) {
    SCOPED_TRACE(length);
    if (length == -1) {
      // 0xffff...: every bit set.
      const std::string path = dir + "/length_max.safetensors";
      WriteBytes(path, std::string(8, '\xff') + header + std::string(16, '\x01'));
      ExpectOpenError(path);
    } else {
      ExpectOpenError(RawFile(dir, absl::StrCat("length_", length), header, 16, length));
    }
  }
  // Not files at all.
  ExpectOpenError(dir + "/does_not_exist.safetensors");
  ExpectOpenError(dir);  // a directory
  WriteBytes(dir + "/empty.safetensors", "");
  ExpectOpenError(dir + "/empty.safetensors");
  // A zero-size tensor at the end of the data is valid.
  EXPECT_TRUE(SafetensorsFile::Open(
                  RawFile(dir, "zero_size",
                          R"({"z":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]}})", 0))
                  .ok());
}

// Tensors of a file as writable data.
std::vector<TensorData> CopyTensors(const SafetensorsFile& file,
                                    const std::vector<std::string>& names) {
  std::vector<TensorData> out;
  for (const std::string& name : names) {
    const TensorView& view = file.tensors().at(name);
    out.push_back(TensorData{name, view.dtype, view.shape,
                             std::vector<uint8_t>(view.data, view.data + view.nbytes)});
  }
  return out;
}

void WriteIndex(const std::string& dir, const json& weight_map) {
  json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
  std::ofstream(dir + "/model.safetensors.index.json") << index.dump(2);
}

TEST(ShardedCheckpointTest, ReadsBackAndValidates) {
  // A random k3-tiny split over two shards, as Hugging Face writes them.
  const ModelConfig config = *PresetConfig("k3-tiny");
  const std::string single = testing::TempDir("sharded_src");
  ASSERT_TRUE(WriteRandomCheckpoint(config, single, 3).ok());
  auto source = SafetensorsFile::Open(single + "/model.safetensors");
  ASSERT_TRUE(source.ok()) << source.status();
  std::vector<std::string> first, second;
  json weight_map = json::object();
  const std::vector<TensorSpec> specs = ExpectedTensors(config);
  for (size_t i = 0; i < specs.size(); ++i) {
    const bool in_first = i < specs.size() / 2;
    (in_first ? first : second).push_back(specs[i].name);
    weight_map[specs[i].name] =
        in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  const std::string dir = testing::TempDir("sharded");
  ASSERT_TRUE(
      WriteSafetensors(dir + "/model-00001-of-00002.safetensors", CopyTensors(**source, first))
          .ok());
  ASSERT_TRUE(
      WriteSafetensors(dir + "/model-00002-of-00002.safetensors", CopyTensors(**source, second))
          .ok());
  WriteIndex(dir, weight_map);
  std::filesystem::copy_file(single + "/config.json", dir + "/config.json");

  auto checkpoint = Checkpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_EQ((*checkpoint)->tensors().size(), specs.size());
  auto loaded = LoadModelConfig(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(ValidateCheckpoint(*loaded, **checkpoint).ok());
  for (const std::string& name : {first.front(), second.back()}) {
    auto a = ToFloat32(**(*source)->Get(name));
    auto b = ToFloat32(**(*checkpoint)->Get(name));
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, *b) << name;
  }
  auto view = (*checkpoint)->Get(second.back());
  ASSERT_TRUE(view.ok());
  EXPECT_NE((*view)->file.find("model-00002-of-00002.safetensors"), std::string::npos);
}

TEST(ShardedCheckpointTest, IndexErrorsNameTheShardOrTensor) {
  const std::string dir = testing::TempDir("sharded_errors");
  ASSERT_TRUE(WriteSafetensors(dir + "/shard-1.safetensors",
                               {MakeF32Tensor("a", {2}, {1, 2}), MakeF32Tensor("b", {1}, {3})})
                  .ok());
  ASSERT_TRUE(
      WriteSafetensors(dir + "/shard-2.safetensors", {MakeBF16Tensor("c", {2}, {4, 5})}).ok());
  WriteIndex(
      dir,
      {{"a", "shard-1.safetensors"}, {"b", "shard-1.safetensors"}, {"c", "shard-2.safetensors"}});
  auto ok = Checkpoint::Open(dir);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->tensors().size(), 3u);
  auto missing = (*ok)->Get("d");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("'d'"), std::string::npos);

  auto expect_error = [&](const json& weight_map, std::vector<std::string> parts) {
    WriteIndex(dir, weight_map);
    auto checkpoint = Checkpoint::Open(dir);
    ASSERT_FALSE(checkpoint.ok()) << weight_map.dump();
    for (const std::string& part : parts) {
      EXPECT_NE(checkpoint.status().message().find(part), std::string::npos)
          << "'" << part << "' not in: " << checkpoint.status();
    }
  };
  // A shard that is not there.
  expect_error({{"a", "shard-1.safetensors"}, {"c", "shard-3.safetensors"}},
               {dir + "/shard-3.safetensors"});
  // A tensor its shard does not hold.
  expect_error({{"a", "shard-1.safetensors"}, {"c", "shard-1.safetensors"}},
               {"'c'", dir + "/shard-1.safetensors"});
  // A malformed index.
  expect_error({{"a", 3}}, {"'a'", "model.safetensors.index.json"});
  expect_error({{"a", "../shard-1.safetensors"}}, {"../shard-1.safetensors"});
  std::ofstream(dir + "/model.safetensors.index.json") << "{\"weight_map\": ";
  auto bad = Checkpoint::Open(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model.safetensors.index.json"), std::string::npos);
  // A broken shard file is reported by name.
  WriteIndex(dir, {{"a", "shard-1.safetensors"}});
  const std::string shard = ReadBytes(dir + "/shard-1.safetensors");
  WriteBytes(dir + "/shard-1.safetensors", shard.substr(0, shard.size() - 1));
  auto truncated = Checkpoint::Open(dir);
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find(dir + "/shard-1.safetensors"), std::string::npos)
      << truncated.status();
}

TEST(ShardedCheckpointTest, EmptyDirectoryIsAnError) {
  const std::string dir = testing::TempDir("checkpoint_empty");
  auto checkpoint = Checkpoint::Open(dir);
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(checkpoint.status().message().find(dir), std::string::npos);
}

}  // namespace
}  // namespace deltaserve
