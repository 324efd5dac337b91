// Simulator build of src/backend/cuda/cuda_decoder.cu for --device cuda-sim (DESIGN.md, "Testing
// without a GPU"): the same source compiled as host C++ against kernels/sim/cuda_sim.h.
#include "../cuda_decoder.cu"
