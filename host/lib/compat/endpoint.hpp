// Forwarding header for one release: <nes/host/endpoint.hpp> moved to <nes/host/lib/endpoint.hpp>.
#pragma once

#include "host/lib/endpoint.hpp"
