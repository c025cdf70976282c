# Which c10d::Backend virtuals the torch being built against declares, read from its Backend.hpp, so one source tree
# builds against torch 2.11 through 2.15: an override of a virtual the header lacks would not compile, and one left
# out would leave torch's refusal in place. Each found feature becomes a compile definition of every target that
# links tunedist (the class layouts must agree in every translation unit):
#   TUNEDIST_C10D_HAS_GATHER_SINGLE        Backend::gather_single (dist.gather_single; gather_into_tensor forwards)
#   TUNEDIST_C10D_HAS_GATHER_INTO_TENSOR   Backend::gather_into_tensor only (the older name of the same collective)
#   TUNEDIST_C10D_HAS_NCCL2                c10d/nccl2/ProcessGroupNCCL.hpp: what "nccl" means by default (torch 2.15),
#                                          made by the C++ NCCL side (backend/cuda/nccl_factory.cpp)
#   TUNEDIST_C10D_NCCL2_BY_DEFAULT         torch's Python registers nccl2 as "nccl" unless TORCH_DIST_USE_NCCL2=0
#                                          (torch 2.15); without it nccl2 is opt-in, TORCH_DIST_USE_NCCL2=1 (2.14).
#                                          Read from torch/distributed/distributed_c10d.py, where torch decides it.
#   TUNEDIST_C10D_HAS_COMPLETION_HOOKS     Backend::registerCompletionHook, keyed completion hooks (torch 2.15; 2.14
#                                          defines C10D_BACKEND_HAS_HOOKS for the abort hooks alone)
#   TUNEDIST_C10D_HAS_ABORT_HOOK_QUERY     Backend::supportsAbortHooks (torch 2.15; 2.14 has the abort hooks without it)
#   TUNEDIST_C10D_HAS_EPHEMERAL_TIMEOUT    Backend::addEphemeralTimeout (torch 2.14 on; not in 2.11)
#   TUNEDIST_C10D_HAS_VIRTUAL_BOUND_DEVICE Backend::setBoundDeviceId is virtual (2.14 on; 2.11 keeps it non-virtual)
#   TUNEDIST_C10D_HAS_TIME_ESTIMATE        Backend::startTimeEstimate / endTimeEstimate (torch 2.15)
#   TUNEDIST_C10D_HAS_SUSPEND              Backend::suspend / resume (torch 2.14 on)
#   TUNEDIST_C10D_HAS_MEMORY_STATS         Backend::getMemoryStats (torch 2.14 on)
#   TUNEDIST_SYMM_MEM_HAS_ALLOCATION       SymmetricMemoryAllocator::has_allocation, behind torch's is_symm_mem_tensor
#                                          (torch 2.14 on), from symm_mem/SymmetricMemory.hpp
# Feature macros that torch defines itself (C10D_BACKEND_HAS_HOOKS: the abort hooks; C10D_BACKEND_HAS_RECONFIGURE;
# C10D_BACKEND_HAS_WINDOW) are used as they are.
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
  foreach(pair IN ITEMS "COMPLETION_HOOKS=virtual void registerCompletionHook\\("
                         "ABORT_HOOK_QUERY=virtual bool supportsAbortHooks\\("
                         "EPHEMERAL_TIMEOUT=virtual void addEphemeralTimeout\\("
                         "VIRTUAL_BOUND_DEVICE=virtual void setBoundDeviceId\\("
                         "TIME_ESTIMATE=virtual void startTimeEstimate\\("
                         "SUSPEND=virtual void suspend\\("
                         "MEMORY_STATS=virtual std::unordered_map<std::string, uint64_t> getMemoryStats\\(")
    string(FIND "${pair}" "=" eq)
    string(SUBSTRING "${pair}" 0 ${eq} name)
    math(EXPR start "${eq} + 1")
    string(SUBSTRING "${pair}" ${start} -1 pattern)
    if(header MATCHES "${pattern}")
      list(APPEND features TUNEDIST_C10D_HAS_${name})
    endif()
  endforeach()
  get_filename_component(c10d_dir "${TUNEDIST_C10D_BACKEND_HPP}" DIRECTORY)
  file(READ "${c10d_dir}/symm_mem/SymmetricMemory.hpp" symm_mem_header)
  if(symm_mem_header MATCHES "virtual bool has_allocation\\(")
    list(APPEND features TUNEDIST_SYMM_MEM_HAS_ALLOCATION)
  endif()
  if(EXISTS "${c10d_dir}/nccl2/ProcessGroupNCCL.hpp")
    list(APPEND features TUNEDIST_C10D_HAS_NCCL2)
    find_file(TUNEDIST_C10D_PY ../distributed/distributed_c10d.py PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH
              NO_CACHE)
    if(NOT TUNEDIST_C10D_PY)
      message(FATAL_ERROR "tunedist: torch has nccl2 but torch/distributed/distributed_c10d.py was not found next to "
                          "${TORCH_INCLUDE_DIRS}: it says whether \"nccl\" means nccl2 by default")
    endif()
    file(READ "${TUNEDIST_C10D_PY}" c10d_py)
    if(c10d_py MATCHES "os\\.environ\\.get\\(\"TORCH_DIST_USE_NCCL2\"\\) == \"0\"")
      list(APPEND features TUNEDIST_C10D_NCCL2_BY_DEFAULT)
    elseif(NOT c10d_py MATCHES "os\\.environ\\.get\\(\"TORCH_DIST_USE_NCCL2\"\\) == \"1\"")
      message(FATAL_ERROR "tunedist: ${TUNEDIST_C10D_PY} tests TORCH_DIST_USE_NCCL2 in neither known way; cannot tell "
                          "whether \"nccl\" means nccl2 there (update cmake/tunedistTorchFeatures.cmake)")
    endif()
  endif()
  message(STATUS "tunedist: c10d features of torch ${Torch_VERSION}: ${features}")
  set(${out_var} ${features} PARENT_SCOPE)
endfunction()
