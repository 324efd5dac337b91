// No garbage out: a model whose parameters hold NaN or infinity is refused where it is loaded
// (train --init-from, eval, generate, convert), instead of training to NaN or generating '⁇'.
#pragma once
#include <cstddef>
#include <string>

#include "llamatrain/model.h"
#include "llamatrain/model_io.h"

namespace lt {

// Throws lt::Error naming the model file, the first tensor (ParameterLayout order) with a
// non-finite element, that element's index and value, e.g.
// "m.bin: parameter layers.0.attention.wq.weight[3, 17] (element 209 of 4096) is nan; ...".
void check_finite_parameters(const ModelData& model);
// The same for the flat elements [begin, end) of a model of this layout (values[0] is element
// begin): a ZeRO-3 rank's shard, named as from `source`.
void check_finite_parameters(const std::string& source, const ParameterLayout& layout, size_t begin, size_t end,
                             const float* values);

}  // namespace lt
