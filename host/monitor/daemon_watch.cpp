#include "host/monitor/daemon_watch.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <boost/asio/post.hpp>

#include "host/monitor/reconcile.hpp"

namespace nes::monitor {

void DaemonWatch::watch(const host::VmmDaemon& d, OnExit on_exit) {
  // Pinned by identity: a pid reused by another process is not this daemon.
  host::Fd fd = host::pin_process(d.id);
  if (!fd) {
    boost::asio::post(io_, [d, on_exit = std::move(on_exit)] { on_exit(d, true); });
    return;
  }
  auto& w = watches_.emplace_back(io_, fd.release());
  w.async_wait(boost::asio::posix::stream_descriptor::wait_read,
               [d, on_exit = std::move(on_exit)](boost::system::error_code ec) {
                 if (!ec) on_exit(d, false);
               });
}

std::string share_tag_of(const host::VmmDaemon& d) {
  constexpr std::string_view kPrefix = "virtiofsd ";
  return d.name.starts_with(kPrefix) ? d.name.substr(kPrefix.size()) : std::string();
}

}  // namespace nes::monitor
