// CheckedProduct: products within the limit come back; over it or past 64
// bits they are refused with the names and values of the factors.
#include "runtime/common/checked_product.h"

#include <gtest/gtest.h>

#include <string>

namespace deltaserve {
namespace {

TEST(CheckedProductTest, NamesTheProductOverTheLimit) {
  auto ok = CheckedProduct({{"layers", 93}, {"experts", 384}}, 93 * 384, "cfg");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 93 * 384);
  auto over = CheckedProduct({{"layers", 4096}, {"experts", 65536}}, 1 << 18, "cfg");
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(over.status().message(),
            "cfg: layers x experts = 4096 x 65536 = 268435456, over the limit of 262144");
}

TEST(CheckedProductTest, OverflowAndNegativeFactorsAreRefused) {
  auto overflow =
      CheckedProduct({{"a", int64_t{1} << 40}, {"b", int64_t{1} << 40}}, INT64_MAX, "cfg");
  EXPECT_NE(std::string(overflow.status().message()).find("more than 64 bits hold"),
            std::string::npos)
      << overflow.status();
  EXPECT_FALSE(CheckedProduct({{"a", -1}, {"b", -1}}, INT64_MAX, "cfg").ok());
  EXPECT_EQ(*CheckedProduct({{"a", 0}, {"b", INT64_MAX}}, 0, "cfg"), 0);
}

}  // namespace
}  // namespace deltaserve
