// The shared vocabulary (base/) under the host library's names: nes::host::Fd, Result, Status,
// Error & co. are aliases of nes::base's, so host code and embedders write host:: (or nothing,
// inside nes::host) for the one owned-fd type and the one result/error vocabulary the init, the
// wire and the host share. Installed as <nes/host/lib/base.hpp>.
#pragma once

#include "base/fd.hpp"
#include "base/result.hpp"

namespace nes::host {

using ::nes::base::errno_error;
using ::nes::base::Error;
using ::nes::base::Fd;
using ::nes::base::Ok;
using ::nes::base::Result;
using ::nes::base::Status;
using ::nes::base::StatusOf;

}  // namespace nes::host
