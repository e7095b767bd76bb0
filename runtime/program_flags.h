// What every program built on parallax::init answers before MPI starts, and the check
// that its command line holds only flags someone knows:
//
//   --help, -h          usage, Parallax's flags and the program's own, where config
//                       files are looked up; exit 0
//   --version           Parallax's version, the LibTorch it was built against, and
//                       whether CUDA and NCCL are compiled in; exit 0
//   --config-reference  every config key (config_reference()); exit 0
//
// Under a launcher only its first rank prints (the launcher's rank variable, read
// before MPI starts), so `mpirun -np 8 train_gpt --help` prints once. init calls these;
// tools that do not call init (parallax_checkpoint, parallax-matrix) call
// answer_informational_flags with their own usage.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace parallax {

struct CommandLine;

/// One command-line flag of the application's own, for --help and the unknown-flag check.
struct AppFlag {
  std::string name{};   ///< e.g. "--print-schedule"
  std::string value{};  ///< what follows it, e.g. "PATH"; "" for a switch
  std::string help{};   ///< one line
};

/// What --help says about a program.
struct ProgramHelp {
  std::string description{};              ///< one line: what the program does
  std::vector<AppFlag> flags{};           ///< its own flags
  std::vector<std::string> app_tables{};  ///< config tables it reads, e.g. {"model", "data"}
  bool reads_config = true;               ///< false for a tool that takes no --config/--set
  std::string usage{};                    ///< replaces the generated usage line(s) when set
  /// The program parses its own flags (InitOptions::program_parses_flags): others pass.
  bool program_parses_flags = false;
  std::vector<std::string> engines{};  ///< engines with [engine.<name>] tables (InitOptions::engines)
};

/// The text for --help, --version or --config-reference when argv (argv[0] first) asks
/// for one (the first of them), else nothing. Stops at a lone "--".
std::optional<std::string> informational_answer(int argc, const char* const* argv, const ProgramHelp& help);

/// Prints informational_answer's text on the launcher's first rank (or alone) and
/// exits 0 when argv asks for one; returns otherwise.
void answer_informational_flags(int argc, const char* const* argv, const ProgramHelp& help);

/// Throws UsageError for an argument of `command_line.rest` that starts with '-' before
/// a lone "--" and is neither Parallax's flag nor one of help.flags (listing the known
/// flags, with a did-you-mean), and for a flag of help.flags that needs a value and has
/// none.
void check_flags(const CommandLine& command_line, const ProgramHelp& help);

/// What a rank compares with the others before anything else (Runtime's first check):
/// the program's GNU build id (the ELF note the linker writes: two builds of the same
/// source differ), Parallax's version and the LibTorch it was built against, e.g.
/// "build id 3d14afcd..., Parallax 0.1.0, LibTorch 2.11.0". Without a build id (a linker
/// told --build-id=none) it says so, and only the versions are compared. Never throws.
std::string program_identity();
/// "Parallax 0.1.0, LibTorch 2.11.0": the libraries this program was built with.
std::string library_versions();

/// This process's executable (/proc/self/exe), e.g. "/opt/train/train_gpt"; "" if unknown.
std::string executable_path();

}  // namespace parallax
