"""litgpt 0.5.13, the largest public client of Lightning Fabric, runs unmodified on fabric_lite through the import
hook (``FABRIC_LITE_AS_LIGHTNING=1``), with Lightning's numbers.

Every command below runs twice in ``.venv-litgpt`` (built by ``.ci/setup-litgpt``): once as published, on Lightning
Fabric 2.6.6, and once with the hook on, on fabric_lite (the one-process commands of a library one after another in
one interpreter, through litgpt's own ``main()``: :mod:`tests.helpers.litgpt.commands`). Both start from the same
tiny model, tokenizer and data, made locally (``tests/helpers/litgpt/tiny.py``: no download), with one CPU thread per
process (several threads make CPU backward passes differ in the last bits from run to run, in either library).

* litgpt's entry points on one process: ``litgpt pretrain`` (and resumed from its checkpoint, also across the two
  libraries), ``finetune_lora``, ``finetune_full``, ``finetune_adapter``, ``finetune_adapter_v2`` and ``generate``:
  the same printed losses and text, the same files and the same checkpoint tensors, bit for bit.
* on two CPU processes, where litgpt picks FSDP (Lightning refuses FSDP on the CPU): ``pretrain`` reaches the same
  weights as one process within float tolerance; ``finetune_full`` and ``finetune_adapter`` (which pass FSDP1's
  arguments) complete, near the one-process run (the data order differs).
* litgpt's own test files that drive Fabric, from its PyPI source distribution: every test that passes on
  Lightning (a list kept in the project, computed once: :mod:`tests.tiers.litgpt.own_tests`) passes on fabric_lite.

The tier is optional, like the DeepSpeed tier: the whole suite skips it unless asked (``pytest -m litgpt``, this
file named, or ``FABRIC_LITE_LITGPT=1``, which also makes a failed install an error).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.harness import Completed, base_env, optional_venv, run_python
from tests.helpers.litgpt.commands import holds_tensors, split
from tests.helpers.litgpt.tiny import BLOCK_SIZE
from tests.tiers.litgpt import own_tests

pytestmark = pytest.mark.litgpt

VENV = own_tests.VENV
COMMANDS = "tests.helpers.litgpt.commands"
IMPLS = ("lightning", "fabric_lite")
NICE = own_tests.NICE
FINETUNE = ("finetune_lora", "finetune_full", "finetune_adapter", "finetune_adapter_v2")
_FINETUNE_ARGS = [
    "--data=JSON",
    "--data.json_path=sft.json",
    "--data.val_split_fraction=0.25",
    "--data.num_workers=0",  # litgpt's default 4 workers leave multiprocessing temp folders behind (torch's, not ours)
    "--train.epochs=1",
    "--train.max_steps=4",
    "--train.global_batch_size=2",
    "--train.micro_batch_size=1",
    "--train.save_interval=2",
    "--train.lr_warmup_steps=1",
    f"--train.max_seq_length={BLOCK_SIZE}",
    "--eval.interval=2",
    "--eval.max_iters=2",
    "--eval.max_new_tokens=4",
    "--precision=32-true",
    "--logger_name=csv",
    "--seed=42",
]
_TIMINGS = [
    (re.compile(r"\d+(\.\d+)? ?ms\b"), "<ms>"),
    (re.compile(r"remaining time: \S+"), "remaining time: <t>"),
    (re.compile(r"(Time to [\w ]+: )[\d.]+ seconds"), r"\1<s> seconds"),
    (re.compile(r"(Training Time\s*:\s*)[\d.]+ s"), r"\1<s> s"),
    (re.compile(r"(Tok/sec\s*:\s*)[\d.]+"), r"\1<n>"),
    (re.compile(r"(Time for inference \d+: )[\d.]+ sec total, [\d.]+ tokens/sec"), r"\1<time>"),
    (re.compile(r"(Measured TFLOPs: )[\d.]+"), r"\1<n>"),
    (re.compile(r" object at 0x[0-9a-f]+>"), " object at 0x...>"),
]
_TIME_COLUMNS = {"iter_time", "time", "remaining_time"}  # and every throughput column ("device/..._per_sec")


@pytest.fixture(scope="module")
def litgpt_python(request: pytest.FixtureRequest) -> str:
    """The Python of ``.venv-litgpt``, built by ``.ci/setup-litgpt`` when missing."""
    return optional_venv(
        request.config,
        marker="litgpt",
        variable="FABRIC_LITE_LITGPT",
        module_file="test_litgpt.py",
        venv=VENV,
        setup=".ci/setup-litgpt",
        # transformers is on the path of litgpt's own tests only (.venv-litgpt/own-tests-site)
        probe=(
            "import fabric_lite, lightning, litgpt, pytest_timeout, importlib.util as u\n"
            "assert not u.find_spec('transformers')"
        ),
    )


#: torch's compile cache, shared by the module's litgpt runs (set by :func:`_compile_cache`)
_COMPILE_CACHE: list[Path] = []


@pytest.fixture(scope="module", autouse=True)
def _compile_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``litgpt pretrain`` compiles its model (``torch.compile``). With an empty cache, as in each test process's own
    ``TMPDIR``, a run took 88 s of CPU; with the kernels already in the cache, 29 s. One cache for the module's runs,
    as a machine's ``/tmp/torchinductor_<user>`` is for every run of a user: the kernels are compiled once and then
    loaded, the same code in every run (the printed losses and the checkpoints come out bit for bit the same)."""
    _COMPILE_CACHE[:] = [tmp_path_factory.mktemp("torchinductor")]


