// The output a monitor still owes once the VM is gone (host/monitor/owed_output.hpp).
#include "host/monitor/owed_output.hpp"

#include <fcntl.h>

#include <boost/asio/posix/stream_descriptor.hpp>
#include <fmt/format.h>

#include "host/monitor/say.hpp"
#include "protocol/status.hpp"

namespace nes::monitor {

namespace asio = boost::asio;
using cli::ExecAttachments;
using cli::FdWriter;
using cli::put_bounded;

void drain_exec_clients(asio::io_context& io, ExecAttachments& execs, int stop_fd) {
  if (execs.idle()) return;
  io.restart();
  bool stop = false;
  asio::posix::stream_descriptor sig(io, ::fcntl(stop_fd, F_DUPFD_CLOEXEC, 3));
  sig.async_wait(asio::posix::stream_descriptor::wait_read, [&](boost::system::error_code ec) { stop = !ec; });
  while (!execs.idle() && !stop && io.run_one()) {
  }
  if (!execs.idle())
    say("neshost run: {} bytes of `neshost exec` output not delivered: interrupted while its readers were still "
        "taking them\n", execs.queued());
}

int deliver_owed_output(FdWriter& out, FdWriter& errw, int stop_fd, const std::optional<host::Record>& final_record,
                        std::chrono::milliseconds grace, int status) {
  const bool timed_out = final_record && final_record->outcome == proto::Outcome::timeout;
  const auto limit = timed_out ? std::optional(grace) : std::nullopt;
  for (auto [w, name] : {std::pair{&out, "stdout"}, std::pair{&errw, "stderr"}}) {
    auto f = w->flush(stop_fd, limit);
    if (!f.left) continue;
    if (f.interrupted) {
      say("neshost run: {} bytes of {} lost: {} while its reader was still taking them\n", f.left, name,
          timed_out ? fmt::format("the --timeout ended neshost {} ms later", grace.count()) : "interrupted");
      // As host::reported_status(): it overrides the workload's own status, not a host verdict.
      if (!final_record || final_record->outcome == proto::Outcome::exited ||
          final_record->outcome == proto::Outcome::signalled)
        status = host::kStatusOutputLost;
    } else {
      if (f.stalled)
        say("neshost run: {} bytes of {} not delivered: left in its FIFO, which no one read for 2 s\n", f.left, name);
      else
        say("neshost run: {} bytes of {} not delivered: its reader went away\n", f.left, name);
    }
  }
  if (final_record)
    for (const auto& line : host::describe_loss(*final_record)) say("neshost run: {}\n", line);
  return status;
}

}  // namespace nes::monitor
