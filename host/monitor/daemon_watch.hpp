// A replacement monitor's watch over the helper daemons the monitor gone started (virtiofsd per
// share, passt): not its children, so no exit status, but each pinned by a pidfd whose identity
// (host::ProcessIdentity, vmm.json) is checked after opening it. Their death is then handled as
// the first monitor handles its own children's (docs/host.md "Re-adoption").
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <functional>
#include <list>
#include <string>

#include "host/monitor/vmm_record.hpp"

namespace nes::monitor {

/// Watches recorded daemons on an io_context. Not thread-safe (the monitor's loop).
class DaemonWatch {
 public:
  /// Called once per daemon that exits (or is found gone when watched: `already` true).
  using OnExit = std::function<void(const host::VmmDaemon& d, bool already)>;
  explicit DaemonWatch(boost::asio::io_context& io) : io_(io) {}
  /// Watches `d`: a pidfd on its pid, its identity checked after opening; `on_exit` runs on the
  /// loop when it exits. A daemon already gone (no such pid, or the pid is another process now):
  /// `on_exit` is posted at once with `already`.
  void watch(const host::VmmDaemon& d, OnExit on_exit);
  /// Stops every watch (pending handlers run with an error and do nothing).
  void clear() { watches_.clear(); }

 private:
  boost::asio::io_context& io_;
  std::list<boost::asio::posix::stream_descriptor> watches_;  // stable addresses
};

/// The share tag of a daemon named "virtiofsd TAG" (vmm.json's names); empty for any other.
std::string share_tag_of(const host::VmmDaemon& d);

}  // namespace nes::monitor
