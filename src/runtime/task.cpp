#include "runtime/task.h"

#include "data/text_corpus.h"
#include "models/models.h"
#include "nn/conv_block.h"
#include "nn/dense_block.h"
#include "nn/lm_head_block.h"
#include "nn/token_embedding_block.h"
#include "nn/transformer_block.h"
#include "ops/ops.h"
#include "runtime/image_task.h"
#include "runtime/text_task.h"

namespace ht::runtime {

namespace {

// The vocabulary is the byte corpus's fixed alphabet and the images' size and classes
// are the builders' defaults: no shape here depends on the data on disk.
models::GptSpec gpt_spec(const config::ModelConfig& m) {
  models::GptSpec spec;
  spec.vocab = data::kByteVocab;
  spec.context = m.context;
  spec.layers = m.layers;
  spec.heads = m.heads;
  spec.d_model = m.d_model;
  spec.dropout = m.dropout;
  return spec;
}

models::CnnSpec cnn_spec(const config::ModelConfig& m) {
  models::CnnSpec spec;
  spec.channels = m.channels;
  spec.hidden = m.fc_hidden;
  return spec;
}

models::MlpSpec mlp_spec(const config::ModelConfig& m) {
  models::MlpSpec spec;
  spec.hidden = m.hidden;
  return spec;
}

// The descriptions follow the Blocks models/ builds, in the same order; the unit test
// test_model_shapes checks them against the built models.
nn::ModelShape describe_gpt(const models::GptSpec& s) {
  nn::ModelShape m;
  m.blocks.reserve(static_cast<size_t>(s.layers) + 2);
  m.blocks.push_back(nn::TokenEmbeddingBlock::describe(s.vocab, s.context, s.d_model, s.dropout));
  for (int64_t i = 0; i < s.layers; ++i)
    m.blocks.push_back(nn::TransformerBlock::describe(s.d_model, s.heads, s.context, s.dropout));
  m.blocks.push_back(nn::LmHeadBlock::describe(s.d_model, s.vocab, s.context));
  return m;
}

nn::ModelShape describe_cnn(const models::CnnSpec& s) {
  nn::ModelShape m;
  int64_t c = s.in_channels, side = s.image;
  for (int64_t out : s.channels) {
    m.blocks.push_back(nn::ConvBlock::describe(c, out, side, side));
    c = out;
    side = m.blocks.back().sample_output_shape[1];
  }
  m.blocks.push_back(nn::DenseBlock::describe(Shape{c, side, side}, s.hidden, true));
  m.blocks.push_back(nn::DenseBlock::describe(Shape{s.hidden}, s.classes, false));
  return m;
}

nn::ModelShape describe_mlp(const models::MlpSpec& s) {
  nn::ModelShape m;
  int64_t in = s.input;
  for (int64_t h : s.hidden) {
    m.blocks.push_back(nn::DenseBlock::describe(Shape{in}, h, true));
    in = h;
  }
  m.blocks.push_back(nn::DenseBlock::describe(Shape{in}, s.classes, false));
  return m;
}

}  // namespace

nn::Sequential build_model(const config::Config& cfg, uint64_t seed) {
  const config::ModelConfig& m = cfg.model;
  if (m.type == "gpt") return models::build_gpt(gpt_spec(m), seed);
  if (m.type == "cnn") return models::build_cnn(cnn_spec(m), seed);
  return models::build_mlp(mlp_spec(m), seed);
}

nn::ModelShape describe_model(const config::Config& cfg) {
  const config::ModelConfig& m = cfg.model;
  if (m.type == "gpt") return describe_gpt(gpt_spec(m));
  if (m.type == "cnn") return describe_cnn(cnn_spec(m));
  return describe_mlp(mlp_spec(m));
}

std::unique_ptr<Task> make_task(const config::Config& cfg, Backend& device) {
  if (cfg.data.dataset == "text") return std::make_unique<TextTask>(cfg, device);
  return std::make_unique<ImageTask>(cfg, device);
}

Tensor summed_loss(const Tensor& logits, const Tensor& targets) {
  int64_t classes = logits.shape().back();
  return cross_entropy(reshape(logits, {-1, classes}), reshape(targets, {-1}), Reduction::sum);
}

}  // namespace ht::runtime
