// nes::host::testing — the in-memory-pipe harness: either end of the lifecycle channel scripted
// over a connected byte stream (one end of a socketpair, an accepted or dialled Unix socket), so
// an embedder's tests drive their daemon and this library without a VM (scripted guest), and a
// guest end (nesinit, or another implementation of docs/protocol.md) is tested the same way
// (ScriptedHost). Nothing here sleeps to synchronise: every wait is on bytes, EOF or a bounded
// deadline. Installed as <nes/host/lib/testing.hpp>; part of libneshost.
#pragma once

#include <utility>  // before Asio 1.74: awaitable.hpp uses std::exchange without it

#include <boost/asio/awaitable.hpp>
#include <boost/asio/buffers_iterator.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "host/lib/base.hpp"
#include "protocol/line_reader.hpp"
#include "protocol/messages.hpp"

namespace nes::host::testing {

/// Both ends of an in-memory byte stream: socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC).
/// Hand one to Host::attach_stream() (or a guest under test) and script the other.
/// Error: "socketpair: <strerror>".
Result<std::pair<Fd, Fd>> stream_pair();

// ---- guest lines, encoded with '\n' (protocol/codec.hpp) ----------------------------------------

/// The `ready` line of a guest speaking `protocol_version` that announces every feature this build
/// knows (proto::all_features()).
std::string ready_line(std::uint32_t protocol_version = proto::kProtocolVersion);
std::string mounted_line();
/// `started{pid}`; pid >= 1 (the workload's pid in the guest).
std::string started_line(int pid = 7);
/// `workload_exited{exit_code}`, code 0..255.
std::string exited_line(int code);
/// `workload_exited{signal}`, signal 1..64 (the workload was killed; no exit code).
std::string signalled_line(int signal);
/// Type tag of a host line ("boot", "stop", "shutdown", "kill"), or "" if it does not decode.
std::string host_type(std::string_view line);

// ---- a scripted guest ---------------------------------------------------------------------------

/// One step of a guest script; run in order, stopping at the first failure.
namespace step {
struct Send { std::string bytes; };                                   // write these bytes
struct Drip { std::string bytes; std::chrono::milliseconds every{0}; };  // one byte per tick
struct Flood { std::string chunk; std::size_t total; };  // write chunk until `total` bytes (or an error)
struct Expect { std::string type; };  // read one host line; its type must be this ("boot", ...)
struct Pause { std::chrono::milliseconds for_{0}; };       // say nothing this long (a slow guest)
struct WaitClose {};                  // read (and log) host lines until the host closes
struct Close {};                      // close our end now (EOF for the host)
}  // namespace step
using Step = std::variant<step::Send, step::Drip, step::Flood, step::Expect, step::Pause,
                          step::WaitClose, step::Close>;

/// What a scripted guest saw. Shared with the caller, who polls `done`.
struct GuestLog {
  std::vector<std::string> lines;  // lines from the host, '\n' stripped
  bool done = false;               // the script ran to its end (or stopped at a failure)
  std::string error;               // first I/O or expectation failure, empty if none
  bool host_closed = false;        // EOF or reset from the host
};

/// Ready scripts for the usual guests (each a plain vector: append or edit steps freely).
/// A workload that exits with `code` (0..255): ready, expect boot, mounted, started, exited, then
/// read until the host closes (the host's `shutdown` ack is in GuestLog::lines).
std::vector<Step> exits_with(int code);
/// As exits_with, but the workload is killed by `signal` (1..64).
std::vector<Step> killed_by(int signal);
/// Says ready, takes the boot descriptor, then goes silent until the host closes (its deadlines).
std::vector<Step> silent_after_boot();
/// Connects and never says a word (the host's ready deadline is what ends it).
std::vector<Step> silent();
/// Sends `bytes` verbatim where `ready` belongs (a hostile or broken guest), then reads until
/// the host closes.
std::vector<Step> hostile(std::string bytes);

/// Run `script` on `stream`, any Asio stream (AsyncReadStream + AsyncWriteStream with close():
/// local::stream_protocol::socket, posix::stream_descriptor, ...). Stops at the first failure,
/// recorded in log->error; sets log->done at the end either way. `stream` is closed on return.
template <class Stream>
boost::asio::awaitable<void> run_script(Stream stream, std::vector<Step> script,
                                        std::shared_ptr<GuestLog> log) {
  namespace asio = boost::asio;
  asio::streambuf in;
  boost::system::error_code ec;
  auto read_line = [&]() -> asio::awaitable<std::optional<std::string>> {
    std::size_t n = co_await asio::async_read_until(stream, in, '\n',
                                                    asio::redirect_error(asio::use_awaitable, ec));
    if (ec) { log->host_closed = true; co_return std::nullopt; }
    std::string line(asio::buffers_begin(in.data()), asio::buffers_begin(in.data()) + n - 1);
    in.consume(n);
    log->lines.push_back(line);
    co_return line;
  };
  for (auto& s : script) {
    if (auto* x = std::get_if<step::Send>(&s)) {
      co_await asio::async_write(stream, asio::buffer(x->bytes), asio::redirect_error(asio::use_awaitable, ec));
      if (ec) { log->error = "send: " + ec.message(); break; }
    } else if (auto* x = std::get_if<step::Drip>(&s)) {
      asio::steady_timer t(stream.get_executor());
      for (char c : x->bytes) {
        co_await asio::async_write(stream, asio::buffer(&c, 1), asio::redirect_error(asio::use_awaitable, ec));
        if (ec) break;
        t.expires_after(x->every);
        co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      }
      if (ec) { log->error = "drip: " + ec.message(); break; }
    } else if (auto* x = std::get_if<step::Flood>(&s)) {
      std::size_t sent = 0;
      while (sent < x->total) {
        co_await asio::async_write(stream, asio::buffer(x->chunk), asio::redirect_error(asio::use_awaitable, ec));
        if (ec) break;
        sent += x->chunk.size();
      }
      if (ec) { log->error = "flood: " + ec.message(); break; }
    } else if (auto* x = std::get_if<step::Expect>(&s)) {
      auto line = co_await read_line();
      if (!line) { log->error = "expected " + x->type + ", got EOF"; break; }
      if (host_type(*line) != x->type) { log->error = "expected " + x->type + ", got " + *line; break; }
    } else if (auto* x = std::get_if<step::Pause>(&s)) {
      asio::steady_timer t(stream.get_executor(), x->for_);
      co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    } else if (std::holds_alternative<step::WaitClose>(s)) {
      while (co_await read_line()) {
      }
    } else if (std::holds_alternative<step::Close>(s)) {
      stream.close(ec);
    }
  }
  stream.close(ec);
  log->done = true;
}

/// Dial the Unix socket `path` (e.g. a Host's listen_unix() endpoint, or a Firecracker-style
/// `<uds>_<port>` path) and run `script` there; a failed connect is log->error "connect: ...".
boost::asio::awaitable<void> guest_at(std::string path, std::vector<Step> script,
                                      std::shared_ptr<GuestLog> log);

/// Start a scripted guest on `io` over a connected stream fd (one end of stream_pair(), or any
/// connected Unix stream socket). Returns its log; the guest runs as the loop runs.
std::shared_ptr<GuestLog> spawn_guest(boost::asio::io_context& io, Fd stream, std::vector<Step> script);
/// Start a scripted guest on `io` that dials the Unix socket `path` (see guest_at()).
std::shared_ptr<GuestLog> spawn_guest_at(boost::asio::io_context& io, std::string path,
                                         std::vector<Step> script);

// ---- a scripted host, for testing a guest end ---------------------------------------------------

/// The host end of one channel, blocking with bounded waits (poll(2)); no io_context needed.
/// Guest lines are framed with the protocol's cap (proto::kDefaultLineCap); a line that does not
/// decode, or is over the cap, is a failure of next() (the reason in last_error()). Timeouts are
/// in milliseconds. Derive and override pump() to serve other fds in the same poll round (a
/// process's stdout, a listener): tests/init's sandbox around the real init does.
class ScriptedHost {
 public:
  /// No channel yet: attach() one.
  ScriptedHost() = default;
  /// Own `channel`, a connected stream fd (made non-blocking).
  explicit ScriptedHost(Fd channel);
  virtual ~ScriptedHost() = default;
  ScriptedHost(const ScriptedHost&) = delete;
  ScriptedHost& operator=(const ScriptedHost&) = delete;

