// A container inside the VM (the host's `exec.container` and `exec.in`, docs/protocol.md
// "Containers"): the steps that give a process its own root, /proc, /dev, /sys and /etc files as
// runc does, planned by the init before the clone (the plan owns every path) and run by the child
// between clone and execve with system calls only (it shares the init's memory: no allocation).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "protocol/messages.hpp"

namespace nes::init {

/// One step of a container's set-up. `a`, `b`: paths (or a mount's source and target),
/// `fstype`/`data` for `mount`, `flags` mount(2)'s flags or a mode.
struct ContainerStep {
  enum Kind : unsigned char { mount, mkdir, touch, symlink, pivot, hostname } kind;
  std::string a, b;
  const char* fstype = nullptr;
  unsigned long flags = 0;
  const char* data = nullptr;
  std::string opts;  // mount(2)'s data when `data` is null and this is not empty (a tmpfs's options)
};

/// The steps, in order, for `c` (its root already checked to be a directory), run in a fresh
/// mount namespace: everything made private (nothing propagates to the VM's mounts), `root`
/// bound onto itself, /proc (the new pid namespace's), /dev (a tmpfs: null, zero, full, random,
/// urandom, tty bound from the init's /dev, a new devpts at /dev/pts with ptmx -> pts/ptmx,
/// fd/stdin/stdout/stderr links, tmpfs /dev/shm, /dev/mqueue), /sys read-only, the init's
/// /etc/hosts and /etc/resolv.conf (and /etc/hostname when the container has no hostname of its
/// own) bound over the root's for each name in `etc` (those the init has), then `c.mounts` in
/// order (proto::ContainerMount: the target's parents made as directories, the target as its
/// bind's source is, a directory unless `src` is a file; a bind remounted with its flags; its
/// propagation applied), the root remounted read-only if `readonly`, then the root switched (pivot_root, or on the initramfs, where
/// pivot_root is refused, a move onto / and chroot as switch_root(8)), then the hostname.
std::vector<ContainerStep> plan_container(const proto::Container& c, const std::vector<std::string>& etc);

/// Runs `steps` (in the child: system calls only). 0 on success, else the errno of the failing
/// step, whose index goes to `failed`.
int run_container(const std::vector<ContainerStep>& steps, int& failed);

/// "mount proc on /r/proc", "mkdir /r/dev", ...: a step for an error's reason.
std::string describe(const ContainerStep& s);

/// The namespaces a process joins to enter a running container (`exec.in`): the container's
/// PID 1 `pid` (in the init's pid namespace). ns[0..2]: its uts, pid, mnt namespace files; root:
/// its root directory.
struct JoinPlan {
  std::string ns[3];
  std::string root;
};
JoinPlan plan_join(pid_t pid);

/// Enters `j` (in the child: system calls only): opens each file, setns(2) into each, and makes
/// the container's root the root and cwd. The pid namespace applies to children only: the
/// caller forks after this. 0 or the errno; `failed` 0..2 the namespace, 3 the root.
int join_container(const JoinPlan& j, int& failed);

}  // namespace nes::init
