// neshost: the host side's CLI. Subcommands register themselves (host/cli/cli.hpp Registrar).
#include <fmt/format.h>

#include <exception>

#include "host/cli/cli.hpp"
#include "protocol/messages.hpp"

namespace {
void print_help() {
  fmt::print("usage: neshost [--help|--version] COMMAND [ARGS...]\n\ncommands:\n");
  for (auto& s : nes::cli::subcommands()) fmt::print("  {:<10} {}\n", s.name, s.summary);
  fmt::print("\n'neshost COMMAND --help' describes one. Exit 125: usage error (as docker's).\n");
}
}  // namespace

int main(int argc, char** argv) try {
  if (argc < 2) {
    print_help();
    return nes::cli::kExitUsage;
  }
  std::string_view cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    print_help();
    return 0;
  }
  if (cmd == "--version") {
    fmt::print("neshost {} (protocol {})\n", NESHOST_VERSION, nes::proto::kProtocolVersion);
    return 0;
  }
  for (auto& s : nes::cli::subcommands()) {
    if (s.name == cmd) {
      nes::cli::Args args(argv + 2, argv + argc);
      return s.main(args);
    }
  }
  fmt::print(stderr, "neshost: unknown command '{}'\nTry 'neshost --help'.\n", cmd);
  return nes::cli::kExitUsage;
} catch (const std::exception& e) {
  // The edge: anything unexpected is a host-side failure (125), never a crash.
  fmt::print(stderr, "neshost: {}\n", e.what());
  return 125;
}
