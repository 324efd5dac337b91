// Simulator wrapper: compiles kernels/attention_decode.cu as host C++ against sim/cuda_sim.h
// (DESIGN.md, "Testing without a GPU"; the only place a .cu is #included).
#include "../attention_decode.cu"
