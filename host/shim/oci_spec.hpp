// An OCI runtime bundle's config.json (runtime-spec v1.0, "config.md") as the one microVM task it
// describes: what the shim can honour becomes a TaskSpec, what it cannot is a Create error naming
// the field. The VM is the isolation boundary, so the spec's in-kernel confinement of a process on
// a shared kernel (namespaces, cgroups, capabilities, rlimits, masked/readonly paths, AppArmor,
// SELinux labels) has nothing to apply to and is ignored; what would change the workload's view
// and cannot be given in a VM is refused. Which is which: docs/containerd.md "What Create honours".
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "host/lib/base.hpp"
#include "protocol/messages.hpp"

namespace nes::shim {

/// A host directory or regular file shared into the guest (an OCI bind mount).
struct Volume {
  std::filesystem::path host;  // absolute, symlinks resolved
  std::string guest;           // absolute guest path
  bool ro = false;
  /// The spec's other options that a pod's container honours in the guest (a task of its own
  /// runs `neshost run --volume`, which has none of them): `nosuid`, `nodev`, `noexec`;
  /// `rbind` (else a plain bind, without the source's submounts); the propagation
  /// (`rprivate`, `rslave`, ...; empty: private).
  bool nosuid = false, nodev = false, noexec = false, rbind = false;
  std::string propagation;
  bool operator==(const Volume&) const = default;
};

/// A tmpfs the spec mounts where the guest's init mounts none (`ctr run --mount type=tmpfs`,
/// docker's --tmpfs): a pod's container gets it as a guest tmpfs (host/shim/pod_mounts.hpp); a
/// task of its own refuses it at Create naming `field`.
struct Tmpfs {
  std::string guest;  // absolute guest path
  bool ro = false, nosuid = false, nodev = false, noexec = false;
  std::string data;   // its size=, mode=, nr_inodes=, uid=, gid= options, comma-separated
  std::string field;  // "mounts[N]"
  bool operator==(const Tmpfs&) const = default;
};

/// The OCI annotation that names a snapshot to restore the task's VM from (TaskSpec::snapshot).
inline constexpr std::string_view kSnapshotAnnotation = "io.nesinit.snapshot";

/// The task as the microVM will run it.
struct TaskSpec {
  std::vector<std::string> argv;  // process.args, non-empty
  std::vector<std::string> env;   // process.env, each "K=V"
  std::string cwd = "/";          // process.cwd, absolute
  std::uint32_t uid = 0, gid = 0; // process.user
  std::vector<std::uint32_t> groups;  // process.user.additionalGids
  bool terminal = false;          // process.terminal
  std::filesystem::path root;     // root.path, made absolute against the bundle
  bool root_ro = false;           // root.readonly
  std::string hostname;           // hostname (may be empty)
  std::vector<Volume> volumes;    // bind mounts
  std::vector<Tmpfs> tmpfs;       // tmpfs mounts not met by the guest's own
  /// linux.namespaces' `network` entry's path (CNI's /var/run/netns/NAME): the VM takes over that
  /// namespace's interface (`--network netns:PATH`). Empty: no such entry, or one without a path
  /// (a new namespace of its own): `neshost run`'s default network (user mode).
  std::filesystem::path netns;
  /// The VM's size (`--mem` MiB, `--cpus`): a pod's sandbox sized from CRI's annotations
  /// (host/shim/pod.hpp parse_pod_size); unset: neshost run's defaults.
  std::optional<std::uint32_t> mem_mib, cpus;
  /// annotations["io.nesinit.snapshot"]: a snapshot's directory (absolute; `neshost snapshot
  /// create`): the VM is restored from it (`--snapshot`) instead of booted. Empty: none.
  std::filesystem::path snapshot;
  /// linux.resources (host/shim/resources.hpp): a pod's container's cgroup in the guest; unset:
  /// none asked for. A task of its own has the VM as its limit and ignores it.
  std::optional<proto::ContainerResources> resources;
  bool operator==(const TaskSpec&) const = default;
};

/// Parse config.json text. `bundle` resolves a relative root.path. At most 4 MiB. Errors name the
/// field: "process.args: expected a non-empty array of strings", "linux.seccomp: not supported:
/// ...". Unknown fields are ignored (the spec's extension rule). With the snapshot annotation, more
/// shares than `neshost run --snapshot` takes (vm::kHotplugPorts, one fewer when the VM gets a NIC:
/// a network namespace, or $NESHOST_NETWORK, which the shim's neshost inherits, not "none") is an
/// error naming annotations.io.nesinit.snapshot.
host::Result<TaskSpec> parse_oci_spec(std::string_view json, const std::filesystem::path& bundle);

/// Parse an OCI `process` object alone (the spec of containerd's Exec): the process fields of
/// the result are set (args, env, cwd, user, terminal), the rest left at their defaults. Errors
/// name the field as parse_oci_spec's do ("process.args: ...").
host::Result<TaskSpec> parse_oci_process(std::string_view json);

/// The text of `<bundle>/config.json` (at most 4 MiB), for parse_oci_spec and the pod's
/// annotations (host/shim/pod.hpp) alike; a missing or unreadable file is an error naming it.
host::Result<std::string> read_oci_config(const std::filesystem::path& bundle);

/// What `neshost run` needs beyond the spec.
struct RunPlan {
  std::string vm;                   // VM id
  std::filesystem::path state_dir;  // neshost's --state
  bool attach_stdin = false;        // containerd gave a stdin FIFO: -i --stdin-hold (CloseIO ends it)
};

/// `neshost run` arguments (without the program) that run `s` as planned: one VM in the
/// foreground, its exit status the task's (128+N for a signal N, as runc reports it); with
/// `--network netns:PATH` when the spec names a network namespace.
std::vector<std::string> run_args(const TaskSpec& s, const RunPlan& p);

}  // namespace nes::shim
