// libFuzzer target: config.json parsing (hf_config_from_json) on arbitrary bytes, and a property:
// any config it accepts survives hf_config_to_json -> hf_config_from_json unchanged. An lt::Error
// is a correct refusal; a crash, a sanitizer report, any other exception or a changed config
// (abort) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "llamatrain/error.h"
#include "llamatrain/hf_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  lt::Llama2Config c;
  try {
    c = lt::hf_config_from_json(text, "fuzz/config.json");
  } catch (const lt::Error&) {
    return 0;
  }
  const lt::Llama2Config again = lt::hf_config_from_json(lt::hf_config_to_json(c, false), "round trip");
  if (again.to_string() != c.to_string() || again.norm_eps != c.norm_eps || again.rope_theta != c.rope_theta) {
    std::fprintf(stderr, "config changed in a round trip:\n  %s\n  %s\n", c.to_string().c_str(),
                 again.to_string().c_str());
    std::abort();
  }
  return 0;
}
