#include "daemon.hpp"

#include <boost/asio/post.hpp>

#include <nes/host/lib/endpoint.hpp>
#include <nes/protocol/status.hpp>

namespace embed {

namespace host = nes::host;

Daemon::Daemon(boost::asio::io_context& io, Options o, std::function<void(const std::string&)> print)
    : io_(io), opt_(std::move(o)), print_(std::move(print)) {
  host::HostOptions h;
  h.state_dir = opt_.state;
  // A real daemon kills its VMM here; without one, the VM is gone when its channel is.
  h.hooks.destroy = [this](const std::string& vm, std::uint64_t) {
    boost::asio::post(io_, [this, vm] { (void)host_->vm_exited(vm); });
  };
  h.on_event = [this](const host::Event& e) {
    if (e.kind == "finished") {
      ++finished_;
    } else if (e.kind == "disconnected") {
      auto* s = host_->session(e.vm);
      if (s && s->outcome()) boost::asio::post(io_, [this, vm = e.vm] { (void)host_->vm_exited(vm); });
    }
  };
  host_ = std::make_unique<host::Host>(io_, std::move(h));
}

std::string Daemon::socket_path(const std::string& vm) const {
  return host::firecracker_vsock_path((opt_.dir / (vm + ".vsock")).string(), opt_.port);
}

host::Status Daemon::start() {
  for (const auto& vm : opt_.vms) {
    host::SessionConfig c;
    c.vm = vm;
    c.descriptor.exec.argv = opt_.argv;
    c.descriptor.exec.env = {{"PATH", "/usr/sbin:/usr/bin:/sbin:/bin"}, {"NES_VM", vm}};
    c.ready_timeout = opt_.ready_timeout;
    c.stop_timeout = std::chrono::seconds(5);
    if (auto s = host_->add_vm(c); !s) return host::Error{vm + ": " + s.error().message};
    host::UnixListenOptions u;
    u.path = socket_path(vm);
    if (auto s = host_->listen_unix(vm, u); !s) return host::Error{vm + ": " + s.error().message};
    (void)host_->vm_started(vm);  // a real daemon: once its VMM process runs
    host_->async_wait(vm, [this, vm](host::WaitResult r) {
      if (!r) {
        ++failures_;
        print_(vm + " error " + r.error().message);
        return;
      }
      if (r->exit_status != 0) ++failures_;
      print_(vm + " " + std::string(nes::proto::to_string(r->outcome)) + " " +
             std::to_string(r->exit_status));
    });
  }
  return host::Ok{};
}

}  // namespace embed
