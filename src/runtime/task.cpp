#include "runtime/task.h"

#include "ops/ops.h"
#include "runtime/image_task.h"
#include "runtime/text_task.h"

namespace ht::runtime {

std::unique_ptr<Task> make_task(const config::Config& cfg) {
  if (cfg.data.dataset == "text") return std::make_unique<TextTask>(cfg);
  return std::make_unique<ImageTask>(cfg);
}

Tensor summed_loss(const Tensor& logits, const Tensor& targets) {
  int64_t classes = logits.shape().back();
  return cross_entropy(reshape(logits, {-1, classes}), reshape(targets, {-1}), Reduction::sum);
}

}  // namespace ht::runtime
