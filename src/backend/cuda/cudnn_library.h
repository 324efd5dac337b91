// The cuDNN library behind --attention cudnn, opened with dlopen on first use (like cuBLASLt in
// device_gpu.cu) so that llamatrain starts, and trains with our own attention, on machines without
// cuDNN. Candidates, first that loads wins: $LLAMATRAIN_CUDNN_LIBRARY alone when set (a path or a
// name; for a cuDNN outside the loader's search path, and for tests), otherwise the soname
// libcudnn.so.9 (LD_LIBRARY_PATH, the loader cache), then the CUDA toolkit's library directories
// (the one found at configure time, /usr/local/cuda/lib64). Plain C++ interface, so host-only code
// (tests) can ask without the CUDA flavour headers. Defined in cudnn_attention.cu (GPU build only).
#pragma once
#include <cstddef>

namespace lt::cudnn {

// cudnnGetVersion() of the loaded library, e.g. 91900 for 9.19.0 (loads it on the first call; no
// GPU needed). Throws lt::Error naming every path tried and why each failed when it cannot be
// loaded; a later call tries again.
size_t library_version();

}  // namespace lt::cudnn
