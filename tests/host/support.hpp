// Test support for host/: temp dirs, a Host harness driven by events (never sleeps), and the
// scripted fake guests of the installed harness (host/lib/testing.hpp).
#pragma once

#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "host/lib/host.hpp"
#include "host/lib/testing.hpp"
#include "protocol/codec.hpp"
#include "tests/support/temp_dir.hpp"

namespace nes::test {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

/// A minimal valid boot descriptor.
inline proto::Boot sample_boot() {
  proto::Boot b;
  b.exec.argv = {"/bin/sh", "-c", "exit 3"};
  b.exec.env = {{"PATH", "/usr/bin:/bin"}};
  b.geometry = {640, 480, 30, false};
  b.on_exit.terminal = true;
  return b;
}

// Guest lines and the scripted guest: the installed harness (host/lib/testing.hpp).
using host::testing::exited_line;
using host::testing::host_type;
using host::testing::ready_line;
using host::testing::signalled_line;
using host::testing::started_line;

/// Peak resident set size of this process, in KiB (VmHWM).
inline long peak_rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string k;
  while (f >> k) {
    if (k == "VmHWM:") { long v; f >> v; return v; }
  }
  return -1;
}
/// Current resident set size, in KiB (VmRSS).
inline long rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string k;
  while (f >> k) {
    if (k == "VmRSS:") { long v; f >> v; return v; }
  }
  return -1;
}

/// Raise RLIMIT_NOFILE's soft limit to the hard limit; returns the new soft limit.
inline rlim_t raise_nofile() {
  rlimit r{};
  ::getrlimit(RLIMIT_NOFILE, &r);
  r.rlim_cur = r.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &r);
  ::getrlimit(RLIMIT_NOFILE, &r);
  return r.rlim_cur;
}

/// Write all of `b` to `fd` (a socket or pipe end a test plays the guest on); throws on an error
/// (a test failure).
inline void write_all(int fd, std::string_view b) {
  while (!b.empty()) {
    ssize_t n = ::write(fd, b.data(), b.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error("write_all: " + std::string(std::strerror(errno)));
    b.remove_prefix(static_cast<std::size_t>(n));
  }
}

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAsan = true;
#else
inline constexpr bool kAsan = false;
#endif

// ---- scripted fake guests (host/lib/testing.hpp) ---------------------------------------------------

namespace step = host::testing::step;
using host::testing::GuestLog;
using host::testing::guest_at;
using host::testing::run_script;
using host::testing::Step;

// ---- a Host under test -------------------------------------------------------------------------

/// A Host on its own io_context, recording every event and hook call. Drive it with run_until().
struct Harness {
  asio::io_context io;
  // Keeps run_one_for() from seeing an idle loop as stopped while work is on the worker pool.
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  TempDir tmp;
  fs::path state;
  std::vector<host::Event> events;
  std::map<std::string, int> destroyed, removed;
  std::function<void(const std::string&)> on_destroy;  // optional extra reaction
  std::unique_ptr<host::Host> host;

  explicit Harness(std::function<void(host::HostOptions&)> tweak = {}) : state(tmp.path / "state") {
    host::HostOptions o;
    o.state_dir = state;
    o.on_event = [this](const host::Event& e) { events.push_back(e); };
    o.hooks.destroy = [this](const std::string& vm, std::uint64_t) {
      ++destroyed[vm];
      if (on_destroy) on_destroy(vm);
    };
    o.hooks.remove = [this](const std::string& vm, std::uint64_t) { ++removed[vm]; };
    if (tweak) tweak(o);
    host = std::make_unique<host::Host>(io, std::move(o));
  }
  ~Harness() { host.reset(); }

  /// Run the loop until `pred` holds; false if it did not within `bound` (a failure, not a wait).
  bool run_until(const std::function<bool()>& pred, std::chrono::milliseconds bound = 60s) {
    auto end = std::chrono::steady_clock::now() + bound;
    while (!pred()) {
      if (std::chrono::steady_clock::now() > end) return false;
      io.run_one_for(20ms);
    }
    return true;
  }

  host::SessionConfig config(std::string vm, host::OnExitPolicy p = host::OnExitPolicy::stop,
                             std::uint64_t generation = 1) {
    host::SessionConfig c;
    c.vm = std::move(vm);
    c.generation = generation;
    c.descriptor = sample_boot();
    c.on_exit = p;
    c.stop_timeout = 2s;
    return c;
  }

  /// Register `vm`, listen on its own socket, report it started. Returns the socket path.
  std::string add(const host::SessionConfig& c) {
    auto s = host->add_vm(c);
    if (!s) throw std::runtime_error(s.error().message);
    std::string path = (tmp.path / "sock" / (c.vm + ".sock")).string();
    host::UnixListenOptions u;
    u.path = path;
    auto l = host->listen_unix(c.vm, u);
    if (!l) throw std::runtime_error(l.error().message);
    (void)host->vm_started(c.vm);
    return path;
  }

  /// Start a scripted guest on this loop.
  std::shared_ptr<GuestLog> guest(const std::string& path, std::vector<Step> script) {
    return host::testing::spawn_guest_at(io, path, std::move(script));
  }

  bool has_event(const std::string& vm, const std::string& kind) const {
    for (auto& e : events)
      if (e.vm == vm && e.kind == kind) return true;
    return false;
  }
  int count_events(const std::string& vm, const std::string& kind) const {
    int n = 0;
    for (auto& e : events)
      if (e.vm == vm && e.kind == kind) ++n;
    return n;
  }
  const host::Session& session(const std::string& vm) const { return *host->session(vm); }
  bool durable(const std::string& vm) const {
    auto* s = host->session(vm);
    return s && s->durable();
  }
  bool finished(const std::string& vm) const {
    auto* s = host->session(vm);
    return s && s->finished();
  }
  /// The record on disk.
  std::optional<host::Record> record(const std::string& vm) const {
    auto r = host::read_record(state, vm);
    if (!r) throw std::runtime_error(r.error().message);
    return *r;
  }
};

}  // namespace nes::test
