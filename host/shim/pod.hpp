// A task's place in its Kubernetes pod, and so which shim serves it (issue 27: one VM per pod).
// containerd's CRI plugin marks every task it creates with annotations in config.json
// (pkg/cri/annotations): `io.kubernetes.cri.container-type` (`sandbox` for the pod's pause task,
// `container` for the others) and `io.kubernetes.cri.sandbox-id` (the sandbox task's id). As Kata
// Containers' shim does, `shim start` for a `container` answers the address of its sandbox's shim
// (derived from the sandbox id), so one shim serves the pod; a task without them (plain `ctr
// run`) keeps a shim of its own. Sans-I/O: the caller reads config.json and probes the socket.
// docs/containerd.md "Pods".
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "host/lib/base.hpp"

namespace nes::shim {

inline constexpr std::string_view kContainerTypeAnnotation = "io.kubernetes.cri.container-type";
inline constexpr std::string_view kSandboxIdAnnotation = "io.kubernetes.cri.sandbox-id";

/// What the task is in its pod: not in one (no CRI annotations), the pod's sandbox, or one of its
/// containers.
enum class PodRole { none, sandbox, container };

/// The task's role and, for a sandbox or a container, the pod's sandbox id (its shim's key).
struct PodPlacement {
  PodRole role = PodRole::none;
  std::string sandbox_id;  // empty for PodRole::none
  bool operator==(const PodPlacement&) const = default;
};

/// Reads the two annotations from config.json's text (`annotations`, an object of strings; at
/// most 4 MiB of JSON) for task `task_id`. Errors name the container and the field, e.g.
/// "container 'c1': annotations.io.kubernetes.cri.sandbox-id: missing (container-type is
/// 'container')". Refused: a container-type other than sandbox/container; a sandbox-id without a
/// container-type or the reverse; a sandbox whose sandbox-id is not its own id (a second sandbox
/// in one pod); a container whose sandbox-id is its own id; an empty sandbox-id.
host::Result<PodPlacement> parse_pod_placement(std::string_view config_json, std::string_view task_id);

/// The task id whose shim serves the task: the sandbox id for a pod's task, else the task's own.
std::string_view shim_key(const PodPlacement& p, std::string_view task_id);

inline constexpr std::string_view kSandboxMemoryAnnotation = "io.kubernetes.cri.sandbox-memory";
inline constexpr std::string_view kSandboxCpuQuotaAnnotation = "io.kubernetes.cri.sandbox-cpu-quota";
inline constexpr std::string_view kSandboxCpuPeriodAnnotation = "io.kubernetes.cri.sandbox-cpu-period";

/// The VM's defaults a pod's size is added to (neshost run's own: 256 MiB, 1 vCPU) and its bounds
/// (`--mem` MiB, `--cpus`).
inline constexpr std::uint32_t kPodBaseMemMib = 256, kPodBaseCpus = 1;
inline constexpr std::uint32_t kPodMaxMemMib = 1024 * 1024, kPodMaxCpus = 64;

/// The pod VM's size. containerd's CRI plugin (1.6) annotates the sandbox with the sum of its
/// containers' limits when the kubelet (>= 1.23) sends them (PodSandboxConfig.linux.resources):
/// `sandbox-memory` (bytes), `sandbox-cpu-quota` and `sandbox-cpu-period` (CFS, microseconds).
/// As Kata Containers sizes a pod VM, they are added to the VM's defaults: memory rounded up to
/// MiB, ceil(quota / period) vCPUs. Unset (no annotation, or 0, or a quota <= 0: no limit): the
/// default. Sizes past the bounds are errors.
struct PodSize {
  std::uint32_t mem_mib = kPodBaseMemMib;
  std::uint32_t cpus = kPodBaseCpus;
  bool operator==(const PodSize&) const = default;
};

/// Reads the sandbox annotations above from config.json's text for sandbox `task_id`. Errors name
/// the container and the field: "container 'S': annotations.io.kubernetes.cri.sandbox-memory:
/// expected a decimal number of bytes, got 'x'"; a quota without a period; a size past the bounds.
host::Result<PodSize> parse_pod_size(std::string_view config_json, std::string_view task_id);

/// What `shim start` does for a task.
struct StartPlan {
  /// true: start a shim of its own (listening on `socket`); false: answer `socket`, the sandbox's
  /// shim's address (already serving).
  bool spawn = true;
  std::filesystem::path socket;
  bool operator==(const StartPlan&) const = default;
};

/// Decides `shim start` for task `task_id` placed as `p`, given whether a shim already answers on
/// the socket of shim_key(p) (`key_shim_alive`; the socket is socket_path(address, ns, key)). A
/// live shim is answered (a sandbox or plain task asked twice: containerd's retry; a container:
/// its pod's shim); none spawns one for a sandbox or plain task. A container whose sandbox has no
/// live shim is an error naming the container and its sandbox: "container 'c1':
/// annotations.io.kubernetes.cri.sandbox-id: sandbox 'S' has no running shim (unknown or gone)".
host::Result<StartPlan> plan_start(const PodPlacement& p, std::string_view task_id, std::string_view address,
                                   std::string_view ns, bool key_shim_alive);

}  // namespace nes::shim
