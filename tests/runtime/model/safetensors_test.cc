#include "runtime/model/safetensors.h"

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace deltaserve {
namespace {

TEST(SafetensorsTest, ReadsGoldenModel) {
  auto file = SafetensorsFile::Open(testing::GoldenPath("model/k3-tiny/model.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  auto view = (*file)->Get("language_model.model.embed_tokens.weight");
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ((*view)->dtype, DType::kBF16);
  EXPECT_EQ((*view)->shape, (std::vector<int64_t>{256, 64}));
}

TEST(SafetensorsTest, BF16RoundsToNearestEven) {
  for (float exact : {0.0f, -0.0f, 1.0f, -2.5f, 0.15625f, 0x1.fep127f, 0x1.0p-126f,
                      0x1.0p-133f}) {  // largest, smallest normal, a subnormal
    EXPECT_EQ(BF16ToFloat(FloatToBF16(exact)), exact) << exact;
  }
  // Halfway cases go to the even mantissa.
  EXPECT_EQ(BF16ToFloat(FloatToBF16(1.0f + 0x1.0p-8f)), 1.0f);
  EXPECT_EQ(BF16ToFloat(FloatToBF16(1.0f + 3 * 0x1.0p-8f)), 1.0f + 0x1.0p-6f);
  EXPECT_EQ(BF16ToFloat(FloatToBF16(1.0f + 0x1.8p-8f)), 1.0f + 0x1.0p-7f);
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(std::nanf("")))));
  EXPECT_TRUE(std::isinf(BF16ToFloat(FloatToBF16(INFINITY))));
}

TEST(SafetensorsTest, F16Decodes) {
  EXPECT_EQ(F16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(F16ToFloat(0xc000), -2.0f);
  EXPECT_EQ(F16ToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToFloat(0x0001), 0x1.0p-24f);         // smallest subnormal
  EXPECT_EQ(F16ToFloat(0x03ff), 1023 * 0x1.0p-24f);  // largest subnormal
  EXPECT_EQ(F16ToFloat(0x0400), 0x1.0p-14f);         // smallest normal
  EXPECT_TRUE(std::signbit(F16ToFloat(0x8000)));
  EXPECT_TRUE(std::isinf(F16ToFloat(0x7c00)));
  EXPECT_TRUE(std::isnan(F16ToFloat(0x7e00)));
}

TEST(SafetensorsTest, WrongKindConversionsNameTheTensor) {
  const std::string dir = testing::TempDir("safetensors_kinds");
  const std::string path = dir + "/t.safetensors";
  ASSERT_TRUE(
      WriteSafetensors(path, {MakeF32Tensor("floats", {2}, {1, 2}),
                              TensorData{"ints", DType::kI32, {2}, std::vector<uint8_t>(8, 0)}})
          .ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto as_float = ToFloat32(**(*file)->Get("ints"));
  ASSERT_FALSE(as_float.ok());
  EXPECT_NE(as_float.status().message().find("'ints'"), std::string::npos);
  auto as_int = ToInt64(**(*file)->Get("floats"));
  ASSERT_FALSE(as_int.ok());
  EXPECT_NE(as_int.status().message().find("'floats'"), std::string::npos);
  auto ints = ToInt64(**(*file)->Get("ints"));
  ASSERT_TRUE(ints.ok());
  EXPECT_EQ(*ints, (std::vector<int64_t>{0, 0}));
}

TEST(SafetensorsTest, WriterRejectsInconsistentTensors) {
  const std::string dir = testing::TempDir("safetensors_writer");
  const std::string path = dir + "/bad.safetensors";
  auto dup = WriteSafetensors(path, {MakeF32Tensor("x", {1}, {1}), MakeF32Tensor("x", {1}, {2})});
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.message().find("'x'"), std::string::npos);
  auto size = WriteSafetensors(path, {MakeF32Tensor("y", {3}, {1, 2})});
  ASSERT_FALSE(size.ok());
  EXPECT_NE(size.message().find("'y'"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

}  // namespace
}  // namespace deltaserve
