#include "kernels/reference/logsoftmax_ref.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace deltaserve::kernels::ref {

double LogSumExp(const double* row, int64_t vocab) {
  double max = row[0];
  for (int64_t i = 1; i < vocab; ++i) max = std::max(max, row[i]);
  long double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<long double>(row[i] - max));
  return static_cast<double>(max + std::log(sum));
}

std::vector<int32_t> Ranked(const double* row, int64_t vocab) {
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [row](int32_t a, int32_t b) { return row[a] > row[b]; });
  return ids;
}

int64_t FindNonFinite(const double* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i]) || std::isinf(x[i])) return i;
  }
  return -1;
}

}  // namespace deltaserve::kernels::ref
