// Simulator build of src/backend/cuda/register.cu (see pass_ops_sim.cpp).
#include "../register.cu"
