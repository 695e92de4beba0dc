#pragma once
// The CUDA examples' matrix products: cuBLAS (cublasSgemm in fp32; cublasGemmEx with bf16 inputs, an fp32 or bf16
// output and fp32 accumulation, on tensor cores), or (gemm_kind::plain) a plain GEMM kernel of the examples' own with
// the same meaning, which lets a whole step run where cuBLAS cannot: on the simulated GPU (tools/sim-check builds the
// examples with -DEXAMPLES_NO_CUBLAS, without cuBLAS at all).
#ifndef EXAMPLES_NO_CUBLAS
#include <cublas_v2.h>
#endif
#include <cuda_runtime_api.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <fsdp/fsdp.cuh>

namespace examples {

/// Which GEMM does the matrix products.
enum class gemm_kind { cublas, plain };

#ifndef EXAMPLES_NO_CUBLAS
#define EXAMPLES_CUBLAS_CHECK(...)                                                                      \
  do {                                                                                                  \
    const cublasStatus_t examples_st_ = (__VA_ARGS__);                                                  \
    if (examples_st_ != CUBLAS_STATUS_SUCCESS)                                                          \
      throw std::runtime_error(std::string("cuBLAS call '" #__VA_ARGS__ "' failed with status ") +      \
                               std::to_string(int(examples_st_)));                                      \
  } while (0)
#endif

/// Grid size for `work` elements at 256 threads per block (at most 1024 blocks; the kernels stride).
inline int blocks(long long work) { return (work + 255) / 256 < 1024 ? int((work + 255) / 256) : 1024; }

/// C = alpha op(A) op(B) + beta C, column-major with cuBLAS's arguments, A and B in T (float or fsdp::bfloat16), C
/// in CT (fp32, or T): one thread per element of C, the sum in fp32 in index order, each operation rounded once (no
/// fused multiply-add), the result rounded to CT once.
template <class T, class CT = float>
__global__ void plain_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const T* a, int lda, const T* b, int ldb,
                           float beta, CT* c, int ldc) {
  const long long count = (long long)m * n;  // 64-bit index math: m * n passes 2^31 for a large vocabulary's logits
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < count;
       e += (long long)gridDim.x * blockDim.x) {
    const long long i = e % m, j = e / m;
    float acc = 0.0f;
    for (long long p = 0; p < k; ++p) {
      const float x = static_cast<float>(ta ? a[p + i * lda] : a[i + p * lda]);
      const float y = static_cast<float>(tb ? b[j + p * ldb] : b[p + j * ldb]);
      acc = __fadd_rn(acc, __fmul_rn(x, y));
    }
    const float r = __fmul_rn(alpha, acc);
    c[i + j * ldc] = CT(beta == 0.0f ? r : __fadd_rn(r, __fmul_rn(beta, static_cast<float>(c[i + j * ldc]))));
  }
}

/// The matrix products of the example: cuBLAS, or plain_gemm with the same meaning.
class gemm {
 public:
  gemm(gemm_kind kind, cudaStream_t s) : kind_(kind), s_(s) {
#ifndef EXAMPLES_NO_CUBLAS
    if (kind_ == gemm_kind::cublas) {
      EXAMPLES_CUBLAS_CHECK(cublasCreate(&h_));
      if (const cublasStatus_t st = cublasSetStream(h_, s_); st != CUBLAS_STATUS_SUCCESS) {
        cublasDestroy(h_);  // the destructor does not run for a constructor that throws
        h_ = nullptr;
        EXAMPLES_CUBLAS_CHECK(st);
      }
    }
#else
    if (kind_ == gemm_kind::cublas)
      throw std::runtime_error("built without cuBLAS (EXAMPLES_NO_CUBLAS): use --gemm plain");
#endif
  }
  gemm(const gemm&) = delete;
  gemm& operator=(const gemm&) = delete;
  ~gemm() {
#ifndef EXAMPLES_NO_CUBLAS
    if (h_) cublasDestroy(h_);
#endif
  }
  /// cublasSgemm(h, ta ? T : N, tb ? T : N, m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc)
  void operator()(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
                  float beta, float* c, int ldc) {
#ifndef EXAMPLES_NO_CUBLAS
    if (kind_ == gemm_kind::cublas) {
      EXAMPLES_CUBLAS_CHECK(cublasSgemm(h_, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
                                        &alpha, a, lda, b, ldb, &beta, c, ldc));
      return;
    }
#endif
    plain(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  /// The same with A and B in bf16 and C in fp32, accumulated in fp32: cublasGemmEx(..., CUDA_R_16BF, ...,
  /// CUDA_R_32F, ..., CUBLAS_COMPUTE_32F), as PyTorch's bf16 autocast runs a linear layer.
  void operator()(bool ta, bool tb, int m, int n, int k, float alpha, const fsdp::bfloat16* a, int lda,
                  const fsdp::bfloat16* b, int ldb, float beta, float* c, int ldc) {
    bf16_product(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  /// The same with C in bf16 too (accumulated in fp32, rounded once): a linear layer's output as PyTorch's bf16
  /// autocast keeps it.
  void operator()(bool ta, bool tb, int m, int n, int k, float alpha, const fsdp::bfloat16* a, int lda,
                  const fsdp::bfloat16* b, int ldb, float beta, fsdp::bfloat16* c, int ldc) {
    bf16_product(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }

 private:
  /// bf16 A and B, C in CT (fp32 or bf16), fp32 accumulation: cublasGemmEx, or the plain kernel.
  template <class CT>
  void bf16_product(bool ta, bool tb, int m, int n, int k, float alpha, const fsdp::bfloat16* a, int lda,
                    const fsdp::bfloat16* b, int ldb, float beta, CT* c, int ldc) {
#ifndef EXAMPLES_NO_CUBLAS
    if (kind_ == gemm_kind::cublas) {
      const cudaDataType_t ct = std::is_same_v<CT, float> ? CUDA_R_32F : CUDA_R_16BF;
      EXAMPLES_CUBLAS_CHECK(cublasGemmEx(h_, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
                                         &alpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &beta, c, ct, ldc,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      return;
    }
#endif
    plain(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  template <class T, class CT>
  void plain(bool ta, bool tb, int m, int n, int k, float alpha, const T* a, int lda, const T* b, int ldb, float beta,
             CT* c, int ldc) {
    // at least one block: a product of no rows (an expert that received none) launches all the same
    plain_gemm<T, CT>
        <<<std::max(1, blocks((long long)m * n)), 256, 0, s_>>>(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    FSDP_CUDA_CHECK(cudaGetLastError());
  }

  gemm_kind kind_;
  cudaStream_t s_;
#ifndef EXAMPLES_NO_CUBLAS
  cublasHandle_t h_ = nullptr;
#endif
};

}  // namespace examples
