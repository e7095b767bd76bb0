#include "parallax/runtime/program_flags.h"

#include <elf.h>
#include <link.h>
#include <torch/version.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>

#include "parallax/core/config_loader.h"
#include "parallax/core/error.h"

namespace parallax {
namespace {

constexpr char kHelp[] = "--help";
constexpr char kShortHelp[] = "-h";
constexpr char kVersion[] = "--version";
constexpr char kConfigReference[] = "--config-reference";

std::string program_name(const char* argv0) {
  const std::string path = argv0 != nullptr ? argv0 : "program";
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Parallax's own flags, as --help lists them (config ones only for programs that read a config).
std::vector<AppFlag> parallax_flags(bool reads_config) {
  std::vector<AppFlag> flags;
  if (reads_config) {
    flags.push_back(
        {"--config", "FILE", "Read a TOML config file; repeat for more (a later file overrides an earlier one)."});
    flags.push_back({"--set", "KEY=VALUE", "Override one key after every file, VALUE in TOML: --set zero.stage=3."});
    flags.push_back(
        {kConfigReference, "", "Print every config key (type, default, allowed values, meaning) and exit."});
  }
  flags.push_back({kVersion, "", "Print Parallax's version, its LibTorch, and whether CUDA and NCCL are built in."});
  flags.push_back({"--help, -h", "", "Print this help and exit."});
  return flags;
}

void list_flags(std::ostream& out, const std::vector<AppFlag>& flags) {
  for (const AppFlag& flag : flags) {
    std::string left = flag.name + (flag.value.empty() ? "" : " " + flag.value);
    out << "  " << left << std::string(left.size() < 22 ? 22 - left.size() : 1, ' ') << flag.help << "\n";
  }
}

std::string help_text(const std::string& program, const ProgramHelp& help) {
  std::ostringstream out;
  if (!help.usage.empty()) {
    out << help.usage;
  } else {
    out << "Usage: " << program << " [--config FILE]... [--set KEY=VALUE]... [FLAG]...\n"
        << "       mpirun -np N " << program << " ...    (one process per rank)\n";
  }
  if (!help.description.empty()) out << "\n" << help.description << "\n";
  out << "\nParallax's flags:\n";
  list_flags(out, parallax_flags(help.reads_config));
  if (!help.flags.empty()) {
    out << "\n" << program << "'s flags:\n";
    list_flags(out, help.flags);
  }
  if (help.program_parses_flags) {
    out << "\nEvery other argument is " << program << "'s own: Parallax takes --config and --set out of\n"
        << "the command line and leaves the rest, in order, for " << program << "'s parser.\n";
  }
  if (help.reads_config) {
    out << "\nConfig files: each --config FILE is opened as given (relative to the working\n"
           "directory); a file's `extends = \"base.toml\"` is found relative to that file.\n"
           "Without --config every key keeps its default (--config-reference lists them all).\n";
    if (!help.app_tables.empty()) {
      out << "The config tables";
      for (std::size_t i = 0; i < help.app_tables.size(); ++i) {
        out << (i == 0 ? " [" : ", [") << help.app_tables[i] << "]";
      }
      out << " are " << program << "'s own.\n";
    }
    if (!help.engines.empty()) {
      out << "The config tables";
      for (std::size_t i = 0; i < help.engines.size(); ++i) {
        out << (i == 0 ? " [engine." : ", [engine.") << help.engines[i] << "]";
      }
      out << " hold those engines' own grad_accum and [zero], [offload] and [precision] keys.\n";
    }
    out << "Arguments after a lone \"--\" go to " << program << " untouched.\n";
  }
  return out.str();
}

std::string version_text() {
  std::ostringstream out;
  out << "Parallax " << PARALLAX_VERSION << "\n"
      << "LibTorch " << TORCH_VERSION << " (built against)\n"
      << "CUDA: " << (PARALLAX_TORCH_CUDA_BUILD ? "compiled in (LibTorch built with CUDA)" : "not compiled in") << "\n";
#ifdef PARALLAX_WITH_NCCL
  out << "NCCL: compiled in\n";
#else
  out << "NCCL: not compiled in\n";
#endif
  return out.str();
}

// The hex of the main program's NT_GNU_BUILD_ID note, or "" (dl_iterate_phdr visits the
// program first).
std::string main_program_build_id() {
  std::string id;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* out) -> int {
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& header = info->dlpi_phdr[i];
          if (header.p_type != PT_NOTE) continue;
          const char* at = reinterpret_cast<const char*>(info->dlpi_addr + header.p_vaddr);
          const char* end = at + header.p_memsz;
          while (at + sizeof(ElfW(Nhdr)) <= end) {
            const auto* note = reinterpret_cast<const ElfW(Nhdr)*>(at);
            const char* name = at + sizeof(ElfW(Nhdr));
            const char* desc = name + ((note->n_namesz + 3u) & ~3u);
            if (desc + note->n_descsz > end) break;
            if (note->n_type == NT_GNU_BUILD_ID && note->n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0) {
              static constexpr char kHex[] = "0123456789abcdef";
              auto& id = *static_cast<std::string*>(out);
              for (std::uint32_t b = 0; b < note->n_descsz; ++b) {
                const auto byte = static_cast<unsigned char>(desc[b]);
                id += kHex[byte >> 4];
                id += kHex[byte & 15];
              }
              return 1;
            }
            at = desc + ((note->n_descsz + 3u) & ~3u);
          }
        }
        return 1;
      },
      &id);
  return id;
}

