#include "llamatrain/model_check.h"

#include <cmath>
#include <sstream>

#include "llamatrain/error.h"
#include "llamatrain/model.h"

namespace lt {

namespace {

// "[3, 17]": the row-major multi-index of flat element i of a tensor of this shape.
std::string index_text(const std::vector<int64_t>& shape, size_t i) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = int64_t(i % size_t(shape[d]));
    i /= size_t(shape[d]);
  }
  std::ostringstream os;
  os << '[';
  for (size_t d = 0; d < idx.size(); ++d) os << (d ? ", " : "") << idx[d];
  os << ']';
  return os.str();
}

}  // namespace

void check_finite_parameters(const ModelData& model) {
  const ParameterLayout layout(model.config);
  for (const TensorInfo& t : layout.tensors()) {
    if (t.offset + t.numel > model.params.size()) break;  // load_model checked the sizes
    const float* p = model.params.data() + t.offset;
    for (size_t i = 0; i < t.numel; ++i) {
      if (std::isfinite(p[i])) continue;
      fail(strcat(model.source.empty() ? std::string("model") : model.source, ": parameter ", t.name,
                  index_text(t.shape, i), " (element ", i, " of ", t.numel, ") is ", p[i],
                  "; every weight must be a finite number (a damaged file, or saved from a run that diverged)"));
    }
  }
}

}  // namespace lt
