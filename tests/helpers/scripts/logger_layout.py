"""The files a CSVLogger writes, as JSON: run with Lightning Fabric's logger or fabric_lite's, and compare.

python tests/helpers/scripts/logger_layout.py {lightning|fabric_lite} ROOT
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import torch

if sys.argv[1] == "lightning":
    from lightning_fabric.loggers import CSVLogger
else:
    from fabric_lite.loggers import CSVLogger

root = sys.argv[2]
for existing in ("version_0", "version_3", "version_x", "other"):
    os.makedirs(os.path.join(root, "lightning_logs", existing))

seen = {}
# the next free version (version_4), automatic steps, tensors, a metric that appears later
a = CSVLogger(root)
a.log_metrics({"loss": torch.tensor(0.5), "acc": 0.25})
a.log_metrics({"loss": 0.25})
a.log_metrics({"loss": 0.125, "lr": 1e-3, "count": 3})
a.finalize("success")
seen["a"] = [a.version, os.path.relpath(a.log_dir, root)]

# explicit steps, a flush every two rows, a new column after the file exists, a prefix, no name, a str version
b = CSVLogger(root, name=None, version="run-b", prefix="train", flush_logs_every_n_steps=2)
for step in range(4):
    b.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
b.log_metrics({"loss": 0.1, "val_acc": torch.tensor(0.9, dtype=torch.float64)}, step=4)
b.finalize("success")
seen["b"] = [b.version, os.path.relpath(b.log_dir, root)]

# rows without a step across flushes (every 2 rows): the step is the number of rows since the last flush point, as
# Lightning writes it; a row whose step + 1 is a multiple of 2 is one too, and so is an explicit save()
d = CSVLogger(root, name="auto", version=0, flush_logs_every_n_steps=2)
for value in range(5):
    d.log_metrics({"v": value})
d.log_metrics({"v": 5}, step=9)
d.log_metrics({"v": 6})
d.save()
d.log_metrics({"v": 7})
d.finalize("success")

# an explicit int version whose folder holds an old metrics.csv: replaced, with a warning
os.makedirs(os.path.join(root, "exp", "version_7"))
with open(os.path.join(root, "exp", "version_7", "metrics.csv"), "w") as f:
    f.write("old,step\n1,0\n")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    c = CSVLogger(root, name="exp", version=7)
    c.log_metrics({"x": 1}, step=0)
    c.finalize("success")
seen["c"] = [c.version, os.path.relpath(c.log_dir, root), len(caught)]

files = {}
for folder, _, names in os.walk(root):
    for name in names:
        path = os.path.join(folder, name)
        with open(path) as f:
            files[os.path.relpath(path, root)] = f.read()
dirs = sorted(os.path.relpath(folder, root) for folder, _, _ in os.walk(root))
print("LAYOUT " + json.dumps({"seen": seen, "files": files, "dirs": dirs}, sort_keys=True))
