"""tunedist.tune, the DDP bucket autotuner: its cost model as unit tests, then real 2-rank runs over `tuned` that
compare the simulated bucketing with the reducer's and tune a model end to end. No timing is asserted."""

import dataclasses
import importlib.util
import math

import pytest
import torch
import torch.distributed as dist

from dist_utils import launch
from tunedist import tune
from tunedist.tune.candidates import build_ddp, ddp_accepts_cap_list, register_hook
from tunedist.tune.costmodel import MIB, CommModel, Prediction, assign_buckets, fit_comm_model, simulate
from tunedist.tune.measure import ReadyProfile, StepTiming, measure_ready_times, params_of
from tunedist.tune.tuner import choose_trial, select_trials

# --------------------------------------------------------------------------------------------------- unit tests


@pytest.mark.parametrize("alpha_us,beta_gbps", [(30.0, 2.0), (400.0, 0.8), (5.0, 12.0)])
def test_fit_recovers_alpha_beta(alpha_us, beta_gbps):
    sizes = [4096 << (2 * k) for k in range(7)]  # 4 KiB .. 16 MiB
    alpha, g = alpha_us * 1e-6, 1 / (beta_gbps * 1e9)
    exact = fit_comm_model(sizes, [alpha + n * g for n in sizes])
    assert math.isclose(exact.alpha_s, alpha, rel_tol=1e-6) and math.isclose(exact.beta_bps, 1 / g, rel_tol=1e-6)
    assert exact.max_rel_err < 1e-9
    # +-5% deterministic noise: the fit stays close, and the error it reports is the noise it saw.
    noise = [1.05, 0.95, 1.03, 0.97, 1.05, 0.96, 1.04]
    noisy = fit_comm_model(sizes, [(alpha + n * g) * e for n, e in zip(sizes, noise)])
    assert noisy.alpha_s == pytest.approx(alpha, rel=0.1) and noisy.beta_bps == pytest.approx(1 / g, rel=0.1)
    assert 0.02 < noisy.max_rel_err < 0.1


def test_fit_reports_a_bad_fit_and_rejects_bad_input():
    sizes = [1 << k for k in range(10, 24, 2)]
    # A step at 256 KiB (two algorithms) does not fit one line: the reported error says so.
    times = [20e-6 if n <= 256 << 10 else 200e-6 + n / 3e9 for n in sizes]
    assert fit_comm_model(sizes, times).max_rel_err > 0.3
    with pytest.raises(ValueError, match="at least 2"):
        fit_comm_model([4096], [1e-5])
    with pytest.raises(ValueError, match="distinct sizes"):
        fit_comm_model([4096, 4096], [1e-5, 2e-5])


