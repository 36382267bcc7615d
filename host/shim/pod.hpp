// A task's place in its Kubernetes pod, and so which shim serves it (issue 27: one VM per pod).
// containerd's CRI plugin marks every task it creates with annotations in config.json
// (pkg/cri/annotations): `io.kubernetes.cri.container-type` (`sandbox` for the pod's pause task,
// `container` for the others) and `io.kubernetes.cri.sandbox-id` (the sandbox task's id). As Kata
// Containers' shim does, `shim start` for a `container` answers the address of its sandbox's shim
// (derived from the sandbox id), so one shim serves the pod; a task without them (plain `ctr
// run`) keeps a shim of its own. Sans-I/O: the caller reads config.json and probes the socket.
// docs/containerd.md "Pods".
#pragma once

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
