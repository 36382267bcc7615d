// vm::Vmm: the VMM's process booted, restored from a snapshot or adopted (host/vm/vmm.hpp).
#include "host/vm/vmm.hpp"

#include <fcntl.h>
#include <signal.h>

#include <boost/asio/error.hpp>
#include <fmt/format.h>

#include "host/vm/qmp.hpp"

namespace nes::vm {

namespace asio = boost::asio;
using namespace std::chrono_literals;

namespace {

LaunchOptions launch_options(VmmLaunch& l) {
  LaunchOptions lo;
  // A VMM that outlives us is recorded by the gate before it runs; else it dies with us.
  if (l.gate) {
    lo.death_signal = 0;
    lo.before_exec = std::move(l.gate);
  }
  lo.netns_fd = l.netns_fd;
  lo.argv = std::move(l.argv);
  lo.console = std::move(l.console);
  lo.diagnostics = std::move(l.diagnostics);
  lo.fds = std::move(l.fds);
  return lo;
}

/// A restore's NIC backend waits on the command line for its device (plugged in after the load):
/// QEMU's startup warning about it says nothing to our user. Read line by line (QEMU writes its
/// program name and the message apart), that one line dropped; the rest goes on to `next`.
ByteSink without_peer_warning(ByteSink next) {
  return [next = std::move(next), pending = std::make_shared<std::string>()](std::string_view b) {
    pending->append(b);
    for (std::size_t nl; (nl = pending->find('\n')) != std::string::npos;) {
      std::string_view line(pending->data(), nl + 1);
      if (line.find("warning: netdev net0 has no peer") == std::string_view::npos && next) next(line);
      pending->erase(0, nl + 1);
    }
    if (pending->size() > 8192) {
      if (next) next(*pending);
      pending->clear();
    }
  };
}

/// The snapshot's state loaded into the paused QEMU, the shares and the NIC plugged in (their
/// daemons and backend run already), then `cont`. Each QMP step bounded.
host::Status load(const VmmRestore& r) {
  auto q = Qmp::connect(r.qmp_socket, 5s);
  if (!q) return q.error();
  auto refuse = [&](host::Error e) { return r.refuse ? r.refuse(std::move(e)) : std::move(e); };
  if (q->qemu_version() != r.qemu_version)
    return refuse(host::Error{fmt::format("made with QEMU {}; this QEMU is {}", r.qemu_version, q->qemu_version())});
  if (auto s = load_vm_state(*q, *r.state, Vmm::kSnapshotLoadWait); !s) return refuse(s.error());
  for (std::size_t i = 0; i < r.shares.size(); ++i)
    if (auto s = hotplug_share(*q, i, i, r.shares[i], 5s); !s) return s;
  if (r.nic)
    if (auto s = hotplug_nic(*q, *r.nic, 5s); !s) return s;
  if (auto s = q->execute("cont", "", 5s); !s) return s.error();
  return host::Ok{};
}

}  // namespace

host::Result<std::unique_ptr<Vmm>> Vmm::boot(asio::io_context& io, VmmLaunch launch) {
  auto p = VmProcess::launch(launch_options(launch));
  if (!p) return host::Error{"cannot start QEMU: " + p.error().message};
  return std::make_unique<Vmm>(Key{}, io, std::move(*p));
}

host::Result<std::unique_ptr<Vmm>> Vmm::restore(asio::io_context& io, VmmLaunch launch, const VmmRestore& restore) {
  launch.diagnostics = without_peer_warning(std::move(launch.diagnostics));
  auto p = VmProcess::launch(launch_options(launch));
  if (!p) return host::Error{"cannot start QEMU: " + p.error().message};
  if (auto s = load(restore); !s) {
    // A refusal of the snapshot itself names it (snapshot_refusal(): "--snapshot GIVEN: ...").
    const std::string& msg = s.error().message;
    host::Error e{msg.starts_with("--snapshot ") ? msg : "--snapshot: " + msg};
    (*p)->terminate(200ms);
    (*p)->finish_output(2s);
    return e;
  }
  return std::make_unique<Vmm>(Key{}, io, std::move(*p));
}

std::unique_ptr<Vmm> Vmm::adopt(asio::io_context& io, std::unique_ptr<VmProcess> process) {
  return std::make_unique<Vmm>(Key{}, io, std::move(process));
}

void Vmm::watch_exit(std::function<void(std::optional<ProcessExit>)> exited) {
  // Its exit, seen through its pidfd on this io_context: reap, drain its output to EOF (so every
  // console line precedes what the caller does next), then tell the caller.
  exit_watch_.emplace(io_, ::fcntl(process_->pidfd(), F_DUPFD_CLOEXEC, 3));
  exit_watch_->async_wait(asio::posix::stream_descriptor::wait_read,
                          [this, exited = std::move(exited)](boost::system::error_code ec) {
                            if (ec == asio::error::operation_aborted) return;  // stop_watching()
                            auto e = process_->wait_for(0ms);
                            process_->finish_output(2s);
                            exited(e);
                          });
}

void Vmm::stop() {
  if (!process_->exit_status()) process_->terminate(1s);
  process_->finish_output(2s);
}

}  // namespace nes::vm
