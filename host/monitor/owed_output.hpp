// What a monitor still owes its readers once the VM is gone: the `neshost exec` clients' output
// and the workload's own on our stdout/stderr (docs/vm.md "Workload stdio": a slow reader costs
// time, never bytes, until a signal).
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <optional>

#include "host/cli/exec.hpp"
#include "host/cli/stdio.hpp"
#include "host/lib/record.hpp"

namespace nes::monitor {

/// `neshost exec` clients still taking their output once the VM is gone: the loop goes on until
/// each has it all and its final reply (a slow client costs time, never bytes), or until a signal
/// (`stop_fd`, a signalfd, readable); what is then left is said on stderr.
void drain_exec_clients(boost::asio::io_context& io, cli::ExecAttachments& execs, int stop_fd);

/// The workload's output our readers have not taken yet: written for as long as they live,
/// however slowly they read, until a signal (`stop_fd` readable) says to give up (counted and
/// said, exit 125). An end the user asked for up front, --timeout, bounds this too (by `grace`),
/// keeping its 124. Then the record's own losses, said. Returns `status`, or 125 if output was lost.
int deliver_owed_output(cli::FdWriter& out, cli::FdWriter& errw, int stop_fd,
                        const std::optional<host::Record>& final_record, std::chrono::milliseconds grace, int status);

}  // namespace nes::monitor