def _env(impl: str, **extra: str) -> dict[str, str]:
    env = own_tests.env(impl)
    if _COMPILE_CACHE:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(_COMPILE_CACHE[0])
    env.update(extra)
    return env


def _litgpt(python: str, impl: str, folder: Path, *args: str, timeout: float = 300, **env: str) -> Completed:
    done = run_python(
        ["-m", "litgpt", *args], env=_env(impl, **env), cwd=folder, python=python, timeout=timeout, nice=NICE
    )
    assert done.returncode == 0, f"litgpt {' '.join(args)} on {impl} failed\n{done.output}"
    return done


def normalised(text: str, folder: Path) -> list[str]:
    """The lines a run printed, with timings and its own folder masked: what must be equal across libraries."""
    lines = []
    for line in text.replace(str(folder), "<run>").splitlines():
        for pattern, replacement in _TIMINGS:
            line = pattern.sub(replacement, line)
        lines.append(line.rstrip())
    return lines


def files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def digests(paths: list[Path], python: str) -> list[dict[str, str]]:
    """Every tensor of each checkpoint file (or of each file in a sharded folder) by an MD5 of its bytes; other values
    by their ``repr`` (:func:`tests.helpers.litgpt.commands.digest`). One process reads them all: a start of Python
    with torch costs seconds of CPU."""
    if not paths:
        return []
    done = run_python(["-m", COMMANDS, "digest", *map(str, paths)], python=python, timeout=120, env=base_env())
    assert done.returncode == 0, done.output
    return json.loads(done.stdout.split("DIGEST ", 1)[1])  # type: ignore[no-any-return]


def metrics(path: Path) -> list[dict[str, str]]:
    """The rows of a CSVLogger's metrics.csv without the columns that hold timings."""
    import csv

    with open(path, newline="") as f:
        rows = csv.DictReader(f)
        return [{k: v for k, v in row.items() if k not in _TIME_COLUMNS and not k.endswith("_per_sec")} for row in rows]


