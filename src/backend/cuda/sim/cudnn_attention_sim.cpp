// The simulator build's cuDNN attention (see ../cudnn_attention.h): cuDNN runs only on a GPU, so
// every entry point refuses, naming the option and the alternative (--device cuda-sim with
// --attention cudnn is already refused by train and by RegisteredModel::set_attention).
#include "backend/cuda/cudnn_attention.h"
#include "llamatrain/error.h"

LT_CUDA_NAMESPACE_BEGIN

void cudnn_attention_prepare() {
  fail("--attention cudnn runs only on a GPU (--device cuda): cuDNN is not available in the CUDA simulator "
       "(--device cuda-sim); use --attention native there");
}

void cudnn_attention_forward(const AttentionParams&, cudaStream_t) {
  fail("cuDNN attention runs only on a GPU (--device cuda), not in the CUDA simulator");
}
void cudnn_attention_backward(const AttentionParams&, cudaStream_t) {
  fail("cuDNN attention runs only on a GPU (--device cuda), not in the CUDA simulator");
}

LT_CUDA_NAMESPACE_END
