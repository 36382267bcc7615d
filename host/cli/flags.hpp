// The `neshost` CLI's one flag parser and its value parsers. Two orders, as docker spells its
// commands: flags anywhere among the positionals (`neshost logs VM -f`), or options first and
// the rest verbatim (`neshost run [OPTIONS] ARGV...`, where ARGV's own flags are the program's).
// Errors name the flag; the subcommand turns them into exit status 125, docker's status for its own
// flag errors (host/cli/cli.hpp usage_error). A command's flags as one table: host/cli/flag_table.hpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "host/lib/base.hpp"

namespace nes::cli {

/// Arguments after the subcommand name.
using Args = std::vector<std::string_view>;

/// A flag a subcommand accepts. `takes_value`: `--name VALUE`, `--name=VALUE` or, with a short
/// form, `-n VALUE`, `-nVALUE` or `-n=VALUE`. Short forms may run together, as getopt and docker
/// read them: switches (`-it` is `-i -t`), then at most one flag with a value (`-ie K=V`).
struct FlagSpec {
  std::string_view name;        // the long form, without the leading "--"
  bool takes_value = true;
  std::string_view short_form = {};  // e.g. "-e"; empty: none
};

/// Where the flags may stand. `anywhere`: every argument that starts with '-' is a flag until
/// `--`. `options_first`: flags end at the first positional (or `--`, or a lone "-"); that
/// argument and all after it are positionals, as given.
enum class FlagOrder { anywhere, options_first };

/// A parsed command line.
struct Parsed {
  /// Each flag by its long name; the last one given wins. A switch maps to "".
  std::map<std::string, std::string, std::less<>> flags;
  /// Every flag as given, in order (repeatable flags such as `--env` read this).
  std::vector<std::pair<std::string, std::string>> given;
  std::vector<std::string> positional;  // in order
  /// Index into `positional` of the first argument after a `--` (positional.size() if none):
  /// `run IMAGE CMD...` and `run -- ARGV...` differ by it.
  std::size_t after_dashdash = 0;
  bool help = false;                    // -h or --help
  bool has(std::string_view f) const { return flags.find(f) != flags.end(); }
  std::optional<std::string> get(std::string_view f) const {
    auto it = flags.find(f);
    return it == flags.end() ? std::nullopt : std::optional<std::string>(it->second);
  }
};

/// Parse `args` against `specs`. `--` ends the flags; `--help` sets `help`, and so does `-h`
/// unless a spec has it as its short form (docker run's `-h` is `--hostname`). Errors name the
/// flag: "unknown flag --x", "unknown flag -x", "--state needs a value", "--tty takes no value".
host::Result<Parsed> parse_flags(std::span<const FlagSpec> specs, const Args& args,
                                 FlagOrder order = FlagOrder::anywhere);

/// Seconds (decimal allowed, e.g. "0.5") -> milliseconds; error names `flag`. 0 < S <= 31 days.
host::Result<std::chrono::milliseconds> parse_seconds(std::string_view flag, std::string_view v);
/// Unsigned integer in [lo, hi]; error names `flag`.
host::Result<std::uint64_t> parse_uint(std::string_view flag, std::string_view v, std::uint64_t lo,
                                       std::uint64_t hi);
/// `--user UID[:GID]` (numbers; GID defaults to UID), each 0..2^32-2. Errors name --user.
host::Result<std::pair<std::uint32_t, std::uint32_t>> parse_user(std::string_view v);
/// `--env K=V` -> {K, V}; K is not empty. `--env K` alone takes K's value from our own
/// environment and is nothing (nullopt) when K is unset there, as docker reads it. Errors
/// name --env.
host::Result<std::optional<std::pair<std::string, std::string>>> parse_env(std::string_view v);
/// `--workdir DIR`: DIR must be absolute. Errors name --workdir.
host::Result<std::string> parse_workdir(std::string_view v);

}  // namespace nes::cli
