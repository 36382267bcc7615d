// An OCI spec's `linux.resources` (runtime-spec config-linux.md "Control groups") as the limits
// of a pod's container in the guest (proto::ContainerResources, nesinit/cgroup.hpp), as runc
// converts them for cgroup v2: memory.limit -> memory.max, cpu.quota/period -> cpu.max,
// cpu.shares -> cpu.weight (1 + ((shares-2)*9999)/262142), pids.limit -> pids.max. The same
// JSON is what containerd's Update sends (its `resources` Any holds a LinuxResources as JSON).
// docs/containerd.md "Resources of a pod's containers".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <simdjson.h>

#include "host/lib/base.hpp"
#include "protocol/messages.hpp"

namespace nes::shim {

/// runc's cgroup v2 conversion of CPU shares (2..262144, clamped) to cpu.weight (1..10000).
std::uint32_t shares_to_weight(std::uint64_t shares);

/// The limits `r` (a LinuxResources object) asks for; unset when it asks for none. `field`
/// prefixes every error ("linux.resources"). Accepted and ignored, as the VM is their boundary or
/// the guest has no such thing: devices, blockIO, hugepageLimits, network, rdma, memory's
/// reservation, swap, kernel, kernelTCP, swappiness, disableOOMKiller, useHierarchy,
/// checkBeforeUpdate, cpu's cpus, mems, realtime*, idle. Errors name the field: a negative value
/// other than -1 (`linux.resources.memory.limit: expected bytes > 0, or -1 for no limit, got -5`),
/// a value past cgroup v2's range, a non-number, a key the spec does not define (`...: unknown
/// resource field`), a non-empty `unified` entry.
host::Result<std::optional<proto::ContainerResources>> parse_resources(simdjson::dom::element r,
                                                                       std::string_view field);

/// parse_resources over JSON text (the Update request's Any); an unparsable text is an error
/// naming `field`.
host::Result<std::optional<proto::ContainerResources>> parse_resources_json(std::string_view json,
                                                                            std::string_view field);

/// `now` with every field `update` sets replaced (what the container has after an Update).
proto::ContainerResources merged(const std::optional<proto::ContainerResources>& now,
                                 const proto::ContainerResources& update);

/// Whether the pod's containers' limits `limits` (each container's, the updated one included)
/// fit its VM of `mem_mib` MiB and `cpus` vCPUs: the memory limits set (not 0) add up to at most
/// the VM's RAM, the CPU quotas set to at most its vCPUs. A pod's VM does not grow after its
/// boot (the lean guest kernel has no memory or CPU hot-plug), so an Update past it is refused:
/// the Error names `field` (linux.resources.memory.limit or linux.resources.cpu.quota), both
/// sums and the VM's size.
host::Status fits_vm(const std::vector<proto::ContainerResources>& limits, std::uint32_t mem_mib, std::uint32_t cpus);

}  // namespace nes::shim
