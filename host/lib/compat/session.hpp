// Forwarding header for one release: <nes/host/session.hpp> moved to <nes/host/lib/session.hpp>.
#pragma once

#include "host/lib/session.hpp"
