// The torch.ops.tunedist namespace: the schemas of the direct collectives (synchronous, in place, on a group named as
// torch's functional collectives name it, or passed as c10d's own operators take it: the `.group` overloads take the
// TorchScript object, ProcessGroup.boxed(); a plain Python ProcessGroup reaches a custom operator only as an opaque
// Python object in torch 2.15, so the `.pg` overloads that take it are defined and run in Python, in
// python/tunedist/ops.py). Each operator's kernels are in its own file. They return nothing: a custom operator that
// mutates its arguments and returns no alias of them is one torch.compile can functionalize.
#include <torch/library.h>

// c10d's own operators name the ProcessGroup class this way (torch/csrc/distributed/c10d/Ops.cpp).
#define TUNEDIST_PG "__torch__.torch.classes.c10d.ProcessGroup"

TORCH_LIBRARY(tunedist, m) {
  m.def("all_reduce_(Tensor(a!) tensor, str op, str group_name) -> ()");
  m.def("all_reduce_.group(Tensor(a!) tensor, str op, " TUNEDIST_PG " group) -> ()");
  m.def("all_gather_into_tensor_(Tensor(a!) output, Tensor input, str group_name) -> ()");
  m.def("all_gather_into_tensor_.group(Tensor(a!) output, Tensor input, " TUNEDIST_PG " group) -> ()");
  m.def("reduce_scatter_tensor_(Tensor(a!) output, Tensor input, str op, str group_name) -> ()");
  m.def("reduce_scatter_tensor_.group(Tensor(a!) output, Tensor input, str op, " TUNEDIST_PG " group) -> ()");
  m.def("broadcast_(Tensor(a!) tensor, int group_src, str group_name) -> ()");
  m.def("broadcast_.group(Tensor(a!) tensor, int group_src, " TUNEDIST_PG " group) -> ()");
}
