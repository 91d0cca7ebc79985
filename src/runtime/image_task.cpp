// Image classification on Fashion-MNIST with the MLP or the CNN.
#include <cstdio>

#include "core/error.h"
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

int64_t ImageTask::eval_chunks() const {
  return data::ImageEvalIterator(data_.test, cfg_.train.eval_batch_size, cfg_.train.eval_max_samples, device()).chunks();
}

// Each chunk's summed loss, correct predictions and images.
std::vector<double> ImageTask::evaluate_chunks(const nn::Sequential& model, int64_t first, int64_t end) const {
  data::ImageEvalIterator it(data_.test, cfg_.train.eval_batch_size, cfg_.train.eval_max_samples, device());
  it.seek_chunk(first);
  data::ImageBatch b;
  std::vector<double> sums;
  for (int64_t chunk = first; chunk < end && it.next(b); ++chunk) {
    Tensor logits = model.forward(b.inputs);  // (n, classes)
    const double loss = summed_loss(logits, b.labels).item();
    std::vector<float> l = logits.to_vector();
    std::vector<int32_t> y = b.labels.to_ints();
    int64_t classes = logits.size(1);
    double correct = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      const float* row = l.data() + i * classes;
      int64_t best = 0;
      for (int64_t c = 1; c < classes; ++c)
        if (row[c] > row[best]) best = c;
      correct += best == y[i];
    }
    sums.insert(sums.end(), {loss, correct, static_cast<double>(y.size())});
  }
  return sums;
}

EvalResult ImageTask::eval_result(const std::vector<double>& sums) const {
  HT_CHECK(sums.size() % 3 == 0, "ImageTask: ", sums.size(), " evaluation sums; expected 3 a chunk");
  double loss = 0, correct = 0, seen = 0;
  for (size_t k = 0; k < sums.size(); k += 3) loss += sums[k], correct += sums[k + 1], seen += sums[k + 2];
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
