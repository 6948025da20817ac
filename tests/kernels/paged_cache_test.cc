// kernels/paged_cache.h against the float64 reference: rows written through a
// shuffled page table land in the pool rows the reference names, stored as
// given (f32) or rounded to nearest even (bf16), and read back as stored;
// nothing else in the pool changes. Per device of AvailableDevices(); the
// pool and the rows read back are guarded buffers whose guards are checked
// after the calls.
#include "kernels/paged_cache.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/reference/convert_ref.h"
#include "kernels/reference/paged_cache_ref.h"
#include "tests/kernels/device_test_util.h"
#include "tests/test_util.h"

namespace deltaserve::kernels {
namespace {

using testing::DeviceTest;
using testing::GuardedBuffer;
using testing::RandomFloats;

// The values of a pool [rows, width], copied to the host.
struct PoolValues {
  double At(int64_t row, int64_t c) const { return values[row * width + c]; }
  int64_t width;
  std::vector<double> values;
};

// A pool of `pages` pages of `page_tokens` rows on `device`, every value NaN
// (a bf16 NaN for bf16), between guard bands: a row the ops should not touch
// stays NaN, and nothing outside the pool changes.
struct Pool {
  Pool(Device device, DType dtype, int64_t pages, int64_t page_tokens, int64_t width)
      : dtype(dtype),
        rows(pages * page_tokens),
        width(width),
        f32(device, dtype == DType::kF32 ? rows * width : 0),
        bf16(device, dtype == DType::kBF16 ? rows * width : 0) {}
  MutableTensor View() {
    return dtype == DType::kBF16 ? bf16.View(rows, width) : f32.View(rows, width);
  }
  PoolValues Values() const {
    PoolValues out{width, {}};
    if (dtype == DType::kBF16) {
      for (uint16_t b : bf16.Values()) out.values.push_back(Bf16ToFloat(b));
    } else {
      for (float v : f32.Values()) out.values.push_back(v);
    }
    return out;
  }
  ::testing::AssertionResult GuardsIntact() const {
    return dtype == DType::kBF16 ? bf16.GuardsIntact() : f32.GuardsIntact();
  }
  DType dtype;
  int64_t rows, width;
  GuardedBuffer<float> f32;
  GuardedBuffer<uint16_t> bf16;
};

class PagedCacheTest : public DeviceTest {};

// `pages` distinct pages of a pool of `pool_pages`, in a shuffled order.
std::vector<int32_t> ShuffledPages(int64_t pages, int64_t pool_pages, uint64_t seed) {
  std::vector<int32_t> all(static_cast<size_t>(pool_pages));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), std::mt19937_64(seed));
  all.resize(static_cast<size_t>(pages));
  return all;
}

TEST_P(PagedCacheTest, WritesLandWhereTheReferenceSaysAndReadBackAsStored) {
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
          Pool pool(device(), dtype, pool_pages, page_tokens, width);
          const std::vector<int32_t> table = ShuffledPages(pages, pool_pages, ++seed);
          // Strided rows: two spare columns after each.
          const int64_t stride = width + 2;
          const std::vector<float> rows = RandomFloats(static_cast<size_t>(n * stride), ++seed);
          auto rows_device = Input(rows);
          auto table_device = Input(table);
          const MutablePagedCache cache{pool.View(), table_device.View(1, pages), page_tokens};
          PagedCacheWrite(rows_device.View(n, width, stride), begin, cache);
          ASSERT_TRUE(pool.GuardsIntact());
          const PoolValues stored = pool.Values();

          std::vector<bool> written(static_cast<size_t>(pool.rows), false);
          for (int64_t i = 0; i < n; ++i) {
            const int64_t row = ref::PagedRow(table.data(), page_tokens, begin + i);
            written[row] = true;
            for (int64_t c = 0; c < width; ++c) {
              const double given = rows[i * stride + c];
              const double want = dtype == DType::kBF16 ? ref::RoundToBf16(given) : given;
              ASSERT_EQ(stored.At(row, c), want) << "token " << begin + i << " column " << c;
            }
          }
          for (int64_t row = 0; row < pool.rows; ++row) {
            if (written[row]) continue;
            for (int64_t c = 0; c < width; ++c) ASSERT_TRUE(std::isnan(stored.At(row, c)));
          }

          auto read = Output<float>(n * stride);
          PagedCacheRead(PagedCache{cache.pool, cache.page_table, page_tokens}, begin,
                         read.View(n, width, stride));
          ASSERT_TRUE(read.GuardsIntact());
          ASSERT_TRUE(pool.GuardsIntact());
          const std::vector<float> back = read.Values();
          for (int64_t i = 0; i < n; ++i) {
            const int64_t row = ref::PagedRow(table.data(), page_tokens, begin + i);
            for (int64_t c = 0; c < width; ++c) {
              ASSERT_EQ(back[i * stride + c], stored.At(row, c));
            }
            for (int64_t c = width; c < stride; ++c) ASSERT_TRUE(std::isnan(back[i * stride + c]));
          }
        }
      }
    }
  }
}

