"""The autotuner's cost model: a latency + bandwidth fit of all_reduce, DDP's bucket assignment, and a simulation of
one comm stream working through the buckets while the backward pass is still running.

Pure functions of numbers: nothing here touches a process group, so all of it is unit-testable.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class CommModel:
    """all_reduce time of n bytes = alpha_s + n / beta (n x s_per_byte), fitted to measured (bytes, seconds)."""

    alpha_s: float
    s_per_byte: float  # 1 / beta; 0 when the bandwidth term was not measurable
    points: tuple  # ((bytes, seconds), ...) that were fitted
    max_rel_err: float  # max over points of |model - measured| / measured
    rms_rel_err: float
    # time(calibrated at) / the plain fit's time there: see calibrated(); 1 when not calibrated
    calibration: float = 1.0
    fit_s_per_byte: float | None = None  # the fit's own bandwidth term, where calibrated() changed it

    @property
    def beta_bps(self) -> float:
        return 1.0 / self.s_per_byte if self.s_per_byte > 0 else math.inf

    def time(self, nbytes: float) -> float:
        return self.alpha_s + nbytes * self.s_per_byte

    def calibrated(self, nbytes: int, seconds: float) -> CommModel:
        """This fit with its bandwidth term set so that time(nbytes) == seconds, the latency kept (the bandwidth
        term to 0 where seconds <= alpha). The fit repeats an all_reduce of one buffer, which then runs from warm
        caches; a DDP bucket is all-reduced right after the backward pass, whose activations and gradients have
        pushed it out, and is divided by the world size after: on a 2-vCPU AMD EPYC that costs 1.4-5x the fit.
        A measurement of that (probes.measure_probes' tail all_reduce) calibrates it."""
        if nbytes <= 0 or seconds <= 0:
            raise ValueError(f"CommModel.calibrated: need nbytes > 0 and seconds > 0, got {nbytes} and {seconds}")
        g = max(0.0, seconds - self.alpha_s) / nbytes
        return dataclasses.replace(self, s_per_byte=g, calibration=self.calibration * seconds / self.time(nbytes),
                                   fit_s_per_byte=self.s_per_byte if self.fit_s_per_byte is None
                                   else self.fit_s_per_byte)

    def as_dict(self) -> dict:
        g = self.s_per_byte if self.fit_s_per_byte is None else self.fit_s_per_byte
        return {"alpha_us": self.alpha_s * 1e6, "beta_gbps": self.beta_bps / 1e9, "max_rel_err": self.max_rel_err,
                "rms_rel_err": self.rms_rel_err, "calibration": self.calibration,
                "points": [{"bytes": n, "time_us": t * 1e6, "fit_us": (self.alpha_s + n * g) * 1e6} for n, t in
                           self.points]}


def fit_comm_model(sizes, times) -> CommModel:
    """Least squares on the relative error: minimise sum(((alpha + n g) / t - 1)^2) with alpha >= 0 and g >= 0.

    Relative error, because the sizes span decades: an absolute fit would ignore every small message.
    """
    if len(sizes) != len(times) or len(sizes) < 2:
        raise ValueError(f"fit_comm_model: need at least 2 (size, time) points, got {len(sizes)} sizes and "
                         f"{len(times)} times")
    if any(t <= 0 for t in times) or any(n < 0 for n in sizes) or len(set(sizes)) < 2:
        raise ValueError("fit_comm_model: times must be > 0 and there must be at least two distinct sizes")
    # Rows u_i = (1/t_i, n_i/t_i), target 1: the 2x2 normal equations.
    u1 = [1.0 / t for t in times]
    u2 = [n / t for n, t in zip(sizes, times)]
    s11, s12, s22 = sum(a * a for a in u1), sum(a * b for a, b in zip(u1, u2)), sum(b * b for b in u2)
    r1, r2 = sum(u1), sum(u2)
    det = s11 * s22 - s12 * s12
    alpha, g = ((r1 * s22 - r2 * s12) / det, (s11 * r2 - s12 * r1) / det) if det > 0 else (-1.0, -1.0)
    if alpha < 0 or g < 0:  # not physical (noise): the best fit with one term, whichever fits better
        options = [(0.0, r2 / s22), (r1 / s11, 0.0)]
        alpha, g = min(options, key=lambda ag: sum(e * e for e in _rel_errors(*ag, sizes, times)))
    errs = _rel_errors(alpha, g, sizes, times)
    return CommModel(alpha_s=alpha, s_per_byte=g, points=tuple(zip(sizes, times)), max_rel_err=max(errs),
                     rms_rel_err=math.sqrt(sum(e * e for e in errs) / len(errs)))


def _rel_errors(alpha: float, g: float, sizes, times) -> list:
    return [abs(alpha + n * g - t) / t for n, t in zip(sizes, times)]


@dataclass(frozen=True)
class MachineModel:
    """What communication costs this job: the all_reduce fit, the share of overlapped communication the compute
    loses (contention), and each bucket's fixed cost to the step beyond its all_reduce."""

    comm: CommModel
    contention: float = 0.0
    bucket_overhead_s: float = 0.0

    def as_dict(self) -> dict:
        return {"comm_fit": self.comm.as_dict(), "contention": self.contention,
                "bucket_overhead_us": self.bucket_overhead_s * 1e6}


def assign_buckets(param_bytes, limits, keys=None) -> list:
    """DDP's bucket assignment over parameters given in gradient-ready order (what the reducer does when it
    rebuilds its buckets after the first iteration).

    Parameters are added one by one to the open bucket of their key (dtype, device); a bucket closes as soon as its
    bytes reach the current limit (>=), and each key then moves on to the next limit, staying on the last one.
    Parameters are never split. Returns buckets as lists of positions into `param_bytes`, in the order they close
    (the buckets still open at the end follow, in the order their keys first appeared).
    """
    if not limits or any(lim <= 0 for lim in limits):
        raise ValueError(f"assign_buckets: limits must be a non-empty list of positive byte counts, got {limits}")
    keys = keys if keys is not None else [None] * len(param_bytes)
    open_buckets: dict = {}
    limit_pos: dict = {}
    sizes: dict = {}
    done = []
    for i, (nbytes, key) in enumerate(zip(param_bytes, keys)):
        open_buckets.setdefault(key, []).append(i)
        sizes[key] = sizes.get(key, 0) + nbytes
        pos = limit_pos.setdefault(key, 0)
        if sizes[key] >= limits[pos]:
            done.append(open_buckets.pop(key))
            sizes[key] = 0
            limit_pos[key] = min(pos + 1, len(limits) - 1)
    done.extend(b for b in open_buckets.values() if b)
    return done


@dataclass(frozen=True)
class Prediction:
    step_s: float  # compute step + exposed communication + what overlapped communication costs the compute
    exposed_s: float  # communication still running after the backward pass's compute ended
    comm_s: float  # total communication time of all buckets
    bucket_bytes: tuple  # bytes per bucket, in launch order


def simulate(ready_s, param_bytes, limits, comm: CommModel, backward_s: float, compute_step_s: float,
             wire_bytes=None, per_bucket_extra_s: float = 0.0, contention: float = 0.0,
             bucket_overhead_s: float = 0.0) -> Prediction:
    """One comm stream running buckets in order: bucket k starts when its last gradient is ready (ready_s, seconds
    after the backward pass started, in gradient-ready order) and bucket k-1 has finished.

    Buckets are assigned by param_bytes; wire_bytes (default: the same) is what each parameter puts on the wire,
    smaller under a compression hook, and per_bucket_extra_s adds fixed costs per bucket (a hook's extra
    collectives). The step is compute_step_s plus whatever communication runs past the backward compute
    (backward_s), plus `contention` x the overlapped communication: 0 when communication takes nothing from the
    compute (a GPU's copy engines and network), 1 when every second of it is a second the compute loses (CPU
    collectives on cores the compute needs). bucket_overhead_s is what each bucket costs the step beyond its
    all_reduce (issuing it, waking the comm thread, waiting on it).
    """
    if len(ready_s) != len(param_bytes):
        raise ValueError(f"simulate: {len(ready_s)} ready times for {len(param_bytes)} parameters")
    wire = param_bytes if wire_bytes is None else wire_bytes
    free_at, comm_total, sizes = 0.0, 0.0, []
    for bucket in assign_buckets(param_bytes, limits):
        cost = comm.time(sum(wire[i] for i in bucket)) + per_bucket_extra_s
        free_at = max(free_at, max(ready_s[i] for i in bucket)) + cost
        comm_total += cost
        sizes.append(sum(param_bytes[i] for i in bucket))
    exposed = max(0.0, free_at - backward_s)
    step = compute_step_s + exposed + contention * (comm_total - exposed) + bucket_overhead_s * len(sizes)
    return Prediction(step_s=step, exposed_s=exposed, comm_s=comm_total,
                      bucket_bytes=tuple(sizes))
