// kernels/paged_cache.h against the float64 reference: rows written through a
// shuffled page table land in the pool rows the reference names, stored as
// given (f32) or rounded to nearest even (bf16), and read back as stored;
// nothing else in the pool changes.
#include "kernels/paged_cache.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/reference/convert_ref.h"
#include "kernels/reference/paged_cache_ref.h"
#include "tests/test_util.h"

namespace deltaserve::kernels {
namespace {

using testing::NaNs;
using testing::RandomFloats;

// A pool of `pages` pages of `page_tokens` rows, every value NaN (a bf16 NaN
// for bf16): a row the ops should not touch stays NaN.
struct Pool {
  Pool(DType dtype, int64_t pages, int64_t page_tokens, int64_t width)
      : dtype(dtype), rows(pages * page_tokens), width(width) {
    f32 = NaNs(static_cast<size_t>(rows * width));
    bf16.assign(static_cast<size_t>(rows * width), uint16_t{0x7fc0});
  }
  MutableTensor View() {
    if (dtype == DType::kBF16) {
      return MutableTensor{bf16.data(), nullptr, DType::kBF16, Device::kCpu, rows, width};
    }
    return MutableTensor::F32(f32.data(), rows, width);
  }
  double At(int64_t row, int64_t c) const {
    return dtype == DType::kBF16 ? Bf16ToFloat(bf16[row * width + c]) : f32[row * width + c];
  }
  DType dtype;
  int64_t rows, width;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
};

// `pages` distinct pages of a pool of `pool_pages`, in a shuffled order.
std::vector<int32_t> ShuffledPages(int64_t pages, int64_t pool_pages, uint64_t seed) {
  std::vector<int32_t> all(static_cast<size_t>(pool_pages));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), std::mt19937_64(seed));
  all.resize(static_cast<size_t>(pages));
  return all;
}

TEST(PagedCacheTest, WritesLandWhereTheReferenceSaysAndReadBackAsStored) {
  uint64_t seed = 1;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t page_tokens : {1, 5, 64}) {
      for (int64_t width : {1, 20, 320}) {
        for (const auto& [begin, n] :
             {std::pair<int64_t, int64_t>{0, 1}, {0, 64}, {3, 130}, {63, 2}, {64, 64}, {100, 0}}) {
          SCOPED_TRACE(::testing::Message()
                       << DTypeName(dtype) << " page_tokens " << page_tokens << " width " << width
                       << " begin " << begin << " n " << n);
          const int64_t tokens = begin + n;
          const int64_t pages = (tokens + page_tokens - 1) / page_tokens;
          const int64_t pool_pages = pages + 3;
          Pool pool(dtype, pool_pages, page_tokens, width);
          const std::vector<int32_t> table = ShuffledPages(pages, pool_pages, ++seed);
          // Strided rows: two spare columns after each.
          const int64_t stride = width + 2;
          const std::vector<float> rows = RandomFloats(static_cast<size_t>(n * stride), ++seed);
          const MutablePagedCache cache{
              pool.View(), Tensor::I32(table.data(), 1, static_cast<int64_t>(pages)), page_tokens};
          PagedCacheWrite(Tensor::F32(rows.data(), n, width, stride), begin, cache);

          std::vector<bool> written(static_cast<size_t>(pool.rows), false);
          for (int64_t i = 0; i < n; ++i) {
            const int64_t row = ref::PagedRow(table.data(), page_tokens, begin + i);
            written[row] = true;
            for (int64_t c = 0; c < width; ++c) {
              const double given = rows[i * stride + c];
              const double want = dtype == DType::kBF16 ? ref::RoundToBf16(given) : given;
              ASSERT_EQ(pool.At(row, c), want) << "token " << begin + i << " column " << c;
            }
          }
          for (int64_t row = 0; row < pool.rows; ++row) {
            if (written[row]) continue;
            for (int64_t c = 0; c < width; ++c) ASSERT_TRUE(std::isnan(pool.At(row, c)));
          }

          std::vector<float> back = NaNs(static_cast<size_t>(n * stride));
          PagedCacheRead(PagedCache{cache.pool, cache.page_table, page_tokens}, begin,
                         MutableTensor::F32(back.data(), n, width, stride));
          for (int64_t i = 0; i < n; ++i) {
            const int64_t row = ref::PagedRow(table.data(), page_tokens, begin + i);
            for (int64_t c = 0; c < width; ++c) {
              ASSERT_EQ(back[i * stride + c], pool.At(row, c));
            }
            for (int64_t c = width; c < stride; ++c) ASSERT_TRUE(std::isnan(back[i * stride + c]));
          }
        }
      }
    }
  }
}