// A long read takes the parallel path; it reads what the serial one does.
TEST_P(PagedCacheTest, LongReadEqualsRowByRow) {
  const int64_t page_tokens = 64, width = 320, tokens = 2000;
  const int64_t pages = (tokens + page_tokens - 1) / page_tokens;
  Pool pool(device(), DType::kF32, pages, page_tokens, width);
  const std::vector<int32_t> table = ShuffledPages(pages, pages, 7);
  const std::vector<float> rows = RandomFloats(static_cast<size_t>(tokens * width), 8);
  auto rows_device = Input(rows);
  auto table_device = Input(table);
  const MutablePagedCache cache{pool.View(), table_device.View(1, pages), page_tokens};
  PagedCacheWrite(rows_device.View(tokens, width), 0, cache);
  EXPECT_TRUE(pool.GuardsIntact());
  auto read = Output<float>(tokens * width);
  PagedCacheRead(PagedCache{cache.pool, cache.page_table, page_tokens}, 0,
                 read.View(tokens, width));
  EXPECT_TRUE(read.GuardsIntact());
  const std::vector<float> all = read.Values();
  EXPECT_EQ(std::memcmp(all.data(), rows.data(), rows.size() * sizeof(float)), 0);
}

TEST_P(PagedCacheTest, CopyPageCopiesItsFirstRowsOnly) {
  // 5 bf16 rows of width 3 are 30 bytes: not whole 4-byte words.
  for (const auto& [dtype, page_tokens, width] :
       {std::tuple<DType, int64_t, int64_t>{DType::kF32, 8, 6},
        {DType::kBF16, 8, 6},
        {DType::kBF16, 5, 3}}) {
    Pool pool(device(), dtype, 3, page_tokens, width);
    const std::vector<int32_t> table = {2};
    const std::vector<float> rows = RandomFloats(5 * width, 9);
    auto rows_device = Input(rows);
    auto table_device = Input(table);
    const MutablePagedCache cache{pool.View(), table_device.View(1, 1), page_tokens};
    PagedCacheWrite(rows_device.View(5, width), 0, cache);
    PagedCacheCopyPage(pool.View(), page_tokens, 2, 0, 5);
    EXPECT_TRUE(pool.GuardsIntact()) << DTypeName(dtype);
    const PoolValues stored = pool.Values();
    for (int64_t r = 0; r < page_tokens; ++r) {
      for (int64_t c = 0; c < width; ++c) {
        if (r < 5) {
          EXPECT_EQ(stored.At(r, c), stored.At(2 * page_tokens + r, c));
        } else {
          EXPECT_TRUE(std::isnan(stored.At(r, c)));
        }
        EXPECT_TRUE(std::isnan(stored.At(page_tokens + r, c)));  // page 1 untouched
      }
    }
  }
}

TEST_P(PagedCacheTest, RoundsTiesToEvenAsTheReference) {
  // 1 + 2^-8 lies halfway between bf16 neighbours 1 and 1 + 2^-7: to even (1);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: to even (1 + 2^-6).
  const std::vector<float> rows = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -1.5f, 0.0f};
  Pool pool(device(), DType::kBF16, 1, 4, 1);
  auto rows_device = Input(rows);
  auto table_device = Input(std::vector<int32_t>{0});
  PagedCacheWrite(rows_device.View(4, 1), 0,
                  MutablePagedCache{pool.View(), table_device.View(1, 1), 4});
  EXPECT_TRUE(pool.GuardsIntact());
  const PoolValues stored = pool.Values();
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(stored.At(i, 0), ref::RoundToBf16(rows[i])) << i;
  EXPECT_EQ(stored.At(0, 0), 1.0);
  EXPECT_EQ(stored.At(1, 0), 1.0 + 0x1p-6);
}

TEST(PagedCacheDeathTest, EntryPointRefusesAPageOutsideThePool) {
  Pool pool(Device::kCpu, DType::kF32, 2, 4, 3);
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

DELTASERVE_INSTANTIATE_DEVICE_TEST(PagedCacheTest);

}  // namespace
}  // namespace deltaserve::kernels
