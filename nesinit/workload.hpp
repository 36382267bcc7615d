// Starting the workload: a vfork-style clone (CLONE_VM|CLONE_VFORK, as posix_spawn) with every
// signal blocked, set the child up (session, stdio, signals, oom_score_adj, fds, environment, cwd,
// credentials) and exec; the failing step and its errno, if any, come back in the memory parent
// and child share until the exec.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "base/result.hpp"
#include "container.hpp"
#include "protocol/limits.hpp"
#include "protocol/messages.hpp"
#include "reaper.hpp"

namespace nes::init {

/// PATH used to resolve argv[0] when exec.env has no PATH (protocol/limits.hpp).
using proto::kDefaultPath;

/// The workload's environment, `NAME=value` strings: exactly exec.env, plus NESINIT_WIDTH,
/// NESINIT_HEIGHT, NESINIT_FPS, NESINIT_HDR (0/1) from geometry unless exec.env has the same name
/// (docs/protocol.md "Environment handed to the workload"). Sorted by name.
std::vector<std::string> workload_env(const proto::Exec& exec, const proto::Geometry& g);

/// The paths execve is tried with, in order: argv0 itself if it contains '/', else each PATH entry
/// (an empty entry means the current directory, as in POSIX execvp) joined with argv0. `path` is
/// exec.env's PATH if present, else kDefaultPath.
std::vector<std::string> exec_candidates(const std::string& argv0, const std::string& path);

/// The set-up step that failed in the child.
enum class SpawnStep : int { fork = 1, pipe, setsid, console, sigmask, chdir, setgroups, setgid,
                             setuid, exec, stdio, terminal, container, join, cgroup };
std::string_view to_string(SpawnStep s);

/// start_failed's class for a failing step and errno: exec ENOENT/ENOTDIR -> not_found (127 in
/// POSIX shells), exec EACCES/ENOEXEC/EPERM/EISDIR -> not_executable (126), everything else
/// (set-up steps, E2BIG, ENOMEM, ...) -> other.
proto::StartFailClass classify(SpawnStep step, int err);

/// How to set up the child's stdio: guest mode opens /dev/console (O_NOCTTY: never a controlling
/// terminal); sandbox mode keeps the init's own fds 0-2, which its parent chose.
enum class Stdio { console, inherit };

/// The workload's fds 0, 1, 2 when the init owns its stdio (boot.stdio): pipe ends or the PTY
/// slave (then `terminal`: after setsid the child makes it its controlling terminal with
/// TIOCSCTTY, so ^C and job control reach the workload's group). Overrides `Stdio`.
struct ChildFds {
  int fd[3] = {-1, -1, -1};
  bool terminal = false;
};

/// The workload's pid, or the start_failed to report (the failing step, its errno, the class).
using SpawnResult = base::Result<pid_t, proto::StartFailed>;

/// Whose pid the reaper is to watch: the workload's (Reaper::watch) or one `exec` started
/// (Reaper::watch_exec).
enum class Role { workload, exec };

/// Where the process runs (exec.container / exec.in): `steps` set: a new container (its own
/// mount and pid namespaces, and UTS with `uts`), the steps run in the child before the exec;
/// `join` set: inside a running one (its namespaces and root). Neither: the init's own.
/// `cgroup_procs` set: the child writes its pid there first (the container's cgroup, cgroup.hpp).
struct Enclosure {
  const std::vector<ContainerStep>* steps = nullptr;
  bool uts = false;
  const JoinPlan* join = nullptr;
  const char* cgroup_procs = nullptr;
};

/// Start `exec`. On success the child has exec'd and its pid is registered with `reaper` (it may
/// already have exited: the reaper delivers its status later). On failure the child has been
/// collected and a StartFailed says which step failed with which errno.
/// Blocks only until the child's execve succeeds or the child reports its failure and exits.
SpawnResult spawn(const proto::Exec& exec, const proto::Geometry& g, Stdio stdio, Reaper& reaper,
                  const ChildFds* fds = nullptr, Role role = Role::workload,
                  const Enclosure& where = {});

}  // namespace nes::init
