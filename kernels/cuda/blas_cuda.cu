// Gemm of kernels/cuda/blas.h: cuBLASLt on the GPU, a host loop on the SIMT
// harness. The cuBLASLt handle is created once per process, on first use
// (the process drives one device: the CUDA workspace's); its workspace for
// split-K and stream-K algorithms comes from the CUDA workspace per call,
// which reuses blocks in its one stream's order.
#include "kernels/cuda/compat.h"
// compat.h first
#include "kernels/cuda/blas.h"

#ifdef __CUDACC__
#include <cublasLt.h>
#include <dlfcn.h>

#include <mutex>
#endif

namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET {

#ifdef __CUDACC__

namespace {

// cuBLASLt is loaded on first use, not linked: mapping and relocating it
// costs a process some 210 MB of resident memory, which a run on the CPU
// should not pay. Each function the calls below use is looked up once; the
// macros after the table route the calls through it.
// clang-format off
#define DELTASERVE_LT_FUNCTIONS(X)                                                      \
  X(cublasLtCreate) X(cublasLtGetStatusString) X(cublasLtMatmulDescCreate)             \
  X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute)                       \
  X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy)                         \
  X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceDestroy)                 \
  X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatmulAlgoGetHeuristic)            \
  X(cublasLtMatmul)
// clang-format on

struct LtFunctions {
#define DELTASERVE_LT_FIELD(name) decltype(&::name) name = nullptr;
  DELTASERVE_LT_FUNCTIONS(DELTASERVE_LT_FIELD)
#undef DELTASERVE_LT_FIELD
  std::string error;  // why the library or a function is missing
};

#define DELTASERVE_LT_STR2(x) #x
#define DELTASERVE_LT_STR(x) DELTASERVE_LT_STR2(x)

