// Contract checks for kernels. A kernel's preconditions (shapes, aliasing) are
// established by its caller from validated configs, so a violation is a broken
// internal invariant: report where and abort, never continue with bad memory.
#pragma once

#include <cstdio>
#include <cstdlib>

#define DELTASERVE_CHECK(cond)                                                      \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)
