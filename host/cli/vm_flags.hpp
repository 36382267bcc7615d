// `neshost stop` and `neshost kill` flags as tables (host/cli/flag_table.hpp), with the VM they
// name: parse_stop(), parse_kill(); their --help option lines come from the same entries. Errors
// name the flag or the argument and exit kExitUsage (125).
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "host/cli/flag_table.hpp"
#include "host/cli/flags.hpp"
#include "host/lib/base.hpp"

namespace nes::cli {

/// `neshost stop [--state DIR] [-t S] VM`.
struct StopFlags {
  std::optional<std::filesystem::path> state;
  std::chrono::milliseconds grace{30000};  // -t/--time/--timeout: SIGKILL after it; 0: at once
  std::string vm;
  bool help = false;
};

/// `neshost kill [--state DIR] [-s SIG] VM`.
struct KillFlags {
  std::optional<std::filesystem::path> state;
  int signal = 9;  // SIGKILL, as docker's
  std::string vm;
  bool help = false;
};

/// "TERM", "SIGTERM", "15" -> 15 (names of the usual signals, or 1..64); nullopt if neither.
std::optional<int> parse_signal(std::string_view v);

std::span<const Flag<StopFlags>> stop_flags();
std::span<const Flag<KillFlags>> kill_flags();

/// Flags anywhere; exactly one VM (host::check_vm_id) unless --help.
host::Result<StopFlags> parse_stop(const Args& args);
host::Result<KillFlags> parse_kill(const Args& args);

}  // namespace nes::cli
