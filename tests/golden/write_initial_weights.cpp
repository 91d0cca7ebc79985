// golden_initial_weights CONFIG OUT: writes the initial parameters of CONFIG's model
// (hetrain's own initialisation from train.seed) to the safetensors checkpoint OUT.
// tools/make-golden runs it so that PyTorch starts from exactly hetrain's weights.
#include <cstdio>
#include <exception>
#include <string>

#include "golden_model.h"
#include "runtime/checkpoint.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s CONFIG.json OUT.safetensors\n", argv[0]);
    return 2;
  }
  try {
    const ht::config::Config cfg = ht::config::load_config(argv[1]);
    const ht::nn::Sequential model = ht::golden::build_model(cfg);
    ht::runtime::write_checkpoint(argv[2], model.named_parameters(),
                                  {{"config", cfg.name}, {"seed", std::to_string(cfg.train.seed)}});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "golden_initial_weights: %s\n", e.what());
    return 1;
  }
  return 0;
}
