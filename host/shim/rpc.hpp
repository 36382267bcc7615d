// The answers every Task RPC handler builds (host/shim/task_service.cpp and the rooms it calls:
// container.cpp, exec_proc.cpp): a ttrpc::Reply with a message, an error or nothing.
#pragma once

#include <optional>
#include <string>

#include <google/protobuf/message.h>

#include "host/shim/ttrpc.hpp"

namespace nes::shim::rpc {

/// OK with `m` serialized.
inline ttrpc::Reply ok(const google::protobuf::Message& m) { return {{}, m.SerializeAsString()}; }
/// The error `c` saying `msg`.
inline ttrpc::Reply fail(ttrpc::Code c, std::string msg) { return {{c, std::move(msg)}, {}}; }
/// OK with an empty message (google.protobuf.Empty).
inline ttrpc::Reply empty() { return {{}, {}}; }

/// The request `Req` in payload `p`, nullopt when it does not parse.
template <class Req>
std::optional<Req> parse(const std::string& p) {
  Req r;
  if (!r.ParseFromString(p)) return std::nullopt;
  return r;
}

/// The first of a request's stdin/stdout/stderr that names a scheme other than file:// (a FIFO
/// path has none; containerd's binary:// loggers are not supported), or null.
template <class Req>
const std::string* unsupported_stdio(const Req& req) {
  for (const std::string* io : {&req.stdin(), &req.stdout(), &req.stderr()})
    if (io->find("://") != std::string::npos && !io->starts_with("file://")) return io;
  return nullptr;
}

}  // namespace nes::shim::rpc
