// Forwarding header for one release: <nes/host/record.hpp> moved to <nes/host/lib/record.hpp>.
#pragma once

#include "host/lib/record.hpp"
