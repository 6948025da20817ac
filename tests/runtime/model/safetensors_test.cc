#include "runtime/model/safetensors.h"

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

}  // namespace
}  // namespace deltaserve