// Whether this process is the launcher's first rank, or alone (read before MPI starts).
bool first_rank_or_alone() {
  for (const char* variable : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* value = std::getenv(variable)) return std::string(value) == "0";
  }
  return true;
}

// An argument that is a flag: "-x" or "--x", not "-" alone or a negative number.
bool is_flag(const std::string& arg) {
  return arg.size() > 1 && arg[0] == '-' && !(arg[1] >= '0' && arg[1] <= '9') && arg[1] != '.';
}

}  // namespace

std::optional<std::string> informational_answer(int argc, const char* const* argv, const ProgramHelp& help) {
  const std::string program = program_name(argc > 0 ? argv[0] : nullptr);
  for (int i = 1; i < argc && argv[i] != nullptr; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    if (arg == kHelp || arg == kShortHelp) return help_text(program, help);
    if (arg == kVersion) return version_text();
    if (arg == kConfigReference && help.reads_config) return config_reference();
  }
  return std::nullopt;
}

void answer_informational_flags(int argc, const char* const* argv, const ProgramHelp& help) {
  const std::optional<std::string> answer = informational_answer(argc, argv, help);
  if (!answer) return;
  if (first_rank_or_alone()) {
    std::cout << *answer << std::flush;
  }
  std::exit(0);
}

void check_flags(const CommandLine& command_line, const ProgramHelp& help) {
  const std::vector<std::string>& args = command_line.rest;
  const std::string program = program_name(args.empty() ? nullptr : args[0].c_str());
  std::vector<std::string> known = {"--config", "--set", kHelp, kShortHelp, kVersion, kConfigReference};
  for (const AppFlag& flag : help.flags) known.push_back(flag.name);
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") break;
    if (!is_flag(arg)) continue;
    const std::string name = arg.substr(0, arg.find('='));
    const AppFlag* own = nullptr;
    for (const AppFlag& flag : help.flags) {
      if (flag.name == name) own = &flag;
    }
    if (own != nullptr) {
      if (!own->value.empty() && name == arg) {
        PARALLAX_CHECK(i + 1 < args.size() && args[i + 1] != "--", UsageError, program, ": ", name, " needs a value (",
                       name, " ", own->value, ")");
        ++i;
      }
      continue;
    }
    std::string list;
    for (const std::string& flag : known) list += (list.empty() ? "" : ", ") + flag;
    const std::string suggestion = closest_spelling(name, known);
    throw UsageError(detail::concat(program, ": unknown flag '", arg, "'",
                                    suggestion.empty() ? "" : "; did you mean '" + suggestion + "'?", " ", program,
                                    " takes: ", list, " (--help says what each does)"));
  }
}

std::string library_versions() {
  return std::string("Parallax ") + PARALLAX_VERSION + ", LibTorch " + TORCH_VERSION;
}

std::string program_identity() {
  const std::string id = main_program_build_id();
  return (id.empty() ? std::string("no build id") : "build id " + id) + ", " + library_versions();
}

std::string executable_path() {
  char path[4096];
  const ssize_t length = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
  return length > 0 ? std::string(path, static_cast<std::size_t>(length)) : "";
}

}  // namespace parallax
