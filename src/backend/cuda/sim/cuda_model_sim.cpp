// Simulator build of src/backend/cuda/cuda_model.cu for --device cuda-sim (DESIGN.md, "Testing without a
// GPU"): the same source compiled as host C++ against kernels/sim/cuda_sim.h.
#include "../cuda_model.cu"
