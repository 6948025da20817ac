// Which instruction set the CPU kernels run with, decided at run time. Every
// file of kernels/cpu/ is compiled once per level (CMakeLists.txt,
// DELTASERVE_CPU_ISAS) into its own namespace, cpu::generic, cpu::avx2 and
// cpu::avx512; each op's entry point (kernels/<op>.cc) calls the variant of
// ActiveIsa(). One binary thus uses AVX-512 where the machine has it and runs
// unchanged on one that has only AVX2, or neither.
#pragma once

namespace deltaserve::kernels {

enum class Isa : int {
  kGeneric = 0,  // x86-64 baseline (SSE2)
  kAvx2 = 1,     // x86-64-v3: AVX2, FMA, F16C, BMI2
  kAvx512 = 2,   // x86-64-v4: AVX-512 F, BW, CD, DQ, VL
};

const char* IsaName(Isa isa);

// The best level this CPU (and its operating system) supports.
Isa DetectedIsa();

// The level the kernels use: DetectedIsa(), lowered by the environment
// variable DELTASERVE_CPU_ISA (generic, avx2 or avx512) so that one machine
// can test every variant. A level above the detected one, or an unknown
// name, is reported on stderr once and ignored. Read once, on first use.
Isa ActiveIsa();

}  // namespace deltaserve::kernels
