// expf as the CPU variants get it from std::exp: glibc's x86-64 expf
// with FMA (the ifunc this project's CPUs select), step for step in double,
// so a CUDA kernel whose CPU sibling calls std::exp on floats produces the
// same bits (the CUDA expf is within 2 ulp but rounds differently). The
// algorithm: x·32/ln2 = k + r, exp(x) = 2^(k/32) · p(r), with 2^(i/32) from a
// 32-entry table whose entry i holds the bits of 2^(i/32) less i << 47 (the
// exponent k/32 is added back as bits); p is a cubic, good to 2^-34
// relative before the final rounding to float. Include after compat.h.
#pragma once

#include <cstdint>

namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET {
namespace {

__device__ const uint64_t kExp2Table[32] = {
    0x3ff0000000000000ull, 0x3fefd9b0d3158574ull, 0x3fefb5586cf9890full, 0x3fef9301d0125b51ull,
    0x3fef72b83c7d517bull, 0x3fef54873168b9aaull, 0x3fef387a6e756238ull, 0x3fef1e9df51fdee1ull,
    0x3fef06fe0a31b715ull, 0x3feef1a7373aa9cbull, 0x3feedea64c123422ull, 0x3feece086061892dull,
    0x3feebfdad5362a27ull, 0x3feeb42b569d4f82ull, 0x3feeab07dd485429ull, 0x3feea47eb03a5585ull,
    0x3feea09e667f3bcdull, 0x3fee9f75e8ec5f74ull, 0x3feea11473eb0187ull, 0x3feea589994cce13ull,
    0x3feeace5422aa0dbull, 0x3feeb737b0cdc5e5ull, 0x3feec49182a3f090ull, 0x3feed503b23e255dull,
    0x3feee89f995ad3adull, 0x3feeff76f2fb5e47ull, 0x3fef199bdd85529cull, 0x3fef3720dcef9069ull,
    0x3fef5818dcfba487ull, 0x3fef7c97337b9b5full, 0x3fefa4afa2a490daull, 0x3fefd0765b6e4540ull,
};

__device__ __forceinline__ float HostExpf(float x) {
  constexpr double kInvLn2N = 0x1.71547652b82fep+0 * 32;  // 32 / ln 2
  constexpr double kShift = 0x1.8p+52;                    // rounds to an integer
  constexpr double kC0 = 0x1.c6af84b912394p-5 / 32 / 32 / 32;
  constexpr double kC1 = 0x1.ebfce50fac4f3p-3 / 32 / 32;
  constexpr double kC2 = 0x1.62e42ff0c52d6p-1 / 32;
  const unsigned bits = __float_as_uint(x);
  const unsigned abstop = (bits >> 20) & 0x7ffu;
  if (abstop > 0x42au) {  // |x| >= 88 or NaN
    if (bits == 0xff800000u) return 0.0f;
    if (abstop >= 0x7f8u) return x + x;                          // inf, NaN
    if (x > 0x1.62e42ep6f) return __uint_as_float(0x7f800000u);  // overflows
    if (x < -0x1.9fe368p6f) return 0.0f;                         // underflows
  }
  const double xd = x;
  double kd = fma(kInvLn2N, xd, kShift);
  const uint64_t ki = static_cast<uint64_t>(__double_as_longlong(kd));
  kd -= kShift;
  const double r = fma(kInvLn2N, xd, -kd);
  const double s = __longlong_as_double(static_cast<long long>(kExp2Table[ki % 32] + (ki << 47)));
  const double z = fma(kC0, r, kC1);
  const double r2 = r * r;
  double y = fma(kC2, r, 1.0);
  y = fma(z, r2, y);
  return static_cast<float>(y * s);
}

}  // namespace
}  // namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET
