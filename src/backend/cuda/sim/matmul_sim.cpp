// Simulator build of src/backend/cuda/matmul.cu for --device cuda-sim: the same descriptor code as
// on a GPU, its cuBLASLt calls answered by the interpreter in cublaslt_sim.cpp.
#include "../matmul.cu"
