// The cuBLASLt entry points the CUDA backend calls (matmul.cu), as one table of function pointers
// with one implementation per build:
//   device_gpu.cu      the real library, opened with dlopen on the first product (a CPU run never
//                      maps its ~500 MB);
//   cublaslt_sim.cpp   an interpreter of the same descriptors on the CPU, for --device cuda-sim:
//                      operations, layouts (types, rows, columns, leading dimensions), alpha/beta
//                      and the workspace are taken from the descriptors exactly as the GPU
//                      library takes them, so CI runs the GPU build's matrix-product code.
#pragma once
#include <cublasLt.h>

#include "cuda_compat.cuh"

LT_CUDA_NAMESPACE_BEGIN

struct CublasLtApi {
  decltype(&::cublasLtGetStatusString) cublasLtGetStatusString = nullptr;
  decltype(&::cublasLtCreate) cublasLtCreate = nullptr;
  decltype(&::cublasLtMatmulDescCreate) cublasLtMatmulDescCreate = nullptr;
  decltype(&::cublasLtMatmulDescSetAttribute) cublasLtMatmulDescSetAttribute = nullptr;
  decltype(&::cublasLtMatmulDescDestroy) cublasLtMatmulDescDestroy = nullptr;
  decltype(&::cublasLtMatrixLayoutCreate) cublasLtMatrixLayoutCreate = nullptr;
  decltype(&::cublasLtMatrixLayoutDestroy) cublasLtMatrixLayoutDestroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceCreate) cublasLtMatmulPreferenceCreate = nullptr;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) cublasLtMatmulPreferenceSetAttribute = nullptr;
  decltype(&::cublasLtMatmulPreferenceDestroy) cublasLtMatmulPreferenceDestroy = nullptr;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) cublasLtMatmulAlgoGetHeuristic = nullptr;
  decltype(&::cublasLtMatmul) cublasLtMatmul = nullptr;
};

// The table of this build; throws lt::Error if the GPU library cannot be loaded.
const CublasLtApi& cublaslt_api();

LT_CUDA_NAMESPACE_END
