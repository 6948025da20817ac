// MXFP4 decoding in float64, from the format's definition (E2M1: sign,
// two exponent bits with bias 1, one mantissa bit, subnormal at exponent 0;
// E8M0: a biased power of two), not from a table.
#pragma once

#include <cstdint>
#include <vector>

namespace deltaserve::kernels::ref {

double Mxfp4CodeRef(uint8_t code);
double E8m0ScaleRef(uint8_t s);  // NaN for 255

// [rows, cols] from packed [rows, cols / 2] and scales [rows, cols / 32].
std::vector<double> DequantizeMxfp4Ref(const uint8_t* packed, const uint8_t* scales, int64_t rows,
                                       int64_t cols);

}  // namespace deltaserve::kernels::ref
