// What a replacement monitor takes over from the one it replaces, beyond the session itself
// (docs/host.md "Re-adoption", "What the replacement takes over"): the VM's start and its
// `--timeout` deadline (recorded in vmm.json by the first monitor, re-armed by the replacement),
// and the helpers it watches and ends. Each duty is recorded in vmm.json (host/monitor/
// vmm_record.hpp) by whoever holds the VM, so no duty ends with the process that held it.
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>

#include "host/lib/base.hpp"
#include "host/lib/record.hpp"
#include "host/lib/session.hpp"
#include "host/monitor/vmm_record.hpp"

namespace nes::monitor {

/// The VM has started (the session's vm_started at `started_at`): `v` gets started_at and, with a
/// wall limit `timeout` (`run --timeout`), timeout_ms and a first deadline (CLOCK_BOOTTIME now
/// plus the limit: never later than the session's, which runs from `boot` or `started`), and is
/// written durably (write_vmm). Error names the file; `v` is changed only when written.
host::Status record_started(const std::filesystem::path& state, host::VmmInfo& v, host::WallTime started_at,
                            std::optional<std::chrono::milliseconds> timeout);

/// The workload's first `started` (where the session arms its limit again): `v`'s deadline
/// becomes CLOCK_BOOTTIME now plus its timeout_ms, written durably. Nothing without a limit.
host::Status record_wall_deadline(const std::filesystem::path& state, host::VmmInfo& v);

/// A replacement's session config from what the first monitor recorded: started_at (the record's),
/// the wall limit and what is left of its deadline (SessionConfig::wall_left; `now_boottime_ns`:
/// host::boottime_ns()). A vmm.json without them (an older monitor) leaves them unset.
void take_over_duties(const host::VmmInfo& v, host::SessionConfig& sc, std::int64_t now_boottime_ns);

}  // namespace nes::monitor
