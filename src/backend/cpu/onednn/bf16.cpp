// fp32 -> bf16 conversion of a whole buffer (bf16.h).
#include "backend/cpu/onednn/bf16.h"

#include <cstddef>

namespace lt::cpu {

void convert_to_bf16(bf16* dst, const float* src, size_t n) {
  const std::ptrdiff_t m = std::ptrdiff_t(n);
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < m; ++i) dst[i] = float_to_bf16(src[i]);
}

}  // namespace lt::cpu
