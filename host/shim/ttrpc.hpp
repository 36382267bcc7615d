// ttrpc, containerd's RPC for shims (github.com/containerd/ttrpc): frames over a Unix stream,
// each a 10-byte header (length u32 BE, stream id u32 BE, type u8, flags u8) and a protobuf
// Request or Response of at most 4 MiB. Clients use odd stream ids; several calls may be in flight
// on one connection and are answered in any order. There is no C++ ttrpc library: this is the
// smallest exact one the shim needs: the framing (host/shim/ttrpc_frame.hpp, sans-I/O, fuzzed),
// the envelope (libprotobuf) and here the I/O: Server and call(). Why and how: docs/containerd.md "ttrpc".
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "host/lib/base.hpp"
#include "host/shim/ttrpc_frame.hpp"

namespace nes::ttrpc {

/// google.rpc.Code (google/rpc/code.proto): the status codes ttrpc carries; containerd's errdefs
/// maps them to its errors (NOT_FOUND -> ErrNotFound, UNIMPLEMENTED -> ErrNotImplemented, ...).
enum class Code : std::int32_t {
  ok = 0, cancelled = 1, unknown = 2, invalid_argument = 3, deadline_exceeded = 4, not_found = 5,
  already_exists = 6, permission_denied = 7, resource_exhausted = 8, failed_precondition = 9,
  aborted = 10, out_of_range = 11, unimplemented = 12, internal = 13, unavailable = 14,
};

/// A call's status: code and a one-line message for the caller.
struct Status {
  Code code = Code::ok;
  std::string message;
  bool ok() const { return code == Code::ok; }
};

/// One call as the server received it. `timeout_ns` 0 means none given.
struct Call {
  std::string service;  // e.g. "containerd.task.v2.Task"
  std::string method;   // e.g. "Create"
  std::string payload;  // the method's request message, serialized
  std::int64_t timeout_ns = 0;
  std::vector<std::pair<std::string, std::string>> metadata;
};

/// A call's answer: a status and, when ok, the method's response message serialized.
struct Reply {
  Status status;
  std::string payload;
};

/// A serialized ttrpc Request (the client side's half; used by call() and the tests).
std::string encode_request(const Call& c);
/// Parse a serialized Response; error when it is not one.
host::Result<Reply> decode_response(std::string_view bytes);
/// A serialized Response.
std::string encode_response(const Reply& r);

/// Answers one call; call it once, on the server's io_context thread (later calls, and calls after
/// the connection has gone, are ignored).
using Respond = std::function<void(Reply)>;
/// A method: may answer at once or keep `respond` and answer later (e.g. Task.Wait).
using Method = std::function<void(Call&& call, Respond respond)>;

/// A ttrpc server on one io_context: every connection served concurrently, calls dispatched by
/// service and method. An unknown service or method answers UNIMPLEMENTED ("service X" / "method
/// Y", as ttrpc's own server), an unparsable Request INVALID_ARGUMENT, an even stream id
/// INVALID_ARGUMENT, an oversized one RESOURCE_EXHAUSTED, a call beyond kMaxInFlight unanswered
/// ones RESOURCE_EXHAUSTED; the connection keeps serving. It is closed only on EOF or a read or
/// write error. While more than kMaxQueuedBytes of answers wait for the peer, it is not read.
class Server {
 public:
  /// Calls a connection may have unanswered; more are refused RESOURCE_EXHAUSTED.
  static constexpr std::size_t kMaxInFlight = 1024;
  /// Answer bytes queued for a peer beyond which its connection is not read.
  static constexpr std::size_t kMaxQueuedBytes = 8u << 20;

  explicit Server(boost::asio::io_context& io);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Register a method (before serving).
  void add(std::string service, std::string method, Method m);
  /// Accept connections on a listening Unix socket. Owns the fd.
  void serve(host::Fd listener);
  /// Serve one already-connected stream (a socketpair in tests). Owns the fd.
  void serve_connection(host::Fd conn);
  /// Connections open now.
  std::size_t connections() const;
  /// Stop accepting new connections; those open keep being served.
  void stop_accepting();
  /// Stop accepting and close every connection (unanswered calls are dropped).
  void close();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

/// Listen on a Unix socket at `path` (an existing socket there is replaced; the directory is
/// created 0711). Error names the path.
host::Result<host::Fd> listen_unix(const std::filesystem::path& path);

/// One blocking call on a new connection to the Unix socket `path`, bounded by `timeout` (connect,
/// send and the answer together). The reply's status is the server's; an error means no answer
/// (no server, timeout, a malformed response).
host::Result<Reply> call(const std::filesystem::path& path, const Call& c,
                         std::chrono::milliseconds timeout);

}  // namespace nes::ttrpc
