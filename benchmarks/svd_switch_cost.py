"""What the spectral-norm switch costs (issue 34): the MLP of breakdown_workloads.py with every step recorded, three
copies in one process: plain training, comgra with ``calculate_svd_and_other_expensive_operations_of_parameters``
off (the default) and on; blocks of 20 steps interleaved, the order rotating each round. Prints comgra's extra
milliseconds per step over plain training (medians over the rounds) on the training thread's CPU clock, the
process's CPU clock (the writer and statistics threads too) and the wall clock, with the load average.

    python benchmarks/svd_switch_cost.py          # R=15 python ... for more rounds
"""
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.simplefilter("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402

import breakdown_workloads as wl  # noqa: E402
from comgra.objects import DecisionMakerForRecordingsFrequencyPerType  # noqa: E402
from comgra.recorder import ComgraRecorder  # noqa: E402

torch.set_num_threads(1)
root = tempfile.mkdtemp()
w = wl.WORKLOADS["mlp"]


def rec(trial: str, svd: bool) -> ComgraRecorder:
    return ComgraRecorder(root, "bench", trial, DecisionMakerForRecordingsFrequencyPerType(min_training_steps_difference=1),
                          max_num_batch_size_to_record=5, calculate_svd_and_other_expensive_operations_of_parameters=svd)


trainers = {"plain": wl.Trainer(w, None), "svd off": wl.Trainer(w, rec("off", False)), "svd on": wl.Trainer(w, rec("on", True))}
b = [w.batch(i) for i in range(10)]
n = 20


def block(t: wl.Trainer) -> tuple[float, float, float]:
    c, p, wall = time.thread_time(), time.process_time(), time.perf_counter()
    for i in range(n):
        t.step(b[i % 10])
    return (time.thread_time()-c)/n*1e3, (time.process_time()-p)/n*1e3, (time.perf_counter()-wall)/n*1e3


for t in trainers.values():
    block(t)
res: dict[str, list[tuple[float, float, float]]] = {k: [] for k in trainers}
load0 = os.getloadavg()[0]
names = list(trainers)
for r in range(int(os.environ.get("R", "9"))):
    order = names[r % 3:] + names[:r % 3]
    for k in order:
        res[k].append(block(trainers[k]))
print(f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f}; {len(res['plain'])} rounds of {n} steps; medians, ms per step")
for i, clock in enumerate(("training thread CPU", "process CPU", "wall")):
    pl = [x[i] for x in res["plain"]]
    cells = [f"plain {statistics.median(pl):6.2f}"] + [f"{k}: +{statistics.median([x[i]-p for x, p in zip(res[k], pl)]):6.2f}" for k in ("svd off", "svd on")]
    print(f"  {clock:20s}", "  ".join(cells))
for t in trainers.values():
    if t.recorder:
        t.recorder.finalize()
