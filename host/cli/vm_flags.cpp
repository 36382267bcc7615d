// `neshost stop` and `neshost kill`'s flag tables and parsers (host/cli/vm_flags.hpp).
#include "host/cli/vm_flags.hpp"

#include <signal.h>

#include <fmt/format.h>

#include "host/lib/state_dir.hpp"

namespace nes::cli {

using host::Error;
using host::Ok;
using host::Status;

namespace {

template <class Opts>
Status set_state(Opts& o, std::string_view v) {
  if (v.empty()) return Error{"--state: expected a path, got ''"};
  return o.state = std::filesystem::path(v), Ok{};
}

/// -t 0 is docker's "SIGKILL at once" (no ordered shutdown); any other value as parse_seconds().
template <class Opts>
Status set_grace(Opts& o, std::string_view flag, std::string_view v) {
  if (v == "0") return o.grace = std::chrono::milliseconds(0), Ok{};
  auto ms = parse_seconds(flag, v);
  if (!ms) return ms.error();
  return o.grace = *ms, Ok{};
}

const Flag<StopFlags> kStopFlags[] = {
    {{"time", true, "-t"}, "S", [](StopFlags& o, std::string_view v) { return set_grace(o, "time", v); },
     "seconds the guest has to shut down in order before the workload gets\nSIGKILL (default 30; 0: SIGKILL at once, docker's -t 0)"},
    {{"timeout"}, "S", [](StopFlags& o, std::string_view v) { return set_grace(o, "timeout", v); },
     "the same as --time (docker's older spelling)"},
    {{"state"}, "DIR", set_state<StopFlags>, "state directory (default: as neshost run)"},
};

const Flag<KillFlags> kKillFlags[] = {
    {{"signal", true, "-s"}, "SIG",
     [](KillFlags& o, std::string_view v) -> Status {
       auto s = parse_signal(v);
       if (!s) return Error{fmt::format("--signal: expected a name (TERM, SIGUSR1, ...) or 1..64, got '{}'", v)};
       return o.signal = *s, Ok{};
     },
     "the signal: a name (TERM, SIGUSR1, ...) or 1..64 (default KILL)"},
    {{"state"}, "DIR", set_state<KillFlags>, "state directory (default: as neshost run)"},
};

/// The one VM a command names.
template <class Opts>
host::Result<Opts> one_vm(std::span<const Flag<Opts>> table, const Args& args) {
  Opts o;
  auto a = apply_flags(table, args, FlagOrder::anywhere, o);
  if (!a) return a.error();
  o.help = a->help;
  if (o.help) return o;
  if (a->positional.size() != 1) return Error{"exactly one VM is required"};
  o.vm = a->positional[0];
  if (auto id = host::check_vm_id(o.vm); !id) return Error{"VM: " + id.error().message};
  return o;
}

}  // namespace

std::optional<int> parse_signal(std::string_view v) {
  if (!v.empty() && v[0] >= '0' && v[0] <= '9') {
    auto n = parse_uint("signal", v, 1, 64);
    return n ? std::optional<int>(static_cast<int>(*n)) : std::nullopt;
  }
  if (v.starts_with("SIG")) v.remove_prefix(3);
  static constexpr std::pair<std::string_view, int> kNames[] = {
      {"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT}, {"KILL", SIGKILL},
      {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"PIPE", SIGPIPE}, {"ALRM", SIGALRM},
      {"TERM", SIGTERM}, {"CONT", SIGCONT}, {"STOP", SIGSTOP}, {"TSTP", SIGTSTP},
      {"WINCH", SIGWINCH}};
  for (auto [n, s] : kNames)
    if (n == v) return s;
  return std::nullopt;
}

std::span<const Flag<StopFlags>> stop_flags() { return kStopFlags; }
std::span<const Flag<KillFlags>> kill_flags() { return kKillFlags; }

host::Result<StopFlags> parse_stop(const Args& args) { return one_vm(stop_flags(), args); }
host::Result<KillFlags> parse_kill(const Args& args) { return one_vm(kill_flags(), args); }

}  // namespace nes::cli
