# Included by CMakeLists.txt before find_package(Torch). Checks that the C++ compiler links libstdc++ as a shared
# library into a shared object, as torch's own libraries do.
#
# Why: a compiler whose libstdc++ comes only as a static archive (or whose specs say -static-libstdc++) copies
# libstdc++ into libtunedist.so. The process then holds two libstdc++: torch's (the system's libstdc++.so.6) and
# ours. Each numbers its locale facets on its own, so the first stream insertion of a number in our code finds
# another copy's facet and crashes (seen on the GPU machine, 2026-12-04: /opt/gcc/bin/g++ 13.3, a segfault in
# `import tunedist` inside ostream::_M_insert<unsigned long> -> codecvt<char16_t>::do_in, both from libtunedist.so).
# So configure stops here with the fix instead of building a library that crashes at import.
include_guard(DIRECTORY)

function(tunedist_check_shared_libstdcxx)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang" OR NOT CMAKE_SYSTEM_NAME STREQUAL "Linux")
    return()
  endif()
  find_program(_readelf NAMES ${CMAKE_READELF} readelf)
  if(NOT _readelf)
    message(STATUS "tunedist: no readelf, not checking how ${CMAKE_CXX_COMPILER} links libstdc++")
    return()
  endif()
  set(dir "${CMAKE_BINARY_DIR}/CMakeFiles/tunedist_libstdcxx_probe")
  file(MAKE_DIRECTORY "${dir}")
  # A number into a stream: the libstdc++ code that crashed, never inlined (an extern template of the library).
  file(WRITE "${dir}/probe.cpp"
       "#include <sstream>\n#include <string>\n"
       "std::string tunedist_probe(unsigned long v) { std::ostringstream s; s << v; return s.str(); }\n")
  separate_arguments(cxx_flags UNIX_COMMAND "${CMAKE_CXX_FLAGS}")
  separate_arguments(link_flags UNIX_COMMAND "${CMAKE_SHARED_LINKER_FLAGS}")
  execute_process(
    COMMAND "${CMAKE_CXX_COMPILER}" ${cxx_flags} -fPIC -shared probe.cpp -o libprobe.so ${link_flags}
    WORKING_DIRECTORY "${dir}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "tunedist: ${CMAKE_CXX_COMPILER} could not link a shared library (${dir}/probe.cpp):\n${out}")
  endif()
  execute_process(COMMAND "${_readelf}" -d "${dir}/libprobe.so" OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(STATUS "tunedist: readelf failed on the libstdc++ probe, not checking it")
    return()
  endif()
  if(NOT dynamic MATCHES "NEEDED[^\n]*libstdc\\+\\+\\.so")
    message(FATAL_ERROR
      "tunedist: ${CMAKE_CXX_COMPILER} links libstdc++ statically into shared libraries (its probe "
      "${dir}/libprobe.so needs no libstdc++.so). libtunedist would then carry its own libstdc++ next to torch's "
      "and crash at import (two copies of the locale facets). Configure with a compiler that links the shared "
      "libstdc++, e.g. the system's: CXX=/usr/bin/g++ CC=/usr/bin/gcc (pip install: the same variables; cmake: "
      "-DCMAKE_CXX_COMPILER=/usr/bin/g++ -DCMAKE_C_COMPILER=/usr/bin/gcc in a fresh build directory).")
  endif()
endfunction()

tunedist_check_shared_libstdcxx()
