// A fixture for tools/check_isa.py (CMakeLists.txt, isa_check_*): a function
// outside the per-level namespaces compiled with AVX2 flags, as a template
// instantiated by a kernel would be. The checker must refuse it.
#include <immintrin.h>

float LeakedAvx2Sum(const float* p) {
  const __m256 v = _mm256_loadu_ps(p);
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  return _mm_cvtss_f32(s);
}

int main(int argc, char** argv) {
  float values[8] = {};
  return static_cast<int>(LeakedAvx2Sum(values)) + (argc > 99 ? argv[0][0] : 0);
}
