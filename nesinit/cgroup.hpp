// A container's cgroup v2 inside the VM (exec.container.resources, docs/protocol.md "Container
// resources"): each container `exec` starts gets `<root>/ctr-<proc>` with the limits the host
// sent (memory.max, cpu.max, cpu.weight, pids.max), as runc gives an OCI spec's
// `linux.resources` on cgroup v2; its PID 1 and every process that joins it (exec.in) run there,
// so the kernel's OOM killer, CFS bandwidth and pids limit act on that container alone. The init
// enables the controllers in the root's cgroup.subtree_control the first time it makes one.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/result.hpp"
#include "protocol/messages.hpp"

namespace nes::init {

/// Writes the set fields of `r` into the cgroup directory `dir` (memory.max, cpu.max as
/// "QUOTA PERIOD" with "max" for 0 and the period kept from the file when `r` sets none,
/// cpu.weight, pids.max). With `no_shrink_below_use` (an update of a running container): a
/// memory_max below memory.current is first reclaimed toward (memory.reclaim), and refused
/// when the container still uses more, naming the field and both figures, nothing written.
/// Errors name the wire field (`memory_max: ...`) and the file with the kernel's errno.
base::Status write_resources(const std::string& dir, const proto::ContainerResources& r,
                             bool no_shrink_below_use = false);

/// The cgroup's use (proto::CgroupStats) from the files in `dir`; an Error naming the file
/// when memory.current cannot be read (the cgroup is gone).
base::Result<proto::CgroupStats> read_stats(const std::string& dir);

/// The cgroups of the containers this init started, under `root` (/sys/fs/cgroup in the VM; a
/// temporary directory in the unit tests). At most kMaxEnded removed-but-busy ones are retried.
class ContainerCgroups {
 public:
  explicit ContainerCgroups(std::string root = "/sys/fs/cgroup") : root_(std::move(root)) {}

  /// `root/ctr-PROC` for process `proc`.
  std::string dir(std::uint16_t proc) const;

  /// Makes the cgroup of the container `exec` starts as `proc` (controllers enabled first), with
  /// `r` written when set. Returns its cgroup.procs path, which the child writes its pid to
  /// before anything else runs. An Error (its message names the field or file) leaves nothing.
  base::Result<std::string> create(std::uint16_t proc, const std::optional<proto::ContainerResources>& r);

  /// The container's PID 1 `pid` runs (its cgroup is removed once it was reaped and is empty).
  void started(std::uint16_t proc, pid_t pid);
  /// Its start failed: its cgroup goes now.
  void failed(std::uint16_t proc);
  /// `pid` was reaped: a container's PID 1 marks its cgroup ended; every ended cgroup is then
  /// tried (rmdir: EBUSY while its last processes are still exiting; tried again at the next reap).
  void reaped(pid_t pid);

  /// The cgroup of the running container `proc`, if it is one this init started and runs.
  std::optional<std::string> running(std::uint16_t proc) const;

  /// The cgroup.procs a process joining the container whose PID 1 is `pid` writes to (from
  /// /proc/PID/cgroup, "0::/ctr-N"); empty when it is in none of ours (the VM's root).
  std::string procs_of(pid_t pid, const std::string& proc = "/proc") const;

  /// How many removed cgroups wait for their last process to go, at most.
  static constexpr std::size_t kMaxEnded = 64;

 private:
  struct Entry {
    std::uint16_t proc;
    pid_t pid;  // 0: ended (reaped)
  };
  void sweep();
  std::string root_;
  bool enabled_ = false;
  std::vector<Entry> live_;
};

}  // namespace nes::init
