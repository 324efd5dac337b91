// matmul forward/backward on the CPU: out = x @ w^T (PyTorch Linear without bias) through BLAS.
#include <algorithm>

#include "backend/cpu/blas.h"
#include "llamatrain/ops_cpu.h"

namespace lt::cpu {

template <class T>
void matmul_forward(T* out /*(N,OC)*/, const T* x /*(N,IC)*/, const T* w /*(OC,IC)*/, int N, int IC,
                    int OC) {
  if (N <= 0 || OC <= 0) return;
  // BLAS rejects a leading dimension of 0; an empty reduction gives zeros.
  if (IC <= 0) {
    std::fill(out, out + static_cast<size_t>(N) * OC, T(0));
    return;
  }
  // out (N,OC) = x (N,IC) * w^T (IC,OC)
  blas::gemm(false, true, N, OC, IC, T(1), x, IC, w, IC, T(0), out, OC);
}

template <class T>
void matmul_backward(T* dx /*(N,IC) =*/, T* dw /*(OC,IC) += or null*/, const T* dout /*(N,OC)*/,
                     const T* x /*(N,IC)*/, const T* w /*(OC,IC)*/, int N, int IC, int OC) {
  if (N <= 0 || IC <= 0) return;
  if (OC <= 0) {
    if (dx) std::fill(dx, dx + static_cast<size_t>(N) * IC, T(0));
    return;
  }
  // dx (N,IC) = dout (N,OC) * w (OC,IC)
  if (dx) blas::gemm(false, false, N, IC, OC, T(1), dout, OC, w, IC, T(0), dx, IC);
  // dw (OC,IC) += dout^T (OC,N) * x (N,IC); none for a frozen weight (null dw)
  if (dw) blas::gemm(true, false, OC, IC, N, T(1), dout, OC, x, IC, T(1), dw, IC);
}

template void matmul_forward<float>(float*, const float*, const float*, int, int, int);
template void matmul_forward<double>(double*, const double*, const double*, int, int, int);
template void matmul_backward<float>(float*, float*, const float*, const float*, const float*, int,
                                     int, int);
template void matmul_backward<double>(double*, double*, const double*, const double*, const double*,
                                      int, int, int);

}  // namespace lt::cpu
