// parallax_checkpoint: checkpoints and weights files, offline, in one process (no MPI).
//
//   parallax_checkpoint info    <checkpoint directory | root | file.safetensors>
//   parallax_checkpoint export  <checkpoint directory | root> <out.safetensors | out.pt> [--dtype D]
//   parallax_checkpoint convert <in.pt | in.safetensors> <out.safetensors | out.pt> [--dtype D]
//
// export writes the weights (fp32 masters) of a Parallax checkpoint, whole and under the
// model's own parameter names, one tensor at a time; a root means its newest complete
// checkpoint. convert moves a weights file between the two formats (a torch.save file
// is read whole). D: float32, bfloat16 or float16. A run starts from a safetensors file
// with checkpoint.load = "<file>.safetensors", under any layout.
#include <torch/types.h>

#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "parallax/checkpoint/store.h"
#include "parallax/checkpoint/weights_file.h"
#include "parallax/core/error.h"
#include "parallax/runtime/program_flags.h"

namespace {

using parallax::checkpoint::Reader;

constexpr char kUsage[] =
    "usage:\n"
    "  parallax_checkpoint info    <checkpoint directory | root | file.safetensors>\n"
    "  parallax_checkpoint export  <checkpoint directory | root> <out.safetensors | out.pt> [--dtype D]\n"
    "  parallax_checkpoint convert <in.pt | in.safetensors> <out.safetensors | out.pt> [--dtype D]\n"
    "D: float32, bfloat16 or float16 (default: as saved). A root means its newest complete checkpoint.\n";

// A checkpoint directory (has a commit marker), else a root, else a safetensors file.
Reader open_source(const std::string& where) {
  if (parallax::checkpoint::weights_format(where)) return Reader::open_weights(where);
  if (std::FILE* commit = std::fopen((where + "/commit").c_str(), "r")) {
    std::fclose(commit);
    return Reader::open(where, Reader::kExactly);
  }
  return Reader::open(where, Reader::kLatest);
}

std::optional<torch::ScalarType> parse_dtype(const std::vector<std::string>& args) {
  for (std::size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] != "--dtype") continue;
    const std::string& d = args[i + 1];
    if (d == "float32") return torch::kFloat;
    if (d == "bfloat16") return torch::kBFloat16;
    if (d == "float16") return torch::kHalf;
    throw parallax::UsageError("--dtype " + d + ": expected float32, bfloat16 or float16");
  }
  return std::nullopt;
}

int info(const std::string& where) {
  const Reader checkpoint = open_source(where);
  std::cout << checkpoint.directory() << ": step " << checkpoint.step() << ", saved under " << checkpoint.layout()
            << "\n";
  for (const std::string& skipped : checkpoint.skipped()) std::cout << "passed over: " << skipped << "\n";
  for (const std::string& name : checkpoint.wholes()) {
    std::cout << "  " << name << " " << c10::toString(checkpoint.dtype(name)) << " "
              << c10::IntArrayRef(checkpoint.shape(name));
    if (const std::int64_t parts = checkpoint.parts_of(name)) std::cout << " (" << parts << " tensor-parallel parts)";
    std::cout << "\n";
  }
  return 0;
}

int write_weights(const std::string& from, const std::string& to, std::optional<torch::ScalarType> dtype) {
  using namespace parallax::checkpoint;
  ExportResult result;
  if (weights_format(from) == WeightsFormat::kTorch) {
    // torch.save's pickle is read whole; the writer still streams.
    const auto tensors = read_torch_weights(from);
    std::vector<WeightsEntry> entries;
    for (const auto& [name, t] : tensors) entries.push_back({name, dtype.value_or(t.scalar_type()), t.sizes().vec()});
    result = write_weights(to, entries, [&](std::size_t i) { return tensors[i].second; });
  } else {
    const Reader checkpoint = open_source(from);
    result = export_weights(checkpoint, to, dtype);
    std::cout << "from " << checkpoint.directory() << " (step " << checkpoint.step() << ", saved under "
              << checkpoint.layout() << "): largest tensor held " << result.largest_tensor_bytes << " bytes\n";
  }
  std::cout << "wrote " << result.tensors << " tensors, " << result.bytes << " bytes, to " << to << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  parallax::ProgramHelp help;
  help.description = "Reads, exports and converts checkpoints and weights files, in one process (no MPI).";
  help.flags = {{"--dtype", "D", "export, convert: write float32, bfloat16 or float16 (default: as saved)."}};
  help.reads_config = false;
  help.usage = kUsage;
  parallax::answer_informational_flags(argc, argv, help);  // --help, --version
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.empty()) {
      std::cerr << kUsage;
      return 2;
    }
    if (args[0] == "info" && args.size() == 2) return info(args[1]);
    if ((args[0] == "export" || args[0] == "convert") && (args.size() == 3 || args.size() == 5)) {
      if (args[0] == "convert") {
        PARALLAX_CHECK(parallax::checkpoint::weights_format(args[1]).has_value(), UsageError, "convert ", args[1],
                       ": expected a .pt, .pth or .safetensors file (export reads checkpoints)");
      }
      return write_weights(args[1], args[2], parse_dtype(args));
    }
    std::cerr << "parallax_checkpoint: unknown command or wrong arguments\n" << kUsage;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "parallax_checkpoint: " << e.what() << "\n";
    return 1;
  }
}
