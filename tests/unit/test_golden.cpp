// PyTorch as an outside oracle: the fixtures in tests/golden/ (written by
// tools/make-golden, see tests/golden/README.md) hold hetrain's own initial weights, the
// batches, and what float64 PyTorch computes from them: the loss and every gradient at
// the initial weights, and the parameters after a few AdamW steps with weight decay,
// clipping by the global norm and the warm-up/cosine schedule. Here the same steps run
// through the executor that `hetrain train` steps with, and each tensor is compared by
//   relative error = ||hetrain - pytorch||_2 / ||pytorch||_2
// (per tensor: an element-wise relative error on a near-zero gradient entry measures
// only rounding). Limits: 1e-5 on the loss and the gradients, 1e-4 on the parameters.
// The reference is float64, so these errors are hetrain's float32 rounding alone; AdamW
// divides by sqrt(v) and so magnifies it in the parameters, hence their looser limit.
//
// The device: the CPU, or what HETRAIN_GOLDEN_DEVICE names ("cuda", "cuda:N"), as
// tools/gpu-check runs these cases on a GPU. The limits are the same there: the CUDA
// backend keeps TF32 off (cuBLAS and cuDNN in FMA math), so a GPU's products round as
// float32 does, in another order.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "backend/cuda/device_select.h"
#include "comm/local_communicator.h"
#include "config/config.h"
#include "nn/layernorm.h"
#include "golden_dir.h"
#include "ops/ops.h"
#include "optim/lr_schedule.h"
#include "runtime/executor.h"
#include "runtime/safetensors.h"
#include "runtime/task.h"
#include "tests/golden/golden_model.h"

namespace ht {
namespace {

constexpr double kLossGradLimit = 1e-5;
constexpr double kParamLimit = 1e-4;

// The fixtures' device (see the top); a name that cannot be met fails the first case
// with device selection's message.
Backend& golden_device() {
  static Backend* device = [] {
    const char* e = std::getenv("HETRAIN_GOLDEN_DEVICE");
    if (!e || !*e || std::string(e) == "cpu") return &cpu_backend();
    return select_device(e, 0).backend;
  }();
  return *device;
}

struct Fixture {
  std::string path;
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
  config::Config cfg;
  int64_t run_steps = 0;

  const Tensor& at(const std::string& name) const {
    auto it = tensors.find(name);
    HT_CHECK(it != tensors.end(), "golden fixture ", path, " has no tensor '", name,
             "'; regenerate it with tools/make-golden");
    return it->second;
  }
};

// Read through the plain safetensors layer: the fixtures are PyTorch's files and carry no
// hetrain checkpoint checksum.
Fixture read_fixture(const std::string& name) {
  Fixture f;
  f.path = std::string(HETRAIN_GOLDEN_DIR) + "/" + name + ".safetensors";
  std::ifstream in(f.path, std::ios::binary);
  HT_CHECK(in.is_open(), "golden fixture ", f.path, " cannot be opened; expected the file "
           "tools/make-golden writes (it is kept in git)");
  const std::string bytes{std::istreambuf_iterator<char>(in), {}};
  HT_CHECK(bytes.size() >= runtime::safetensors::kLengthBytes, "golden fixture ", f.path, " is ",
           bytes.size(), " bytes; expected a safetensors file");
  const uint64_t n = runtime::safetensors::decode_length(reinterpret_cast<const unsigned char*>(bytes.data()));
  const size_t head = runtime::safetensors::kLengthBytes;
  HT_CHECK(n <= bytes.size() - head, "golden fixture ", f.path, ": header length ", n,
           " runs past the file's ", bytes.size(), " bytes");
  const runtime::safetensors::Header h = runtime::safetensors::parse_header(
      std::string_view(bytes).substr(head, n), bytes.size() - head - n);
  const char* data = bytes.data() + head + n;
  for (const auto& e : h.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype, cpu_backend());
    std::memcpy(t.raw(), data + e.begin, e.end - e.begin);
    f.tensors.emplace(e.name, t);
  }
  f.metadata = h.metadata;
  if (f.metadata.contains("config")) {  // a model's fixture
    f.cfg = config::parse_config(f.metadata.at("config"), name + ".json");
    f.run_steps = std::stoll(f.metadata.at("run_steps"));
  }
  return f;
}

// The fixture's batches by stream position: rows [first, first + count).
class FixtureTask : public runtime::TrainingOnlyTask {
 public:
  explicit FixtureTask(const Fixture& f)
      : TrainingOnlyTask(golden_device()), f_(f), inputs_(f.at("batch.inputs")), targets_(f.at("batch.targets")) {}