// A long read takes the parallel path; it reads what the serial one does.
TEST(PagedCacheTest, LongReadEqualsRowByRow) {
  const int64_t page_tokens = 64, width = 320, tokens = 2000;
  const int64_t pages = (tokens + page_tokens - 1) / page_tokens;
  Pool pool(DType::kF32, pages, page_tokens, width);
  const std::vector<int32_t> table = ShuffledPages(pages, pages, 7);
  const std::vector<float> rows = RandomFloats(static_cast<size_t>(tokens * width), 8);
  const MutablePagedCache cache{pool.View(), Tensor::I32(table.data(), 1, pages), page_tokens};
  PagedCacheWrite(Tensor::F32(rows.data(), tokens, width), 0, cache);
  std::vector<float> all = NaNs(rows.size());
  PagedCacheRead(PagedCache{cache.pool, cache.page_table, page_tokens}, 0,
                 MutableTensor::F32(all.data(), tokens, width));
  EXPECT_EQ(std::memcmp(all.data(), rows.data(), rows.size() * sizeof(float)), 0);
}

TEST(PagedCacheTest, CopyPageCopiesItsFirstRowsOnly) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const int64_t page_tokens = 8, width = 6;
    Pool pool(dtype, 3, page_tokens, width);
    const std::vector<int32_t> table = {2};
    const std::vector<float> rows = RandomFloats(5 * width, 9);
    const MutablePagedCache cache{pool.View(), Tensor::I32(table.data(), 1, 1), page_tokens};
    PagedCacheWrite(Tensor::F32(rows.data(), 5, width), 0, cache);
    PagedCacheCopyPage(pool.View(), page_tokens, 2, 0, 5);
    for (int64_t r = 0; r < page_tokens; ++r) {
      for (int64_t c = 0; c < width; ++c) {
        if (r < 5) {
          EXPECT_EQ(pool.At(r, c), pool.At(2 * page_tokens + r, c));
        } else {
          EXPECT_TRUE(std::isnan(pool.At(r, c)));
        }
        EXPECT_TRUE(std::isnan(pool.At(page_tokens + r, c)));  // page 1 untouched
      }
    }
  }
}

TEST(PagedCacheTest, RoundsTiesToEvenAsTheReference) {
  // 1 + 2^-8 lies halfway between bf16 neighbours 1 and 1 + 2^-7: to even (1);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: to even (1 + 2^-6).
  const std::vector<float> rows = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -1.5f, 0.0f};
  Pool pool(DType::kBF16, 1, 4, 1);
  const std::vector<int32_t> table = {0};
  PagedCacheWrite(Tensor::F32(rows.data(), 4, 1), 0,
                  MutablePagedCache{pool.View(), Tensor::I32(table.data(), 1, 1), 4});
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(pool.At(i, 0), ref::RoundToBf16(rows[i])) << i;
  EXPECT_EQ(pool.At(0, 0), 1.0);
  EXPECT_EQ(pool.At(1, 0), 1.0 + 0x1p-6);
}

TEST(PagedCacheDeathTest, EntryPointRefusesAPageOutsideThePool) {
  Pool pool(DType::kF32, 2, 4, 3);
  const std::vector<int32_t> table = {0, 2};  // page 2 of a 2-page pool
  const std::vector<float> rows(3 * 3, 1.0f);
  const MutablePagedCache cache{pool.View(), Tensor::I32(table.data(), 1, 2), 4};
  PagedCacheWrite(Tensor::F32(rows.data(), 3, 3), 0, cache);  // page 0 only: fine
  EXPECT_DEATH(PagedCacheWrite(Tensor::F32(rows.data(), 3, 3), 3, cache), "page < pool_pages");
  const std::vector<int32_t> short_table = {0};
  EXPECT_DEATH(
      PagedCacheWrite(Tensor::F32(rows.data(), 3, 3), 3,
                      MutablePagedCache{pool.View(), Tensor::I32(short_table.data(), 1, 1), 4}),
      "page_table.cols >= pages");
}

}  // namespace
}  // namespace deltaserve::kernels
