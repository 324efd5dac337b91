#include "llamatrain/model_check.h"

#include <algorithm>
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
  // load_model checked the sizes; a short buffer is checked as far as it goes.
  check_finite_parameters(model.source.empty() ? std::string("model") : model.source, layout, 0,
                          std::min(model.params.size(), layout.total()), model.params.data());
}

void check_finite_parameters(const std::string& source, const ParameterLayout& layout, size_t begin, size_t end,
                             const float* values) {
  for (const TensorInfo& t : layout.tensors()) {
    const size_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
    for (size_t k = lo; k < hi; ++k) {
      const float v = values[k - begin];
      if (std::isfinite(v)) continue;
      const size_t i = k - t.offset;
      fail(strcat(source, ": parameter ", t.name, index_text(t.shape, i), " (element ", i, " of ", t.numel, ") is ",
                  v, "; every weight must be a finite number (a damaged file, or saved from a run that diverged)"));
    }
  }
}

}  // namespace lt
