// The CPU variants of the ops and the choice between them. Files of
// kernels/cpu/ define their functions in namespace cpu::DELTASERVE_CPU_ISA,
// which the build sets to generic, avx2 and avx512 in turn, compiling each
// file once per level with that level's flags (kernels/isa.h). A variant
// takes raw pointers and sizes, its own signature, declared in one line per op
// (kernels/cpu/ops.h); the op's entry point (kernels/<op>.cc) checks the
// views it was given, then calls DELTASERVE_CPU_DISPATCH(Op)(pointers...).
//
// Code inside a variant must stay inside its namespace: an inline function or
// template of its own defined outside it would be compiled at several levels
// under one name, and the linker would keep one of them for all callers.
// tools/check_isa.py disassembles the linked binaries and fails the build's
// tests on any function outside cpu::avx2 / cpu::avx512 that uses their
// registers.
#pragma once

#include "kernels/isa.h"

#ifndef DELTASERVE_CPU_ISA
// Compiled outside the per-level build (an entry point, a test): the
// declarations below still name all three.
#define DELTASERVE_CPU_ISA generic
#endif

// DELTASERVE_CPU_DECLARE(Op, void(const float* x, int64_t n)) declares the
// variant Op of that function type at every level, and cpu::OpFn, its type.
#define DELTASERVE_CPU_DECLARE(op, ...)         \
  namespace deltaserve::kernels::cpu {          \
  using op##Fn = __VA_ARGS__;                   \
  }                                             \
  namespace deltaserve::kernels::cpu::generic { \
  op##Fn op;                                    \
  }                                             \
  namespace deltaserve::kernels::cpu::avx2 {    \
  op##Fn op;                                    \
  }                                             \
  namespace deltaserve::kernels::cpu::avx512 {  \
  op##Fn op;                                    \
  }

namespace deltaserve::kernels::cpu {

template <typename F>
F Select(F generic, F avx2, F avx512) {
  switch (ActiveIsa()) {
    case Isa::kAvx512:
      return avx512;
    case Isa::kAvx2:
      return avx2;
    case Isa::kGeneric:
      break;
  }
  return generic;
}

}  // namespace deltaserve::kernels::cpu

#define DELTASERVE_CPU_DISPATCH(op)                                             \
  (::deltaserve::kernels::cpu::Select(&::deltaserve::kernels::cpu::generic::op, \
                                      &::deltaserve::kernels::cpu::avx2::op,    \
                                      &::deltaserve::kernels::cpu::avx512::op))
