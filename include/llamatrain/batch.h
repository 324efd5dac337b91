// What a model's forward and backward read: one micro-batch's token arrays, as the data layer's
// loader makes them (loader.h) and the model consumes them (model.h).
#pragma once
#include <cstdint>

namespace lt {

// A batch of B rows of T tokens. targets/loss_mask/pos/seg_start may be null where noted.
struct Batch {
  int B = 0, T = 0;
  const int32_t* inputs = nullptr;     // (B,T)
  const int32_t* targets = nullptr;    // (B,T) next tokens
  const uint8_t* loss_mask = nullptr;  // (B,T) 1 = the target carries loss; null = all
  const int32_t* pos = nullptr;        // (B,T) RoPE positions; null = t
  const int32_t* seg_start = nullptr;  // (B,T) first key index each query may see; null = 0
};

}  // namespace lt