const LtFunctions& LtApi() {
  static const LtFunctions api = [] {
    LtFunctions out;
    const std::string soname = "libcublasLt.so." DELTASERVE_LT_STR(CUBLAS_VER_MAJOR);
    void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {  // the toolkit's own directory, where the build found it
      lib = dlopen((std::string(DELTASERVE_CUDA_LIBRARY_DIR) + "/" + soname).c_str(),
                   RTLD_NOW | RTLD_LOCAL);
    }
    if (lib == nullptr) {
      out.error = "cannot load " + soname + ": " + dlerror();
      return out;
    }
#define DELTASERVE_LT_LOAD(name)                                      \
  out.name = reinterpret_cast<decltype(out.name)>(dlsym(lib, #name)); \
  if (out.name == nullptr && out.error.empty()) out.error = soname + " has no " #name;
    DELTASERVE_LT_FUNCTIONS(DELTASERVE_LT_LOAD)
#undef DELTASERVE_LT_LOAD
    return out;
  }();
  return api;
}

#define cublasLtCreate LtApi().cublasLtCreate
#define cublasLtGetStatusString LtApi().cublasLtGetStatusString
#define cublasLtMatmulDescCreate LtApi().cublasLtMatmulDescCreate
#define cublasLtMatmulDescDestroy LtApi().cublasLtMatmulDescDestroy
#define cublasLtMatmulDescSetAttribute LtApi().cublasLtMatmulDescSetAttribute
#define cublasLtMatrixLayoutCreate LtApi().cublasLtMatrixLayoutCreate
#define cublasLtMatrixLayoutDestroy LtApi().cublasLtMatrixLayoutDestroy
#define cublasLtMatmulPreferenceCreate LtApi().cublasLtMatmulPreferenceCreate
#define cublasLtMatmulPreferenceDestroy LtApi().cublasLtMatmulPreferenceDestroy
#define cublasLtMatmulPreferenceSetAttribute LtApi().cublasLtMatmulPreferenceSetAttribute
#define cublasLtMatmulAlgoGetHeuristic LtApi().cublasLtMatmulAlgoGetHeuristic
#define cublasLtMatmul LtApi().cublasLtMatmul

// What cuBLASLt's heuristics may use for split-K and stream-K: the 32 MiB
// NVIDIA recommends for Hopper.
constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;

struct Lt {
  cublasLtHandle_t handle = nullptr;
  std::string error;
};

const Lt& Handle() {
  static const Lt lt = [] {
    Lt out;
    if (!LtApi().error.empty()) {
      out.error = LtApi().error;
      return out;
    }
    const cublasStatus_t status = cublasLtCreate(&out.handle);
    if (status != CUBLAS_STATUS_SUCCESS) {
      out.error = std::string("cublasLtCreate: ") + cublasLtGetStatusString(status);
    }
    return out;
  }();
  return lt;
}

// Descriptors of one call, destroyed with it (each is a host-side struct).
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

// The largest power of two up to 256 that divides p's address: what the
// heuristic may assume of an operand (its default, 256, would pick kernels
// that fault on a view that starts at a column block of a wider row).
uint32_t Alignment(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

std::string Failed(const char* call, cublasStatus_t status) {
  return std::string(call) + ": " + cublasLtGetStatusString(status);
}

}  // namespace

std::string Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 BlasType type, const void* a, int64_t lda, const void* b, int64_t ldb, float beta,
                 float* c, int64_t ldc, const Stream& stream) {
  if (m == 0 || n == 0) return std::string();
  const Lt& lt = Handle();
  if (!lt.error.empty()) return lt.error;
  const cudaDataType_t ab = type == BlasType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  Descriptors d;
  cublasStatus_t s = cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (s != CUBLAS_STATUS_SUCCESS) return Failed("cublasLtMatmulDescCreate", s);
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a));
  cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b));
  // Layouts of the stored matrices, before op(): A is [k, m] when
  // transposed, else [m, k]; B [n, k] or [k, n].
  s = cublasLtMatrixLayoutCreate(&d.a, ab, trans_a ? k : m, trans_a ? m : k, lda);
  if (s != CUBLAS_STATUS_SUCCESS) return Failed("cublasLtMatrixLayoutCreate", s);
  s = cublasLtMatrixLayoutCreate(&d.b, ab, trans_b ? n : k, trans_b ? k : n, ldb);
  if (s != CUBLAS_STATUS_SUCCESS) return Failed("cublasLtMatrixLayoutCreate", s);
  s = cublasLtMatrixLayoutCreate(&d.c, CUDA_R_32F, m, n, ldc);
  if (s != CUBLAS_STATUS_SUCCESS) return Failed("cublasLtMatrixLayoutCreate", s);
  s = cublasLtMatmulPreferenceCreate(&d.pref);
  if (s != CUBLAS_STATUS_SUCCESS) return Failed("cublasLtMatmulPreferenceCreate", s);
  const uint64_t workspace_bytes = kBlasWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                       &workspace_bytes, sizeof(workspace_bytes));
  const uint32_t align_a = Alignment(a), align_b = Alignment(b), align_c = Alignment(c);
  cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                       sizeof(align_a));
  cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                       sizeof(align_b));
  cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                       sizeof(align_c));
  cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                       sizeof(align_c));
  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;
  s = cublasLtMatmulAlgoGetHeuristic(lt.handle, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &result,
                                     &found);
  if (s != CUBLAS_STATUS_SUCCESS) return Failed("cublasLtMatmulAlgoGetHeuristic", s);
  if (found == 0) return "cublasLtMatmulAlgoGetHeuristic: no algorithm for this shape";
  void* workspace = WorkspaceAllocate(kBlasWorkspaceBytes);
  s = cublasLtMatmul(lt.handle, d.op, &alpha, a, d.a, b, d.b, &beta, c, d.c, c, d.c, &result.algo,
                     workspace, kBlasWorkspaceBytes, static_cast<cudaStream_t>(stream.handle));
  WorkspaceFree(workspace, kBlasWorkspaceBytes);
  if (s != CUBLAS_STATUS_SUCCESS) return Failed("cublasLtMatmul", s);
  return std::string();
}

#else  // the SIMT harness: the definition of the product, summed in double

namespace {

double Element(BlasType type, const void* p, int64_t i) {
  if (type == BlasType::kF32) return static_cast<const float*>(p)[i];
  return Bf16Bits(static_cast<const uint16_t*>(p)[i]);
}

}  // namespace

std::string Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 BlasType type, const void* a, int64_t lda, const void* b, int64_t ldb, float beta,
                 float* c, int64_t ldc, const Stream& stream) {
  static_cast<void>(stream);
  // cuBLAS's argument checks, so that a wrong leading dimension fails here
  // as it would on the GPU.
  if (m < 0 || n < 0 || k < 0 || lda < (trans_a ? k : m) || ldb < (trans_b ? n : k) || ldc < m ||
      lda < 1 || ldb < 1 || ldc < 1) {
    return "Gemm: invalid value (a dimension or leading dimension)";
  }
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < m; ++i) {
      double sum = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double av = Element(type, a, trans_a ? p + i * lda : i + p * lda);
        const double bv = Element(type, b, trans_b ? j + p * ldb : p + j * ldb);
        sum += av * bv;
      }
      float& out = c[i + j * ldc];
      const float product = static_cast<float>(alpha * sum);
      out = beta == 0.0f ? product : product + beta * out;
    }
  }
  return std::string();
}

#endif  // __CUDACC__

}  // namespace deltaserve::kernels::cuda::DELTASERVE_CUDA_TARGET
