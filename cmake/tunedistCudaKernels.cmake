# Included by CMakeLists.txt after cmake/tunedistNccl.cmake. Decides whether libtunedist gets the hooks' CUDA kernels
# (csrc/hooks/cuda: fused fp16/bf16 compression and PowerSGD's error feedback on CUDA tensors) and builds them.
#
# TUNEDIST_CUDA_KERNELS: ON, OFF, or unset (= ON when the NCCL side is on and a CUDA compiler is found; nvcc is
# looked for on PATH, in CUDACXX and in /usr/local/cuda). Without them, CUDA tensors in the hooks take ATen's ops.
#
# The kernels are plain CUDA (no torch headers): kernels.cu exports C-typed launchers (launch.h), and dispatch.cpp,
# C++ against torch's headers, calls them on torch's current stream. They link the CUDA runtime that torch itself
# loads (libcudart.so.13 of the nvidia-* wheels, found by the same file name in the toolkit otherwise), so there is
# one runtime in the process.
include_guard(DIRECTORY)
include(CheckLanguage)

set(_tunedist_cuda_kernels_default OFF)
if(TUNEDIST_USE_NCCL AND NOT DEFINED TUNEDIST_CUDA_KERNELS)
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(_tunedist_cuda_kernels_default ON)
  endif()
endif()
option(TUNEDIST_CUDA_KERNELS "Build the hooks' CUDA kernels (needs nvcc and the NCCL side)" ${_tunedist_cuda_kernels_default})

if(TUNEDIST_CUDA_KERNELS AND NOT TUNEDIST_USE_NCCL)
  message(FATAL_ERROR "tunedist: TUNEDIST_CUDA_KERNELS=ON needs the NCCL side (TUNEDIST_USE_NCCL=ON): both need a "
                      "CUDA build of torch and the CUDA runtime headers.")
endif()

# enable_language must run at file scope, not in the function below.
if(TUNEDIST_CUDA_KERNELS)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    # Turing to Hopper as machine code, Hopper's PTX for anything newer (JIT-compiled by the driver).
    set(CMAKE_CUDA_ARCHITECTURES "75-real;80-real;86-real;90-real;90-virtual")
  endif()
  enable_language(CUDA)
endif()

# Adds the kernels to `target` (the dispatch source `dispatch_source` is compiled only here).
function(tunedist_add_cuda_kernels target dispatch_source)
  if(NOT TUNEDIST_CUDA_KERNELS)
    message(STATUS "tunedist: hooks' CUDA kernels OFF (CUDA tensors in the hooks use ATen's ops)")
    return()
  endif()
  # _tunedist_site: torch's site-packages, from cmake/tunedistNccl.cmake (included first).
  file(GLOB _wheel_libs LIST_DIRECTORIES true "${_tunedist_site}/nvidia/*/lib")
  find_library(TUNEDIST_CUDART_LIBRARY NAMES libcudart.so.13 libcudart.so.12 HINTS ${_wheel_libs} NO_DEFAULT_PATH)
  if(NOT TUNEDIST_CUDART_LIBRARY)
    find_package(CUDAToolkit REQUIRED)
    find_library(TUNEDIST_CUDART_LIBRARY NAMES libcudart.so.13 libcudart.so.12 HINTS ${CUDAToolkit_LIBRARY_DIR})
  endif()
  if(NOT TUNEDIST_CUDART_LIBRARY)
    message(FATAL_ERROR "tunedist: TUNEDIST_CUDA_KERNELS=ON but no libcudart.so.13/.12 (torch's nvidia-* wheels or "
                        "the CUDA toolkit); configure with -DTUNEDIST_CUDA_KERNELS=OFF")
  endif()
  # Installed next to torch (site-packages/tunedist): find the wheel's runtime from there, as libtorch_cuda does.
  get_filename_component(_cudart_dir "${TUNEDIST_CUDART_LIBRARY}" DIRECTORY)
  file(RELATIVE_PATH _cudart_rel "${_tunedist_site}" "${_cudart_dir}")
  if(NOT _cudart_rel MATCHES "^\\.\\.")
    set(TUNEDIST_CUDART_INSTALL_RPATH "$ORIGIN/../${_cudart_rel}" PARENT_SCOPE)
  endif()
  add_library(tunedist_cuda_kernels STATIC ${CMAKE_CURRENT_SOURCE_DIR}/csrc/hooks/cuda/kernels.cu)
  set_target_properties(tunedist_cuda_kernels PROPERTIES POSITION_INDEPENDENT_CODE ON CUDA_RUNTIME_LIBRARY None
                                                           CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
  target_include_directories(tunedist_cuda_kernels PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/csrc)
  target_sources(${target} PRIVATE ${dispatch_source})
  target_compile_definitions(${target} PRIVATE TUNEDIST_WITH_CUDA_KERNELS=1)
  target_link_libraries(${target} PRIVATE tunedist_cuda_kernels ${TUNEDIST_CUDART_LIBRARY})
  message(STATUS "tunedist: hooks' CUDA kernels ON (${CMAKE_CUDA_COMPILER}, architectures "
                 "${CMAKE_CUDA_ARCHITECTURES}, runtime ${TUNEDIST_CUDART_LIBRARY})")
endfunction()
