// Image classification on Fashion-MNIST with the MLP or the CNN.
#include <cstdio>

#include "data/batch.h"
#include "data/image_dataset.h"
#include "ops/ops.h"
#include "runtime/image_task.h"

namespace ht::runtime {

ImageTask::ImageTask(const config::Config& cfg, Backend& device)
    : Task(device),
      cfg_(cfg),
      data_(data::load_fashion_mnist(cfg.data.dir)),
      sampler_(data_.train.size(), cfg.train.seed) {}

nn::Sequential ImageTask::build_model(uint64_t seed) const {
  return runtime::build_model(cfg_, seed);
}

Batch ImageTask::train_batch(int64_t first, int64_t count) {
  data::ImageBatch b = data::make_image_batch(data_.train, sampler_, first, count, device());
  return {b.inputs, b.labels};
}

EvalResult ImageTask::evaluate(const nn::Sequential& model) const {
  data::ImageEvalIterator it(data_.test, cfg_.train.eval_batch_size, cfg_.train.eval_max_samples,
                           device());
  data::ImageBatch b;
  double loss = 0, correct = 0, seen = 0;
  while (it.next(b)) {
    Tensor logits = model.forward(b.inputs);  // (n, classes)
    loss += summed_loss(logits, b.labels).item();
    std::vector<float> l = logits.to_vector();
    std::vector<int32_t> y = b.labels.to_ints();
    int64_t classes = logits.size(1);
    for (size_t i = 0; i < y.size(); ++i) {
      const float* row = l.data() + i * classes;
      int64_t best = 0;
      for (int64_t c = 1; c < classes; ++c)
        if (row[c] > row[best]) best = c;
      correct += best == y[i];
    }
    seen += static_cast<double>(y.size());
  }
  EvalResult r;
  r.metrics = {{"test_accuracy", correct / seen}, {"test_loss", loss / seen},
               {"test_samples", seen}};
  char line[128];
  std::snprintf(line, sizeof line, "test accuracy %.2f%%, test loss %.4f (%.0f images)",
                100 * correct / seen, loss / seen, seen);
  r.line = line;
  return r;
}

}  // namespace ht::runtime
