// Names the shim derives from containerd's (namespace, task id): the VM id and the shim's ttrpc
// socket. Both are SHA-256 of length-framed fields, so no two (namespace, id) pairs share one
// ("a/b" + "c" and "a" + "b/c" differ) and any bytes containerd allows stay out of paths.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace nes::shim {

/// Lower-case hex SHA-256 of the fields, each preceded by its length as 8 bytes big-endian.
std::string framed_sha256(std::initializer_list<std::string_view> fields);

/// The VM id of a task: "ctr-" and the first 24 hex digits of framed_sha256({ns, id}) (96 bits;
/// a valid neshost VM id, host/lib/state_dir.hpp check_vm_id()).
std::string vm_id(std::string_view ns, std::string_view id);

/// The shim's socket: `<dir of containerd's socket>/s/<framed_sha256({address, ns, id})>`, i.e.
/// /run/containerd/s/HEX for the system daemon, as containerd's own shims place theirs; a private
/// daemon's stay under its own directory. At most 108 bytes with Debian's default paths.
std::filesystem::path socket_path(std::string_view containerd_address, std::string_view ns, std::string_view id);

}  // namespace nes::shim
