// A removal that a crash cannot leave half done (docs/host.md "Removal"): its intent is written
// durably (`removing` in the VM's directory, host::kRemovingFile) before the first file goes,
// and whoever finds an intent — the next neshost command that reads the VM (every one goes
// through ensure_monitor()), `neshost rm`, `ps` — finishes the removal.
#pragma once

#include <filesystem>
#include <optional>
#include <string_view>

#include "host/lib/base.hpp"
#include "host/lib/state_dir.hpp"
#include "host/monitor/vmm_record.hpp"

namespace nes::host {

/// `--on-exit remove` of generation `generation`: the intent "scratch G" durably, then the VM's
/// scratch files (console.log, passt.log, every virtiofsd-*.log, workload.log and its
/// rotations), then the intent. The record, monitor.json and monitor.log stay. Error: the
/// intent could not be written (nothing removed) or a file could not be removed (the intent
/// stays: the next command tries again); each names the file.
Status remove_scratch(const std::filesystem::path& state_dir, std::string_view vm, std::uint64_t generation);

/// What finish_removal() did.
enum class Finished { nothing, scratch, all, stale };

/// If `vm` has a removal's intent: finishes it. "scratch G" with G the VM's current generation:
/// its scratch files go, then the intent; "all G" with no newer generation on disk: the whole
/// directory goes (under the VM's lock, as remove_vm(): the intent says its owner had decided),
/// then what its VMM left if it is gone too (end_leftovers(), from the vmm.json read first);
/// an intent of an older generation is stale and only unlinked. Returns what was done; errors
/// name the file.
Result<Finished> finish_removal(const std::filesystem::path& state_dir, std::string_view vm);

/// What a VM whose monitor and VMM are both gone left (`v` its vmm.json): each recorded helper
/// daemon that still runs is SIGKILLed (its identity checked through a pidfd), and its runtime dir
/// removed if it is what `run` makes (an absolute `neshost-XXXXXX` directory of ours, never
/// through a symlink).
void end_leftovers(const VmmInfo& v);

/// The whole directory of `vm`, locked (`dir` and its lock held by the caller): the intent "all G"
/// durably, every entry but the lock, the intent and vmm.json (kept to the last: a finisher reads
/// what to clean up from it; listed again until none is left, at most 3 passes), then vmm.json,
/// the intent, the lock, the directory. Error (the intent kept): the entry or listing that failed.
/// Used by remove_vm().
Status remove_dir_with_intent(const std::filesystem::path& dir, std::uint64_t generation);

}  // namespace nes::host
