// Simulator wrapper: compiles kernels/elementwise.cu as host C++ against sim/cuda_sim.h (DESIGN.md,
// "Testing without a GPU"; the only place a .cu is #included).
#include "../elementwise.cu"
