// Forwarding header for one release: <nes/host/log_writer.hpp> moved to <nes/host/lib/log_writer.hpp>.
#pragma once

#include "host/lib/log_writer.hpp"