@pytest.fixture(scope="module")
def runs(litgpt_python: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every entry point, on each library in a folder of its own: what each command printed, and the tensors of every
    checkpoint they wrote. The commands of one library run in one interpreter, one after another, each through
    litgpt's own ``main()`` (:mod:`tests.helpers.litgpt.commands`)."""
    resume = ["pretrain", "--config=pretrain.yaml", f"--train.max_tokens={9 * 4 * BLOCK_SIZE}", "--resume=auto"]
    generate = ["generate", "checkpoint", "--prompt=the cat", "--max_new_tokens=16", "--top_k=4"]
    steps: list[list[Any]] = [
        ["tiny"],
        ["litgpt", "pretrain", ["pretrain", "--config=pretrain.yaml"]],
        ["copy", "out/pretrain", "out/pretrain-6"],  # for the cross-library resume
        ["litgpt", "resume", resume],
        *(["litgpt", c, [c, "checkpoint", f"--out_dir=out/{c}", *_FINETUNE_ARGS]] for c in FINETUNE),
        ["litgpt", "generate", generate],
        # the merged LoRA weights, with the fine-tuning's prompt style
        ["litgpt", "generate_lora", [generate[0], "out/finetune_lora/final", *generate[2:]]],
    ]
    out: dict[str, Any] = {}
    for impl in IMPLS:
        folder = tmp_path_factory.mktemp(impl)
        done = run_python(
            ["-m", COMMANDS, str(folder), json.dumps(steps)],
            env=_env(impl),
            python=litgpt_python,
            timeout=1500,
            nice=NICE,
        )
        assert done.returncode == 0, f"litgpt's commands on {impl} failed\n{done.output}"
        printed = {
            name: Completed(done.argv, 0, text, done.stderr, done.seconds) for name, text in split(done.stdout).items()
        }
        assert list(printed) == [step[1] for step in steps if step[0] == "litgpt"], done.output
        for command, text in printed.items():  # kept beside the run, to read when a comparison fails
            (folder / f"{command}.stdout").write_text(text.stdout)
        found = json.loads(done.stdout.split("\nDIGESTS ", 1)[1])
        out[impl] = {"folder": folder, "printed": printed, "digests": found}
    return out


def _same_printed(runs: dict[str, Any], command: str) -> list[str]:
    lines = {impl: normalised(runs[impl]["printed"][command].stdout, runs[impl]["folder"]) for impl in IMPLS}
    assert lines["fabric_lite"] == lines["lightning"], f"`litgpt {command}` printed differently:\n" + "\n".join(
        f"{impl}:\n{runs[impl]['printed'][command].output}" for impl in IMPLS
    )
    return lines["lightning"]


def _same_files_and_checkpoints(runs: dict[str, Any], subfolder: str) -> None:
    trees = {impl: runs[impl]["folder"] / "out" / subfolder for impl in IMPLS}
    listed = {impl: files(tree) for impl, tree in trees.items()}
    assert listed["fabric_lite"] == listed["lightning"]
    tensors = [n for n in listed["lightning"] if holds_tensors(Path(n).name)]
    read = {impl: {n: runs[impl]["digests"][f"{subfolder}/{n}"] for n in tensors} for impl in IMPLS}
    for name in listed["lightning"]:
        a, b = (trees[impl] / name for impl in IMPLS)
        if name in tensors:
            assert read["fabric_lite"][name] == read["lightning"][name], f"{subfolder}/{name} differs"
        elif name.endswith("metrics.csv"):
            assert metrics(b) == metrics(a), f"{subfolder}/{name} differs"
        else:  # text (yaml, json): the same once each run's own folder is masked
            texts = [(trees[impl] / name).read_text().replace(str(runs[impl]["folder"]), "<run>") for impl in IMPLS]
            assert texts[1] == texts[0], f"{subfolder}/{name} differs"


def test_pretrain_prints_writes_and_saves_what_lightning_does(runs: dict[str, Any]) -> None:
    lines = _same_printed(runs, "pretrain")
    losses = [line for line in lines if "loss train:" in line]
    assert len(losses) == 6 and any("Final evaluation | val loss:" in line for line in lines), lines
    _same_files_and_checkpoints(runs, "pretrain-6")


def test_pretrain_resumes_from_its_checkpoint(runs: dict[str, Any]) -> None:
    lines = _same_printed(runs, "resume")
    assert "Resuming training from '<run>/out/pretrain/step-00000006/lit_model.pth'" in "\n".join(lines) or any(
        "Resuming training from <run>/out/pretrain/step-00000006/lit_model.pth" in line for line in lines
    ), lines
    assert [line.split("|")[1].strip() for line in lines if "loss train:" in line] == [
        "iter 14 step 7",
        "iter 16 step 8",
        "iter 18 step 9",
    ]
    _same_files_and_checkpoints(runs, "pretrain")


# a niced litgpt run (12 s alone) beside the other worker's jobs took over 120 s in CI: the bound covers its own
# subprocess bounds (300 s, and 120 s for each digest)
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("writer", "reader"), [("lightning", "fabric_lite"), ("fabric_lite", "lightning")])
def test_a_pretrain_checkpoint_resumes_on_the_other_library(
    runs: dict[str, Any], litgpt_python: str, writer: str, reader: str, tmp_path: Path
) -> None:
    """The step-6 checkpoint one library wrote (model, optimizer, the loader's own state, counters) resumes on the
    other with the losses and final weights of the writer's own resume."""
    folder = runs[writer]["folder"]
    for name in ("checkpoint", "pretrain.yaml"):
        (tmp_path / name).symlink_to(folder / name)
    shutil.copytree(folder / "out" / "pretrain-6", tmp_path / "out" / "pretrain")
    resume = ["pretrain", "--config=pretrain.yaml", f"--train.max_tokens={9 * 4 * BLOCK_SIZE}", "--resume=auto"]
    resume.append(f"--out_dir={tmp_path / 'out' / 'pretrain'}")
    done = _litgpt(litgpt_python, reader, tmp_path, *resume)
    theirs = [line for line in normalised(done.stdout, tmp_path) if "loss" in line]
    own = [line for line in normalised(runs[writer]["printed"]["resume"].stdout, folder) if "loss" in line]
    assert theirs == own and len(theirs) >= 3, done.output
    final = "final/lit_model.pth"
    expected, resumed = digests(
        [folder / "out" / "pretrain" / final, tmp_path / "out" / "pretrain" / final], litgpt_python
    )
    assert resumed == expected


