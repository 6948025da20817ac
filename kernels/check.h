// Contract checks for kernels. A kernel's preconditions (shapes, dtypes,
// device, aliasing) are established by its caller from validated configs, so a
// violation is a broken internal invariant: report where and abort, never
// continue with bad memory. Each op checks them once, at its entry point
// (kernels/<op>.cc); the CPU variants behind it trust them.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "kernels/tensor.h"

#define DELTASERVE_CHECK(cond)                                                      \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

// view is a contiguous CPU tensor of dtype, shape [rows, cols]; the message
// names the argument and what differs (device, dtype or shape).
#define DELTASERVE_CHECK_VIEW(view, dtype, rows, cols) \
  DELTASERVE_CHECK_VIEW_ON(::deltaserve::kernels::Device::kCpu, view, dtype, rows, cols)
// The same, for a kernel that reads rows at view.RowStride() >= cols.
#define DELTASERVE_CHECK_STRIDED_VIEW(view, dtype, rows, cols) \
  DELTASERVE_CHECK_STRIDED_VIEW_ON(::deltaserve::kernels::Device::kCpu, view, dtype, rows, cols)
// A weight: a contiguous CPU tensor [rows, cols] of f32, bf16 or mxfp4.
#define DELTASERVE_CHECK_WEIGHT(view, rows, cols) \
  DELTASERVE_CHECK_WEIGHT_ON(::deltaserve::kernels::Device::kCpu, view, rows, cols)

// An op with a CUDA variant: `const Device device = DELTASERVE_OP_DEVICE(y)`
// takes the device of its output y (the CPU, or CUDA with an active
// backend), and the checks below hold every view to it.
#define DELTASERVE_OP_DEVICE(view) \
  ::deltaserve::kernels::OpDevice(__FILE__, __LINE__, #view, (view), true)
#define DELTASERVE_CHECK_VIEW_ON(device, view, dtype, rows, cols)                              \
  ::deltaserve::kernels::CheckView(__FILE__, __LINE__, #view, (view), (dtype), (rows), (cols), \
                                   false, (device))
#define DELTASERVE_CHECK_STRIDED_VIEW_ON(device, view, dtype, rows, cols)                      \
  ::deltaserve::kernels::CheckView(__FILE__, __LINE__, #view, (view), (dtype), (rows), (cols), \
                                   true, (device))
#define DELTASERVE_CHECK_WEIGHT_ON(device, view, rows, cols) \
  ::deltaserve::kernels::CheckWeight(__FILE__, __LINE__, #view, (view), (rows), (cols), (device))
