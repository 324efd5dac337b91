// The cuDNN library behind --attention cudnn, opened with dlopen on first use (like cuBLASLt in
// device_gpu.cu) so that llamatrain starts, and trains with our own attention, on machines without
// cuDNN. Candidates, first that loads wins: $LLAMATRAIN_CUDNN_LIBRARY alone when set (a path or a
// name; for a cuDNN outside the loader's search path, and for tests), otherwise the soname
// libcudnn.so.9 (LD_LIBRARY_PATH, the loader cache), then the CUDA toolkit's library directories
// (the one found at configure time, /usr/local/cuda/lib64), then the nvidia-cudnn Python wheel
// (PyTorch's CUDA builds install it). Plain C++ interface, so host-only code
// (tests) can ask without the CUDA flavour headers. Defined in cudnn_attention.cu (GPU build only).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace lt::cudnn {

// Where cuDNN is looked for, in order: $LLAMATRAIN_CUDNN_LIBRARY alone when set; otherwise the
// soname, the toolkit's library directories, then PyTorch's cuDNN wheel (site-packages/nvidia/cudnn/lib).
std::vector<std::string> library_candidates();

// cudnnGetVersion() of the loaded library, e.g. 91900 for 9.19.0 (loads it on the first call; no
// GPU needed). Throws lt::Error naming every path tried and why each failed when it cannot be
// loaded; a later call tries again.
size_t library_version();

// For tests without a GPU: describes the forward and backward attention graphs of one shape (dense
// (B, T, heads, hd) rows) and finalizes every tensor and operation descriptor, which is where cuDNN
// checks attribute types and that the operands' shapes fit each operation. Stops before the
// operation graph and its engines, which need a cuDNN handle and so a GPU. Throws lt::Error naming
// the first call cuDNN rejected.
void check_attention_descriptors(int B, int T, int H, int KVH, int hd);

}  // namespace lt::cudnn