@pytest.mark.parametrize("command", FINETUNE)
def test_finetuning_prints_writes_and_saves_what_lightning_does(runs: dict[str, Any], command: str) -> None:
    lines = _same_printed(runs, command)
    assert sum("loss train:" in line for line in lines) == 8 and any("Final evaluation" in x for x in lines), lines
    _same_files_and_checkpoints(runs, command)


@pytest.mark.parametrize("command", ["generate", "generate_lora"])
def test_generation_prints_what_lightning_does(runs: dict[str, Any], command: str) -> None:
    lines = _same_printed(runs, command)
    text = [line for line in lines if line and not line.startswith(("{", " ", "Seed set"))]
    assert text and all(len(line) > 1 for line in text), lines  # what the model wrote


@pytest.mark.distributed
@pytest.mark.timeout(900)
def test_two_processes_train_as_one_where_lightning_refuses(litgpt_python: str, tmp_path: Path) -> None:
    """``--devices 2`` on the CPU: litgpt picks ``FSDPStrategy`` (hybrid sharding). Lightning refuses it there;
    fabric_lite trains, to the weights and losses of one process within float tolerance: the same global batch of 4
    per step (one process: micro-batches of 4; two: 2 each, from a ``DistributedSampler`` over unshuffled data) and
    so the same learning-rate schedule (litgpt's depends on the gradient accumulation). The two processes run
    compiled, as litgpt compiles its model; the one-process reference runs eagerly."""
    run_python(
        ["-m", "tests.helpers.litgpt.tiny", str(tmp_path)], python=litgpt_python, env=_env("lightning"), timeout=120
    )
    common = ["pretrain", "--config=pretrain.yaml", "--data.init_args.shuffle=false"]
    refused = run_python(
        ["-m", "litgpt", *common, "--devices=2", "--out_dir=out/lightning-2"],
        env=_env("lightning"),
        cwd=tmp_path,
        python=litgpt_python,
        timeout=300,
        nice=NICE,
    )
    assert refused.returncode != 0 and "FSDP" in refused.stderr, refused.output
    # the reference runs eagerly: compiled, its batch of 4 shares no kernel with the module's other runs, and the
    # compilation alone took 105 s of CPU (measured against the compiled two processes: weights within 4e-7)
    one_process = [*common, "--devices=1", "--train.micro_batch_size=4"]
    one = _litgpt(litgpt_python, "fabric_lite", tmp_path, *one_process, TORCHDYNAMO_DISABLE="1")
    two = _litgpt(litgpt_python, "fabric_lite", tmp_path, *common, "--devices=2", "--out_dir=out/two", timeout=600)
    code = (
        "import sys, torch\n"
        "from litgpt import GPT, Config\n"
        "from tests.helpers.litgpt.tiny import MODEL, TinyText\n"
        "data = TinyText(shuffle=False)\n"
        "data.connect(batch_size=8)\n"
        "batch = next(iter(data.val_dataloader()))\n"
        "losses, states = [], []\n"
        "for path in sys.argv[1:]:\n"
        "    state = torch.load(path, weights_only=True)\n"
        "    state = state.get('model', state)\n"
        "    model = GPT(Config(**MODEL))\n"
        "    model.load_state_dict(state)\n"
        "    logits = model(batch[:, :-1])\n"
        "    losses.append(torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()).item())\n"
        "    states.append(state)\n"
        "worst = max((states[0][k] - states[1][k]).abs().max().item() for k in states[0])\n"
        "print('COMPARED', worst, *losses)\n"
    )
    final = "final/lit_model.pth"
    compared = run_python(
        ["-c", code, str(tmp_path / "out" / "pretrain" / final), str(tmp_path / "out" / "two" / final)],
        python=litgpt_python,
        env=_env("lightning"),
        timeout=120,
    )
    assert compared.returncode == 0, compared.output + one.output + two.output
    worst, loss_one, loss_two = (float(v) for v in compared.stdout.split("COMPARED ", 1)[1].split())
    assert worst < 1e-5 and abs(loss_one - loss_two) < 1e-5, compared.stdout
    assert loss_one < 3.0, compared.stdout  # it trained (the untrained model's loss is about 3.5)


