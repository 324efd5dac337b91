// libFuzzer target: the safetensors header parser and the fp32 conversion on arbitrary bytes, as
// if they were a whole file. An lt::Error is a correct refusal; a crash, a sanitizer report, any
// other exception, or an allocation beyond -malloc_limit_mb (i.e. sized by the header rather
// than by the bytes actually present) is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "llamatrain/error.h"
#include "llamatrain/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace st = lt::safetensors;
  const std::string_view file(reinterpret_cast<const char*>(data), size);
  try {
    const st::Header h = st::parse(file, "fuzz.safetensors");
    std::vector<float> out;
    for (const auto& t : h.tensors) {
      // Validated: the tensor's bytes lie inside `file`, so numel is bounded by the input size.
      out.resize(t.numel());
      try {
        st::convert_to_f32(out.data(), t, file.data() + h.data_start + t.begin, "fuzz.safetensors");
      } catch (const lt::Error&) {  // a dtype that is not a float weight
      }
    }
  } catch (const lt::Error&) {
  }
  return 0;
}
