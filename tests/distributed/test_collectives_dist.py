"""Collectives on real gloo process groups of 2 and 3 CPU ranks (RELIABILITY.md cases 8-11).

One job per world size runs every case of :mod:`tests.helpers.jobs.collectives` (a spawn costs seconds, a case
costs milliseconds); the tests below each check one case on every rank against an exact, closed-form value
built from the same rank-dependent inputs the job used.
"""

from __future__ import annotations

import importlib
import math
import re
from collections import OrderedDict, defaultdict
from fractions import Fraction
from typing import Any

import pytest
import torch

from tests.helpers.harness import spawn_job
from tests.helpers.jobs import collectives as jobs
from tests.helpers.jobs.collectives import Metrics, Pair, Raised, describe

pytestmark = pytest.mark.distributed

WORLDS = (2, 3)
SEED = 20240607
N_PROPERTY = 50


@pytest.fixture(scope="module")
def run_suite():  # type: ignore[no-untyped-def]
    """Run the suite once per world size; cache the result (or the failure, so no test retries it)."""
    cache: dict[int, Any] = {}

    def get(world: int) -> list[dict[str, Any]]:
        if world not in cache:
            try:
                cache[world] = spawn_job(
                    "tests.helpers.jobs.collectives:suite", world, timeout=120, seed=SEED, n_property=N_PROPERTY
                )
            except pytest.fail.Exception as failure:
                cache[world] = failure
        if isinstance(cache[world], BaseException):
            pytest.fail(f"the {world}-rank collectives job failed (see the first test that ran it): {cache[world]}")
        return cache[world]  # type: ignore[no-any-return]

    return get


@pytest.fixture(params=WORLDS, ids=lambda w: f"{w}ranks")
def world(request: pytest.FixtureRequest) -> int:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def results(run_suite, world):  # type: ignore[no-untyped-def]
    return run_suite(world)


def observed(results: list[dict[str, Any]], case: str) -> list[Any]:
    assert all(case in r for r in results), f"case {case!r} missing on some rank"
    return [r[case] for r in results]


def assert_every_rank(results: list[dict[str, Any]], case: str, expected: Any) -> None:
    for rank, value in enumerate(observed(results, case)):
        assert value == expected, f"rank {rank}, case {case}"


def tensor(values: Any, dtype: str | torch.dtype) -> Any:
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    return describe(torch.tensor(values, dtype=dtype))


def assert_raised_everywhere(results: list[dict[str, Any]], case: str, exc: type[BaseException]) -> list[Raised]:
    raised = observed(results, case)
    for rank, value in enumerate(raised):
        assert isinstance(value, Raised), f"rank {rank} did not raise in {case}: {value!r}"
        assert exc.__name__ in value.mro, f"rank {rank} raised {value.type}, expected {exc.__name__}: {value.message}"
    return raised


def gather_stack(values_per_rank: list[Any], dtype: str | torch.dtype) -> Any:
    return tensor(values_per_rank, dtype)


# ---------------------------------------------------------------------------------------------- all_reduce
def closed_form(op: str, columns: list[tuple[int, ...]], world: int, dtype: str) -> list[Any]:
    """Exact reduction of integer columns with Python numbers; the (integer) mean is truncated toward zero."""
    if op == "mean":
        return [math.trunc(Fraction(sum(c), world)) for c in columns]
    fn = {"sum": sum, "max": max, "min": min, "product": math.prod}[op]
    return [fn(c) for c in columns]


def expected_reduce(inputs: list[list[int]], op: str, world: int, dtype: str) -> Any:
    columns = list(zip(*inputs))
    if op == "mean" and not dtype.startswith(("int", "uint")):
        # the mean in the dtype itself: the exact sum, divided once (thirds are not exact in binary)
        dt = getattr(torch, dtype)
        return describe(torch.tensor([sum(c) for c in columns], dtype=dt) / world)
    return tensor(closed_form(op, columns, world, dtype), dtype)


@pytest.mark.parametrize("op", jobs.REDUCE_OPS)
@pytest.mark.parametrize("dtype", jobs.REDUCE_DTYPES)
def test_all_reduce_every_op_and_dtype(results, world, dtype, op):
    inputs = [jobs.reduce_input(r) for r in range(world)]
    assert_every_rank(results, f"all_reduce/{dtype}/{op}", expected_reduce(inputs, op, world, dtype))


@pytest.mark.parametrize("op", jobs.REDUCE_OPS)
@pytest.mark.parametrize("dtype", jobs.SMALL_DTYPES)
def test_all_reduce_small_dtypes(results, world, dtype, op):
    inputs = [jobs.small_input(r) for r in range(world)]
    assert_every_rank(results, f"all_reduce_small/{dtype}/{op}", expected_reduce(inputs, op, world, dtype))


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_mean_truncates_toward_zero(results, world, dtype):
    # last element: rank 0 holds -5, the others 0 -> -5 / world = -2.5 or -1.67
    # truncated toward zero: -2 / -1 (flooring would give -3 / -2)
    # second element: -(3 r + 1) summed = -5 (world 2) or -12 (world 3) -> -2 / -4
    values = observed(results, f"all_reduce/{dtype}/mean")[0][3]
    assert values[4] == {2: -2, 3: -1}[world]
    assert values[1] == {2: -2, 3: -4}[world]
    assert values[0] == {2: 1, 3: 2}[world]  # (1 + 2) / 2 = 1.5 -> 1; (1 + 2 + 3) / 3 = 2


