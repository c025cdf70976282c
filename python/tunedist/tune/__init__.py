"""DDP bucket autotuner.

    model_ddp, report = tunedist.tune.ddp(model, step_fn=lambda m: loss(m(x), y), hook=None)
    print(report.table())

It measures, on the running job, when each gradient is ready in the backward pass and what an all_reduce costs at
each size on the process group's backend (a latency + bandwidth fit, checked against the measurements, its
bandwidth term calibrated by one all_reduce right after a backward, as DDP meets it); predicts
the step time and exposed communication of every candidate bucket_cap_mb (and first-bucket size, where the running
torch allows one) by simulating DDP's bucketing and one comm stream; measures the best few for real, where a trial
overrules the best prediction only when it is faster by more than its measurement's noise; and every rank takes
rank 0's choice. The report also says which tunedist hook would pay off where communication stays exposed.
"""

from .candidates import Candidate, make_candidates
from .report import TuneReport
from .tuner import TuneOptions, ddp, tune

# What a training script calls. The parts (the cost model, the measurements, the trial selection) stay importable
# from their modules: tunedist.tune.costmodel, .measure, .candidates, .report, .tuner.
__all__ = ["Candidate", "TuneOptions", "TuneReport", "ddp", "make_candidates", "tune"]
