// Forwarding header: the owned fd (Fd) lives in base/fd.hpp, namespace nes::base, shared by the
// init and the host. This alias keeps nes::host::Fd and <nes/host/fd.hpp> working for host/ code
// and embedders; new code includes "base/fd.hpp" and writes base::Fd.
#pragma once

#include "base/fd.hpp"

namespace nes::host {

using ::nes::base::Fd;

}  // namespace nes::host
