// Catch2 for the tests that include torch headers. c10's logging (c10/util/logging_is_not_google_glog.h) defines a
// glog-style CHECK that aborts on failure and is not counted; whichever header comes last wins, so a test that
// includes ATen after Catch2 silently gets c10's CHECK. Include c10's logging first, drop its CHECK, then Catch2:
// c10's header is include-guarded, so later torch includes do not bring its CHECK back.
#pragma once

#include <c10/util/Logging.h>

#undef CHECK

#include <catch2/catch.hpp>
