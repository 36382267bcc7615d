// `neshost exec`'s flag table and parser (host/cli/exec_flags.hpp).
#include "host/cli/exec_flags.hpp"

#include <tuple>

#include <fmt/format.h>

#include "host/lib/state_dir.hpp"

namespace nes::cli {

using host::Error;
using host::Ok;
using host::Status;

namespace {

const Flag<ExecFlags> kExecFlags[] = {
    {{"interactive", false, "-i"}, "",
     [](ExecFlags& o, std::string_view) -> Status { return o.interactive = true, Ok{}; },
     "forward our stdin (else the process reads /dev/null)"},
    {{"tty", false, "-t"}, "",
     [](ExecFlags& o, std::string_view) -> Status { return o.tty = true, Ok{}; },
     "a pseudo-terminal sized like ours (raw mode here with -i; SIGWINCH\n"
     "resizes)"},
    {{"env", true, "-e"}, "K=V|K",
     [](ExecFlags& o, std::string_view v) -> Status {
       auto kv = parse_env(v);
       if (!kv) return kv.error();
       if (*kv) o.exec.env[(*kv)->first] = (*kv)->second;
       return Ok{};
     },
     "environment (repeatable; K alone: its value here, if set)"},
    {{"workdir", true, "-w"}, "DIR",
     [](ExecFlags& o, std::string_view v) -> Status {
       auto w = parse_workdir(v);
       if (!w) return w.error();
       o.exec.cwd = std::move(*w);
       return o.workdir_given = true, Ok{};
     },
     "working directory (absolute)"},
    {{"user", true, "-u"}, "UID[:GID]",
     [](ExecFlags& o, std::string_view v) -> Status {
       auto u = parse_user(v);
       if (!u) return u.error();
       std::tie(o.exec.uid, o.exec.gid) = *u;
       return o.user_given = true, Ok{};
     },
     "uid and gid, numeric (GID alone defaults to UID)"},
    {{"state"}, "DIR",
     [](ExecFlags& o, std::string_view v) -> Status {
       if (v.empty()) return Error{"--state: expected a path, got ''"};
       return o.state = std::filesystem::path(v), Ok{};
     },
     "the state directory (default: as neshost run)"},
};

constexpr std::string_view kExecUsage =
    R"(usage: neshost exec [-i] [-t] [-e K=V]... [-w DIR] [-u UID[:GID]] [--state DIR] VM [--] ARGV...

Runs ARGV in the running VM's guest beside its workload, as `docker exec`: the workload's
environment with -e on top, its working directory and user unless -w/-u say otherwise; its own
stdout and stderr (here), and stdin with -i. Exit status: ARGV's; 128+N for signal N; 127 not
found, 126 cannot run; 125 when the VM cannot be reached, and for a usage error (as docker's;
nothing is started).

)";

}  // namespace

std::span<const Flag<ExecFlags>> exec_flags() { return kExecFlags; }

std::string exec_help() { return std::string(kExecUsage) + flag_help(exec_flags()); }

host::Result<ExecFlags> parse_exec(const Args& args) {
  ExecFlags o;
  auto a = apply_flags(exec_flags(), args, FlagOrder::options_first, o);
  if (!a) return a.error();
  o.help = a->help;
  if (o.help) return o;
  auto& pos = a->positional;
  if (pos.empty()) return Error{"a VM and ARGV are required"};
  o.vm = pos[0];
  if (auto id = host::check_vm_id(o.vm); !id) return Error{"VM: " + id.error().message};
  std::size_t i = 1;
  if (i < pos.size() && pos[i] == "--") ++i;  // `VM -- ARGV`
  if (i >= pos.size()) return Error{"ARGV is required"};
  o.exec.argv.assign(pos.begin() + static_cast<std::ptrdiff_t>(i), pos.end());
  return o;
}

}  // namespace nes::cli