  nn::Sequential build_model(uint64_t) const override { return golden::build_model(f_.cfg); }
  int64_t train_size() const override { return inputs_.shape()[0]; }
  int64_t predictions_per_sample() const override {
    return targets_.dim() == 1 ? 1 : targets_.shape()[1];
  }
  runtime::Batch train_batch(int64_t first, int64_t count) override {
    HT_CHECK(first >= 0 && first + count <= train_size(), "golden fixture ", f_.path,
             " holds ", train_size(), " samples; asked for [", first, ", ", first + count, ")");
    return {contiguous(slice(inputs_, 0, first, first + count)).to(device()),
            contiguous(slice(targets_, 0, first, first + count)).to(device())};
  }

 private:
  const Fixture& f_;
  Tensor inputs_, targets_;
};

double norm2(const std::vector<float>& a) {
  double s = 0;
  for (float x : a) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

double relative_error(const Tensor& got, const Tensor& want) {
  const std::vector<float> a = got.to_vector(), b = want.to_vector();
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = static_cast<double>(a[i]) - b[i];
    d += e * e;
  }
  return std::sqrt(d) / norm2(b);
}

// A model with the fixture's initial weights.
nn::Sequential initial_model(const Fixture& f) {
  nn::Sequential model = golden::build_model(f.cfg);
  for (const auto& [name, p] : model.named_parameters()) {
    const Tensor& init = f.at("init." + name);
    REQUIRE_MESSAGE(init.shape() == p.shape(), "parameter '", name, "' is ", to_string(p.shape()),
                    " in the model and ", to_string(init.shape()), " in ", f.path);
    std::memcpy(p.data(), init.data(), static_cast<size_t>(p.numel()) * sizeof(float));
  }
  return model;
}

optim::LrSchedule schedule_of(const config::TrainConfig& t) {
  // As the trainer builds it (runtime/trainer.cpp), over train.steps.
  return {t.schedule.type, t.optimizer.lr, t.schedule.warmup_steps, t.schedule.min_lr, *t.steps};
}

// How far AdamW can move an element that starts at 0, whatever its gradients, over steps
// with learning rates `lrs`. Step t moves it by lr_t |m_hat| / (sqrt(v_hat) + eps), and by
// Cauchy-Schwarz over the gradient history
//   |m_t| / sqrt(v_t) <= (1 - b1) / sqrt(1 - b2) * sqrt(sum_{k<t} (b1^2 / b2)^k),
// with m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t); weight decay only shrinks |p|.
double adamw_reach(const config::OptimizerConfig& o, const std::vector<float>& lrs) {
  const double b1 = o.beta1, b2 = o.beta2;
  double reach = 0, geometric = 0;
  for (size_t i = 0; i < lrs.size(); ++i) {
    const auto t = static_cast<double>(i + 1);
    geometric += std::pow(b1 * b1 / b2, t - 1);
    const double ratio = (1 - b1) / std::sqrt(1 - b2) * std::sqrt(geometric) *
                         std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
    reach += lrs[i] * ratio;
  }
  return reach;
}

// The plan `hetrain train` makes for one process: the whole batch in train.micro_batches.
plan::Plan plan_of(const nn::Sequential& model, const config::TrainConfig& t) {
  return runtime::single_process_plan(static_cast<int>(model.size()), t.batch_size,
                                      static_cast<int>(t.micro_batches));
}

struct Worst {
  double error = 0;
  std::string name;
  void see(double e, const std::string& n) {
    if (e > error) error = e, name = n;
  }
};

void check_against_pytorch(const std::string& fixture_name) {
  const Fixture f = read_fixture(fixture_name);
  const config::TrainConfig& train = f.cfg.train;
  REQUIRE_MESSAGE(train.optimizer.type == "adamw", f.path, " trains with ", train.optimizer.type,
                  "; expected adamw");
  const optim::LrSchedule schedule = schedule_of(train);
  FixtureTask task(f);
  comm::LocalCommunicator world;
  const int64_t batch = train.batch_size;
  const double predictions = static_cast<double>(batch * task.predictions_per_sample());

  // The loss and the gradients at the initial weights, from one executor step. The
  // executor drops the gradients when the step ends, but AdamW's first moment after its
  // first update is (1 - beta1) * g, one float rounding from g: dividing by the same
  // float (1 - beta1) gives back g to an ulp. Clipping is off in this step, so that g is
  // the raw gradient; the clipped steps below check the clipping.
  {
    nn::Sequential model = initial_model(f);
    config::TrainConfig raw = train;
    raw.grad_clip = 0.f;
    const plan::Plan plan = plan_of(model, train);
    runtime::Executor executor(plan, model, task, world, raw, std::chrono::seconds(1));
    const runtime::StepResult r = executor.step(0, schedule.at(0), false);
    const double loss = r.loss_sum / predictions;
    const double want = f.at("loss").item();
    const double loss_error = std::abs(loss - want) / std::abs(want);
    INFO(f.path, ": loss ", loss, " against PyTorch's ", want);
    CHECK(loss_error <= kLossGradLimit);

    std::map<std::string, Tensor> state;
    for (const auto& [name, t] : executor.optimizer()->state()) state.emplace(name, t);
    const float one_minus_beta1 = 1.f - train.optimizer.beta1;
    Worst worst;
    for (const auto& [name, p] : executor.parameters()) {
      // Divided element-wise: a multiply by the reciprocal would round twice.
      std::vector<float> m = state.at(name + ".exp_avg").to_vector();
      for (float& x : m) x /= one_minus_beta1;
      const double e = relative_error(Tensor::from_vector(m, p.shape(), cpu_backend()), f.at("grad." + name));
      worst.see(e, name);
      INFO(f.path, ": gradient of '", name, "' has relative error ", e);
      CHECK(e <= kLossGradLimit);
    }
    if (std::getenv("HETRAIN_GOLDEN_VERBOSE"))
      std::printf("%s: loss rel. error %.3g; largest gradient rel. error %.3g (%s)\n",
                  fixture_name.c_str(), loss_error, worst.error, worst.name.c_str());
  }

  // The training steps, clipped, with the schedule's learning rates.
  nn::Sequential model = initial_model(f);
  const plan::Plan plan = plan_of(model, train);
  runtime::Executor executor(plan, model, task, world, train, std::chrono::seconds(1));
  const std::vector<float> lrs = f.at("steps.lr").to_vector();
  const std::vector<float> losses = f.at("steps.loss").to_vector();
  REQUIRE(static_cast<int64_t>(lrs.size()) == f.run_steps);
  Worst worst_loss;
  for (int64_t step = 0; step < f.run_steps; ++step) {
    const float lr = schedule.at(step);
    INFO(f.path, ": step ", step, " learning rate ", lr, " against PyTorch's ", lrs[step]);
    CHECK(std::abs(lr - lrs[step]) <= 1e-6 * lrs[step]);
    const runtime::StepResult r = executor.step(step * batch, lr, false);
    const double e = std::abs(r.loss_sum / predictions - losses[step]) / std::abs(losses[step]);
    worst_loss.see(e, "step " + std::to_string(step));
    INFO(f.path, ": step ", step, " loss ", r.loss_sum / predictions, " against PyTorch's ", losses[step]);
    CHECK(e <= kLossGradLimit);
  }
  Worst worst;
  for (const auto& [name, p] : executor.parameters()) {
    const Tensor& want = f.at("final." + name);
    if (name.ends_with("attn.qkv.bias")) {
      // The key bias has an exact gradient of 0: it adds q . b_k to every score of a row,
      // which the softmax ignores. Its float32 gradient is rounding noise (about 1e-7 of
      // the query bias's), and AdamW scales noise below eps up to steps of up to ~lr, so
      // its value after the steps is noise in any float32 implementation (PyTorch's own
      // float32 run differs from its float64 one by 4e-4 on this tensor). The query and
      // value parts are compared as tensors of their own; the key part must stay within
      // what AdamW can move a parameter that starts at 0.
      const int64_t c = p.shape()[0] / 3;
      for (int64_t part : {0, 2}) {
        const std::string label = name + (part == 0 ? " (query part)" : " (value part)");
        const double e = relative_error(slice(p, 0, part * c, (part + 1) * c),
                                        slice(want, 0, part * c, (part + 1) * c));
        worst.see(e, label);
        INFO(f.path, ": parameter '", label, "' after ", f.run_steps, " steps has relative error ", e);
        CHECK(e <= kParamLimit);
      }
      const double bound = adamw_reach(train.optimizer, lrs);
      for (float k : slice(p, 0, c, 2 * c).to_vector()) {
        INFO(f.path, ": an element of '", name, "' (key part) is ", k, "; AdamW can move it at most ", bound);
        CHECK(std::abs(k) <= bound);
      }
      continue;
    }
    const double e = relative_error(p, want);
    worst.see(e, name);
    INFO(f.path, ": parameter '", name, "' after ", f.run_steps, " steps has relative error ", e);
    CHECK(e <= kParamLimit);
  }
  if (std::getenv("HETRAIN_GOLDEN_VERBOSE"))
    std::printf("%s: largest step-loss rel. error %.3g (%s); largest parameter rel. error after %lld steps %.3g (%s)\n",
                fixture_name.c_str(), worst_loss.error, worst_loss.name.c_str(),
                static_cast<long long>(f.run_steps), worst.error, worst.name.c_str());
}

// One op's result against PyTorch's, by the same relative error.
void check_op(const Fixture& f, const std::string& what, const Tensor& got, const std::string& want) {
  const double e = relative_error(got, f.at(want));
  INFO(f.path, ": ", what, " has relative error ", e, " against PyTorch's ", want);
  CHECK(e <= kLossGradLimit);
  if (std::getenv("HETRAIN_GOLDEN_VERBOSE")) std::printf("ops: %s rel. error %.3g\n", what.c_str(), e);
}

}  // namespace

