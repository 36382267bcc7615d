// Forwarding header: the result/error vocabulary (Error, errno_error, Result, Ok, StatusOf,
// Status) lives in base/result.hpp, namespace nes::base, shared by the init, the wire and the
// host. These aliases keep nes::host::Result & co. and <nes/host/result.hpp> working for host/
// code and embedders; new code includes "base/result.hpp" and writes base::.
#pragma once

#include "base/result.hpp"

namespace nes::host {

using ::nes::base::errno_error;
using ::nes::base::Error;
using ::nes::base::Ok;
using ::nes::base::Result;
using ::nes::base::Status;
using ::nes::base::StatusOf;

}  // namespace nes::host