def test_float_mean_closed_form(results, world):
    # sum over ranks of (r + 1) is world (world + 1) / 2, so the mean is (world + 1) / 2
    assert observed(results, "all_reduce/float32/mean")[0][3][0] == (world + 1) / 2
    assert_every_rank(results, "all_reduce/default_op", tensor((world + 1) / 2, "float32"))


@pytest.mark.parametrize("label", list(jobs.REDUCE_ALIASES))
def test_all_reduce_op_spellings(results, world, label):
    _, meaning = jobs.REDUCE_ALIASES[label]
    inputs = [jobs.reduce_input(r) for r in range(world)]
    assert_every_rank(results, f"all_reduce_alias/{label}", expected_reduce(inputs, meaning, world, "float32"))


@pytest.mark.parametrize("label", list(jobs.INVALID_OPS))
def test_all_reduce_unknown_op_raises_on_every_rank(results, world, label):
    for value in assert_raised_everywhere(results, f"all_reduce_invalid/{label}", ValueError):
        assert value.type == "InvalidReduceOpError"
        assert "AttributeError" in value.mro  # what Lightning raises for the same input
        assert repr(jobs.INVALID_OPS[label]) in value.message  # the value received
        assert "'sum'" in value.message and "'mean'" in value.message  # the choices


@pytest.mark.parametrize("op", jobs.BOOL_OPS)
def test_all_reduce_bool_tensors(results, world, op):
    inputs = [jobs.bool_input(r, world) for r in range(world)]
    columns = list(zip(*inputs))
    any_ = [any(c) for c in columns]
    all_ = [all(c) for c in columns]
    expected = {"sum": any_, "mean": any_, "max": any_, "min": all_, "product": all_}[op]
    assert expected == ([True, True, False, True] if op in ("sum", "mean", "max") else [False, True, False, False])
    assert_every_rank(results, f"all_reduce_bool/{op}", tensor(expected, "bool"))


