// CheckJsonBounds: size and nesting limits on JSON text before parsing;
// brackets inside strings (escaped quotes included) do not count.
#include "runtime/common/json_bounds.h"

#include <gtest/gtest.h>

#include <string>

namespace deltaserve {
namespace {

TEST(JsonBoundsTest, CountsNestingOutsideStrings) {
  EXPECT_TRUE(CheckJsonBounds(R"({"a": [1, {"b": [2]}]})", 100, 4, "x").ok());
  const absl::Status deep = CheckJsonBounds(R"({"a": [1, {"b": [[2]]}]})", 100, 4, "x");
  EXPECT_EQ(deep.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(deep.message()).find("x: JSON nested deeper than the limit of 4"),
            std::string::npos)
      << deep;
  EXPECT_TRUE(CheckJsonBounds(R"({"a": "[[[[[[\"[[[[[["})", 100, 1, "x").ok());
  EXPECT_FALSE(CheckJsonBounds(R"({"a": "\\", "b": [[]]})", 100, 2, "x").ok());
  // Closing brackets without opening ones do not make room for more.
  EXPECT_FALSE(CheckJsonBounds("]]]]][[[", 100, 2, "x").ok());
}

TEST(JsonBoundsTest, RefusesLongTextOrDeepNestingOfAnySize) {
  EXPECT_TRUE(CheckJsonBounds(std::string(100, ' '), 100, 1, "x").ok());
  const absl::Status big = CheckJsonBounds(std::string(101, ' '), 100, 1, "x");
  EXPECT_NE(std::string(big.message()).find("101 bytes of JSON, over the limit of 100"),
            std::string::npos)
      << big;
  const std::string nested = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_FALSE(CheckJsonBounds(nested, 1 << 20, 64, "x").ok());
}

}  // namespace
}  // namespace deltaserve
