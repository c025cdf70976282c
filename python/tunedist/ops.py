"""tunedist.all_reduce (and all_gather_into_tensor, reduce_scatter_tensor, broadcast): synchronous collectives
without torch.distributed's Python layer.

``tunedist.all_reduce(t)`` does what ``dist.all_reduce(t)`` does (same group, same result, same errors) through the
operator ``torch.ops.tunedist.all_reduce_`` (csrc/ops/all_reduce.cpp), which goes from the dispatcher straight to the
group's backend for the tensor's device. It is meant for calls where the per-call cost is the whole story: a
tensor-parallel layer on CPU, once per layer per token, at 4-64 KiB. There dist.all_reduce spends about 4.8 us in
Python and c10d dispatch before any backend runs (torch's fake process group, which does nothing, costs that much on
a 2-vCPU AMD EPYC), an operator call about 1.3 us (docs/performance.md#the-per-call-budget-and-the-direct-operators).
It is DeepSpeed's ``inference_all_reduce`` calling convention, with the group honoured, every dtype and reduce op of
the backend, and results checked across ranks as ``tuned`` checks them.

On a ``tuned`` group it runs the same engine as dist.all_reduce, in the same sequence: the two can be mixed in any
order, and ranks that disagree (one calls it with 1024 elements, another dist.all_reduce with 2048) all get the
disagreement error. On other backends (gloo, nccl) it calls their allreduce and waits, as dist.all_reduce does.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import GroupMember

__all__ = ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast"]

_REDUCE_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.AVG: "avg",
    dist.ReduceOp.PRODUCT: "product",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.BAND: "band",
    dist.ReduceOp.BOR: "bor",
    dist.ReduceOp.BXOR: "bxor",
}
_NAMES = frozenset(_REDUCE_OPS.values())
# By identity first: hashing a pybind enum costs ~0.4 us, more than the rest of this wrapper.
_BY_ID = {id(k): v for k, v in _REDUCE_OPS.items()}
# Registered by libtunedist, which the package loads (tunedist._C) before it imports this module.
_ALL_REDUCE = torch.ops.tunedist.all_reduce_.default
_ALL_GATHER = torch.ops.tunedist.all_gather_into_tensor_.default
_REDUCE_SCATTER = torch.ops.tunedist.reduce_scatter_tensor_.default
_BROADCAST = torch.ops.tunedist.broadcast_.default
# Collectives, not pure functions: under torch.compile a node whose mutated tensor nobody reads must stay (dropping it
# on some ranks would hang the others), as torch marks its own c10d operators.
for _op in (_ALL_REDUCE, _ALL_GATHER, _REDUCE_SCATTER, _BROADCAST):
    torch.fx.node.has_side_effect(_op)


def _op_name(op, what: str) -> str:
    if isinstance(op, str) and op in _NAMES:
        return op
    if type(op) is dist.ReduceOp:  # dist.ReduceOp(dist.ReduceOp.SUM): dist.all_reduce takes these too
        op = op.op
    if isinstance(op, dist.ReduceOp.RedOpType) and op in _REDUCE_OPS:
        return _REDUCE_OPS[op]
    raise ValueError(f"tunedist.{what}: unsupported reduce op {op!r}; use dist.ReduceOp.SUM, AVG, PRODUCT, MIN, MAX, "
                     f"BAND, BOR or BXOR (or their lower-case names); for PREMUL_SUM use torch.distributed")


# torch's registry of live groups, {group: name}: a destroyed group leaves it, so a stale group object cannot reach a
# newer group that took its name (names restart after destroy_process_group). ~0.09 us a look; None where this torch
# keeps it elsewhere (then group.group_name, without that check).
_WORLD = getattr(dist.distributed_c10d, "_world", None)
if _WORLD is not None and not isinstance(getattr(_WORLD, "pg_names", None), dict):
    _WORLD = None
_is_compiling = torch.compiler.is_compiling


def _group_name(group, what: str) -> str:
    # Traced by torch.compile, group.group_name is what dynamo guards by the group's identity (a registry look is not).
    if _WORLD is None or _is_compiling():
        return group.group_name
    name = _WORLD.pg_names.get(group)
    if name is None:
        raise ValueError(f"tunedist.{what}: {group!r} is not a live process group (destroyed, or not a group); pass "
                         f"a group from torch.distributed.new_group, or None for the world")
    return name


def _resolve(group, what: str):
    """(group, its name) for `group` (None: the world), or (None, None) on a rank outside it."""
    if group is None:
        group = GroupMember.WORLD
        if group is None:
            raise ValueError(f"tunedist.{what}: the default process group has not been initialized; call "
                             "torch.distributed.init_process_group first, or pass group=")
    elif group is GroupMember.NON_GROUP_MEMBER:
        return None, None
    return group, _group_name(group, what)


def all_reduce(tensor: torch.Tensor, op=dist.ReduceOp.SUM, group=None) -> torch.Tensor:
    """Reduces ``tensor`` over ``group`` (default: the world) in place and returns it, synchronously.

    ``op`` is a ``dist.ReduceOp`` (not PREMUL_SUM) or its lower-case name. A rank outside ``group`` gets ``tensor``
    back unchanged, as from dist.all_reduce. Errors are dist.all_reduce's: a dead peer or a mismatch between ranks
    raises ``torch.distributed.DistBackendError`` on every rank of a ``tuned`` group.
    """
    # Written flat: at 4 KiB the call takes ~3-5 us, and each helper call here would add ~0.05 us.
    name = _BY_ID.get(id(op))
    if name is None:
        name = _op_name(op, "all_reduce")
    if group is None:
        group = GroupMember.WORLD
        if group is None:
            raise ValueError("tunedist.all_reduce: the default process group has not been initialized; call "
                             "torch.distributed.init_process_group first, or pass group=")
    elif group is GroupMember.NON_GROUP_MEMBER:
        return tensor
    if _WORLD is None or _is_compiling():
        group_name = group.group_name
    else:
        group_name = _WORLD.pg_names.get(group)
        if group_name is None:
            group_name = _group_name(group, "all_reduce")  # raises, naming the stale group
    _ALL_REDUCE(tensor, name, group_name)
    return tensor


def all_gather_into_tensor(output: torch.Tensor, input: torch.Tensor, group=None) -> torch.Tensor:
    """``dist.all_gather_into_tensor(output, input, group)``, synchronously, through the operator
    ``torch.ops.tunedist.all_gather_into_tensor_``; returns ``output``. A rank outside ``group`` gets it unchanged."""
    group, name = _resolve(group, "all_gather_into_tensor")
    if name is not None:
        _ALL_GATHER(output, input, name)
    return output


def reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor, op=dist.ReduceOp.SUM,
                          group=None) -> torch.Tensor:
    """``dist.reduce_scatter_tensor(output, input, op, group)``, synchronously, through the operator
    ``torch.ops.tunedist.reduce_scatter_tensor_``; returns ``output``. A rank outside ``group`` gets it unchanged."""
    op_name = _BY_ID.get(id(op)) or _op_name(op, "reduce_scatter_tensor")
    group, name = _resolve(group, "reduce_scatter_tensor")
    if name is not None:
        _REDUCE_SCATTER(output, input, op_name, name)
    return output


def broadcast(tensor: torch.Tensor, src: int | None = None, group=None, group_src: int | None = None) -> torch.Tensor:
    """``dist.broadcast(tensor, src, group, group_src=...)``, synchronously, through the operator
    ``torch.ops.tunedist.broadcast_``; returns ``tensor``. ``src`` is a global rank and ``group_src`` the root's
    rank in ``group``, as in dist.broadcast: give exactly one. A rank outside ``group`` gets it unchanged."""
    if (src is None) == (group_src is None):
        raise ValueError("tunedist.broadcast: give exactly one of src (a global rank) and group_src (a rank in the "
                         f"group), got src={src!r}, group_src={group_src!r}")
    group, name = _resolve(group, "broadcast")
    if name is None:
        return tensor
    if group_src is None:
        group_src = src if group is GroupMember.WORLD else dist.get_group_rank(group, src)
    _BROADCAST(tensor, group_src, name)
    return tensor


# The operators with a plain ProcessGroup object: torch.ops.tunedist.all_reduce_(t, "sum", group). torch 2.15 hands a
# custom operator a Python ProcessGroup only as an opaque Python object (schema type Any): c10d's own operators, and
# the `.group` overloads here, take the TorchScript class instead (group.boxed()), which a ProcessGroup does not
# convert to. So these `.pg` overloads take `Any`, and their kernel, in Python, passes the group's name to the
# default overload: the same call, the same errors. The packet tries `.default` (a string) and `.group` first, so a
# call through it pays for their two mismatches; calling `.pg` itself does not
# (docs/performance.md#the-per-call-budget-and-the-direct-operators).
_PG_LIB = torch.library.Library("tunedist", "FRAGMENT")


def _define_pg_overload(name: str, schema: str, kernel) -> None:
    _PG_LIB.define(f"{name}.pg{schema}")
    _PG_LIB.impl(f"{name}.pg", kernel, "CompositeImplicitAutograd")


def _all_reduce_pg(tensor, op, group):
    _ALL_REDUCE(tensor, op, _group_name(group, "all_reduce_"))


def _all_gather_pg(output, input, group):
    _ALL_GATHER(output, input, _group_name(group, "all_gather_into_tensor_"))


def _reduce_scatter_pg(output, input, op, group):
    _REDUCE_SCATTER(output, input, op, _group_name(group, "reduce_scatter_tensor_"))


def _broadcast_pg(tensor, group_src, group):
    _BROADCAST(tensor, group_src, _group_name(group, "broadcast_"))


_define_pg_overload("all_reduce_", "(Tensor(a!) tensor, str op, Any group) -> ()", _all_reduce_pg)
_define_pg_overload("all_gather_into_tensor_", "(Tensor(a!) output, Tensor input, Any group) -> ()", _all_gather_pg)
_define_pg_overload("reduce_scatter_tensor_", "(Tensor(a!) output, Tensor input, str op, Any group) -> ()",
                    _reduce_scatter_pg)
_define_pg_overload("broadcast_", "(Tensor(a!) tensor, int group_src, Any group) -> ()", _broadcast_pg)
