// The tensor-parallel split rule as data: each cut's parts, and that the
// parts of every tensor of every preset tile it exactly across the group.
#include "runtime/model/tp_split.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/model/presets.h"
#include "runtime/model/weight_spec.h"
#include "tests/test_util.h"

namespace deltaserve {
namespace {

TEST(TpSplitTest, PartsOfEachCut) {
  const std::vector<int64_t> shape = {8, 6};
  auto part = [&](TpSplit split, int rank) {
    const TpPart p = RankPart(split, shape, rank, 2);
    return std::vector<int64_t>{p.begin, p.end, p.elements};
  };
  EXPECT_EQ(part(TpSplit::Replicated(), 1), (std::vector<int64_t>{0, 8, 48}));
  EXPECT_EQ(part(TpSplit::Rows(TpDim::kKdaHeads), 1), (std::vector<int64_t>{4, 8, 24}));
  EXPECT_EQ(part(TpSplit::Columns(TpDim::kMlaHeads), 1), (std::vector<int64_t>{3, 6, 24}));
  // Only the leading values are held; the rest of the tensor is padding.
  EXPECT_EQ(part(TpSplit::Leading(TpDim::kKdaHeads, 4), 1), (std::vector<int64_t>{2, 4, 2}));
  EXPECT_EQ(part(TpSplit::Expert(3), 1), (std::vector<int64_t>{0, 8, 48}));
  EXPECT_EQ(part(TpSplit::Expert(3), 0)[2], 0);
}

// Over every rank of a group the parts of a split tensor are contiguous,
// disjoint and cover it (its leading values for kLeading); a replicated
// tensor is whole everywhere; a routed expert is whole on exactly one rank.
TEST(TpSplitTest, PartsTileEveryTensorOfEveryPreset) {
  for (const std::string& name : PresetNames()) {
    auto config = PresetConfig(name);
    ASSERT_TRUE(config.ok()) << config.status();
    for (int tp : {1, 2, 4, 8}) {
      if (!CheckTensorParallel(*config, tp).ok()) continue;
      SCOPED_TRACE(absl::StrCat(name, " tp ", tp));
      for (const TensorSpec& spec : ExpectedTensors(*config)) {
        const int64_t whole =
            spec.split.cut == TpCut::kLeading ? spec.split.leading : spec.NumElements();
        int64_t held = 0, holders = 0, next = 0;
        for (int rank = 0; rank < tp; ++rank) {
          const TpPart part = spec.RankPart(rank, tp);
          held += part.elements;
          holders += part.elements > 0;
          if (spec.split.cut == TpCut::kRows || spec.split.cut == TpCut::kColumns ||
              spec.split.cut == TpCut::kLeading) {
            EXPECT_EQ(part.begin, next) << spec.name;
            next = part.end;
          } else {
            EXPECT_TRUE(part.elements == 0 || part.elements == spec.NumElements()) << spec.name;
          }
        }
        switch (spec.split.cut) {
          case TpCut::kReplicated:
            EXPECT_EQ(held, tp * whole) << spec.name;
            break;
          case TpCut::kExpert:
            EXPECT_EQ(holders, 1) << spec.name;
            EXPECT_EQ(held, whole) << spec.name;
            break;
          default:
            EXPECT_EQ(held, whole) << spec.name;
            EXPECT_EQ(holders, tp) << spec.name;
            break;
        }
      }
    }
  }
}

TEST(TpSplitTest, OneDivisibilityCheckNamesTheDimension) {
  auto config = PresetConfig("k3-tiny");  // 4 KDA heads
  ASSERT_TRUE(config.ok());
  EXPECT_TRUE(CheckTensorParallel(*config, 2).ok());
  const absl::Status three = CheckTensorParallel(*config, 3);
  EXPECT_NE(three.message().find("linear_attn_config.num_heads (KDA heads) = 4"), std::string::npos)
      << three;
  EXPECT_FALSE(CheckTensorParallel(*config, 0).ok());
  // Every split tensor divides a dimension the check covers.
  for (const TensorSpec& spec : ExpectedTensors(*config)) {
    if (spec.split.cut == TpCut::kRows || spec.split.cut == TpCut::kColumns ||
        spec.split.cut == TpCut::kLeading) {
      EXPECT_GT(TpDimSize(*config, spec.split.dim), 0) << spec.name;
    }
  }
}

}  // namespace
}  // namespace deltaserve
