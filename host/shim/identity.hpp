// Names the shim derives from containerd's (namespace, task id): the VM id and the shim's ttrpc
// socket. Both are SHA-256 of length-framed fields, so no two (namespace, id) pairs share one
// ("a/b" + "c" and "a" + "b/c" differ) and any bytes containerd allows stay out of paths.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace nes::shim {

/// Lower-case hex SHA-256 of the fields, each preceded by its length as 8 bytes big-endian.
/// Never "": if libcrypto cannot make its context (an allocation failure) it prints
/// "containerd-shim-nesinit-v2: libcrypto: no SHA-256 context" to stderr and aborts.
std::string framed_sha256(std::initializer_list<std::string_view> fields);

/// The stem of a task's VM ids: "ctr-" and the first 24 hex digits of framed_sha256({ns, id})
/// (96 bits); also the name of a pod container's directory in the pod's share.
std::string vm_id(std::string_view ns, std::string_view id);

/// A new incarnation id: 16 lower-case hex digits, 64 random bits from getrandom(2) (the
/// kernel's CSPRNG; it does not fail for 8 bytes once the pool is up, else the error says so).
std::string new_incarnation();

/// The VM id of one incarnation of a task: vm_id(ns, id), "-", `incarnation` (45 bytes, a valid
/// neshost VM id: host/lib/state_dir.hpp check_vm_id()). Each Create makes a new incarnation, so
/// a task deleted and created again under the same id runs a VM of another id: its state,
/// control socket and outcome record are never the earlier VM's, and nothing a stale process of
/// that VM writes can be taken for the new one's.
std::string incarnation_vm_id(std::string_view ns, std::string_view id, std::string_view incarnation);

/// The shim's socket: `<dir of containerd's socket>/s/<framed_sha256({address, ns, id})>`, i.e.
/// /run/containerd/s/HEX for the system daemon, as containerd's own shims place theirs; a private
/// daemon's stay under its own directory. At most 108 bytes with Debian's default paths.
std::filesystem::path socket_path(std::string_view containerd_address, std::string_view ns, std::string_view id);

}  // namespace nes::shim
