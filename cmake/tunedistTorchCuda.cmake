# Include before find_package(Torch). It lets CPU-only code find a CUDA build of torch with or without a CUDA toolkit.
#
# With a CUDA build of torch (the default PyPI wheel on Linux), TorchConfig.cmake runs torch's
# Caffe2/public/cuda.cmake, which causes three problems for code that compiles no CUDA:
#   - With no CUDA toolkit, it stops with "Your installed Caffe2 version uses CUDA but I cannot find the CUDA
#     libraries".
#   - With a toolkit, it links the toolkit's libraries and puts the toolkit's lib directory in the link RPATH. ld then
#     resolves libtorch_cuda.so's own dependencies there instead of in torch's nvidia-* wheels. A toolkit whose
#     libnccl is older than torch's fails the link with "libtorch_cuda.so: undefined reference to `ncclCommGrow'".
#     (This is seen with CUDA 13.0 and torch 2.15+cu132.)
#   - It spends about 20 s enabling the CUDA language.
# None of it is needed to compile CPU code against torch's headers and link its libraries, because those libraries
# find the CUDA runtime themselves through their RPATH into the nvidia-* wheels.
#
# cuda.cmake returns at once if the target torch::cudart exists (that is its include guard), so an empty
# torch::cudart defined first skips it. This file does that unless torch::cudart exists already, which is the case
# when the project ran find_package(Torch) itself first (then torch's full CUDA setup stays as it was), or unless
# TUNEDIST_TORCH_CUDA_TOOLKIT is ON. tunedist's own build never sets it: even its NCCL side (TUNEDIST_USE_NCCL) is
# plain C++ that takes its CUDA headers from cmake/tunedistNccl.cmake.
include_guard(DIRECTORY)

option(TUNEDIST_TORCH_CUDA_TOOLKIT "Let find_package(Torch) set up the CUDA toolkit (needed only to compile CUDA)" OFF)

if(NOT TARGET torch::cudart AND NOT TUNEDIST_TORCH_CUDA_TOOLKIT)
  message(STATUS "tunedist: skipping torch's CUDA toolkit setup (CPU-only use of torch; "
                 "find_package(Torch) first or set TUNEDIST_TORCH_CUDA_TOOLKIT=ON to compile CUDA)")
  add_library(torch::cudart INTERFACE IMPORTED)
endif()
