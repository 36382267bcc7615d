// Test support for host/: temp dirs, a Host harness driven by events (never sleeps), and scripted
// fake guests (Asio coroutines speaking raw bytes over Unix sockets).
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
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "host/host.hpp"
#include "protocol/codec.hpp"

namespace nes::test {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

/// A fresh directory under $TMPDIR (short path: sun_path is 108 bytes), removed on destruction.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "nesh-XXXXXX").string();
    char* p = ::mkdtemp(tmpl.data());
    if (!p) throw std::runtime_error("mkdtemp failed");
    path = p;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

/// A minimal valid boot descriptor.
inline proto::Boot sample_boot() {
  proto::Boot b;
  b.exec.argv = {"/bin/sh", "-c", "exit 3"};
  b.exec.env = {{"PATH", "/usr/bin:/bin"}};
  b.geometry = {640, 480, 30, false};
  b.on_exit.terminal = true;
  return b;
}

inline std::string ready_line(std::uint32_t v = 2) {
  return proto::encode(proto::GuestMessage{proto::Ready{v}}) + "\n";
}
inline std::string exited_line(int code) {
  return proto::encode(proto::GuestMessage{proto::WorkloadExited::code(static_cast<std::uint8_t>(code))}) + "\n";
}
inline std::string signalled_line(int sig) {
  return proto::encode(proto::GuestMessage{proto::WorkloadExited::killed(static_cast<std::uint8_t>(sig))}) + "\n";
}
inline std::string started_line(int pid = 7) {
  return proto::encode(proto::GuestMessage{proto::Started{pid}}) + "\n";
}

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

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAsan = true;
#else
inline constexpr bool kAsan = false;
#endif

// ---- scripted fake guests ----------------------------------------------------------------------

namespace step {
struct Send { std::string bytes; };                            // write these bytes
struct Drip { std::string bytes; std::chrono::milliseconds every; };  // one byte per tick
struct Flood { std::string chunk; std::size_t total; };         // write chunk repeatedly (stops on error)
struct Expect { std::string type; };                            // read one line; its type must be this
struct WaitClose {};                                            // read until the host closes
struct Close {};                                                // close our end now
}  // namespace step
using Step = std::variant<step::Send, step::Drip, step::Flood, step::Expect, step::WaitClose, step::Close>;

/// What a fake guest saw.
struct GuestLog {
  std::vector<std::string> lines;  // lines from the host
  bool done = false;               // the script ran to its end (or stopped on an error)
  std::string error;               // first I/O or expectation failure, if any
  bool host_closed = false;        // EOF/reset from the host
};

/// Type tag of a host line ("boot", "shutdown", ...), or "" if it does not decode.
inline std::string host_type(const std::string& line) {
  auto d = proto::decode_host(line);
  if (auto* m = std::get_if<proto::HostMessage>(&d)) return std::string(proto::type_name(*m));
  return "";
}

/// Run `script` on a connected socket. Stops at the first failure (recorded in log->error).
inline asio::awaitable<void> run_script(asio::local::stream_protocol::socket sock,
                                        std::vector<Step> script, std::shared_ptr<GuestLog> log) {
  asio::streambuf in;
  boost::system::error_code ec;
  auto read_line = [&]() -> asio::awaitable<std::optional<std::string>> {
    std::size_t n = co_await asio::async_read_until(sock, in, '\n', asio::redirect_error(asio::use_awaitable, ec));
    if (ec) { log->host_closed = true; co_return std::nullopt; }
    std::string line(asio::buffers_begin(in.data()), asio::buffers_begin(in.data()) + n - 1);
    in.consume(n);
    log->lines.push_back(line);
    co_return line;
  };
  for (auto& s : script) {
    if (auto* x = std::get_if<step::Send>(&s)) {
      co_await asio::async_write(sock, asio::buffer(x->bytes), asio::redirect_error(asio::use_awaitable, ec));
      if (ec) { log->error = "send: " + ec.message(); break; }
    } else if (auto* x = std::get_if<step::Drip>(&s)) {
      asio::steady_timer t(sock.get_executor());
      for (char c : x->bytes) {
        co_await asio::async_write(sock, asio::buffer(&c, 1), asio::redirect_error(asio::use_awaitable, ec));
        if (ec) break;
        t.expires_after(x->every);
        co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      }
      if (ec) { log->error = "drip: " + ec.message(); break; }
    } else if (auto* x = std::get_if<step::Flood>(&s)) {
      std::size_t sent = 0;
      while (sent < x->total) {
        co_await asio::async_write(sock, asio::buffer(x->chunk), asio::redirect_error(asio::use_awaitable, ec));
        if (ec) break;
        sent += x->chunk.size();
      }
      if (ec) { log->error = "flood: " + ec.message(); break; }
    } else if (auto* x = std::get_if<step::Expect>(&s)) {
      auto line = co_await read_line();
      if (!line) { log->error = "expected " + x->type + ", got EOF"; break; }
      if (host_type(*line) != x->type) { log->error = "expected " + x->type + ", got " + *line; break; }
    } else if (std::holds_alternative<step::WaitClose>(s)) {
      for (;;) {
        auto line = co_await read_line();
        if (!line) break;
      }
    } else if (std::holds_alternative<step::Close>(s)) {
      sock.close(ec);
    }
  }
  log->done = true;
}

/// Connect to a Unix socket path and run a script on it.
inline asio::awaitable<void> guest_at(std::string path, std::vector<Step> script,
                                      std::shared_ptr<GuestLog> log) {
  asio::local::stream_protocol::socket sock(co_await asio::this_coro::executor);
  boost::system::error_code ec;
  co_await sock.async_connect(asio::local::stream_protocol::endpoint(path),
                              asio::redirect_error(asio::use_awaitable, ec));
  if (ec) {
    log->error = "connect: " + ec.message();
    log->done = true;
    co_return;
  }
  co_await run_script(std::move(sock), std::move(script), log);
}

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
    auto log = std::make_shared<GuestLog>();
    asio::co_spawn(io, guest_at(path, std::move(script), log), asio::detached);
    return log;
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