  /// Take `channel` as the channel (replacing and closing any earlier one).
  void attach(Fd channel);
  /// A channel is attached (it may have reached EOF).
  bool attached() const { return static_cast<bool>(chan_); }

  /// The next guest message; nullopt on EOF, timeout, an over-long or undecodable line
  /// (last_error() says which: "EOF", "timeout", "over-long line from the guest",
  /// "undecodable guest line: <line>").
  std::optional<proto::GuestMessage> next(int timeout_ms = 10000);
  /// The next message, required to be a T (else nullopt, "unexpected message: <line>").
  template <class T>
  std::optional<T> expect(int timeout_ms = 10000) {
    auto m = next(timeout_ms);
    if (!m) return std::nullopt;
    if (auto* t = std::get_if<T>(&*m)) return *t;
    last_error_ = "unexpected message: " + describe(*m);
    return std::nullopt;
  }
  /// The usual opening: `ready` (version checked), send `boot`, then `mounted` and `started`.
  /// false at the first step that fails, that step named in last_error() ("ready: timeout").
  bool open(const proto::Boot& boot, int timeout_ms = 10000);

  /// Send one message (encoded line).
  bool send(const proto::HostMessage& m);
  /// Send raw bytes (hostile input): false if the channel closed or `timeout_ms` passed first.
  bool send_raw(std::string_view bytes, int timeout_ms = 10000);
  /// Close our end (EOF for the guest).
  void close();
  /// True once the guest closed its end (after every complete line was read); bounded wait.
  bool wait_eof(int timeout_ms = 10000);
  /// The guest closed its end (or a read failed).
  bool eof() const { return eof_; }

  const std::string& last_error() const { return last_error_; }

 protected:
  /// One wait for input, at most timeout_ms: poll the channel and read what it has. Returns
  /// false if nothing happened before the timeout. Overrides must call read_channel() when the
  /// channel (channel_fd(), -1 if none or at EOF) is readable.
  virtual bool pump(int timeout_ms);
  /// Read everything the channel has now (non-blocking) into the line reader; EOF noted.
  void read_channel();
  /// Called with each chunk read_channel() reads, before it is framed (e.g. to log the timeline).
  virtual void on_bytes(std::string_view) {}
  /// Called with each message send() is about to write (e.g. to note what a boot asked for).
  virtual void on_send(const proto::HostMessage&) {}
  /// The channel fd to poll for input: -1 if none or already at EOF.
  int channel_fd() const { return chan_ && !eof_ ? chan_.get() : -1; }
  /// Monotonic milliseconds (the clock every deadline here uses).
  static std::uint64_t now_ms();
  static std::string describe(const proto::GuestMessage& m);

  std::string last_error_;

 private:
  Fd chan_;
  bool eof_ = false;
  proto::LineReader reader_;
};

}  // namespace nes::host::testing