def test_all_reduce_python_int_becomes_int32_and_mean_truncates(results, world):
    assert_every_rank(results, "all_reduce/python_int_default", tensor((world + 1) // 2, "int32"))
    assert_every_rank(results, "all_reduce/python_int_sum", tensor(world * (world + 1) // 2, "int32"))


def test_all_reduce_python_float_becomes_float32(results, world):
    # sum over ranks of (r + 0.5) = world (world - 1) / 2 + world / 2 = world ** 2 / 2
    assert_every_rank(results, "all_reduce/python_float_sum", tensor(world**2 / 2, "float32"))


def test_all_reduce_python_bool_becomes_uint8(results, world):
    # only rank 0 passes True: uint8, so "sum" counts (it is not "any" as for bool tensors)
    assert_every_rank(results, "all_reduce/python_bool_sum", tensor(1, "uint8"))
    assert_every_rank(results, "all_reduce/python_bool_max", tensor(1, "uint8"))


def test_all_reduce_leaves_strings_and_none_alone(results, world):
    assert_every_rank(results, "all_reduce/string_leaf", ("leaf", "str", "text"))
    assert_every_rank(results, "all_reduce/none_leaf", ("leaf", "NoneType", None))


def test_all_reduce_is_in_place(results, world):
    # [r + 1, 2 r] summed: [world (world + 1) / 2, world (world - 1)]
    expected = (True, tensor([world * (world + 1) / 2, world * (world - 1)], "float32"))
    assert_every_rank(results, "all_reduce/in_place", expected)


def test_all_reduce_is_in_place_inside_collections(results, world):
    expected = (
        True,
        True,
        tensor(world * (world + 1) / 2, "float32"),
        tensor([world * (world - 1) // 2], "int32"),
    )
    assert_every_rank(results, "all_reduce/in_place_collection", expected)


def test_all_reduce_non_contiguous_tensor_in_place(results, world):
    base = torch.arange(6.0).reshape(2, 3) * world + 6 * world * (world - 1) // 2
    assert_every_rank(results, "all_reduce/noncontiguous", (True, False, describe(base.t())))


def test_all_reduce_collection_sum_rebuilds_every_type(results, world):
    s0 = world * (world - 1) // 2  # sum of r
    s1 = world * (world + 1) // 2  # sum of r + 1
    expected = {
        "loss": torch.tensor(float(s1)),
        "n": torch.tensor(s1, dtype=torch.int32),
        "items": [torch.tensor([s0, 2 * s0]), "label", None],
        "pair": Pair(torch.tensor(float(s1)), (torch.tensor(float(s0)), "x")),
        "metrics": Metrics(loss=torch.tensor([s0 + world / 2]), count=torch.tensor(s0, dtype=torch.int32)),
        "ordered": OrderedDict(
            [("b", torch.tensor(s0, dtype=torch.float64)), ("a", torch.tensor(1, dtype=torch.uint8))]
        ),
        "counts": defaultdict(int, {"k": torch.tensor([s0, world], dtype=torch.int32)}),
    }
    assert_every_rank(results, "all_reduce/collection_sum", describe(expected))


def test_all_reduce_collection_mean(results, world):
    half = (world - 1) / 2  # mean of r
    expected = {
        "loss": torch.tensor((world + 1) / 2),
        "n": torch.tensor((world + 1) // 2, dtype=torch.int32),
        "items": [torch.tensor([int(half), world - 1]), "label", None],
        "pair": Pair(torch.tensor((world + 1) / 2), (torch.tensor(half), "x")),
        "metrics": Metrics(loss=torch.tensor([world / 2]), count=torch.tensor(int(half), dtype=torch.int32)),
        "ordered": OrderedDict(
            [("b", torch.tensor(half, dtype=torch.float64)), ("a", torch.tensor(0, dtype=torch.uint8))]
        ),
        "counts": defaultdict(int, {"k": torch.tensor([int(half), 1], dtype=torch.int32)}),
    }
    assert_every_rank(results, "all_reduce/collection_mean", describe(expected))


def test_all_reduce_many_tensors_of_one_dtype(results, world):
    s0 = world * (world - 1) // 2
    expected = [
        torch.tensor([s0, s0 + world], dtype=torch.float32),
        torch.tensor(10.0 * s0),
        torch.full((2, 2), float(s0)),
        torch.zeros(0),
    ]
    assert_every_rank(results, "all_reduce/same_dtype_many", describe(expected))


def test_all_reduce_mixed_dtypes(results, world):
    mean = (world + 1) / 2
    expected_mean = {
        "f32": torch.tensor(mean),
        "f64": torch.tensor(mean, dtype=torch.float64),
        "i32": torch.tensor(int(mean), dtype=torch.int32),
        "i64": torch.tensor(-int(mean)),
    }
    assert_every_rank(results, "all_reduce/mixed_dtypes_mean", describe(expected_mean))
    expected_max = {
        "f32": torch.tensor(float(world)),
        "f64": torch.tensor(float(world), dtype=torch.float64),
        "i32": torch.tensor(world, dtype=torch.int32),
        "i64": torch.tensor(-1),
    }
    assert_every_rank(results, "all_reduce/mixed_dtypes_max", describe(expected_max))


def test_all_reduce_empty_tensor(results, world):
    assert_every_rank(results, "all_reduce/empty_tensor", describe(torch.zeros(0, 3)))


def test_strategy_all_reduce_directly(results, world):
    assert_every_rank(results, "all_reduce/strategy_direct", tensor(world * (world + 1) / 2, "float32"))


# ---------------------------------------------------------------------------------------------- all_gather
def test_all_gather_adds_a_leading_world_dimension(results, world):
    assert_every_rank(results, "all_gather/arange", describe(torch.arange(3 * world).reshape(world, 3)))
    assert_every_rank(results, "all_gather/matrix", describe(torch.arange(6 * world).reshape(world, 2, 3)))


@pytest.mark.parametrize("dtype", jobs.REDUCE_DTYPES)
def test_all_gather_dtypes(results, world, dtype):
    assert_every_rank(results, f"all_gather/{dtype}", gather_stack([jobs.reduce_input(r) for r in range(world)], dtype))


def test_all_gather_bool_tensor(results, world):
    assert_every_rank(
        results,
        "all_gather/bool_tensor",
        gather_stack([jobs.bool_input(r, world) for r in range(world)], "bool"),
    )


def test_all_gather_scalar_tensor(results, world):
    assert_every_rank(results, "all_gather/scalar", tensor([2.0 * r for r in range(world)], "float32"))


def test_all_gather_python_numbers(results, world):
    assert_every_rank(results, "all_gather/python_int", tensor(list(range(1, world + 1)), "int32"))
    assert_every_rank(results, "all_gather/python_float", tensor([r + 0.5 for r in range(world)], "float32"))
    assert_every_rank(results, "all_gather/python_bool", tensor([1] + [0] * (world - 1), "uint8"))


def test_all_gather_non_contiguous_input(results, world):
    assert_every_rank(
        results,
        "all_gather/noncontiguous",
        describe(torch.stack([jobs.noncontiguous(r) for r in range(world)])),
    )


def test_all_gather_empty_tensor(results, world):
    assert_every_rank(results, "all_gather/empty_tensor", describe(torch.zeros(world, 0, 3)))


def test_all_gather_collection_rebuilds_every_type(results, world):
    expected = {
        "a": torch.arange(2 * world).reshape(world, 2),
        "b": [torch.arange(1, world + 1, dtype=torch.int32), "s", None],
        "p": Pair(torch.tensor([[r * 1.0] for r in range(world)]), torch.tensor([2.5 * r for r in range(world)])),
        "m": Metrics(
            loss=torch.tensor([r + 0.25 for r in range(world)]),
            count=torch.tensor([1] + [0] * (world - 1), dtype=torch.uint8),
        ),
        "o": OrderedDict([("z", torch.arange(world).reshape(world, 1, 1)), ("y", "keep")]),
    }
    assert_every_rank(results, "all_gather/collection", describe(expected))


def test_all_gather_many_tensors_of_one_dtype(results, world):
    expected = [torch.stack([t[i] for t in (jobs.same_dtype_many(r) for r in range(world))]) for i in range(4)]
    # spelled out for world 2 so that the stacking above is not the only statement of the expectation
    if world == 2:
        assert describe(expected[0]) == tensor([[0.0, 1.0], [1.0, 2.0]], "float32")
        assert describe(expected[1]) == tensor([0.0, 10.0], "float32")
    assert_every_rank(results, "all_gather/same_dtype_many", describe(expected))


def test_all_gather_mixed_dtypes(results, world):
    expected = {
        "f32": torch.arange(1.0, world + 1),
        "f64": torch.arange(1.0, world + 1, dtype=torch.float64),
        "i32": torch.arange(1, world + 1, dtype=torch.int32),
        "i64": -torch.arange(1, world + 1),
    }
    assert_every_rank(results, "all_gather/mixed_dtypes", describe(expected))


def test_all_gather_without_tensors_returns_the_leaves(results, world):
    assert_every_rank(results, "all_gather/only_strings", describe(["a", None]))


def test_all_gather_returns_a_new_tensor_and_leaves_the_input(results, world):
    for rank, (same, value) in enumerate(observed(results, "all_gather/input_untouched")):
        assert same is False
        assert value == describe(torch.arange(3) + 3 * rank)


def test_all_gather_without_sync_grads_is_not_differentiable(results, world):
    assert_every_rank(results, "all_gather/sync_grads_false_requires_grad", False)


@pytest.mark.parametrize("case", jobs.SYNC_GRAD_CASES)
def test_all_gather_sync_grads(results, world, case):
    # every rank gathers y_r = x_r * (r + 1) with x_r = ones(2)
    gathered = describe(torch.arange(1.0, world + 1).view(world, 1).expand(world, 2))
    for rank, (requires_grad, value, grad, tag) in enumerate(observed(results, f"all_gather_sync_grads/{case}")):
        factor = {
            "plain": world * (rank + 1),  # sum over ranks of d(sum g)/d g[rank] = world, times dy/dx = r + 1
            "rank_weighted_loss": (rank + 1) * world * (world + 1) // 2,  # loss_q = (q + 1) sum g
            "slice_weighted_loss": world * (rank + 1) ** 2,  # loss_q = sum_j (j + 1) g[j]
            "collection": world * (rank + 1),
        }[case]
        assert requires_grad is True
        assert value == gathered
        assert grad == tensor([float(factor)] * 2, "float32"), f"rank {rank}"
        assert tag == ("t" if case == "collection" else None)


def _mismatch_lines(world: int, case: str) -> list[str]:
    per_rank = {
        "shape": lambda q: [("float32", (q + 1,))],
        "sync_grads": lambda q: [("float32", (q + 1,))],
        "dtype": lambda q: [("float64" if q % 2 else "float32", (2,))],
        "count": lambda q: [("float32", (1,))] * (2 if q == 0 else 1),
        "in_collection": lambda q: [("float32", (2,)), ("float32", (q + 1,))],
    }[case]
    return [f"rank {q}: all_gather on {per_rank(q)}" for q in range(world)]


_ALL_REDUCE_MISMATCH = {
    "size": lambda q: f"all_reduce(reduce_op=sum) on [('float32', ({q + 1},))]",
    "shape": lambda q: f"all_reduce(reduce_op=sum) on [('float32', {(2, 3) if q == 0 else (3, 2)})]",
    "dtype": lambda q: f"all_reduce(reduce_op=sum) on [('{'float64' if q % 2 else 'float32'}', (2,))]",
    "large": lambda q: f"all_reduce(reduce_op=sum) on [('float32', ({1000 * (q + 1)},))]",
    "op": lambda q: f"all_reduce(reduce_op={'sum' if q == 0 else 'max'}) on [('float32', (2,))]",
}


@pytest.mark.parametrize("case", sorted(_ALL_REDUCE_MISMATCH))
def test_all_reduce_mismatch_raises_on_every_rank_with_a_table(results, world, case):
    """RELIABILITY 10: never a C++ abort, a hang or wrong data; a per-rank table on every rank, checked always."""
    for value in assert_raised_everywhere(results, f"all_reduce_mismatch/{case}", ValueError):
        assert value.type == "CollectiveMismatchError", value
        for q in range(world):
            assert f"rank {q}: {_ALL_REDUCE_MISMATCH[case](q)}" in value.message, value.message


def test_all_reduce_still_works_after_a_mismatch(results, world):
    assert_every_rank(results, "all_reduce/after_mismatch", describe(torch.tensor([world * (world - 1) // 2])))


def test_debug_mode_names_ranks_calling_different_collectives(results, world):
    for value in assert_raised_everywhere(results, "debug/barrier_vs_all_reduce", ValueError):
        assert "The ranks called different collectives" in value.message
        assert "rank 0: barrier on []" in value.message
        for q in range(1, world):
            assert f"rank {q}: all_reduce(reduce_op=mean) on [('float32', (1,))]" in value.message


def test_debug_mode_checks_the_broadcast_source(results, world):
    for value in assert_raised_everywhere(results, "debug/broadcast_src", ValueError):
        for q in range(world):
            assert f"rank {q}: broadcast(src={q}) on []" in value.message


def test_debug_mode_lets_matching_calls_through(results, world):
    assert_every_rank(results, "debug/matching_calls", (None, 7, True))


@pytest.mark.parametrize("case", ["shape", "dtype", "count", "in_collection", "sync_grads"])
def test_all_gather_mismatch_raises_on_every_rank_with_a_table(results, world, case):
    for value in assert_raised_everywhere(results, f"all_gather_mismatch/{case}", ValueError):
        for line in _mismatch_lines(world, case):
            assert line in value.message


def test_all_gather_still_works_after_a_mismatch(results, world):
    assert_every_rank(results, "all_gather/after_mismatch", describe(torch.arange(world).reshape(world, 1)))


def test_all_gather_mismatch_advice_names_a_real_function(results, world):
    message = observed(results, "all_gather_mismatch/shape")[0].message
    names = re.findall(r"fabric_lite(?:\.\w+)+", message)
    assert names, message
    for name in names:
        module_name, _, attribute = name.rpartition(".")
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            module = None
        assert callable(getattr(module, attribute, None)), f"{name} does not exist"


# ---------------------------------------------------------------------------------------------- broadcast
SOURCES = [(w, s) for w in WORLDS for s in range(w)]


@pytest.mark.parametrize(("n", "src"), SOURCES, ids=[f"{w}ranks-src{s}" for w, s in SOURCES])
def test_broadcast_tensor_from_every_source(run_suite, n, src):
    results = run_suite(n)
    for rank, (identity, value) in enumerate(observed(results, f"broadcast/tensor/src{src}")):
        assert value == tensor([2.0 * src, 2.0 * src + 1, 2.0 * src + 2], "float32")
        assert identity is (True if rank == src else None)  # the source gets its own object back
    assert_every_rank(results, f"broadcast/scalar_tensor/src{src}", tensor(7 + src, "int64"))


@pytest.mark.parametrize(("n", "src"), SOURCES, ids=[f"{w}ranks-src{s}" for w, s in SOURCES])
def test_broadcast_object_from_every_source(run_suite, n, src):
    results = run_suite(n)
    for rank, (identity, value) in enumerate(observed(results, f"broadcast/object/src{src}")):
        assert value == describe(
            {
                "src": src,
                "list": [1, "a", None],
                "tuple": (src, 2.5),
                "pair": Pair(src, "p"),
                "metrics": Metrics(loss=0.5 * src, count=src),
            }
        )
        assert identity is (True if rank == src else None)
    assert_every_rank(results, f"broadcast/string/src{src}", f"from {src}")


def test_broadcast_none_and_default_source(results, world):
    assert_every_rank(results, "broadcast/none", ("leaf", "NoneType", None))
    assert_every_rank(results, "broadcast/default_src", 1)  # rank 0 passes 0 * 10 + 1


def test_broadcast_tensor_with_more_dims_than_the_header(results, world):
    assert_every_rank(results, "broadcast/nine_dims", describe(torch.arange(1, 4).reshape((1,) * 8 + (3,))))


def test_broadcast_tensor_with_as_many_dims_as_the_header(results, world):
    # eight dims (the most the header describes), mostly of size 1: the shape must arrive exactly
    expected = torch.arange(6).reshape(2, 1, 1, 1, 1, 1, 1, 3) * world  # the source is rank world - 1
    assert_every_rank(results, "broadcast/eight_dims", describe(expected))
    assert_every_rank(results, "broadcast/unit_dims", describe(torch.tensor([[[0.5], [1.5], [2.5]]])))


def test_broadcast_empty_tensor(results, world):
    assert_every_rank(results, "broadcast/empty_tensor", describe(torch.zeros(0, 3)))


def test_broadcast_ignores_what_receivers_pass(results, world):
    assert_every_rank(results, "broadcast/unpicklable_on_receivers", 5)


@pytest.mark.parametrize("dtype", jobs.BROADCAST_DTYPES_OK)
def test_broadcast_tensor_dtypes(results, world, dtype):
    assert_every_rank(
        results, f"broadcast_dtype/{dtype}", describe(jobs.broadcast_tensor(world - 1, getattr(torch, dtype)))
    )


@pytest.mark.parametrize("dtype", jobs.BROADCAST_DTYPES_GLOO_GAP)
def test_broadcast_tensor_dtypes_gloo_lacks(results, world, dtype):
    assert_every_rank(
        results, f"broadcast_dtype/{dtype}", describe(jobs.broadcast_tensor(world - 1, getattr(torch, dtype)))
    )


@pytest.mark.parametrize(
    ("case", "type_name", "values"),
    [("requires_grad", "Tensor", [1.0, 1.0]), ("parameter", "Parameter", [3.0, 3.0])],
)
def test_broadcast_keeps_requires_grad_and_parameter_type(results, world, case, type_name, values):
    assert_every_rank(results, f"broadcast/{case}", (type_name, True, tensor(values, "float32")))


@pytest.mark.parametrize(("case", "type_name"), [("lambda", "function"), ("lock", "lock")])
def test_broadcast_unpicklable_raises_type_error_on_every_rank(results, world, case, type_name):
    src = world - 1 if case == "lambda" else 0
    for value in assert_raised_everywhere(results, f"broadcast_unpicklable/{case}", TypeError):
        assert f"rank {src} could not pickle" in value.message
        assert f"a {type_name} (" in value.message


@pytest.mark.parametrize("label", ["negative", "world_size", "float", "string", "bool"])
def test_broadcast_invalid_source_raises_value_error(results, world, label):
    src = {"negative": -1, "world_size": world, "float": 1.0, "string": "0", "bool": True}[label]
    for value in assert_raised_everywhere(results, f"broadcast_invalid_src/{label}", ValueError):
        assert f"src={src!r}" in value.message
        assert f"0..{world - 1}" in value.message


# ---------------------------------------------------------------------------------------- barrier, decisions
def test_barrier_returns_none(results, world):
    assert_every_rank(results, "barrier", None)
    assert_every_rank(results, "barrier/named", None)


DECISIONS = {  # label -> (all, any) over the ranks' decisions
    "all_true": (True, True),
    "all_false": (False, False),
    "only_rank0": (False, True),
    "all_but_last": (False, True),
}


@pytest.mark.parametrize("via", ["fabric", "strategy"])
@pytest.mark.parametrize("all_", [True, False], ids=["all", "any"])
@pytest.mark.parametrize("label", list(DECISIONS))
def test_reduce_boolean_decision(results, world, label, all_, via):
    expected = DECISIONS[label][0 if all_ else 1]
    assert_every_rank(results, f"reduce_boolean_decision/{via}/{label}/all={all_}", ("bool", expected))


def test_reduce_boolean_decision_defaults_to_all(results, world):
    assert_every_rank(results, "reduce_boolean_decision/default_all/only_rank0", False)


def test_ranks_stay_in_step_after_every_error(results, world):
    assert_every_rank(results, "healthy_after_errors", tensor(world * (world + 1) // 2, "int32"))


# --------------------------------------------------------------------------------------- subgroups (3 ranks)
@pytest.fixture
def three(run_suite):  # type: ignore[no-untyped-def]
    return run_suite(3)


def members(results: list[dict[str, Any]], case: str) -> list[Any]:
    assert case not in results[1], "rank 1 is not in the subgroup and must not have run the subgroup cases"
    return [results[r][case] for r in jobs.SUBGROUP]


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("all_reduce_sum", tensor(4.0, "float32")),  # ranks 0 and 2: 1 + 3
        ("all_reduce_mean", tensor(2.0, "float32")),
        ("all_reduce_int_mean", tensor(-2, "int64")),  # (-1 - 3) / 2
        ("all_reduce_max", tensor([2, 0], "int64")),
        (
            "all_reduce_collection",
            describe({"a": torch.tensor(4, dtype=torch.int32), "b": [torch.tensor([2.0])]}),
        ),
        ("all_gather", tensor([[0, 1], [20, 21]], "int64")),
        (
            "all_gather_collection",
            describe({"n": torch.tensor([0, 2], dtype=torch.int32), "t": (torch.tensor([[0.0], [2.0]]), "s")}),
        ),
    ],
)
def test_subgroup_collectives(three, case, expected):
    for value in members(three, f"subgroup/{case}"):
        assert value == expected


def test_subgroup_all_gather_sync_grads(three):
    # the group has 2 members: x.grad = 2 (r + 1) -> 2 on rank 0, 6 on rank 2
    for rank, (value, grad) in zip(jobs.SUBGROUP, members(three, "subgroup/all_gather_sync_grads")):
        assert value == tensor([[1.0, 1.0], [3.0, 3.0]], "float32")
        assert grad == tensor([2.0 * (rank + 1)] * 2, "float32")


def test_subgroup_mismatch_raises_on_every_member(three):
    for value in members(three, "subgroup/all_gather_mismatch"):
        assert isinstance(value, Raised) and "ValueError" in value.mro
        assert "('float32', (1,))" in value.message and "('float32', (3,))" in value.message


def test_subgroup_mismatch_table_names_global_ranks(three):
    for value in members(three, "subgroup/all_gather_mismatch"):
        assert "rank 0: all_gather on [('float32', (1,))]" in value.message
        assert "rank 2: all_gather on [('float32', (3,))]" in value.message


def test_whole_world_still_works_after_subgroups(three):
    for case in ("subgroup/whole_group_sum", "subgroup/world_after"):
        assert_every_rank(three, case, tensor(6.0, "float32"))


# ---------------------------------------------------------------------------------------------- property
# ~50 random nested collections (float32/float64/int32/int64 tensors of random shapes, Python numbers,
# strings, None; dicts, OrderedDicts, lists, tuples, namedtuples, dataclasses) and reduce ops, each rank's
# values drawn from (seed, case, rank). Every rank regenerated all ranks' inputs and compared the results
# against a single-process reference.
@pytest.mark.parametrize("case", range(N_PROPERTY))
def test_property_all_reduce_matches_single_process_reference(results, world, case):
    for rank, record in enumerate(observed(results, "property")):
        assert record[case]["reduce_ok"], f"rank {rank}, op {record[case]['op']}: {record[case].get('reduce')}"


@pytest.mark.parametrize("case", range(N_PROPERTY))
def test_property_all_gather_matches_single_process_reference(results, world, case):
    for rank, record in enumerate(observed(results, "property")):
        assert record[case]["gather_ok"], f"rank {rank}: {record[case].get('gather')}"


def test_property_inputs_differ_across_ranks_and_cover_the_ops(results, world):
    # the property is only meaningful if ranks really hold different values and every op is drawn
    records = observed(results, "property")
    different = sum(records[0][c]["input"] != records[1][c]["input"] for c in range(N_PROPERTY))
    assert different >= N_PROPERTY // 2
    meaning = {label: m for label, _, m in jobs.PROPERTY_OPS}
    assert {meaning[records[0][c]["op"]] for c in range(N_PROPERTY)} == {
        "sum",
        "mean",
        "max",
        "min",
        "product",
    }


# ---------------------------------------------------------------------------------------------- predicted calls
@pytest.mark.parametrize("world_size", WORLDS)
@pytest.mark.timeout(180)
def test_predicted_calls_give_exact_results_and_every_mismatch_still_raises_everywhere(world_size):
    """A loop of collectives is predicted after its first round (one collective a call, no check ahead of it), with
    results equal to the closed forms; real NaN and inf values stand; a rank calling another shape, another
    collective or another reduce op where a call is predicted makes every rank raise the mismatch, and the next
    calls work (and are predicted again)."""
    results = spawn_job("tests.helpers.jobs.collectives:predicted", world_size, timeout=120)
    ranks = range(world_size)
    for rank, obs in enumerate(results):
        for step, row in enumerate(obs["loop"]):
            assert row["sum"] == tensor(float(sum(r + step for r in ranks)), "float32"), (rank, step)
            for i in range(64):
                mean = sum(r * 100 + i + step for r in ranks) / world_size
                assert row["mean"][f"m{i}"] == pytest.approx([mean] * 8, rel=1e-6), (rank, step, i)
            assert row["max"] == [0.0, float(world_size), 69_999.0 * world_size]
            assert row["min"] == tensor([0.0, -float(world_size - 1)], "float32")
            expected = torch.tensor([[[r, step], [step, r]] for r in ranks], dtype=torch.float64)
            assert row["gather"] == describe(expected)
        # 6 rounds of 5 calls: the first round and the first call of the second are not predicted yet
        assert obs["hits_after_loop"] == 5 * 6 - 6, obs["hits_after_loop"]
        nan = obs["nan"]
        assert nan[:3] == ("tensor", "float32", ()) and math.isnan(nan[3])
        assert obs["inf_max"] == [math.inf if world_size > 1 else 1.0, math.inf]
        gathered = obs["nan_gather"][3]
        assert all(math.isnan(v) for v in gathered[0]) and gathered[1:] == [[float(r)] * 3 for r in ranks[1:]]
        for case in ("mismatch_shape", "mismatch_kind", "mismatch_gather", "mismatch_reduce_op"):
            raised = obs[case]
            assert isinstance(raised, Raised) and raised.type == "CollectiveMismatchError", (rank, case, raised)
            assert all(f"rank {r}:" in raised.message for r in ranks), raised.message
        assert obs["after_mismatch"] == obs["again"] == tensor(float(sum(ranks)), "float32")
        assert obs["gather_again"] == describe(torch.tensor([[float(r)] * 3 for r in ranks]))
        assert obs["reduce_again"] == tensor([float(sum(ranks))] * 3, "float32")
        # the last two of the first "again" loop and the last of each other one (a NaN or inf probe is no hit)
        assert obs["hits"] == obs["hits_after_loop"] + 4, (obs["hits"], obs["hits_after_loop"])


@pytest.mark.parametrize("world_size", WORLDS)
@pytest.mark.timeout(240)
def test_predicted_integer_and_boolean_reductions_are_exact_and_mismatches_raise_everywhere(world_size):
    """Integer and boolean reductions (every op; one element, a few, and enough to go through the backend's
    all-reduce) are predicted from their third round, with a flag beside the data (max and min: the dtype's extreme
    as the mark), and give exactly what the unpredicted path gives, a real extreme where the probe reads included; a
    rank calling another dtype, shape or op at a predicted call makes every rank raise."""
    from tests.helpers.jobs.collectives import INTEGER_CASES, integer_input

    results = spawn_job("tests.helpers.jobs.collectives:predicted_integers", world_size, timeout=180)
    ranks = range(world_size)
    cases = len(INTEGER_CASES) + 1
    expected = {}  # each case's reduction, worked out once: the same for every rank and round
    for name, dtype, numel, op in INTEGER_CASES:
        inputs = torch.stack([integer_input(dtype, numel, op, r) for r in ranks])
        if dtype == "bool":
            reduced = inputs.all(0) if op in ("min", "product") else inputs.any(0)
        elif op in ("sum", "mean"):
            reduced = inputs.sum(0, dtype=inputs.dtype)
            if op == "mean":
                reduced = torch.div(reduced, world_size, rounding_mode="trunc")
        elif op == "product":
            reduced = inputs.prod(0, dtype=inputs.dtype)
        else:
            reduced = inputs.amax(0) if op == "max" else inputs.amin(0)
        expected[name] = (describe(reduced[:5]), int(reduced.to(torch.int64).sum()))
    for rank, obs in enumerate(results):
        for round in range(4):
            for name, *_ in INTEGER_CASES:
                assert obs[f"{round}/{name}"] == expected[name][0], (rank, round, name)
                assert obs[f"{round}/{name}/total"] == expected[name][1], (rank, round, name)
            assert obs[f"{round}/mixed"] == {
                "n": tensor(sum(r + 1 for r in ranks), "int64"),
                "ok": tensor(True, "bool"),
                "loss": tensor(0.5 * sum(ranks), "float32"),
            }
        # nothing predicted in the first round, all but the first call of the second, all of the third and fourth
        assert [obs[f"{r}/hits"] for r in range(4)] == [0, cases - 1, 2 * cases - 1, 3 * cases - 1]
        for numel in (5, 600_000):
            assert obs[f"extreme/max/{numel}"] == [torch.iinfo(torch.int64).max, numel - 1], rank
            assert obs[f"extreme/min/{numel}"] == [torch.iinfo(torch.int64).min, numel - 1], rank
        for case in (
            "mismatch_dtype",
            "mismatch_dtype_flag_apart",
            "mismatch_shape",
            "mismatch_op",
            "mismatch_marked_op",
        ):
            raised = obs[case]
            assert isinstance(raised, Raised) and raised.type == "CollectiveMismatchError", (rank, case, raised)
            assert all(f"rank {r}:" in raised.message for r in ranks), raised.message
        assert obs["after"] == tensor([sum(ranks), world_size], "int64")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world_size", WORLDS)
def test_predicted_broadcasts_give_what_the_source_sent(world_size):
    """A broadcast like the previous one from its source travels as one message of its own size; every change of
    shape, dtype, source or kind (an object, a parameter, a tensor too large to predict, an error) is noticed by
    every rank, which then gets what the source sent, as without prediction."""
    results = spawn_job("tests.helpers.jobs.collectives:predicted_broadcasts", world_size, timeout=120)
    last = world_size - 1
    expected = {
        f"loop{step}": (tensor([float(i + step) for i in range(8)], "float32"), "Tensor", False) for step in range(4)
    }
    expected |= {
        "strided": (tensor([10.0 + 2 * i for i in range(8)], "float32"), "Tensor", False),
        "other_shape": (tensor([0.0, 1.0, 2.0, 3.0, 4.0], "float32"), "Tensor", False),
        "other_dtype": (tensor([0, 1, 2, 3, 4], "int64"), "Tensor", False),
        "same_again": (tensor([0, 2, 4, 6, 8], "int64"), "Tensor", False),
        "other_source": (tensor([i * (last + 3) for i in range(5)], "int64"), "Tensor", False),
        "object": {"rank": 0, "values": [0, 0, 0]},
        "after_object": (tensor([[0.0] * 3] * 2, "float32"), "Tensor", False),
        "after_object_again": (tensor([[1.0] * 3] * 2, "float32"), "Tensor", False),
        "parameter": (tensor([[2.0] * 3] * 2, "float32"), "Parameter", True),
        "grad": (tensor([[3.0] * 3] * 2, "float32"), "Tensor", True),
        "large": (tensor([float(i) for i in range(8)], "float64"), "Tensor", False),
        "small_after_large": (tensor([0.0] * 3, "float32"), "Tensor", False),
        "empty": (tensor([], "float32"), "Tensor", False),
        "small_after_empty": (tensor([1.0] * 3, "float32"), "Tensor", False),
    }
    for rank, obs in enumerate(results):
        for name, value in expected.items():
            assert obs[name] == value, (rank, name, obs[name])
        raised = obs["unpicklable"]
        assert isinstance(raised, Raised) and raised.type == "TypeError" and "could not pickle" in raised.message
        assert obs["after_error"] == tensor([5.0] * 3, "float32")
        assert obs["loop1_later"] == expected["loop1"][0]
        # predicted and held: loop1-3, strided, same_again, after_object_again, small_after_large is not (the large
        # one is never remembered), nor is anything right after a change
        assert obs["hits"] == 6, obs["hits"]


def test_checks_on_a_separate_host_group_as_for_nccl():
    """With NCCL the signatures travel on a gloo group beside it (no copy of device tensors to the host); here the
    same arrangement on gloo: the results are exact and mismatches raise on every rank, and the barrier works."""
    for rank, obs in enumerate(spawn_job("tests.helpers.jobs.collectives:host_checks", 2, timeout=120)):
        assert obs["registered"]
        assert obs["small"] == tensor([2.0, 1.0], "float32")
        assert obs["ints"] == tensor([1, 2], "int64")
        assert obs["dict"] == {"a": [1.0] * 3, "b": [1.0] * 2}  # the mean by default
        assert obs["gather"] == tensor([[0, 1], [1, 2]], "int64")
        for case in ("mismatch", "gather_mismatch"):
            raised = obs[case]
            assert isinstance(raised, Raised) and raised.type == "CollectiveMismatchError", (rank, case, raised)
            assert "rank 0:" in raised.message and "rank 1:" in raised.message
        assert obs["after"] == tensor(1.0, "float32")


# ---------------------------------------------------------------------------------------------- per-group state
def test_two_fabrics_with_different_debug_settings_keep_their_own_behaviour():
    """Two Fabric objects over one process group, one in debug mode (set up after the other) and one not: the
    first's calls are predicted as before, the debug one's never are and it still names mismatched ranks at once;
    neither setting reaches the other (each strategy holds the state of its own collectives)."""
    for rank, obs in enumerate(spawn_job("tests.helpers.jobs.collectives:two_fabrics", 2, timeout=120)):
        assert obs["debug"] == [False, True, False], rank
        assert obs["same_state"] is False
        for round in range(4):
            for name in ("plain", "debug"):
                assert obs[f"{round}/{name}"] == [tensor(1.0, "float32"), tensor([[0.0], [1.0]], "float32")]
        # 4 rounds of 2 calls: the first round and the first call of the second are not predicted
        assert obs["hits"] == [4 * 2 - 3, 0, 0], (rank, obs["hits"])
        raised = obs["debug_mismatch"]
        assert isinstance(raised, Raised) and raised.type == "CollectiveMismatchError", (rank, raised)
        assert "rank 0: barrier" in raised.message and "rank 1: all_reduce" in raised.message, raised.message
        assert obs["plain_after"] == [tensor(1.0, "float32"), tensor([[0.0], [1.0]], "float32")]
        assert obs["hits_after"] == obs["hits"][0] + 2


def test_a_new_group_does_not_inherit_the_history_of_a_destroyed_one():
    """A process group destroyed and another made over the same ranks (possibly at the same address): the new one
    has state of its own, so its first calls are not predicted from the old one's history."""
    for rank, obs in enumerate(spawn_job("tests.helpers.jobs.collectives:group_recreated", 2, timeout=120)):
        # 4 calls of one kind: the first two are not predicted
        assert obs["first_hits"] == 2, (rank, obs["first_hits"])
        assert obs["new_state"] is True
        assert obs["new_hits_before"] == 0
        assert obs["reduced"] == [tensor([1.0, 1.0], "float32")] * 4
        assert obs["new_hits"] == 2, (rank, obs["new_hits"])
        assert obs["old_hits"] == 2
