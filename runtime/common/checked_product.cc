#include "runtime/common/checked_product.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace deltaserve {

absl::StatusOr<int64_t> CheckedProduct(std::initializer_list<SizeFactor> factors, int64_t limit,
                                       const std::string& what) {
  int64_t product = 1;
  bool overflow = false;
  for (const SizeFactor& f : factors) {
    if (f.value < 0 || __builtin_mul_overflow(product, f.value, &product)) {
      overflow = true;
      break;
    }
  }
  if (!overflow && product <= limit) return product;
  std::string names, values;
  for (const SizeFactor& f : factors) {
    absl::StrAppend(&names, names.empty() ? "" : " x ", f.name);
    absl::StrAppend(&values, values.empty() ? "" : " x ", f.value);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": ", names, " = ", values, " = ",
      overflow ? "more than 64 bits hold" : absl::StrCat(product), ", over the limit of ", limit));
}

}  // namespace deltaserve
