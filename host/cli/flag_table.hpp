// One flag table per command: each entry holds a flag's names (docker's spelling), how it sets
// and checks its value, and its help line. parse_flags() (host/cli/flags.hpp) reads the command
// line against the table's names; apply_flags() hands each value to its entry's setter, then runs
// the entries' checks; flag_help() prints the option lines of a --help text from the same table,
// so a new flag is one entry (host/cli/run_flags.cpp: `neshost run`'s, shared with `snapshot create`).
// Every error names its flag; a command turns it into kExitUsage (125, docker's status for its own
// flag errors: host/cli/cli.hpp usage_error), before anything starts.
#pragma once

#include <algorithm>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "host/cli/flags.hpp"
#include "host/lib/base.hpp"

namespace nes::cli {

/// One flag of a command whose options are an `Opts` (e.g. RunFlags).
template <class Opts>
struct Flag {
  /// The long name without "--" (docker's), its short form ("-e"; empty: none), and whether it
  /// takes a value (else it is a switch, and `set` gets "").
  FlagSpec spec;
  /// The value's name in the help line ("K=V|K", "MiB"); empty for a switch.
  std::string_view value_name;
  /// Parses and checks one value as given and stores it in the options (a repeatable flag adds
  /// to them). Errors name the flag: "--mem: expected an integer 64..1048576, got '32'".
  host::Status (*set)(Opts& opts, std::string_view value);
  /// Its help text: lines separated by '\n', each at most ~72 columns (flag_help() indents them).
  std::string_view help;
  /// Run once after every flag is set, if this flag was given: what the flag needs of the others
  /// ("--stdin-hold needs -i"). nullptr: nothing. Errors name the flag.
  host::Status (*check)(const Opts& opts) = nullptr;
  /// The help section it is listed in ("" the main one; e.g. "Network").
  std::string_view section = {};
};

/// The parser's view of `table`: each entry's FlagSpec, in order.
template <class Opts>
std::vector<FlagSpec> flag_specs(std::span<const Flag<Opts>> table) {
  std::vector<FlagSpec> specs;
  specs.reserve(table.size());
  for (const auto& f : table) specs.push_back(f.spec);
  return specs;
}

/// What apply_flags() leaves besides the options: the positionals, and --help.
struct Applied {
  std::vector<std::string> positional;  // in order, as given
  /// Index into `positional` of the first argument after a `--` (positional.size() if none).
  std::size_t after_dashdash = 0;
  bool help = false;
};

/// Parses `args` against `table` (parse_flags, `order`), then calls each given flag's setter in the
/// order given, then each given flag's check in table order. The first error wins; it names the
/// flag. `opts` holds the defaults on entry.
template <class Opts>
host::Result<Applied> apply_flags(std::span<const Flag<Opts>> table, const Args& args, FlagOrder order, Opts& opts) {
  const auto specs = flag_specs(table);
  auto p = parse_flags(specs, args, order);
  if (!p) return p.error();
  auto entry = [&](std::string_view name) {
    return std::find_if(table.begin(), table.end(), [&](const Flag<Opts>& f) { return f.spec.name == name; });
  };
  for (const auto& [name, value] : p->given)
    if (auto s = entry(name)->set(opts, value); !s) return s.error();
  for (const auto& f : table)
    if (f.check && p->has(f.spec.name))
      if (auto c = f.check(opts); !c) return c.error();
  return Applied{std::move(p->positional), p->after_dashdash, p->help};
}

/// One help line (or more): "  -e, --env K=V|K      text", the names padded to column 23; names
/// longer than 20 columns stand alone and the text starts on the next line. Each further line of
/// `help` ('\n'-separated) is indented to column 23.
std::string flag_help_line(const FlagSpec& spec, std::string_view value_name, std::string_view help);

/// The option lines of the entries of `table` in `section`, in table order.
template <class Opts>
std::string flag_help(std::span<const Flag<Opts>> table, std::string_view section = {}) {
  std::string out;
  for (const auto& f : table)
    if (f.section == section) out += flag_help_line(f.spec, f.value_name, f.help);
  return out;
}

}  // namespace nes::cli
