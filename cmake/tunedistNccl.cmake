# Included by CMakeLists.txt after find_package(Torch). Decides whether libtunedist gets its NCCL side (CUDA tensors
# of a `tuned` group go to a wrapped c10d::ProcessGroupNCCL) and sets it up on a target.
#
# TUNEDIST_USE_NCCL: ON, OFF, or unset (= ON when torch was built with CUDA and the headers below are found).
#
# What the NCCL side compiles against. The NCCL side is plain C++ (no CUDA code): it includes torch's
# ProcessGroupNCCL.hpp, which needs the CUDA runtime headers and nccl.h, and it links libtorch_cuda, which holds
# ProcessGroupNCCL and itself loads libnccl.so.2. tunedist does not link libnccl directly, so it always uses the NCCL
# that torch loads. The headers should be that NCCL's too: ProcessGroupNCCL::Options embeds ncclConfig_t, whose layout
# changes between NCCL releases. Searched in this order:
#   - TUNEDIST_NCCL_INCLUDE_DIR, TUNEDIST_CUDA_INCLUDE_DIRS if given;
#   - the nvidia-* pip wheels next to torch (site-packages/nvidia/nccl/include, nvidia/cu13/include, ...): what a
#     pip-installed torch loads at run time;
#   - the CUDA toolkit (find_package(CUDAToolkit), headers only). Its nccl.h may be older than torch's NCCL; the
#     NCCL side compares versions at run time and refuses a different major.minor (see nccl_factory.cpp).
include_guard(DIRECTORY)

get_filename_component(_tunedist_site "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
file(GLOB _tunedist_wheel_includes LIST_DIRECTORIES true "${_tunedist_site}/nvidia/*/include")

find_library(TUNEDIST_TORCH_CUDA_LIBRARY torch_cuda PATHS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH)
find_library(TUNEDIST_C10_CUDA_LIBRARY c10_cuda PATHS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH)

find_path(TUNEDIST_NCCL_INCLUDE_DIR nccl.h HINTS "${_tunedist_site}/nvidia/nccl/include" $ENV{NCCL_ROOT}/include
          PATHS /usr/local/cuda/include /usr/include)
# The wheels' runtime headers are complete only with the compiler's crt/ headers beside them (cuda_runtime_api.h
# includes crt/host_defines.h): some images ship nvidia/cu13/include without crt/ and the toolkit in
# /usr/local/cuda. Then the toolkit's include directory comes first and the wheels' after it (for headers the
# toolkit lacks).
find_path(_tunedist_cudart_include cuda_runtime_api.h HINTS ${_tunedist_wheel_includes} NO_CACHE)
if(_tunedist_cudart_include AND EXISTS "${_tunedist_cudart_include}/crt/host_defines.h")
  set(_tunedist_cuda_includes ${_tunedist_wheel_includes})
else()
  find_package(CUDAToolkit QUIET)
  set(_tunedist_cuda_includes ${CUDAToolkit_INCLUDE_DIRS})
  if(_tunedist_cudart_include)
    if(NOT CUDAToolkit_INCLUDE_DIRS)
      message(WARNING "tunedist: ${_tunedist_cudart_include} has cuda_runtime_api.h but not crt/host_defines.h, and "
        "no CUDA toolkit was found to supply it: the NCCL side will not compile. Install the CUDA toolkit or set "
        "TUNEDIST_CUDA_INCLUDE_DIRS.")
    endif()
    list(APPEND _tunedist_cuda_includes ${_tunedist_wheel_includes})
  endif()
endif()
set(TUNEDIST_CUDA_INCLUDE_DIRS "${_tunedist_cuda_includes}" CACHE STRING "CUDA runtime headers for the NCCL side")

set(_tunedist_nccl_ready OFF)
if(TUNEDIST_TORCH_CUDA_LIBRARY AND TUNEDIST_C10_CUDA_LIBRARY AND TUNEDIST_NCCL_INCLUDE_DIR
   AND TUNEDIST_CUDA_INCLUDE_DIRS)
  set(_tunedist_nccl_ready ON)
endif()

# Cached as a BOOL either way (a bare -DTUNEDIST_USE_NCCL=OFF is cached untyped).
if(DEFINED TUNEDIST_USE_NCCL)
  set(_tunedist_use_nccl ${TUNEDIST_USE_NCCL})
else()
  set(_tunedist_use_nccl ${_tunedist_nccl_ready})
endif()
set(TUNEDIST_USE_NCCL ${_tunedist_use_nccl} CACHE BOOL "Build the NCCL side for CUDA tensors" FORCE)

if(TUNEDIST_USE_NCCL AND NOT _tunedist_nccl_ready)
  message(FATAL_ERROR "tunedist: TUNEDIST_USE_NCCL=ON needs a CUDA build of torch (libtorch_cuda: "
    "${TUNEDIST_TORCH_CUDA_LIBRARY}), nccl.h (${TUNEDIST_NCCL_INCLUDE_DIR}) and the CUDA runtime headers "
    "(${TUNEDIST_CUDA_INCLUDE_DIRS}). Set TUNEDIST_NCCL_INCLUDE_DIR / TUNEDIST_CUDA_INCLUDE_DIRS, or configure "
    "with -DTUNEDIST_USE_NCCL=OFF for a CPU-only build.")
endif()

if(TUNEDIST_USE_NCCL)
  file(STRINGS "${TUNEDIST_NCCL_INCLUDE_DIR}/nccl.h" _tunedist_nccl_ver REGEX "#define NCCL_(MAJOR|MINOR|PATCH) ")
  message(STATUS "tunedist: NCCL side ON (nccl.h in ${TUNEDIST_NCCL_INCLUDE_DIR}: ${_tunedist_nccl_ver})")
else()
  message(STATUS "tunedist: NCCL side OFF (CPU-only build; CUDA tensors of a `tuned` group raise a clear error)")
endif()

# Adds the NCCL side's source and dependencies to `target` when TUNEDIST_USE_NCCL is ON.
function(tunedist_add_nccl_side target source)
  if(NOT TUNEDIST_USE_NCCL)
    return()
  endif()
  target_sources(${target} PRIVATE ${source})
  target_compile_definitions(${target} PRIVATE TUNEDIST_WITH_NCCL=1)
  set_source_files_properties(${source} PROPERTIES COMPILE_DEFINITIONS USE_C10D_NCCL=1)
  target_include_directories(${target} SYSTEM PRIVATE ${TUNEDIST_NCCL_INCLUDE_DIR} ${TUNEDIST_CUDA_INCLUDE_DIRS})
  target_link_libraries(${target} PRIVATE ${TUNEDIST_TORCH_CUDA_LIBRARY} ${TUNEDIST_C10_CUDA_LIBRARY})
endfunction()
