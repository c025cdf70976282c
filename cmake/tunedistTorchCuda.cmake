# Include before find_package(Torch) so it also works on a machine with no CUDA toolkit.
#
# With a CUDA build of torch (the default PyPI wheel on Linux), TorchConfig.cmake runs torch's
# Caffe2/public/cuda.cmake. That script needs a CUDA toolkit: with no nvcc it stops with "Your installed Caffe2
# version uses CUDA but I cannot find the CUDA libraries". Where a toolkit is present, it enables the CUDA language
# (about 20 s of configure) and adds the toolkit's libnvrtc to TORCH_LIBRARIES, so an absolute /usr/local/cuda path
# would end up in what tunedist links and exports. None of this is needed to compile CPU code against torch's
# headers and link its libraries, because those libraries find the CUDA runtime on their own, through their RUNPATH
# into the nvidia-* wheels.
#
# cuda.cmake returns at once if the target torch::cudart exists (that is its include guard), so defining an empty
# torch::cudart first skips the toolkit search. TUNEDIST_TORCH_CUDA_TOOLKIT decides when to do that:
#   OFF   always skip it. This is tunedist's own build unless TUNEDIST_USE_NCCL is on, since it compiles no CUDA.
#   AUTO  skip it only when no nvcc is found, the way torch's FindCUDA would look for one. This is the default for
#         find_package(tunedist): a project that compiles CUDA itself keeps torch's full CUDA setup.
#   ON    never skip it.
include_guard(DIRECTORY)

if(NOT DEFINED TUNEDIST_TORCH_CUDA_TOOLKIT)
  set(TUNEDIST_TORCH_CUDA_TOOLKIT AUTO)
endif()

if(NOT TARGET torch::cudart AND NOT TUNEDIST_TORCH_CUDA_TOOLKIT STREQUAL "ON")
  set(_tunedist_skip_cuda_toolkit OFF)
  if(TUNEDIST_TORCH_CUDA_TOOLKIT STREQUAL "OFF")
    set(_tunedist_skip_cuda_toolkit ON)
  elseif(NOT CUDA_TOOLKIT_ROOT_DIR AND NOT CMAKE_CUDA_COMPILER)
    find_program(TUNEDIST_TORCH_NVCC NAMES nvcc
      HINTS ENV CUDA_TOOLKIT_ROOT ENV CUDA_PATH ENV CUDA_BIN_PATH
      PATHS /usr/local/cuda /opt/cuda
      PATH_SUFFIXES bin cuda/bin
      DOC "nvcc as torch's FindCUDA would find it (tunedist skips torch's CUDA setup where there is none)")
    mark_as_advanced(TUNEDIST_TORCH_NVCC)
    if(NOT TUNEDIST_TORCH_NVCC)
      set(_tunedist_skip_cuda_toolkit ON)
    endif()
  endif()
  if(_tunedist_skip_cuda_toolkit)
    message(STATUS "tunedist: skipping torch's CUDA toolkit setup (TUNEDIST_TORCH_CUDA_TOOLKIT="
                   "${TUNEDIST_TORCH_CUDA_TOOLKIT}); torch's libraries still link")
    add_library(torch::cudart INTERFACE IMPORTED)
  endif()
  unset(_tunedist_skip_cuda_toolkit)
endif()