#: the finetuning runs on one and two processes: prompts kept whole (256 tokens, the model's block size), so that
#: the examples differ (cut to 32 tokens, every one is the same start of the Alpaca template)
_TWO_PROCESS_FINETUNE_ARGS = [
    *(arg for arg in _FINETUNE_ARGS if not arg.startswith(("--train.max_seq_length", "--train.save_interval"))),
    "--train.max_seq_length=256",
    "--train.save_interval=4",
]


@pytest.mark.distributed
@pytest.mark.timeout(1200)
def test_finetuning_on_two_processes_lands_near_one_process(litgpt_python: str, tmp_path: Path) -> None:
    """``litgpt finetune_full`` and ``finetune_adapter`` with ``--devices 2`` on the CPU, under the hook: litgpt builds
    ``FSDPStrategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block}, state_dict_type="full",
    limit_all_gathers=True, cpu_offload=False)`` (FSDP1's arguments, which fabric_lite maps onto ``fully_shard``),
    trains 4 steps of a global batch of 2 (one example per process; one process accumulates two) and writes its
    checkpoints. Each lands near the same command on one process, and cannot equal it:

    * the data order differs: one process draws the examples in its ``RandomSampler``'s order, two processes in
      their ``DistributedSampler``'s, so the steps see other pairs of examples. ``finetune_full``'s weights differ
      from the one-process run's by at most about 0.004 (measured 0.0035), as much as each run moved them from the
      initial checkpoint (Adam moves every weight by about the learning rate per step), but the two runs moved
      them the same way (cosine similarity of the updates 0.97) and reach the same validation loss within 0.005;
    * ``finetune_adapter``'s adapter embedding starts elsewhere: on two processes litgpt creates the model on the
      meta device and fabric_lite initialises it module by module, while one process builds it eagerly, where
      litgpt's adapter ``Block`` first builds (and discards) a plain attention, which draws random numbers too. Its
      weights are therefore not comparable; the validation loss is (measured: 3.556 and 3.547).
    """
    run_python(
        ["-m", "tests.helpers.litgpt.tiny", str(tmp_path)], python=litgpt_python, env=_env("lightning"), timeout=120
    )
    finals, val_losses = {}, {}
    for command, weights in (("finetune_full", "lit_model.pth"), ("finetune_adapter", "lit_model.pth.adapter")):
        for devices in (1, 2):
            out = f"out/{command}-{devices}"
            args = [command, "checkpoint", f"--out_dir={out}", f"--devices={devices}", *_TWO_PROCESS_FINETUNE_ARGS]
            done = _litgpt(litgpt_python, "fabric_lite", tmp_path, *args, timeout=400)
            lines = normalised(done.stdout, tmp_path)
            steps = [line.split("|")[1].strip() for line in lines if "loss train:" in line]
            # one process: two micro-batches a step; two: one each
            assert steps[-1] == f"iter {8 // devices} step 4" and len(steps) == 8 // devices, done.output
            final = [line for line in lines if line.startswith("Final evaluation | val loss:")]
            assert final, done.output
            val_losses[command, devices] = float(final[0].split("val loss:")[1].split("|")[0])
            finals[command, devices] = tmp_path / out / "final" / weights
    code = (
        "import sys, torch\n"
        "states = [torch.load(path, weights_only=True) for path in sys.argv[1:]]\n"
        "initial, one, two = [state.get('model', state) for state in states]\n"
        "worst = max((one[k] - two[k]).abs().max().item() for k in initial)\n"
        "moved = max((one[k] - initial[k]).abs().max().item() for k in initial)\n"
        "updates = [torch.cat([(s[k] - initial[k]).flatten() for k in initial]) for s in (one, two)]\n"
        "cosine = torch.nn.functional.cosine_similarity(*updates, dim=0).item()\n"
        "print('COMPARED', worst, moved, cosine)\n"
    )
    paths = [tmp_path / "checkpoint" / "lit_model.pth", finals["finetune_full", 1], finals["finetune_full", 2]]
    compared = run_python(["-c", code, *map(str, paths)], python=litgpt_python, env=_env("lightning"), timeout=120)
    assert compared.returncode == 0, compared.output
    worst, moved, cosine = (float(v) for v in compared.stdout.split("COMPARED ", 1)[1].split())
    assert moved > 1e-3 and worst < 0.01 and cosine > 0.9, compared.stdout  # trained, the same way, nearby
    for command in ("finetune_full", "finetune_adapter"):
        assert abs(val_losses[command, 1] - val_losses[command, 2]) < 0.02, val_losses
    assert finals["finetune_adapter", 2].is_file()


@pytest.mark.timeout(1800)
def test_litgpts_own_fabric_tests_pass_as_on_lightning(litgpt_python: str, tmp_path: Path) -> None:
    """litgpt's own test files (from its sdist, with our conftest.py): every test that passes on Lightning (the list
    kept in tests/tiers/litgpt/passing_on_lightning.txt, see own_tests.py) passes on fabric_lite. Those that fail on
    Lightning need what CI does not have (the Hugging Face Hub, bitsandbytes' optimizers)."""
    reference = own_tests.read_reference()
    ours, output = own_tests.run(litgpt_python, "fabric_lite", tmp_path)
    counts = {outcome: list(ours.values()).count(outcome) for outcome in ("passed", "failed", "skipped")}
    print(f"litgpt's tests on fabric_lite: {counts}")
    regressed = sorted(test for test in reference if ours.get(test) != "passed")
    assert not regressed, f"pass on Lightning, not on fabric_lite: {regressed}\n{output[-20000:]}"
    assert len(reference) > 600, len(reference)
