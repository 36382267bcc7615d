// Where the two channels meet (docs/protocol.md "Transport and addressing", "Data channel"): the
// vsock ports and virtio-serial port names both ends must agree on, since the init dials by
// them and the host listens or builds the VMM's devices by them. Header-only, std only; the
// names are C strings, as the init compares and copies them (no std::string_view conversion).
#pragma once

#include <cstdint>

namespace nes::proto {

/// The lifecycle channel's vsock port: the init dials the host (CID 2) on it by default; the
/// host listens on it (on Firecracker/Cloud Hypervisor the connection arrives on `<uds>_7000`).
inline constexpr std::uint32_t kLifecycleVsockPort = 7000;
/// The data channel's vsock port (the workload's stdio, boot.stdio): the init's default beside a
/// vsock lifecycle channel, same CID; the host's listener for it (`<uds>_7001`).
inline constexpr std::uint32_t kDataVsockPort = 7001;

/// The lifecycle channel's virtio-serial port name, as the guest reads it in
/// /sys/class/virtio-ports/*/name (the host's VMM names the port so: QEMU's
/// `virtserialport,name=`).
inline constexpr const char* kLifecyclePortName = "nes.0";
/// The data channel's virtio-serial port name: the init's default beside a lifecycle channel on
/// port kLifecyclePortName; a second port on the same virtio-serial bus on the host's side.
inline constexpr const char* kDataPortName = "nes.1";

}  // namespace nes::proto
