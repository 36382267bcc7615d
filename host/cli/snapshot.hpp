// `neshost snapshot`'s link to `neshost run` (docs/vm.md "Snapshots"): the machine a snapshot is
// made of is the one `run` would boot with the same flags, so a restore's command line matches it.
#pragma once

#include <filesystem>

#include "host/cli/plan.hpp"
#include "host/lib/base.hpp"
#include "host/vm/qemu_argv.hpp"

namespace nes::cli {

/// The QEMU spec `neshost run` would boot for `flags` (its kernel, initramfs, kernel command line,
/// accelerator: resolved as run resolves them, RAM, vCPUs), with no shares and no NIC, in a
/// snapshot's layout (QemuSpec::snapshot_layout), its sockets in `runtime_dir` (channel.sock,
/// data.sock, qmp.sock). Error: the kernel or initramfs missing, a flag run would refuse.
host::Result<vm::QemuSpec> snapshot_machine(const RunFlags& flags, const std::filesystem::path& runtime_dir);

}  // namespace nes::cli
