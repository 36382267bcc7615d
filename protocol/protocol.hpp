// Everything of the lifecycle and data channels: messages, codec, framing, frames, exit statuses.
#pragma once
#include "codec.hpp"
#include "frame.hpp"
#include "line_reader.hpp"
#include "messages.hpp"
#include "status.hpp"
