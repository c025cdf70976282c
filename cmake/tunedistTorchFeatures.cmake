# Which c10d::Backend virtuals the torch being built against declares, read from its Backend.hpp, so one source tree
# builds against torch 2.11 through 2.15: an override of a virtual the header lacks would not compile, and one left
# out would leave torch's refusal in place. Each found feature becomes a compile definition of every target that
# links tunedist (the class layouts must agree in every translation unit):
#   TUNEDIST_C10D_HAS_GATHER_SINGLE        Backend::gather_single (dist.gather_single; gather_into_tensor forwards)
#   TUNEDIST_C10D_HAS_GATHER_INTO_TENSOR   Backend::gather_into_tensor only (the older name of the same collective)
#   TUNEDIST_C10D_HAS_NCCL2                c10d/nccl2/ProcessGroupNCCL.hpp: what "nccl" means by default (torch 2.15),
#                                          made by the C++ NCCL side (backend/cuda/nccl_factory.cpp)
# Feature macros that torch defines itself (C10D_BACKEND_HAS_HOOKS, C10D_BACKEND_HAS_RECONFIGURE) are used as they are.
function(tunedist_torch_features out_var)
  find_file(TUNEDIST_C10D_BACKEND_HPP torch/csrc/distributed/c10d/Backend.hpp PATHS ${TORCH_INCLUDE_DIRS}
            NO_DEFAULT_PATH NO_CACHE)
  if(NOT TUNEDIST_C10D_BACKEND_HPP)
    message(FATAL_ERROR "tunedist: torch/csrc/distributed/c10d/Backend.hpp not found under ${TORCH_INCLUDE_DIRS}")
  endif()
  file(READ "${TUNEDIST_C10D_BACKEND_HPP}" header)
  set(features "")
  if(header MATCHES "virtual c10::intrusive_ptr<Work> gather_single\\(")
    list(APPEND features TUNEDIST_C10D_HAS_GATHER_SINGLE)
  elseif(header MATCHES "virtual c10::intrusive_ptr<Work> gather_into_tensor\\(")
    list(APPEND features TUNEDIST_C10D_HAS_GATHER_INTO_TENSOR)
  endif()
  get_filename_component(c10d_dir "${TUNEDIST_C10D_BACKEND_HPP}" DIRECTORY)
  if(EXISTS "${c10d_dir}/nccl2/ProcessGroupNCCL.hpp")
    list(APPEND features TUNEDIST_C10D_HAS_NCCL2)
  endif()
  message(STATUS "tunedist: c10d features of torch ${Torch_VERSION}: ${features}")
  set(${out_var} ${features} PARENT_SCOPE)
endfunction()
