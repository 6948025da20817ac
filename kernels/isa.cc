#include "kernels/isa.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace deltaserve::kernels {
namespace {

Isa Detect() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // GCC's checks include the operating system's support for the register
  // state (XGETBV), not only the CPUID bits.
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("bmi2");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512cd") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return avx512 ? Isa::kAvx512 : avx2 ? Isa::kAvx2 : Isa::kGeneric;
#else
  return Isa::kGeneric;
#endif
}

Isa Choose() {
  const Isa detected = DetectedIsa();
  const char* requested = std::getenv("DELTASERVE_CPU_ISA");
  if (requested == nullptr || *requested == '\0') return detected;
  for (Isa isa : {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512}) {
    if (std::strcmp(requested, IsaName(isa)) != 0) continue;
    if (static_cast<int>(isa) <= static_cast<int>(detected)) return isa;
    std::fprintf(stderr,
                 "deltaserve: DELTASERVE_CPU_ISA=%s is above what this CPU supports; using %s\n",
                 requested, IsaName(detected));
    return detected;
  }
  std::fprintf(stderr,
               "deltaserve: DELTASERVE_CPU_ISA=%s is not one of generic, avx2, avx512; using %s\n",
               requested, IsaName(detected));
  return detected;
}

}  // namespace

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kGeneric:
      return "generic";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "?";
}

Isa DetectedIsa() {
  static const Isa isa = Detect();
  return isa;
}

Isa ActiveIsa() {
  static const Isa isa = Choose();
  return isa;
}

}  // namespace deltaserve::kernels
