// The torch.ops.tunedist namespace: the schemas of the direct collectives (synchronous, in place, on a group named as
// torch's functional collectives name it). Each operator's kernels are in its own file. They return nothing: a
// custom operator that mutates its arguments and returns no alias of them is one torch.compile can functionalize.
#include <torch/library.h>

TORCH_LIBRARY(tunedist, m) {
  m.def("all_reduce_(Tensor(a!) tensor, str op, str group_name) -> ()");
  m.def("all_gather_into_tensor_(Tensor(a!) output, Tensor input, str group_name) -> ()");
  m.def("reduce_scatter_tensor_(Tensor(a!) output, Tensor input, str op, str group_name) -> ()");
  m.def("broadcast_(Tensor(a!) tensor, int group_src, str group_name) -> ()");
}
