"""The tuner's report: one row per candidate it predicted (and measured), the comm fit, and hook advice."""

from __future__ import annotations

from dataclasses import dataclass, field

from .candidates import Candidate
from .costmodel import MachineModel, Prediction, simulate
from .measure import ReadyProfile, StepTiming

POWERSGD_RANK = 1  # torch's PowerSGDState default matrix_approximation_rank
# Communication left exposed below this share of the step is not worth a hook.
EXPOSED_SHARE_FOR_ADVICE = 0.05


def wire_bytes(profile: ReadyProfile, hook: str | None) -> tuple:
    """(bytes each parameter puts on the wire, extra collectives per bucket) under `hook`.

    fp16/bf16 halve every fp32 gradient. PowerSGD sends P (n x r) and Q (m x r) instead of an n x m matrix when
    that compresses at least 2x (torch's min_compression_rate), and the rest uncompressed, in three all_reduces
    per bucket instead of one.
    """
    if hook in ("fp16", "bf16"):
        return tuple(b // 2 if b // max(_numel(s), 1) == 4 else b for b, s in zip(profile.param_bytes,
                                                                                profile.shapes)), 0
    if hook == "powersgd":
        out = []
        for nbytes, shape in zip(profile.param_bytes, profile.shapes):
            elem = nbytes // max(_numel(shape), 1)
            if len(shape) >= 2:
                n, m = shape[0], _numel(shape) // shape[0]
                r = min(n, m, POWERSGD_RANK)
                if (n + m) * r * 2 <= n * m:
                    out.append((n + m) * r * elem)
                    continue
            out.append(nbytes)
        return tuple(out), 2
    return profile.param_bytes, 0


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def predict(profile: ReadyProfile, machine: MachineModel, candidate: Candidate, hook: str | None = None
            ) -> Prediction:
    wire, extra_collectives = wire_bytes(profile, hook)
    return simulate(profile.ready_s, profile.param_bytes, candidate.limits(), machine.comm, profile.backward_s,
                    profile.compute_step_s, wire_bytes=wire,
                    per_bucket_extra_s=extra_collectives * machine.comm.alpha_s, contention=machine.contention,
                    bucket_overhead_s=machine.bucket_overhead_s)


def hook_advice(profile: ReadyProfile, machine: MachineModel, candidate: Candidate, measured_s: float | None
                ) -> list:
    """Which tunedist hook would pay off at `candidate`, with the saving estimated from the model's bandwidth term
    (the compression's own compute is not counted). Empty when communication is already hidden."""
    base = predict(profile, machine, candidate)
    step = measured_s if measured_s is not None else base.step_s
    if base.exposed_s < EXPOSED_SHARE_FOR_ADVICE * step:
        return []
    advice = []
    for hook, what in (("fp16", "fp16/bf16 compression halves the bytes"),
                       ("powersgd", f"PowerSGD (rank {POWERSGD_RANK}) sends low-rank factors of the large "
                                    "matrices")):
        saving = base.step_s - predict(profile, machine, candidate, hook).step_s
        if saving > 0.02 * step:
            advice.append({"hook": hook, "call": f'tunedist.hooks.register(model, "{hook}")', "why": what,
                           "saving_ms": saving * 1e3, "saving_share": saving / step})
    return advice


@dataclass
class Row:
    candidate: Candidate
    prediction: Prediction
    measured: StepTiming | None = None

    def as_dict(self) -> dict:
        return {"candidate": self.candidate.label, "bucket_cap_mb": self.candidate.cap_mb,
                "first_bucket_mb": self.candidate.first_mb, "predicted_ms": self.prediction.step_s * 1e3,
                "exposed_ms": self.prediction.exposed_s * 1e3, "buckets": len(self.prediction.bucket_bytes),
                "measured": self.measured.as_dict() if self.measured else None}


@dataclass
class TuneReport:
    choice: Candidate
    rows: list  # of Row: every predicted candidate, best prediction first, then DDP's default
    machine: MachineModel
    profile: ReadyProfile
    world_size: int
    backend: str
    tune_s: float = 0.0
    hook: str | None = None
    hook_used: str | None = None
    advice: list = field(default_factory=list)

    def row(self, candidate: Candidate) -> Row:
        return next(r for r in self.rows if r.candidate == candidate)

    @property
    def default_row(self) -> Row:
        return self.row(Candidate(None))

    def as_dict(self) -> dict:
        return {"choice": self.row(self.choice).as_dict(), "rows": [r.as_dict() for r in self.rows],
                **self.machine.as_dict(), "world_size": self.world_size, "backend": self.backend,
                "forward_ms": self.profile.forward_s * 1e3, "backward_ms": self.profile.backward_s * 1e3,
                "model_bytes": sum(self.profile.param_bytes), "tune_s": self.tune_s, "hook": self.hook,
                "hook_used": self.hook_used, "advice": self.advice}

    def table(self, max_rows: int = 12) -> str:
        c, m = self.machine.comm, self.machine
        lines = [f"# tunedist.tune: {self.backend}, world size {self.world_size}, model "
                 f"{sum(self.profile.param_bytes) / 2**20:.1f} MiB in {len(self.profile.param_bytes)} tensors; "
                 f"forward {self.profile.forward_s * 1e3:.1f} ms, backward {self.profile.backward_s * 1e3:.1f} ms "
                 f"(no DDP); tuning took {self.tune_s:.1f} s",
                 f"# all_reduce: {c.alpha_s * 1e6:.1f} us + n / {c.beta_bps / 1e9:.2f} GB/s: the fit of "
                 f"{len(c.points)} sizes (error max {c.max_rel_err:.0%}, rms {c.rms_rel_err:.0%}), its bandwidth term",
                 f"# calibrated by an all_reduce of the model's bytes right after a backward, as DDP meets it "
                 f"({c.calibration:.2f}x the fit there)",
                 f"# overlapped communication costs the compute {m.contention:.0%} of its time; each bucket costs "
                 f"{m.bucket_overhead_s * 1e6:.0f} us beyond its all_reduce",
                 f"#{'candidate':>30} {'buckets':>8} {'predicted':>10} {'exposed':>8} {'measured':>10} "
                 f"{'+-':>7}",
                 f"#{'':>30} {'':>8} {'(ms)':>10} {'(ms)':>8} {'(ms)':>10} {'(ms)':>7}"]
        shown = [r for r in self.rows if r.measured is not None or r.candidate.is_default]
        shown += [r for r in self.rows if r not in shown][:max(0, max_rows - len(shown))]
        for r in sorted(shown, key=lambda r: r.prediction.step_s):
            mark = " <- chosen" if r.candidate == self.choice else ""
            meas = (f"{r.measured.median_s * 1e3:>10.2f} {r.measured.spread_s * 1e3:>7.2f}" if r.measured
                    else f"{'-':>10} {'-':>7}")
            lines.append(f"{r.candidate.label:>31} {len(r.prediction.bucket_bytes):>8} "
                         f"{r.prediction.step_s * 1e3:>10.2f} {r.prediction.exposed_s * 1e3:>8.2f} {meas}{mark}")
        if self.hook_used:
            lines.append(f"# hook: {self.hook_used}")
        for a in self.advice:
            lines.append(f"# exposed communication remains: {a['call']} ({a['why']}) would save about "
                         f"{a['saving_ms']:.1f} ms/step ({a['saving_share']:.0%}) by the bandwidth term")
        if not self.advice and not self.hook:
            lines.append("# communication is hidden behind the backward pass at the chosen setting: no hook needed")
        return "\n".join(lines)
