// libFuzzer target: the llama2.c v0 parser on arbitrary bytes as a whole file, and its header
// check against a file size taken from the input (the size a file on disk would report). An
// lt::Error is a correct refusal; a crash, a sanitizer report, any other exception, or an
// allocation beyond -malloc_limit_mb (one sized by the header alone) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "llamatrain/error.h"
#include "llamatrain/llama2c.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view file(reinterpret_cast<const char*>(data), size);
  try {
    const lt::ModelData m = lt::llama2c_parse(file, "fuzz.bin");
    (void)m;
  } catch (const lt::Error&) {
  }
  // The header against an arbitrary claimed size: must only ever accept or refuse, never
  // overflow while computing the size the header implies.
  if (size >= lt::kLlama2cHeaderBytes + 8) {
    uint64_t claimed = 0;
    std::memcpy(&claimed, data + lt::kLlama2cHeaderBytes, 8);
    try {
      lt::llama2c_parse_header(file, claimed, "fuzz.bin");
    } catch (const lt::Error&) {
    }
  }
  return 0;
}