// The models at their initial weights keep some ops in a narrow range: the GPT's GELU
// inputs stay near 0, where the tanh and erf forms agree to 1e-9. These cases take each op
// over the range where its definition shows.
TEST_CASE("golden: GELU, LayerNorm and cross-entropy match PyTorch over wide input ranges") {
  const Fixture f = read_fixture("ops");
  Backend& dev = golden_device();
  const auto on_device = [&](const std::string& name) { return f.at(name).to(dev); };
  {
    Tensor x = on_device("gelu.x").detach().set_requires_grad();
    Tensor y = gelu(x);
    check_op(f, "gelu over [-8, 8]", y, "gelu.y");
    y.backward(on_device("gelu.gy"));
    check_op(f, "gelu's input gradient", x.grad(), "gelu.gx");
  }
  {
    const Tensor& gamma = f.at("layernorm.gamma");
    // The layer as the models build it, so that its default eps is the one compared.
    nn::LayerNorm ln(gamma.shape()[0]);
    const std::vector<nn::NamedTensor> params = ln.named_parameters();  // weight, bias
    std::memcpy(params[0].second.data(), gamma.data(), static_cast<size_t>(gamma.numel()) * sizeof(float));
    std::memcpy(params[1].second.data(), f.at("layernorm.beta").data(),
                static_cast<size_t>(gamma.numel()) * sizeof(float));
    for (const auto& [name, p] : params) p.rehome(dev, false);
    Tensor x = on_device("layernorm.x").detach().set_requires_grad();
    Tensor y = ln.forward(x);
    check_op(f, "layernorm on rows of std 1e-3 to 100", y, "layernorm.y");
    y.backward(on_device("layernorm.gy"));
    check_op(f, "layernorm's input gradient", x.grad(), "layernorm.gx");
    check_op(f, "layernorm's weight gradient", params[0].second.grad(), "layernorm.ggamma");
    check_op(f, "layernorm's bias gradient", params[1].second.grad(), "layernorm.gbeta");
  }
  {
    Tensor logits = on_device("cross_entropy.logits").detach().set_requires_grad();
    const Tensor labels = on_device("cross_entropy.labels");
    // As the executor forms the loss: summed, then scaled by 1 / predictions.
    Tensor loss = mul(runtime::summed_loss(logits, labels), 1.f / static_cast<float>(labels.numel()));
    check_op(f, "cross-entropy with logits up to ~60", loss, "cross_entropy.loss");
    loss.backward();
    check_op(f, "cross-entropy's logit gradient", logits.grad(), "cross_entropy.glogits");
  }
}

TEST_CASE("golden: the MLP's loss, gradients and AdamW steps match PyTorch") {
  check_against_pytorch("fashion_mnist_mlp");
}

TEST_CASE("golden: the CNN's loss, gradients and AdamW steps match PyTorch") {
  check_against_pytorch("fashion_mnist_cnn");
}

TEST_CASE("golden: the GPT's loss, gradients and AdamW steps match PyTorch") {
  check_against_pytorch("text_gpt_tiny");
}

}  // namespace ht
