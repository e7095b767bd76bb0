// A plain LibTorch program, as a user of exported weights writes one: no Parallax runtime,
// no MPI. It builds the GPT example's model, reads a file `parallax_checkpoint export`
// wrote in torch.save's format with torch::pickle_load (LibTorch's reader for torch.save
// files), copies every tensor into the parameter of the same name, and prints the mean
// next-token loss on samples [first, first + count) of the example's synthetic stream and
// the sum of every weight, to 9 significant digits:
//   loss 3.98765432 checksum -12.3456789
//
//   plain_gpt_loss WEIGHTS.pt FIRST COUNT   (the model and data of configs/gpt_base.toml)
#include <torch/serialize.h>
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "gpt.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: plain_gpt_loss WEIGHTS.pt FIRST COUNT\n");
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const c10::Dict<c10::IValue, c10::IValue> weights = torch::pickle_load(bytes).toGenericDict();

  gpt::GPTOptions options;  // configs/gpt_base.toml's [model]
  options.vocab_size = 64;
  options.block_size = 32;
  options.d_model = 64;
  options.n_layer = 2;
  options.n_head = 4;
  gpt::GPT model(options, /*seed=*/0);
  torch::NoGradGuard no_grad;
  std::size_t loaded = 0;
  double checksum = 0.0;
  for (auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    torch::Tensor& parameter = item.value();
    const c10::IValue key(name);
    if (!weights.contains(key)) {
      std::fprintf(stderr, "%s: no tensor '%s'\n", argv[1], name.c_str());
      return 1;
    }
    parameter.copy_(weights.at(key).toTensor());
    checksum += parameter.to(torch::kDouble).sum().item().toDouble();
    ++loaded;
  }
  if (loaded != weights.size()) {
    std::fprintf(stderr, "%s: %zu tensors, the model has %zu parameters\n", argv[1], weights.size(), loaded);
    return 1;
  }
  const gpt::SyntheticTokens data(options.vocab_size, options.block_size, /*seed=*/1234, /*noise=*/0.1);
  const auto [inputs, targets] = data.batch(std::stoll(argv[2]), std::stoll(argv[3]));
  const double loss = gpt::language_model_loss(model->forward(inputs), targets).item<double>();
  std::printf("loss %.9g checksum %.9g\n", loss, checksum);
  return 0;
}