def test_assign_buckets_follows_ddp_rules():
    mb = MIB
    # Closes at >= the limit, never splits a tensor, first limit then the cap.
    assert assign_buckets([mb, mb, mb, mb], [2 * mb]) == [[0, 1], [2, 3]]
    assert assign_buckets([mb, mb, mb, mb], [mb, 3 * mb]) == [[0], [1, 2, 3]]
    assert assign_buckets([5 * mb, 1, 1], [mb, 2 * mb]) == [[0], [1, 2]]
    assert assign_buckets([mb // 2] * 3, [mb]) == [[0, 1], [2]]
    # Separate buckets per key (dtype/device); the ones still open come last in first-seen order.
    assert assign_buckets([mb, mb, mb], [2 * mb], keys=["f", "h", "f"]) == [[0, 2], [1]]
    with pytest.raises(ValueError):
        assign_buckets([1], [])


def test_simulate_one_comm_stream():
    comm = CommModel(alpha_s=1.0, s_per_byte=1.0, points=(), max_rel_err=0.0, rms_rel_err=0.0)
    # Ready at 1, 2, 10; each bucket of one byte takes 2 s; backward ends at 10.
    p = simulate([1.0, 2.0, 10.0], [1, 1, 1], [1], comm, backward_s=10.0, compute_step_s=15.0)
    # Bucket 0: 1 -> 3, bucket 1: 3 -> 5, bucket 2: 10 -> 12: 2 s exposed.
    assert p.exposed_s == pytest.approx(2.0) and p.step_s == pytest.approx(17.0) and p.comm_s == pytest.approx(6.0)
    one = simulate([1.0, 2.0, 10.0], [1, 1, 1], [100], comm, backward_s=10.0, compute_step_s=15.0)
    assert one.bucket_bytes == (3,) and one.exposed_s == pytest.approx(4.0)
    # Contention charges the overlapped part; the overhead each bucket.
    c = simulate([1.0, 2.0, 10.0], [1, 1, 1], [1], comm, 10.0, 15.0, contention=0.5, bucket_overhead_s=0.1)
    assert c.step_s == pytest.approx(15.0 + 2.0 + 0.5 * 4.0 + 0.3)


def test_candidates_and_ddp_arguments():
    default = tune.Candidate(None)
    assert default.limits() == [dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * MIB] and default.is_default
    assert tune.Candidate(4).limits() == [4 * MIB]
    assert tune.Candidate(4, 1).limits() == [MIB, 4 * MIB]
    caps = [c.cap_mb for c in tune.make_candidates(64 * MIB) if c.first_mb is None]
    assert caps[0] == 0.25 and caps[-1] >= 64 and all(b == 2 * a for a, b in zip(caps, caps[1:]))
    firsts = [c for c in tune.make_candidates(64 * MIB, first_mb=(1.0,)) if c.first_mb is not None]
    assert bool(firsts) == ddp_accepts_cap_list() and all(c.first_mb < c.cap_mb for c in firsts)
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        build_ddp(torch.nn.Linear(2, 2), tune.Candidate(4), bucket_cap_mb=8)
    with pytest.raises(ValueError, match="unknown hook"):
        register_hook(None, "int8")


def _rows(profile, machine, candidates):
    from tunedist.tune.report import Row, predict
    from tunedist.tune.tuner import rank_key
    rows = [Row(c, predict(profile, machine, c)) for c in candidates]
    return sorted(rows, key=lambda r: rank_key(r.prediction, r.candidate))


def test_select_trials_hedges_the_contention():
    # 8 tensors of 1 MiB ready every 10 ms over an 80 ms backward; 5 ms per MiB on the wire, 1 ms per bucket.
    profile = ReadyProfile(order=tuple(range(8)), ready_s=tuple(0.01 * (k + 1) for k in range(8)),
                                param_bytes=(MIB,) * 8, shapes=((MIB // 4,),) * 8, forward_s=0.04, backward_s=0.08)
    comm = CommModel(alpha_s=1e-3, s_per_byte=5e-3 / MIB, points=(), max_rel_err=0.0, rms_rel_err=0.0)
    machine = tune.costmodel.MachineModel(comm=comm, contention=0.1, bucket_overhead_s=1e-3)
    candidates = [tune.Candidate(c) for c in (0.5, 1, 2, 4, 8, 16)] + [tune.Candidate(16, 1)]
    rows = _rows(profile, machine, candidates)
    # Overlap nearly free: small buckets predicted best. At contention 1 overlap buys nothing: one bucket wins.
    assert len(rows[0].prediction.bucket_bytes) > 1
    picked = select_trials(rows, profile, machine, None, top_k=2)
    assert picked[0] is rows[0] and picked[1].candidate == tune.Candidate(16)
    # Caps 0.5 and 1 MiB give the same buckets (one per tensor), and so do 8 and 16 (one): never both measured.
    everything = select_trials(rows, profile, machine, None, top_k=len(rows))
    layouts = [r.prediction.bucket_bytes for r in everything]
    assert len(set(layouts)) == len(layouts) == len(rows) - 2
    assert [r.candidate for r in select_trials(rows, profile, machine, None, top_k=1)] == [rows[0].candidate]
    # With contention 1 measured, the hedge is the other extreme: overlap for free.
    full = dataclasses.replace(machine, contention=1.0)
    rows1 = _rows(profile, full, candidates)
    picked1 = select_trials(rows1, profile, full, None, top_k=2)
    assert picked1[0].candidate == tune.Candidate(16)
    assert picked1[1].candidate == _rows(profile, dataclasses.replace(machine, contention=0.0), candidates)[0].candidate
    assert select_trials([], profile, machine, None, top_k=2) == []


def test_calibrated_comm_model():
    fit = CommModel(alpha_s=1e-4, s_per_byte=1e-9, points=((4096, 1e-4), (MIB, 1.1e-3)), max_rel_err=0.0,
                         rms_rel_err=0.0)
    # After a backward the model's 16 MiB take 2.5x the fit: the bandwidth term takes it all, the latency stays.
    n = 16 * MIB
    cal = fit.calibrated(n, 2.5 * fit.time(n))
    assert cal.time(n) == pytest.approx(2.5 * fit.time(n)) and cal.alpha_s == fit.alpha_s
    assert cal.calibration == pytest.approx(2.5) and cal.fit_s_per_byte == fit.s_per_byte
    assert cal.s_per_byte == pytest.approx((2.5 * fit.time(n) - fit.alpha_s) / n)
    # The report keeps the fit beside the points it was fitted to; calibrating again composes.
    assert [p["fit_us"] for p in cal.as_dict()["points"]] == pytest.approx([p["fit_us"] for p in
                                                                            fit.as_dict()["points"]])
    twice = cal.calibrated(n, 2 * cal.time(n))
    assert twice.calibration == pytest.approx(5.0) and twice.fit_s_per_byte == fit.s_per_byte
    # Faster than the latency alone: no bandwidth term left, never a negative one.
    assert fit.calibrated(n, fit.alpha_s / 2).s_per_byte == 0.0
    with pytest.raises(ValueError, match="nbytes > 0 and seconds > 0"):
        fit.calibrated(n, 0.0)


def _measured_rows(relatives, sds, steps=8):
    cands = [tune.Candidate(c) for c in (4, 16, 1, 2)][:len(relatives)]
    pred = Prediction(step_s=0.05, exposed_s=0.0, comm_s=0.0, bucket_bytes=(1,))
    return [tune.report.Row(c, pred, StepTiming(median_s=0.05 * r, spread_s=0.001, steps=steps, relative=r,
                                                      relative_sd=sd)) for c, r, sd in zip(cands, relatives, sds)]


def test_choose_trial_needs_a_clear_win_to_overrule_the_prediction():
    # sd 0.07 over 8 rounds: the standard error of a difference is 0.035.
    assert choose_trial(_measured_rows([1.02, 0.99], [0.07, 0.07]), True, 1.0) == 0  # within the noise
    assert choose_trial(_measured_rows([1.05, 0.95], [0.07, 0.07]), True, 1.0) == 1  # beyond it
    assert choose_trial(_measured_rows([0.98, 1.03], [0.07, 0.07]), True, 1.0) == 0  # the prediction was best
    # More rounds, or a steadier machine, make the same gap decisive.
    assert choose_trial(_measured_rows([1.02, 0.99], [0.07, 0.07], steps=64), True, 1.0) == 1
    assert choose_trial(_measured_rows([1.02, 0.99], [0.01, 0.01]), True, 1.0) == 1
    # sigmas 0: the least measured wins outright. Three trials: the least is what may overrule.
    assert choose_trial(_measured_rows([1.02, 0.99], [0.07, 0.07]), True, 0.0) == 1
    assert choose_trial(_measured_rows([1.06, 1.0, 0.94], [0.05, 0.05, 0.05]), True, 1.0) == 2
    # Beside the rounds' error, the windows': with window_sd 0.08 (the default), the error of the difference is
    # sqrt(0.035^2 + 0.08^2) = 0.087, so a 10% lead overrules the prediction and an 8% one does not.
    assert choose_trial(_measured_rows([1.05, 0.95], [0.07, 0.07]), True, 1.0, window_sd=0.08) == 1
    assert choose_trial(_measured_rows([1.04, 0.96], [0.07, 0.07]), True, 1.0, window_sd=0.08) == 0
    assert choose_trial(_measured_rows([1.04, 0.96], [0.07, 0.07]), True, 1.0) == 1
    # Measured apart: by the median step and its spread (1 ms / 0.674 each, a standard error of 0.74 ms).
    assert choose_trial(_measured_rows([1.0, 0.99], [0.0, 0.0]), False, 1.0) == 0  # 0.5 ms faster
    assert choose_trial(_measured_rows([1.0, 0.97], [0.0, 0.0]), False, 1.0) == 1  # 1.5 ms faster
    # ... and window_sd as a share of the reference's median step (0.03 x 50 ms: 1.5 ms, 1.67 ms in all).
    assert choose_trial(_measured_rows([1.0, 0.97], [0.0, 0.0]), False, 1.0, window_sd=0.03) == 0


# --------------------------------------------------------------------------------------------------- 2 ranks


def _mixed_model():
    torch.manual_seed(0)
    # Tensors of very different sizes, so caps between them change the bucketing.
    return torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1024),
                               torch.nn.ReLU(), torch.nn.Linear(1024, 8))


def _step_fn(rank):
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(16, 64, generator=g), torch.randn(16, 8, generator=g)
    return lambda m: torch.nn.functional.mse_loss(m(x), y)


def _candidates_to_check():
    out = [tune.Candidate(None), tune.Candidate(0.25), tune.Candidate(1.0), tune.Candidate(4.0)]
    if ddp_accepts_cap_list():
        out.append(tune.Candidate(1.5, 0.25))
    return out


def _bucketing_vs_reducer(rank, world_size):
    model, step_fn = _mixed_model(), _step_fn(rank)
    profile = measure_ready_times(model, step_fn, None, iters=2)
    out = []
    for cand in _candidates_to_check():
        ddp = build_ddp(model, cand)
        for _ in range(3):  # the reducer rebuilds its buckets at the second forward
            ddp.zero_grad()
            step_fn(ddp).backward()
        actual = [[int(i) for i in b.split()] for b in
                  ddp._get_ddp_logging_data()["rebuilt_per_bucket_param_indices"].split(",")]
        simulated = [[profile.order[i] for i in b] for b in assign_buckets(profile.param_bytes, cand.limits())]
        out.append((cand.label, actual, simulated))
        tune.candidates.dispose_ddp(ddp)
    return out


def _grads(module):
    return torch.cat([p.grad.reshape(-1) for p in params_of(module)])


def _reference_grad(rank, world_size, step_fn_of_rank):
    """The average over ranks of the local gradients: what DDP must produce."""
    total = None
    for r in range(world_size):
        model = _mixed_model()
        step_fn_of_rank(r)(model).backward()
        total = _grads(model) if total is None else total + _grads(model)
    return total / world_size


def _tune_end_to_end(rank, world_size, hook):
    model = _mixed_model()
    opts = tune.TuneOptions(trial_steps=3, top_k=2, profile_iters=2, progress=False)
    ddp, report = tune.ddp(model, step_fn=_step_fn(rank), hook=hook, options=opts)
    ddp.zero_grad()
    _step_fn(rank)(ddp).backward()
    grad = _grads(ddp.module)
    gathered = [torch.empty_like(grad) for _ in range(world_size)]
    dist.all_gather(gathered, grad)
    measured = [r for r in report.rows if r.measured is not None]
    selected = select_trials(report.rows[:-1], report.profile, report.machine, hook, opts.top_k)
    measured_in_trial_order = selected + [report.default_row]
    return {"choice": report.choice, "label": report.choice.label, "table": report.table(),
            "same_grads": all(torch.equal(g, gathered[0]) for g in gathered),
            "grad_err": float((grad - _reference_grad(rank, world_size, _step_fn)).abs().max()),
            "n_measured": len(measured), "n_rows": len(report.rows), "hook_used": report.hook_used,
            "measured_as_selected": [r.candidate for r in measured if not r.candidate.is_default] ==
            [r.candidate for r in sorted(selected, key=lambda r: report.rows.index(r))],
            "measured_layouts": [r.prediction.bucket_bytes for r in measured if not r.candidate.is_default],
            "relatives": [r.measured.relative for r in measured],
            "least_relative": min(measured, key=lambda r: r.measured.relative).candidate,
            "first_trial": selected[0].candidate,
            "rechosen": measured_in_trial_order[choose_trial(measured_in_trial_order, True,
                                                                  opts.overrule_sigmas, opts.window_sd)].candidate,
            "ready_sorted": list(report.profile.ready_s) == sorted(report.profile.ready_s),
            "fit_points": len(report.machine.comm.points), "dict": report.as_dict()}


def _powersgd_refusal(rank, world_size):
    ddp = build_ddp(_mixed_model(), tune.Candidate(1.0))
    try:
        register_hook(ddp, "powersgd", source="torch")
    except ValueError as exc:
        return str(exc)
    finally:
        tune.candidates.dispose_ddp(ddp)
    return None


def _probes(rank, world_size):
    """measure_probes (the tuner's: both probes on shared plain backwards) against the two probes apart."""
    from tunedist.tune import probes
    from tunedist.tune.measure import comm_sizes, model_bytes, time_all_reduce
    model, step_fn = _mixed_model(), _step_fn(rank)
    profile = measure_ready_times(model, step_fn, None, iters=2)
    sizes = comm_sizes(model_bytes(model), points=5)
    comm = fit_comm_model(sizes, time_all_reduce(sizes, None))
    calls = []
    real_one = probes._one

    def counting_one(*args):
        calls.append(args[3] is not None)  # a probed backward (start given) or a plain one
        return real_one(*args)

    probes._one = counting_one
    try:
        measured = probes.measure_probes(model, step_fn, None, comm, profile.backward_s, iters=2)
    finally:
        probes._one = real_one
    return {"contention": measured.contention, "per_grad": measured.per_grad, "calls": calls, "fit": comm,
            "comm": measured.comm, "tail_s": measured.tail_s, "model_bytes": model_bytes(model),
            "grads_cleared": all(p.grad is None for p in model.parameters())}


def _trial_ddps_freed(rank, world_size):
    """The tuner's trial DDPs are gone once measured (their bucket buffers with them), with a comm hook or without."""
    import gc
    import weakref

    from tunedist.tune import tuner
    model, step_fn = _mixed_model(), _step_fn(rank)
    out = {}
    for hook in (None, "bf16"):
        ddps = tuner._build_all(model, [tune.Candidate(0.25), tune.Candidate(4.0)], None, hook, {})
        tuner.time_steps_interleaved(ddps, step_fn, None, steps=2)
        refs = [weakref.ref(d) for d in ddps]
        gc.disable()  # only _dispose_all's own collection, if any, may free them
        try:
            tuner._dispose_all(ddps)
            out[hook] = {"emptied": ddps == [], "alive": sum(r() is not None for r in refs)}
        finally:
            gc.enable()
    return out


def _interleaved_order(rank, world_size):
    """Which DDP time_steps_interleaved steps when, with stand-ins that log their turn."""
    from tunedist.tune.measure import time_steps_interleaved

    class Logged:
        def __init__(self, name, log):
            self.name, self.log = name, log

        def zero_grad(self, set_to_none=True):
            pass

    out = {}
    for n in (2, 3):
        log = []
        ddps = [Logged(chr(ord("A") + i), log) for i in range(n)]
        timings = time_steps_interleaved(
            ddps, lambda d: (d.log.append(d.name), torch.ones((), requires_grad=True) * 2)[1], None, steps=4,
            warmup=1)
        out[n] = {"order": "".join(log[n:]), "steps": [t.steps for t in timings]}  # the warm-up steps left out
    return out


def _on_tuned(rank, world_size):
    return {"order": _interleaved_order(rank, world_size), "freed": _trial_ddps_freed(rank, world_size),
            "probes": _probes(rank, world_size),
            "bucketing": _bucketing_vs_reducer(rank, world_size), "tune": _tune_end_to_end(rank, world_size, "bf16"),
            "powersgd": _powersgd_refusal(rank, world_size), "fp16": _torch_fp16_fallback(rank, world_size)}


@pytest.fixture(scope="module")
def tuned_run():
    """One 2-rank launch over `tuned` for the tests below (process start-up dominates their cost)."""
    return launch(2, _on_tuned)


def test_simulated_bucketing_matches_the_reducer(tuned_run):
    for rank_result in tuned_run:
        rows = rank_result["bucketing"]
        for label, actual, simulated in rows:
            assert actual == simulated, f"{label}: reducer {actual} vs simulated {simulated}"
        assert len({len(a) for _, a, _ in rows}) > 1, "the caps tried should give different bucket counts"


def test_interleaved_steps_never_repeat_a_ddp(tuned_run):
    """Rounds of 3 or more DDPs start one further each time; 2 alternate (a rotation would run one twice in a row,
    which flatters it: its buckets are still in cache)."""
    for r in tuned_run:
        assert r["order"][2] == {"order": "ABABABAB", "steps": [4, 4]}, r["order"]
        assert r["order"][3] == {"order": "ABCBCACABABC", "steps": [4, 4, 4]}, r["order"]


def test_trial_ddps_are_freed(tuned_run):
    for r in tuned_run:
        for hook, v in r["freed"].items():
            assert v["emptied"] and v["alive"] == 0, (hook, v)


def test_probes_share_plain_backwards(tuned_run):
    """Per iteration one plain backward, then the contention and the per-gradient probe: 2 iterations, 6 backwards
    (the probes apart would take 8). The timings are agreed over the ranks, and the probe leaves no gradient."""
    results = [r["probes"] for r in tuned_run]
    for r in results:
        assert r["calls"] == [False, True, True] * 2, r["calls"]
        assert 0.0 <= r["contention"] <= 1.0
        t = r["per_grad"]
        assert t.plain_s > 0 and t.compute_s > 0 and t.total_s >= t.compute_s, t
        assert r["grads_cleared"]
        # The fit calibrated by the tail all_reduce: it predicts that all_reduce exactly, with the fit's latency.
        assert r["tail_s"] > 0 and r["comm"].time(r["model_bytes"] // 4 * 4) == pytest.approx(r["tail_s"])
        assert r["comm"].alpha_s == r["fit"].alpha_s and r["comm"].calibration > 0
    for key in ("per_grad", "contention", "tail_s", "comm"):
        assert results[0][key] == results[1][key], key


def test_tune_two_ranks_agree_and_train(tuned_run):
    results = [r["tune"] for r in tuned_run]
    assert results[0]["choice"] == results[1]["choice"], [r["label"] for r in results]
    for r in results:
        assert r["same_grads"], "ranks hold different gradients after a DDP step"
        assert r["grad_err"] < 1e-2, r["grad_err"]  # bf16 on the wire
        assert r["n_measured"] == 3 and r["n_rows"] > 3  # 2 trials + the default measured, the rest predicted
        # The trials are what select_trials picks from the report's own model, and never one bucket layout twice.
        assert r["measured_as_selected"] and len(set(r["measured_layouts"])) == 2, r["table"]
        # Measured in turns in one go, the trials are compared by their step over the round's mean step; the choice
        # is what choose_trial makes of them: the best prediction, or a trial that beat it clearly.
        assert all(0 < x < 3 for x in r["relatives"]), r["relatives"]
        assert r["choice"] in (r["least_relative"], r["first_trial"]) and r["choice"] == r["rechosen"], r["table"]
        assert r["ready_sorted"] and r["fit_points"] >= 5
        assert "<- chosen" in r["table"] and "default (25 MB" in r["table"]
        assert r["dict"]["choice"]["measured"]["median_ms"] > 0
    expected = "tunedist.hooks.register" if importlib.util.find_spec("tunedist.hooks") else "bf16_compress_hook"
    assert expected in results[0]["hook_used"]


def _torch_fp16_fallback(rank, world_size):
    ddp = build_ddp(_mixed_model(), tune.Candidate(0.5))
    used = register_hook(ddp, "fp16", source="torch")
    for _ in range(3):
        ddp.zero_grad()
        _step_fn(rank)(ddp).backward()
    grad = _grads(ddp.module)
    gathered = [torch.empty_like(grad) for _ in range(world_size)]
    dist.all_gather(gathered, grad)
    ref = _reference_grad(rank, world_size, _step_fn)
    tune.candidates.dispose_ddp(ddp)
    return {"used": used, "same": all(torch.equal(g, gathered[0]) for g in gathered),
            "rel_err": float((grad - ref).norm() / ref.norm())}


def test_torch_fp16_fallback_on_tuned(tuned_run):
    for r in tuned_run:
        v = r["fp16"]
        assert "fp16_compress_hook" in v["used"] and v["same"] and 0 < v["rel_err"] < 1e-2, v


def test_torch_powersgd_is_refused_on_tuned(tuned_run):
    """torch's powerSGD_hook issues collectives from future callbacks, racing DDP's next buckets: refused on CPU."""
    for rank, r in enumerate(tuned_run):
        assert r["powersgd"] is not None and "different orders" in r["powersgd"] and f"rank {rank}" in r["powersgd"]
