// A VM daemon's use of libneshost, reduced to its core: one Host serves several VMs, each on the
// Unix socket its VMM forwards the guest's vsock connection to (Firecracker's hybrid vsock: a
// guest dialling port P arrives on `<uds_path>_<P>`), hands each its boot descriptor and reports
// each VM's durable outcome. Starting and stopping the VMM (Firecracker, QEMU, ...) is the
// embedder's part and left out: here the channel's end is taken as the VM's exit.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nes/host/lib/host.hpp>

namespace embed {

struct Options {
  std::filesystem::path dir;          // <dir>/<vm>.vsock is each VM's Firecracker uds_path
  std::uint32_t port = 7000;          // the vsock port the guest dials (nesinit's default)
  std::filesystem::path state;        // durable outcome records (<state>/<vm>/outcome.json)
  std::vector<std::string> vms;       // VM ids ([A-Za-z0-9._-])
  std::vector<std::string> argv;      // the workload; each VM gets env NES_VM=<its id>
  std::chrono::milliseconds ready_timeout{30000};
};

/// Serves every VM of `Options` on one io_context; `print` gets one line per outcome,
/// "<vm> <outcome> <exit status>" (e.g. "a exited 3", "b signalled 137").
class Daemon {
 public:
  Daemon(boost::asio::io_context& io, Options o, std::function<void(const std::string&)> print);
  /// Register each VM and listen on its socket; the error names the VM.
  nes::host::Status start();
  /// Path the VMM of `vm` forwards vsock port `port` to.
  std::string socket_path(const std::string& vm) const;
  /// Every VM's session has finished.
  bool done() const { return finished_ == opt_.vms.size(); }
  /// VMs whose outcome is not `exited 0`.
  int failures() const { return failures_; }

 private:
  boost::asio::io_context& io_;
  Options opt_;
  std::function<void(const std::string&)> print_;
  std::unique_ptr<nes::host::Host> host_;
  std::size_t finished_ = 0;
  int failures_ = 0;
};

}  // namespace embed
