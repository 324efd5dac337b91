// Simulator build of src/backend/cuda/device_zero_blocks.cu (see pass_ops_sim.cpp).
#include "../device_zero_blocks.cu"
