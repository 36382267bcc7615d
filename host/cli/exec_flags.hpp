// `neshost exec`'s flags as one table (host/cli/flag_table.hpp): -i, -t, -e, -w, -u as `neshost
// run` spells and checks them (the same value parsers), and --state; parse_exec() also reads and
// checks the VM and ARGV. Every error names its flag or argument and exits kExitUsage (125).
#pragma once

#include <filesystem>
#include <optional>
#include <span>
#include <string>

#include "host/cli/flag_table.hpp"
#include "host/cli/flags.hpp"
#include "host/lib/base.hpp"
#include "protocol/messages.hpp"

namespace nes::cli {

/// `neshost exec`'s command line as parsed.
struct ExecFlags {
  /// argv (ARGV), env (-e on top of the workload's), cwd (-w), uid/gid (-u), as given.
  proto::Exec exec;
  bool interactive = false, tty = false;
  bool workdir_given = false, user_given = false;  // else the workload's (docker exec's)
  std::optional<std::filesystem::path> state;      // --state
  std::string vm;                                  // the VM (checked: host::check_vm_id)
  bool help = false;
};

/// `neshost exec`'s table, in --help's order.
std::span<const Flag<ExecFlags>> exec_flags();

/// `neshost exec --help`.
std::string exec_help();

/// `neshost exec [OPTIONS] VM [--] ARGV...`: options before VM; then VM (a valid id) and ARGV
/// (not empty) are required unless --help.
host::Result<ExecFlags> parse_exec(const Args& args);

}  // namespace nes::cli
