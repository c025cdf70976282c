"""The client examples in examples/clients, run for real under torchrun on 2 CPU ranks over `tuned`.

Each example writes a JSON result; these tests check what it says, not only the exit code:

* Lightning (`lightning_ddp.py`): DDPStrategy(process_group_backend="tuned") trains; a tunedist hook registered
  from a Callback runs once per step on every rank; the ranks end bit-identical; the run equals the same run on gloo
  bit for bit; and DDPStrategy(ddp_comm_hook=...) is never called on CPU (Lightning registers it on CUDA only).
* Accelerate (`accelerate_cpu.py`): dist.init_process_group("tuned") before Accelerator(cpu=True) makes prepare()
  wrap the model in DDP over the tuned group; the ranks see different data and end bit-identical, equal to one
  process training on both ranks' batches; InitProcessGroupKwargs(backend="tuned") raises; without cpu=True
  (and no GPU) Accelerate runs as one process and wraps nothing.
* Distributed checkpoint (`dcp_async_save.py`): async_save on its own group while training collectives go on,
  on gloo and on a second tuned group; the checkpoint loads back bit for bit.

No timing is asserted. Lightning and Accelerate tests skip when the package is missing (./dev installs both).
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "clients"
RUN_TIMEOUT_S = 300  # a Lightning run takes ~15 s on an idle 2-core machine; the machine is shared
LIGHTNING_STEPS = 6


def _torchrun(script, *argv, world_size=2):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={world_size}",
        str(EXAMPLES / script),
        *map(str, argv),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # PYTHONPATH (set by conftest for a source tree) is kept
    proc = subprocess.run(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=RUN_TIMEOUT_S
    )
    assert proc.returncode == 0, f"{' '.join(cmd)} exited with {proc.returncode}:\n{proc.stdout[-8000:]}"
    return proc.stdout


def _run_json(tmp_path, script, *argv):
    out = tmp_path / f"{Path(script).stem}_{len(list(tmp_path.iterdir()))}.json"
    _torchrun(script, *argv, "--json", out)
    return json.loads(out.read_text())


# ---------------------------------------------------------------------------------------------------------------
# Lightning


@pytest.fixture(scope="module")
def lightning_runs(tmp_path_factory):
    pytest.importorskip("lightning", reason="lightning is not installed (./dev installs it)")
    tmp = tmp_path_factory.mktemp("lightning")
    common = ("--hook", "fp16", "--steps", LIGHTNING_STEPS)
    return {
        "tuned": _run_json(tmp, "lightning_ddp.py", "--backend", "tuned", "--hook-via", "callback", *common),
        "gloo": _run_json(tmp, "lightning_ddp.py", "--backend", "gloo", "--hook-via", "callback", *common),
        "tuned_strategy_hook": _run_json(
            tmp, "lightning_ddp.py", "--backend", "tuned", "--hook-via", "strategy", *common
        ),
    }


def test_lightning_trains_ddp_over_tuned(lightning_runs):
    run = lightning_runs["tuned"]
    assert run["backend"] == "tuned" and run["world_size"] == 2
    assert run["model_wrapper"] == {"type": "DistributedDataParallel", "group_backend": "tuned"}
    assert all(len(r["losses"]) == LIGHTNING_STEPS for r in run["ranks"])


def test_lightning_callback_hook_runs_every_step(lightning_runs):
    # The model (161 parameters) is one DDP bucket, so the hook runs once per step on each rank.
    assert [r["hook_calls"] for r in lightning_runs["tuned"]["ranks"]] == [LIGHTNING_STEPS] * 2


def test_lightning_ranks_end_bit_identical(lightning_runs):
    rank0, rank1 = lightning_runs["tuned"]["ranks"]
    assert rank0["losses"] != rank1["losses"], "the ranks should see different batches (DistributedSampler)"
    assert rank0["params"] == rank1["params"]


def test_lightning_tuned_equals_gloo_bit_for_bit(lightning_runs):
    # With 2 ranks each gradient element is reduced by one addition, which is commutative in IEEE arithmetic, and
    # the hook does the same casts and division on both backends: any correct backend gives the same bits. Observed
    # equal; a tolerance would hide a wrong reduction order or a lost bucket.
    tuned, gloo = lightning_runs["tuned"], lightning_runs["gloo"]
    assert gloo["backend"] == "gloo"
    assert [r["hook_calls"] for r in gloo["ranks"]] == [LIGHTNING_STEPS] * 2
    for t, g in zip(tuned["ranks"], gloo["ranks"]):
        assert t["losses"] == g["losses"]
        assert t["params"] == g["params"]


def test_lightning_ignores_strategy_hook_on_cpu(lightning_runs):
    # Lightning 2.6 DDPStrategy._register_ddp_hooks registers ddp_comm_hook only when the root device is CUDA.
    # If a Lightning release starts registering it on CPU, this fails: then the README's Callback is unneeded.
    ignored, hooked = lightning_runs["tuned_strategy_hook"], lightning_runs["tuned"]
    assert [r["hook_calls"] for r in ignored["ranks"]] == [0, 0]
    assert ignored["ranks"][0]["params"] == ignored["ranks"][1]["params"]
    # fp16 compression changes the numbers, so the Callback's hook really did the reduction.
    assert ignored["ranks"][0]["params"] != hooked["ranks"][0]["params"]


# ---------------------------------------------------------------------------------------------------------------
# Accelerate


@pytest.fixture(scope="module")
def accelerate_run(tmp_path_factory):
    pytest.importorskip("accelerate", reason="accelerate is not installed (./dev installs it)")
    return _run_json(tmp_path_factory.mktemp("accelerate"), "accelerate_cpu.py", "--init", "tuned")


def _load_example(name):
    spec = importlib.util.spec_from_file_location(f"clients_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_accelerate_uses_the_tuned_group(accelerate_run):
    run = accelerate_run
    assert run["backend"] == "tuned"
    assert run["model_wrapper"] == "DistributedDataParallel" and run["ddp_group_backend"] == "tuned"
    assert run["distributed_type"] == "DistributedType.MULTI_CPU" and run["num_processes"] == 2
    # Accelerate sets state.backend from its own choice for cpu=True, not from the group it found.
    assert run["state_backend"] == "gloo"


def test_accelerate_synchronises_gradients(accelerate_run):
    run = accelerate_run
    seen0, seen1 = run["ranks_sample_indices"]
    assert not set(seen0) & set(seen1), "the prepared DataLoader should give each rank its own samples"
    assert run["params_changed"]
    assert run["ranks_params"][0] == run["ranks_params"][1]
    mean_last = (run["ranks_losses"][0][-1] + run["ranks_losses"][1][-1]) / 2
    assert run["reduced_mean_last_loss"] == pytest.approx(mean_last, rel=1e-6)


def test_accelerate_matches_one_process_on_both_batches(accelerate_run):
    # DDP averages the two ranks' gradients: the same as one process minimising the mean of the two batch losses.
    # Summation order differs from one process, so this compares to float32 rounding.
    example = _load_example("accelerate_cpu")
    run = accelerate_run
    _, x, y = example.data().tensors
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batch = 4
    seen0, seen1 = run["ranks_sample_indices"]
    for step in range(len(run["ranks_losses"][0])):
        i0, i1 = seen0[step * batch : (step + 1) * batch], seen1[step * batch : (step + 1) * batch]
        loss0 = torch.nn.functional.mse_loss(model(x[i0]), y[i0])
        loss1 = torch.nn.functional.mse_loss(model(x[i1]), y[i1])
        assert [loss0.item(), loss1.item()] == pytest.approx(
            [run["ranks_losses"][0][step], run["ranks_losses"][1][step]], rel=1e-5
        )
        ((loss0 + loss1) / 2).backward()
        optimizer.step()
        optimizer.zero_grad()
    expected = torch.cat([p.detach().flatten() for p in model.parameters()]).double()
    torch.testing.assert_close(
        torch.tensor(run["ranks_params"][0], dtype=torch.float64), expected, rtol=1e-5, atol=1e-6
    )


def test_accelerate_refuses_tuned_in_init_process_group_kwargs(tmp_path):
    # accelerate 1.16: for cpu=True the backend is gloo (or mpi), and any other requested backend raises.
    pytest.importorskip("accelerate", reason="accelerate is not installed (./dev installs it)")
    run = _run_json(tmp_path, "accelerate_cpu.py", "--init", "kwargs")
    assert run["raised"] == "ValueError"
    assert run["message"] == "Your assigned backend tuned is not available, please use gloo"


def test_accelerate_without_cpu_flag_runs_as_one_process(tmp_path):
    # accelerate 1.16 on a machine without an accelerator: Accelerator() without cpu=True finds no device backend
    # and sets DistributedType.NO, ignoring the existing tuned group, so prepare() does not wrap the model in DDP.
    pytest.importorskip("accelerate", reason="accelerate is not installed (./dev installs it)")
    if torch.accelerator.is_available():
        pytest.skip("this machine has an accelerator: Accelerate would then take its device backend")
    run = _run_json(tmp_path, "accelerate_cpu.py", "--init", "tuned-without-cpu")
    assert run["backend"] == "tuned"
    assert run["distributed_type"] == "DistributedType.NO" and run["num_processes"] == 1
    assert run["state_backend"] is None and run["model_wrapper"] == "Linear"


# ---------------------------------------------------------------------------------------------------------------
# Distributed checkpoint


@pytest.mark.parametrize("ckpt_backend", ["gloo", "tuned"])
def test_dcp_async_save_on_its_own_group(tmp_path, ckpt_backend):
    steps_before, steps_during = 3, 6
    run = _run_json(
        tmp_path,
        "dcp_async_save.py",
        "--ckpt-backend",
        ckpt_backend,
        "--ckpt-dir",
        tmp_path / "ckpt",
        "--steps-before",
        steps_before,
        "--steps-during",
        steps_during,
    )
    assert run["backend"] == "tuned" and run["ckpt_backend"] == ckpt_backend
    assert (tmp_path / "ckpt" / ".metadata").is_file()
    for rank in run["ranks"]:
        # every training step's all_reduce and all_gather gave the known result, before and during the save
        assert rank["collective_checks"] == [True] * (steps_before + steps_during), rank
        assert rank["loaded_equals_saved"] and rank["restored_model_equals_saved"], rank
        assert rank["live_differs_from_saved"], "training went on after the save; the checkpoint must not follow it"
    assert run["ranks"][0]["params"] == run["ranks"][1]["params"]
